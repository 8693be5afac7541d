"""Field checks for the drafter and target configs: int, float, bool and choice.

Each returns the checked value and raises ``ValueError`` naming ``owner.field`` and
the fix, so a wrong config field fails at construction rather than in training.
"""

from __future__ import annotations

import math
from typing import Any, get_args


def _check_int(
    owner: str, name: str, value: object, lo: int | None = None, hi: int | None = None
) -> int:
    """An ``int`` (not a bool) in ``[lo, hi]``; the error names ``owner.name``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(
            f"{owner}.{name} must be an int, got {value!r} ({type(value).__name__}); "
            f"set {name} to an integer"
        )
    if lo is not None and value < lo:
        raise ValueError(f"{owner}.{name} must be >= {lo}, got {value}; set {name} >= {lo}")
    if hi is not None and value > hi:
        raise ValueError(
            f"{owner}.{name}={value} is out of range (at most {hi}, far above any real model): "
            f"the config is corrupt; set {name} <= {hi} to the drafter's real size"
        )
    return value


def _check_float(owner: str, name: str, value: object, *, positive: bool = True) -> float:
    """A finite real number (ints accepted), returned as ``float``."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(
            f"{owner}.{name} must be a number, got {value!r} ({type(value).__name__}); "
            f"set {name} to a float"
        )
    out = float(value)
    if not math.isfinite(out) or (positive and out <= 0.0):
        raise ValueError(f"{owner}.{name} must be a finite number > 0, got {value!r}")
    return out


def _check_bool(owner: str, name: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise ValueError(
            f"{owner}.{name} must be true or false, got {value!r}; set {name} to a bool"
        )
    return value


def _check_choice(owner: str, name: str, value: object, literal: Any) -> str:
    choices = get_args(literal)
    if value not in choices:
        raise ValueError(f"{owner}.{name} must be one of {choices}, got {value!r}")
    return str(value)
