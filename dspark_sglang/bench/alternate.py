"""Time two or more functions side by side: A B A B ..., so machine drift hits each alike.

``alternate`` calls every function once untimed (warm-up), then for each of ``repeats``
rounds times ``iters`` calls of each function in turn. A round's figure is its mean time
per call (times ``scale``: 1 for seconds, 1e3 for milliseconds), stored under ``key``
with the median, minimum and maximum over rounds. Read ratios of medians taken in one
run; the absolute figures move with a shared machine's load.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping
from typing import Any


def alternate(
    fns: Mapping[str, Callable[[], Any]],
    repeats: int,
    iters: int,
    *,
    scale: float = 1.0,
    key: str = "seconds",
) -> dict[str, dict[str, Any]]:
    """Per function name: ``{key: [per-round time per call], "median", "min", "max"}``."""
    if repeats < 1 or iters < 1:
        raise ValueError(f"repeats and iters must be >= 1 (got {repeats}, {iters})")
    for fn in fns.values():
        fn()
    rounds: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            for _ in range(iters):
                fn()
            rounds[name].append((time.perf_counter() - t0) / iters * scale)
    return {
        name: {key: r, "median": statistics.median(r), "min": min(r), "max": max(r)}
        for name, r in rounds.items()
    }
