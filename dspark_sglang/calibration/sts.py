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

This module holds the fit and the held-out evaluation; the metrics are in
``sts_metrics``, the labels and ``apply_sts`` in ``sts_survival``, the JSON struct
and its file in ``sts_file``. Every public name is importable from here too.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from dspark_sglang.calibration.sts_file import (
    GREEDY_STS_FILENAME,
    STS_FILENAME,
    StsCalibration,
    load_sts,
)
from dspark_sglang.calibration.sts_metrics import (
    _ece_rows,
    ece,
    reliability_bins,
    roc_auc,
)
from dspark_sglang.calibration.sts_survival import (
    _check_counts,
    apply_sts,
    observed_mask,
    survival_labels,
    survival_probs,
)

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
