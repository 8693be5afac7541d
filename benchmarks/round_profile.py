"""Where a DSPARK_MOE decode round spends its time, next to a plain decode step (SGLang CPU).

What is measured, in SGLang's real CPU engine (``sglang_integration.engine``), one engine
at a time, as ``dspark-sglang demo --engine sglang`` runs them:

* Target SmolLM2-135M-Instruct; drafter: the embedded one
  (``dspark_sglang/assets/drafters/smollm2/``, or ``--drafter``); prompts: the demo's
  GSM8K chats (``data.demo_prompts``), sent ``--concurrency`` at a time (default 1:
  batch 1), greedy, ``--new-tokens`` each with EOS ignored; ``--dtype`` (default
  bfloat16), ``--threads`` OpenMP threads; verify lengths by SGLang's own decision
  unless ``--policy`` names ours.
* Inside each engine's scheduler process the profiling aid
  ``DSPARK_PROFILE_ROUNDS`` (``sglang_integration/round_profile.py``) times every decode
  round of DSPARK_MOE phase by phase (draft backbone forward, draft LM head, Markov
  sequential loop, confidence head, budget and policy decision, target verify forward,
  accept, hidden-state commit into the draft KV, observers and metrics), and every plain
  decode step of the plain engine (``TpModelWorker.forward_batch_generation`` on a decode
  batch). Execution on CPU is synchronous, so wall time per phase is its compute.
* One DSPARK_MOE engine and one plain engine, each in its own process
  (``engine_process``), started one after the other and alive together; the one
  waiting for its turn sleeps (SGLang's ``sleep_on_idle``). Each gets an untimed warm-up
  request, then ``--repeats`` timed passes over the prompts, the two engines taking
  turns (DSPARK_MOE, plain, plain, DSPARK_MOE, ...: ``engine_process.turns``), so the
  machine's drift over minutes hits both alike; only a pass's steps count (two
  snapshots of the running totals, subtracted). Repeat ``r`` pairs pass ``r`` of both
  engines. Every pass starts from an empty radix cache (as the demo's), so every pass
  computes the same text: in bfloat16 a cached prompt's shorter prefill can flip a
  near-tie.

Reported per phase: mean ms per round, share of the round, and the same in plain decode
steps; the round / plain step ratio; accepted tokens per round (SGLang's
``spec_verify_ct``) and so the round's break-even. Median and range over ``--repeats``.
The rows add up to the round by construction; the ``unattributed remainder`` row is what
no wrapper saw, and the run checks it stays within ``--tolerance`` of the round (printed
and stored as ``sanity``). The plain and DSPARK_MOE outputs must be token-identical
(greedy verification is lossless); the count is stored.

Usage: ``python benchmarks/round_profile.py [--num-prompts 4] [--new-tokens 80]
[--repeats 3] [--dtype bfloat16] [--policy NAME] [--label before] [--out FILE]``.
Without ``--out`` the JSON goes to a fresh run folder; the committed result is
``--out benchmarks/results/round_profile.json``. Shared machines are noisy: the JSON
records the load average; read shares and ratios, not milliseconds.
"""

from __future__ import annotations

import argparse
import importlib.metadata as md
import os
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from dspark_sglang.bench.round_profile_report import combine, repeat_result, table
from dspark_sglang.results import default_out, dump_json, software_versions
from dspark_sglang.scheduling.config import POLICIES
from dspark_sglang.sglang_integration import round_profile as rp
from dspark_sglang.sglang_integration.launch import SGLANG_DECISION

ENGINES = ("plain", "dspark_moe")
#: Start order: DSPARK_MOE first, so that a start-up failure (it needs more memory) costs
#: no plain pass.
START_ORDER = ("dspark_moe", "plain")


def settled_snapshot(path: Path, *, quiet_s: float = 0.3, timeout_s: float = 10.0) -> dict:
    """The snapshot once it stops changing (a step still in flight lands first)."""
    last = rp.read_snapshot(path)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        time.sleep(quiet_s)
        now = rp.read_snapshot(path)
        if now == last:
            return now
        last = now
    return last


