"""Calibration metrics for STS: reliability bins, ECE and ROC AUC.

Equal-width binning (``p = 1`` in the last bin) for the reliability diagram and the
expected calibration error, a row-batched ECE that scores every candidate
temperature of a grid search at once, and the rank-statistic AUC. All in float64.
"""

from __future__ import annotations

import torch

__all__ = [
    "ece",
    "reliability_bins",
    "roc_auc",
]


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
