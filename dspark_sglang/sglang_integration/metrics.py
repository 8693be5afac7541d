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
            draft_steps=Counter(
                "dspark_draft_request_steps",  # exposed as dspark_draft_request_steps_total
                "Request-steps by whether the step ran the draft pass (draft_decision: priced "
                "runs plain decode steps where drafting does not pay)",
                ["drafted"],
            ),
            refused=Counter(
                "dspark_requests_refused",  # exposed as dspark_requests_refused_total
                "Requests refused with HTTP 400 before scheduling (sglang_integration.requests)",
                ["reason"],
            ),
            round_shapes=Gauge(
                "dspark_round_cost_shapes",
                "Round shapes (requests x verify tokens) the scheduling policy prices from "
                "this worker's timed rounds (CPU workers); 0: from the cost table alone",
                multiprocess_mode="max",
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
        for drafted in ("true", "false"):
            _metrics["draft_steps"].labels(drafted=drafted)
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


def observe_decision_seconds(seconds: float) -> None:
    """Host wall time of one verify-length decision (no device read involved)."""
    _get()["decision"].observe(seconds)


def set_round_cost_shapes(shapes: int) -> None:
    """How many round shapes the policy now prices from timed rounds."""
    _get()["round_shapes"].set(shapes)


def count_fallback(reason: str, steps: int = 1) -> None:
    if steps:
        _get()["fallback"].labels(reason=reason).inc(steps)


def count_draft_request_steps(drafted: bool, requests: int) -> None:
    """``requests`` request-steps of one decode step that did (or did not) draft."""
    if requests:
        _get()["draft_steps"].labels(drafted="true" if drafted else "false").inc(requests)


def count_refused(reason: str) -> None:
    _get()["refused"].labels(reason=reason).inc()


def _observe_counts(histogram: Any, bucket_counts: list[int], total: float) -> None:
    """Add ``bucket_counts[i]`` observations to bucket ``i`` and ``total`` to the sum.

    Equivalent to ``sum(bucket_counts)`` ``observe`` calls whose values sum to
    ``total`` (``bucket_counts`` has one entry per upper bound, ``+Inf`` last), in
    O(buckets) instead of O(observations): it adds to the same value objects
    ``Histogram.observe`` adds to (``_sum``, ``_buckets``), in either prometheus mode.
    """
    if len(bucket_counts) != len(histogram._buckets):
        raise ValueError(
            f"bucket_counts has {len(bucket_counts)} entries, the histogram "
            f"{len(histogram._buckets)} buckets"
        )
    if not any(bucket_counts):
        return
    histogram._sum.inc(total)
    for bucket, n in zip(histogram._buckets, bucket_counts, strict=True):
        if n:
            bucket.inc(n)


def _bucket_index(value: float, bounds: tuple[float, ...]) -> int:
    """Index of the first upper bound ``>= value`` (``len(bounds)`` is ``+Inf``)."""
    for i, bound in enumerate(bounds):
        if value <= bound:
            return i
    return len(bounds)


class StepMetrics:
    """The per-step ``dspark_*`` values, accumulated on the device, flushed later.

    Why: reading accept lengths back every step is a host synchronisation (and
    cannot sit in a CUDA graph). Each decode step instead adds into one packed
    int64 device tensor with torch ops only; :meth:`snapshot` clones it (one
    kernel, no read), and :meth:`flush` turns a *host copy* of a snapshot into
    Prometheus increments: the difference to the last flushed snapshot. Snapshots
    are cumulative, so a skipped or late flush loses nothing, and one flushed out
    of order (older than the last) is ignored.

    Layout of the packed tensor (``B`` = block size):

    * ``rounds``: decode steps observed;
    * ``emitted[v]`` for ``v = 0..B+1``: requests x rounds that emitted ``v``
      tokens (accepted drafts + bonus). Every possible value has its own slot, so
      the flushed histogram sum is exact;
    * ``reached[k]``, ``accepted[k]`` for draft positions ``k = 1..B``
      (``dspark_position_acceptance_ratio = accepted / reached``, running);
    * ``budget[i]``: decisions whose total verify tokens fall in
      ``BUDGET_BUCKETS[i]`` (``+Inf`` last), and ``budget_sum`` (exact);
    * ``non_finite``: decode steps with at least one non-finite drafter row.

    Where the flush happens: ``DSparkMoeWorker`` hands each step's snapshot to
    SGLang as the batch result's auxiliary output, so SGLang's own asynchronous
    result copy brings it to the host with the accept lengths, and the scheduler
    calls :meth:`flush` when it processes that result (``MetricsFlush``). Tests and
    callers without a scheduler call :meth:`flush` with no argument (one read).
    """

    def __init__(self, block_size: int, device: torch.device | str = "cpu") -> None:
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        b = block_size
        self.block_size = b
        sizes = {
            "rounds": 1,
            "emitted": b + 2,
            "reached": b,
            "accepted": b,
            "budget": len(BUDGET_BUCKETS) + 1,
            "budget_sum": 1,
            "non_finite": 1,
        }
        self.packed = torch.zeros(sum(sizes.values()), dtype=torch.int64, device=device)
        self._slices: dict[str, slice] = {}
        at = 0
        for name, size in sizes.items():
            self._slices[name] = slice(at, at + size)
            at += size
        views = {name: self.packed[sl] for name, sl in self._slices.items()}
        self.rounds, self.emitted = views["rounds"], views["emitted"]
        self.reached, self.accepted = views["reached"], views["accepted"]
        self.budget, self.budget_sum = views["budget"], views["budget_sum"]
        self.non_finite = views["non_finite"]
        dev = self.packed.device
        self._k = torch.arange(1, b + 1, dtype=torch.int64, device=dev)
        self._budget_bounds = torch.tensor(
            [int(x) for x in BUDGET_BUCKETS], dtype=torch.int64, device=dev
        )
        self._flushed = torch.zeros_like(self.packed, device="cpu")

    # --- device side: torch ops only, no host read -------------------------------
    def observe_round(self, accept_lens: torch.Tensor, verify_lens: torch.Tensor) -> None:
        """One decode step: ``accept_lens`` tokens emitted per request (incl. bonus),
        ``verify_lens`` tokens verified per request (incl. anchor)."""
        emitted = accept_lens.detach().view(-1).to(self.packed.device, torch.int64)
        verified = verify_lens.detach().view(-1).to(self.packed.device, torch.int64)
        self.rounds.add_(1)
        top = self.emitted.numel() - 1
        self.emitted.scatter_add_(0, emitted.clamp(0, top), torch.ones_like(emitted))
        a = (emitted - 1).view(-1, 1)
        v = (verified - 1).view(-1, 1)
        self.reached.add_(((a >= self._k - 1) & (v >= self._k)).sum(0))
        self.accepted.add_((a >= self._k).sum(0))

    def observe_budget(self, verify_lens: torch.Tensor) -> None:
        """One decision: its total verify tokens (anchors + drafts) into the histogram."""
        total = verify_lens.detach().to(self.packed.device, torch.int64).sum().view(1)
        index = torch.searchsorted(self._budget_bounds, total)  # first bound >= total
        self.budget.scatter_add_(0, index, torch.ones_like(index))
        self.budget_sum.add_(total)

    def count_non_finite(self, any_row: torch.Tensor) -> None:
        """One step's "some drafter row was non-finite" flag (0-d bool/int tensor)."""
        self.non_finite.add_(any_row.to(self.packed.device, torch.int64).view(1))

    def snapshot(self) -> torch.Tensor:
        """A device copy of the cumulative counts (safe to read after later steps)."""
        return self.packed.clone()

    # --- host side ----------------------------------------------------------------
    def flush(self, host_snapshot: torch.Tensor | None = None) -> None:
        """Publish everything accumulated since the last flush (a host read if no
        ``host_snapshot`` is given: call it where a sync is acceptable)."""
        snap = (self.packed if host_snapshot is None else host_snapshot).cpu()
        sl = self._slices
        # Every entry only grows, so the elementwise max is the latest state; an
        # older snapshot (flushed after a newer one) adds nothing.
        latest = torch.maximum(snap, self._flushed)
        delta = (latest - self._flushed).tolist()
        if not any(delta):
            return
        self._flushed = latest
        m = _get()
        m["rounds"].inc(delta[sl["rounds"]][0])
        emitted = delta[sl["emitted"]]
        counts = [0] * (len(ACCEPTED_LENGTH_BUCKETS) + 1)
        for value, n in enumerate(emitted):
            counts[_bucket_index(value, ACCEPTED_LENGTH_BUCKETS)] += n
        _observe_counts(m["accepted"], counts, sum(v * n for v, n in enumerate(emitted)))
        _observe_counts(m["budget"], delta[sl["budget"]], delta[sl["budget_sum"]][0])
        count_fallback("non_finite", delta[sl["non_finite"]][0])
        reached = latest[sl["reached"]].tolist()
        accepted = latest[sl["accepted"]].tolist()
        for k, (r, a) in enumerate(zip(reached, accepted, strict=True), start=1):
            m["position"].labels(position=str(k)).set(a / max(r, 1))


class MetricsFlush:
    """SGLang auxiliary output carrying one :meth:`StepMetrics.snapshot`.

    ``copy_to_host`` runs inside SGLang's asynchronous copy of the step result
    (``GenerationBatchResult.copy_to_cpu``, which passes its own async copy), and
    ``consume`` after the scheduler waited for that copy (``process_batch_result_*``),
    so the flush adds no synchronisation of its own.
    """

    def __init__(self, metrics: StepMetrics, snapshot: torch.Tensor) -> None:
        self.metrics = metrics
        self.snapshot = snapshot

    def copy_to_host(self, copy_tensor: Any) -> MetricsFlush:
        return MetricsFlush(self.metrics, copy_tensor(self.snapshot))

    def consume(self, batch: Any, commits: Any) -> None:
        del batch, commits
        self.metrics.flush(self.snapshot)


def attach_flush(result: Any, step_metrics: StepMetrics) -> None:
    """Hand a decode step's cumulative snapshot to SGLang as an auxiliary output.

    SGLang copies it to the host with the step's accept lengths (the same asynchronous
    copy) and the scheduler's result processing calls its ``consume``, which publishes
    the Prometheus values (:class:`MetricsFlush`). A step whose result has no logits
    output carries none; the next one's cumulative snapshot covers it.
    """
    from sglang.srt.managers.auxiliary_output import append_auxiliary_output

    logits_output = getattr(result, "logits_output", None)
    if logits_output is None:
        return
    logits_output.auxiliary_device_output = append_auxiliary_output(
        logits_output.auxiliary_device_output,
        MetricsFlush(step_metrics, step_metrics.snapshot()),
    )
