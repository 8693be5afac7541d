"""Measurement core: probe grid, warm-up, repeats, median and spread, refinement.

Why this shape: a single timing is useless on a shared machine and a
coarse grid misses cliffs. Each probe is therefore the median of many timed
steps taken in *rounds* (every round visits all pending probes in a fresh
shuffled order, so slow drift and co-tenant bursts spread over all batch sizes
instead of biasing a few), and after the coarse grid the intervals whose excess
jump (``stairs.excess_jumps``) is significant are bisected until each cliff is
pinned to adjacent batch sizes or the refinement budget is spent.

Invariant: the returned probes are strictly increasing in ``batch_tokens``,
``steps_per_sec = 1 / median(step_time)``, and every probe carries at least
``rounds * repeats`` samples.
"""

from __future__ import annotations

import itertools
import math
import random
import statistics
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from dspark_sglang.profiling.backend import Backend
from dspark_sglang.profiling.stairs import excess_jumps, noise_bar

ProgressFn = Callable[[int, int], None]  # (probes measured so far, probes planned so far)


@dataclass(frozen=True)
class MeasureConfig:
    """How hard to measure each probe.

    ``warmup`` untimed steps after each ``prepare`` (allocator, caches, graph
    replay warm), then ``repeats`` timed steps, in each of ``rounds`` shuffled
    passes over the grid; ``seed`` fixes the shuffle.
    """

    warmup: int = 2
    repeats: int = 5
    rounds: int = 2
    seed: int = 0

    def __post_init__(self) -> None:
        if self.warmup < 0:
            raise ValueError(f"MeasureConfig.warmup must be >= 0, got {self.warmup}")
        if self.repeats < 1:
            raise ValueError(f"MeasureConfig.repeats must be >= 1, got {self.repeats}")
        if self.rounds < 1:
            raise ValueError(f"MeasureConfig.rounds must be >= 1, got {self.rounds}")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class GridSpec:
    """The probe grid: explicit ``points``, or every integer up to ``dense_until``
    then ``points_per_octave`` geometric points per doubling up to ``max_tokens``;
    plus adaptive refinement of up to ``max_refine_probes`` extra probes around
    intervals whose excess jump exceeds ``drop_threshold``.
    """

    max_tokens: int
    min_tokens: int = 1
    dense_until: int = 16
    points_per_octave: int = 4
    points: tuple[int, ...] | None = None
    refine: bool = True
    max_refine_probes: int = 24
    drop_threshold: float = 0.05
    noise_k: float = 1.0

    def __post_init__(self) -> None:
        if self.min_tokens < 1:
            raise ValueError(f"GridSpec.min_tokens must be >= 1, got {self.min_tokens}")
        if self.max_tokens < self.min_tokens:
            raise ValueError(
                f"GridSpec.max_tokens ({self.max_tokens}) must be >= min_tokens ({self.min_tokens})"
            )
        if self.points_per_octave < 1:
            raise ValueError(
                f"GridSpec.points_per_octave must be >= 1, got {self.points_per_octave}"
            )
        if self.max_refine_probes < 0:
            raise ValueError(
                f"GridSpec.max_refine_probes must be >= 0, got {self.max_refine_probes}"
            )
        if not self.drop_threshold > 0:
            raise ValueError(f"GridSpec.drop_threshold must be > 0, got {self.drop_threshold}")
        if self.points is not None:
            pts = list(self.points)
            if not pts:
                raise ValueError(
                    "GridSpec.points is empty: give at least one batch size in tokens "
                    "(or leave points unset for the default grid)"
                )
            if any(b1 <= b0 for b0, b1 in itertools.pairwise(pts)):
                raise ValueError(
                    f"GridSpec.points must be strictly increasing without duplicates, got {pts}"
                )
            if pts[0] < 1:
                raise ValueError(f"GridSpec.points must be >= 1 token, got {pts}")
            if pts[-1] > self.max_tokens:
                raise ValueError(f"GridSpec.points exceeds max_tokens={self.max_tokens}: {pts[-1]}")

    def initial_points(self) -> list[int]:
        if self.points is not None:
            return list(self.points)
        pts = set(range(self.min_tokens, min(self.dense_until, self.max_tokens) + 1))
        x = float(max(self.dense_until, self.min_tokens))
        factor = 2.0 ** (1.0 / self.points_per_octave)
        while x < self.max_tokens:
            x *= factor
            pts.add(min(self.max_tokens, round(x)))
        pts.add(self.max_tokens)
        return sorted(p for p in pts if self.min_tokens <= p <= self.max_tokens)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["points"] = list(self.points) if self.points is not None else None
        return d


