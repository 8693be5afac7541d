"""The CPU speed benchmark's rows: each speculative engine against plain, per cell.

``build_rows`` pairs every cell of every repeat with plain's, ``check_row`` is a row's
contract, ``not_identical`` / ``not_lossless`` pick the greedy rows that diverged, and
``table`` is the printed summary.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from dspark_sglang.bench.cpu_speedup.grid import DSPARK, NGRAM, PLAIN, Cell, Engine
from dspark_sglang.results import spread

#: Every row has at least these keys.
ROW_KEYS = (
    "prompt_set",
    "concurrency",
    "temperature",
    "algorithm",
    "policy",
    "plain_tok_s",
    "dspark_tok_s",
    "ratio",
    "ratio_min",
    "ratio_max",
    "accept_length",
    "identical",
    "lossless",
)
NGRAM_SAMPLED_NOTE = (
    "SGLang's NGRAM verifies greedily on CPU at any temperature (eagle_sample): its outputs "
    "here are greedy continuations, not samples"
)


def _finite_or_none(x: float) -> float | None:
    return x if math.isfinite(x) else None


def build_rows(
    runs: Mapping[str, Sequence[Mapping[Cell, Any]]],
    cells: Sequence[Cell],
    speculative: Sequence[Engine],
    dtype: str = "float32",
) -> list[dict[str, Any]]:
    """One row per cell and speculative engine, against plain's same cell in the same repeat.

    ``runs[engine.label][repeat][cell]`` is what that engine produced for the cell: an
    object with ``outputs`` (token ids per request), ``num_tokens``, ``wall_s``,
    ``tokens_per_second``, ``verify_rounds``, ``correct_drafts`` and ``accept_length``
    (``demo.EngineRun``); the plain engine's greedy cells also carry ``top_tokens``, the
    target's best tokens along its outputs, which classify each divergence (``greedy_check``
    in ``dtype``, the engines' dtype).
    """
    from dspark_sglang.sglang_integration.greedy_check import find_divergences

    plain = runs.get(PLAIN)
    if not plain:
        raise ValueError("runs has no plain engine to compare against")
    n_repeats = len(plain)
    rows = []
    for cell in cells:
        for eng in speculative:
            if eng.algorithm == PLAIN:
                raise ValueError("speculative engines must not include plain")
            spec = runs.get(eng.label)
            if spec is None or len(spec) != n_repeats:
                raise ValueError(
                    f"engine {eng.label} has {0 if spec is None else len(spec)} repeats, "
                    f"plain has {n_repeats}"
                )
            per = []
            for r in range(n_repeats):
                p, s = plain[r][cell], spec[r][cell]
                if len(p.outputs) != len(s.outputs):
                    raise ValueError(
                        f"{cell.label}, repeat {r}: plain has {len(p.outputs)} outputs, "
                        f"{eng.label} {len(s.outputs)}"
                    )
                same = sum(a == b for a, b in zip(p.outputs, s.outputs, strict=True))
                divergences = []
                if cell.temperature == 0:
                    tops = p.top_tokens or tuple(() for _ in p.outputs)
                    divergences = find_divergences(p.outputs, s.outputs, tops, dtype, eng.label)
                per.append(
                    {
                        "plain_tokens": p.num_tokens,
                        "plain_wall_s": p.wall_s,
                        "plain_tok_s": p.tokens_per_second,
                        "dspark_tokens": s.num_tokens,
                        "dspark_wall_s": s.wall_s,
                        "dspark_tok_s": s.tokens_per_second,
                        "ratio": s.tokens_per_second / p.tokens_per_second,
                        "verify_rounds": s.verify_rounds,
                        "correct_drafts": s.correct_drafts,
                        "accept_length": _finite_or_none(s.accept_length),
                        "identical_outputs": same,
                        "outputs": len(p.outputs),
                        "near_ties": sum(d.near_tie for d in divergences),
                        "mismatches": sum(not d.near_tie for d in divergences),
                        "divergences": [d.describe() for d in divergences],
                    }
                )
            ratio = spread([x["ratio"] for x in per])
            plain_tps = spread([x["plain_tok_s"] for x in per])
            spec_tps = spread([x["dspark_tok_s"] for x in per])
            accept = [x["accept_length"] for x in per if x["accept_length"] is not None]
            greedy = cell.temperature == 0
            rows.append(
                {
                    "prompt_set": cell.prompt_set,
                    "concurrency": cell.concurrency,
                    "temperature": cell.temperature,
                    "algorithm": eng.algorithm,
                    "policy": eng.policy,
                    "plain_tok_s": plain_tps["median"],
                    "plain_tok_s_min": plain_tps["min"],
                    "plain_tok_s_max": plain_tps["max"],
                    "dspark_tok_s": spec_tps["median"],
                    "dspark_tok_s_min": spec_tps["min"],
                    "dspark_tok_s_max": spec_tps["max"],
                    "ratio": ratio["median"],
                    "ratio_min": ratio["min"],
                    "ratio_max": ratio["max"],
                    "accept_length": statistics.median(accept) if accept else None,
                    "identical": all(x["identical_outputs"] == x["outputs"] for x in per)
                    if greedy
                    else None,
                    "lossless": all(x["mismatches"] == 0 for x in per) if greedy else None,
                    "note": NGRAM_SAMPLED_NOTE if eng.algorithm == NGRAM and not greedy else None,
                    "repeats": per,
                }
            )
    return rows


def check_row(row: Mapping[str, Any]) -> None:
    """Raise ``ValueError`` naming the field when a row breaks the result's contract."""
    missing = [k for k in ROW_KEYS if k not in row]
    if missing:
        raise ValueError(f"row is missing {missing}")
    where = f"row {row['prompt_set']} c={row['concurrency']} T={row['temperature']}"
    if row["algorithm"] == DSPARK:
        if not isinstance(row["policy"], str) or not row["policy"]:
            raise ValueError(f"{where}: policy must name the DSPARK_MOE policy")
    elif row["algorithm"] == NGRAM:
        if row["policy"] is not None:
            raise ValueError(f"{where}: policy must be null for NGRAM")
    else:
        raise ValueError(f"{where}: algorithm must be {DSPARK} or {NGRAM}, got {row['algorithm']}")
    if not (isinstance(row["concurrency"], int) and row["concurrency"] >= 1):
        raise ValueError(f"{where}: concurrency must be an int >= 1")
    if row["temperature"] < 0:
        raise ValueError(f"{where}: temperature must be >= 0")
    for key in ("plain_tok_s", "dspark_tok_s", "ratio", "ratio_min", "ratio_max"):
        value = row[key]
        if not (isinstance(value, int | float) and math.isfinite(value) and value > 0):
            raise ValueError(f"{where}: {key} must be a positive finite number, got {value!r}")
    if not row["ratio_min"] <= row["ratio"] <= row["ratio_max"]:
        raise ValueError(f"{where}: ratio must lie in [ratio_min, ratio_max]")
    if row["accept_length"] is not None and row["accept_length"] < 1:
        raise ValueError(f"{where}: accept_length counts the bonus token, so it is >= 1")
    if row["temperature"] == 0:
        for key in ("identical", "lossless"):
            if not isinstance(row[key], bool):
                raise ValueError(f"{where}: {key} must be true or false at temperature 0")
        if row["identical"] and not row["lossless"]:
            raise ValueError(f"{where}: identical outputs are lossless; lossless must be true")
    else:
        for key in ("identical", "lossless"):
            if row[key] is not None:
                raise ValueError(f"{where}: {key} must be null at temperature > 0")


