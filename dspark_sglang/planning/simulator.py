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
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

import numpy as np
import torch

from dspark_sglang.calibration.sts import StsCalibration, apply_sts
from dspark_sglang.planning.traces import AcceptanceTraces
from dspark_sglang.planning.workload import LengthDistribution
from dspark_sglang.scheduling.cost_table import CostModel
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
            requests decode (see the module docstring); ``0`` = not modelled. The cost
            model given to ``simulate`` must be the target-only profile.
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

    def __post_init__(self) -> None:
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


class StepTimer:
    """Seconds per engine forward from a cost table, splitting batches above its limit.

    ``time(n, b) = k / SPS(n, M) + 1 / SPS(n, b - k*M)`` with ``k = floor(b / M)`` full
    forwards of ``M = max_batch_tokens`` (``M`` absent: one forward), memoised.
    """

    def __init__(self, cost_model: CostModel) -> None:
        self.cost_model = cost_model
        mbt = getattr(cost_model, "max_batch_tokens", None)
        self.max_batch_tokens: int | None = (
            int(mbt) if isinstance(mbt, int) and not isinstance(mbt, bool) else None
        )
        self._cache: dict[tuple[int, int], float] = {}

    def _one(self, num_reqs: int, tokens: int) -> float:
        sps = self.cost_model.steps_per_sec(num_reqs, torch.tensor([tokens]))
        return 1.0 / float(torch.as_tensor(sps).reshape(-1)[0])

    def __call__(self, num_reqs: int, batch_tokens: int) -> float:
        key = (num_reqs, batch_tokens)
        hit = self._cache.get(key)
        if hit is not None:
            return hit
        m = self.max_batch_tokens
        if m is None or batch_tokens <= m:
            t = self._one(num_reqs, max(1, batch_tokens))
        else:
            full, rest = divmod(batch_tokens, m)
            t = full * self._one(num_reqs, m) + (self._one(num_reqs, rest) if rest else 0.0)
        if len(self._cache) > 100_000:
            self._cache.clear()
        self._cache[key] = t
        return t


@dataclass(frozen=True)
class SimDetails:
    """Raw per-step and per-request records of a run (numpy arrays)."""

    step_start: np.ndarray  # float64 [S]: clock at the start of each step
    step_time: np.ndarray  # float64 [S]
    step_decoding: np.ndarray  # int64 [S]: requests decoding (N)
    step_drafts: np.ndarray  # int64 [S]: drafts verified, sum(l)
    step_prefill_tokens: np.ndarray  # int64 [S]
    step_emitted: np.ndarray  # int64 [S]: output tokens produced
    step_round_tokens: np.ndarray  # int64 [S]: sum of accepted + 1 over decode rounds (uncapped)
    req_spawn: np.ndarray  # float64 [R]: arrival time
    req_admit: np.ndarray  # float64 [R] (nan: never admitted)
    req_first_token: np.ndarray  # float64 [R] (nan: none yet)
    req_finish: np.ndarray  # float64 [R] (nan: unfinished)
    req_output_len: np.ndarray  # int64 [R]: tokens the request must generate
    req_emitted: np.ndarray  # int64 [R]: tokens it did generate
    decisions: list[tuple[torch.Tensor, torch.Tensor]] = field(default_factory=list)