@dataclass(frozen=True)
class Probe:
    """One measured batch size.

    ``spread`` is the relative IQR of the step times (how noisy the machine was);
    ``median_se`` the relative standard error of the median, from the MAD
    (robust to the co-tenant bursts that inflate the IQR), which is what decides
    whether a jump between two probes is real.
    """

    batch_tokens: int
    steps_per_sec: float
    median_step_s: float
    spread: float
    samples: int
    median_se: float = 0.0

    def __post_init__(self) -> None:
        if self.batch_tokens < 1:
            raise ValueError(f"Probe.batch_tokens must be >= 1, got {self.batch_tokens}")
        if not self.steps_per_sec > 0:
            raise ValueError(f"Probe.steps_per_sec must be > 0, got {self.steps_per_sec}")
        if self.samples < 1:
            raise ValueError(f"Probe.samples must be >= 1, got {self.samples}")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Probe:
        return cls(
            batch_tokens=int(d["batch_tokens"]),
            steps_per_sec=float(d["steps_per_sec"]),
            median_step_s=float(d["median_step_s"]),
            spread=float(d["spread"]),
            samples=int(d["samples"]),
            median_se=float(d.get("median_se", 0.0)),
        )


def summarize(batch_tokens: int, step_times: Sequence[float]) -> Probe:
    """Median, relative IQR and relative standard error of the median of one probe.

    ``median_se = 1.2533 * 1.4826 * MAD / (median * sqrt(n))``: the asymptotic
    standard error of a median under normal noise with the MAD as a robust sigma.
    """
    if not step_times:
        raise ValueError(f"no samples for batch_tokens={batch_tokens}")
    if any(not (t > 0) for t in step_times):
        raise ValueError(f"step times must be > 0 (clock too coarse?), got {list(step_times)}")
    med = statistics.median(step_times)
    if len(step_times) >= 2:
        q1, _, q3 = statistics.quantiles(step_times, n=4, method="inclusive")
    else:
        q1 = q3 = med
    mad = statistics.median(abs(t - med) for t in step_times)
    return Probe(
        batch_tokens=batch_tokens,
        steps_per_sec=1.0 / med,
        median_step_s=med,
        spread=(q3 - q1) / med,
        samples=len(step_times),
        median_se=1.2533 * 1.4826 * mad / (med * math.sqrt(len(step_times))),
    )


def refinement_points(probes: Sequence[Probe], grid: GridSpec) -> list[int]:
    """Midpoints of the intervals worth bisecting, most significant first."""
    if len(probes) < 2:
        return []
    b = [p.batch_tokens for p in probes]
    jumps = excess_jumps(b, [p.steps_per_sec for p in probes])
    ranked: list[tuple[float, int]] = []
    for i, jump in enumerate(jumps):
        bar = max(
            grid.drop_threshold,
            noise_bar(probes[i].median_se, probes[i + 1].median_se, grid.noise_k),
        )
        if jump > bar and b[i + 1] - b[i] > 1:
            ranked.append((jump, (b[i] + b[i + 1]) // 2))
    ranked.sort(key=lambda x: -x[0])
    return [m for _, m in ranked]


def _measure_points(
    backend: Backend,
    points: Sequence[int],
    cfg: MeasureConfig,
    samples: dict[int, list[float]],
    rng: random.Random,
    on_probe: Callable[[], None],
) -> None:
    for _ in range(cfg.rounds):
        order = list(points)
        rng.shuffle(order)
        for b in order:
            step = backend.prepare(b)
            for _ in range(cfg.warmup):
                step()
            times = samples.setdefault(b, [])
            for _ in range(cfg.repeats):
                t0 = backend.now()
                step()
                times.append(backend.now() - t0)
            del step
            on_probe()
    backend.release()


def measure_staircase(
    backend: Backend,
    grid: GridSpec,
    cfg: MeasureConfig,
    progress: ProgressFn | None = None,
) -> list[Probe]:
    """Measure the grid, then bisect significant jumps; returns sorted probes."""
    if grid.max_tokens > backend.max_batch_tokens:
        raise ValueError(
            f"grid max_tokens={grid.max_tokens} exceeds the backend's max_batch_tokens="
            f"{backend.max_batch_tokens}"
        )
    rng = random.Random(cfg.seed)
    samples: dict[int, list[float]] = {}
    points = grid.initial_points()
    planned = [len(points) * cfg.rounds]
    done = [0]

    def on_probe() -> None:
        done[0] += 1
        if progress is not None:
            progress(done[0], planned[0])

    _measure_points(backend, points, cfg, samples, rng, on_probe)
    refined = 0
    while grid.refine and refined < grid.max_refine_probes:
        probes = [summarize(b, samples[b]) for b in sorted(samples)]
        new = [m for m in refinement_points(probes, grid) if m not in samples]
        new = new[: grid.max_refine_probes - refined]
        if not new:
            break
        planned[0] += len(new) * cfg.rounds
        _measure_points(backend, new, cfg, samples, rng, on_probe)
        refined += len(new)
    return [summarize(b, samples[b]) for b in sorted(samples)]