def run_engines(
    specs: Mapping[str, Any],
    paths: Mapping[str, Path],
    prompts: Sequence[Sequence[int]],
    warmup: Sequence[int],
    new: int,
    passes: int,
    console: Any,
    concurrency: int = 1,
) -> dict[str, list[dict[str, Any]]]:
    """Start the engines (``specs``, in order, each profiling into ``paths[name]``), alive
    together; ``passes`` timed passes of each over the prompts in turns, ``concurrency``
    requests in one batch at a time, each pass its own snapshot difference."""
    from dspark_sglang.sglang_integration.demo import flush_radix_cache
    from dspark_sglang.sglang_integration.demo_report import EngineRun
    from dspark_sglang.sglang_integration.engine import generate_outputs, timed_in_batches
    from dspark_sglang.sglang_integration.engine_process import engine_processes, turns

    out: dict[str, list[dict[str, Any]]] = {name: [] for name in specs}
    with engine_processes(specs) as engines:
        for engine in engines.values():
            engine.call(generate_outputs, [list(warmup)], 8)  # untimed: first-call set-up
        for name in turns(list(specs), passes):
            engine, path = engines[name], paths[name]
            label = specs[name].overrides.get("speculative_algorithm", "plain")
            startup = round(engine.startup_s or 0.0, 1)
            # Every pass from an empty radix cache, as the demo's: a later pass would
            # otherwise prefill only its prompts' last token, another kernel path whose
            # bfloat16 rounding can flip a near-tie, and no longer compute the first's text.
            engine.call(flush_radix_cache)
            before = settled_snapshot(path)
            wall, outputs = engine.call(timed_in_batches, prompts, new, concurrency)
            after = settled_snapshot(path)
            out[name].append(
                {
                    "delta": rp.delta(before, after),
                    "wall_s": wall,
                    "startup_s": startup,
                    "run": EngineRun.from_outputs(label, outputs, wall),
                }
            )
            console.print(
                f"{label}: pass {len(out[name])}/{passes} {wall:.1f} s (engine start-up "
                f"{startup} s)",
                highlight=False,
            )
    return out


def demo_plan_args(args: argparse.Namespace) -> argparse.Namespace:
    """The ``demo`` flags ``plan_demo`` reads, from this benchmark's own."""
    return argparse.Namespace(
        drafter=args.drafter,
        seed=args.seed,
        # One DSPARK_MOE engine: the benchmark's policy, or SGLang's own decision.
        policy=args.policy or SGLANG_DECISION,
        compare=(),
        sts=args.sts if args.policy else None,
        cost_table=args.cost_table,
        static_k=args.static_k,
        num_prompts=args.num_prompts,
        max_new_tokens=args.new_tokens,
        threads=args.threads,
        dtype=args.dtype,
        passes=None,  # this benchmark times its own passes (--repeats)
        concurrency=args.concurrency,
    )


