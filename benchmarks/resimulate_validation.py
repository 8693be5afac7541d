"""Re-simulate committed sim-validation runs with today's simulator, without a server.

Why: the simulator's model changes (``SimConfig.first_token``, ``closed_admission``)
should be judged on the loads already measured, not only on the next run. A run stores
each level's cost table and settings, the eval prompts and the acceptance traces are
committed, so a level's prediction can be recomputed exactly: with the run's own
settings it reproduces the stored throughput (printed as a check), and with the current
``ValidationSettings`` it shows what the new model predicts for the same load.

Usage: ``python benchmarks/resimulate_validation.py [RUN.json ...]`` (default: every
``benchmarks/results/sim_validation*.json`` that stores per-level tables). Prints a table;
writes nothing.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from dspark_sglang.bench.acceptance import load_eval_prompts
from dspark_sglang.bench.sim_validation import ValidationSettings
from dspark_sglang.planning.simulator import SimConfig, SimResult, simulate
from dspark_sglang.planning.traces import load_traces_many
from dspark_sglang.planning.workload import LengthDistribution
from dspark_sglang.reference.cli import ensure_target_path
from dspark_sglang.scheduling.cost_table import SpsCostTable
from dspark_sglang.scheduling.policies import build_policy
from dspark_sglang.targets.hf_target import HFTarget

REPO = Path(__file__).resolve().parents[1]
SETS = ("gsm8k", "humaneval", "mtbench")  # interleaved as `bench sim-validation` does


def _simulate(
    point: dict[str, Any], run: dict[str, Any], prompts: list, domains: list, traces: Any,
    first_token: str, admission: str,
) -> SimResult:  # fmt: skip
    s = run["settings"]
    c = point["concurrency"]
    n_req = max(s["requests_per_client"] * c, s.get("min_requests", 1))
    used = [prompts[i % len(prompts)] for i in range(n_req)]
    used_domains = [domains[i % len(prompts)] for i in range(n_req)]
    lengths = LengthDistribution(
        tuple(len(p) for p in used), (s["max_new_tokens"],) * n_req, source="the run's prompts"
    )
    cfg = SimConfig(
        mode="closed",
        concurrency=c,
        num_requests=max(s["sim_requests"], n_req),
        warmup_fraction=s["warmup_fraction"],
        prefill="separate",
        first_token=first_token,  # type: ignore[arg-type]
        closed_admission=admission,  # type: ignore[arg-type]
        domain_weights={d: used_domains.count(d) / n_req for d in traces.domains},
        seed=s["seed"],
    )
    table = SpsCostTable.from_json(json.dumps(point["cost_table"]))
    return simulate(traces, table, build_policy("static", k=s["static_k"]), lengths, cfg)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="*", type=Path)
    ap.add_argument("--num-prompts", type=int, default=10, help="as the runs' --num-prompts")
    args = ap.parse_args()
    console = Console(width=130)
    runs = args.runs or sorted((REPO / "benchmarks/results").glob("sim_validation*.json"))
    target = HFTarget(ensure_target_path(console), num_threads=1)
    by_set = load_eval_prompts(target, list(SETS), args.num_prompts)
    del target
    prompts, domains = [], []
    for i in range(args.num_prompts):
        for name in SETS:
            if i < len(by_set[name]):
                prompts.append(by_set[name][i])
                domains.append(name)
    now = ValidationSettings(
        static_k=2, concurrencies=(1,), requests_per_client=2, max_new_tokens=2
    )
    tab = Table(title="committed runs re-simulated: as run -> with today's settings")
    for col in ("run", "c", "throughput err", "TTFT live / sim, s", "per-user p50 err"):
        tab.add_column(col, justify="right")
    for path in runs:
        run = json.loads(path.read_text())
        if not all("cost_table" in p for p in run["points"]):
            continue  # older runs kept one table for all levels; skip them
        traces = load_traces_many(run["traces"])
        for p in run["points"]:
            m = p["measured"]
            old = _simulate(p, run, prompts, domains, traces, "prefill", "at_finish")
            new = _simulate(p, run, prompts, domains, traces, now.first_token, now.closed_admission)
            if abs(old.throughput / p["predicted"]["throughput"] - 1) > 1e-9:
                raise SystemExit(f"{path.name}: c={p['concurrency']} does not reproduce")
            tab.add_row(
                path.name,
                str(p["concurrency"]),
                f"{old.throughput / m['throughput'] - 1:+.1%} -> "
                f"{new.throughput / m['throughput'] - 1:+.1%}",
                f"{m['ttft_p50']:.2f} / {old.ttft_p50:.2f} -> {new.ttft_p50:.2f}",
                f"{old.user_tps_p50 / m['user_tps_p50'] - 1:+.1%} -> "
                f"{new.user_tps_p50 / m['user_tps_p50'] - 1:+.1%}",
            )
    console.print(tab)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