@dataclass(frozen=True)
class SimResult:
    """Summary of one run (all speeds in output tokens per second)."""

    policy: str
    mode: str
    concurrency: int | None
    arrival_rate: float | None
    max_running_requests: int
    throughput: float
    user_tps_p50: float
    user_tps_p90: float
    user_tps_mean: float
    ttft_p50: float
    mean_decoding: float
    mean_verify_len: float
    mean_verify_tokens_per_request: float
    mean_batch_tokens: float
    mean_accept_len: float
    completed: int
    sim_time: float
    steps: int
    #: Seconds of draft pass the clock charged per decode step (0: not modelled).
    draft_step_seconds: float = 0.0
    details: SimDetails | None = field(default=None, repr=False, compare=False)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready summary (without the raw ``details``)."""
        d = asdict(self)
        d.pop("details", None)
        return d


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
    running: list[int] = []  # request ids, admission order
    pending: list[int] = []  # closed loop, "next_step": sent, joining at the next step
    next_req = 0  # next request to spawn / admit
    t = 0.0
    steps: list[tuple[float, float, int, int, int, int, int]] = []
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
        if n:
            ids = np.asarray(decode_now, dtype=np.int64)
            rounds = span_start[trace_req[ids]] + ptr[ids] % span_len[trace_req[ids]]
            conf = conf_all[torch.from_numpy(rounds)]
            lens = policy.decide(conf)
            if cfg.record_decisions:
                decisions.append((conf, lens.clone()))
            l = lens.numpy().astype(np.int64)
            accepted = np.minimum(acc_all[rounds], l)
            room = out_len[ids] - emitted_req[ids]
            got = np.minimum(accepted + 1, room)
            emitted_req[ids] += got
            ptr[ids] += 1
            drafts = int(l.sum())
            emitted_step = int(got.sum())
            round_tokens = int(accepted.sum()) + n
        num_reqs = n + len(pre_reqs)
        dt = timer(num_reqs, n + drafts + pre_tokens)
        if n:  # the engine drafts for the decoding requests before the policy decides
            dt += cfg.draft_step_seconds
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
    )
    return _summarise(policy, cfg, details, acc_all, t)


def _summarise(
    policy: SchedulingPolicy, cfg: SimConfig, d: SimDetails, acc_all: np.ndarray, t_end: float
) -> SimResult:
    """Window statistics after the warm-up (see the module docstring)."""
    n_req = cfg.num_requests
    warm = int(cfg.warmup_fraction * n_req)
    finished_times = np.sort(d.req_finish[~np.isnan(d.req_finish)])
    t0 = float(finished_times[warm - 1]) if warm and finished_times.size >= warm else 0.0
    if warm and finished_times.size < warm:
        raise ValueError(
            f"only {finished_times.size} requests finished, fewer than the {warm} warm-up "
            "requests: raise num_requests or lower warmup_fraction"
        )
    in_win = d.step_start >= t0
    window = t_end - t0
    if window <= 0 or not in_win.any():
        raise ValueError(
            "no simulated time after the warm-up: raise num_requests or lower warmup_fraction"
        )
    throughput = float(d.step_emitted[in_win].sum()) / window

    ids = np.arange(n_req)
    ok = (ids >= warm) & ~np.isnan(d.req_finish) & (d.req_output_len >= 2)
    tpot = (d.req_finish[ok] - d.req_first_token[ok]) / (d.req_output_len[ok] - 1)
    speed = 1.0 / np.maximum(tpot, 1e-12)
    started = (ids >= warm) & ~np.isnan(d.req_first_token)
    ttft = d.req_first_token[started] - d.req_spawn[started]

    dec = in_win & (d.step_decoding > 0)
    n_dec = d.step_decoding[dec].astype(np.float64)
    drafts = d.step_drafts[dec].astype(np.float64)
    emitted_rounds = d.step_round_tokens[dec].astype(np.float64)
    has_dec = bool(dec.any())
    nan = float("nan")
    return SimResult(
        policy=policy.name,
        mode=cfg.mode,
        concurrency=cfg.concurrency,
        arrival_rate=cfg.arrival_rate,
        max_running_requests=cfg.cap,
        throughput=throughput,
        user_tps_p50=float(np.percentile(speed, 50)) if speed.size else nan,
        user_tps_p90=float(np.percentile(speed, 10)) if speed.size else nan,
        user_tps_mean=float(speed.mean()) if speed.size else nan,
        ttft_p50=float(np.percentile(ttft, 50)) if ttft.size else nan,
        mean_decoding=float(n_dec.mean()) if has_dec else 0.0,
        mean_verify_len=float(drafts.sum() / n_dec.sum()) if has_dec else 0.0,
        mean_verify_tokens_per_request=float((n_dec + drafts).sum() / n_dec.sum())
        if has_dec
        else 0.0,
        mean_batch_tokens=float((n_dec + drafts).mean()) if has_dec else 0.0,
        # Tokens per decode round (accepted + 1), before the output-length cap.
        mean_accept_len=float(emitted_rounds.sum() / n_dec.sum()) if has_dec else nan,
        completed=int(ok.sum()),
        sim_time=float(t_end),
        steps=int(d.step_time.size),
        draft_step_seconds=cfg.draft_step_seconds,
        details=d,
    )
