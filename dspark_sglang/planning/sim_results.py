"""What one simulated load point produced: raw records and their summary (``simulator``)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

if TYPE_CHECKING:
    from dspark_sglang.scheduling.policies import SchedulingPolicy

__all__ = ["SimDetails", "SimResult", "summarise"]


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
    step_drafted: np.ndarray | None = None  # bool [S]: the step ran the draft pass


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
    #: ``always`` or ``priced`` (the draft decision, ``SimConfig.draft_decision``).
    draft_decision: str = "always"
    #: Share of the request-steps decoded in the window that ran the draft pass.
    drafted_share: float = 1.0
    details: SimDetails | None = field(default=None, repr=False, compare=False)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready summary (without the raw ``details``)."""
        d = asdict(self)
        d.pop("details", None)
        return d


def summarise(
    policy: SchedulingPolicy, cfg: Any, d: SimDetails, acc_all: np.ndarray, t_end: float
) -> SimResult:
    """Window statistics after the warm-up (``simulator``'s module docstring) of a run
    under ``cfg``, the ``simulator.SimConfig`` it ran."""
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
        draft_decision=cfg.draft_decision,
        drafted_share=(
            float((n_dec * d.step_drafted[dec]).sum() / n_dec.sum())
            if has_dec and d.step_drafted is not None
            else 1.0
        ),
        details=d,
    )
