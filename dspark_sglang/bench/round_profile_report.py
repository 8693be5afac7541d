"""The round profile's figures across repeats: per-repeat results, their medians and
ranges, the verify-shape table and the printed report (``benchmarks/round_profile.py``
measures; this part reads no server)."""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from dspark_sglang.results import spread
from dspark_sglang.sglang_integration import round_profile as rp


def repeat_result(
    plain: Mapping[str, Mapping[str, float]],
    spec: Mapping[str, Mapping[str, float]],
    *,
    spec_tokens: int,
    verify_rounds: int,
) -> dict[str, Any]:
    """One repeat: the DSPARK_MOE round summary, the plain step, and their ratio.

    ``plain`` and ``spec`` are :func:`round_profile.delta`\\ s of the two engines;
    ``spec_tokens`` / ``verify_rounds`` are SGLang's counts for the same requests.
    """
    summary = rp.summarize(spec)
    step_ms, steps = rp.plain_step_ms(plain)
    for row in summary["phases"]:
        row["plain_steps"] = row["ms_per_round"] / step_ms
    tokens_per_round = spec_tokens / verify_rounds if verify_rounds else float("nan")
    ratio = summary["round_ms"] / step_ms
    return {
        **summary,
        "plain_step_ms": step_ms,
        "plain_steps": steps,
        "round_over_plain_step": ratio,
        "verify_model_forward_over_plain_step": summary["verify_model_forward_ms_per_round"]
        / step_ms,
        "tokens_per_round": tokens_per_round,
        # Tokens per unit of plain-step time: > 1 means the round pays for itself.
        "tokens_per_round_over_ratio": tokens_per_round / ratio,
        "verify_shapes": rp.verify_shapes(spec),
    }


