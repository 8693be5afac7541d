"""Throughput vs per-user speed frontiers, the SLA-anchor table and the verify-budget curve.

Why: a speculative policy is only better if, for the load an operator runs at, it serves
more tokens per second in total *and* each user faster. Sweeping the closed-loop
concurrency traces each policy's curve in the (throughput, tok/s/user) plane; the upper
envelope of its points (Pareto frontier) is what the policy can offer. Two readings
compare DSpark with the MTP-1 baseline (one draft token, always verified), as in the paper:

* SLA anchor: at a per-user speed target ``s``, the highest throughput whose per-user
  speed still meets ``s`` (p50, or p50 and p90), and its gain over MTP-1's.
* Matched throughput: at each MTP-1 operating point's throughput ``T``, the per-user
  speed a policy reaches at ``T`` on its frontier (linear between frontier points), as
  a speed-up over MTP-1's.

The budget curve (paper Fig. 8) is the mean number of verified tokens per request per
step (anchor + drafts) against concurrency.
"""

from __future__ import annotations

import itertools
import json
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from dspark_sglang.calibration.sts import StsCalibration
from dspark_sglang.planning.simulator import SimConfig, SimResult, simulate
from dspark_sglang.planning.traces import AcceptanceTraces
from dspark_sglang.planning.workload import LengthDistribution
from dspark_sglang.scheduling.config import NEEDS_COST_TABLE, POLICIES, SchedulerConfig
from dspark_sglang.scheduling.cost_table import CostModel
from dspark_sglang.scheduling.policies import (
    IN_MEMORY_COST_TABLE,
    SchedulingPolicy,
    policy_from_config,
)

__all__ = [
    "Frontier",
    "PolicySpec",
    "best_at_sla",
    "budget_curve",
    "default_policy_specs",
    "matched_throughput_table",
    "pareto",
    "plot_budget",
    "plot_frontier",
    "sla_table",
    "speed_at_throughput",
    "sweep",
]

Criterion = Literal["p50", "p50+p90"]
_SPEC = re.compile(rf"^({'|'.join(map(re.escape, POLICIES))})(?::(\d+))?$")
_SPEC_FORMS = " | ".join(
    {"lagged": "lagged[:lag]", "static": "static:<k>"}.get(p, p) for p in POLICIES
)


