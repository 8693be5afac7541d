"""Sequential Temperature Scaling (STS) of the drafter's confidence head.

The scheduler multiplies conditional confidences into survival probabilities
``A_k = prod_{j<=k} c_j`` and trades them against hardware cost, so it is the
*product* that must be calibrated, not each ``c_k`` alone: miscalibration
compounds along the block. STS fixes one temperature per position, in order:

    for k = 1..B:  T_k = argmin_{T in grid} ECE( A_{k-1} * sigmoid(z_k / T),  1[accepted >= k] )
                   with A_{k-1} = prod_{j<k} sigmoid(z_j / T_j) already fixed.

Invariants: every ``T_k > 0``, so ``sigmoid(z/T)`` is strictly increasing in
``z``: the ranking of drafts at each position, hence the conditional AUC, is
unchanged; only the probability scale moves.

Data: raw confidence logits ``z`` ``[M, B]`` and accepted-draft counts ``[M]``
(how many drafts of that round were accepted). The prefix-survival indicator at
position ``k`` (1-based) is ``accepted >= k``. Optionally ``verified`` ``[M]``
(how many drafts were verified): position ``k`` of a round then counts only if
``verified >= k``. A round that rejected early *does* imply non-survival beyond
``verified``, but keeping it only when it failed would select on the outcome
and bias survival down; selecting on ``verified`` alone (chosen before the
outcome, non-anticipating) keeps the labels unbiased.

``ece_before``/``ece_after`` follow SGLang's ``dspark_sts_fit`` definition: the
ECE of the survival product at ``T = 1`` and at the fitted temperatures. The
output JSON is byte-compatible with SGLang's ``DSparkStsCalibration``.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import torch

__all__ = [
    "GREEDY_STS_FILENAME",
    "STS_FILENAME",
    "StsCalibration",
    "StsEvaluation",
    "StsFit",
    "apply_sts",
    "default_grid",
    "ece",
    "evaluate_sts",
    "fit_sts",
    "load_sts",
    "observed_mask",
    "reliability_bins",
    "roc_auc",
    "survival_labels",
    "survival_probs",
]

_MAX_CHUNK_ELEMS = 1 << 22  # bounds the [grid, samples] candidate block to ~32 MiB (float64)


def default_grid(lo: float = 0.05, hi: float = 20.0, steps: int = 241) -> torch.Tensor:
    """Log-spaced temperatures (float64); 241 points over 0.05..20 is a 2.5 % step."""
    if not (0.0 < lo < hi) or not math.isfinite(hi) or steps < 2:
        raise ValueError(f"grid needs 0 < lo < hi < inf and steps >= 2, got {lo}, {hi}, {steps}")
    return torch.logspace(math.log10(lo), math.log10(hi), steps, dtype=torch.float64)


# --------------------------------------------------------------------------- #
# Metrics.
# --------------------------------------------------------------------------- #


def _check_prob_label(prob: torch.Tensor, label: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    p = torch.as_tensor(prob).reshape(-1).to(torch.float64)
    y = torch.as_tensor(label).reshape(-1).to(torch.float64)
    if p.numel() != y.numel():
        raise ValueError(f"prob and label sizes differ: {p.numel()} vs {y.numel()}")
    if p.numel() == 0:
        raise ValueError("ECE of an empty set is undefined: pass at least one sample")
    if not bool(((p >= 0) & (p <= 1)).all()):
        raise ValueError("prob must lie in [0, 1] (and not be NaN)")
    if not bool(((y >= 0) & (y <= 1)).all()):
        raise ValueError("label must lie in [0, 1] (and not be NaN)")
    return p, y


def _bin_index(p: torch.Tensor, n_bins: int) -> torch.Tensor:
    """Equal-width bins ``[i/n, (i+1)/n)``; ``p = 1`` goes in the last bin."""
    return (p * n_bins).long().clamp_(0, n_bins - 1)


def reliability_bins(
    prob: torch.Tensor, label: torch.Tensor, n_bins: int = 15
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per equal-width bin: ``(count, mean predicted, mean label)``, float64 ``[n_bins]``.

    Empty bins have count 0 and means 0.
    """
    if n_bins < 1:
        raise ValueError(f"n_bins must be >= 1, got {n_bins}")
    p, y = _check_prob_label(prob, label)
    idx = _bin_index(p, n_bins)
    count = torch.zeros(n_bins, dtype=torch.float64).index_add_(0, idx, torch.ones_like(p))
    psum = torch.zeros(n_bins, dtype=torch.float64).index_add_(0, idx, p)
    ysum = torch.zeros(n_bins, dtype=torch.float64).index_add_(0, idx, y)
    denom = count.clamp(min=1.0)
    return count, psum / denom, ysum / denom


