"""A round's cost priced from the rounds a worker ran, on top of a cost table.

A cost table prices the target's forward from probes: extend batches the profiler
builds, not the verify a speculative worker runs, and not the rest of its round (the
draft pass, the accept and KV bookkeeping). Where timing on the host costs no
synchronisation (a CPU worker) the worker times each decode round and, inside it, the
target's verify, and records them (:class:`RoundTimings`) under the round's shape:
``n`` requests verifying ``m`` tokens in all. :class:`RoundCosts` is an immutable
snapshot over a base table and answers the policies' ``steps_per_sec(n, m)`` as
``verify(n, m) + rest(n)``:

* ``verify``: a shape is *measured* once it has :data:`MIN_SAMPLES` recent timings
  (within the last :data:`HORIZON` rounds, at most :data:`WINDOW` of them, after its
  first :data:`WARMUP` ones: a new shape's first forwards build its kernels); its value
  is their median. At each request count ``n`` with measured shapes the verify is
  ``c_n + s_n * (base(n, m) - base(n, n))``: the table's own rise with ``m``, scaled by
  ``s_n >= 0``, and a level ``c_n``, fitted by weighted least squares to the measured
  shapes (weights: their samples) with a prior that pulls ``s_n`` to 1 with the weight
  of :data:`PRIOR_SAMPLES` samples at each end of the measured range. So one measured shape
  sets the level and keeps the table's slope; several measure the slope too (0 where
  the verify costs the same whatever its length), and one
  noisy shape moves the slope only as much as its samples weigh. At a request count
  with none, the base table is shifted by the gap of the nearest measured request count
  ``n'`` (the smaller on a tie): its level ``c_n'`` minus the table at ``n'`` tokens. With
  nothing measured it is the base table.
* ``rest``: the median of round minus verify over the recent rounds of ``n`` requests
  (the nearest measured count's where ``n`` has none; 0 before any). It depends on the
  batch, not on the verify length the policy chooses, so it sets the level the policy
  weighs a longer verify against.

Why the two are kept apart: the rest of a round grows with the tokens a round accepts
(which the policy does not choose), and the machine's speed drifts; a shape priced
from whole rounds would carry both into the choice of verify length. Why recent only:
a shape the policy stopped choosing would otherwise keep a price from another time
forever; once its timings age out it is priced from the table again, and tried again
if that makes it worth it.

Invariant: non-anticipating. A snapshot holds only rounds that are over, so the
lengths decided for a round never depend on that round's drafts or timing; the
verification stays lossless whatever the prices are.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from dspark_sglang.scheduling.cost_table import (
    CostTable,
    SpsAdditiveCostTable,
    SpsCostTable,
    _check_batch_tokens,
)

__all__ = [
    "HORIZON",
    "MIN_SAMPLES",
    "PRIOR_SAMPLES",
    "WARMUP",
    "WINDOW",
    "RoundCosts",
    "RoundTimings",
    "fit_level_and_slope",
]

MIN_SAMPLES = 3
"""Timings a shape needs before its median prices it (one slow round cannot)."""
WINDOW = 16
"""Latest timings per shape (or per request count, for the rest) a median is taken over."""
HORIZON = 128
"""Rounds after which a timing no longer counts (the machine's speed drifts)."""
WARMUP = 2
"""First timings of each shape left out: its first forwards build its kernels."""
PRIOR_SAMPLES = 1.0
"""Weight, in samples at each end of the measured range, of the prior that the verify
rises with its length as the table's step time does."""

_F64 = torch.float64


def fit_level_and_slope(
    rise: Iterable[float], seconds: Iterable[float], weights: Iterable[float]
) -> tuple[float, float]:
    """``(c, s)`` minimising ``sum w (y - c - s x)^2 + P (s - 1)^2`` subject to ``s >= 0``.

    ``x`` is the table's rise over the smallest verify (``rise``), ``y`` the measured
    seconds, ``w`` their samples. The prior that the slope is the table's,
    ``P = PRIOR_SAMPLES * (max(x) - min(x))^2 / 2``, weighs as much as ``PRIOR_SAMPLES``
    samples at each end of the measured range lying on a line of slope 1. One rise
    measured (nothing to fit a slope to): ``s = 1``.
    """
    xs, ys, ws = (list(map(float, v)) for v in (rise, seconds, weights))
    if not (len(xs) == len(ys) == len(ws) > 0):
        raise ValueError("fit_level_and_slope: give one rise, seconds and weight per shape")
    if not all(math.isfinite(v) for v in (*xs, *ys, *ws)) or min(ws) <= 0 or min(xs) < 0:
        raise ValueError(
            f"fit_level_and_slope: values must be finite, weights > 0 and rises >= 0; got "
            f"{xs}, {ys}, {ws}"
        )
    w = sum(ws)
    sx = sum(wi * x for wi, x in zip(ws, xs, strict=True))
    sy = sum(wi * y for wi, y in zip(ws, ys, strict=True))
    sxx = sum(wi * x * x for wi, x in zip(ws, xs, strict=True))
    sxy = sum(wi * x * y for wi, x, y in zip(ws, xs, ys, strict=True))
    prior = PRIOR_SAMPLES * (max(xs) - min(xs)) ** 2 / 2.0
    det = w * (sxx + prior) - sx * sx
    slope = 1.0 if prior == 0.0 or det <= 0.0 else (w * (sxy + prior) - sx * sy) / det
    slope = max(slope, 0.0)
    return (sy - slope * sx) / w, slope


@dataclass(frozen=True)
class RoundCosts:
    """Step seconds per round shape: ``verify(n, m) + rest(n)`` over ``base`` (module doc).

    Fields:
        base: the cost table the worker started with (loaded or profiled at start-up).
        verify: ``(requests, tokens) -> (median seconds, samples)`` of the target's verify
            at measured shapes, each with ``1 <= requests <= tokens`` and at least
            :data:`MIN_SAMPLES` samples.
        rest: ``requests -> (median seconds, samples)`` of the round minus its verify,
            each >= 0 with at least :data:`MIN_SAMPLES` samples.
    """

    base: CostTable
    verify: Mapping[tuple[int, int], tuple[float, int]] = field(default_factory=dict)
    rest: Mapping[int, tuple[float, int]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.base, SpsCostTable | SpsAdditiveCostTable):
            raise TypeError(
                f"RoundCosts.base must be an SpsCostTable or SpsAdditiveCostTable, got "
                f"{type(self.base).__name__}"
            )
        for (n, m), (s, k) in self.verify.items():
            if not (1 <= n <= m) or not (math.isfinite(s) and s > 0) or k < MIN_SAMPLES:
                raise ValueError(
                    f"RoundCosts.verify[{(n, m)}] = {(s, k)}: a shape needs 1 <= requests <= "
                    f"tokens, finite seconds > 0 and >= {MIN_SAMPLES} samples"
                )
        for n, (s, k) in self.rest.items():
            if n < 1 or not (math.isfinite(s) and s >= 0) or k < MIN_SAMPLES:
                raise ValueError(
                    f"RoundCosts.rest[{n}] = {(s, k)}: needs requests >= 1, finite seconds "
                    f">= 0 and >= {MIN_SAMPLES} samples"
                )
        by_n: dict[int, list[tuple[int, float, float]]] = {}
        for (n, m), (s, k) in sorted(self.verify.items()):
            by_n.setdefault(n, []).append((m, s, float(k)))
        # The table at n tokens, per measured n: what ``_rise`` measures from. A one-element
        # CPU float64 tensor computed here, so a lookup does not recompute it.
        at_n = {n: self._base_seconds(n, torch.tensor([n])) for n in by_n}
        object.__setattr__(self, "_base_at_n", at_n)
        fitted = {}
        for n, shapes in by_n.items():
            rise = self._rise(n, torch.tensor([m for m, _, _ in shapes]))
            fitted[n] = fit_level_and_slope(
                rise.tolist(), [s for _, s, _ in shapes], [k for _, _, k in shapes]
            )
        object.__setattr__(self, "_fitted", fitted)
        # Level minus the table at n tokens, per measured n: the shift an unmeasured request
        # count borrows. Host floats computed here, so a lookup reads nothing back.
        gaps = {n: level - float(at_n[n][0]) for n, (level, _) in fitted.items()}
        object.__setattr__(self, "_gaps", gaps)

    @property
    def max_batch_tokens(self) -> int | None:
        """The base table's engine limit (a staircase's ``max_batch_tokens``), if any."""
        return getattr(self.base, "max_batch_tokens", None)

    def _base_seconds(self, n: int, tokens: torch.Tensor) -> torch.Tensor:
        return 1.0 / self.base.steps_per_sec(n, tokens).to(_F64)

    def _rise(self, n: int, tokens: torch.Tensor) -> torch.Tensor:
        """The table's step time at ``tokens`` over its time at ``n`` tokens (``>= 0``).

        ``n`` is a measured request count (``_base_at_n``, precomputed at construction).
        """
        t = self._base_seconds(n, tokens.to(torch.int64))
        base_at_n: dict[int, torch.Tensor] = self._base_at_n  # type: ignore[attr-defined]
        return (t - base_at_n[n]).clamp(min=0.0)

    @staticmethod
    def _nearest(counts: Iterable[int], n: int) -> int:
        return min(counts, key=lambda c: (abs(c - n), c))

    def verify_seconds(self, num_reqs: int, batch_tokens: torch.Tensor) -> torch.Tensor:
        """Predicted seconds of the target's verify at each total (float64).

        ``batch_tokens`` must be on the CPU (the only device rounds are timed on); the
        lookup is tensor arithmetic on host floats fixed at construction: no read-back.
        """
        bt = _check_batch_tokens(num_reqs, batch_tokens)
        if bt.device.type != "cpu":
            raise ValueError(
                f"RoundCosts prices rounds timed on a CPU worker: batch_tokens must be on the "
                f"CPU, got {bt.device}"
            )
        fitted: dict[int, tuple[float, float]] = self._fitted  # type: ignore[attr-defined]
        if num_reqs in fitted:
            level, slope = fitted[num_reqs]
            return level + slope * self._rise(num_reqs, bt)
        base = self._base_seconds(num_reqs, bt)
        if not fitted:
            return base
        gaps: dict[int, float] = self._gaps  # type: ignore[attr-defined]
        return base + gaps[self._nearest(fitted, num_reqs)]

    def rest_seconds(self, num_reqs: int) -> float:
        """Predicted seconds of the round besides its verify at ``num_reqs`` requests."""
        if not self.rest:
            return 0.0
        return self.rest[self._nearest(self.rest, num_reqs)][0]

    def step_seconds(self, num_reqs: int, batch_tokens: torch.Tensor) -> torch.Tensor:
        """Predicted seconds of a round of ``num_reqs`` requests at each total (float64)."""
        return self.verify_seconds(num_reqs, batch_tokens) + self.rest_seconds(num_reqs)

    def steps_per_sec(self, num_reqs: int, batch_tokens: torch.Tensor) -> torch.Tensor:
        """``1 / step_seconds`` (the ``CostModel`` protocol; CPU tensors)."""
        return 1.0 / self.step_seconds(num_reqs, batch_tokens)


@dataclass
class RoundTimings:
    """The worker's round timings, kept to build :class:`RoundCosts` snapshots.

    ``add`` records one round (its verify under its shape, after the shape's first
    :data:`WARMUP`, the rest under its request count); a timing counts for ``horizon``
    rounds and per key only the latest ``window`` are kept. ``ready`` says whether a
    snapshot would price something the last one did not: a key reached
    :data:`MIN_SAMPLES` recent timings, or ``refresh`` rounds were added since the
    last snapshot.
    """

    window: int = WINDOW
    refresh: int = WINDOW
    horizon: int = HORIZON
    verify: dict[tuple[int, int], deque[tuple[int, float]]] = field(default_factory=dict)
    rest: dict[int, deque[tuple[int, float]]] = field(default_factory=dict)
    rounds: int = 0
    #: Timings left out per shape so far (up to :data:`WARMUP`).
    _seen: dict[tuple[int, int], int] = field(default_factory=dict)
    _since_snapshot: int = 0
    _new_key: bool = False

    def add(self, num_reqs: int, tokens: int, round_seconds: float, verify_seconds: float) -> None:
        if not (1 <= num_reqs <= tokens):
            raise ValueError(f"a round has >= 1 request and a token each, got {num_reqs}, {tokens}")
        if not (math.isfinite(verify_seconds) and 0 < verify_seconds <= round_seconds):
            raise ValueError(
                f"a round's verify seconds must be finite, > 0 and <= the round's; got "
                f"{verify_seconds} of {round_seconds}"
            )
        self.rounds += 1
        self._since_snapshot += 1
        for store, key, value in (
            (self.verify, (num_reqs, tokens), verify_seconds),
            (self.rest, num_reqs, round_seconds - verify_seconds),
        ):
            if store is self.verify and self._seen.get(key, 0) < WARMUP:
                self._seen[key] = self._seen.get(key, 0) + 1  # type: ignore[index]
                continue
            times = store.setdefault(key, deque(maxlen=self.window))  # type: ignore[attr-defined]
            before = len(self._recent(times))
            times.append((self.rounds, float(value)))
            if before < MIN_SAMPLES <= len(self._recent(times)):  # newly measured
                self._new_key = True

    def _recent(self, times: deque[tuple[int, float]]) -> list[float]:
        return [s for r, s in times if r > self.rounds - self.horizon]

    @property
    def ready(self) -> bool:
        return self._new_key or self._since_snapshot >= self.refresh

    def _medians(
        self, store: Mapping[Any, deque[tuple[int, float]]]
    ) -> dict[Any, tuple[float, int]]:
        out = {}
        for key, times in store.items():
            recent = self._recent(times)
            if len(recent) >= MIN_SAMPLES:
                out[key] = (statistics.median(recent), len(recent))
        return out

    def snapshot(self, base: CostTable) -> RoundCosts:
        """The recent timings now, over ``base``; resets :attr:`ready`."""
        self._new_key = False
        self._since_snapshot = 0
        return RoundCosts(base, self._medians(self.verify), self._medians(self.rest))