def pooled_shapes(repeats: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The target's verify forward per shape over all repeats: calls summed, ms pooled.

    Each row also gives the ms in plain decode steps (the median plain step of the
    repeats), the unit the round's rows use.
    """
    total: dict[tuple[int, int], list[float]] = {}
    for r in repeats:
        for row in r.get("verify_shapes", ()):
            acc = total.setdefault((row["requests"], row["tokens"]), [0.0, 0])
            acc[0] += row["ms"] * row["calls"]
            acc[1] += row["calls"]
    step = statistics.median(r["plain_step_ms"] for r in repeats)
    return [
        {
            "requests": n,
            "tokens": b,
            "calls": int(calls),
            "ms": ms / calls,
            "plain_steps": ms / calls / step,
        }
        for (n, b), (ms, calls) in sorted(total.items())
    ]


def combine(repeats: Sequence[Mapping[str, Any]], tolerance: float) -> dict[str, Any]:
    """Median and range over repeats of every figure, and the sanity verdict.

    Sanity: in every repeat the unattributed remainder is within ``tolerance`` (a
    fraction) of the round, and the rows add up to the round (floating point aside).
    """
    if not repeats:
        raise ValueError("no repeats to combine")
    if not 0 < tolerance < 1:
        raise ValueError(f"--tolerance must be a fraction in (0, 1), got {tolerance}")
    names = [row["phase"] for row in repeats[0]["phases"]]
    phases = []
    for i, name in enumerate(names):
        rows = [r["phases"][i] for r in repeats]
        if any(row["phase"] != name for row in rows):
            raise ValueError(f"repeats list their phases in different orders at {name!r}")
        phases.append(
            {
                "phase": name,
                "group": rows[0]["group"],
                "label": rows[0]["label"],
                "wraps": rows[0]["wraps"],
                **{
                    key: spread([row[key] for row in rows])
                    for key in ("ms_per_round", "share", "plain_steps")
                },
            }
        )
    groups: dict[str, list[float]] = {}
    for r in repeats:
        per: dict[str, float] = {}
        for row in r["phases"]:
            per[row["group"]] = per.get(row["group"], 0.0) + row["share"]
        for g, share in per.items():
            groups.setdefault(g, []).append(share)
    unattributed = [
        next(row["share"] for row in r["phases"] if row["phase"] == "unattributed") for r in repeats
    ]
    sums = [sum(row["ms_per_round"] for row in r["phases"]) / r["round_ms"] for r in repeats]
    figures = (
        "round_ms",
        "plain_step_ms",
        "round_over_plain_step",
        "verify_model_forward_ms_per_round",
        "verify_model_forward_over_plain_step",
        "tokens_per_round",
        "tokens_per_round_over_ratio",
    )
    return {
        "phases": phases,
        "verify_by_shape": pooled_shapes(repeats),
        "group_share": {g: spread(v) for g, v in groups.items()},
        **{key: spread([r[key] for r in repeats]) for key in figures},
        "sanity": {
            "tolerance": tolerance,
            "unattributed_share": spread(unattributed),
            "rows_sum_over_round": spread(sums),
            "ok": all(abs(u) <= tolerance for u in unattributed)
            and all(abs(s - 1.0) < 1e-9 for s in sums),
        },
    }


def _rng(s: Mapping[str, float], fmt: str) -> str:
    return f"{format(s['min'], fmt)}-{format(s['max'], fmt)}"


def table(combined: Mapping[str, Any]) -> str:
    """The printed table: one row per phase, then the round, the plain step, the ratio."""
    head = (
        f"{'phase':<42} {'group':<24} {'ms/round':>9} {'range':>13} {'share':>7} "
        f"{'plain steps':>11}"
    )
    lines = [head, "-" * len(head)]
    for p in combined["phases"]:
        ms, share, steps = p["ms_per_round"], p["share"], p["plain_steps"]
        lines.append(
            f"{p['label']:<42} {p['group']:<24} {ms['median']:>9.2f} {_rng(ms, '.2f'):>13} "
            f"{100 * share['median']:>6.1f}% {steps['median']:>11.2f}"
        )
    lines.append("-" * len(head))
    r, s = combined["round_ms"], combined["plain_step_ms"]
    ratio = combined["round_over_plain_step"]
    lines.append(
        f"{'DSPARK_MOE round':<42} {'':<24} {r['median']:>9.2f} {_rng(r, '.2f'):>13} "
        f"{'100.0%':>7} {ratio['median']:>11.2f}"
    )
    lines.append(
        f"{'plain decode step':<42} {'':<24} {s['median']:>9.2f} {_rng(s, '.2f'):>13} "
        f"{'':>7} {1.0:>11.2f}"
    )
    lines.append("")
    for g, share in combined["group_share"].items():
        lines.append(f"group {g:<28} {100 * share['median']:>6.1f}% of the round")
    t, b = combined["tokens_per_round"], combined["tokens_per_round_over_ratio"]
    lines.append(
        f"round / plain step {ratio['median']:.2f} (range {_rng(ratio, '.2f')}); tokens per "
        f"round {t['median']:.2f}; tokens per plain-step time {b['median']:.2f}"
    )
    v = combined["verify_model_forward_over_plain_step"]
    lines.append(
        f"target model forward inside verify: {v['median']:.2f} plain steps "
        "(part of the target verify forward row)"
    )
    shapes = combined.get("verify_by_shape", [])
    if shapes:
        lines.append("")
        lines.append(
            "target verify forward by shape (all repeats pooled; what a cost table prices):"
        )
        lines.append(f"{'requests':>8} {'tokens':>6} {'calls':>6} {'ms':>8} {'plain steps':>11}")
        for row in shapes:
            lines.append(
                f"{row['requests']:>8} {row['tokens']:>6} {row['calls']:>6} {row['ms']:>8.2f} "
                f"{row['plain_steps']:>11.2f}"
            )
        lines.append("")
    sanity = combined["sanity"]
    u = sanity["unattributed_share"]
    lines.append(
        f"sanity: unattributed {100 * u['median']:.2f}% of the round (range "
        f"{100 * u['min']:.2f}-{100 * u['max']:.2f}%), tolerance "
        f"{100 * sanity['tolerance']:.0f}%: {'ok' if sanity['ok'] else 'FAILED'}"
    )
    return "\n".join(lines)
