"""Cost-table field checks: the sanity bounds, the error type, probe and value validation.

Shared by both SGLang table formats (``cost_table_formats``) and the builders
(``cost_table_builders``). Each error names the table, the field and the fix. The
bounds ``MAX_BATCH_TOKENS``, ``MAX_STEPS_PER_SEC`` and ``MAX_STEP_SECONDS`` lie far
beyond any engine, so only unit slips and corrupt tables hit them.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from typing import Any

import torch

__all__ = [
    "MAX_BATCH_TOKENS",
    "MAX_STEPS_PER_SEC",
    "MAX_STEP_SECONDS",
    "CostTableError",
]


# Upper bounds, far beyond any engine: a value above one is a unit slip or a corrupt table.
MAX_BATCH_TOKENS = 2**20  # tokens (or requests) in one forward batch; engines cap near 2**16
MAX_STEPS_PER_SEC = 1e6  # a step per microsecond: one kernel launch already takes longer
MAX_STEP_SECONDS = 3600.0  # a step of over an hour is a broken measurement


class CostTableError(ValueError):
    """A cost table (or the input used to build one) is malformed."""


def _int_probes(table: str, field: str, values: Any) -> tuple[int, ...]:
    """Probes as a tuple of ints: non-empty, each in 1..MAX_BATCH_TOKENS, strictly increasing."""
    if isinstance(values, str | bytes) or not isinstance(values, Sequence):
        raise CostTableError(
            f"{table}.{field} must be a list of integers, got {type(values).__name__}"
        )
    if len(values) == 0:
        raise CostTableError(
            f"{table}.{field} is empty: a cost table needs at least one probe; "
            "profile at least one batch size"
        )
    out: list[int] = []
    for i, v in enumerate(values):
        if isinstance(v, bool) or not isinstance(v, numbers.Integral):
            raise CostTableError(
                f"{table}.{field}[{i}] must be an integer, got {v!r} ({type(v).__name__})"
            )
        iv = int(v)
        if iv < 1:
            raise CostTableError(
                f"{table}.{field}[{i}] = {iv}: probes must be >= 1 (a forward batch "
                "holds at least one token/request)"
            )
        if iv > MAX_BATCH_TOKENS:
            raise CostTableError(
                f"{table}.{field}[{i}] = {iv} is above the bound {MAX_BATCH_TOKENS} "
                "(MAX_BATCH_TOKENS, far beyond any engine's batch): drop that probe or re-profile"
            )
        if out and iv == out[-1]:
            raise CostTableError(
                f"{table}.{field} has duplicate probe {iv} at index {i}: median the "
                "repeated measurements into one probe per size"
            )
        if out and iv < out[-1]:
            raise CostTableError(
                f"{table}.{field} is not sorted: {iv} at index {i} follows {out[-1]}; "
                "list probes in strictly increasing order"
            )
        out.append(iv)
    return tuple(out)


def _float_values(
    table: str,
    field: str,
    values: Any,
    *,
    n: int,
    probes_field: str,
    allow_zero: bool,
    hi: tuple[float, str],
) -> tuple[float, ...]:
    """Values as a tuple of finite floats, one per probe, > 0 (or >= 0), <= ``hi`` (bound, name)."""
    if isinstance(values, str | bytes) or not isinstance(values, Sequence):
        raise CostTableError(
            f"{table}.{field} must be a list of numbers, got {type(values).__name__}"
        )
    if len(values) != n:
        raise CostTableError(
            f"{table}.{field} has {len(values)} values but {probes_field} has {n} "
            "probes: give exactly one value per probe"
        )
    out: list[float] = []
    bound = ">= 0" if allow_zero else "> 0"
    for i, v in enumerate(values):
        if isinstance(v, bool) or not isinstance(v, numbers.Real):
            raise CostTableError(
                f"{table}.{field}[{i}] must be a number, got {v!r} ({type(v).__name__})"
            )
        fv = float(v)
        if not math.isfinite(fv) or fv < 0.0 or (fv == 0.0 and not allow_zero):
            raise CostTableError(
                f"{table}.{field}[{i}] = {fv!r}: must be finite and {bound}; "
                "re-measure that probe or drop it"
            )
        if fv > hi[0]:
            raise CostTableError(
                f"{table}.{field}[{i}] = {fv!r} is above the bound {hi[0]:g} ({hi[1]}, far "
                "beyond any engine): check the unit, re-measure that probe or drop it"
            )
        out.append(fv)
    return tuple(out)


def _check_batch_tokens(num_reqs: int, batch_tokens: torch.Tensor) -> torch.Tensor:
    if isinstance(num_reqs, bool) or not isinstance(num_reqs, numbers.Integral):
        raise TypeError(f"num_reqs must be an int, got {type(num_reqs).__name__}")
    if num_reqs < 0:
        raise ValueError(f"num_reqs must be >= 0, got {num_reqs}")
    bt = torch.as_tensor(batch_tokens)
    if bt.is_floating_point() or bt.is_complex() or bt.dtype == torch.bool:
        raise TypeError(f"batch_tokens must be an integer tensor, got dtype {bt.dtype}")
    return bt.to(torch.int64)
