"""One PNG for the acceptance benchmark: the paper's Table 2 as bars and Figure 2 as curves.

Left: grouped bars of accepted length per round (bonus token included) per
domain and the macro average, one colour per drafter, error bars = the
request-clustered standard error. Right: position-wise conditional acceptance
``P(draft k accepted | drafts < k accepted)``; a thick line per drafter pooled
over domains and thin lines (one style per domain) for the per-domain curves,
which is where "DFlash decays, AR stays flat, DSpark stays high" shows.
"""

from __future__ import annotations

from pathlib import Path

from dspark_sglang.bench.acceptance import AcceptanceReport

__all__ = ["plot_acceptance"]

_DOMAIN_STYLES = (":", "--", "-.", (0, (1, 3)), (0, (5, 2, 1, 2)))


def plot_acceptance(report: AcceptanceReport, path: str | Path) -> Path:
    """Write the two-panel figure to ``path`` (PNG); returns the path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    drafters, domains = report.drafters, report.domains
    groups = [*domains, "macro"]
    colors = plt.get_cmap("tab10").colors
    fig, (ax_bar, ax_pos) = plt.subplots(1, 2, figsize=(13, 4.8))

    width = 0.8 / len(drafters)
    for j, name in enumerate(drafters):
        means = [report.cells[name][d].accept_length for d in domains]
        errs = [report.cells[name][d].accept_length_stderr for d in domains]
        m, e = report.macro(name)
        means.append(m)
        errs.append(e)
        xs = [i - 0.4 + width * (j + 0.5) for i in range(len(groups))]
        errs = [0.0 if x != x else x for x in errs]  # NaN (one request): no bar
        bars = ax_bar.bar(xs, means, width, yerr=errs, capsize=3, color=colors[j % 10], label=name)
        ax_bar.bar_label(bars, fmt="%.2f", fontsize=7, padding=2)
    ax_bar.set_xticks(range(len(groups)), groups)
    ax_bar.set_ylabel("accepted tokens per round (incl. bonus)")
    b_max = max(report.cells[n][domains[0]].block_size for n in drafters)
    ax_bar.set_ylim(0, b_max + 1.5)
    ax_bar.axhline(1.0, color="grey", lw=0.8, ls=":")
    ax_bar.set_title(
        f"accepted length, T={report.temperature:g}, all drafts verified, "
        f"{report.num_prompts} prompts/set"
    )
    ax_bar.legend(fontsize=8, loc="upper right")

    for j, name in enumerate(drafters):
        color = colors[j % 10]
        pooled = report.pooled_position_acceptance(name)
        ks = list(range(1, len(pooled) + 1))
        ax_pos.plot(ks, pooled, color=color, lw=2.4, marker="o", label=name)
        for i, dom in enumerate(domains):
            curve = report.cells[name][dom].position_acceptance
            style = _DOMAIN_STYLES[i % len(_DOMAIN_STYLES)]
            ax_pos.plot(ks, curve, color=color, lw=1.0, ls=style, alpha=0.6)
    ax_pos.set_xlabel("draft position k")
    ax_pos.set_ylabel("P(accept k | accepted < k)")
    ax_pos.set_ylim(-0.02, 1.02)
    ax_pos.set_xticks(range(1, b_max + 1))
    ax_pos.set_title("position-wise conditional acceptance")
    handles = [Line2D([], [], color=colors[j % 10], lw=2.4) for j in range(len(drafters))]
    labels = [f"{n} (all domains)" for n in drafters]
    for i, dom in enumerate(domains):
        handles.append(
            Line2D([], [], color="black", lw=1.0, ls=_DOMAIN_STYLES[i % len(_DOMAIN_STYLES)])
        )
        labels.append(dom)
    ax_pos.legend(handles, labels, fontsize=7, loc="best")
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out
