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
"""

from __future__ import annotations

import itertools
import math
import numbers
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar, Protocol, Self, runtime_checkable

import msgspec
import torch

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


# Upper bounds, far beyond any engine: a value above one is a unit slip or a corrupt table.
MAX_BATCH_TOKENS = 2**20  # tokens (or requests) in one forward batch; engines cap near 2**16
MAX_STEPS_PER_SEC = 1e6  # a step per microsecond: one kernel launch already takes longer
MAX_STEP_SECONDS = 3600.0  # a step of over an hour is a broken measurement


class CostTableError(ValueError):
    """A cost table (or the input used to build one) is malformed."""


@runtime_checkable
class CostModel(Protocol):
    """What a scheduling policy needs from a cost table."""

    def steps_per_sec(self, num_reqs: int, batch_tokens: torch.Tensor) -> torch.Tensor:
        """Engine steps/s for ``num_reqs`` requests at each total of ``batch_tokens``."""
        ...


# --------------------------------------------------------------------------- #
# Field validation shared by both tables.
# --------------------------------------------------------------------------- #


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


# --------------------------------------------------------------------------- #
# Staircase table.
# --------------------------------------------------------------------------- #


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
