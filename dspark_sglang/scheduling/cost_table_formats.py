"""The two SGLang 0.5.23 cost-table formats, their lookups and JSON I/O.

``SpsCostTable`` is the staircase (floor lookup over probe batch sizes),
``SpsAdditiveCostTable`` the additive step-time model (bias plus two clamped
piecewise-linear terms); ``cost_table``'s module docstring spells out both. Field
order and msgspec encoding match SGLang's, so ``to_json`` gives the same bytes.
``parse_cost_table``/``load_cost_table`` read either format, telling them apart by
the ``bias_seconds`` key.
"""

from __future__ import annotations

import math
import numbers
from pathlib import Path
from typing import ClassVar, Self

import msgspec
import torch

from dspark_sglang.scheduling.cost_table_fields import (
    MAX_BATCH_TOKENS,
    MAX_STEP_SECONDS,
    MAX_STEPS_PER_SEC,
    CostTableError,
    _check_batch_tokens,
    _float_values,
    _int_probes,
)

__all__ = [
    "CostTable",
    "SpsAdditiveCostTable",
    "SpsCostTable",
    "load_cost_table",
    "parse_cost_table",
]


class _JsonTable(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """JSON I/O shared by both table kinds.

    A field-less msgspec base, so the subclasses keep SGLang's field order and
    ``to_json`` stays byte-identical to SGLang's ``msgspec.json.encode``.
    """

    def to_json(self) -> str:
        """Exactly the text SGLang's ``to_json()`` gives for these values."""
        return msgspec.json.encode(self).decode("utf-8")

    @classmethod
    def from_json(cls, data: str | bytes) -> Self:
        table = parse_cost_table(data)
        if not isinstance(table, cls):
            raise CostTableError(f"expected an {cls.__name__}, got an {type(table).__name__}")
        return table

    def save(self, path: str | Path) -> None:
        Path(path).write_text(self.to_json(), encoding="utf-8")


# --------------------------------------------------------------------------- #
# Staircase table.
# --------------------------------------------------------------------------- #


class SpsCostTable(_JsonTable, frozen=True, forbid_unknown_fields=True):
    """Staircase ``SPS(b)`` sampled at probe batch sizes (SGLang's ``SpsCostTable``).

    Fields:
        sample_batch_tokens: probe batch sizes (total tokens in the forward
            batch), strictly increasing, each >= 1.
        sample_steps_per_sec: measured engine steps/s at each probe, finite > 0.
        max_batch_tokens: the largest batch the engine will run; >= the last
            probe. Lookups beyond it still return the last probe's rate (as in
            SGLang); policies cap their budget with it.
    """

    sample_batch_tokens: tuple[int, ...]
    sample_steps_per_sec: tuple[float, ...]
    max_batch_tokens: int

    KIND: ClassVar[str] = "staircase"

    def __post_init__(self) -> None:
        name = "SpsCostTable"
        probes = _int_probes(name, "sample_batch_tokens", self.sample_batch_tokens)
        rates = _float_values(
            name,
            "sample_steps_per_sec",
            self.sample_steps_per_sec,
            n=len(probes),
            probes_field="sample_batch_tokens",
            allow_zero=False,
            hi=(MAX_STEPS_PER_SEC, "MAX_STEPS_PER_SEC"),
        )
        mbt = self.max_batch_tokens
        if isinstance(mbt, bool) or not isinstance(mbt, numbers.Integral):
            raise CostTableError(
                f"{name}.max_batch_tokens must be an integer, got {mbt!r} ({type(mbt).__name__})"
            )
        if int(mbt) < probes[-1]:
            raise CostTableError(
                f"{name}.max_batch_tokens = {int(mbt)} is below the last probe {probes[-1]}: "
                f"set it to at least {probes[-1]} (or drop probes above the engine's limit)"
            )
        if int(mbt) > MAX_BATCH_TOKENS:
            raise CostTableError(
                f"{name}.max_batch_tokens = {int(mbt)} is above the bound {MAX_BATCH_TOKENS} "
                "(MAX_BATCH_TOKENS, far beyond any engine's batch): set it to the engine's "
                "real limit (e.g. its largest CUDA-graph bucket or --max-prefill-tokens)"
            )
        # Normalise to exact Python types so encoding matches SGLang's float lists.
        msgspec.structs.force_setattr(self, "sample_batch_tokens", probes)
        msgspec.structs.force_setattr(self, "sample_steps_per_sec", rates)
        msgspec.structs.force_setattr(self, "max_batch_tokens", int(mbt))

    def lookup(self, batch_tokens: int) -> float:
        """Scalar floor lookup (SGLang's ``SpsCostTable.lookup``)."""
        return float(self.steps_per_sec(0, torch.tensor([int(batch_tokens)]))[0])

    def steps_per_sec(self, num_reqs: int, batch_tokens: torch.Tensor) -> torch.Tensor:
        """Floor lookup of ``SPS`` at every entry of ``batch_tokens`` (float64).

        ``idx = clamp(searchsorted(probes, b, right=True) - 1, 0, n-1)``, i.e. the
        largest probe ``<= b``, clamped to the first/last probe. ``num_reqs`` is
        unused by a staircase table (kept so both tables share one signature).
        """
        bt = _check_batch_tokens(num_reqs, batch_tokens)
        probes = torch.tensor(self.sample_batch_tokens, dtype=torch.int64, device=bt.device)
        rates = torch.tensor(self.sample_steps_per_sec, dtype=torch.float64, device=bt.device)
        idx = torch.searchsorted(probes, bt.contiguous(), right=True) - 1
        return rates[idx.clamp(0, probes.numel() - 1)]


# --------------------------------------------------------------------------- #
# Additive table.
# --------------------------------------------------------------------------- #


def _interp_clamped(xs: torch.Tensor, ys: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """Piecewise-linear ``y(x)`` through ``(xs, ys)``, constant beyond the ends."""
    if xs.numel() == 1:
        return ys.expand_as(x).clone()
    xc = x.clamp(xs[0], xs[-1])
    hi = torch.searchsorted(xs, xc.contiguous(), right=True).clamp(1, xs.numel() - 1)
    lo = hi - 1
    frac = (xc - xs[lo]) / (xs[hi] - xs[lo])
    return ys[lo] + frac * (ys[hi] - ys[lo])


class SpsAdditiveCostTable(_JsonTable, frozen=True, forbid_unknown_fields=True):
    """Additive step-time model (SGLang's ``SpsAdditiveCostTable``).

    ``step_time(n, b) = bias_seconds + interp(alpha_seconds @ bs_probes, n)
    + interp(theta_seconds @ m_probes, b)`` for ``n`` requests and ``b`` total
    batch tokens; interpolation is linear and clamped to the end probes.

    Fields:
        bias_seconds: fixed per-step cost, finite > 0 (keeps step time > 0).
        bs_probes: request counts the per-request term was sampled at,
            strictly increasing, each >= 1.
        alpha_seconds: per-request-count cost at each ``bs_probes`` entry,
            finite >= 0 (zero allowed: ``bias`` already carries the floor).
        m_probes: total batch tokens the per-token term was sampled at,
            strictly increasing, each >= 1.
        theta_seconds: per-token-count cost at each ``m_probes`` entry, finite >= 0.
    """

    bias_seconds: float
    bs_probes: tuple[int, ...]
    alpha_seconds: tuple[float, ...]
    m_probes: tuple[int, ...]
    theta_seconds: tuple[float, ...]

    KIND: ClassVar[str] = "additive"

    def __post_init__(self) -> None:
        name = "SpsAdditiveCostTable"
        bias = self.bias_seconds
        if isinstance(bias, bool) or not isinstance(bias, numbers.Real):
            raise CostTableError(
                f"{name}.bias_seconds must be a number, got {bias!r} ({type(bias).__name__})"
            )
        if not math.isfinite(float(bias)) or float(bias) <= 0.0:
            raise CostTableError(
                f"{name}.bias_seconds = {float(bias)!r}: must be finite and > 0 "
                "(the fixed cost of one engine step)"
            )
        if not 1.0 / MAX_STEPS_PER_SEC <= float(bias) <= MAX_STEP_SECONDS:
            raise CostTableError(
                f"{name}.bias_seconds = {float(bias)!r} is outside [{1.0 / MAX_STEPS_PER_SEC:g}, "
                f"{MAX_STEP_SECONDS:g}] s (1/MAX_STEPS_PER_SEC..MAX_STEP_SECONDS, far beyond "
                "any engine): check the unit (seconds) and re-profile"
            )
        bs = _int_probes(name, "bs_probes", self.bs_probes)
        sec = (MAX_STEP_SECONDS, "MAX_STEP_SECONDS")
        alpha = _float_values(
            name, "alpha_seconds", self.alpha_seconds,
            n=len(bs), probes_field="bs_probes", allow_zero=True, hi=sec,
        )  # fmt: skip
        m = _int_probes(name, "m_probes", self.m_probes)
        theta = _float_values(
            name, "theta_seconds", self.theta_seconds,
            n=len(m), probes_field="m_probes", allow_zero=True, hi=sec,
        )  # fmt: skip
        msgspec.structs.force_setattr(self, "bias_seconds", float(bias))
        msgspec.structs.force_setattr(self, "bs_probes", bs)
        msgspec.structs.force_setattr(self, "alpha_seconds", alpha)
        msgspec.structs.force_setattr(self, "m_probes", m)
        msgspec.structs.force_setattr(self, "theta_seconds", theta)

    def step_time_tensor(self, num_reqs: int, batch_tokens: torch.Tensor) -> torch.Tensor:
        """Predicted seconds per engine step at each ``batch_tokens`` (float64)."""
        bt = _check_batch_tokens(num_reqs, batch_tokens)
        f64 = {"dtype": torch.float64, "device": bt.device}
        per_req = _interp_clamped(
            torch.tensor(self.bs_probes, **f64),
            torch.tensor(self.alpha_seconds, **f64),
            torch.tensor([float(num_reqs)], **f64),
        )
        per_tok = _interp_clamped(
            torch.tensor(self.m_probes, **f64),
            torch.tensor(self.theta_seconds, **f64),
            bt.to(torch.float64),
        )
        return self.bias_seconds + per_req + per_tok

    def step_time(self, *, num_reqs: int, budget: int) -> float:
        """Scalar step time (SGLang's signature: ``budget`` = draft tokens beyond anchors)."""
        return float(self.step_time_tensor(num_reqs, torch.tensor([num_reqs + budget]))[0])

    def steps_per_sec(self, num_reqs: int, batch_tokens: torch.Tensor) -> torch.Tensor:
        """``1 / step_time`` with ``budget = batch_tokens - num_reqs`` (float64)."""
        return 1.0 / self.step_time_tensor(num_reqs, batch_tokens)


CostTable = SpsCostTable | SpsAdditiveCostTable

_FIELDS: dict[type[SpsCostTable] | type[SpsAdditiveCostTable], tuple[str, ...]] = {
    SpsCostTable: SpsCostTable.__struct_fields__,
    SpsAdditiveCostTable: SpsAdditiveCostTable.__struct_fields__,
}


def parse_cost_table(data: str | bytes, *, source: str = "cost table") -> CostTable:
    """Decode either JSON format; the additive one is recognised by ``bias_seconds``.

    (SGLang tests for the substring ``"bias_seconds"``; we look at the parsed
    keys so a stray string value cannot flip the format.)
    """
    raw = data.encode("utf-8") if isinstance(data, str) else data
    try:
        obj = msgspec.json.decode(raw)
    except msgspec.DecodeError as exc:
        raise CostTableError(f"{source}: not valid JSON ({exc})") from exc
    if not isinstance(obj, dict):
        raise CostTableError(f"{source}: top level must be a JSON object, got {type(obj).__name__}")
    cls: type[SpsCostTable] | type[SpsAdditiveCostTable] = (
        SpsAdditiveCostTable if "bias_seconds" in obj else SpsCostTable
    )
    allowed = _FIELDS[cls]
    unknown = sorted(set(obj) - set(allowed))
    if unknown:
        raise CostTableError(
            f"{source}: unknown key(s) {unknown} for {cls.__name__}; allowed keys: "
            f"{list(allowed)} (metadata belongs in a sidecar file)"
        )
    missing = [k for k in allowed if k not in obj]
    if missing:
        raise CostTableError(f"{source}: {cls.__name__} is missing required key(s) {missing}")
    try:
        return msgspec.json.decode(raw, type=cls)
    except msgspec.ValidationError as exc:
        raise CostTableError(f"{source}: {exc}") from exc


def load_cost_table(path: str | Path) -> CostTable:
    """Read a cost-table JSON file in either SGLang format."""
    p = Path(path)
    try:
        data = p.read_bytes()
    except OSError as exc:
        raise CostTableError(f"cannot read cost table {p}: {exc}") from exc
    return parse_cost_table(data, source=str(p))
