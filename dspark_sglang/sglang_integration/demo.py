"""``dspark-sglang demo --engine sglang``: the product, plain vs DSpark, in SGLang's engine on CPU.

Why this exists: the README's first command must show what users actually run
-- SGLang's real ``Engine`` with our drafter behind
``--speculative-algorithm DSPARK_MOE`` -- not the pure-PyTorch reference
generator. The demo starts one engine for plain decoding and one DSPARK_MOE engine
with the embedded drafter per verify policy, each in its own process
(``engine_process``): ``--policy``, by default our ``prefix`` scheduler (a cost table
the worker measures at start-up in the engine's own settings, the drafter's STS
file), which the report leads with, and ``--compare``, by default SGLang's own
decision (the whole block) and ``mtp1`` (one draft per round) (``demo_policies``).
It times them in turns on the same greedy chat prompts, with ``--concurrency``
requests in flight (one by default: speculative decoding is for per-request
latency): ``--passes`` timed passes per engine in the order plain, A, B, ..., B, A,
plain, ... (``engine_process.turns``), so the machine's drift over minutes hits all
alike. An engine waiting for its turn sleeps (SGLang's ``sleep_on_idle``) and takes
no CPU from the one being timed. It prints per engine tokens/s (wall time of
``generate`` only, after a short warm-up on a different prompt so no run pays
first-call costs; every pass starts from an empty radix cache so that every pass
computes the same thing; the median of the passes counts, because one pass on a
shared machine can be off by a third), each DSPARK_MOE engine's speed ratio to
plain decoding, SGLang's accepted length per verify round, and whether the outputs
are token-identical. Greedy verification is lossless, so they must be; where a
prompt's outputs differ the demo names the position and the target's best tokens
there (``greedy_check``): two tokens within the dtype's rounding tolerance of the
best are printed loudly as a numerical near-tie, anything else is a bug and the
demo exits 1. The margins come from the plain engine itself: after its timed run,
one untimed prefill of each prompt plus its plain output with ``return_logprob``
and ``top_logprobs_num`` = ``greedy_check.TOP_TOKENS``.

Every demo request is greedy (``--temperature 0``; the engine refuses others), so
the DSPARK_MOE engines draft by argmax: SGLang's ``SGLANG_DSPARK_USE_GREEDY_DRAFT``,
on through the scheduler config's ``greedy_only`` or, without one,
``scheduler_env(..., greedy_draft=True)`` (``DemoEngine.env``). The drafter then
skips sampling its drafts, which only costs time when every request is greedy.

All engines run in one dtype, ``--dtype`` (``auto``: bfloat16 where the CPU
has native bf16 matrix instructions, else float32; ``cpu_dtype``), and the
demo prints which and why. The drafter's weights are cast to the engine's
dtype by SGLang, whatever dtype its checkpoint stores (that changes acceptance
at most, never the output). A cost table is a measurement in one dtype: the
demo warns when its ``.meta.json`` names another one.

Everything that can be checked without an engine (flags, cost table, drafter
checkpoint against the target config) is checked first, because SGLang kills
its parent process when a scheduler dies during start-up: a bad checkpoint
must become a clear error here, not a dead CLI.

Invariant: every engine sees identical prompts and sampling settings, and every
engine process is reaped before the demo returns. Every timed pass of plain
decoding must give the same outputs (greedy); a speculative pass may differ from
its first only where both differ from plain decoding at near-ties.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from dspark_sglang.model.context_copy import default_ngram
from dspark_sglang.scheduling.config import NEEDS_COST_TABLE, POLICIES
from dspark_sglang.sglang_integration.cpu_dtype import DtypeChoice, choose_cpu_dtype, read_cpuinfo
from dspark_sglang.sglang_integration.demo_report import EngineRun, report
from dspark_sglang.sglang_integration.greedy_check import (
    TOP_TOKENS,
    TopTokens,
    top_tokens_from_sglang,
)
from dspark_sglang.sglang_integration.launch import (
    GREEDY_DRAFT_ENV,
    SGLANG_DECISION,
    LaunchError,
    check_sts_block_size,
    drafter_block_size,
    drafter_sts,
    scheduler_env,
)

__all__ = [
    "DEFAULT_COMPARE",
    "DEFAULT_POLICY",
    "ENGINE_POLICIES",
    "PRICED_SUFFIX",
    "DemoEngine",
    "DemoError",
    "DemoPlan",
    "check_sglang_flags",
    "cost_table_dtype",
    "demo_policies",
    "flush_radix_cache",
    "plan_demo",
    "resolve_drafter",
    "run_engines",
    "run_sglang_demo",
    "split_policy",
    "target_top_tokens",
    "write_scheduler_config",
]

_WARMUP_TEXT = "Hello"
_HOST = "127.0.0.1"  # SGLang's engine binds only loopback ports (dist init); say so explicitly


#: Timed passes per engine when ``--passes`` is not given: the median of 3 is what a
#: reader can trust on a shared machine, where one pass can be off by a third.
DEFAULT_PASSES = 3

#: Requests in flight when ``--concurrency`` is not given: one, the per-request latency
#: speculative decoding exists to cut (a batch makes a verify of every draft dearer while
#: plain decoding gains from the batch).
DEFAULT_CONCURRENCY = 1

#: An engine name's suffix for ``draft_decision: priced`` (``prefix+priced``): each step
#: drafts only where the measured costs price a drafting round above a plain step.
PRICED_SUFFIX = "+priced"
#: Every engine name a demo or benchmark accepts for our policies.
ENGINE_POLICIES: tuple[str, ...] = (*POLICIES, *(p + PRICED_SUFFIX for p in NEEDS_COST_TABLE))

#: The verify policy of the DSPARK_MOE engine the report leads with when ``--policy`` is
#: not given: the policy and draft decision of the chart's default tier, our hardware-aware
#: scheduler on each request's confidences from ``lag_steps`` rounds back, on a cost table
#: the worker measures at start-up in the engine's own settings and the drafter's STS
#: file, drafting only in steps where a drafting round pays (``draft_decision: priced``).
DEFAULT_POLICY = "lagged" + PRICED_SUFFIX


def split_policy(name: str) -> tuple[str, str]:
    """``(policy, draft_decision)`` of an engine name (``prefix+priced``, ``mtp1``, ...)."""
    if name.endswith(PRICED_SUFFIX):
        return name.removesuffix(PRICED_SUFFIX), "priced"
    return name, "always"


#: The DSPARK_MOE engines timed beside it when ``--compare`` is not given: SGLang's own
#: decision (the whole block) and one draft per round.
DEFAULT_COMPARE = (SGLANG_DECISION, "mtp1")


def demo_policies(args: argparse.Namespace) -> tuple[str, ...]:
    """The DSPARK_MOE engines' verify policies, the lead first, each name once.

    ``--policy`` (default ``DEFAULT_POLICY``), then ``--compare`` (default
    ``DEFAULT_COMPARE``; given with no names, none). ``SGLANG_DECISION`` is SGLang's own
    decision; any other name is our policy, in a scheduler config.
    """
    lead = args.policy or DEFAULT_POLICY
    compare = getattr(args, "compare", None)
    return tuple(dict.fromkeys((lead, *(DEFAULT_COMPARE if compare is None else compare))))


class DemoError(ValueError):
    """A flag, file or checkpoint the demo cannot use; the message names the fix."""


@dataclass(frozen=True)
class DemoEngine:
    """One DSPARK_MOE engine of the demo: its verify policy and the config that sets it."""

    policy: str
    #: SchedulerConfig file routed through ``DSPARK_SCHEDULER_CONFIG``, else None:
    #: SGLang's own verify decision (``SGLANG_RAGGED_VERIFY_MODE=static``: the whole block).
    scheduler_config: Path | None

    @property
    def label(self) -> str:
        return f"DSPARK_MOE ({self.policy})"

    @property
    def env(self) -> dict[str, str]:
        """The engine's environment (``launch.scheduler_env``).

        Every demo request is greedy, so the draft is argmax
        (``SGLANG_DSPARK_USE_GREEDY_DRAFT=1``): a written config has ``greedy_only``
        set (``write_scheduler_config``), and without one the demo asks for it.
        """
        return scheduler_env(self.scheduler_config, greedy_draft=True)


@dataclass(frozen=True)
class DemoPlan:
    """Everything the engine runs need, resolved and validated before any engine starts."""

    model_path: Path
    drafter_dir: Path
    trained: bool
    prompts: tuple[tuple[int, ...], ...]
    max_new_tokens: int
    omp_threads: int
    #: Timed passes per engine (``--passes``); the report uses their median.
    passes: int
    #: Requests in flight (``--concurrency``): each pass keeps this many in flight.
    concurrency: int
    #: The DSPARK_MOE engines (``demo_policies``), the one the report leads with first.
    engines: tuple[DemoEngine, ...]
    #: The dtype every engine runs in, and why.
    dtype: DtypeChoice

    @property
    def dspark_env(self) -> dict[str, str]:
        """The leading DSPARK_MOE engine's environment (``DemoEngine.env``)."""
        return self.engines[0].env

    def __post_init__(self) -> None:
        if not self.engines:
            raise DemoError("DemoPlan.engines must name at least one DSPARK_MOE engine")
        if not self.prompts or any(len(p) == 0 for p in self.prompts):
            raise DemoError("DemoPlan.prompts must be non-empty token-id lists")
        if self.max_new_tokens < 1:
            raise DemoError(f"--max-new-tokens must be >= 1, got {self.max_new_tokens}")
        if self.omp_threads < 1:
            raise DemoError(f"--threads must be >= 1, got {self.omp_threads}")
        if self.passes < 1:
            raise DemoError(f"--passes must be >= 1, got {self.passes}")
        if self.concurrency < 1:
            raise DemoError(f"--concurrency must be >= 1, got {self.concurrency}")


