"""Field checks shared by the training config's sections, and the compute precisions.

Each check raises ``ValueError`` naming the field as ``section.name`` so a bad
YAML value is reported where it was written.
"""

from __future__ import annotations

import math

#: Precisions the drafter's forward (``run.autocast``) and the data stage's sampling pass
#: (``data.gen_dtype``) may run in.
COMPUTE_DTYPES = ("float32", "bfloat16")


def check_int(section: str, name: str, value: object, lo: int = 1) -> None:
    """``section.name`` must be an int (not a bool) >= ``lo``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < lo:
        raise ValueError(f"{section}.{name} must be an integer >= {lo}, got {value!r}")


def check_number(
    section: str, name: str, value: object, lo: float = 0.0, hi: float = math.inf
) -> None:
    """``section.name`` must be an int or float (not a bool) in ``[lo, hi]``."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not lo <= value <= hi:
        raise ValueError(f"{section}.{name} must be a number in [{lo}, {hi}], got {value!r}")
