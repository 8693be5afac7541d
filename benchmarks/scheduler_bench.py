"""Scheduler decision time and sequential-head overhead (writes a run folder, or --out).

Why: the scheduler sits on the critical path of every decode step, so its host
time must stay far below a step (~10 ms on a GPU); and DSpark's claim is that the
sequential Markov head is cheap next to the parallel drafter pass (paper: +0.2-1.3 %
round latency at batch 128). Both are measured here, on one CPU thread.

1. Scheduling policies: ``decide`` time for N in {1, 32, 256, 1024} requests x B = 7,
   p50/p99 over many repeats (the policies interleaved per repeat), on a tile-like
   staircase SPS table and random confidences (a pool of inputs cycled so generation
   is not timed). Side by side on
   the same inputs: the NumPy policies (``scheduling/policies.py``), their device
   twins run on the CPU (``scheduling/device_policies.py``, rows ``<name> [device cpu]``)
   and SGLang 0.5.23's own DSpark planner decision (row ``sglang planner``, see
   ``SglangPlannerDecision``: SGLang's lengths count the anchor, its
   ``mean_verify_len`` here is drafts per request like ours).
2. Drafter: one parallel ``forward_block`` vs the Markov sampling loop
   (``sample_block``: Markov bias, processed distribution and a draw per position,
   plus the confidence head) at batch 128, B in {4, 8, 16}, random weights with a
   SmolLM2-135M geometry (speed does not depend on the values). The paper's 0.2-1.3 %
   is relative to a whole round (target verify included); here the denominator is
   the drafter pass alone, so the percentage is an upper bound of that figure.

Usage: ``python benchmarks/scheduler_bench.py [--quick] [--skip-drafter] [--out FILE]``.
Without ``--out`` the JSON goes to a fresh run folder,
``<cache>/runs/bench/scheduler_bench-<UTC time>/scheduler_bench.json``; the committed result
is ``--out benchmarks/results/scheduler_bench.json``.
Timings on shared dev machines are noisy: the JSON records the load average.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import platform
import statistics
import sys
import time
from collections import deque
from pathlib import Path
from typing import Any

import torch

from dspark_sglang.results import default_out, dump_json
from dspark_sglang.scheduling.cost_table import SpsCostTable
from dspark_sglang.scheduling.device_policies import device_twin
from dspark_sglang.scheduling.policies import (
    AnticipatingGlobalSearch,
    SchedulingPolicy,
    build_policy,
)

BLOCK = 7
REQUEST_COUNTS = (1, 32, 256, 1024)
DRAFT_BATCH = 128
DRAFT_BLOCKS = (4, 8, 16)


def staircase_table() -> SpsCostTable:
    """A GPU-like staircase: flat inside 64-token tiles, 6 % slower per tile."""
    probes = tuple(range(1, 16385, 64))
    return SpsCostTable(
        sample_batch_tokens=probes,
        sample_steps_per_sec=tuple(120.0 * 0.94**t for t in range(len(probes))),
        max_batch_tokens=16384,
    )


def policies(table: SpsCostTable) -> list[SchedulingPolicy]:
    return [
        build_policy("prefix", table),
        build_policy("lagged", table),
        build_policy("static", k=3),
        build_policy("mtp1"),
        build_policy("verify_all"),
        build_policy("none"),
        AnticipatingGlobalSearch(table),  # reference point only (biased)
    ]


class SglangPlannerDecision(SchedulingPolicy):
    """SGLang 0.5.23's per-step DSpark planner decision, called standalone on the CPU.

    Building ``DSparkVerifyPlanner`` itself needs a published runtime context (its
    constructor reads the server arguments) and stand-ins for the model runner's
    request pool, the draft model's confidence head and the TP sync
    (``tests/sglang_integration/test_sglang_verify_tier.py`` builds one that way), and
    its ``schedule_layout`` adds the ragged layout around the decision. So this times
    the decision alone, with SGLang's own classes, as the planner makes it each step:
    ``HostConfidenceBudgetPlanner.compute_budget`` on the confidences of two steps ago
    (the overlap relay ring's lag, no carry ring) and ``ScheduleVerifyLensTopk.execute``
    on the current ones (its torch path on CPU tensors). Until two steps of history
    exist SGLang has no resolved confidence and verifies every draft; so does this.
    Returned lengths are draft tokens (SGLang's minus its ``min_verify_len`` anchor).
    """

    def __init__(self, table: SpsCostTable, block: int) -> None:
        import msgspec
        from sglang.kernels.ops.speculative.dspark.dspark_schedule import ScheduleVerifyLensTopk
        from sglang.srt.managers.overlap_utils import CONFIDENCE_RELAY_RING_LAG
        from sglang.srt.speculative.dspark_components import dspark_planner, dspark_sps

        self.cfg = dspark_planner.DSparkScheduleConfig(gamma=block)
        self.planner = dspark_planner.HostConfidenceBudgetPlanner(
            sps_table=msgspec.json.decode(table.to_json(), type=dspark_sps.SpsCostTable),
            cfg=self.cfg,
            model_runner=None,  # only touched by the carry ring, absent at relay lag 2
            relay_lag_steps=CONFIDENCE_RELAY_RING_LAG,
        )
        self.topk = ScheduleVerifyLensTopk
        self.lag = CONFIDENCE_RELAY_RING_LAG
        self.block = block
        self._history: deque[torch.Tensor] = deque(maxlen=self.lag + 1)
        self._pool_index: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    @property
    def name(self) -> str:
        return "sglang planner"

    def reset(self) -> None:
        self._history.clear()

    def decide(self, confidence: torch.Tensor) -> torch.Tensor:
        n = confidence.shape[0]
        self._history.append(confidence)
        if len(self._history) <= self.lag:
            return torch.full((n,), self.block, dtype=torch.int64)
        if n not in self._pool_index:  # request slots and generations: the pool's, not timed
            self._pool_index[n] = (torch.arange(n), torch.ones(n, dtype=torch.int64))
        slots, generation = self._pool_index[n]
        budget = self.planner.compute_budget(
            confidence=self._history[0],
            generation=generation,
            current_generation=generation,
            req_pool_indices_cpu=slots,
        )
        lens = self.topk.execute(confidence=confidence, budget=budget, cfg=self.cfg)
        return lens.to(torch.int64) - self.cfg.min_verify_len


def sglang_planner(table: SpsCostTable) -> tuple[list[tuple[str, SchedulingPolicy]], str | None]:
    """``[("sglang planner", decision)]``, or ``[]`` and why SGLang cannot be called."""
    try:
        decision = SglangPlannerDecision(table, BLOCK)
    except ImportError as exc:
        return [], f"SGLang's DSpark planner is not importable: {exc}"
    return [(decision.name, decision)], None


def percentile(sorted_values: list[float], q: float) -> float:
    return sorted_values[min(len(sorted_values) - 1, round(q * (len(sorted_values) - 1)))]


def bench_scheduler(repeats: int) -> tuple[list[dict[str, Any]], str | None]:
    """Decision time per step for each policy and N (microseconds), and why SGLang's
    planner rows are missing (``None`` when they are there)."""
    table = staircase_table()
    host = policies(table)
    timed: list[tuple[str, SchedulingPolicy]] = [(p.name, p) for p in host]
    timed += [
        (f"{p.name} [device cpu]", device_twin(p, "cpu"))
        for p in host
        if not isinstance(p, AnticipatingGlobalSearch)  # no device twin: it is biased
    ]
    sglang_rows, sglang_skipped = sglang_planner(table)
    timed += sglang_rows
    gen = torch.Generator().manual_seed(0)
    rows: list[dict[str, Any]] = []
    for n in REQUEST_COUNTS:
        # Calibrated-looking confidences: mostly high, some low, per-request level.
        level = torch.randn(n, 1, generator=gen)
        pool = [
            torch.sigmoid(1.5 + level + 0.8 * torch.randn(n, BLOCK, generator=gen))
            for _ in range(16)
        ]
        # Round-robin: every timed repeat runs each policy once on the same input, so
        # load from other processes falls on all rows alike (the ratios stay fair).
        for _, policy in timed:
            policy.reset()
            for i in range(min(50, repeats)):  # warm-up (and the lagged history)
                policy.decide(pool[i % len(pool)])
        times: dict[str, list[float]] = {label: [] for label, _ in timed}
        drafts = dict.fromkeys(times, 0)
        for i in range(repeats):
            conf = pool[i % len(pool)]
            for label, policy in timed:
                t0 = time.perf_counter_ns()
                lens = policy.decide(conf)
                times[label].append((time.perf_counter_ns() - t0) / 1e3)
                drafts[label] += int(lens.sum())
        for label, _ in timed:
            ts = sorted(times[label])
            rows.append(
                {
                    "policy": label,
                    "num_requests": n,
                    "block": BLOCK,
                    "p50_us": round(percentile(ts, 0.5), 1),
                    "p99_us": round(percentile(ts, 0.99), 1),
                    "mean_verify_len": round(drafts[label] / (repeats * n), 3),
                    "repeats": repeats,
                }
            )
    return rows, sglang_skipped


def bench_drafter(repeats: int, vocab: int) -> list[dict[str, Any]]:
    """Parallel drafter pass vs the sequential Markov sampling loop (milliseconds)."""
    from torch import nn

    from dspark_sglang.model import DSparkConfig, DSparkDrafter, sample_block
    from dspark_sglang.targets.smollm2 import SMOLLM2_GEOMETRY

    spec = dataclasses.replace(SMOLLM2_GEOMETRY, vocab_size=vocab)
    # The reference drafter has no KV cache: every call re-projects all context rows
    # (fc + per-layer K/V). A serving engine projects only the rows a round adds, so
    # pass about that many; a long prefix would inflate the parallel pass instead.
    context_len = 16
    rows: list[dict[str, Any]] = []
    gen = torch.Generator().manual_seed(0)
    for block in DRAFT_BLOCKS:
        config = DSparkConfig.for_target(spec, mask_token_id=0, block_size=block)
        torch.manual_seed(0)
        drafter = DSparkDrafter(
            config, nn.Embedding(vocab, spec.hidden_size), nn.Linear(spec.hidden_size, vocab, False)
        ).eval()
        n = DRAFT_BATCH
        features = config.num_context_features * config.target_hidden_size
        ctx = torch.randn(n, context_len, features, generator=gen)
        ctx_pos = torch.arange(context_len).expand(n, context_len)
        ctx_valid = torch.ones(n, context_len, dtype=torch.bool)
        anchors = torch.randint(0, vocab, (n,), generator=gen)
        anchor_pos = torch.full((n,), context_len)
        parallel_ms: list[float] = []
        sequential_ms: list[float] = []
        with torch.no_grad():
            for i in range(repeats + 1):  # first round is warm-up
                t0 = time.perf_counter()
                draft_block = drafter.forward_block(ctx, ctx_pos, ctx_valid, anchors, anchor_pos)
                t1 = time.perf_counter()
                sample_block(drafter, draft_block, anchors, generator=gen)
                t2 = time.perf_counter()
                if i:
                    parallel_ms.append((t1 - t0) * 1e3)
                    sequential_ms.append((t2 - t1) * 1e3)
        par, seq = statistics.median(parallel_ms), statistics.median(sequential_ms)
        rows.append(
            {
                "batch": n,
                "block": block,
                "vocab": vocab,
                "context_len": context_len,
                "parallel_pass_ms": round(par, 2),
                "markov_loop_ms": round(seq, 2),
                "markov_overhead_pct_of_drafter": round(100.0 * seq / par, 1),
                "repeats": repeats,
            }
        )
        del drafter, draft_block
    return rows


def print_table(title: str, rows: list[dict[str, Any]]) -> None:
    print(f"\n{title}")
    if not rows:
        print("  (none)")
        return
    keys = list(rows[0])
    widths = [max(len(k), *(len(str(r[k])) for r in rows)) for k in keys]
    print("  " + "  ".join(k.rjust(w) for k, w in zip(keys, widths, strict=True)))
    for r in rows:
        print("  " + "  ".join(str(r[k]).rjust(w) for k, w in zip(keys, widths, strict=True)))


def print_side_by_side(rows: list[dict[str, Any]]) -> None:
    """p50 decision time (us) per N: NumPy vs device (CPU) for each policy, then SGLang's."""
    p50 = {(r["policy"], r["num_requests"]): r["p50_us"] for r in rows}
    labels = list(dict.fromkeys(r["policy"] for r in rows))
    cols = [label for label in labels if not label.endswith(" [device cpu]")]
    table = []
    for n in REQUEST_COUNTS:
        row: dict[str, Any] = {"N": n}
        for label in cols:
            device = f"{label} [device cpu]"
            both = [p50[(label, n)]] + ([p50[(device, n)]] if (device, n) in p50 else [])
            row[label] = " / ".join(str(x) for x in both)
        table.append(row)
    print_table("p50 us per decision, NumPy / device on CPU (SGLang: its planner alone)", table)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=2000, help="decisions timed per cell")
    parser.add_argument("--drafter-repeats", type=int, default=3)
    parser.add_argument("--drafter-vocab", type=int, default=49152, help="SmolLM2: 49152")
    parser.add_argument("--quick", action="store_true", help="200 repeats, 1 drafter round")
    parser.add_argument("--skip-drafter", action="store_true")
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="result JSON (default: scheduler_bench.json in a fresh run folder, "
        "<cache>/runs/bench/scheduler_bench-<UTC time>/)",
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.repeats, args.drafter_repeats = 200, 1
    torch.set_num_threads(1)

    result: dict[str, Any] = {
        "benchmark": "scheduler_bench",
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "python": sys.version.split()[0],
        "machine": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "loadavg_start": list(os.getloadavg()),
    }
    result["scheduler"], sglang_skipped = bench_scheduler(args.repeats)
    if sglang_skipped:
        result["sglang_planner"] = {"skipped": sglang_skipped}
        print(f"sglang planner rows skipped: {sglang_skipped}")
    print_table("Scheduler decision time (one CPU thread), B = 7", result["scheduler"])
    print_side_by_side(result["scheduler"])
    if args.skip_drafter:
        result["drafter"] = {"skipped": "--skip-drafter"}
    else:
        result["drafter"] = bench_drafter(args.drafter_repeats, args.drafter_vocab)
        print_table(
            f"Drafter at batch {DRAFT_BATCH}: parallel pass vs Markov loop", result["drafter"]
        )
    result["loadavg_end"] = list(os.getloadavg())
    if args.out is None:
        args.out = default_out("scheduler_bench", "scheduler_bench.json")
    dump_json(args.out, result)
    print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
