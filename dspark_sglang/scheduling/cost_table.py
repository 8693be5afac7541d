"""Profiled hardware cost tables, byte-compatible with SGLang 0.5.23's JSON.

The scheduler trades expected accepted tokens against engine speed, so it needs
``SPS(b)``: engine steps per second at a forward batch of ``b`` tokens. GPUs step
down at tile and CUDA-graph bucket boundaries, so the table is a *staircase*
sampled at probe sizes, not a smooth curve. SGLang 0.5.23 reads two formats and
the profiler, the SGLang worker and our own policies must agree on them bit for
bit, hence the same field names and the same msgspec encoding here:

``SpsCostTable`` (``sample_batch_tokens``, ``sample_steps_per_sec``, ``max_batch_tokens``)
    Floor lookup: ``SPS(b)`` is the rate of the largest probe ``<= b``; below the
    first probe the first probe's rate is used (clamped), above the last probe
    the last one's. Invariant: probes strictly increasing, rates finite and > 0.

``SpsAdditiveCostTable`` (``bias_seconds``, ``bs_probes``, ``alpha_seconds``,
``m_probes``, ``theta_seconds``)
    ``step_time = bias + interp(alpha, num_reqs) + interp(theta, batch_tokens)``
    with piecewise-linear interpolation clamped to the end probes (SGLang writes
    the second argument as ``num_reqs + budget``: the same number, since the
    budget counts draft tokens on top of one anchor per request), and
    ``SPS = 1 / step_time``.

Validation is stricter than SGLang's (which accepts e.g. NaN rates, zero
probes, or unknown keys) because a bad table silently mis-schedules every step:
each error names the field and says how to fix it. Finite but absurd values are
refused too, by the bounds ``MAX_BATCH_TOKENS``, ``MAX_STEPS_PER_SEC`` and
``MAX_STEP_SECONDS`` (far beyond any engine, so only unit slips and corrupt
tables hit them).

Both classes offer ``steps_per_sec(num_reqs, batch_tokens)``, the vectorised
lookup the scheduling policies use (see ``CostModel``). ``with_fixed_step_cost``
adds a fixed time to every step of a table (e.g. the draft pass of a speculative
step, which the target's profile does not contain). ``additive_from_probes`` builds
an additive table whose step time is linear between probes, for engines whose cost
has no graph buckets (CPU).

This module holds ``CostModel``; the bounds, the error type and field validation are
in ``cost_table_fields``, the two formats and their JSON I/O in
``cost_table_formats``, the builders in ``cost_table_builders``. Every public name
is importable from here too.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch

from dspark_sglang.scheduling.cost_table_builders import (
    additive_from_probes,
    from_probes,
    with_fixed_step_cost,
)
from dspark_sglang.scheduling.cost_table_fields import (
    MAX_BATCH_TOKENS,
    MAX_STEP_SECONDS,
    MAX_STEPS_PER_SEC,
    CostTableError,
)
from dspark_sglang.scheduling.cost_table_fields import (
    _check_batch_tokens as _check_batch_tokens,
)
from dspark_sglang.scheduling.cost_table_formats import (
    CostTable,
    SpsAdditiveCostTable,
    SpsCostTable,
    load_cost_table,
    parse_cost_table,
)
from dspark_sglang.scheduling.cost_table_formats import _interp_clamped as _interp_clamped

__all__ = [
    "MAX_BATCH_TOKENS",
    "MAX_STEPS_PER_SEC",
    "MAX_STEP_SECONDS",
    "CostModel",
    "CostTable",
    "CostTableError",
    "SpsAdditiveCostTable",
    "SpsCostTable",
    "additive_from_probes",
    "from_probes",
    "load_cost_table",
    "parse_cost_table",
    "with_fixed_step_cost",
]


@runtime_checkable
class CostModel(Protocol):
    """What a scheduling policy needs from a cost table."""

    def steps_per_sec(self, num_reqs: int, batch_tokens: torch.Tensor) -> torch.Tensor:
        """Engine steps/s for ``num_reqs`` requests at each total of ``batch_tokens``."""
        ...