def check_sglang_flags(args: argparse.Namespace) -> None:
    """Flag checks that need neither the target nor an engine (fail in milliseconds)."""
    if args.temperature != 0.0:
        raise DemoError(
            f"--engine sglang runs greedy only (got --temperature {args.temperature}): on CPU "
            "SGLang's speculative verify is always greedy; drop --temperature or use "
            "--engine reference for sampling"
        )
    if args.top_k not in (-1, 0) or args.top_p != 1.0:
        raise DemoError("--top-k/--top-p need sampling; --engine sglang runs greedy only")
    if args.num_prompts < 1:
        raise DemoError(f"--num-prompts must be >= 1, got {args.num_prompts}")
    if args.max_new_tokens < 1:
        raise DemoError(f"--max-new-tokens must be >= 1, got {args.max_new_tokens}")
    if args.threads is not None and args.threads < 1:
        raise DemoError(f"--threads must be >= 1, got {args.threads}")
    if args.passes is not None and args.passes < 1:
        raise DemoError(f"--passes must be >= 1 (timed passes per engine), got {args.passes}")
    if args.concurrency is not None and args.concurrency < 1:
        raise DemoError(f"--concurrency must be >= 1 (requests in flight), got {args.concurrency}")
    if not set(demo_policies(args)) - {SGLANG_DECISION}:
        for flag, value in (("--cost-table", args.cost_table), ("--sts", args.sts)):
            if value is not None:
                raise DemoError(
                    f"{flag} only feeds our scheduler, and every DSPARK_MOE engine here runs "
                    f"SGLang's own decision (--policy/--compare {SGLANG_DECISION}): name one "
                    "of our policies in --policy or --compare, or drop the flag"
                )
    for flag, value in (("--cost-table", args.cost_table), ("--sts", args.sts)):
        if value is not None and not Path(value).is_file():
            raise DemoError(f"{flag} {value}: no such file")
    try:
        choose_cpu_dtype(args.dtype, None)
    except ValueError as exc:
        raise DemoError(str(exc)) from exc


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