def ece(prob: torch.Tensor, label: torch.Tensor, n_bins: int = 15) -> float:
    """Expected calibration error with equal-width bins.

    ``ECE = sum_b (n_b / N) * |mean(p in b) - mean(y in b)| = sum_b |sum_b p - sum_b y| / N``.
    """
    count, mp, my = reliability_bins(prob, label, n_bins)
    return float(((mp - my).abs() * count).sum() / count.sum())


def _ece_rows(prob: torch.Tensor, label: torch.Tensor, n_bins: int) -> torch.Tensor:
    """ECE of each row of ``prob`` ``[G, N]`` against one ``label`` ``[N]`` (float64 ``[G]``)."""
    g, n = prob.shape
    idx = _bin_index(prob, n_bins) + torch.arange(g).unsqueeze(1) * n_bins
    flat = idx.reshape(-1)
    diff = (prob - label.unsqueeze(0)).reshape(-1)
    err = torch.zeros(g * n_bins, dtype=torch.float64).index_add_(0, flat, diff)
    return err.view(g, n_bins).abs().sum(1) / n


def roc_auc(score: torch.Tensor, label: torch.Tensor) -> float:
    """Area under the ROC curve via the Mann-Whitney rank statistic.

    ``AUC = (sum of positives' ranks - P(P+1)/2) / (P * N)`` with ties given
    their average rank (so a tie counts 1/2). NaN when one class is absent.
    """
    s = torch.as_tensor(score).reshape(-1).to(torch.float64)
    y = torch.as_tensor(label).reshape(-1)
    if s.numel() != y.numel():
        raise ValueError(f"score and label sizes differ: {s.numel()} vs {y.numel()}")
    if bool(torch.isnan(s).any()):
        raise ValueError("score contains NaN")
    yb = y.to(torch.bool) if y.dtype == torch.bool else y != 0
    n_pos = int(yb.sum())
    n_neg = s.numel() - n_pos
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    sorted_s, order = torch.sort(s)
    _, inverse, counts = torch.unique_consecutive(sorted_s, return_inverse=True, return_counts=True)
    first_rank = (torch.cumsum(counts, 0) - counts).to(torch.float64) + 1.0
    avg_rank = first_rank + (counts.to(torch.float64) - 1.0) / 2.0
    pos_rank_sum = float(avg_rank[inverse][yb[order]].sum())
    return (pos_rank_sum - n_pos * (n_pos + 1) / 2.0) / (n_pos * n_neg)


# --------------------------------------------------------------------------- #
# Labels and application.
# --------------------------------------------------------------------------- #


