"""Step-level serving simulator: predicts throughput and per-user speed of a policy.

Why a simulator: the scheduler's value shows only under load (how many requests share
the target, how the cost staircase bends), and sweeping loads on real hardware is slow
and costly. Every step here runs the *same* ``SchedulingPolicy`` object the SGLang worker
runs (``scheduling.policies``), on confidences the drafter really produced (recorded
``AcceptanceTraces``), against the engine speed the profiler measured (``CostModel``).

Model, per engine step (clock ``t`` in seconds):

1. Admission. Closed loop: keep ``concurrency`` requests in the system (a finished one is
   replaced at once; with ``closed_admission="next_step"`` the replacement joins one
   step later while others are running: a live client's new request reaches the server
   after it has launched the next step for the others, benchmarks/README.md, "TTFT").
   Open loop: Poisson arrivals at ``arrival_rate`` wait in a FIFO queue and are admitted
   while fewer than ``max_running_requests`` run. A new request draws a ``(prompt,
   output)`` length pair (``LengthDistribution``), a domain, and one recorded trace
   request of that domain whose rounds it replays from the first, cycling if the output
   outlasts the recording.
2. Prefill (``prefill``): ``"none"`` = free (not modelled; every output token comes from
   decode rounds). ``"separate"`` (SGLang's default with speculative decoding, no mixed
   chunks): while prompts are pending, the step is a prefill-only forward of up to
   ``chunked_prefill_size`` prompt tokens (FIFO), decoders wait. ``"mixed"``: the chunk's
   prompt tokens ride along in the decode step's forward and count in ``b``. A request
   whose last prompt chunk ran emits its first token at the end of that step (the
   prefill samples it) and decodes from the next step. ``first_token`` says when a
   client *sees* that token: ``"prefill"`` (then), or ``"first_round"`` (at the end of
   the request's first decode round, together with that round's tokens: what SGLang's
   stream delivers under speculative decoding on the CPU server, benchmarks/README.md,
   "TTFT"). It moves TTFT and per-user speed only, never throughput.
3. Decode. ``N`` decoding requests each take their next trace round: raw logits ->
   STS (``sigmoid(z / T)``) -> ``policy.decide(confidence [N, B])`` -> ``l [N]``. Drafts
   accepted = ``min(accepted_full, l)`` (chain verification, see ``traces``); tokens
   emitted = accepted + 1, capped by what the request still has to generate.
4. Time. Forward batch tokens ``b = N + sum(l)`` (+ prefill tokens); the step takes
   ``1 / SPS(num_reqs, b)`` from the cost table. A batch above the table's
   ``max_batch_tokens`` runs as several forwards of at most that size (times add up),
   so the table is never extrapolated past its last probe. A step in which requests
   decode also pays the draft pass, ``draft_step_seconds`` (once per step): the table
   profiles the target's forward alone, and the DSPARK_MOE engine drafts every decode
   step before the policy decides, whatever it then verifies (policy ``none``
   included). A prefill-only step (``"separate"``) drafts nothing and pays nothing.
   This is the same ``1 / SPS + d`` a ``prefix``/``lagged`` policy built with
   ``draft_step_seconds = d`` decides with (``cost_table.with_fixed_step_cost``); the
   policy's table is for its decisions only, the clock reads ``cost_model`` (the
   target-only profile) and adds ``d`` itself, so nothing is counted twice.
5. Draft decision (``draft_decision="priced"``, what the chart's default tiers run): before
   a decode step, the worker's own ``DraftDecision`` (``scheduling/draft_decision.py``)
   prices a drafting round against a plain step from the confidences and outcomes of the
   requests' earlier simulated rounds (its probes and their backoff included). A step it
   leaves plain is a plain decode step: no draft pass, no policy call, each request emits
   one token and keeps its next trace round for its next drafting step; the step costs
   ``1 / SPS(N, N)``. A drafting step is step 3-4 above, then its confidences and the drafts
   it got are the decision's evidence, as the worker hands them over.

Per-user speed is the decode speed ``(output - 1) / (finish - first_token)`` (1 / TPOT,
as SGLang reports it and the chart's SLA alert judges it). ``user_tps_p90`` is the speed
90 % of requests reach or exceed (the 10th percentile of speed = speed at p90 TPOT).
Statistics skip the first ``warmup_fraction`` of requests (start-up transient: all
requests arrive and prefill together); throughput counts tokens emitted from the end of
the warm-up to the end of the run. Without ``drain`` the run ends when the steady state
ends (closed: the last request was admitted and a slot cannot be refilled; open: the
last arrival), so the tail with a shrinking batch does not bias throughput.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch

from dspark_sglang.calibration.sts import StsCalibration, apply_sts
from dspark_sglang.planning.sim_results import SimDetails, SimResult, summarise
from dspark_sglang.planning.step_timer import StepTimer
from dspark_sglang.planning.traces import AcceptanceTraces
from dspark_sglang.planning.workload import LengthDistribution
from dspark_sglang.scheduling.config import DEFAULT_PROBE_EVERY
from dspark_sglang.scheduling.cost_table import CostModel
from dspark_sglang.scheduling.draft_decision import DraftDecision, expected_accepted
from dspark_sglang.scheduling.policies import SchedulingPolicy

__all__ = [
    "ClosedAdmission",
    "FirstToken",
    "SimConfig",
    "SimDetails",
    "SimResult",
    "StepTimer",
    "is_seconds",
    "simulate",
]

PrefillMode = Literal["none", "separate", "mixed"]
FirstToken = Literal["prefill", "first_round"]
ClosedAdmission = Literal["at_finish", "next_step"]


@dataclass(frozen=True)
class SimConfig:
    """One simulated load point.

    Fields:
        mode: ``"closed"`` (fixed concurrency) or ``"open"`` (Poisson arrivals).
        concurrency: closed loop: requests kept in flight (>= 1).
        arrival_rate: open loop: mean arrivals per second (> 0).
        max_running_requests: admission cap. Closed loop: defaults to (and may not be
            below) ``concurrency``; open loop: required.
        num_requests: requests generated in total (>= 1).
        warmup_fraction: share of the first requests left out of the statistics, [0, 1).
        prefill: ``"none"``, ``"separate"`` or ``"mixed"`` (see the module docstring).
        first_token: ``"prefill"`` or ``"first_round"``: when the first token reaches
            the client (see the module docstring).
        closed_admission: ``"at_finish"`` or ``"next_step"``: when a closed loop's
            replacement request joins (see the module docstring).
        chunked_prefill_size: prompt tokens per step; default the table's
            ``max_batch_tokens`` (or 2048 for a table without one).
        drain: keep stepping until every admitted request finished (no new ones).
        domain_weights: probability of each trace domain for a new request (by name);
            default: proportional to the number of recorded requests per domain.
        seed: seeds lengths, domains, trace choice and arrivals.
        max_steps: safety bound; exceeding it raises (a stuck configuration).
        record_decisions: keep every step's confidences and verify lengths (tests).
        draft_step_seconds: seconds of the draft pass added to every step in which
            requests decode and draft (see the module docstring); ``0`` = not modelled. The
            cost model given to ``simulate`` must be the target-only profile.
        draft_decision: ``"always"`` (every decode step drafts) or ``"priced"`` (the draft
            decision, module docstring step 5; policies with a cost table only).
        probe_every: with ``"priced"``: plain steps in a row before a probe drafts.
    """

    mode: Literal["closed", "open"] = "closed"
    concurrency: int | None = None
    arrival_rate: float | None = None
    max_running_requests: int | None = None
    num_requests: int = 200
    warmup_fraction: float = 0.2
    prefill: PrefillMode = "separate"
    first_token: FirstToken = "prefill"
    closed_admission: ClosedAdmission = "at_finish"
    chunked_prefill_size: int | None = None
    drain: bool = False
    domain_weights: dict[str, float] | None = None
    seed: int = 0
    max_steps: int = 2_000_000
    record_decisions: bool = False
    draft_step_seconds: float = 0.0
    draft_decision: Literal["always", "priced"] = "always"
    probe_every: int = DEFAULT_PROBE_EVERY

    def __post_init__(self) -> None:
        if self.draft_decision not in ("always", "priced"):
            raise ValueError(
                "SimConfig.draft_decision must be 'always' or 'priced', got "
                f"{self.draft_decision!r}"
            )
        if not _pos_int(self.probe_every):
            raise ValueError(
                "SimConfig.probe_every must be an integer >= 1 (plain steps in a row before "
                f"a probe), got {self.probe_every!r}"
            )
        d = self.draft_step_seconds
        if not is_seconds(d):
            raise ValueError(
                "SimConfig.draft_step_seconds must be a finite number of seconds >= 0 (the "
                f"draft pass of one decode step; 0 = not modelled), got {d!r}"
            )
        object.__setattr__(self, "draft_step_seconds", float(d))
        if self.mode == "closed":
            if not _pos_int(self.concurrency):
                raise ValueError(
                    f"SimConfig.concurrency must be an integer >= 1 in closed-loop mode, "
                    f"got {self.concurrency!r}"
                )
            if self.arrival_rate is not None:
                raise ValueError("SimConfig.arrival_rate is for mode='open'; remove it")
            cap = self.max_running_requests
            if cap is not None and (not _pos_int(cap) or cap < int(self.concurrency or 0)):
                raise ValueError(
                    f"SimConfig.max_running_requests ({cap!r}) must be an integer >= "
                    f"concurrency ({self.concurrency}) in closed-loop mode"
                )
        elif self.mode == "open":
            r = self.arrival_rate
            if r is None or not math.isfinite(r) or r <= 0:
                raise ValueError(
                    f"SimConfig.arrival_rate must be > 0 requests/s in open-loop mode, got {r!r}"
                )
            if not _pos_int(self.max_running_requests):
                raise ValueError(
                    "SimConfig.max_running_requests (the admission cap) must be an integer "
                    f">= 1 in open-loop mode, got {self.max_running_requests!r}"
                )
            if self.concurrency is not None:
                raise ValueError("SimConfig.concurrency is for mode='closed'; remove it")
        else:
            raise ValueError(f"SimConfig.mode must be 'closed' or 'open', got {self.mode!r}")
        if not _pos_int(self.num_requests):
            raise ValueError(f"SimConfig.num_requests must be >= 1, got {self.num_requests!r}")
        if not 0.0 <= self.warmup_fraction < 1.0:
            raise ValueError(
                f"SimConfig.warmup_fraction must be in [0, 1), got {self.warmup_fraction!r}"
            )
        if self.prefill not in ("none", "separate", "mixed"):
            raise ValueError(
                f"SimConfig.prefill must be 'none', 'separate' or 'mixed', got {self.prefill!r}"
            )
        if self.closed_admission not in ("at_finish", "next_step"):
            raise ValueError(
                "SimConfig.closed_admission must be 'at_finish' or 'next_step', got "
                f"{self.closed_admission!r}"
            )
        if self.first_token not in ("prefill", "first_round"):
            raise ValueError(
                "SimConfig.first_token must be 'prefill' or 'first_round', got "
                f"{self.first_token!r}"
            )
        if self.chunked_prefill_size is not None and not _pos_int(self.chunked_prefill_size):
            raise ValueError(
                "SimConfig.chunked_prefill_size must be an integer >= 1 or None, got "
                f"{self.chunked_prefill_size!r}"
            )
        if self.domain_weights is not None:
            w = self.domain_weights
            if (
                not w
                or any(not math.isfinite(v) or v < 0 for v in w.values())
                or not any(v > 0 for v in w.values())
            ):
                raise ValueError(
                    "SimConfig.domain_weights must map domain names to finite weights >= 0, "
                    f"at least one > 0; got {w!r}"
                )

    @property
    def cap(self) -> int:
        """Most requests running at once."""
        if self.max_running_requests is not None:
            return int(self.max_running_requests)
        return int(self.concurrency or 1)


def _pos_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 1


def is_seconds(v: Any) -> bool:
    """Whether ``v`` is a finite number >= 0 (a duration in seconds; not a bool)."""
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) and v >= 0


def _confidences(
    traces: AcceptanceTraces, sts: StsCalibration | Sequence[float] | None
) -> torch.Tensor:
    """Calibrated conditional confidences of every recorded round, ``[M, B]`` float32."""
    b = traces.block_size
    if sts is None:
        temps: Sequence[float] = [1.0] * b
    elif isinstance(sts, StsCalibration):
        temps = sts.temperatures
    else:
        temps = list(sts)
    if len(temps) != b:
        raise ValueError(
            f"STS has {len(temps)} temperatures but the traces have block size {b}; "
            "calibrate on rollouts of the same drafter"
        )
    return apply_sts(traces.confidence_logits.float(), temps).to(torch.float32)


def _domain_probs(
    traces: AcceptanceTraces, weights: dict[str, float] | None, counts: np.ndarray
) -> np.ndarray:
    if weights is None:
        p = counts.astype(np.float64)
    else:
        unknown = sorted(set(weights) - set(traces.domains))
        if unknown:
            raise ValueError(
                f"domain_weights name unknown domain(s) {unknown}; traces have "
                f"{list(traces.domains)}"
            )
        p = np.array([float(weights.get(d, 0.0)) for d in traces.domains])
    return p / p.sum()


def simulate(
    traces: AcceptanceTraces,
    cost_model: CostModel,
    policy: SchedulingPolicy,
    lengths: LengthDistribution,
    config: SimConfig,
    *,
    sts: StsCalibration | Sequence[float] | None = None,
) -> SimResult:
    """Run one load point; ``policy`` is reset first and then sees every step in order."""
    cfg = config
    rng = np.random.default_rng(cfg.seed)
    gen = torch.Generator().manual_seed(cfg.seed)
    timer = StepTimer(cost_model)
    chunk = cfg.chunked_prefill_size or timer.max_batch_tokens or 2048
    conf_all = _confidences(traces, sts)
    acc_all = traces.accepted.numpy()
    span_start, span_len, span_dom = (t.numpy() for t in traces.request_spans())
    dom_counts = np.bincount(span_dom, minlength=len(traces.domains))
    dom_p = _domain_probs(traces, cfg.domain_weights, dom_counts)
    by_domain = [np.nonzero(span_dom == d)[0] for d in range(len(traces.domains))]

    n_req = cfg.num_requests
    prompt_t, output_t = lengths.sample(n_req, gen)
    prompt = prompt_t.numpy()
    out_len = output_t.numpy()
    dom = rng.choice(len(traces.domains), size=n_req, p=dom_p)
    trace_req = np.array([rng.choice(by_domain[d]) for d in dom], dtype=np.int64)
    if cfg.mode == "open":
        rate = float(cfg.arrival_rate or 0.0)
        spawn = np.cumsum(rng.exponential(1.0 / rate, size=n_req))
    else:
        spawn = np.full(n_req, np.nan)
    admit = np.full(n_req, np.nan)
    first = np.full(n_req, np.nan)
    finish = np.full(n_req, np.nan)
    emitted_req = np.zeros(n_req, dtype=np.int64)
    ptr = np.zeros(n_req, dtype=np.int64)  # round offset within the trace request
    prompt_left = prompt.copy() if cfg.prefill != "none" else np.zeros(n_req, dtype=np.int64)

    policy.reset()
    gate = _draft_decision(policy, cost_model, cfg, int(conf_all.shape[1]))
    running: list[int] = []  # request ids, admission order
    pending: list[int] = []  # closed loop, "next_step": sent, joining at the next step
    next_req = 0  # next request to spawn / admit
    t = 0.0
    steps: list[tuple[float, float, int, int, int, int, int]] = []
    drafted_steps: list[bool] = []
    decisions: list[tuple[torch.Tensor, torch.Tensor]] = []
    cap = cfg.cap

    while True:
        # --- admission -----------------------------------------------------------
        if cfg.mode == "closed":
            target = int(cfg.concurrency or 0)
            for r in pending:  # sent while the last step ran: they join now
                admit[r] = t
                running.append(r)
            pending = []
            join_now = cfg.closed_admission == "at_finish" or not running
            while len(running) + len(pending) < target and next_req < n_req:
                spawn[next_req] = t
                if join_now:
                    admit[next_req] = t
                    running.append(next_req)
                else:
                    pending.append(next_req)
                next_req += 1
            steady_over = next_req >= n_req and len(running) + len(pending) < target
        else:
            while len(running) < cap and next_req < n_req and spawn[next_req] <= t:
                admit[next_req] = t
                running.append(next_req)
                next_req += 1
            steady_over = t >= spawn[-1]
        if not running:
            if next_req >= n_req:
                break
            t = max(t, float(spawn[next_req]))  # idle until the next arrival
            continue
        if steady_over and not cfg.drain:
            break
        if len(steps) >= cfg.max_steps:
            raise RuntimeError(
                f"simulation exceeded max_steps={cfg.max_steps}; lower num_requests or raise "
                "max_steps (is the cost table's SPS tiny?)"
            )

        # --- prefill ---------------------------------------------------------------
        prefilling = [r for r in running if prompt_left[r] > 0]
        pre_tokens = 0
        pre_reqs: list[int] = []
        if prefilling and cfg.prefill != "none":
            budget = chunk
            for r in prefilling:
                if budget <= 0:
                    break
                take = int(min(budget, prompt_left[r]))
                prompt_left[r] -= take
                budget -= take
                pre_tokens += take
                pre_reqs.append(r)
        waiting = set(prefilling)
        decode_now = (
            []
            if cfg.prefill == "separate" and prefilling
            else [r for r in running if r not in waiting]
        )

        # --- decode ----------------------------------------------------------------
        n = len(decode_now)
        drafts = 0
        emitted_step = 0
        round_tokens = 0
        keys = [int(r) for r in decode_now] if gate is not None else []
        drafting = bool(n) and (gate is None or gate.decide(keys))
        if drafting:
            ids = np.asarray(decode_now, dtype=np.int64)
            rounds = span_start[trace_req[ids]] + ptr[ids] % span_len[trace_req[ids]]
            conf = conf_all[torch.from_numpy(rounds)]
            lens = policy.decide(conf)
            if cfg.record_decisions:
                decisions.append((conf, lens.clone()))
            l = lens.numpy().astype(np.int64)
            accepted = np.minimum(acc_all[rounds], l)
            if gate is not None:  # the round's evidence, as the worker hands it over
                gate.observe(keys, conf)
                gate.observe_outcome(expected_accepted(conf, lens), float(accepted.sum()))
            room = out_len[ids] - emitted_req[ids]
            got = np.minimum(accepted + 1, room)
            emitted_req[ids] += got
            ptr[ids] += 1
            drafts = int(l.sum())
            emitted_step = int(got.sum())
            round_tokens = int(accepted.sum()) + n
        elif n:  # a plain decode step: one token each, the next trace round kept
            emitted_req[np.asarray(decode_now, dtype=np.int64)] += 1
            emitted_step = round_tokens = n
        num_reqs = n + len(pre_reqs)
        dt = timer(num_reqs, n + drafts + pre_tokens)
        if drafting:  # the engine drafts for the decoding requests before the policy decides
            dt += cfg.draft_step_seconds
        drafted_steps.append(drafting)
        steps.append((t, dt, n, drafts, pre_tokens, emitted_step, round_tokens))
        t += dt

        # --- bookkeeping -------------------------------------------------------------
        for r in pre_reqs:
            if prompt_left[r] == 0:  # last chunk ran: the prefill samples the first token
                emitted_req[r] += 1
                if cfg.first_token == "prefill" or emitted_req[r] >= out_len[r]:
                    first[r] = t  # else it streams with the first round (bookkeeping below)
                steps[-1] = (*steps[-1][:5], steps[-1][5] + 1, steps[-1][6])
        for r in decode_now:
            if np.isnan(first[r]):
                first[r] = t
        done = [r for r in running if emitted_req[r] >= out_len[r]]
        for r in done:
            finish[r] = t
        if done:
            running = [r for r in running if emitted_req[r] < out_len[r]]

    arr = np.asarray(steps, dtype=np.float64).reshape(-1, 7)
    details = SimDetails(
        step_start=arr[:, 0].copy(),
        step_time=arr[:, 1].copy(),
        step_decoding=arr[:, 2].astype(np.int64),
        step_drafts=arr[:, 3].astype(np.int64),
        step_prefill_tokens=arr[:, 4].astype(np.int64),
        step_emitted=arr[:, 5].astype(np.int64),
        step_round_tokens=arr[:, 6].astype(np.int64),
        req_spawn=spawn,
        req_admit=admit,
        req_first_token=first,
        req_finish=finish,
        req_output_len=out_len.astype(np.int64),
        req_emitted=emitted_req,
        decisions=decisions,
        step_drafted=np.asarray(drafted_steps, dtype=bool),
    )
    return summarise(policy, cfg, details, acc_all, t)


def _draft_decision(
    policy: SchedulingPolicy, cost_model: CostModel, cfg: SimConfig, block_size: int
) -> DraftDecision | None:
    """The worker's draft decision for ``cfg.draft_decision="priced"``, else None: drafting
    rounds priced with the policy's own cost model (the table plus the draft pass), a plain
    step with the target-only table the clock reads."""
    if cfg.draft_decision != "priced":
        return None
    model = getattr(policy, "cost_model", None)
    if model is None:
        raise ValueError(
            f"SimConfig.draft_decision='priced' prices drafting rounds with the policy's cost "
            f"table; policy {policy.name!r} has none (use prefix or lagged, or 'always')"
        )
    return DraftDecision(
        block_size=block_size,
        probe_every=cfg.probe_every,
        round_model=lambda: model,
        plain_table=cost_model,
        max_verify_tokens=getattr(policy, "max_verify_tokens", None),
    )