def plan_demo(
    args: argparse.Namespace, model_path: Path, default_dir: Path, workdir: Path, console: Any
) -> DemoPlan:
    """Validate everything and write the files the engine runs need (no engine started)."""
    from dspark_sglang.data.demo_prompts import demo_chats

    dtype = choose_cpu_dtype(args.dtype, read_cpuinfo() if args.dtype == "auto" else None)
    console.print(dtype.describe(), highlight=False)
    drafter_dir, trained = resolve_drafter(
        model_path, args.drafter, default_dir, args.seed, workdir, console
    )
    engines = tuple(
        DemoEngine(
            policy,
            write_scheduler_config(args, drafter_dir, workdir, console, dtype.dtype, policy=policy),
        )
        for policy in demo_policies(args)
    )
    _, tokenizer = _target_spec(model_path)
    prompts = []
    for chat in demo_chats(args.num_prompts):
        ids = tokenizer.apply_chat_template(
            chat, add_generation_prompt=True, tokenize=True, return_dict=False
        )
        if isinstance(ids, Mapping):  # some tokenizers return a BatchEncoding regardless
            ids = ids["input_ids"]
        prompts.append(tuple(int(t) for t in ids))
    return DemoPlan(
        model_path=model_path,
        drafter_dir=drafter_dir,
        trained=trained,
        prompts=tuple(prompts),
        max_new_tokens=args.max_new_tokens,
        omp_threads=args.threads if args.threads is not None else 1,
        passes=args.passes if args.passes is not None else DEFAULT_PASSES,
        concurrency=args.concurrency if args.concurrency is not None else DEFAULT_CONCURRENCY,
        engines=engines,
        dtype=dtype,
    )