def main(argv: Sequence[str] | None = None) -> int:
    from dspark_sglang.targets.smollm2 import DEFAULT_DRAFTER_DIR

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--num-prompts", type=int, default=4)
    ap.add_argument("--new-tokens", type=int, default=80)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument(
        "--concurrency", type=int, default=1, help="requests sent as one batch (default 1)"
    )
    ap.add_argument("--dtype", choices=("float32", "bfloat16"), default="bfloat16")
    ap.add_argument("--threads", type=int, default=1, help="OpenMP threads per scheduler")
    ap.add_argument("--drafter", type=Path, default=DEFAULT_DRAFTER_DIR)
    ap.add_argument(
        "--policy",
        choices=POLICIES,
        default=None,
        help="our verify policy (default: SGLang's own decision)",
    )
    ap.add_argument("--static-k", type=int, default=None, help="drafts for --policy static")
    ap.add_argument("--cost-table", type=Path, default=None, help="for --policy prefix/lagged")
    ap.add_argument("--sts", type=Path, default=None, help="STS file (default: the drafter's)")
    ap.add_argument(
        "--mem-fraction-static",
        type=float,
        default=0.15,
        help="SGLang's share of RAM for weights + KV pool (0.08, the CPU default, "
        "is refused by DSPARK_MOE when other jobs hold memory)",
    )
    ap.add_argument("--tolerance", type=float, default=0.05, help="max unattributed share")
    ap.add_argument("--label", default="before", help="stored as the result's label")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--out",
        type=Path,
        default=None,
        help="result JSON (default: round_profile.json in a fresh run folder, "
        "<cache>/runs/bench/round_profile-<UTC time>/)",
    )
    args = ap.parse_args(argv)
    for name in ("num_prompts", "new_tokens", "repeats", "threads", "concurrency"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.new_tokens < 2:
        ap.error("--new-tokens must be >= 2 (the first token comes from prefill)")
    if not 0 < args.mem_fraction_static < 1:
        ap.error(f"--mem-fraction-static must be in (0, 1), got {args.mem_fraction_static}")
    if not 0 < args.tolerance < 1:
        ap.error(f"--tolerance must be a fraction in (0, 1), got {args.tolerance}")
    if args.policy is None and (args.static_k, args.cost_table) != (None, None):
        ap.error("--static-k / --cost-table feed our policy: give --policy too")

    os.environ.setdefault("SGLANG_USE_CPU_ENGINE", "1")  # before anything imports sglang
    from rich.console import Console

    from dspark_sglang.sglang_integration.demo import _target_spec, plan_demo
    from dspark_sglang.sglang_integration.engine import CpuEngineSpec
    from dspark_sglang.sglang_integration.launch import GREEDY_DRAFT_ENV
    from dspark_sglang.targets.smollm2 import ensure_smollm2

    console = Console(stderr=True)
    model_path = Path(ensure_smollm2())
    with tempfile.TemporaryDirectory(prefix="round_profile-") as tmp:
        plan = plan_demo(demo_plan_args(args), model_path, args.drafter, Path(tmp), console)
        if not plan.trained:
            raise SystemExit(f"round_profile: {args.drafter} holds no drafter checkpoint")
        _, tokenizer = _target_spec(plan.model_path)
        warmup = tokenizer("Hello", add_special_tokens=False)["input_ids"]
        base = {
            "host": "127.0.0.1",
            "log_level": "error",
            "dtype": args.dtype,
            "mem_fraction_static": args.mem_fraction_static,
            # Both engines are alive together; the one waiting for its turn sleeps.
            "sleep_on_idle": True,
        }
        specs = {
            "plain": (base, {}),
            "dspark_moe": (
                {
                    **base,
                    "speculative_algorithm": "DSPARK_MOE",
                    "speculative_draft_model_path": str(plan.drafter_dir),
                },
                plan.dspark_env,
            ),
        }
        result: dict[str, Any] = {
            "label": args.label,
            "settings": {
                "target": "smollm2 (SmolLM2-135M-Instruct)",
                "drafter": str(plan.drafter_dir),
                "prompts": f"demo chats (data.demo_prompts), {len(plan.prompts)} prompts, "
                f"{args.concurrency} request(s) per batch",
                "concurrency": args.concurrency,
                "prompt_tokens": [len(p) for p in plan.prompts],
                "new_tokens": args.new_tokens,
                "sampling": "greedy, EOS ignored",
                "draft": f"{GREEDY_DRAFT_ENV}={plan.dspark_env[GREEDY_DRAFT_ENV]} (as the demo)",
                "dtype": args.dtype,
                "threads": args.threads,
                "mem_fraction_static": args.mem_fraction_static,
                "policy": args.policy or "SGLang's own decision (ragged verify mode static)",
                "repeats": args.repeats,
                "tolerance": args.tolerance,
                "order": "one DSPARK_MOE engine and one plain engine, each in its own "
                "process, started in that order and alive together (sleep_on_idle); each: "
                "an untimed warm-up request (8 tokens), then --repeats timed passes over "
                "the prompts, each from an empty radix cache, the engines in turns "
                "(engine_process.turns); repeat r pairs pass r of both engines",
                "profiling": f"{rp.ENV} (dspark_sglang/sglang_integration/round_profile.py)",
                "sglang_engine": "CPU engine (intel_amx attention, pytorch sampling)",
            },
            "versions": {**software_versions(), "sglang": md.version("sglang")},
            "loadavg_start": os.getloadavg(),
        }
        raw: list[dict[str, Any]] = []
        repeats: list[dict[str, Any]] = []
        identical: list[int] = []
        paths = {name: Path(tmp) / f"{name}.json" for name in START_ORDER}
        engine_specs = {
            name: CpuEngineSpec(
                model_path=str(plan.model_path),
                overrides=specs[name][0],
                env={**specs[name][1], rp.ENV: str(paths[name])},
                omp_threads=args.threads,
            )
            for name in START_ORDER
        }
        passes = run_engines(
            engine_specs,
            paths,
            plan.prompts,
            warmup,
            args.new_tokens,
            args.repeats,
            console,
            args.concurrency,
        )
        for rep in range(args.repeats):
            runs = {name: passes[name][rep] for name in ENGINES}
            spec_run = runs["dspark_moe"]["run"]
            same = sum(
                a == b for a, b in zip(runs["plain"]["run"].outputs, spec_run.outputs, strict=True)
            )
            identical.append(same)
            repeats.append(
                repeat_result(
                    runs["plain"]["delta"],
                    runs["dspark_moe"]["delta"],
                    spec_tokens=spec_run.num_tokens,
                    verify_rounds=spec_run.verify_rounds,
                )
            )
            raw.append(
                {
                    name: {
                        "timers": runs[name]["delta"],
                        "wall_s": runs[name]["wall_s"],
                        "engine_startup_s": runs[name]["startup_s"],
                        "tokens": runs[name]["run"].num_tokens,
                        "verify_rounds": runs[name]["run"].verify_rounds,
                    }
                    for name in ENGINES
                }
            )
    result["loadavg_end"] = os.getloadavg()
    result["identical_outputs"] = {"prompts": len(plan.prompts), "per_repeat": identical}
    result["repeats"] = repeats
    result["raw"] = raw
    result["summary"] = combined = combine(repeats, args.tolerance)
    print(table(combined))
    print(f"identical greedy outputs, plain vs DSPARK_MOE: {identical} of {len(plan.prompts)}")
    out = args.out or default_out("round_profile", "round_profile.json")
    print(f"wrote {dump_json(out, result)}")
    lossless = all(n == len(plan.prompts) for n in identical)
    return 0 if combined["sanity"]["ok"] and lossless else 1


if __name__ == "__main__":
    raise SystemExit(main())