def not_identical(rows: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """Greedy rows whose outputs differed from plain's in some repeat."""
    return [r for r in rows if r["identical"] is False]


def not_lossless(rows: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """Greedy rows with a divergence from plain's outputs that is not a numerical near-tie."""
    return [r for r in rows if r["lossless"] is False]


def _fmt(x: float | None, spec: str = ".2f") -> str:
    return "-" if x is None else format(x, spec)


def table(rows: Sequence[Mapping[str, Any]]) -> str:
    """The printed table: one line per row."""
    head = (
        f"{'set':<10} {'c':>2} {'T':>4} {'engine':<19} {'plain tok/s':>11} {'spec tok/s':>10} "
        f"{'ratio':>6} {'range':>11} {'accept':>6} {'identical':>9}"
    )
    lines = [head, "-" * len(head)]
    for r in rows:
        eng = f"{r['algorithm']}/{r['policy']}" if r["policy"] else r["algorithm"]
        same = (
            "-"
            if r["identical"] is None
            else "yes"
            if r["identical"]
            else "near-ties"
            if r["lossless"]
            else "NO"
        )
        lines.append(
            f"{r['prompt_set']:<10} {r['concurrency']:>2} {r['temperature']:>4g} {eng:<19} "
            f"{r['plain_tok_s']:>11.2f} {r['dspark_tok_s']:>10.2f} {r['ratio']:>6.3f} "
            f"{r['ratio_min']:>5.3f}-{r['ratio_max']:<5.3f} {_fmt(r['accept_length']):>6} "
            f"{same:>9}"
        )
    if any(r.get("note") for r in rows):
        lines.append(f"note (NGRAM at T > 0): {NGRAM_SAMPLED_NOTE}")
    return "\n".join(lines)
