"""Speed of speculative decoding in SGLang's CPU engine: plain vs DSPARK_MOE vs NGRAM, side by side.

The project's headline speed figure. In one run, on the same prompts, SGLang's real CPU
engine (``sglang_integration.engine``) decodes with

* ``plain``: no speculation;
* ``--speculative-algorithm DSPARK_MOE`` with the embedded drafter
  (``dspark_sglang/assets/drafters/smollm2/``, or ``--drafter``), once per verify policy in
  ``--policies``: ``sglang`` is SGLang's own decision (the whole block, ragged verify
  mode ``static``, no scheduler config); any other name is our policy, routed through a
  ``SchedulerConfig`` file as ``dspark-sglang demo --policy`` writes it (with the
  drafter's ``sts.json``; ``prefix`` / ``lagged`` without ``--cost-table`` measure their
  cost table when the worker starts);
* ``--speculative-algorithm NGRAM``: SGLang's prompt-lookup speculation (no drafter, its
  default settings), the no-training peer; ``--no-ngram`` leaves it out.

The grid: prompt sets (``--sets``, chat template applied: GSM8K test, HumanEval, MT-Bench
first turns) x concurrency levels (``--concurrency``) x temperatures (``--temperatures``).
Every cell has its own ``--prompts-per-cell`` prompts ``n`` (default 8, at least the
highest concurrency), distinct from every other cell's: cell ``j`` of a set, counting that
set's cells in grid order (concurrency-major, then temperature), takes the set's prompts
``j*n .. j*n+n-1``, so a set needs ``n`` x (concurrency levels x temperatures) prompts and
the run stops with an error naming the flags when it has fewer. Every engine gets the same
prompts in the same cell, so each plain-vs-speculative comparison stays paired. A cell at
concurrency ``c`` keeps ``c`` requests in flight (``engine.generate_in_flight``: SGLang's
``async_generate``, the next prompt sent as soon as a request finishes, in prompt order),
as a server under ``c`` concurrent clients; its tokens/s is the tokens generated over the
cell's wall time. (Batches of ``c`` prompts, each waiting for its slowest request, would
charge a speculative engine, whose requests finish in different numbers of rounds, for
stragglers that plain decoding never has.)
``--max-new-tokens`` (default 64) per request, EOS ignored, so every engine generates the
same number of tokens. Temperature 0 is greedy; temperature > 0 samples with no top-k /
top-p, the engines seeded with ``--seed``.

Each repeat starts every engine once, each in its own process
(``sglang_integration.engine_process``), one after the other in an order rotated by one
engine per repeat, and keeps them all alive for the repeat: an engine waiting for its
turn sleeps (SGLang's ``sleep_on_idle``) and takes no CPU from the one being timed. Each
gets an untimed warm-up request per temperature (on a different prompt). Then the cells
run set by set, and within a cell the engines take turns, in the start order in even
cells and reversed in odd ones (``engine_process.turns``), so every engine's figure for a
cell is timed within a minute or so of the others' and the machine's drift hits them
alike. Right before its turn in a cell an engine prefills that cell's prompts once,
untimed (one token each), so every timed cell finds its prompts' prefill in the radix
cache: the cells time decoding, the part speculation changes. NGRAM's n-gram corpus still
holds what the engine generated in earlier cells, but for other prompts, never the
cell's own.

A row is one cell and one speculative engine, against the plain engine's same cell of the
same repeat: tokens/s of both, their ratio (per repeat, then median and range over
``--repeats``), SGLang's accepted length per verify round (completion tokens over
``spec_verify_ct`` from ``meta_info``, bonus token included, as the demo reads it), and,
at temperature 0, whether every output was token-identical to plain's in every repeat
(greedy verification is lossless) and, where one was not, whether each divergence is a
numerical near-tie (``lossless``, the demo's rule in ``greedy_check``: the plain engine
computes, untimed after each greedy cell, the target's best tokens along its outputs; a
divergence where both tokens are within the dtype's rounding tolerance of the target's
best is a near-tie, anything else a bug). Each row keeps every repeat's raw figures.

On CPU SGLang's NGRAM verifies greedily whatever the temperature (``eagle_sample``: no
sampling-verify kernel on CPU), so at temperature > 0 its outputs are the target's greedy
continuations, not samples: those rows carry a ``note``. DSPARK_MOE samples its verify on
CPU (``cpu_sampling.py``).

Usage: ``python benchmarks/cpu_speedup.py [--sets gsm8k humaneval mtbench]
[--concurrency 1 4 8] [--temperatures 0 1] [--policies sglang mtp1 prefix] [--no-ngram]
[--prompts-per-cell 8] [--max-new-tokens 64] [--repeats 3] [--dtype auto] [--threads 1]
[--out FILE]``. Without ``--out`` the JSON goes to a fresh run folder,
``<cache>/runs/bench/cpu_speedup-<UTC time>/cpu_speedup.json``; the committed result is
``--out benchmarks/results/cpu_speedup.json``. Exit 1 when a greedy row has a divergence
that is not a near-tie. Timings on shared machines are noisy: the JSON records the load
average; read the ratios, measured side by side in one run.

This script parses the flags and writes the JSON; the grid, the rows and the engine runs
are ``dspark_sglang/bench/cpu_speedup/`` (re-exported here).
"""

