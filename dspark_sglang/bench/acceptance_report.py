"""The figures of an acceptance run: per-cell results, the report, their standard errors.

Per drafter ``d`` and domain ``D`` (requests ``i``, each with ``n_i`` rounds and
``s_i = sum over its rounds of (accepted + 1)``):

    accept_length   L = sum_i s_i / sum_i n_i          (= GenerationResult.accept_length_mean)
    stderr          sqrt(R/(R-1) * sum_i (s_i - L n_i)^2) / sum_i n_i
                    (ratio estimator clustered by request: rounds of one request
                     are correlated, requests are the independent units)
    position k      accepted_k / reached_k             (conditional acceptance)
    macro           mean over domains of L, stderr sqrt(sum se_D^2) / |domains|
    copy acceptance copies_accepted / copies_reached   (drafters run with context copies:
                    the copied drafts among the reached / accepted ones)
    gain(a over b)  100 * (L_a / L_b - 1) %           (per domain and macro)
    its stderr      100 * sqrt(V_a/L_b^2 + L_a^2 V_b/L_b^4 - 2 L_a C_ab/L_b^3)  (delta method)
                    V = stderr^2; C_ab = R/(R-1) sum_i u_ai u_bi with u_i = (s_i - L n_i) / sum n,
                    the two drafters' estimates paired by request (same prompts, same order);
                    macro: V and C summed over domains / |domains|^2

Invariant: every figure in the report is a pure function of the per-round
``accepted`` counts it stores, so a reader can recompute them from the JSON.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch


def _nan_to_none(xs: Sequence[float]) -> list[float | None]:
    return [None if not math.isfinite(x) else float(x) for x in xs]


def _influence(accepted: Sequence[Sequence[int]]) -> tuple[float, torch.Tensor]:
    """``(L, u)``: tokens per round and each request's ``u_i = (s_i - L n_i) / sum n``."""
    s = torch.tensor([sum(a + 1 for a in r) for r in accepted], dtype=torch.float64)
    n = torch.tensor([len(r) for r in accepted], dtype=torch.float64)
    total = float(n.sum())
    if total == 0:
        return float("nan"), torch.full_like(s, float("nan"))
    mean = float(s.sum()) / total
    return mean, (s - mean * n) / total


def accept_length_stats(accepted: Sequence[Sequence[int]]) -> tuple[float, float]:
    """``(L, stderr)`` of tokens per round from per-request accepted counts (module docstring)."""
    mean, u = _influence(accepted)
    r = len(accepted)
    if r < 2 or not math.isfinite(mean):
        return mean, float("nan")
    return mean, math.sqrt(r / (r - 1) * float((u * u).sum()))


def paired_covariance(a: Sequence[Sequence[int]], b: Sequence[Sequence[int]]) -> float:
    """Covariance of two drafters' ``L`` estimates run on the same requests, in order.

    Requests are the independent units, and request ``i`` is the same prompt for both,
    so the two estimates co-vary through it (a prompt easy for one is easy for the other).
    """
    if len(a) != len(b):
        raise ValueError(f"paired_covariance: {len(a)} vs {len(b)} requests; pair by request")
    r = len(a)
    if r < 2:
        return float("nan")
    (_, ua), (_, ub) = _influence(a), _influence(b)
    return r / (r - 1) * float((ua * ub).sum())


def ratio_gain_stderr(a: float, b: float, var_a: float, var_b: float, cov: float) -> float:
    """Standard error, in %, of ``100 * (a / b - 1)`` by the delta method (module docstring)."""
    var = var_a / b**2 + a**2 * var_b / b**4 - 2.0 * a * cov / b**3
    return 100.0 * math.sqrt(max(var, 0.0)) if math.isfinite(var) else float("nan")


@dataclass(frozen=True)
class CellResult:
    """One drafter on one domain. ``accepted[i]``: accepted drafts per round of request ``i``.

    ``confidence_logits[i]`` (``[rounds_i, B]`` raw, pre-STS) is kept in memory for
    traces/rollouts only; ``None`` for drafters without a confidence head.
    """

    drafter: str
    domain: str
    block_size: int
    accepted: tuple[tuple[int, ...], ...]
    position_reached: tuple[int, ...]
    position_accepted: tuple[int, ...]
    num_tokens: int
    wall_time_s: float
    target_forwards: int
    confidence_logits: tuple[torch.Tensor, ...] | None = field(
        default=None, repr=False, compare=False
    )
    copies_reached: int = 0
    copies_accepted: int = 0

    def __post_init__(self) -> None:
        b = self.block_size
        if len(self.position_reached) != b or len(self.position_accepted) != b:
            raise ValueError(f"CellResult: position counts must have block_size={b} entries")
        if any(not 0 <= a <= b for r in self.accepted for a in r):
            raise ValueError(f"CellResult: accepted counts must lie in 0..{b}")

    @property
    def num_requests(self) -> int:
        return len(self.accepted)

    @property
    def num_rounds(self) -> int:
        return sum(len(r) for r in self.accepted)

    @property
    def accept_length(self) -> float:
        return accept_length_stats(self.accepted)[0]

    @property
    def accept_length_stderr(self) -> float:
        return accept_length_stats(self.accepted)[1]

    @property
    def position_acceptance(self) -> list[float]:
        """Conditional acceptance per position (NaN where never reached)."""
        return [
            a / r if r > 0 else float("nan")
            for a, r in zip(self.position_accepted, self.position_reached, strict=True)
        ]

    def to_dict(self) -> dict[str, Any]:
        return {
            "accept_length": self.accept_length,
            "accept_length_stderr": _nan_to_none([self.accept_length_stderr])[0],
            "num_requests": self.num_requests,
            "num_rounds": self.num_rounds,
            "num_tokens": self.num_tokens,
            "wall_time_s": self.wall_time_s,
            "target_forwards": self.target_forwards,
            "position_acceptance": _nan_to_none(self.position_acceptance),
            "position_reached": list(self.position_reached),
            "position_accepted": list(self.position_accepted),
            "accepted_per_round": [list(r) for r in self.accepted],
            "copies_reached": self.copies_reached,
            "copies_accepted": self.copies_accepted,
        }


