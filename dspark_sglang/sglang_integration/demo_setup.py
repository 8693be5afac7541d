"""The files and names the demo's engines need, resolved and checked before any starts.

``demo.plan_demo`` builds its plan from these:

* engine names: our policies, with ``PRICED_SUFFIX`` for ``draft_decision: priced``
  (``ENGINE_POLICIES``, ``split_policy``);
* the drafter checkpoint the DSPARK_MOE engines load (``resolve_drafter``: the one given,
  the embedded one, or a seeded untrained one), checked against the target's config
  without loading the target's weights (``_target_spec``);
* one ``SchedulerConfig`` file per verify policy (``write_scheduler_config``), with the
  cost table and STS file it names read here first, and a warning when the cost table
  was measured in another dtype than the engines run in (``cost_table_dtype``).

SGLang kills its parent process when a scheduler dies during start-up, so every file an
engine would read is read here first and a bad one becomes a ``DemoError`` (or a
``CheckpointError``) naming the fix. The benchmarks resolve their drafters and scheduler
configs through the same functions.
"""

from __future__ import annotations

import argparse
import json
from functools import lru_cache
from pathlib import Path
from typing import Any

from dspark_sglang.model.context_copy import default_ngram
from dspark_sglang.scheduling.config import NEEDS_COST_TABLE, POLICIES
from dspark_sglang.sglang_integration.launch import (
    SGLANG_DECISION,
    LaunchError,
    check_sts_block_size,
    drafter_block_size,
    drafter_sts,
)

__all__ = [
    "ENGINE_POLICIES",
    "PRICED_SUFFIX",
    "DemoError",
    "cost_table_dtype",
    "resolve_drafter",
    "split_policy",
    "write_scheduler_config",
]


#: An engine name's suffix for ``draft_decision: priced`` (``prefix+priced``): each step
#: drafts only where the measured costs price a drafting round above a plain step.
PRICED_SUFFIX = "+priced"
#: Every engine name a demo or benchmark accepts for our policies.
ENGINE_POLICIES: tuple[str, ...] = (*POLICIES, *(p + PRICED_SUFFIX for p in NEEDS_COST_TABLE))


def split_policy(name: str) -> tuple[str, str]:
    """``(policy, draft_decision)`` of an engine name (``prefix+priced``, ``mtp1``, ...)."""
    if name.endswith(PRICED_SUFFIX):
        return name.removesuffix(PRICED_SUFFIX), "priced"
    return name, "always"


class DemoError(ValueError):
    """A flag, file or checkpoint the demo cannot use; the message names the fix."""


@lru_cache(maxsize=4)
def _target_spec(model_path: Path) -> tuple[Any, Any]:
    """``(TargetSpec, tokenizer)`` from the model folder, without loading its weights."""
    from transformers import AutoConfig, AutoTokenizer

    from dspark_sglang.model import TargetSpec
    from dspark_sglang.targets.smollm2 import RECORD_FILENAME, SMOLLM2_NAME

    name = SMOLLM2_NAME if (model_path / RECORD_FILENAME).is_file() else model_path.name
    config = AutoConfig.from_pretrained(str(model_path))
    spec = TargetSpec.from_hf_config(config, name=name)
    return spec, AutoTokenizer.from_pretrained(str(model_path))


def _shared_stubs(vocab: int, hidden: int) -> tuple[Any, Any]:
    """Meta-device stand-ins for the target's embedding/LM head.

    The drafter never saves them (they belong to the target; SGLang re-attaches
    the real ones), so shape-checked stubs are enough to validate or write a
    checkpoint without loading the target's weights in this process.
    """
    from torch import nn

    return (
        nn.Embedding(vocab, hidden, device="meta"),
        nn.Linear(hidden, vocab, bias=False, device="meta"),
    )


def resolve_drafter(
    model_path: Path,
    drafter: Path | None,
    default_dir: Path,
    seed: int,
    workdir: Path,
    console: Any,
) -> tuple[Path, bool]:
    """``(checkpoint folder, trained)`` for the DSPARK_MOE engine, validated against the target.

    ``drafter`` if given (ours, or DeepSpec's layout: its config and tensor header checked
    against the target), else ``default_dir`` if it holds a checkpoint, else a
    seeded untrained drafter written with ``save_drafter`` under ``workdir``
    (with a loud warning: its drafts are essentially never accepted).
    Raises ``CheckpointError`` (a ``ValueError``) naming the field and the fix.
    """
    import torch

    from dspark_sglang.model import DSparkConfig, DSparkDrafter, load_drafter, save_drafter
    from dspark_sglang.model.formats.deepspec import check_checkpoint
    from dspark_sglang.model.formats.layout import is_deepspec_folder
    from dspark_sglang.targets.hf_target import default_mask_token_id

    spec, tokenizer = _target_spec(model_path)
    embed, head = _shared_stubs(spec.vocab_size, spec.hidden_size)
    path = drafter
    if path is None and (default_dir / "config.json").is_file():
        path = default_dir
    if path is not None:
        if is_deepspec_folder(path):  # served by SGLang's dense class: its header vs the target
            check_checkpoint(path, json.loads((model_path / "config.json").read_text()))
        else:
            load_drafter(path, spec, embed, head)  # full check: config vs target, every tensor
        console.print(f"drafter: {path}")
        return path, True
    config = DSparkConfig.for_target(spec, mask_token_id=default_mask_token_id(tokenizer))
    torch.manual_seed(seed)
    folder = save_drafter(DSparkDrafter(config, embed, head), workdir / "untrained_drafter")
    console.print(
        "[bold red]WARNING: no trained drafter checkpoint found; using an UNTRAINED, "
        f"seeded (seed={seed}) drafter.[/] Its drafts are almost never accepted, so "
        "expect ~1 token per round and a slowdown: this run checks correctness, not speed.",
        soft_wrap=True,
    )
    return folder, False