def target_top_tokens(
    engine: Any, prompts: Sequence[Sequence[int]], outputs: Sequence[Sequence[int]]
) -> tuple[tuple[TopTokens | None, ...], ...]:
    """The target's best tokens at every token of each output, by one prefill in ``engine``.

    Each request is the prompt followed by its output, with ``return_logprob``
    and ``top_logprobs_num=TOP_TOKENS``. SGLang's entry for input position ``p`` is the
    distribution that predicted token ``p``, except that the first entry (at
    ``logprob_start_len``) is always None, so the start is the prompt's last
    token: its None entry is dropped and the rest are the distributions before
    every output token. One forward pass, not a second decode; the radix cache
    still serves the prompt up to the start.
    """
    requests = [list(p) + list(o) for p, o in zip(prompts, outputs, strict=True)]
    results = engine.generate(
        input_ids=requests,
        sampling_params={"temperature": 0.0, "max_new_tokens": 1},
        return_logprob=True,
        logprob_start_len=[len(p) - 1 for p in prompts],
        top_logprobs_num=TOP_TOKENS,
    )
    top = []
    for i, (res, out) in enumerate(zip(results, outputs, strict=True)):
        entries = res["meta_info"]["input_top_logprobs"]
        if len(entries) != len(out) + 1:
            raise RuntimeError(
                f"SGLang returned {len(entries)} input_top_logprobs for the last prompt token "
                f"and {len(out)} output tokens of prompt {i}; the near-tie check cannot align them"
            )
        top.append(top_tokens_from_sglang(entries[1:], f"prompt {i} input_top_logprobs"))
    return tuple(top)


def flush_radix_cache(engine: Any, wait_s: float = 30.0, poll_s: float = 0.05) -> None:
    """Empty ``engine``'s radix cache (SGLang's ``Engine.flush_cache``); raise if it refuses
    for ``wait_s`` seconds.

    SGLang refuses while its scheduler holds a request. A request whose output
    ``generate`` has already returned is retired only on the scheduler loop's next
    iteration, so a flush sent right after a pass can land before that (on a loaded
    machine it does) and is asked again every ``poll_s`` seconds. A refusal that
    outlasts ``wait_s`` means requests are still running between two finished
    passes: a bug worth stopping for.
    """
    deadline = time.monotonic() + wait_s
    while True:
        result = engine.flush_cache()
        if getattr(result, "success", False):
            return
        if time.monotonic() >= deadline:
            raise RuntimeError(
                f"SGLang refused to flush the radix cache between passes for {wait_s:g} s: "
                f"{result!r}"
            )
        time.sleep(poll_s)