from __future__ import annotations

import argparse
import importlib.metadata as md
import math
import os
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dspark_sglang.bench.cpu_speedup.grid import (
    DSPARK,
    NGRAM,
    PLAIN,
    SETS,
    Cell,
    Engine,
    cell_prompt_slices,
    cell_prompts,
    check_cell_size,
    check_set_size,
    engines,
    grid,
    prompts_needed,
    rotated,
)
from dspark_sglang.bench.cpu_speedup.rows import (
    NGRAM_SAMPLED_NOTE,
    ROW_KEYS,
    build_rows,
    check_row,
    not_identical,
    not_lossless,
    spread,
    table,
)
from dspark_sglang.bench.cpu_speedup.run import (
    encoded_prompts,
    engine_specs,
    run_repeat,
    sampling,
    stderr_console,
)
from dspark_sglang.results import default_out, dump_json, software_versions
from dspark_sglang.sglang_integration.launch import SGLANG_DECISION

__all__ = [
    "DSPARK",
    "NGRAM",
    "NGRAM_SAMPLED_NOTE",
    "PLAIN",
    "ROW_KEYS",
    "SETS",
    "Cell",
    "Engine",
    "build_rows",
    "cell_prompt_slices",
    "cell_prompts",
    "check_cell_size",
    "check_row",
    "check_set_size",
    "encoded_prompts",
    "engine_specs",
    "engines",
    "grid",
    "main",
    "not_identical",
    "not_lossless",
    "parse_args",
    "parser",
    "prompts_needed",
    "rotated",
    "run_repeat",
    "sampling",
    "spread",
    "stderr_console",
    "table",
]

# --------------------------------------------------------------------------- arguments


