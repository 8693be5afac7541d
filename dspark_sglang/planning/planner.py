"""SLA planner: per latency tier, the admission cap and scheduler that maximise throughput.

Why: an operator promises each user a decode speed (tok/s/user) and wants the most
total throughput per replica under that promise. More concurrent requests raise
throughput but slow every user; which policy wins depends on the hardware's cost
staircase and on how predictable the drafter is. The planner answers with simulation,
not rules of thumb.

Algorithm, per candidate policy: closed-loop simulations at concurrency ``C`` (a
saturated replica runs ``C = max_running_requests`` requests, the worst case for per-user
speed). Per-user speed falls with ``C``, so for each SLA ``s`` the largest feasible
``C`` (``p50 >= s`` and ``p90 >= s``) is found by a doubling search followed by
bisection between the last feasible and the first infeasible ``C``; runs are cached, so
tiers share them. Every decode step pays the draft pass the tier's engine runs
(``draft_step_seconds``, per tier; ``None`` = not modelled, step time is the target's
alone), and ``prefix``/``lagged`` decide with it added to their table, as the served
scheduler does with ``draftStepSeconds``. The tier takes the (policy, ``C``) with the
highest throughput among the feasible ones. Invariant: every planned tier's simulated
p50 and p90 per-user speed meet its SLA.

Output: a Helm values fragment with one ``slaTiers`` entry per SLA, in exactly the keys
``helm/dspark-sglang/values.schema.json`` accepts (merged over the chart's defaults by
``helm install -f``).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import yaml

from dspark_sglang.calibration.sts import StsCalibration
from dspark_sglang.planning.frontier import PolicySpec, default_num_requests
from dspark_sglang.planning.simulator import SimConfig, SimResult, is_seconds, simulate
from dspark_sglang.planning.traces import AcceptanceTraces
from dspark_sglang.planning.workload import LengthDistribution
from dspark_sglang.scheduling.config import DEFAULT_PROBE_EVERY, NEEDS_COST_TABLE
from dspark_sglang.scheduling.cost_table import CostModel

__all__ = [
    "DRAFT_STEP_KEY",
    "PlanError",
    "PlannedTier",
    "Planner",
    "default_planner_specs",
    "draft_text",
    "plan_table",
    "tier_name",
    "values_yaml",
]


DRAFT_STEP_KEY = "draftStepSeconds"
"""The chart's ``slaTiers[].scheduler`` key of the draft pass (``draft_step_seconds``)."""


class PlanError(ValueError):
    """No configuration meets an SLA, or the inputs cannot be planned."""


@dataclass(frozen=True)
class PlannedTier:
    """The chosen configuration for one SLA and what the simulator predicts for it."""

    sla: float
    spec: PolicySpec
    max_running_requests: int
    max_verify_tokens: int
    block_size: int
    result: SimResult
    #: Draft-pass seconds per decode step the prediction assumed (``None``: not modelled).
    draft_step_seconds: float | None = None
    #: The draft decision the prediction ran (``always``, ``priced``; ``None``: not planned,
    #: the tier keeps its own) and the probe gap the plan was given (``None``: the default).
    draft_decision: str | None = None
    probe_every: int | None = None

    def scheduler_values(self) -> dict[str, Any]:
        """The chart's ``slaTiers[].scheduler`` block (camelCase keys).

        Rendered from the tier's ``SchedulerConfig`` (``PolicySpec.config``), the one the
        simulation ran, so the values carry exactly the validated settings, including
        the draft pass where the policy reads it (``prefix``, ``lagged``) and it was
        modelled.
        """
        cfg = self.spec.config(self.block_size, self.max_verify_tokens, self.draft_step_seconds)
        s: dict[str, Any] = {"policy": cfg.policy, "blockSize": cfg.block_size}
        if cfg.static_k is not None:
            s["staticK"] = cfg.static_k
        if cfg.policy == "lagged":
            s["lagSteps"] = cfg.lag_steps
        s["maxVerifyTokens"] = cfg.max_verify_tokens
        s["maxRunningRequests"] = self.max_running_requests
        if cfg.draft_step_seconds is not None:
            s[DRAFT_STEP_KEY] = cfg.draft_step_seconds
        if cfg.policy in NEEDS_COST_TABLE and self.draft_decision is not None:
            s["draftDecision"] = self.draft_decision  # the decision the prediction ran
            if self.draft_decision == "priced" and self.probe_every is not None:
                s["probeEvery"] = self.probe_every
        s["greedyOnly"] = False
        return s


def default_planner_specs() -> list[PolicySpec]:
    """Deployable candidates: the production lagged scheduler, Algorithm 1, MTP-1, none."""
    return [PolicySpec("lagged"), PolicySpec("prefix"), PolicySpec("mtp1"), PolicySpec("none")]