def run_engines(
    specs: Mapping[str, Any],
    prompts: Sequence[Sequence[int]],
    warmup: Sequence[int],
    max_new_tokens: int,
    console: Any,
    top_tokens_of: str | None = None,
    passes: int = 1,
    concurrency: int | None = None,
) -> dict[str, EngineRun]:
    """Start the engines, warm each up, time ``passes`` passes of each in turns.

    ``specs`` maps a label to a ``CpuEngineSpec`` (with ``sleep_on_idle``); each engine
    runs in its own process (``engine_process``), passes in ``engine_process.turns``. A pass
    keeps ``concurrency`` requests in flight (all prompts at once when None): a request
    is sent as soon as one in flight finishes (``engine.generate_in_flight``), as a server
    under that many clients would see them; its wall time is the pass's. Per engine the
    figures are the first pass's outputs and the median wall time; a later pass whose
    outputs differ from the first's is counted (``differing_passes``).

    EOS is honoured (``ignore_eos=False``): the demo shows real answers; greedy
    runs of both engines stop at the same token anyway. The engine ``top_tokens_of``
    also computes, untimed, the target's best tokens along its outputs
    (``target_top_tokens``).
    """
    from dspark_sglang.sglang_integration.engine import generate_outputs, timed_in_flight
    from dspark_sglang.sglang_integration.engine_process import engine_processes, turns

    sampling = {"ignore_eos": False}
    width = len(prompts) if concurrency is None else concurrency
    if width < 1:
        raise ValueError(f"concurrency must be >= 1, got {concurrency}")
    if top_tokens_of is not None and top_tokens_of not in specs:
        raise ValueError(f"top_tokens_of={top_tokens_of!r} names no engine of {sorted(specs)}")
    sent = [list(p) for p in prompts]
    walls: dict[str, list[float]] = {label: [] for label in specs}
    outputs: dict[str, list[dict[str, Any]]] = {}
    differing: dict[str, list[list[list[int]]]] = {label: [] for label in specs}
    names = " and ".join(specs)
    with contextlib.ExitStack() as stack:
        with console.status(
            f"starting SGLang's engines on CPU for {names}, one after the other, each in its "
            "own process (each scheduler process loads the model; ~20-60 s each)"
        ):
            engines = stack.enter_context(engine_processes(specs))
            for engine in engines.values():
                engine.call(generate_outputs, [list(warmup)], 2, sampling)
        order = turns(list(specs), passes)
        for i, label in enumerate(order):
            with console.status(
                f"{label}: generating {len(prompts)} prompts, {width} in flight "
                f"(timed pass {len(walls[label]) + 1} of {passes}; {i + 1} of {len(order)} "
                "in all, engines in turns)"
            ):
                # Every pass starts from an empty radix cache: a later pass that found its
                # prompts cached would prefill only their last token, a different kernel
                # path whose rounding (bfloat16 above all) can flip a near-tie.
                engines[label].call(flush_radix_cache)
                wall, out = engines[label].call(
                    timed_in_flight, sent, max_new_tokens, width, sampling
                )
            walls[label].append(wall)
            if label not in outputs:
                outputs[label] = out
            elif [o["output_ids"] for o in out] != [o["output_ids"] for o in outputs[label]]:
                differing[label].append([list(o["output_ids"]) for o in out])
        tops: tuple[tuple[TopTokens | None, ...], ...] = ()
        if top_tokens_of is not None:
            with console.status(
                f"{top_tokens_of}: target's best tokens along the outputs (untimed)"
            ):
                tops = engines[top_tokens_of].call(
                    target_top_tokens, sent, [o["output_ids"] for o in outputs[top_tokens_of]]
                )
        for label in specs:
            each = ", ".join(f"{w:.2f}" for w in walls[label])
            console.print(f"{label}: {each} s", highlight=False)
        console.print("shutting the engines down", highlight=False)
    return {
        label: EngineRun.from_outputs(
            label,
            outputs[label],
            statistics.median(walls[label]),
            tops if label == top_tokens_of else (),
            pass_walls=walls[label] if passes > 1 else (),
            differing_outputs=differing[label],
        )
        for label in specs
    }


