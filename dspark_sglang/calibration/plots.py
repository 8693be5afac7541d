"""Reliability diagrams for STS: predicted vs empirical prefix survival per position.

A table of ECE numbers hides *where* the head is miscalibrated (over-confident
at the top, under-confident in the middle, ...); the diagram shows it. One panel
per block position; each panel plots, per equal-width bin of predicted survival
``A_k``, the empirical survival rate before (``T = 1``) and after STS, against
the diagonal. Drawn with the Agg canvas directly (no pyplot), so it works
headless and never changes matplotlib's global backend.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import torch
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from dspark_sglang.calibration.sts import (
    apply_sts,
    ece,
    observed_mask,
    reliability_bins,
    survival_labels,
    survival_probs,
)

__all__ = ["reliability_diagram"]


def reliability_diagram(
    path: str | Path,
    logits: torch.Tensor,
    accepted: torch.Tensor,
    temperatures: Sequence[float] | torch.Tensor,
    *,
    n_bins: int = 15,
    verified: torch.Tensor | None = None,
    title: str = "STS reliability",
) -> Path:
    """Write a PNG reliability diagram (one panel per position) and return its path."""
    z = torch.as_tensor(logits).to(torch.float64)
    b = z.shape[-1]
    acc = torch.as_tensor(accepted).reshape(-1).to(torch.int64)
    ver = None if verified is None else torch.as_tensor(verified).reshape(-1).to(torch.int64)
    labels = survival_labels(acc, b).to(torch.float64)
    observed = observed_mask(acc, ver, b)
    curves = {
        "before (T=1)": survival_probs(torch.sigmoid(z)),
        "after STS": survival_probs(
            apply_sts(z, torch.as_tensor(temperatures, dtype=torch.float64))
        ),
    }

    ncols = min(b, 4)
    nrows = math.ceil(b / ncols)
    fig = Figure(figsize=(3.2 * ncols, 3.2 * nrows), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(nrows, ncols, squeeze=False)
    for k in range(nrows * ncols):
        ax = axes[k // ncols][k % ncols]
        if k >= b:
            ax.set_axis_off()
            continue
        obs = observed[:, k]
        ax.plot([0, 1], [0, 1], color="0.6", linestyle="--", linewidth=1)
        for (name, surv), marker in zip(curves.items(), ("o", "s"), strict=True):
            p, y = surv[obs, k], labels[obs, k]
            count, mp, my = reliability_bins(p, y, n_bins)
            keep = count > 0
            ax.plot(
                mp[keep].numpy(),
                my[keep].numpy(),
                marker=marker,
                markersize=3,
                linewidth=1,
                label=f"{name}: ECE {ece(p, y, n_bins):.3f}",
            )
        ax.set_xlim(0, 1)
        ax.set_ylim(0, 1)
        ax.set_title(f"position {k + 1}", fontsize=9)
        ax.set_xlabel("predicted survival", fontsize=8)
        ax.set_ylabel("empirical survival", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.legend(fontsize=7, loc="upper left")
    fig.suptitle(title, fontsize=10)
    out = Path(path)
    fig.savefig(out, dpi=100)
    return out
