"""Turn measured probes into table entries that SGLang's floor lookup reads faithfully.

Why: SGLang's ``SpsCostTable.lookup(b)`` returns the rate of the largest entry
``<= b``, so each entry stands for every batch size up to the next one. The
profiler probes densely only around cliffs (``stairs.py`` leaves smooth
stretches alone, as it should), and on a smooth stretch a sparse entry then
claims that the next sizes run at its rate: a plateau of free tokens the
hardware does not have. The prefix scheduler fills such plateaus with drafts of
any survival (a 32-token batch probed at 32 and 38 gets 5 "free" tokens), which
is what made the CPU budget curve rise at high load.

Algorithm: the profiler's model of the curve is piecewise linear in step time
``t = 1/SPS`` between adjacent probes, except across a detected stair (a cliff
at an unknown point inside the interval, or between adjacent sizes). Inside
every other interval ``(b0, b1)``, walk from ``b0`` and add the furthest size
``x'`` whose interpolated step time is at most ``(1 + tolerance)`` times that of
the current entry ``x`` (or ``x + 1`` when a single token already costs more).

Invariant: every measured probe is an entry with its measured rate, and for
every size ``b`` outside stair intervals the floor lookup under-states the
interpolated step time at ``b`` by at most ``tolerance`` (relative). Stair
intervals keep the flat-then-cliff shape SGLang reads. ``tolerance = 0`` adds
nothing: the probes alone, as tables were written before this module.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

DEFAULT_FLOOR_TOLERANCE = 0.02  # below the probes' typical spread (2-5 %)


@dataclass(frozen=True)
class FloorTable:
    """Table entries plus which of them are interpolated rather than measured."""

    batch_tokens: tuple[int, ...]
    steps_per_sec: tuple[float, ...]
    interpolated: tuple[int, ...]
    tolerance: float


def _interp_step_time(b0: int, t0: float, b1: int, t1: float, x: int) -> float:
    return t0 + (t1 - t0) * (x - b0) / (b1 - b0)


def _fill_interval(b0: int, t0: float, b1: int, t1: float, tolerance: float) -> list[int]:
    """Sizes strictly inside ``(b0, b1)`` that keep each floor step within ``tolerance``."""
    if t1 <= t0 * (1.0 + tolerance) or b1 - b0 <= 1:
        return []
    slope = (t1 - t0) / (b1 - b0)
    out: list[int] = []
    x = b0
    while True:
        tx = _interp_step_time(b0, t0, b1, t1, x)
        # Furthest size whose step time stays within (1 + tolerance) * t(x).
        reach = x + math.floor(tx * tolerance / slope + 1e-9)
        nxt = max(x + 1, reach)
        if nxt >= b1:
            return out
        out.append(nxt)
        x = nxt


def floor_table(
    batch_tokens: Sequence[int],
    steps_per_sec: Sequence[float],
    stair_intervals: Iterable[tuple[int, int]] = (),
    tolerance: float = 0.02,
) -> FloorTable:
    """Entries for an ``SpsCostTable`` built from strictly increasing probes (see module doc)."""
    if not (isinstance(tolerance, int | float) and math.isfinite(tolerance) and tolerance >= 0):
        raise ValueError(
            f"floor tolerance must be a finite number >= 0 (0 = probes only), got {tolerance!r}"
        )
    if len(batch_tokens) != len(steps_per_sec) or not batch_tokens:
        raise ValueError(
            f"need matching non-empty probes, got {len(batch_tokens)} sizes and "
            f"{len(steps_per_sec)} rates"
        )
    if any(b1 <= b0 for b0, b1 in itertools.pairwise(batch_tokens)):
        raise ValueError(f"probe sizes must be strictly increasing, got {list(batch_tokens)}")
    if any(not (s > 0 and math.isfinite(s)) for s in steps_per_sec):
        raise ValueError(f"probe rates must be finite and > 0, got {list(steps_per_sec)}")
    stairs = {(int(lo), int(hi)) for lo, hi in stair_intervals}
    sizes: list[int] = [int(batch_tokens[0])]
    rates: list[float] = [float(steps_per_sec[0])]
    added: list[int] = []
    for i in range(len(batch_tokens) - 1):
        b0, b1 = int(batch_tokens[i]), int(batch_tokens[i + 1])
        t0, t1 = 1.0 / steps_per_sec[i], 1.0 / steps_per_sec[i + 1]
        if tolerance > 0 and (b0, b1) not in stairs:
            for x in _fill_interval(b0, t0, b1, t1, tolerance):
                sizes.append(x)
                rates.append(1.0 / _interp_step_time(b0, t0, b1, t1, x))
                added.append(x)
        sizes.append(b1)
        rates.append(float(steps_per_sec[i + 1]))
    return FloorTable(tuple(sizes), tuple(rates), tuple(added), float(tolerance))