def run_sglang_demo(
    args: argparse.Namespace, model_path_fn: Any, default_dir: Path, console: Any
) -> int:
    """The ``--engine sglang`` demo; exit code 0 ok, 1 outputs differ, 2 unusable input.

    ``model_path_fn(console)`` fetches/converts the target (it may take a while
    on first use) and returns its HF folder.
    """
    import subprocess
    import sys

    from dspark_sglang.sglang_integration.engine import CpuEngineSpec

    os.environ.setdefault("SGLANG_USE_CPU_ENGINE", "1")  # before anything imports sglang
    with tempfile.TemporaryDirectory(prefix="dspark-demo-") as tmp:
        try:
            check_sglang_flags(args)
            model_path = Path(model_path_fn(console))
            plan = plan_demo(args, model_path, default_dir, Path(tmp), console)
        except (ValueError, FileNotFoundError, OSError, subprocess.CalledProcessError) as exc:
            print(f"demo: error: {exc}", file=sys.stderr)
            return 2
        _, tokenizer = _target_spec(plan.model_path)
        warmup = tokenizer(_WARMUP_TEXT, add_special_tokens=False)["input_ids"]
        # Errors only: SGLang's CPU start-up logs a page of irrelevant GPU/import warnings.
        # sleep_on_idle: the engine waiting for its turn sleeps instead of polling.
        base = {
            "host": _HOST,
            "log_level": "error",
            "dtype": plan.dtype.dtype,
            "sleep_on_idle": True,
        }
        specs = {
            "plain": CpuEngineSpec(
                model_path=str(plan.model_path), overrides=base, omp_threads=plan.omp_threads
            )
        }
        for engine in plan.engines:
            specs[engine.label] = CpuEngineSpec(
                model_path=str(plan.model_path),
                overrides={
                    **base,
                    "speculative_algorithm": "DSPARK_MOE",
                    "speculative_draft_model_path": str(plan.drafter_dir),
                },
                env=engine.env,
                omp_threads=plan.omp_threads,
            )
        policies = ", ".join(
            f"{e.policy} (SGLang's own decision: the whole block)"
            if e.scheduler_config is None
            else e.policy
            for e in plan.engines
        )
        console.print(
            f"target {plan.model_path.name}, drafter {plan.drafter_dir.name} "
            f"({'trained' if plan.trained else 'UNTRAINED'}), {len(plan.prompts)} prompts x "
            f"<= {plan.max_new_tokens} new tokens, {plan.concurrency} request(s) in flight, "
            f"greedy, {plan.dtype.dtype}; DSPARK_MOE verify policies: {policies}",
            soft_wrap=True,
        )
        console.print(
            f"draft: argmax ({GREEDY_DRAFT_ENV}={plan.dspark_env[GREEDY_DRAFT_ENV]}), "
            "because every demo request is greedy: the drafter skips sampling, "
            "verification stays lossless",
            soft_wrap=True,
            highlight=False,
        )
        n = getattr(args, "context_copy", None)
        n = default_ngram(True) if n is None else n  # every demo request is greedy
        console.print(
            f"context copies: {n}-gram in every policy's scheduler config (where a request's "
            f"last {n} tokens occurred before, the next draft is the token that followed them; "
            f"'{SGLANG_DECISION}' has no config, so none; --context-copy 0 turns them off)"
            if n
            else "context copies: off (--context-copy 0)",
            soft_wrap=True,
            highlight=False,
        )
        try:
            runs = run_engines(
                specs,
                plan.prompts,
                warmup,
                plan.max_new_tokens,
                console,
                top_tokens_of="plain",
                passes=plan.passes,
                concurrency=plan.concurrency,
            )
            plain = runs["plain"]
            spec_runs = [runs[e.label] for e in plan.engines]
        except ImportError as exc:
            print(
                f"demo: error: SGLang is not importable ({exc}); build the venv with "
                "scripts/setup.sh (it installs the lean CPU SGLang) or use --engine reference",
                file=sys.stderr,
            )
            return 2
        except RuntimeError as exc:  # SGLang reports a failed start-up as RuntimeError
            print(f"demo: error: SGLang's engine failed: {exc}", file=sys.stderr)
            return 2
    ok = report(console, plain, spec_runs, plan.dtype.dtype)
    console.rule(f"first answer ({spec_runs[0].label})")
    console.print(tokenizer.decode(list(spec_runs[0].outputs[0]), skip_special_tokens=True))
    return 0 if ok else 1
