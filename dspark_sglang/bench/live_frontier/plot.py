"""The live frontier's PNG: throughput against per-user speed, one panel per prompt set and
temperature."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any


def plot(result: Mapping[str, Any], path: Path) -> None:
    """One panel per prompt set and temperature: throughput (x) vs per-user speed (y), every
    engine's medians as dots and its Pareto frontier as a line (the default engine bold)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fronts = result["frontier"]
    sets = list(dict.fromkeys(f["prompt_set"] for f in fronts))
    temps = list(dict.fromkeys(f["temperature"] for f in fronts))
    engines = list(dict.fromkeys(f["engine"] for f in fronts))
    colors = {e: f"C{i % 10}" for i, e in enumerate(engines)}
    fig, axes = plt.subplots(
        len(sets), len(temps), figsize=(6.5 * len(temps), 4.6 * len(sets)), squeeze=False
    )
    for i, s in enumerate(sets):
        for j, t in enumerate(temps):
            ax = axes[i][j]
            for f in (f for f in fronts if f["prompt_set"] == s and f["temperature"] == t):
                e = f["engine"]
                rows = [
                    r
                    for r in result["rows"]
                    if (r["prompt_set"], r["temperature"], r["engine"]) == (s, t, e)
                ]
                ax.scatter(
                    [r["output_tok_s"] for r in rows],
                    [r["user_tok_s"] for r in rows],
                    s=10,
                    alpha=0.45,
                    color=colors[e],
                )
                bold = e == result.get("default_engine")
                ax.plot(
                    [p["output_tok_s"] for p in f["points"]],
                    [p["user_tok_s"] for p in f["points"]],
                    marker="o",
                    ms=3,
                    lw=2.4 if bold else 1.1,
                    color=colors[e],
                    label=f"{e} (chart default)" if bold else e,
                )
            ax.set_title(f"{s}, temperature {t:g}")
            ax.set_xlabel("throughput (output tok/s, all users)")
            ax.set_ylabel("per-user speed (tok/s/user, 1000 / median TPOT)")
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7)
    fig.suptitle("Live CPU SGLang servers, bench_serving: Pareto frontier per engine")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
