"""Staircase plot: what a reviewer looks at before trusting a cost table."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from dspark_sglang.profiling.measure import Probe
from dspark_sglang.profiling.stairs import Stair
from dspark_sglang.scheduling.cost_table import SpsCostTable


def plot_staircase(
    path: Path,
    probes: Sequence[Probe],
    stairs: Sequence[Stair],
    title: str,
    node_curves: Mapping[str, Sequence[Probe]] | None = None,
    table: SpsCostTable | None = None,
) -> Path:
    """PNG of SPS(b) as the floor-lookup staircase the scheduler will use.

    Points carry the IQR of each probe as error bars; detected cliffs are shaded;
    a second panel shows tokens/s (``b * SPS``), where cliffs are easier to see.
    Individual node curves (fleet runs) are drawn thin behind the merged one.
    ``table`` (the published one, with interpolated entries) is drawn as the
    staircase when given; otherwise the probes' own floor lookup is.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if not probes:
        raise ValueError("plot_staircase needs at least one probe")
    b = [p.batch_tokens for p in probes]
    sps = [p.steps_per_sec for p in probes]
    lo = [p.steps_per_sec * p.spread / 2 for p in probes]
    fig, (ax, ax2) = plt.subplots(2, 1, figsize=(9, 7), sharex=True, height_ratios=[2, 1])
    for name, curve in (node_curves or {}).items():
        ax.step(
            [p.batch_tokens for p in curve],
            [p.steps_per_sec for p in curve],
            where="post",
            lw=0.8,
            alpha=0.5,
            label=f"node {name}",
        )
    tb, ts = (b, sps) if table is None else (table.sample_batch_tokens, table.sample_steps_per_sec)
    ax.step(tb, ts, where="post", color="black", lw=1.6, label="table (floor lookup)")
    ax.errorbar(b, sps, yerr=lo, fmt="o", ms=3, color="tab:blue", label="probe median ± IQR/2")
    for s in stairs:
        ax.axvspan(s.lo_tokens, s.hi_tokens, color="tab:red", alpha=0.15 if s.resolved else 0.07)
    ax.set_xscale("log", base=2)
    ax.set_ylabel("engine steps / s")
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    ax2.plot(b, [x * y for x, y in zip(b, sps, strict=True)], "o-", ms=3, color="tab:green")
    for s in stairs:
        ax2.axvspan(s.lo_tokens, s.hi_tokens, color="tab:red", alpha=0.15)
    ax2.set_xlabel("forward batch size (tokens)")
    ax2.set_ylabel("tokens / s")
    ax2.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp.png")
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    tmp.replace(path)
    return path