@dataclass(frozen=True)
class AcceptanceReport:
    """All cells of one benchmark run, ``cells[drafter][domain]``, in the given orders."""

    drafters: tuple[str, ...]
    domains: tuple[str, ...]
    cells: Mapping[str, Mapping[str, CellResult]]
    num_prompts: int
    max_new_tokens: int
    seed: int
    temperature: float = 1.0
    policy: str = "verify_all"
    #: Drafters run with context copies: name -> n-gram (absent: none).
    context_copy: Mapping[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for d in self.drafters:
            missing = [x for x in self.domains if x not in self.cells.get(d, {})]
            if missing:
                raise ValueError(f"AcceptanceReport: drafter {d!r} has no result for {missing}")

    def macro(self, drafter: str) -> tuple[float, float]:
        """``(mean over domains of L, its stderr)`` for one drafter."""
        cells = [self.cells[drafter][d] for d in self.domains]
        mean = sum(c.accept_length for c in cells) / len(cells)
        se = math.sqrt(sum(c.accept_length_stderr**2 for c in cells)) / len(cells)
        return mean, se

    def pooled_position_acceptance(self, drafter: str) -> list[float]:
        """Conditional acceptance per position over all domains' rounds of one drafter."""
        cells = [self.cells[drafter][d] for d in self.domains]
        reached = [sum(c.position_reached[k] for c in cells) for k in range(cells[0].block_size)]
        acc = [sum(c.position_accepted[k] for c in cells) for k in range(cells[0].block_size)]
        return [a / r if r > 0 else float("nan") for a, r in zip(acc, reached, strict=True)]

    def _lengths(self, better: str, base: str, domain: str | None) -> tuple[float, float]:
        """The two accepted lengths a gain compares: one domain's, or macro (``None``)."""
        if domain is None:
            return self.macro(better)[0], self.macro(base)[0]
        return self.cells[better][domain].accept_length, self.cells[base][domain].accept_length

    def gain(self, better: str, base: str, domain: str | None = None) -> float:
        """Relative gain of ``better`` over ``base`` in %, per domain or macro (``None``)."""
        a, b = self._lengths(better, base, domain)
        return 100.0 * (a / b - 1.0)

    def gain_stderr(self, better: str, base: str, domain: str | None = None) -> float:
        """Standard error of :meth:`gain`, in %, pairing the two drafters by request."""
        domains = self.domains if domain is None else (domain,)
        k = len(domains)
        va = vb = cov = 0.0
        for d in domains:
            ca, cb = self.cells[better][d], self.cells[base][d]
            va += ca.accept_length_stderr**2 / k**2
            vb += cb.accept_length_stderr**2 / k**2
            cov += paired_covariance(ca.accepted, cb.accepted) / k**2
        return ratio_gain_stderr(*self._lengths(better, base, domain), va, vb, cov)

    def gains(self) -> dict[str, dict[str, dict[str, float]]]:
        """``gains[a][b][domain or 'macro']`` for every ordered pair of distinct drafters."""
        return {
            a: {
                b: {
                    **{d: self.gain(a, b, d) for d in self.domains},
                    "macro": self.gain(a, b),
                }
                for b in self.drafters
                if b != a
            }
            for a in self.drafters
        }

    def to_dict(self) -> dict[str, Any]:
        """The figures as JSON-ready data (NaN written as null)."""

        def clean(x: float) -> float | None:
            return _nan_to_none([x])[0]

        gains = self.gains()
        return {
            "settings": {
                "num_prompts": self.num_prompts,
                "max_new_tokens": self.max_new_tokens,
                "seed": self.seed,
                "temperature": self.temperature,
                "policy": self.policy,
                "bonus_token_included": True,
                "context_copy_ngram": {d: self.context_copy.get(d, 0) for d in self.drafters},
            },
            "drafters": list(self.drafters),
            "domains": list(self.domains),
            "results": {
                d: {dom: self.cells[d][dom].to_dict() for dom in self.domains}
                for d in self.drafters
            },
            "macro": {
                d: {"accept_length": clean(self.macro(d)[0]), "stderr": clean(self.macro(d)[1])}
                for d in self.drafters
            },
            "position_acceptance_pooled": {
                d: _nan_to_none(self.pooled_position_acceptance(d)) for d in self.drafters
            },
            "gains_percent": {
                a: {b: {k: clean(v) for k, v in row.items()} for b, row in cols.items()}
                for a, cols in gains.items()
            },
            "gains_stderr_percent": {
                a: {
                    b: {
                        **{d: clean(self.gain_stderr(a, b, d)) for d in self.domains},
                        "macro": clean(self.gain_stderr(a, b)),
                    }
                    for b in cols
                }
                for a, cols in gains.items()
            },
        }