def tier_name(sla: float) -> str:
    """``sla-80``, ``sla-80-5`` for 80.5: an RFC 1123 label of at most 20 characters."""
    text = f"{sla:g}".replace(".", "-")
    name = f"sla-{text}"
    if not re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", name) or len(name) > 20:
        raise PlanError(f"cannot name a tier for SLA {sla!r}; use a plain positive number")
    return name


@dataclass
class Planner:
    """Simulation-backed search over (policy, admission cap) per SLA.

    Fields:
        traces, cost_model, lengths, sts: the simulator inputs.
        specs: candidate policies (``default_planner_specs()``).
        max_concurrency: largest admission cap considered.
        num_requests: requests per simulation as a function of the concurrency.
        prefill: prefill model of the simulator (see ``simulator``).
        seed: one seed for every run (common random numbers across candidates).
        draft_step_seconds: seconds of one draft pass, charged to every decode step
            (``SimConfig.draft_step_seconds``) and added to the table ``prefix``/``lagged``
            decide with; ``None``: not modelled. ``plan`` may give a tier its own.
        draft_decision, probe_every: the draft decision ``prefix``/``lagged`` tiers run
            (``SimConfig``; written onto the tiers as ``draftDecision``, and ``probeEvery``
            when given; ``None``: :data:`DEFAULT_PROBE_EVERY`, the tier's own value kept).
    """

    traces: AcceptanceTraces
    cost_model: CostModel
    lengths: LengthDistribution
    specs: Sequence[PolicySpec] = field(default_factory=default_planner_specs)
    sts: StsCalibration | Sequence[float] | None = None
    max_concurrency: int = 256
    num_requests: Callable[[int], int] = default_num_requests
    prefill: str = "separate"
    seed: int = 0
    progress: Callable[[str, SimResult], None] | None = None
    draft_step_seconds: float | None = None
    draft_decision: str = "always"
    probe_every: int | None = None
    _cache: dict[tuple[Any, ...], SimResult] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        d = self.draft_step_seconds
        if d is not None and not is_seconds(d):
            raise PlanError(
                "Planner.draft_step_seconds must be a finite number of seconds >= 0 (the "
                f"draft pass of one decode step) or None (not modelled), got {d!r}"
            )
        if not isinstance(self.max_concurrency, int) or self.max_concurrency < 1:
            raise PlanError(
                f"max_concurrency must be an integer >= 1, got {self.max_concurrency!r}"
            )
        if not self.specs:
            raise PlanError("no candidate policies given")

    def max_verify_tokens(self, concurrency: int) -> int:
        """Verify-token cap for a tier: all anchors + drafts, within the table's limit."""
        cap = concurrency * (self.traces.block_size + 1)
        mbt = getattr(self.cost_model, "max_batch_tokens", None)
        if isinstance(mbt, int) and not isinstance(mbt, bool):
            cap = min(cap, mbt)
        return max(1, cap)

    def run(self, spec: PolicySpec, concurrency: int) -> SimResult:
        """Closed-loop simulation at ``concurrency`` with the tier's verify cap and the
        planner's draft pass (cached)."""
        draft = self.draft_step_seconds
        decision = spec.draft_decision(self.draft_decision)
        key = (spec.label, concurrency, draft, decision, self.probe_every)
        hit = self._cache.get(key)
        if hit is not None:
            return hit
        cfg = SimConfig(
            concurrency=concurrency,
            num_requests=self.num_requests(concurrency),
            prefill=self.prefill,  # type: ignore[arg-type]
            seed=self.seed,
            draft_step_seconds=draft or 0.0,
            draft_decision=decision,  # type: ignore[arg-type]
            probe_every=self.probe_every or DEFAULT_PROBE_EVERY,
        )
        policy = spec.build(
            self.cost_model,
            self.max_verify_tokens(concurrency),
            block_size=self.traces.block_size,
            draft_step_seconds=draft,
        )
        res = simulate(self.traces, self.cost_model, policy, self.lengths, cfg, sts=self.sts)
        self._cache[key] = res
        if self.progress is not None:
            self.progress(spec.label, res)
        return res

    def largest_feasible(self, spec: PolicySpec, sla: float) -> int | None:
        """Largest concurrency whose p50 and p90 per-user speed meet ``sla`` (None: not even 1)."""

        def ok(c: int) -> bool:
            r = self.run(spec, c)
            return r.user_tps_p50 >= sla and r.user_tps_p90 >= sla

        if not ok(1):
            return None
        lo, hi = 1, None
        c = 1
        while c < self.max_concurrency:
            c = min(2 * c, self.max_concurrency)
            if ok(c):
                lo = c
            else:
                hi = c
                break
        if hi is None:
            return lo
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if ok(mid):
                lo = mid
            else:
                hi = mid
        return lo

    def plan_tier(self, sla: float) -> PlannedTier:
        """Best feasible (policy, cap) for one SLA; ``PlanError`` names the closest miss."""
        if not math.isfinite(sla) or sla <= 0:
            raise PlanError(f"SLA must be a positive tok/s/user, got {sla!r}")
        best: PlannedTier | None = None
        for spec in self.specs:
            c = self.largest_feasible(spec, sla)
            if c is None:
                continue
            r = self.run(spec, c)
            if best is None or r.throughput > best.result.throughput:
                best = PlannedTier(
                    sla,
                    spec,
                    c,
                    self.max_verify_tokens(c),
                    self.traces.block_size,
                    r,
                    draft_step_seconds=self.draft_step_seconds,
                    draft_decision=spec.draft_decision(self.draft_decision),
                    probe_every=self.probe_every,
                )
        if best is None:
            fastest = max(
                (self.run(s, 1) for s in self.specs),
                key=lambda r: min(r.user_tps_p50, r.user_tps_p90),
            )
            raise PlanError(
                f"no candidate meets {sla:g} tok/s/user even at one request: the fastest is "
                f"{fastest.policy} with p50 {fastest.user_tps_p50:.1f} / p90 "
                f"{fastest.user_tps_p90:.1f} tok/s/user; lower the SLA, add policies, or use "
                "faster hardware"
            )
        return best

    def plan(
        self,
        slas: Sequence[float],
        draft_step_seconds: Mapping[float, float | None] | None = None,
    ) -> list[PlannedTier]:
        """One tier per SLA, tightest first. ``draft_step_seconds`` gives an SLA's tier
        its own draft pass (e.g. its base values' ``draftStepSeconds``); the others use
        the planner's. Runs are shared between tiers with the same draft pass."""
        if not slas:
            raise PlanError("give at least one SLA (tok/s/user), e.g. --sla 80,120")
        if len(set(slas)) != len(slas):
            raise PlanError(f"SLAs must be distinct, got {list(slas)}")
        own = dict(draft_step_seconds or {})
        unknown = sorted(set(own) - set(slas))
        if unknown:
            raise PlanError(f"a draft pass was given for SLA {unknown[0]:g}, which is not planned")
        tiers = []
        for s in sorted(slas, reverse=True):
            d = own.get(s, self.draft_step_seconds)
            planner = self if d == self.draft_step_seconds else replace(self, draft_step_seconds=d)
            tiers.append(planner.plan_tier(float(s)))
        return tiers