@dataclass(frozen=True)
class PolicySpec:
    """A policy by name plus its one integer option (``static:k``, ``lagged:lag``).

    ``config`` is the ``SchedulerConfig`` the spec stands for and ``build`` turns it
    into a policy with ``scheduling.policies.policy_from_config``, the worker's own
    translation: the simulator runs the very settings and classes a tier would run,
    validated by the same rules.
    """

    name: str
    option: int | None = None

    def __post_init__(self) -> None:
        if self.name == "static" and (self.option is None or self.option < 1):
            raise ValueError("policy 'static' needs k >= 1: write it as static:<k>, e.g. static:3")
        if self.name not in ("static", "lagged") and self.option is not None:
            raise ValueError(f"policy {self.name!r} takes no option (got :{self.option})")
        if self.name == "lagged" and self.option is not None and self.option < 1:
            raise ValueError("lagged:<lag> needs lag >= 1 (lag 0 would anticipate)")
        if self.name not in POLICIES:
            raise ValueError(f"unknown policy {self.name!r}")

    @classmethod
    def parse(cls, text: str) -> PolicySpec:
        """Parse a spec: a policy name, ``lagged[:lag]`` or ``static:<k>``."""
        m = _SPEC.match(text.strip())
        if not m:
            raise ValueError(f"bad policy spec {text!r}; use {_SPEC_FORMS}")
        return cls(m.group(1), int(m.group(2)) if m.group(2) else None)

    @property
    def label(self) -> str:
        if self.name == "static":
            return f"static:{self.option}"
        if self.name == "lagged" and self.option is not None:
            return f"lagged:{self.option}"
        return self.name

    @property
    def lag(self) -> int:
        return self.option if self.name == "lagged" and self.option is not None else 2

    def draft_decision(self, requested: str) -> str:
        """The draft decision a run of this spec takes when ``requested`` is asked for:
        ``requested`` where the policy prices with a cost table (``prefix``, ``lagged``),
        ``always`` for the others (they have no table to price a drafting round with)."""
        return requested if self.name in NEEDS_COST_TABLE else "always"

    def config(
        self,
        block_size: int,
        max_verify_tokens: int | None = None,
        draft_step_seconds: float | None = None,
    ) -> SchedulerConfig:
        """The scheduler config of this spec for a drafter of ``block_size``.

        ``prefix`` and ``lagged`` name ``IN_MEMORY_COST_TABLE``: their table is the one
        the caller holds, handed to ``build`` as ``cost_model``. They also take
        ``draft_step_seconds`` (the draft pass, added to the table they decide with); the
        other policies read no table, so it is not set on them.
        """
        uses_table = self.name in NEEDS_COST_TABLE
        return SchedulerConfig(
            block_size=block_size,
            policy=self.name,  # type: ignore[arg-type]  # checked in __post_init__
            static_k=self.option if self.name == "static" else None,
            lag_steps=self.lag,
            max_verify_tokens=max_verify_tokens,
            cost_table_path=IN_MEMORY_COST_TABLE if uses_table else None,
            draft_step_seconds=draft_step_seconds if uses_table else None,
        )

    def build(
        self,
        cost_model: CostModel,
        max_verify_tokens: int | None = None,
        *,
        block_size: int,
        draft_step_seconds: float | None = None,
    ) -> SchedulingPolicy:
        """The policy of ``config(block_size, max_verify_tokens, draft_step_seconds)`` on
        ``cost_model`` (the target-only table; the config adds the draft pass to it)."""
        cfg = self.config(block_size, max_verify_tokens, draft_step_seconds)
        return policy_from_config(cfg, cost_model=cost_model)


def default_policy_specs(block_size: int) -> list[PolicySpec]:
    """none, mtp1, static k = 2..B, prefix (Algorithm 1) and lagged (production)."""
    specs = [PolicySpec("none"), PolicySpec("mtp1")]
    specs += [PolicySpec("static", k) for k in range(2, block_size + 1)]
    return [*specs, PolicySpec("prefix"), PolicySpec("lagged")]


def default_num_requests(concurrency: int) -> int:
    """Enough requests for a steady window: 3x the concurrency, at least 60."""
    return max(60, 3 * concurrency)


@dataclass
class Frontier:
    """Sweep results: ``points[label]`` = one ``SimResult`` per concurrency (ascending)."""

    points: dict[str, list[SimResult]] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "meta": self.meta,
            "points": {k: [r.to_dict() for r in v] for k, v in self.points.items()},
        }


def sweep(
    traces: AcceptanceTraces,
    cost_model: CostModel,
    lengths: LengthDistribution,
    specs: Sequence[PolicySpec],
    concurrencies: Sequence[int],
    *,
    sts: StsCalibration | Sequence[float] | None = None,
    prefill: Literal["none", "separate", "mixed"] = "separate",
    num_requests: Callable[[int], int] = default_num_requests,
    seed: int = 0,
    max_verify_tokens: int | None = None,
    progress: Callable[[str, SimResult], None] | None = None,
) -> Frontier:
    """Closed-loop run of every policy at every concurrency (same seed: same requests)."""
    frontier = Frontier(meta={"concurrencies": list(concurrencies), "prefill": prefill})
    for spec in specs:
        runs: list[SimResult] = []
        for c in sorted(set(concurrencies)):
            cfg = SimConfig(concurrency=c, num_requests=num_requests(c), prefill=prefill, seed=seed)
            policy = spec.build(cost_model, max_verify_tokens, block_size=traces.block_size)
            res = simulate(traces, cost_model, policy, lengths, cfg, sts=sts)
            runs.append(res)
            if progress is not None:
                progress(spec.label, res)
        frontier.points[spec.label] = runs
    return frontier


