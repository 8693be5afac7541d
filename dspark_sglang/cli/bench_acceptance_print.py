"""``bench acceptance`` console output: the accepted-length table, gains, position table.

Prints, from an ``AcceptanceReport``, the accepted tokens per round (mean ± standard
error per eval set and macro), the first drafter's gains over the others (paired by
prompt), every ``--context-copy`` run's gain over its own drafter with its copy
acceptance, and the position-wise conditional acceptance pooled over the sets.
"""

from __future__ import annotations

from typing import Any

#: Appended to a drafter's name for its --context-copy run.
COPY_SUFFIX = "+copy"


def _fmt(x: float, digits: int = 2) -> str:
    return "-" if x != x else f"{x:.{digits}f}"


def _print_report(console: Any, report: Any) -> None:
    from rich.table import Table

    table = Table(
        title=f"accepted tokens per round (T={report.temperature:g}, all drafts verified, "
        "bonus included; mean ± s.e. over requests)"
    )
    table.add_column("drafter")
    for d in report.domains:
        table.add_column(d, justify="right")
    table.add_column("macro", justify="right")
    for name in report.drafters:
        cells = [report.cells[name][d] for d in report.domains]
        row = [f"{_fmt(c.accept_length)} ± {_fmt(c.accept_length_stderr)}" for c in cells]
        m, e = report.macro(name)
        table.add_row(name, *row, f"{_fmt(m)} ± {_fmt(e)}")
    console.print(table)
    first = report.drafters[0]
    for other in report.drafters[1:]:
        if other in report.context_copy:
            continue  # compared with its own drafter below
        parts = [
            f"{d} {report.gain(first, other, d):+.1f}% ± {report.gain_stderr(first, other, d):.1f}"
            for d in report.domains
        ]
        console.print(
            f"gain {first} vs {other} (± standard error, paired by prompt): "
            + ", ".join(parts)
            + f", macro {report.gain(first, other):+.1f}% ± {report.gain_stderr(first, other):.1f}"
        )
    for name in report.context_copy:
        base = name.removesuffix(COPY_SUFFIX)
        if base == name or base not in report.drafters:
            continue
        parts = [
            f"{d} {report.gain(name, base, d):+.1f}% ± {report.gain_stderr(name, base, d):.1f}"
            for d in report.domains
        ]
        cells = [report.cells[name][d] for d in report.domains]
        reached = sum(c.copies_reached for c in cells)
        taken = sum(c.copies_accepted for c in cells)
        rate = _fmt(taken / reached if reached else float("nan"), 3)
        console.print(
            f"context copies ({report.context_copy[name]}-gram) {name} vs {base}: "
            + ", ".join(parts)
            + f", macro {report.gain(name, base):+.1f}% ± {report.gain_stderr(name, base):.1f}; "
            f"{reached} copied drafts verified, {rate} of them accepted"
        )
    pos = Table(title="position-wise conditional acceptance (all sets pooled)")
    pos.add_column("drafter")
    b = max(report.cells[n][report.domains[0]].block_size for n in report.drafters)
    for k in range(b):
        pos.add_column(str(k + 1), justify="right")
    for name in report.drafters:
        vals = report.pooled_position_acceptance(name)
        pos.add_row(name, *[_fmt(v, 3) for v in vals], *[""] * (b - len(vals)))
    console.print(pos)
