"""The STS calibration file: SGLang's ``DSparkStsCalibration`` JSON, read and written.

``StsCalibration`` is the frozen on-disk struct (same field names, order, defaults and
omission rules as SGLang's, so ``to_json`` gives the same bytes), validated on
construction; ``load_sts`` reads one from a path. ``STS_FILENAME`` and
``GREEDY_STS_FILENAME`` name the files a drafter folder may hold.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import msgspec
import torch

from dspark_sglang.calibration.sts_survival import apply_sts

__all__ = [
    "GREEDY_STS_FILENAME",
    "STS_FILENAME",
    "StsCalibration",
    "load_sts",
]

STS_FILENAME = "sts.json"
"""A drafter folder's STS file: fitted on rollouts at the temperature its tiers sample at."""

GREEDY_STS_FILENAME = "sts_greedy.json"
"""A drafter folder's STS file for greedy-only tiers, fitted on greedy rollouts (optional).

Greedy acceptance (the draft's argmax equals the target's) is not sampled acceptance
(``min(1, p/q)``): a confidence head calibrated at temperature 1 underestimates it where
the target is confident, and a scheduler reading it verifies too little."""


def _float_tuple(
    field: str, values: Any, *, lo: float, hi: float, open_lo: bool
) -> tuple[float, ...]:
    if isinstance(values, str | bytes) or not isinstance(values, Sequence):
        raise ValueError(
            f"StsCalibration.{field} must be a list of numbers, got {type(values).__name__}"
        )
    out: list[float] = []
    for i, v in enumerate(values):
        if isinstance(v, bool) or not isinstance(v, numbers.Real):
            raise ValueError(f"StsCalibration.{field}[{i}] must be a number, got {v!r}")
        fv = float(v)
        bad_lo = fv <= lo if open_lo else fv < lo
        if not math.isfinite(fv) or bad_lo or fv > hi:
            bound = f"{'>' if open_lo else '>='} {lo}" + ("" if math.isinf(hi) else f" and <= {hi}")
            raise ValueError(f"StsCalibration.{field}[{i}] = {fv!r}: must be finite and {bound}")
        out.append(fv)
    return tuple(out)


class StsCalibration(msgspec.Struct, frozen=True, omit_defaults=True, forbid_unknown_fields=True):
    """STS temperatures as SGLang's ``--speculative-dspark-confidence-sts-path`` reads them.

    Fields (same names, defaults and omission rules as ``DSparkStsCalibration``):
        temperatures: one ``T_k > 0`` per block position (SGLang checks the count
            against its runtime block size).
        dataset: free-form description of the rollouts it was fitted on.
        num_samples: rounds used for the fit.
        ece_before / ece_after: per-position survival ECE at ``T = 1`` and after;
            empty or one per position, each in ``[0, 1]``.
    """

    temperatures: tuple[float, ...]
    dataset: str = ""
    num_samples: int = 0
    ece_before: tuple[float, ...] = ()
    ece_after: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        temps = _float_tuple("temperatures", self.temperatures, lo=0.0, hi=math.inf, open_lo=True)
        if not temps:
            raise ValueError(
                "StsCalibration.temperatures is empty: give one temperature per position"
            )
        if not isinstance(self.dataset, str):
            raise ValueError(f"StsCalibration.dataset must be a string, got {self.dataset!r}")
        ns = self.num_samples
        if isinstance(ns, bool) or not isinstance(ns, numbers.Integral) or ns < 0:
            raise ValueError(f"StsCalibration.num_samples must be an integer >= 0, got {ns!r}")
        eces = {}
        for name in ("ece_before", "ece_after"):
            vals = _float_tuple(name, getattr(self, name), lo=0.0, hi=1.0, open_lo=False)
            if vals and len(vals) != len(temps):
                raise ValueError(
                    f"StsCalibration.{name} has {len(vals)} entries for {len(temps)} "
                    "temperatures: give one per position or leave it out"
                )
            eces[name] = vals
        msgspec.structs.force_setattr(self, "temperatures", temps)
        msgspec.structs.force_setattr(self, "num_samples", int(ns))
        for name, vals in eces.items():
            msgspec.structs.force_setattr(self, name, vals)

    @property
    def block_size(self) -> int:
        return len(self.temperatures)

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        """Calibrated conditional confidences for raw logits ``[..., B]``."""
        return apply_sts(logits, self.temperatures)

    def to_json(self) -> str:
        """Exactly the text SGLang's ``DSparkStsCalibration.to_json()`` gives."""
        return msgspec.json.encode(self).decode("utf-8")

    @classmethod
    def from_json(cls, data: str | bytes, *, source: str = "STS calibration") -> StsCalibration:
        raw = data.encode("utf-8") if isinstance(data, str) else data
        try:
            obj = msgspec.json.decode(raw)
        except msgspec.DecodeError as exc:
            raise ValueError(f"{source}: not valid JSON ({exc})") from exc
        if not isinstance(obj, dict):
            raise ValueError(f"{source}: top level must be a JSON object, got {type(obj).__name__}")
        unknown = sorted(set(obj) - set(cls.__struct_fields__))
        if unknown:
            raise ValueError(
                f"{source}: unknown key(s) {unknown}; allowed keys: {list(cls.__struct_fields__)}"
            )
        try:
            return msgspec.json.decode(raw, type=cls)
        except msgspec.ValidationError as exc:
            raise ValueError(f"{source}: {exc}") from exc

    def save(self, path: str | Path) -> None:
        Path(path).write_text(self.to_json(), encoding="utf-8")


def load_sts(path: str | Path) -> StsCalibration:
    """Read an STS calibration JSON (ours or SGLang's ``dspark_sts_fit`` output)."""
    p = Path(path)
    try:
        data = p.read_bytes()
    except OSError as exc:
        raise ValueError(f"cannot read STS calibration {p}: {exc}") from exc
    return StsCalibration.from_json(data, source=str(p))