def _check_counts(
    logits: torch.Tensor, accepted: torch.Tensor, verified: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    z = torch.as_tensor(logits)
    if z.dim() != 2 or z.shape[0] == 0 or z.shape[1] == 0:
        raise ValueError(f"logits must be [M, B] with M, B >= 1, got shape {tuple(z.shape)}")
    if not bool(torch.isfinite(z).all()):
        raise ValueError("logits contain NaN or inf")
    m, b = z.shape
    acc = torch.as_tensor(accepted)
    if acc.is_floating_point() and not bool((acc == acc.round()).all()):
        raise ValueError("accepted must hold whole counts")
    acc = acc.reshape(-1).to(torch.int64)
    if acc.numel() != m:
        raise ValueError(f"accepted has {acc.numel()} entries but logits has {m} rows")
    if bool(((acc < 0) | (acc > b)).any()):
        raise ValueError(f"accepted counts must lie in 0..{b} (the block size)")
    ver = None
    if verified is not None:
        ver = torch.as_tensor(verified).reshape(-1).to(torch.int64)
        if ver.numel() != m:
            raise ValueError(f"verified has {ver.numel()} entries but logits has {m} rows")
        if bool(((ver < acc) | (ver > b)).any()):
            raise ValueError(f"verified counts must satisfy accepted <= verified <= {b}")
    return z.to(torch.float64), acc, ver


def survival_labels(accepted: torch.Tensor, block_size: int) -> torch.Tensor:
    """``[M, B]`` bool: draft ``k`` (1-based column ``k-1``) survived iff ``accepted >= k``."""
    ks = torch.arange(1, block_size + 1, device=torch.as_tensor(accepted).device)
    return torch.as_tensor(accepted).reshape(-1, 1) >= ks


def observed_mask(
    accepted: torch.Tensor, verified: torch.Tensor | None, block_size: int
) -> torch.Tensor:
    """``[M, B]`` bool: does position ``k`` of this round enter the fit?

    Only when draft ``k`` was verified (``k <= verified``). Early rejections
    beyond ``verified`` are deliberately *not* kept: including a round only when
    it failed would select on the outcome (see the module docstring).
    """
    acc = torch.as_tensor(accepted).reshape(-1, 1)
    if verified is None:
        return torch.ones(acc.shape[0], block_size, dtype=torch.bool, device=acc.device)
    ver = torch.as_tensor(verified).reshape(-1, 1)
    ks = torch.arange(1, block_size + 1, device=acc.device)
    return (ks <= ver).expand(acc.shape[0], block_size)


def apply_sts(logits: torch.Tensor, temperatures: Sequence[float] | torch.Tensor) -> torch.Tensor:
    """Calibrated conditional confidences ``c_k = sigmoid(z_k / T_k)`` over the last axis."""
    z = torch.as_tensor(logits)
    t = torch.as_tensor(temperatures, dtype=z.dtype if z.is_floating_point() else torch.float32)
    if t.dim() != 1 or t.numel() != z.shape[-1]:
        raise ValueError(
            f"need one temperature per block position: {t.numel()} temperatures for "
            f"logits of block size {z.shape[-1]}"
        )
    if not bool((t > 0).all()) or not bool(torch.isfinite(t).all()):
        raise ValueError("temperatures must be finite and > 0")
    return torch.sigmoid(z / t.to(z.device))


def survival_probs(confidences: torch.Tensor) -> torch.Tensor:
    """``A_k = prod_{j<=k} c_j`` over the last axis (non-increasing in ``k``)."""
    return torch.cumprod(confidences, dim=-1)


# --------------------------------------------------------------------------- #
# Fitting.
# --------------------------------------------------------------------------- #


STS_FILENAME = "sts.json"
"""A drafter folder's STS file: fitted on rollouts at the temperature its tiers sample at."""

GREEDY_STS_FILENAME = "sts_greedy.json"
"""A drafter folder's STS file for greedy-only tiers, fitted on greedy rollouts (optional).

Greedy acceptance (the draft's argmax equals the target's) is not sampled acceptance
(``min(1, p/q)``): a confidence head calibrated at temperature 1 underestimates it where
the target is confident, and a scheduler reading it verifies too little."""


@dataclass(frozen=True)
class StsFit:
    """Result of ``fit_sts``; every tuple has one entry per block position.

    ``ece_before``/``ece_after``: ECE of the survival product at ``T = 1`` /
    fitted ``T``. ``auc``: ROC AUC of the raw logit for the *conditional*
    outcome (draft ``k`` accepted, among rounds whose drafts ``< k`` all passed
    and draft ``k`` was verified); temperature scaling cannot change it.
    ``num_tested``: how many rounds that AUC is over.
    """

    temperatures: tuple[float, ...]
    ece_before: tuple[float, ...]
    ece_after: tuple[float, ...]
    auc: tuple[float, ...]
    num_tested: tuple[int, ...]
    num_samples: int
    n_bins: int

    def to_calibration(self, dataset: str = "") -> StsCalibration:
        """The SGLang-compatible JSON struct (``DSparkStsCalibration`` fields)."""
        return StsCalibration(
            temperatures=self.temperatures,
            dataset=dataset,
            num_samples=self.num_samples,
            ece_before=self.ece_before,
            ece_after=self.ece_after,
        )

    def table(self) -> str:
        """Per-position report: temperature, ECE before/after, conditional AUC."""
        lines = [
            f"{'pos':>3}  {'T':>8}  {'ECE before':>10}  {'ECE after':>9}  {'AUC':>6}  {'n':>8}"
        ]
        for k, row in enumerate(
            zip(
                self.temperatures,
                self.ece_before,
                self.ece_after,
                self.auc,
                self.num_tested,
                strict=True,
            )
        ):
            t, eb, ea, auc, n = row
            lines.append(f"{k + 1:>3}  {t:>8.4f}  {eb:>10.4f}  {ea:>9.4f}  {auc:>6.4f}  {n:>8d}")
        mb = sum(self.ece_before) / len(self.ece_before)
        ma = sum(self.ece_after) / len(self.ece_after)
        lines.append(f"mean ECE before {mb:.4f}, after {ma:.4f}; {self.num_samples} rounds")
        return "\n".join(lines)


def _conditional_auc(
    zk: torch.Tensor, acc: torch.Tensor, ver: torch.Tensor | None, k: int
) -> tuple[float, int]:
    """AUC of the raw logit at 0-based position ``k`` for "draft k+1 accepted",
    among rounds whose earlier drafts all passed and that verified draft k+1."""
    tested = acc >= k
    if ver is not None:
        tested &= ver >= k + 1
    return roc_auc(zk[tested], acc[tested] >= k + 1), int(tested.sum())


def fit_sts(
    logits: torch.Tensor,
    accepted: torch.Tensor,
    grid: torch.Tensor | Sequence[float] | None = None,
    *,
    n_bins: int = 15,
    verified: torch.Tensor | None = None,
) -> StsFit:
    """Fit one temperature per position, in order, by grid search on survival ECE.

    All grid candidates of a position are scored at once: candidates
    ``[G, M_k] = A_{k-1}[None] * sigmoid(z_k[None] / T[:, None])`` are binned
    with a per-row offset and reduced with one ``index_add_``. Ties go to the
    smallest temperature (first grid minimum), as in SGLang's fitter.
    """
    z, acc, ver = _check_counts(logits, accepted, verified)
    m, b = z.shape
    if n_bins < 1:
        raise ValueError(f"n_bins must be >= 1, got {n_bins}")
    g = default_grid() if grid is None else torch.as_tensor(grid, dtype=torch.float64).reshape(-1)
    if g.numel() == 0 or not bool(torch.isfinite(g).all()) or not bool((g > 0).all()):
        raise ValueError("grid must be a non-empty list of finite temperatures > 0")
    labels = survival_labels(acc, b).to(torch.float64)
    observed = observed_mask(acc, ver, b)
    chunk = max(1, _MAX_CHUNK_ELEMS // m)

    temps: list[float] = []
    before: list[float] = []
    after: list[float] = []
    aucs: list[float] = []
    tested_counts: list[int] = []
    raw_prefix = torch.ones(m, dtype=torch.float64)
    fit_prefix = torch.ones(m, dtype=torch.float64)
    for k in range(b):
        obs = observed[:, k]
        if not bool(obs.any()):
            raise ValueError(
                f"position {k + 1}: no round verified that many drafts; collect verify-all rollouts"
            )
        zk, yk = z[:, k], labels[:, k]
        raw_prefix = raw_prefix * torch.sigmoid(zk)
        before.append(ece(raw_prefix[obs], yk[obs], n_bins))

        zo, po, yo = zk[obs], fit_prefix[obs], yk[obs]
        scores = torch.cat(
            [
                _ece_rows(
                    po.unsqueeze(0) * torch.sigmoid(zo.unsqueeze(0) / gc.unsqueeze(1)), yo, n_bins
                )
                for gc in g.split(chunk)
            ]
        )
        best = int(torch.argmin(scores))  # first minimum = smallest T among ties
        t_best = float(g[best])
        temps.append(t_best)
        after.append(float(scores[best]))
        fit_prefix = fit_prefix * torch.sigmoid(zk / t_best)

        auc, n_tested = _conditional_auc(zk, acc, ver, k)
        aucs.append(auc)
        tested_counts.append(n_tested)

    return StsFit(
        temperatures=tuple(temps),
        ece_before=tuple(before),
        ece_after=tuple(after),
        auc=tuple(aucs),
        num_tested=tuple(tested_counts),
        num_samples=m,
        n_bins=n_bins,
    )


@dataclass(frozen=True)
class StsEvaluation:
    """Fitted temperatures scored on rounds they were *not* fitted on (held-out split).

    Same fields as ``StsFit`` minus the temperatures: per-position survival ECE at
    ``T = 1`` and at the given temperatures, and the conditional AUC.
    """

    ece_before: tuple[float, ...]
    ece_after: tuple[float, ...]
    auc: tuple[float, ...]
    num_tested: tuple[int, ...]
    num_samples: int
    n_bins: int

    @property
    def mean_ece_before(self) -> float:
        return sum(self.ece_before) / len(self.ece_before)

    @property
    def mean_ece_after(self) -> float:
        return sum(self.ece_after) / len(self.ece_after)

    def to_dict(self) -> dict[str, Any]:
        return {
            "ece_before": list(self.ece_before),
            "ece_after": list(self.ece_after),
            "mean_ece_before": self.mean_ece_before,
            "mean_ece_after": self.mean_ece_after,
            "auc": list(self.auc),
            "num_tested": list(self.num_tested),
            "num_samples": self.num_samples,
            "n_bins": self.n_bins,
        }

    def table(self) -> str:
        lines = [f"{'pos':>3}  {'ECE before':>10}  {'ECE after':>9}  {'AUC':>6}  {'n':>8}"]
        for k, (eb, ea, auc, n) in enumerate(
            zip(self.ece_before, self.ece_after, self.auc, self.num_tested, strict=True)
        ):
            lines.append(f"{k + 1:>3}  {eb:>10.4f}  {ea:>9.4f}  {auc:>6.4f}  {n:>8d}")
        lines.append(
            f"held-out mean ECE before {self.mean_ece_before:.4f}, after "
            f"{self.mean_ece_after:.4f}; {self.num_samples} rounds"
        )
        return "\n".join(lines)


def evaluate_sts(
    logits: torch.Tensor,
    accepted: torch.Tensor,
    temperatures: Sequence[float] | torch.Tensor,
    *,
    n_bins: int = 15,
    verified: torch.Tensor | None = None,
) -> StsEvaluation:
    """Score given temperatures on rounds (ideally held out from the fit).

    Why separate from ``fit_sts``: the fit's own ``ece_after`` is measured on the
    data it minimised, so it is optimistic; the deployment question is how the
    temperatures do on rounds they never saw.
    """
    z, acc, ver = _check_counts(logits, accepted, verified)
    m, b = z.shape
    if n_bins < 1:
        raise ValueError(f"n_bins must be >= 1, got {n_bins}")
    labels = survival_labels(acc, b).to(torch.float64)
    observed = observed_mask(acc, ver, b)
    before = survival_probs(torch.sigmoid(z))
    after = survival_probs(apply_sts(z, torch.as_tensor(temperatures, dtype=torch.float64)))
    eb, ea, aucs, counts = [], [], [], []
    for k in range(b):
        obs = observed[:, k]
        if not bool(obs.any()):
            raise ValueError(
                f"position {k + 1}: no held-out round verified that many drafts; "
                "collect verify-all rollouts"
            )
        eb.append(ece(before[obs, k], labels[obs, k], n_bins))
        ea.append(ece(after[obs, k], labels[obs, k], n_bins))
        auc, n_tested = _conditional_auc(z[:, k], acc, ver, k)
        aucs.append(auc)
        counts.append(n_tested)
    return StsEvaluation(
        ece_before=tuple(eb),
        ece_after=tuple(ea),
        auc=tuple(aucs),
        num_tested=tuple(counts),
        num_samples=m,
        n_bins=n_bins,
    )


# --------------------------------------------------------------------------- #
# SGLang-compatible JSON.
# --------------------------------------------------------------------------- #


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
