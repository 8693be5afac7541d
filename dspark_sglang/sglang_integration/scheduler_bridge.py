"""Our scheduling policy behind SGLang's per-request verify-length decision.

Where SGLang decides: ``DSparkVerifyPlanner.schedule_layout`` (SGLang 0.5.23,
``dspark_components/dspark_planner.py``) turns the draft's calibrated
confidences ``[N, gamma]`` into per-request verify lengths through one private
method, ``_schedule_verify_lens(..., confidence, budget) -> verify_lens [N]``
(SGLang's top-k over survival, filled up to the lagged budget of
``compute_verify_token_budget``). Everything around it (layout, CUDA-graph
tiers, cap-accept/compact verify) consumes only the lengths it returns, so this
is the smallest point where a different policy can decide without changing
anything else SGLang does.

How we override it: one ``HookRegistry`` AROUND hook on that method. It acts
only on planners our worker tagged (:data:`DECIDER_ATTR`, set by
``DSparkMoeWorker``); every other planner (SGLang's own DSPARK) runs the
original code. No SGLang file is patched.

Units: our policies return *drafts* per request (``0..B``); SGLang's verify
length counts the anchor too (``1..B+1``), so ``verify_len = drafts + 1``.

Config: ``DSPARK_SCHEDULER_CONFIG`` names a :class:`SchedulerConfig` YAML/JSON
file. Unset keeps SGLang's own decision (logged once).

Round cost: the cost table profiles the target alone, but every speculative round
also pays the draft pass and its own bookkeeping. The config's ``draft_step_seconds``
adds a fixed draft cost to the table (``policy_from_config``). Unset, a CPU worker
times its decode rounds and the target's verify in each, per shape (requests x verify
tokens), and the policy prices rounds from them once measured, over the table
elsewhere (:meth:`VerifyDecider.observe_round`, ``round_costs.RoundCosts``). A GPU
worker times
nothing, because reading a host clock around device work would need a synchronisation
every step, and logs that the target-only table is in use.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from dspark_sglang.scheduling.config import NEEDS_COST_TABLE, SchedulerConfig
from dspark_sglang.scheduling.cost_table import (
    CostModel,
    CostTable,
    load_cost_table,
)
from dspark_sglang.scheduling.device_policies import device_twin
from dspark_sglang.scheduling.draft_decision import DraftDecision
from dspark_sglang.scheduling.policies import SchedulingPolicy, policy_from_config
from dspark_sglang.scheduling.round_costs import RoundCosts, RoundTimings
from dspark_sglang.sglang_integration import metrics, startup_profile, sync_probe
from dspark_sglang.sglang_integration.launch import (
    CONFIG_ENV,
    DECISION_LOG_ENV,
    RAGGED_MODE_ENV,
    check_config,
    check_sts_block_size,
)
from dspark_sglang.sglang_integration.verify_tier import fit_to_budget, sizes_graph_tiers

logger = logging.getLogger(__name__)

DECIDER_ATTR = "dspark_moe_decider"
PLANNER_METHOD = (
    "sglang.srt.speculative.dspark_components.dspark_planner."
    "DSparkVerifyPlanner._schedule_verify_lens"
)


@dataclass
class VerifyDecider:
    """Our policy as SGLang's verify-length decision, with its metrics.

    Invariant: returns int32 ``verify_lens [N]`` with ``1 <= verify_len <= B + 1``
    (the anchor is always verified), as SGLang's layout requires.

    No host synchronisation: the policy is the device twin of the configured one
    (``device_policies.device_twin``, built once on the worker's device), the
    decision-time metric is host wall time of the call (``perf_counter``, not a
    device read) and the budget histogram is accumulated on the device
    (``step_metrics``, flushed with the step result). Only the decision log
    (``DSPARK_DECISION_LOG``, a debug aid) reads values back, and only when set.
    """

    config: SchedulerConfig
    policy: SchedulingPolicy
    decision_log: Path | None = None
    #: Only TP rank 0 records metrics and the decision log (every rank decides the same).
    records: bool = True
    device: torch.device | str = "cpu"
    #: Device accumulator of the budget histogram (``None``: not recorded).
    step_metrics: metrics.StepMetrics | None = None
    #: The cost table the policy was built on, as loaded or profiled, before any
    #: ``draft_step_seconds`` (``None``: the policy uses no table).
    cost_table: CostTable | None = None
    #: Decode rounds timed per shape (:meth:`observe_round`; empty: none yet).
    timings: RoundTimings = field(default_factory=RoundTimings)
    #: What the policy prices rounds with now: ``RoundCosts`` once a shape is measured.
    cost_model: CostModel | None = None
    #: Whether each step drafts at all (``draft_decision: priced``), else None.
    draft_decision: DraftDecision | None = None
    #: Measured shapes at the last INFO line (the next one comes at twice as many).
    _logged_shapes: float = field(default=0.5, repr=False)

    def __post_init__(self) -> None:
        self.policy = device_twin(self.policy, self.device)

    @property
    def times_rounds(self) -> bool:
        """Whether the worker should time its decode rounds (:meth:`observe_round`).

        Only for a policy with a cost table, without ``draft_step_seconds`` in the
        config, on a CPU device (there host timing costs no synchronisation).
        """
        return (
            self.cost_table is not None
            and self.config.draft_step_seconds is None
            and torch.device(self.device).type == "cpu"
        )

    def observe_round(
        self, num_reqs: int, tokens: int, round_seconds: float, verify_seconds: float
    ) -> None:
        """Record one decode round: ``num_reqs`` requests verified ``tokens`` tokens in all.

        ``round_seconds`` is the whole round, ``verify_seconds`` the target's verify in it.
        Called by the worker after the round, so a rebuilt policy prices the next round
        from rounds that are over (non-anticipating). When a shape gets its
        ``round_costs.MIN_SAMPLES``-th recent timing, or ``round_costs.WINDOW`` rounds
        have passed, the policy is rebuilt on ``round_costs.RoundCosts`` (the measured
        shapes over the cost table), logged at INFO when the number of measured shapes
        reaches 1, 2, 4, 8, ... (DEBUG otherwise).
        """
        if self.cost_table is None:
            raise ValueError("observe_round: this decider's policy uses no cost table")
        self.timings.add(num_reqs, tokens, round_seconds, verify_seconds)
        if self.records and self.decision_log is not None:
            with self.decision_log.open("a", encoding="utf-8") as f:
                timed = [num_reqs, tokens, round_seconds, verify_seconds]
                f.write(json.dumps({"timed_round": timed}) + "\n")
        if not self.timings.ready:
            return
        costs = self.timings.snapshot(self.cost_table)
        self.cost_model = costs
        self.policy = device_twin(policy_from_config(self.config, cost_model=costs), self.device)
        if self.records:
            metrics.set_round_cost_shapes(len(costs.verify))
            # INFO when the measured shapes reach 1, 2, 4, 8, ...: a few lines per worker.
            shown = len(costs.verify) >= 2 * self._logged_shapes
            if shown:
                self._logged_shapes = len(costs.verify)
            shapes = ", ".join(
                f"{n}x{m}: {1e3 * s:.1f} ms" for (n, m), (s, _) in sorted(costs.verify.items())
            )
            rest = ", ".join(f"{n}: {1e3 * s:.1f} ms" for n, (s, _) in sorted(costs.rest.items()))
            logger.log(
                logging.INFO if shown else logging.DEBUG,
                "DSPARK_MOE: policy %s now prices rounds from the decode rounds this worker "
                "timed (target verify, requests x tokens: median %s; rest of the round, per "
                "request count: %s), over the cost table elsewhere (set draft_step_seconds "
                "in the scheduler config, Helm chart slaTiers[].scheduler.draftStepSeconds, "
                "to price from the table alone)",
                self.policy.name,
                shapes or "none yet",
                rest or "none yet",
            )

    def verify_lens(
        self,
        confidence: torch.Tensor,
        device: torch.device,
        prefix_lens: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Decide drafts per request from this step's confidences ``[N, B]``.

        ``prefix_lens`` (each request's length before the round) only goes to the log."""
        t0 = time.perf_counter()
        with sync_probe.sync_free("VerifyDecider.verify_lens"):
            given = confidence.detach().float().clamp(0.0, 1.0)
            drafts = self.policy.decide(given)
            lens = (drafts.clamp(0, confidence.shape[1]) + 1).to(device=device, dtype=torch.int32)
            if self.records and self.step_metrics is not None:
                self.step_metrics.observe_budget(lens)
        if self.records:
            metrics.observe_decision_seconds(time.perf_counter() - t0)
        if self.records and self.decision_log is not None:
            # Debug aid only: these reads sync, and happen only with DSPARK_DECISION_LOG set.
            n, total = int(confidence.shape[0]), int(lens.sum())
            model = self.cost_model
            row = {
                "policy": self.policy.name,
                "confidence": given.tolist(),
                "verify_lens": lens.tolist(),
                "prefix_lens": None if prefix_lens is None else prefix_lens.tolist(),
                # What the policy priced this round at (None: no table), and from what.
                "round_seconds": None
                if model is None
                else 1.0 / float(model.steps_per_sec(n, torch.tensor([total]))[0]),
                "priced_from": None if model is None else _priced_from(model),
            }
            with self.decision_log.open("a", encoding="utf-8") as f:
                f.write(json.dumps(row) + "\n")
        return lens

    def log_used(self, cap_lens: torch.Tensor | None) -> None:
        """Record the verify lengths SGLang's verify actually used (``cap_lens``).

        Reads ``cap_lens`` back (a sync), so only with ``DSPARK_DECISION_LOG`` set."""
        if self.records and self.decision_log is not None:
            used = None if cap_lens is None else cap_lens.cpu().tolist()
            with self.decision_log.open("a", encoding="utf-8") as f:
                f.write(json.dumps({"used_verify_lens": used}) + "\n")


def _priced_from(model: CostModel) -> str:
    """``"table"``, or ``"rounds:<k>"`` for ``RoundCosts`` with ``k`` measured verify shapes."""
    if isinstance(model, RoundCosts):
        return f"rounds:{len(model.verify)}"
    return "table"


def _sha256_12(path: str | None) -> str:
    if not path:
        return "none"
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()[:12]


def load_decider(
    gamma: int,
    env: dict[str, str] | None = None,
    *,
    tp_rank: int = 0,
    profile: Callable[[SchedulerConfig], CostTable] | None = None,
    device: torch.device | str = "cpu",
    step_metrics: metrics.StepMetrics | None = None,
) -> VerifyDecider | None:
    """The decider ``DSPARK_SCHEDULER_CONFIG`` asks for, or ``None`` (SGLang decides).

    Fails at start-up, naming the field and the fix, when the config does not
    fit the running worker (block size, ragged-verify mode, cost table, STS
    file). Publishes ``dspark_scheduler_info`` (policy, SLA tier, cost-table
    and STS digests) and logs the same line, so the deciding config is visible.
    When the config asks for a start-up table (``profiles_at_startup``), ``profile``
    measures it (``startup_profile.profile_target``) and the policy uses it.
    """
    env = dict(os.environ) if env is None else env
    path = env.get(CONFIG_ENV)
    if not path:
        logger.info("%s not set: DSPARK_MOE keeps SGLang's verify-budget decision", CONFIG_ENV)
        return None
    cfg = SchedulerConfig.load(path)
    check_config(cfg, path, gamma, env)
    if cfg.sts_path:
        from dspark_sglang.calibration.sts import load_sts

        check_sts_block_size(load_sts(cfg.sts_path).block_size, gamma, f"sts_path={cfg.sts_path}")
    log = env.get(DECISION_LOG_ENV)
    records = tp_rank == 0
    table = None
    if cfg.profiles_at_startup:
        if profile is None:
            raise ValueError(
                f"{path}: the config asks for a start-up cost table; no profiler given"
            )
        table = profile(cfg)
    uses_table = cfg.policy in NEEDS_COST_TABLE
    policy_table = table
    if uses_table and policy_table is None and cfg.cost_table_path:
        policy_table = load_cost_table(cfg.cost_table_path)
    policy = policy_from_config(cfg, cost_model=policy_table)
    decider = VerifyDecider(
        cfg,
        policy,
        Path(log) if log else None,
        records,
        device=device,
        step_metrics=step_metrics if records else None,
        cost_table=policy_table if uses_table else None,
        # The host policy's own model (the table plus any draft_step_seconds); the
        # decider keeps only its device twin, which holds a device copy.
        cost_model=policy.cost_model if uses_table else None,
    )
    if cfg.draft_decision == "priced" and policy_table is not None:
        decider.draft_decision = DraftDecision(
            block_size=gamma,
            probe_every=cfg.probe_every_value,
            round_model=lambda: decider.cost_model,
            plain_table=policy_table,
            max_verify_tokens=cfg.max_verify_tokens,
        )
    if records and uses_table and cfg.draft_step_seconds is None and not decider.times_rounds:
        logger.info(
            "DSPARK_MOE: draft_step_seconds is unset and the worker runs on %s, where timing "
            "its rounds would synchronise every step: policy %s schedules with the "
            "target-only cost table. Set draft_step_seconds in %s (Helm chart: "
            "slaTiers[].scheduler.draftStepSeconds) to the seconds of one draft pass, e.g. "
            "from a DSPARK_PROFILE_ROUNDS profile, to count the draft",
            torch.device(device).type,
            cfg.policy,
            path,
        )
    info = {
        "policy": decider.policy.name,
        "sla_tier": cfg.sla_name,
        "block_size": str(cfg.block_size),
        "cost_table_sha256": _sha256_12(cfg.cost_table_path)
        if table is None
        else f"startup-{startup_profile.digest(table)}",
        "sts_sha256": _sha256_12(cfg.sts_path),
        "ragged_verify_mode": env.get(RAGGED_MODE_ENV, "static"),
    }
    if records:
        metrics.publish_scheduler_info(info)
        logger.info(
            "DSPARK_MOE: policy %s from %s (sla=%s, cost table %s sha256 %s, sts %s, "
            "%s=%s) decides verify lengths",
            decider.policy.name,
            path,
            cfg.sla_name,
            cfg.cost_table_path,
            info["cost_table_sha256"],
            cfg.sts_path,
            RAGGED_MODE_ENV,
            info["ragged_verify_mode"],
        )
    return decider


def schedule_verify_lens_hook(original: Callable[..., Any], planner: Any, **kw: Any) -> Any:
    """AROUND hook on ``DSparkVerifyPlanner._schedule_verify_lens`` (see module doc).

    SGLang returns ``None`` (verify the whole block) without confidences; so do we.
    After a drafter exception (``fallback.FORCE_PLAIN_ATTR``) every request verifies
    only its anchor, whoever decides otherwise; rows the fault guard folded for
    non-finite output (``fallback.PLAIN_ROWS_ATTR``) verify only theirs (``torch.where``).
    In compact mode with ragged verify graphs our lengths are trimmed to the step's
    CUDA-graph token tier (``verify_tier.fit_to_budget``); without graphs (CPU) the
    verify is laid out as exactly our lengths, so they stand.
    The lengths go through SGLang's TP sync so all ranks verify the same layout.
    """
    from sglang.srt.speculative.spec_tp_sync import SpecTpSyncSite

    from dspark_sglang.sglang_integration.fallback import FORCE_PLAIN_ATTR, PLAIN_ROWS_ATTR

    if getattr(planner, FORCE_PLAIN_ATTR, False):
        # A drafter exception this step: verify the anchor only (plain decoding).
        n = int(kw["req_pool_indices"].shape[0])
        lens = torch.ones(n, dtype=torch.int32, device=kw["device"])
        planner._tp_sync.sync(SpecTpSyncSite.DSPARK_PLAN, lens)
        return lens
    decider: VerifyDecider | None = getattr(planner, DECIDER_ATTR, None)
    confidence = kw.get("confidence")
    ours = decider is not None and confidence is not None
    lens = (
        decider.verify_lens(confidence, kw["device"], kw.get("prefix_lens"))
        if ours
        else original(planner, **kw)
    )
    if ours and planner.is_compact_mode and sizes_graph_tiers(planner):
        # The CUDA-graph tier is sized from SGLang's budget, not from our lengths.
        with sync_probe.sync_free("schedule_verify_lens_hook.fit_to_budget"):
            lens = fit_to_budget(
                lens, confidence, kw.get("budget"), planner._schedule_cfg.min_verify_len
            )
    plain_rows = getattr(planner, PLAIN_ROWS_ATTR, None)
    if lens is not None and plain_rows is not None:
        # Non-finite drafter rows (fallback.fold_rows): anchor only, on the device.
        with sync_probe.sync_free("schedule_verify_lens_hook.plain_rows"):
            rows = plain_rows[: lens.shape[0]].to(lens.device)
            lens = torch.where(rows, torch.ones_like(lens), lens)
        ours = True
    if ours and lens is not None:
        planner._tp_sync.sync(SpecTpSyncSite.DSPARK_PLAN, lens)
    return lens


def install() -> None:
    """Register the hook (SGLang applies hooks in every process after plugins load)."""
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    HookRegistry.register(PLANNER_METHOD, schedule_verify_lens_hook, HookType.AROUND)