def values_yaml(
    doc: dict[str, Any],
    tiers: Sequence[PlannedTier],
    source: str = "",
    names: Mapping[float, str] | None = None,
) -> str:
    """The values document as YAML with a header stating the predictions it rests on
    (``names``: the tier each SLA was written onto, default ``tier_name``)."""
    lines = [
        "# Generated by `dspark-sglang plan`" + (f" ({source})" if source else "") + ".",
        "# Simulated per tier (closed loop at maxRunningRequests, tok/s):",
    ]
    for t in tiers:
        r = t.result
        lines.append(
            f"#   {_name(t, names)}: policy {t.spec.label}, cap {t.max_running_requests}: "
            f"throughput {r.throughput:.1f}, per-user p50 {r.user_tps_p50:.1f} / "
            f"p90 {r.user_tps_p90:.1f}; {draft_text(t.draft_step_seconds)}"
        )
    lines.append("# Re-plan after every re-profile or drafter change.")
    return "\n".join(lines) + "\n" + yaml.safe_dump(doc, sort_keys=False)


def draft_text(seconds: float | None) -> str:
    """What a prediction assumed for the draft pass, in words."""
    if seconds is None:
        return "draft pass not modelled (0 s per decode step)"
    return f"draft pass {seconds:g} s per decode step"


def _name(t: PlannedTier, names: Mapping[float, str] | None) -> str:
    return names[t.sla] if names is not None else tier_name(t.sla)


def plan_table(tiers: Sequence[PlannedTier], names: Mapping[float, str] | None = None) -> str:
    """Fixed-width text table of the plan (what the CLI prints); ``draft s`` is the draft
    pass charged per decode step (``-``: not modelled)."""
    head = (
        f"{'tier':<12}{'SLA':>7}  {'policy':<10}{'cap':>5}{'verify':>8}"
        f"{'thr tok/s':>11}{'p50':>9}{'p90':>9}{'acc len':>9}{'draft s':>9}"
    )
    rows = [head, "-" * len(head)]
    for t in tiers:
        r = t.result
        rows.append(
            f"{_name(t, names):<12}{t.sla:>7g}  {t.spec.label:<10}{t.max_running_requests:>5}"
            f"{t.max_verify_tokens:>8}{r.throughput:>11.1f}{r.user_tps_p50:>9.1f}"
            f"{r.user_tps_p90:>9.1f}{r.mean_accept_len:>9.2f}"
            f"{'-' if t.draft_step_seconds is None else format(t.draft_step_seconds, 'g'):>9}"
        )
    return "\n".join(rows)