def pareto(results: Sequence[SimResult]) -> list[tuple[float, float]]:
    """Upper-right envelope of ``(throughput, user_tps_p50)``, by increasing throughput.

    A point is kept iff no other point has both higher-or-equal throughput and higher
    per-user speed; along the result the speed is strictly decreasing.
    """
    pts = sorted(
        ((r.throughput, r.user_tps_p50) for r in results if math.isfinite(r.user_tps_p50)),
        key=lambda p: (-p[0], -p[1]),
    )
    out: list[tuple[float, float]] = []
    best = -math.inf
    for thr, spd in pts:  # descending throughput: keep points faster than all to the right
        if spd > best:
            out.append((thr, spd))
            best = spd
    return out[::-1]


def speed_at_throughput(results: Sequence[SimResult], throughput: float) -> float | None:
    """Per-user speed (p50) on the Pareto frontier at ``throughput``; None if out of reach.

    Below the frontier's lowest throughput the fastest point's speed applies (it already
    serves more); between two frontier points speed is interpolated linearly.
    """
    front = pareto(results)
    if not front or throughput > front[-1][0]:
        return None
    if throughput <= front[0][0]:
        return front[0][1]
    for (t0, s0), (t1, s1) in itertools.pairwise(front):
        if t0 <= throughput <= t1:
            w = (throughput - t0) / (t1 - t0) if t1 > t0 else 0.0
            return s0 + w * (s1 - s0)
    return None


def _meets(r: SimResult, sla: float, criterion: Criterion) -> bool:
    if criterion == "p50":
        return r.user_tps_p50 >= sla
    return r.user_tps_p50 >= sla and r.user_tps_p90 >= sla


def best_at_sla(
    results: Sequence[SimResult], sla: float, criterion: Criterion = "p50"
) -> SimResult | None:
    """Highest-throughput run whose per-user speed meets ``sla``; None if none does."""
    ok = [r for r in results if _meets(r, sla, criterion)]
    return max(ok, key=lambda r: r.throughput) if ok else None


def sla_table(
    frontier: Frontier,
    slas: Sequence[float],
    *,
    baseline: str = "mtp1",
    criterion: Criterion = "p50",
) -> list[dict[str, Any]]:
    """Per SLA and policy: best throughput meeting it, its concurrency and gain vs baseline."""
    rows: list[dict[str, Any]] = []
    for sla in slas:
        base = best_at_sla(frontier.points.get(baseline, []), sla, criterion)
        for label, runs in frontier.points.items():
            best = best_at_sla(runs, sla, criterion)
            gain = (
                best.throughput / base.throughput - 1.0
                if best is not None and base is not None and base.throughput > 0
                else None
            )
            rows.append(
                {
                    "sla": float(sla),
                    "policy": label,
                    "throughput": None if best is None else best.throughput,
                    "concurrency": None if best is None else best.concurrency,
                    "user_tps_p50": None if best is None else best.user_tps_p50,
                    "user_tps_p90": None if best is None else best.user_tps_p90,
                    "gain_vs_baseline": gain,
                }
            )
    return rows


def matched_throughput_table(frontier: Frontier, *, baseline: str = "mtp1") -> list[dict[str, Any]]:
    """At each baseline point's throughput: each policy's per-user speed-up there."""
    rows: list[dict[str, Any]] = []
    for b in frontier.points.get(baseline, []):
        for label, runs in frontier.points.items():
            s = speed_at_throughput(runs, b.throughput)
            rows.append(
                {
                    "baseline_concurrency": b.concurrency,
                    "throughput": b.throughput,
                    "policy": label,
                    "user_tps_p50": s,
                    "speedup_vs_baseline": None if s is None else s / b.user_tps_p50 - 1.0,
                }
            )
    return rows


