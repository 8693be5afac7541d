"""Rows (median and range over the repeats), Pareto frontiers, the speed-up over the
baseline at matched throughput, and the printed table."""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, NamedTuple

from dspark_sglang.bench.live_frontier.engines import BASELINE, PLAIN
from dspark_sglang.results import fmt_or_dash

#: The figures of a row: median over the repeats, with ``<name>_range`` [min, max].
FIGURES = (
    "output_tok_s",
    "user_tok_s",
    "median_ttft_ms",
    "accept_length",
    "ratio_to_plain",
    "drafted_share",
)


class Cell(NamedTuple):
    prompt_set: str
    concurrency: int
    temperature: float


def turn_order(engines: Sequence[str], repeat: int) -> list[str]:
    """The engines' turns in every cell of ``repeat``: as given, reversed in odd repeats."""
    return list(engines) if repeat % 2 == 0 else list(reversed(engines))


def _spread(values: Iterable[float | None]) -> tuple[float | None, list[float] | None]:
    xs = [float(v) for v in values if v is not None]
    if not xs:
        return None, None
    return statistics.median(xs), [min(xs), max(xs)]


def build_rows(
    runs: Mapping[tuple[Cell, str], Sequence[Mapping[str, Any]]],
    engines: Sequence[str],
) -> list[dict[str, Any]]:
    """One row per cell and engine: each of ``FIGURES`` as the median over the repeats and
    its ``<figure>_range`` [min, max] (None where no repeat has it), and ``repeats``.

    ``runs[(cell, engine)]`` lists that engine's per-repeat figures in repeat order (what
    :func:`parse_bench_output` and :func:`cell_counters` give). ``ratio_to_plain`` is
    computed per repeat, the engine's output throughput over plain's in the same cell and
    repeat, before the median; None without a plain engine.
    """
    cells = list(dict.fromkeys(cell for cell, _ in runs))
    rows = []
    for cell in cells:
        plain = runs.get((cell, PLAIN))
        for engine in engines:
            reps = runs.get((cell, engine))
            if reps is None:
                continue
            if plain is not None and len(plain) != len(reps):
                raise ValueError(
                    f"{cell}: {engine} has {len(reps)} repeats, {PLAIN} has {len(plain)}"
                )
            per = []
            for r, rep in enumerate(reps):
                ratio = rep["output_tok_s"] / plain[r]["output_tok_s"] if plain else None
                per.append({**rep, "ratio_to_plain": ratio})
            row: dict[str, Any] = {
                "prompt_set": cell.prompt_set,
                "concurrency": cell.concurrency,
                "temperature": cell.temperature,
                "engine": engine,
            }
            for name in FIGURES:
                row[name], row[f"{name}_range"] = _spread(x.get(name) for x in per)
            row["repeats"] = per
            rows.append(row)
    return rows


class Point(NamedTuple):
    """One operating point, with the attribute names ``planning.frontier`` reads."""

    throughput: float
    user_tps_p50: float
    concurrency: int


def engine_frontier(points: Sequence[Point]) -> list[Point]:
    """The Pareto frontier of an engine's points, by increasing throughput (per-user speed
    strictly decreasing): a point is dropped when another has at least its throughput and
    per-user speed and is better in one (``planning.frontier.pareto``)."""
    from dspark_sglang.planning.frontier import pareto

    front = set(pareto(points))
    kept = sorted(
        (p for p in points if (p.throughput, p.user_tps_p50) in front),
        key=lambda p: (p.throughput, -p.user_tps_p50),
    )
    # Two concurrencies can land on the same point; keep one.
    out: list[Point] = []
    for p in kept:
        if not out or (out[-1].throughput, out[-1].user_tps_p50) != (p.throughput, p.user_tps_p50):
            out.append(p)
    return out


def matched_throughput_speedup(
    points: Sequence[Point], baseline: Sequence[Point]
) -> list[dict[str, float | None]]:
    """Per-user speed-up of ``points`` over ``baseline`` at matched throughput.

    Method: at each throughput ``T`` of the baseline's Pareto frontier, each frontier is
    read at ``T`` (``planning.frontier.speed_at_throughput``: linear in throughput between
    the two frontier points around ``T``; below a frontier's lowest throughput its fastest
    point's speed, which already serves more; none above its highest, out of reach), and
    the speed-up is the engine's per-user speed over the baseline's there (1.5 = 50 %
    faster per user at the same tokens per second in total); None where the engine's
    frontier does not reach ``T``.
    """
    from dspark_sglang.planning.frontier import pareto, speed_at_throughput

    out: list[dict[str, float | None]] = []
    for t, _ in pareto(baseline):
        mine = speed_at_throughput(points, t)
        base = speed_at_throughput(baseline, t)
        out.append(
            {
                "output_tok_s": t,
                "user_tok_s": mine,
                "baseline_user_tok_s": base,
                "speedup": mine / base if mine is not None and base else None,
            }
        )
    return out


def frontiers(rows: Sequence[Mapping[str, Any]], baseline: str = BASELINE) -> list[dict[str, Any]]:
    """Per prompt set, temperature and engine: the Pareto frontier of its rows' medians
    (``user_tok_s``, ``output_tok_s``) over the concurrencies, and ``vs_<baseline>``, its
    :func:`matched_throughput_speedup` over ``baseline`` (None without that engine)."""
    groups: dict[tuple[str, float, str], list[Point]] = {}
    for r in rows:
        key = (r["prompt_set"], r["temperature"], r["engine"])
        groups.setdefault(key, []).append(
            Point(r["output_tok_s"], r["user_tok_s"], r["concurrency"])
        )
    out = []
    for (prompt_set, temperature, engine), pts in groups.items():
        base = groups.get((prompt_set, temperature, baseline))
        vs = matched_throughput_speedup(pts, base) if base else None
        speedups = [x["speedup"] for x in vs or () if x["speedup"] is not None]
        out.append(
            {
                "prompt_set": prompt_set,
                "temperature": temperature,
                "engine": engine,
                "points": [
                    {
                        "concurrency": p.concurrency,
                        "user_tok_s": p.user_tps_p50,
                        "output_tok_s": p.throughput,
                    }
                    for p in engine_frontier(pts)
                ],
                f"vs_{baseline}": vs,
                f"speedup_vs_{baseline}_median": statistics.median(speedups) if speedups else None,
            }
        )
    return out


def table(rows: Sequence[Mapping[str, Any]]) -> str:
    """The printed summary, one line per row."""
    f = fmt_or_dash
    head = (
        f"{'set':<9} {'c':>3} {'T':>3} {'engine':<14} {'tok/s':>7} {'tok/s/user':>10} "
        f"{'TTFT ms':>8} {'accept':>6} {'vs plain':>8} {'drafted':>7}"
    )
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(
            f"{r['prompt_set']:<9} {r['concurrency']:>3} {r['temperature']:>3g} "
            f"{r['engine']:<14} {r['output_tok_s']:>7.2f} {r['user_tok_s']:>10.2f} "
            f"{r['median_ttft_ms']:>8.0f} {f(r['accept_length'], '.2f'):>6} "
            f"{f(r['ratio_to_plain'], '.3f'):>8} {f(r['drafted_share'], '.2f'):>7}"
        )
    return "\n".join(lines)
