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

Where the parts live: this module holds the demo's verify policies (``DEFAULT_POLICY``,
``DEFAULT_COMPARE``), its plan (``DemoEngine``, ``DemoPlan``, ``check_sglang_flags``,
``plan_demo``) and the entry point ``run_sglang_demo``; ``demo_setup`` resolves the
drafter and writes the scheduler configs, ``demo_engines`` starts and times the engines
and ``demo_report`` prints the figures. The names other modules use from ``demo_setup``
and ``demo_engines`` are re-exported here.
"""

from __future__ import annotations

import argparse
import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dspark_sglang.model.context_copy import default_ngram
from dspark_sglang.sglang_integration.cpu_dtype import DtypeChoice, choose_cpu_dtype, read_cpuinfo
from dspark_sglang.sglang_integration.demo_engines import (
    flush_radix_cache,
    run_engines,
    target_top_tokens,
)
from dspark_sglang.sglang_integration.demo_report import report
from dspark_sglang.sglang_integration.demo_setup import (
    ENGINE_POLICIES,
    PRICED_SUFFIX,
    DemoError,
    _target_spec,
    cost_table_dtype,
    resolve_drafter,
    split_policy,
    write_scheduler_config,
)
from dspark_sglang.sglang_integration.launch import GREEDY_DRAFT_ENV, SGLANG_DECISION, scheduler_env

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
#: Third-party warnings the demo's engines do not print (``warnings`` filter syntax).
QUIET_WARNINGS = ",".join(
    f"ignore:{prefix}:UserWarning"
    for prefix in ("Only CUDA", "Triton is not supported", "resource_tracker")
)
_HOST = "127.0.0.1"  # SGLang's engine binds only loopback ports (dist init); say so explicitly


#: Timed passes per engine when ``--passes`` is not given: the median of 3 is what a
#: reader can trust on a shared machine, where one pass can be off by a third.
DEFAULT_PASSES = 3

#: Requests in flight when ``--concurrency`` is not given: one, the per-request latency
#: speculative decoding exists to cut (a batch makes a verify of every draft dearer while
#: plain decoding gains from the batch).
DEFAULT_CONCURRENCY = 1


#: The verify policy of the DSPARK_MOE engine the report leads with when ``--policy`` is
#: not given: the policy and draft decision of the chart's default tier, our hardware-aware
#: scheduler on each request's confidences from ``lag_steps`` rounds back, on a cost table
#: the worker measures at start-up in the engine's own settings and the drafter's STS
#: file, drafting only in steps where a drafting round pays (``draft_decision: priced``).
DEFAULT_POLICY = "lagged" + PRICED_SUFFIX


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
    # Inherited by every engine process: SGLang's notes that its GPU kernels are missing
    # on a CPU, and the semaphores it leaves to the resource tracker, say nothing about
    # this run. A PYTHONWARNINGS of your own (e.g. `default`) shows everything.
    os.environ.setdefault("PYTHONWARNINGS", QUIET_WARNINGS)
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