def budget_curve(frontier: Frontier) -> dict[str, list[dict[str, float]]]:
    """Per policy: concurrency -> mean verify tokens per request (anchor + drafts) and batch."""
    return {
        label: [
            {
                "concurrency": float(r.concurrency or 0),
                "verify_tokens_per_request": r.mean_verify_tokens_per_request,
                "batch_tokens": r.mean_batch_tokens,
                "mean_decoding": r.mean_decoding,
            }
            for r in runs
        ]
        for label, runs in frontier.points.items()
    }


def write_json(
    frontier: Frontier, path: Path, slas: Sequence[float], baseline: str = "mtp1"
) -> dict[str, Any]:
    """Everything the benchmark reports, as one JSON document."""
    doc = {
        **frontier.to_json(),
        "pareto": {k: pareto(v) for k, v in frontier.points.items()},
        "sla_table_p50": sla_table(frontier, slas, baseline=baseline, criterion="p50"),
        "sla_table_p50_p90": sla_table(frontier, slas, baseline=baseline, criterion="p50+p90"),
        "matched_throughput": matched_throughput_table(frontier, baseline=baseline),
        "budget_curve": budget_curve(frontier),
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    doc = _finite(doc)
    path.write_text(json.dumps(doc, indent=1, allow_nan=False), encoding="utf-8")
    return doc


def _finite(x: Any) -> Any:
    """JSON has no NaN/inf: non-finite floats (e.g. no finished request) become null."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_finite(v) for v in x]
    return x


def plot_frontier(
    frontier: Frontier, path: Path, slas: Sequence[float] = (), title: str = ""
) -> None:
    """Throughput (x) vs per-user p50 speed (y), one curve per policy, SLA lines dashed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 5.0))
    for label, runs in frontier.points.items():
        xs = [r.throughput for r in runs]
        ys = [r.user_tps_p50 for r in runs]
        bold = label.startswith(("lagged", "prefix", "mtp1"))
        ax.plot(xs, ys, marker="o", ms=3, lw=2.0 if bold else 0.9, label=label)
    for s in slas:
        ax.axhline(s, ls="--", lw=0.8, color="gray")
        ax.text(ax.get_xlim()[0], s, f" SLA {s:g}", va="bottom", fontsize=8, color="gray")
    ax.set_xlabel("throughput (output tok/s, all users)")
    ax.set_ylabel("per-user speed p50 (tok/s/user)")
    ax.set_title(title or "Throughput-interactivity frontier (closed-loop concurrency sweep)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_budget(frontier: Frontier, path: Path, title: str = "") -> None:
    """Mean verified tokens per request per step vs concurrency (paper Fig. 8).

    Static policies are flat lines up to B + 1 tokens and squash the adaptive ones
    against the floor, so those (the curves that actually move with load) get a
    second panel on their own scale.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curves = budget_curve(frontier)
    adaptive = {
        label: rows
        for label, rows in curves.items()
        if len({round(r["verify_tokens_per_request"], 9) for r in rows}) > 1
    }
    panels = [(curves, title or "Verify budget vs load")]
    if adaptive:
        panels.append((adaptive, "adaptive policies only"))
    palette = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    colour = {label: palette[i % len(palette)] for i, label in enumerate(curves)}
    fig, axes = plt.subplots(1, len(panels), figsize=(7.0 * len(panels), 4.5), squeeze=False)
    for ax, (shown, heading) in zip(axes[0], panels, strict=True):
        for label, rows in shown.items():
            ax.plot(
                [r["concurrency"] for r in rows],
                [r["verify_tokens_per_request"] for r in rows],
                marker="o",
                ms=3,
                color=colour[label],
                label=label,
            )
        ax.set_xscale("log", base=2)
        ax.set_xlabel("concurrency (requests in flight)")
        ax.set_ylabel("verified tokens per request per step")
        ax.set_title(heading)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