def parser() -> argparse.ArgumentParser:
    from dspark_sglang.cli.base import context_copy_ngram
    from dspark_sglang.model.context_copy import DEFAULT_NGRAM
    from dspark_sglang.sglang_integration.demo import ENGINE_POLICIES
    from dspark_sglang.targets.smollm2 import DEFAULT_DRAFTER_DIR

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sets", nargs="+", choices=SETS, default=list(SETS))
    ap.add_argument("--concurrency", nargs="+", type=int, default=[1, 4, 8])
    ap.add_argument("--temperatures", nargs="+", type=float, default=[0.0, 1.0])
    ap.add_argument(
        "--policies",
        nargs="*",
        choices=(SGLANG_DECISION, *ENGINE_POLICIES),
        default=[SGLANG_DECISION, "mtp1", "prefix"],
        help="DSPARK_MOE verify policies, one engine each ('sglang': SGLang's own decision; "
        "give the flag with no name for no DSPARK_MOE engine)",
    )
    ap.add_argument(
        "--ngram",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also run SGLang's NGRAM speculation (default: yes)",
    )
    ap.add_argument(
        "--prompts-per-cell",
        type=int,
        default=8,
        help="distinct prompts per cell (each cell its own; a set needs this x its cells); "
        "at least the highest --concurrency",
    )
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--dtype", choices=("auto", "float32", "bfloat16"), default="auto")
    ap.add_argument("--threads", type=int, default=1, help="OpenMP threads per scheduler")
    ap.add_argument("--drafter", type=Path, default=DEFAULT_DRAFTER_DIR)
    ap.add_argument("--static-k", type=int, default=None, help="drafts for policy static")
    ap.add_argument(
        "--cost-table",
        type=Path,
        default=None,
        help="SPS cost table for prefix/lagged (default: measured when the worker starts)",
    )
    ap.add_argument("--sts", type=Path, default=None, help="STS file (default: the drafter's)")
    ap.add_argument(
        "--context-copy",
        type=context_copy_ngram,
        default=None,
        metavar="N",
        help="context copies in every DSPARK_MOE policy's scheduler config (N trailing "
        f"tokens; 0 = off; 'sglang' has no config, so no copies). Default: {DEFAULT_NGRAM} "
        "when every --temperatures is 0, else off (one config serves every cell)",
    )
    ap.add_argument(
        "--mem-fraction-static",
        type=float,
        default=0.25,
        help="SGLang's share of RAM for weights + KV pool, every engine (a wide margin: "
        "SGLang re-measures free RAM at start-up, which drifts when other jobs run)",
    )
    ap.add_argument(
        "--max-total-tokens",
        type=int,
        default=8192,
        help="KV pool cap in tokens, every engine (keeps the wide margin's memory small)",
    )
    ap.add_argument("--seed", type=int, default=0, help="engines' random seed")
    ap.add_argument(
        "--out",
        type=Path,
        default=None,
        help="result JSON (default: cpu_speedup.json in a fresh run folder, "
        "<cache>/runs/bench/cpu_speedup-<UTC time>/)",
    )
    return ap


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Parsed and checked flags; a bad one exits 2 with a message naming it."""
    ap = parser()
    args = ap.parse_args(argv)
    for name in ("prompts_per_cell", "max_new_tokens", "repeats", "threads", "max_total_tokens"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    for flag, values in (
        ("--sets", args.sets),
        ("--concurrency", args.concurrency),
        ("--temperatures", args.temperatures),
        ("--policies", args.policies),
    ):
        if len(set(values)) != len(values):
            ap.error(f"{flag} lists a value twice: {values}")
    if min(args.concurrency) < 1:
        ap.error(f"--concurrency levels must be >= 1, got {args.concurrency}")
    if min(args.temperatures) < 0 or not all(math.isfinite(t) for t in args.temperatures):
        ap.error(f"--temperatures must be finite and >= 0, got {args.temperatures}")
    if args.prompts_per_cell < max(args.concurrency):
        ap.error(
            f"--prompts-per-cell {args.prompts_per_cell} cannot fill a call at concurrency "
            f"{max(args.concurrency)}: give at least {max(args.concurrency)}"
        )
    if not args.policies and not args.ngram:
        ap.error("nothing to compare: give --policies or drop --no-ngram")
    if args.context_copy is None:
        from dspark_sglang.model.context_copy import default_ngram

        args.context_copy = default_ngram(all(t == 0 for t in args.temperatures))
    if not 0 < args.mem_fraction_static < 1:
        ap.error(f"--mem-fraction-static must be in (0, 1), got {args.mem_fraction_static}")
    from dspark_sglang.scheduling.config import NEEDS_COST_TABLE
    from dspark_sglang.sglang_integration.demo import split_policy

    base_policies = {split_policy(p)[0] for p in args.policies}
    if args.cost_table is not None and not base_policies & set(NEEDS_COST_TABLE):
        ap.error(f"--cost-table feeds policies {'/'.join(NEEDS_COST_TABLE)}: none is selected")
    if ("static" in args.policies) != (args.static_k is not None):
        ap.error("--static-k goes with policy static, and policy static needs --static-k")
    if args.sts is not None and not set(args.policies) - {SGLANG_DECISION}:
        ap.error("--sts feeds our policies; SGLang's own decision (policy sglang) reads none")
    for flag, value in (("--cost-table", args.cost_table), ("--sts", args.sts)):
        if value is not None and not value.is_file():
            ap.error(f"{flag} {value}: no such file")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("SGLANG_USE_CPU_ENGINE", "1")  # before anything imports sglang
    from dspark_sglang.sglang_integration.cpu_dtype import choose_cpu_dtype, read_cpuinfo
    from dspark_sglang.sglang_integration.demo import _target_spec
    from dspark_sglang.targets.smollm2 import ensure_smollm2

    console = stderr_console()
    model_path = Path(ensure_smollm2())
    dtype = choose_cpu_dtype(args.dtype, read_cpuinfo() if args.dtype == "auto" else None)
    console.print(dtype.describe(), highlight=False)
    cells = grid(args.sets, args.concurrency, args.temperatures)
    all_engines = engines(args.policies, args.ngram)
    speculative = all_engines[1:]
    with tempfile.TemporaryDirectory(prefix="cpu_speedup-") as tmp:
        try:
            specs, configs, drafter_dir = engine_specs(args, all_engines, model_path, dtype, tmp)
        except (ValueError, OSError) as exc:
            print(f"cpu_speedup: error: {exc}", file=sys.stderr)
            return 2
        _, tokenizer = _target_spec(model_path)
        slices = cell_prompt_slices(cells, args.prompts_per_cell)
        try:
            per_set = {
                s: encoded_prompts(tokenizer, s, n, args.prompts_per_cell)
                for s, n in prompts_needed(cells, args.prompts_per_cell).items()
            }
            # One map for every engine: the plain-vs-speculative comparisons stay paired.
            prompts = cell_prompts(cells, per_set, args.prompts_per_cell)
        except ValueError as exc:
            print(f"cpu_speedup: error: {exc}", file=sys.stderr)
            return 2
        warmup = tokenizer("Hello", add_special_tokens=False)["input_ids"]
        result: dict[str, Any] = {
            "settings": {
                "target": "smollm2 (SmolLM2-135M-Instruct)",
                "drafter": str(drafter_dir) if drafter_dir else None,
                "sets": args.sets,
                "concurrency": args.concurrency,
                "temperatures": args.temperatures,
                "policies": args.policies,
                "context_copy_ngram": args.context_copy,
                "ngram": args.ngram,
                "prompts_per_cell": args.prompts_per_cell,
                # Per set, per cell in the grid's order of that set's cells.
                "prompt_tokens": {
                    s: [[len(p) for p in prompts[c]] for c in cells if c.prompt_set == s]
                    for s in args.sets
                },
                "prompt_indices": {
                    s: [[slices[c].start, slices[c].stop] for c in cells if c.prompt_set == s]
                    for s in args.sets
                },
                "max_new_tokens": args.max_new_tokens,
                "sampling": "EOS ignored; temperature 0 greedy, else temperature only "
                "(no top-k / top-p), engines seeded with --seed",
                "seed": args.seed,
                "dtype": dtype.dtype,
                "dtype_reason": dtype.describe(),
                "threads": args.threads,
                "mem_fraction_static": args.mem_fraction_static,
                "max_total_tokens": args.max_total_tokens,
                "cost_table": str(args.cost_table) if args.cost_table else None,
                "scheduler_configs": configs,
                "repeats": args.repeats,
                "cell": "each cell its own prompts: cell j of a set (grid order: concurrency, "
                "then temperature) sends the set's prompts j*n .. j*n+n-1 (n = "
                "prompts_per_cell; prompt_indices), the same for every engine; concurrency c: "
                "c requests in flight, the next prompt sent as one finishes (async_generate); "
                "tok/s = tokens / wall time of the cell",
                "order": "each repeat starts every engine once, each in its own process, one "
                "after the other in an order rotated by one per repeat, all alive for the "
                "repeat (sleep_on_idle: a waiting engine sleeps); untimed warm-up per "
                "temperature; then cell by cell the engines take turns, in the start order in "
                "even cells and reversed in odd ones (raw[].cell_orders); right before its "
                "turn an engine's untimed one-token pass over the cell's prompts puts their "
                "prefill in the radix cache; NGRAM's corpus carries earlier cells' outputs, "
                "for other prompts",
                "sglang_engine": "CPU engine (intel_amx attention, pytorch sampling)",
            },
            "versions": {**software_versions(), "sglang": md.version("sglang")},
            "loadavg_start": os.getloadavg(),
        }
        runs: dict[str, list[dict[Cell, Any]]] = {e.label: [] for e in all_engines}
        raw: list[dict[str, Any]] = []
        try:
            for rep in range(args.repeats):
                rep_runs, starts, orders = run_repeat(
                    all_engines,
                    specs,
                    cells,
                    prompts,
                    warmup,
                    args.max_new_tokens,
                    rep,
                    console,
                )
                for label, cell_runs in rep_runs.items():
                    runs[label].append(cell_runs)
                raw.append(
                    {
                        "order": [e.label for e in rotated(all_engines, rep)],
                        "cell_orders": orders,
                        "engine_startup_s": starts,
                        "cells": [
                            {
                                "prompt_set": c.prompt_set,
                                "concurrency": c.concurrency,
                                "temperature": c.temperature,
                                **{
                                    e.label: {
                                        "tokens": runs[e.label][rep][c].num_tokens,
                                        "wall_s": runs[e.label][rep][c].wall_s,
                                        "verify_rounds": runs[e.label][rep][c].verify_rounds,
                                        "correct_drafts": runs[e.label][rep][c].correct_drafts,
                                    }
                                    for e in all_engines
                                },
                            }
                            for c in cells
                        ],
                    }
                )
        except RuntimeError as exc:  # SGLang reports a failed start-up as RuntimeError
            print(f"cpu_speedup: error: SGLang's engine failed: {exc}", file=sys.stderr)
            return 2
    result["loadavg_end"] = os.getloadavg()
    result["rows"] = rows = build_rows(runs, cells, speculative, dtype.dtype)
    for row in rows:
        check_row(row)
    result["raw"] = raw
    print(table(rows))
    out = args.out or default_out("cpu_speedup", "cpu_speedup.json")
    print(f"wrote {dump_json(out, result)}")
    for r in not_identical(rows):
        kind = "near-ties only" if r["lossless"] else "MISMATCH"
        print(
            f"not identical to plain ({kind}): {r['prompt_set']} c={r['concurrency']} "
            f"{r['algorithm']}/{r['policy']} (identical outputs per repeat: "
            f"{[x['identical_outputs'] for x in r['repeats']]} of {r['repeats'][0]['outputs']}; "
            f"near-ties {[x['near_ties'] for x in r['repeats']]}, "
            f"mismatches {[x['mismatches'] for x in r['repeats']]})"
        )
        for rep in r["repeats"]:
            for d in rep["divergences"]:
                print(f"  {d}")
    return 1 if not_lossless(rows) else 0


if __name__ == "__main__":
    raise SystemExit(main())
