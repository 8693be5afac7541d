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
from dataclasses import fields, replace
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from dspark_sglang.bench.acceptance import load_eval_prompts
from dspark_sglang.bench.sim_validation import (
    ValidationSettings,
    interleave_prompts,
    simulate_level,
)
from dspark_sglang.planning.traces import load_traces_many
from dspark_sglang.scheduling.cost_table import SpsCostTable
from dspark_sglang.targets.hf_target import HFTarget
from dspark_sglang.targets.smollm2 import ensure_smollm2_with_status

REPO = Path(__file__).resolve().parents[1]
SETS = ("gsm8k", "humaneval", "mtbench")  # as `bench sim-validation` loads them
# The simulator's timing before `first_token` and `closed_admission` existed.
OLD_TIMING = {"first_token": "prefill", "closed_admission": "at_finish"}


def _settings(run: dict[str, Any]) -> ValidationSettings:
    """The settings a run used; runs from before an option existed used its old value."""
    stored = {**OLD_TIMING, **run["settings"]}
    stored["concurrencies"] = tuple(stored["concurrencies"])
    return ValidationSettings(**stored)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="*", type=Path)
    ap.add_argument("--num-prompts", type=int, default=10, help="as the runs' --num-prompts")
    args = ap.parse_args()
    console = Console(width=130)
    runs = args.runs or sorted((REPO / "benchmarks/results").glob("sim_validation*.json"))
    target = HFTarget(ensure_smollm2_with_status(console), num_threads=1)
    by_set = load_eval_prompts(target, list(SETS), args.num_prompts)
    del target
    prompts, domains = interleave_prompts(by_set, SETS, args.num_prompts)
    defaults = {f.name: f.default for f in fields(ValidationSettings)}
    today = {k: defaults[k] for k in OLD_TIMING}
    tab = Table(title="committed runs re-simulated: as run -> with today's timing")
    for col in ("run", "c", "throughput err", "TTFT live / sim, s", "per-user p50 err"):
        tab.add_column(col, justify="right")
    for path in runs:
        run = json.loads(path.read_text())
        if not all("cost_table" in p for p in run["points"]):
            continue  # older runs kept one table for all levels; skip them
        traces = load_traces_many(run["traces"])
        as_run = _settings(run)
        now = replace(as_run, **today)
        for p in run["points"]:
            m = p["measured"]
            c = p["concurrency"]
            table = SpsCostTable.from_json(json.dumps(p["cost_table"]))
            old = simulate_level(c, prompts, domains, traces, table, as_run)
            new = simulate_level(c, prompts, domains, traces, table, now)
            if abs(old.throughput / p["predicted"]["throughput"] - 1) > 1e-9:
                raise SystemExit(f"{path.name}: c={c} does not reproduce")
            tab.add_row(
                path.name,
                str(c),
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
