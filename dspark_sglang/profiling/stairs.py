"""Stair detection on a measured step-time curve.

Hardware does not slow down smoothly with batch size: step time jumps at tile
and CUDA-graph bucket boundaries. A stair is an interval whose step-time
increase is far larger than the neighbouring slope predicts.

Algorithm: with step times ``t_i = 1/SPS_i`` at probes ``b_i``, the per-token
slope of interval ``i`` is ``s_i = (t_{i+1} - t_i) / (b_{i+1} - b_i)``. The
*excess jump* of interval ``i`` is the increase not explained by the smaller
neighbouring slope, ``e_i = (t_{i+1} - t_i) - max(0, min(s_{i-1}, s_{i+1})) * gap_i``,
reported relative to ``t_{i+1}``. Invariant: a smooth (piecewise-linear) curve
has ``e_i ~ 0`` everywhere, a cliff of relative height ``h`` inside interval ``i``
gives ``e_i / t_{i+1} ~ h`` however wide the interval is, so bisecting the
intervals with large excess (``measure.py``) converges onto each cliff while
leaving smooth stretches alone.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class Stair:
    """One detected cliff between probes ``lo_tokens`` and ``hi_tokens``.

    ``resolved`` is true when the two probes are adjacent within the grid
    resolution, i.e. the cliff position is known exactly; ``drop`` is the
    relative excess step-time jump (0.2 = the step got 20 % slower than the
    local slope explains).
    """

    lo_tokens: int
    hi_tokens: int
    sps_before: float
    sps_after: float
    drop: float
    resolved: bool

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _check_curve(batch_tokens: Sequence[int], sps: Sequence[float]) -> None:
    if len(batch_tokens) == 0:
        raise ValueError("stair detection needs at least one probe, got an empty curve")
    if len(batch_tokens) != len(sps):
        raise ValueError(
            f"batch_tokens and steps_per_sec differ in length ({len(batch_tokens)} vs {len(sps)})"
        )
    if any(b < 1 for b in batch_tokens):
        raise ValueError(f"batch_tokens must all be >= 1, got {list(batch_tokens)}")
    if any(b1 <= b0 for b0, b1 in itertools.pairwise(batch_tokens)):
        raise ValueError(
            "batch_tokens must be strictly increasing (sort the probes and median "
            f"duplicates first), got {list(batch_tokens)}"
        )
    if any(not (s > 0) for s in sps):
        raise ValueError(f"steps_per_sec must all be > 0, got {list(sps)}")


def excess_jumps(batch_tokens: Sequence[int], sps: Sequence[float]) -> list[float]:
    """Relative excess step-time jump ``e_i / t_{i+1}`` of each adjacent interval."""
    _check_curve(batch_tokens, sps)
    t = [1.0 / s for s in sps]
    n = len(t) - 1
    slopes = [(t[i + 1] - t[i]) / (batch_tokens[i + 1] - batch_tokens[i]) for i in range(n)]
    out: list[float] = []
    for i in range(n):
        neighbours = [slopes[j] for j in (i - 1, i + 1) if 0 <= j < n]
        ref = max(0.0, min(neighbours)) if neighbours else 0.0
        gap = batch_tokens[i + 1] - batch_tokens[i]
        out.append(((t[i + 1] - t[i]) - ref * gap) / t[i + 1])
    return out


def noise_bar(se_a: float, se_b: float, noise_k: float) -> float:
    """Smallest excess jump that is ``3 * noise_k`` standard errors of the difference."""
    return 3.0 * noise_k * math.hypot(se_a, se_b)


def detect_stairs(
    batch_tokens: Sequence[int],
    sps: Sequence[float],
    noise: Sequence[float] | None = None,
    *,
    threshold: float = 0.05,
    noise_k: float = 1.0,
    resolution: int = 1,
) -> list[Stair]:
    """Intervals whose excess jump exceeds ``threshold`` and the measurement noise.

    ``noise`` (relative standard error of each probe's median step time) raises
    the bar to ``noise_k * 3 * hypot(noise_i, noise_{i+1})`` (a 3-sigma jump) where
    measurements are noisy, so noise is not reported as a cliff.
    """
    if not threshold > 0:
        raise ValueError(f"threshold must be > 0, got {threshold}")
    jumps = excess_jumps(batch_tokens, sps)
    if noise is not None and len(noise) != len(sps):
        raise ValueError(f"noise has {len(noise)} entries for {len(sps)} probes")
    stairs: list[Stair] = []
    for i, jump in enumerate(jumps):
        bar = threshold
        if noise is not None:
            bar = max(bar, noise_bar(noise[i], noise[i + 1], noise_k))
        if jump > bar:
            stairs.append(
                Stair(
                    lo_tokens=int(batch_tokens[i]),
                    hi_tokens=int(batch_tokens[i + 1]),
                    sps_before=float(sps[i]),
                    sps_after=float(sps[i + 1]),
                    drop=float(jump),
                    resolved=batch_tokens[i + 1] - batch_tokens[i] <= resolution,
                )
            )
    return stairs
