"""What a run logs: the global batch's loss figures, ``log.jsonl`` and ``loss_curves.png``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from dspark_sglang.training.distributed import DistContext, all_reduce_sum
from dspark_sglang.training.losses import LossTerms


def global_figures(
    loss: torch.Tensor, terms: LossTerms, ctx: DistContext
) -> tuple[float, dict[str, float], list[float]]:
    """The logged numbers of the global batch: this process's shares summed over ranks
    (one all-reduce; with one process they are the numbers themselves, bit for bit)."""
    vec = torch.cat(
        [
            torch.stack([loss.detach(), terms.total.detach(), terms.ce, terms.l1, terms.bce])
            .detach()
            .float(),
            terms.accept_per_slot.detach().float(),
        ]
    )
    vals = all_reduce_sum(vec, ctx).tolist()
    parts = {"loss": vals[1], "ce": vals[2], "l1": vals[3], "bce": vals[4]}
    return vals[0], parts, vals[5:]


def read_log(path: Path) -> list[dict[str, Any]]:
    """The records of a ``log.jsonl`` (none if it is missing; unreadable lines skipped)."""
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out


def plot_curves(history: list[dict[str, Any]], path: Path, title: str) -> None:
    """Loss terms and per-slot expected acceptance (1 - L1/2) against step, as PNG."""
    if not history:
        return
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [r["step"] for r in history]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    for key in ("total", "ce", "l1", "bce"):
        ax1.plot(steps, [r[key] for r in history], label=key)
    ax1.set_xlabel("step")
    ax1.set_ylabel("loss")
    ax1.set_yscale("log")
    ax1.legend()
    ax1.set_title(f"{title}: loss terms")
    slots = len(history[-1]["accept_per_slot"])
    for k in range(slots):
        ax2.plot(steps, [r["accept_per_slot"][k] for r in history], label=f"slot {k}")
    ax2.set_xlabel("step")
    ax2.set_ylabel("E[accept] = 1 - L1/2")
    ax2.set_ylim(0, 1)
    ax2.legend(fontsize=7)
    ax2.set_title("expected single-token acceptance per slot")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
