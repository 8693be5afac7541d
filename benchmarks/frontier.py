"""Throughput-interactivity frontier of every scheduling policy (writes a run folder, or --out).

Why: DSpark's production claim is a frontier, not a single number: at matched throughput
users get faster tokens than with MTP-1, at an SLA the replica serves more throughput,
and the verify budget shrinks as load saturates the target. This sweeps closed-loop
concurrency for none, MTP-1, static k = 2..B, Algorithm 1 (prefix) and the lagged
production scheduler through the serving simulator (dspark_sglang/planning), on a cost
table and acceptance traces, and writes:

    OUT.json         all runs, Pareto fronts, SLA-anchor tables (p50 and p50+p90),
                     matched-throughput speed-ups, budget curve, inputs used
    OUT.png          throughput vs per-user p50 speed
    OUT_budget.png   verify tokens per request vs concurrency

``OUT.json`` is ``--out`` (default: ``frontier.json`` in a fresh run folder,
``<cache>/runs/bench/frontier-<UTC time>/``); the PNGs go beside it.

Inputs: ``--profile`` (default: the committed CPU profile
``profiles/*/smollm2-135m-instruct-tp1.json`` if present, else a synthetic GPU-like
staircase built here; ``--synthetic`` forces the synthetic staircase) and ``--traces``
(default: synthetic high-acceptance traces, a stand-in for a GPU-scale drafter). The committed
``benchmarks/results/frontier_cpu_smollm2.*`` use the committed CPU table with the real SmolLM2
drafter's traces from ``benchmarks/results/traces/``; the command is in benchmarks/README.md.

Usage: ``python benchmarks/frontier.py [--quick] [--profile P | --synthetic] [--traces T]
[--sla 80,120] [--out FILE]``.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import torch

from dspark_sglang.calibration.sts import load_sts
from dspark_sglang.planning.frontier import (
    PolicySpec,
    default_policy_specs,
    plot_budget,
    plot_frontier,
    sweep,
    write_json,
)
from dspark_sglang.planning.traces import (
    AcceptanceTraces,
    decaying_acceptance,
    load_traces_many,
    synthetic_traces,
)
from dspark_sglang.planning.workload import default_lengths
from dspark_sglang.results import default_out
from dspark_sglang.scheduling.cost_table import CostTable, SpsCostTable, load_cost_table

ROOT = Path(__file__).resolve().parents[1]
BLOCK = 7


def synthetic_staircase() -> SpsCostTable:
    """GPU-like staircase: 60 steps/s up to 64 tokens, 5 % slower per 64-token tile."""
    probes = tuple(range(1, 4097, 64))
    return SpsCostTable(
        sample_batch_tokens=probes,
        sample_steps_per_sec=tuple(60.0 * 0.95**i for i in range(len(probes))),
        max_batch_tokens=4096,
    )


def default_traces(seed: int) -> AcceptanceTraces:
    """High, slowly decaying acceptance (~4.8 tokens/round at B = 7), AUC 0.85."""
    return synthetic_traces(
        300, 40, decaying_acceptance(0.9, 0.98, BLOCK), auc=0.85, request_spread=1.0, seed=seed
    )


def find_profile() -> Path | None:
    hits = sorted((ROOT / "profiles").glob("*/smollm2-135m-instruct-tp1.json"))
    return hits[0] if hits else None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    source = ap.add_mutually_exclusive_group()
    source.add_argument("--profile", type=Path, default=None, help="SGLang SPS cost table")
    source.add_argument(
        "--synthetic",
        action="store_true",
        help="the synthetic GPU-like staircase, even where a committed profile exists",
    )
    ap.add_argument("--traces", type=Path, nargs="+", default=None, help="trace files (joined)")
    ap.add_argument("--sts", type=Path, default=None)
    ap.add_argument("--sla", default="80,120")
    ap.add_argument("--concurrency", default="1,2,4,8,16,32,64,128,256")
    ap.add_argument("--policies", default=None, help="specs (default: all)")
    ap.add_argument("--quick", action="store_true", help="fewer loads and policies")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--out",
        type=Path,
        default=None,
        help="result JSON, PNGs beside it (default: frontier.json in a fresh run folder, "
        "<cache>/runs/bench/frontier-<UTC time>/)",
    )
    args = ap.parse_args(argv)
    torch.set_num_threads(1)

    profile = None if args.synthetic else (args.profile or find_profile())
    table: CostTable = load_cost_table(profile) if profile else synthetic_staircase()
    traces = load_traces_many(args.traces) if args.traces else default_traces(args.seed)
    sts = load_sts(args.sts) if args.sts else None
    lengths = default_lengths()
    slas = [float(x) for x in args.sla.split(",")]
    concurrencies = [int(x) for x in args.concurrency.split(",")]
    if args.policies:
        specs = [PolicySpec.parse(s) for s in args.policies.split(",")]
    else:
        specs = default_policy_specs(traces.block_size)
    if args.quick:
        concurrencies = [c for c in concurrencies if c in (1, 4, 16, 64)]
        keep = {"none", "mtp1", "static:3", "prefix", "lagged"}
        specs = [s for s in specs if s.label in keep]

    t0 = time.time()

    def progress(label: str, r: object) -> None:
        print(
            f"  {label:<10} C={r.concurrency:<4} thr={r.throughput:9.1f} "  # type: ignore[attr-defined]
            f"p50={r.user_tps_p50:7.1f} verify/req={r.mean_verify_tokens_per_request:.2f}",  # type: ignore[attr-defined]
            file=sys.stderr,
        )

    frontier = sweep(
        traces, table, lengths, specs, concurrencies, sts=sts, seed=args.seed, progress=progress
    )
    frontier.meta.update(
        {
            "profile": str(profile) if profile else "synthetic staircase (benchmarks/frontier.py)",
            "traces": [str(t) for t in args.traces]
            if args.traces
            else "synthetic (benchmarks/frontier.py)",
            "trace_mean_accept_length_full_block": traces.mean_accept_length(),
            "trace_rounds": traces.num_rounds,
            "block_size": traces.block_size,
            "lengths": lengths.source,
            "mean_output_tokens": lengths.mean_output(),
            "sts": str(args.sts) if args.sts else "none (T = 1)",
            "slas": slas,
            "seed": args.seed,
            "wall_seconds": round(time.time() - t0, 1),
            "python": platform.python_version(),
            "torch": torch.__version__,
        }
    )
    if args.out is None:
        args.out = default_out("frontier", "frontier.json")
    doc = write_json(frontier, args.out, slas)
    plot_frontier(frontier, args.out.with_suffix(".png"), slas=slas)
    plot_budget(frontier, args.out.with_name(args.out.stem + "_budget.png"))
    for row in doc["sla_table_p50"]:
        if row["policy"] in ("mtp1", "prefix", "lagged"):
            print(json.dumps(row))
    print(f"wrote {args.out} (+ PNGs) in {time.time() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
