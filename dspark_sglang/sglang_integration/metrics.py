"""DSpark Prometheus metrics, exported through SGLang's own ``/metrics`` endpoint.

Why here and lazily: SGLang (``--enable-metrics``) sets ``PROMETHEUS_MULTIPROC_DIR``
before it spawns the scheduler processes and serves the directory's aggregate
from the HTTP process. ``prometheus_client`` picks multiprocess mode when a metric
is *created*, so our metrics are created on first use inside the scheduler
process (the worker), never at import time; values then land in SGLang's
multiprocess directory and appear on its endpoint with no extra server.
Without that variable they live in the process-local default registry (tests).

The names are a contract with the Helm chart and the dashboard; do not rename.
"""

from __future__ import annotations

import threading
from typing import Any

import torch

_lock = threading.Lock()
_metrics: dict[str, Any] = {}

ACCEPTED_LENGTH_BUCKETS: tuple[float, ...] = tuple(float(x) for x in range(1, 18))
BUDGET_BUCKETS: tuple[float, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096)
DECISION_BUCKETS: tuple[float, ...] = (1e-5, 3e-5, 1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 0.1)


#: Every ``reason`` label value, created at 0 so alerts and ``rate()`` see the series
#: before the first event.
FALLBACK_REASONS: tuple[str, ...] = ("draft_error", "non_finite")
REFUSAL_REASONS: tuple[str, ...] = ("token_id_out_of_vocab", "greedy_only")


def _get() -> dict[str, Any]:
    """Create the metrics once per process (after SGLang configured prometheus)."""
    with _lock:
        if _metrics:
            return _metrics
        from prometheus_client import Counter, Gauge, Histogram

        _metrics.update(
            accepted=Histogram(
                "dspark_accepted_length",
                "Tokens emitted per request per verify round (accepted drafts + bonus)",
                buckets=ACCEPTED_LENGTH_BUCKETS,
            ),
            position=Gauge(
                "dspark_position_acceptance_ratio",
                "Conditional acceptance of draft position k given positions < k accepted",
                ["position"],
                multiprocess_mode="mostrecent",
            ),
            budget=Histogram(
                "dspark_verify_budget_tokens",
                "Total verify tokens (anchors + drafts) per decode step",
                buckets=BUDGET_BUCKETS,
            ),
            decision=Histogram(
                "dspark_scheduler_decision_seconds",
                "Time our scheduling policy took to choose verify lengths",
                buckets=DECISION_BUCKETS,
            ),
            fallback=Counter(
                "dspark_fallback",  # exposed as dspark_fallback_total
                "Decode steps that fell back to plain decoding (each is also a dspark_rounds step)",
                ["reason"],
            ),
            rounds=Counter("dspark_rounds", "DSpark verify rounds (decode steps)"),
            refused=Counter(
                "dspark_requests_refused",  # exposed as dspark_requests_refused_total
                "Requests refused with HTTP 400 before scheduling (sglang_integration.requests)",
                ["reason"],
            ),
            scheduler=Gauge(
                "dspark_scheduler_info",
                "The scheduler config deciding verify lengths (1 per label set)",
                list(SCHEDULER_INFO_LABELS),
                multiprocess_mode="max",
            ),
        )
        for reason in FALLBACK_REASONS:
            _metrics["fallback"].labels(reason=reason)
        for reason in REFUSAL_REASONS:
            _metrics["refused"].labels(reason=reason)
        return _metrics


def ensure_created() -> None:
    """Create this process's metrics now (every series is then exported, at 0)."""
    _get()


#: Labels of ``dspark_scheduler_info`` (one series per deciding config).
SCHEDULER_INFO_LABELS: tuple[str, ...] = (
    "policy",
    "sla_tier",
    "block_size",
    "cost_table_sha256",
    "sts_sha256",
    "ragged_verify_mode",
)


def publish_scheduler_info(labels: dict[str, str]) -> None:
    """Set ``dspark_scheduler_info{...} 1`` for the config this worker runs."""
    _get()["scheduler"].labels(**{k: labels[k] for k in SCHEDULER_INFO_LABELS}).set(1)


def observe_decision(seconds: float, verify_tokens: int) -> None:
    m = _get()
    m["decision"].observe(seconds)
    m["budget"].observe(verify_tokens)


def count_fallback(reason: str) -> None:
    _get()["fallback"].labels(reason=reason).inc()


def count_refused(reason: str) -> None:
    _get()["refused"].labels(reason=reason).inc()


class PositionAcceptance:
    """Running conditional acceptance per draft position (1-based), published as a gauge.

    ``ratio[k] = #(rounds with >= k drafts accepted) / #(rounds that reached k)``
    where a round reaches position ``k`` when ``k - 1`` drafts were accepted and
    the round verified at least ``k`` drafts.
    """

    def __init__(self, block_size: int) -> None:
        self.reached = torch.zeros(block_size, dtype=torch.int64)
        self.accepted = torch.zeros(block_size, dtype=torch.int64)

    def update(self, accepted_drafts: torch.Tensor, verified_drafts: torch.Tensor) -> None:
        k = torch.arange(1, self.reached.numel() + 1)
        a = accepted_drafts.view(-1, 1).cpu().long()
        v = verified_drafts.view(-1, 1).cpu().long()
        self.reached += ((a >= k - 1) & (v >= k)).sum(0)
        self.accepted += (a >= k).sum(0)

    def ratios(self) -> torch.Tensor:
        return self.accepted.double() / self.reached.clamp(min=1).double()


def observe_round(
    accept_lens: torch.Tensor, verify_lens: torch.Tensor, position: PositionAcceptance
) -> None:
    """One decode step: ``accept_lens`` tokens emitted per request (incl. bonus),
    ``verify_lens`` tokens verified per request (incl. anchor)."""
    m = _get()
    m["rounds"].inc()
    emitted = accept_lens.detach().cpu().long()
    for x in emitted.tolist():
        m["accepted"].observe(x)
    position.update(emitted - 1, verify_lens.detach().cpu().long() - 1)
    for k, r in enumerate(position.ratios().tolist(), start=1):
        m["position"].labels(position=str(k)).set(r)
