"""Building cost tables: from measured probes, and with a fixed time added per step.

``from_probes`` assembles a staircase table from ``(batch_tokens, steps_per_sec)``
measurements, ``additive_from_probes`` an additive table whose step time is linear
between them (engines without CUDA-graph buckets, e.g. CPU), and
``with_fixed_step_cost`` adds a fixed time to every step of either kind (e.g. the
draft pass of a speculative step, which the target's profile does not contain).
"""

from __future__ import annotations

import itertools
import math
import numbers
from collections.abc import Sequence
from typing import Any

import msgspec

from dspark_sglang.scheduling.cost_table_fields import MAX_STEP_SECONDS, CostTableError
from dspark_sglang.scheduling.cost_table_formats import (
    CostTable,
    SpsAdditiveCostTable,
    SpsCostTable,
)

__all__ = [
    "additive_from_probes",
    "from_probes",
    "with_fixed_step_cost",
]


def from_probes(
    probes: Sequence[tuple[int, float]], max_batch_tokens: int | None = None
) -> SpsCostTable:
    """Assemble a staircase table from ``(batch_tokens, steps_per_sec)`` measurements.

    Probes may come in any order; they are sorted by batch size. Repeated sizes
    are an error (median them first); ``max_batch_tokens`` defaults to the
    largest probe.
    """
    ordered = _check_probes("from_probes", probes, "batch_tokens")
    return SpsCostTable(
        sample_batch_tokens=tuple(p[0] for p in ordered),
        sample_steps_per_sec=tuple(p[1] for p in ordered),
        max_batch_tokens=ordered[-1][0] if max_batch_tokens is None else max_batch_tokens,
    )


def _check_probes(who: str, probes: Sequence[tuple[int, float]], what: str) -> list[Any]:
    """``probes`` sorted by their first item, after checking each is a pair."""
    if len(probes) == 0:
        raise CostTableError(f"{who}: no probes given; measure at least one {what}")
    for i, p in enumerate(probes):
        if not isinstance(p, Sequence) or isinstance(p, str | bytes) or len(p) != 2:
            raise CostTableError(f"{who}: probe {i} must be a ({what}, value) pair, got {p!r}")
    return sorted(probes, key=lambda p: p[0])


def additive_from_probes(probes: Sequence[tuple[int, float]]) -> SpsAdditiveCostTable:
    """An additive table whose step time is linear in tokens between the probes.

    ``probes`` are ``(batch_tokens, steps_per_sec)`` pairs, any order, step times
    non-decreasing in tokens (``startup_profile.non_increasing`` makes them so). For an
    engine without CUDA graphs a forward costs what its rows cost, not what a captured
    bucket costs, so a floor lookup (``SpsCostTable``) would price every token up to
    the next probe at the smaller probe's rate and the token that reaches a probe with
    the whole step between the two. Here ``bias_seconds`` is the smallest probe's step
    time, ``theta_seconds`` each probe's step time minus it, and the request term is
    zero (``bs_probes = (1,)``, ``alpha_seconds = (0.0,)``). The step time at every probe is its
    measured one (up to float64 rounding), linear between probes, the last one's
    beyond.
    """
    ordered = _check_probes("additive_from_probes", probes, "batch_tokens")
    seconds = [1.0 / float(sps) for _, sps in ordered]
    if any(later < earlier for earlier, later in itertools.pairwise(seconds)):
        raise CostTableError(
            "additive_from_probes: step times must not decrease with batch tokens, got "
            f"{[(p[0], t) for p, t in zip(ordered, seconds, strict=True)]}; pool the probes "
            "first (startup_profile.non_increasing)"
        )
    return SpsAdditiveCostTable(
        bias_seconds=seconds[0],
        bs_probes=(1,),
        alpha_seconds=(0.0,),
        m_probes=tuple(p[0] for p in ordered),
        theta_seconds=tuple(t - seconds[0] for t in seconds),
    )


def with_fixed_step_cost(table: CostTable, seconds: float) -> CostTable:
    """``table`` with ``seconds`` added to the step time at every batch size.

    For a speculative step the target's profile holds only the verify forward; the
    draft pass runs on top of it every step, so a policy that trades accepted tokens
    against step time must see ``1 / SPS(b) + seconds``. Returns a table of the same
    type (same JSON format, same other fields, e.g. ``max_batch_tokens``):

    ``SpsAdditiveCostTable``
        ``bias_seconds + seconds``. Exact up to float64 rounding: the lookup sums
        ``(bias + seconds) + alpha + theta`` where the formula reads
        ``(bias + alpha + theta) + seconds``, so the two step times (and ``SPS``)
        differ by at most 8 ulps relative (``2**-50``).
    ``SpsCostTable``
        each rate ``s -> 1 / (1 / s + seconds)``. Exact, bit for bit: the floor
        lookup returns the sampled rate of the largest probe ``<= b`` (clamped at
        both ends) and the transform is applied to exactly that value, so at every
        batch size the new table gives ``1 / (1 / SPS(b) + seconds)`` computed in
        float64 from the old ``SPS(b)``.

    ``seconds == 0`` returns ``table`` itself. ``seconds`` must be a finite number in
    ``[0, MAX_STEP_SECONDS]``; a result the table's own validation refuses (e.g. an
    additive ``bias_seconds`` above ``MAX_STEP_SECONDS``) raises ``CostTableError``.
    """
    if isinstance(seconds, bool) or not isinstance(seconds, numbers.Real):
        raise CostTableError(
            f"with_fixed_step_cost: seconds must be a number (seconds per step), got "
            f"{seconds!r} ({type(seconds).__name__})"
        )
    d = float(seconds)
    if not (math.isfinite(d) and 0.0 <= d <= MAX_STEP_SECONDS):
        raise CostTableError(
            f"with_fixed_step_cost: seconds = {d!r} must be finite and in [0, "
            f"{MAX_STEP_SECONDS:g}] (MAX_STEP_SECONDS); give the extra time of one step "
            "in seconds, 0 for none"
        )
    if isinstance(table, SpsAdditiveCostTable):
        if d == 0.0:
            return table
        fields = msgspec.structs.asdict(table)
        fields["bias_seconds"] = table.bias_seconds + d
        return SpsAdditiveCostTable(**fields)
    if isinstance(table, SpsCostTable):
        if d == 0.0:
            return table
        fields = msgspec.structs.asdict(table)
        fields["sample_steps_per_sec"] = tuple(
            1.0 / (1.0 / s + d) for s in table.sample_steps_per_sec
        )
        return SpsCostTable(**fields)
    raise TypeError(
        "with_fixed_step_cost needs an SpsCostTable or SpsAdditiveCostTable, got "
        f"{type(table).__name__}"
    )