def cost_table_dtype(table: Path) -> str | None:
    """The dtype a cost table was measured in, from its ``<table>.meta.json``; None if unknown.

    The table file itself holds only SGLang's keys (its format stays byte-identical
    to SGLang's), so the profiler records the dtype in the sidecar.
    """
    meta = table.with_name(table.stem + ".meta.json")
    try:
        doc = json.loads(meta.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    dtype = doc.get("dtype") if isinstance(doc, dict) else None
    return dtype if isinstance(dtype, str) else None


def _check_cost_table_dtype(table: Path, engine_dtype: str, console: Any) -> None:
    """Warn when ``table`` was measured in another dtype than the engine runs (or is unknown)."""
    measured = cost_table_dtype(table)
    if measured == engine_dtype:
        return
    if measured is None:
        console.print(
            f"[yellow]note: cost table {table} has no .meta.json naming its dtype; its step "
            f"rates should come from a {engine_dtype} engine like this one.[/]",
            soft_wrap=True,
        )
        return
    console.print(
        f"[bold yellow]WARNING: cost table {table} was measured in {measured} (its .meta.json) "
        f"but the engines run in {engine_dtype}: its step rates do not describe these "
        f"engines, so the policy weighs drafts against the wrong costs. Profile in "
        f"{engine_dtype} (`dspark-sglang profile --dtype {engine_dtype}`) or pass "
        f"--dtype {measured}.[/]",
        soft_wrap=True,
    )


def write_scheduler_config(
    args: argparse.Namespace,
    drafter_dir: Path,
    workdir: Path,
    console: Any,
    engine_dtype: str = "float32",
    *,
    policy: str | None = None,
    greedy_only: bool = True,
) -> Path | None:
    """A policy -> a ``SchedulerConfig`` file for ``DSPARK_SCHEDULER_CONFIG`` (else None).

    ``policy`` (default ``args.policy``) is the verify policy; None or
    ``SGLANG_DECISION`` is SGLang's own decision, which needs no config. The file is
    ``workdir/scheduler-<policy>.yaml``, so one folder holds several engines' configs.

    The config sets ``greedy_only`` (default): every demo request is greedy
    (``check_sglang_flags`` refuses ``--temperature`` above 0), so the tier
    drafts by argmax (``SchedulerConfig.greedy_draft``); a caller that also
    sends sampled requests passes ``greedy_only=False``. A policy that picks
    per-request lengths runs in SGLang's ``compact`` ragged mode (``ragged_mode``):
    the demo's engines run on CPU. ``engine_dtype`` is
    what the engines run in; a cost table measured in
    another one is used, with a warning.
    """
    name = args.policy if policy is None else policy
    if name is None or name == SGLANG_DECISION:
        return None
    policy, draft_decision = split_policy(name)
    from dspark_sglang.scheduling.config import SchedulerConfig

    sts = args.sts
    if policy == "verify_all":
        # SGLang's static mode, which verify_all runs, loads the draft without its
        # confidence head: nothing to calibrate (and nothing reads confidences).
        sts = None
    elif sts is None:
        sts = drafter_sts(drafter_dir, greedy_only=greedy_only)
        if sts is not None:
            console.print(f"STS calibration: {sts}")
    from dspark_sglang.calibration.sts import load_sts
    from dspark_sglang.scheduling import load_cost_table

    block_size = drafter_block_size(drafter_dir)
    # The worker reads both files in the scheduler process, where a failure kills
    # this process too (SGLang's start-up SIGQUIT): read them here first.
    if args.cost_table is not None:
        load_cost_table(args.cost_table)
        _check_cost_table_dtype(Path(args.cost_table), engine_dtype, console)
    elif policy in NEEDS_COST_TABLE:
        console.print(
            f"cost table: none given, so the DSPARK_MOE worker measures the target at start-up "
            f"in the engine's own settings ({engine_dtype}; startup_profile) for {policy}"
        )
    if sts is not None:
        try:
            check_sts_block_size(load_sts(sts).block_size, block_size, f"STS {sts}")
        except LaunchError as exc:
            raise DemoError(str(exc)) from exc
    copies = getattr(args, "context_copy", None)
    if copies is None:  # unset: on for a greedy-only tier (model.context_copy.default_ngram)
        copies = default_ngram(greedy_only)
    cfg = SchedulerConfig(
        block_size=block_size,
        policy=policy,
        sla_name="demo",
        static_k=args.static_k if policy == "static" else None,
        cost_table_path=str(Path(args.cost_table).resolve()) if args.cost_table else None,
        sts_path=str(Path(sts).resolve()) if sts is not None else None,
        greedy_only=greedy_only,
        # CPU engines capture no graphs: verifying only the drafts the policy chose
        # is cheaper than verifying the block and capping acceptance.
        ragged_mode=None if policy == "verify_all" else "compact",
        context_copy_ngram=copies if policy != "none" else 0,
        draft_decision=draft_decision,
    )
    path = workdir / f"scheduler-{name.replace(PRICED_SUFFIX, '-priced')}.yaml"
    cfg.save(path)
    return path
