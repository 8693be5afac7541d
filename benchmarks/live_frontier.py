"""Throughput vs per-user speed per verify policy: live CPU SGLang servers, SGLang's own client.

Why: the open question is whether DSpark is ever slower than plain decoding for the traffic a
tier serves. This measures it the way a user would: one ``python -m sglang.launch_server``
per engine, started as the chart's default tier starts it, driven by SGLang's own
``python -m sglang.bench_serving --backend sglang`` over a mixed prompt file, at several
concurrencies and temperatures; then, per engine, the Pareto frontier of (per-user speed,
throughput) and its per-user speed-up over ``mtp1`` at matched throughput.

Servers. Every engine of ``--engines`` is its own ``sglang.launch_server`` process
(``sglang_integration.server.cpu_server``: the project's CPU engine flags, bound to
127.0.0.1, stopped by PID with its children), all started once, one after the other, at the
beginning and stopped at the end; an idle one sleeps (SGLang's ``--sleep-on-idle``), so the
one being measured has the cores. The tier is the chart's default one, the first of
``slaTiers`` in ``--values`` (``helm/dspark-sglang/values.yaml``): its
``maxRunningRequests`` is ``--max-running-requests`` of every server, its scheduler values
(chart keys in camelCase become the scheduler config's snake_case keys, as the chart's
``dspark.schedulerConfig`` writes them) are every DSPARK_MOE engine's scheduler config
with the engine's policy put in, and ``--enable-metrics`` is on. What the CPU needs
instead of the cluster's files: the embedded SmolLM2 target and drafter (``--drafter``),
the drafter's STS file, a cost table measured by the worker at start-up unless
``--cost-table`` names one (then it is also SGLang's ``--speculative-dspark-sps-table-path``,
as the chart passes its table), ``ragged_mode: compact`` unless the tier sets one (a CPU
engine captures no graphs; the demo's rule), ``--dtype auto`` (``cpu_dtype``: bfloat16
where the CPU has native bf16 matrix instructions, else float32) and a smaller KV pool
(``--max-total-tokens``: all servers are alive together; each took about 2.2 GB PSS on the
2-core benchmark machine in bfloat16, so the eight fill ~18 GB of its 24 GB:
``server_memory`` in the JSON records it). The engines:

* ``plain``: no speculation (the same server without the DSPARK_MOE flags);
* ``sglang``: DSPARK_MOE with no scheduler config, SGLang's own decision (the whole block);
* ``mtp1``, ``lagged``, ``prefix``: that policy; ``whole_block``: policy ``verify_all``;
* ``prefix+priced``, ``lagged+priced``: the same policies with ``draft_decision: priced``
  (a step drafts only where a drafting round is priced above a plain step).

``default_engine`` in the JSON is the engine the chart's default tier runs: its policy
(``verify_all`` is ``whole_block``), ``+priced`` when its ``draftDecision`` is ``priced``.

Client. A cell is a prompt set (``--prompt-set``: ``all`` of
``benchmarks/data/mixed_prompts.json``, or ``math_code``, its ``gsm8k-`` and ``humaneval-``
items) x a concurrency (``--concurrency``, bench_serving's ``--max-concurrency``, every
request sent at once otherwise) x a temperature. Each engine runs each cell once per
repeat as one ``bench_serving`` subprocess: ``--dataset-name sharegpt``, ``--num-prompts``
(default ``max(8, 2 x concurrency)``), ``--sharegpt-output-len`` (``--output-len``, EOS
ignored, bench_serving's default), ``--temperature``, ``--seed`` (``--seed`` + repeat: the
same prompts for every engine in a repeat, other prompts in the next), ``--flush-cache`` (a
cold radix cache: TTFT includes the prefill) and ``--warmup-requests 0`` (each server got an
untimed warm-up per temperature after start-up instead, so the server's counters read
around a cell hold the cell only), ``--output-file`` (JSONL) for the figures: output
throughput, median TPOT (per-user speed = 1000 / median TPOT ms) and median TTFT. The
accepted length per verify round (bonus token included) and the share of request-steps
that drafted come from the server's ``/metrics`` read right before and after the cell:
``dspark_accepted_length`` (sum / count of the cell's rounds) and
``dspark_draft_request_steps_total{drafted="true"|"false"}``; null where the server has no
such series (plain decoding; a worker without the counter). bench_serving's own accept
length (``/server_info``, SGLang's counter since the cell's flush, updated every decode log
interval) is kept beside it in ``repeats``. Within a repeat the cells run in turn and, in
each cell, the engines take turns in ``--engines`` order (plain first), reversed in odd
repeats, so the machine's drift hits every engine of a cell alike.

JSON (``--out``, default a fresh run folder): ``rows``, one per (prompt set, concurrency,
temperature, engine): ``output_tok_s``, ``user_tok_s``, ``median_ttft_ms``,
``accept_length``, ``ratio_to_plain`` (the engine's output throughput over plain's in the
same cell and repeat) and ``drafted_share``, each the median over the repeats with its
``<name>_range`` [min, max], and ``repeats`` (every repeat's raw figures);
``default_engine``; ``machine``; ``settings``; ``frontier`` (:func:`frontiers`). A PNG of
the frontiers goes beside it (``--plot``).

Usage: ``python benchmarks/live_frontier.py [--engines plain mtp1 ...] [--concurrency 1 2 4
8 16 32] [--temperatures 0 1] [--repeats 3] [--num-prompts N] [--output-len 64]
[--prompt-set all math_code] [--out FILE]``. The full grid (8 engines x 24 cells x 3
repeats) runs for many hours on 2 cores; a smoke run: ``--engines plain prefix
--concurrency 1 2 --temperatures 0 --repeats 1 --num-prompts 4``.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata as md
import inspect
import json
import math
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from dspark_sglang.sglang_integration.demo import PRICED_SUFFIX

REPO = Path(__file__).resolve().parents[1]
DEFAULT_PROMPTS = REPO / "benchmarks" / "data" / "mixed_prompts.json"
DEFAULT_VALUES = REPO / "helm" / "dspark-sglang" / "values.yaml"

PLAIN = "plain"
#: The engine the frontier's matched-throughput speed-ups are measured against.
BASELINE = "mtp1"
PRICED = PRICED_SUFFIX  # one name for a priced engine, as the demo and cpu_speedup use
#: Every engine, in the default turn order (plain first).
ENGINES = (
    PLAIN,
    "mtp1",
    "whole_block",
    "sglang",
    "lagged",
    "prefix",
    "prefix+priced",
    "lagged+priced",
)
#: Prompt set -> the id prefixes it keeps from the prompt file (empty: every item).
PROMPT_SETS: dict[str, tuple[str, ...]] = {"all": (), "math_code": ("gsm8k-", "humaneval-")}
#: The figures of a row: median over the repeats, with ``<name>_range`` [min, max].
FIGURES = (
    "output_tok_s",
    "user_tok_s",
    "median_ttft_ms",
    "accept_length",
    "ratio_to_plain",
    "drafted_share",
)
ACCEPTED = "dspark_accepted_length"
DRAFT_STEPS = "dspark_draft_request_steps_total"
#: The chart's tier key that is a server flag, not a scheduler-config key.
ADMISSION_KEY = "maxRunningRequests"


# --------------------------------------------------------------------------- engines


def engine_policy(engine: str) -> tuple[str | None, bool]:
    """``(policy, priced)`` of a DSPARK_MOE engine: None is SGLang's own decision (no config)."""
    if engine not in ENGINES or engine == PLAIN:
        raise ValueError(f"{engine!r} is not a DSPARK_MOE engine of {ENGINES}")
    from dspark_sglang.sglang_integration.launch import SGLANG_DECISION

    if engine == SGLANG_DECISION:
        return None, False
    priced = engine.endswith(PRICED)
    base = engine.removesuffix(PRICED)
    return ("verify_all" if base == "whole_block" else base), priced


def default_engine(scheduler_values: Mapping[str, Any]) -> str:
    """The engine a chart tier runs: its policy (``verify_all`` is ``whole_block``), with
    ``+priced`` when its ``draftDecision`` is ``priced``."""
    policy = str(scheduler_values["policy"])
    name = "whole_block" if policy == "verify_all" else policy
    return name + PRICED if scheduler_values.get("draftDecision") == "priced" else name


def default_tier(values: Mapping[str, Any]) -> Mapping[str, Any]:
    """The chart's default tier: the first of ``slaTiers``."""
    tiers = values.get("slaTiers")
    if not isinstance(tiers, list) or not tiers:
        raise ValueError("the values file has no slaTiers list")
    return tiers[0]


def _snake(key: str) -> str:
    return re.sub(r"(?<!^)([A-Z])", r"_\1", key).lower()


def tier_config_fields(tier: Mapping[str, Any]) -> dict[str, Any]:
    """The tier's scheduler values as scheduler-config fields (``lagSteps`` -> ``lag_steps``),
    with ``sla_name`` the tier's name; ``maxRunningRequests`` is a server flag, left out."""
    fields = {_snake(k): v for k, v in tier["scheduler"].items() if k != ADMISSION_KEY}
    return {**fields, "sla_name": str(tier["name"])}


def engine_config_fields(
    engine: str,
    tier_fields: Mapping[str, Any],
    sts_path: str | None,
    cost_table: str | None,
) -> dict[str, Any] | None:
    """The scheduler config of a DSPARK_MOE engine (None: SGLang's own decision).

    The tier's fields with the engine's policy; keys the policy does not read are dropped
    (the config refuses them); ``draft_decision: priced`` for ``*+priced`` engines (every
    other engine runs without the key, the config's default ``always``); ``ragged_mode:
    compact`` unless the tier sets one (``verify_all`` runs SGLang's static mode, no
    confidences, so no STS either).
    """
    from dspark_sglang.scheduling.config import NEEDS_COST_TABLE

    policy, priced = engine_policy(engine)
    if policy is None:
        return None
    fields = {**tier_fields, "policy": policy}
    drop = {"draft_decision", "probe_every"}
    if policy not in NEEDS_COST_TABLE:
        drop |= {"draft_step_seconds", "copy_confidence"}
    if policy != "static":
        drop.add("static_k")
    if policy == "verify_all":
        drop.add("ragged_mode")
    if priced:
        drop.discard("draft_decision")
        drop.discard("probe_every")
        fields["draft_decision"] = "priced"
    fields = {k: v for k, v in fields.items() if k not in drop}
    if policy != "verify_all":
        fields.setdefault("ragged_mode", "compact")
        fields["sts_path"] = sts_path
    fields["cost_table_path"] = cost_table
    return fields


# --------------------------------------------------------------------------- prompts


def select_prompts(items: Sequence[Mapping[str, Any]], prompt_set: str) -> list[Mapping[str, Any]]:
    """The items of ``prompt_set`` (``PROMPT_SETS``), in file order."""
    if prompt_set not in PROMPT_SETS:
        raise ValueError(f"unknown prompt set {prompt_set!r}; choose one of {list(PROMPT_SETS)}")
    prefixes = PROMPT_SETS[prompt_set]
    return [it for it in items if not prefixes or str(it.get("id", "")).startswith(prefixes)]


def num_prompts(concurrency: int, given: int | None = None) -> int:
    """Prompts per cell: ``given``, else ``max(8, 2 x concurrency)`` (each of the
    ``concurrency`` slots serves at least two requests, so the cell has a steady middle)."""
    return given if given is not None else max(8, 2 * concurrency)


# --------------------------------------------------------------------------- the client


def bench_command(
    base_url: str,
    dataset: Path,
    tokenizer: str,
    *,
    prompts: int,
    concurrency: int,
    temperature: float,
    output_len: int,
    seed: int,
    output_file: Path,
    python: str = sys.executable,
) -> list[str]:
    """SGLang's client, ``python -m sglang.bench_serving --backend sglang``, for one cell."""
    return [
        python,
        "-m",
        "sglang.bench_serving",
        "--backend",
        "sglang",
        "--base-url",
        base_url,
        "--model",
        tokenizer,
        "--tokenizer",
        tokenizer,
        "--dataset-name",
        "sharegpt",
        "--dataset-path",
        str(dataset),
        "--num-prompts",
        str(prompts),
        "--sharegpt-output-len",
        str(output_len),
        "--max-concurrency",
        str(concurrency),
        "--temperature",
        f"{temperature:g}",
        "--seed",
        str(seed),
        "--flush-cache",
        "--warmup-requests",
        "0",
        "--disable-tqdm",
        "--output-file",
        str(output_file),
    ]


def parse_bench_output(text: str) -> dict[str, Any]:
    """The figures of bench_serving's ``--output-file`` (JSONL, one line per run: the last
    counts): output throughput, median TPOT and TTFT, completed requests, its accept length.

    ``ValueError`` when the file holds no result, a figure is missing, no request
    completed, or the median TPOT is not positive (no per-user speed).
    """
    lines = [ln for ln in text.splitlines() if ln.strip()]
    if not lines:
        raise ValueError("bench_serving wrote no result line")
    doc = json.loads(lines[-1])
    need = ("completed", "output_throughput", "median_tpot_ms", "median_ttft_ms", "duration")
    missing = [k for k in need if doc.get(k) is None]
    if missing:
        raise ValueError(f"bench_serving's result has no {missing}")
    if doc["completed"] < 1:
        raise ValueError("bench_serving completed no request")
    tpot = float(doc["median_tpot_ms"])
    if not tpot > 0:
        raise ValueError(f"bench_serving's median TPOT is {tpot} ms: no per-user speed")
    accept = doc.get("accept_length")
    return {
        "completed": int(doc["completed"]),
        "total_output_tokens": doc.get("total_output_tokens"),
        "duration_s": float(doc["duration"]),
        "output_tok_s": float(doc["output_throughput"]),
        "median_tpot_ms": tpot,
        "user_tok_s": 1000.0 / tpot,
        "median_ttft_ms": float(doc["median_ttft_ms"]),
        "bench_accept_length": None if accept is None else float(accept),
    }


# --------------------------------------------------------------------------- server counters

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def parse_prometheus(text: str) -> Samples:
    """Every sample of a ``/metrics`` page: ``(sample name, labels) -> value``."""
    from prometheus_client.parser import text_string_to_metric_families

    out: Samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, frozenset(s.labels.items()))] = float(s.value)
    return out


def sample_sum(samples: Samples, name: str, **labels: str) -> float | None:
    """Sum of ``name``'s samples whose labels include ``labels``; None if it has none."""
    want = set(labels.items())
    values = [v for (n, lab), v in samples.items() if n == name and want <= lab]
    return sum(values) if values else None


def _delta(before: Samples, after: Samples, name: str, **labels: str) -> float | None:
    a = sample_sum(after, name, **labels)
    if a is None:
        return None
    return a - (sample_sum(before, name, **labels) or 0.0)


def cell_counters(before: Samples, after: Samples) -> dict[str, float | None]:
    """What a server's counters say about the cell between two ``/metrics`` reads.

    ``accept_length``: tokens per request per verify round (accepted drafts + bonus) over
    the cell's rounds (``dspark_accepted_length`` sum / count); ``drafted_share``: the share
    of request-steps that ran the draft pass (``dspark_draft_request_steps_total``, label
    ``drafted``). None where the series is absent or counted nothing.
    """
    total = _delta(before, after, ACCEPTED + "_sum")
    rounds = _delta(before, after, ACCEPTED + "_count")
    drafted = _delta(before, after, DRAFT_STEPS, drafted="true")
    skipped = _delta(before, after, DRAFT_STEPS, drafted="false")
    steps = None if drafted is None and skipped is None else (drafted or 0.0) + (skipped or 0.0)
    return {
        "accept_length": total / rounds if total is not None and rounds else None,
        "drafted_share": (drafted or 0.0) / steps if steps else None,
    }


# --------------------------------------------------------------------------- rows


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


# --------------------------------------------------------------------------- frontier


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


# --------------------------------------------------------------------------- arguments


def parser() -> argparse.ArgumentParser:
    from dspark_sglang.targets.smollm2 import DEFAULT_DRAFTER_DIR

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--engines",
        nargs="+",
        choices=ENGINES,
        default=list(ENGINES),
        help="engines, in turn order (plain is required: every ratio is against it)",
    )
    ap.add_argument("--concurrency", nargs="+", type=int, default=[1, 2, 4, 8, 16, 32])
    ap.add_argument("--temperatures", nargs="+", type=float, default=[0.0, 1.0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument(
        "--num-prompts",
        type=int,
        default=None,
        help="requests per cell (default: max(8, 2 x concurrency))",
    )
    ap.add_argument("--output-len", type=int, default=64, help="tokens per request (EOS ignored)")
    ap.add_argument("--prompt-set", nargs="+", choices=list(PROMPT_SETS), default=list(PROMPT_SETS))
    ap.add_argument("--prompts", type=Path, default=DEFAULT_PROMPTS, help="ShareGPT prompt file")
    ap.add_argument(
        "--values", type=Path, default=DEFAULT_VALUES, help="chart values: the first slaTiers entry"
    )
    ap.add_argument("--drafter", type=Path, default=DEFAULT_DRAFTER_DIR)
    ap.add_argument(
        "--cost-table",
        type=Path,
        default=None,
        help="SPS cost table for every DSPARK_MOE server (default: each prefix/lagged worker "
        "measures one at start-up)",
    )
    ap.add_argument("--dtype", choices=("auto", "float32", "bfloat16"), default="auto")
    ap.add_argument("--threads", type=int, default=1, help="OpenMP threads per server")
    ap.add_argument("--mem-fraction-static", type=float, default=0.25)
    ap.add_argument(
        "--max-total-tokens",
        type=int,
        default=8192,
        help="KV pool cap in tokens, every server (all of them are alive together)",
    )
    ap.add_argument("--seed", type=int, default=0, help="bench_serving's seed in repeat 0")
    ap.add_argument(
        "--cell-timeout", type=float, default=1800.0, help="seconds one bench_serving may take"
    )
    ap.add_argument(
        "--out",
        type=Path,
        default=None,
        help="result JSON (default: live_frontier.json in a fresh run folder, "
        "<cache>/runs/bench/live_frontier-<UTC time>/)",
    )
    ap.add_argument("--plot", type=Path, default=None, help="PNG (default: beside --out)")
    return ap


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    ap = parser()
    args = ap.parse_args(argv)
    for name in ("repeats", "output_len", "threads", "max_total_tokens"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.output_len < 4:
        ap.error("--output-len must be >= 4 (bench_serving's sharegpt minimum)")
    for flag, values in (
        ("--engines", args.engines),
        ("--concurrency", args.concurrency),
        ("--temperatures", args.temperatures),
        ("--prompt-set", args.prompt_set),
    ):
        if len(set(values)) != len(values):
            ap.error(f"{flag} lists a value twice: {values}")
    if PLAIN not in args.engines:
        ap.error(f"--engines must include {PLAIN}: every ratio_to_plain is against it")
    if min(args.concurrency) < 1:
        ap.error(f"--concurrency levels must be >= 1, got {args.concurrency}")
    if min(args.temperatures) < 0 or not all(math.isfinite(t) for t in args.temperatures):
        ap.error(f"--temperatures must be finite and >= 0, got {args.temperatures}")
    if args.num_prompts is not None and args.num_prompts < max(args.concurrency):
        ap.error(
            f"--num-prompts {args.num_prompts} cannot keep {max(args.concurrency)} requests "
            "in flight: give at least the highest --concurrency"
        )
    if not 0 < args.mem_fraction_static < 1:
        ap.error(f"--mem-fraction-static must be in (0, 1), got {args.mem_fraction_static}")
    for flag, value in (("--prompts", args.prompts), ("--values", args.values)):
        if not value.is_file():
            ap.error(f"{flag} {value}: no such file")
    if args.cost_table is not None and not args.cost_table.is_file():
        ap.error(f"--cost-table {args.cost_table}: no such file")
    return args


# --------------------------------------------------------------------------- servers


@dataclass(frozen=True)
class Plan:
    """Everything the servers and the client need, checked before any server starts."""

    specs: dict[str, Any]  # engine -> CpuEngineSpec
    configs: dict[str, dict[str, Any] | None]  # engine -> scheduler config fields
    tier: Mapping[str, Any]
    default_engine: str
    drafter: Path
    dtype: Any


def plan_servers(args: argparse.Namespace, model_path: Path, workdir: Path) -> Plan:
    """The chart's default tier (``--values``) turned into one server spec per engine."""
    import yaml
    from rich.console import Console

    from dspark_sglang.scheduling.config import SchedulerConfig, num_draft_tokens
    from dspark_sglang.sglang_integration.cpu_dtype import choose_cpu_dtype, read_cpuinfo
    from dspark_sglang.sglang_integration.demo import resolve_drafter
    from dspark_sglang.sglang_integration.engine import CpuEngineSpec
    from dspark_sglang.sglang_integration.launch import (
        check_block_size,
        drafter_block_size,
        drafter_sts,
        scheduler_env,
    )
    from dspark_sglang.targets.smollm2 import DEFAULT_DRAFTER_DIR

    console = Console(stderr=True)
    dtype = choose_cpu_dtype(args.dtype, read_cpuinfo() if args.dtype == "auto" else None)
    console.print(dtype.describe(), highlight=False)
    tier = default_tier(yaml.safe_load(args.values.read_text(encoding="utf-8")))
    fields = tier_config_fields(tier)
    greedy_only = bool(fields.get("greedy_only", False))
    if greedy_only and max(args.temperatures) > 0:
        raise ValueError(
            f"the default tier {tier['name']!r} is greedyOnly: it answers sampled requests "
            "with HTTP 400; give --temperatures 0"
        )
    given = None if args.drafter == DEFAULT_DRAFTER_DIR else args.drafter
    drafter, trained = resolve_drafter(
        model_path, given, DEFAULT_DRAFTER_DIR, args.seed, workdir, console
    )
    if not trained:
        raise ValueError(
            "no trained drafter: a speed benchmark of an untrained one measures nothing"
        )
    block = drafter_block_size(drafter)
    sts = drafter_sts(drafter, greedy_only=greedy_only)
    cost_table = str(args.cost_table.resolve()) if args.cost_table else None
    base: dict[str, Any] = {
        "dtype": dtype.dtype,
        "mem_fraction_static": args.mem_fraction_static,
        "max_total_tokens": args.max_total_tokens,
        "random_seed": args.seed,
        "sleep_on_idle": True,
        "enable_metrics": True,
        "max_running_requests": int(tier["scheduler"][ADMISSION_KEY]),
    }
    specs: dict[str, Any] = {}
    configs: dict[str, dict[str, Any] | None] = {}
    for engine in args.engines:
        overrides = dict(base)
        env: dict[str, str] = {}
        if engine != PLAIN:
            cfg_fields = engine_config_fields(engine, fields, str(sts) if sts else None, cost_table)
            path = None
            if cfg_fields is not None:
                try:
                    cfg = SchedulerConfig.from_dict(cfg_fields, source=f"engine {engine}")
                except ValueError as exc:  # e.g. a key this checkout's config does not know
                    raise ValueError(f"{exc}; leave the engine out with --engines") from exc
                check_block_size(cfg, f"the default tier {tier['name']!r}", block)
                path = workdir / f"scheduler-{engine}.yaml"
                cfg.save(path)
                configs[engine] = cfg.to_dict()
            else:
                configs[engine] = None
            overrides |= {
                "speculative_algorithm": "DSPARK_MOE",
                "speculative_draft_model_path": str(drafter),
                "speculative_num_draft_tokens": num_draft_tokens(block),
            }
            if cost_table:
                overrides["speculative_dspark_sps_table_path"] = cost_table
            env = scheduler_env(path, greedy_draft=greedy_only)
        specs[engine] = CpuEngineSpec(
            model_path=str(model_path), overrides=overrides, env=env, omp_threads=args.threads
        )
    return Plan(specs, configs, tier, default_engine(tier["scheduler"]), drafter, dtype)


def _get(url: str, timeout: float = 30.0) -> str:
    import urllib.request

    with urllib.request.urlopen(url, timeout=timeout) as r:
        return str(r.read().decode())


def _memory_mb(pid: int) -> dict[str, float]:
    """RSS and PSS (shared pages split between their users) of a server's process tree, MB:
    the PSS sum is what the servers alive together take from the machine."""
    import psutil

    with contextlib.suppress(psutil.Error):
        root = psutil.Process(pid)
        full = [p.memory_full_info() for p in (root, *root.children(recursive=True))]
        return {
            "rss_mb": sum(f.rss for f in full) / 2**20,
            "pss_mb": sum(getattr(f, "pss", f.rss) for f in full) / 2**20,
        }
    return {"rss_mb": math.nan, "pss_mb": math.nan}


def run_cell(
    base_url: str,
    dataset: Path,
    tokenizer: str,
    cell: Cell,
    *,
    prompts: int,
    output_len: int,
    seed: int,
    timeout: float,
    workdir: Path,
    tag: str,
) -> dict[str, Any]:
    """One bench_serving run of ``cell`` against one server, with the server's counters."""
    before = parse_prometheus(_get(base_url + "/metrics"))
    out_file = workdir / f"{tag}.jsonl"
    log = workdir / f"{tag}.log"
    cmd = bench_command(
        base_url,
        dataset,
        tokenizer,
        prompts=prompts,
        concurrency=cell.concurrency,
        temperature=cell.temperature,
        output_len=output_len,
        seed=seed,
        output_file=out_file,
    )
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    with log.open("wb") as f:
        proc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env=env, timeout=timeout)
    if proc.returncode != 0 or not out_file.is_file():
        raise RuntimeError(
            f"bench_serving exited {proc.returncode} ({' '.join(cmd)}):\n"
            + log.read_text(errors="replace")[-3000:]
        )
    figures = parse_bench_output(out_file.read_text(encoding="utf-8"))
    if figures["completed"] != prompts:
        raise RuntimeError(
            f"bench_serving completed {figures['completed']} of {prompts} requests ({log})"
        )
    after = parse_prometheus(_get(base_url + "/metrics"))
    counters = cell_counters(before, after)
    if counters["accept_length"] is None:
        counters["accept_length"] = figures["bench_accept_length"]
    return {**figures, **counters, "seed": seed}


def grid(args: argparse.Namespace) -> list[Cell]:
    """Every cell, in the order a repeat runs them: prompt set, temperature, concurrency."""
    return [
        Cell(s, c, float(t))
        for s in args.prompt_set
        for t in args.temperatures
        for c in args.concurrency
    ]


def write_prompt_sets(
    items: Sequence[Mapping[str, Any]], args: argparse.Namespace, workdir: Path
) -> dict[str, Path]:
    """Each prompt set of ``--prompt-set`` as its own ShareGPT file for bench_serving;
    ``ValueError`` naming the flags when a set has fewer prompts than a cell sends."""
    out: dict[str, Path] = {}
    need = max(num_prompts(c, args.num_prompts) for c in args.concurrency)
    for s in args.prompt_set:
        chosen = select_prompts(items, s)
        if len(chosen) < need:
            raise ValueError(
                f"prompt set {s} has {len(chosen)} prompts in {args.prompts}, a cell sends "
                f"{need}: lower --num-prompts or --concurrency"
            )
        out[s] = workdir / f"prompts-{s}.json"
        out[s].write_text(json.dumps(chosen), encoding="utf-8")
    return out


def start_servers(
    stack: contextlib.ExitStack, plan: Plan, engines: Sequence[str], workdir: Path
) -> tuple[dict[str, Any], dict[str, float]]:
    """Start every engine's server, one after the other (each stopped, by PID, when
    ``stack`` closes); ``({engine: RunningServer}, {engine: start-up s})``."""
    from dspark_sglang.sglang_integration.server import cpu_server

    servers: dict[str, Any] = {}
    startup: dict[str, float] = {}
    for engine in engines:
        print(f"starting {engine} (python -m sglang.launch_server) ...", flush=True)
        t0 = time.monotonic()
        try:
            servers[engine] = stack.enter_context(
                cpu_server(plan.specs[engine], workdir / f"server-{engine}.log")
            )
        except (RuntimeError, TimeoutError) as exc:
            raise RuntimeError(
                f"the {engine} server did not start (leave it out with --engines): {exc}"
            ) from exc
        startup[engine] = time.monotonic() - t0
        print(f"  {engine} at {servers[engine].base_url} in {startup[engine]:.0f} s", flush=True)
    return servers, startup


def warm_up(servers: Mapping[str, Any], temperatures: Sequence[float]) -> None:
    """One short untimed request per server and temperature (first-use costs)."""
    from dspark_sglang.sglang_integration.server import post_json

    for srv in servers.values():
        for t in temperatures:
            params = {"temperature": t, "max_new_tokens": 8}
            post_json(srv.base_url + "/generate", {"text": "Hello", "sampling_params": params})


def measure(
    servers: Mapping[str, Any],
    args: argparse.Namespace,
    datasets: Mapping[str, Path],
    tokenizer: str,
    workdir: Path,
) -> dict[tuple[Cell, str], list[dict[str, Any]]]:
    """Every repeat, cell and engine (``turn_order``): ``{(cell, engine): [per repeat]}``."""
    cells = grid(args)
    total = len(cells) * len(args.engines) * args.repeats
    runs: dict[tuple[Cell, str], list[dict[str, Any]]] = {}
    done = 0
    for rep in range(args.repeats):
        for cell in cells:
            for engine in turn_order(args.engines, rep):
                done += 1
                tag = f"r{rep}-{cell.prompt_set}-c{cell.concurrency}-t{cell.temperature:g}-{engine}"
                try:
                    fig = run_cell(
                        servers[engine].base_url,
                        datasets[cell.prompt_set],
                        tokenizer,
                        cell,
                        prompts=num_prompts(cell.concurrency, args.num_prompts),
                        output_len=args.output_len,
                        seed=args.seed + rep,
                        timeout=args.cell_timeout,
                        workdir=workdir,
                        tag=tag,
                    )
                except subprocess.TimeoutExpired as exc:
                    raise RuntimeError(f"{tag}: bench_serving ran past --cell-timeout") from exc
                except (RuntimeError, ValueError) as exc:
                    raise RuntimeError(f"{tag}: {exc}") from exc
                runs.setdefault((cell, engine), []).append(fig)
                acc = fig["accept_length"]
                print(
                    f"[{done}/{total}] {tag}: {fig['output_tok_s']:.2f} tok/s, "
                    f"{fig['user_tok_s']:.2f} tok/s/user, TTFT {fig['median_ttft_ms']:.0f} ms"
                    + (f", accept {acc:.2f}" if acc is not None else ""),
                    flush=True,
                )
    return runs


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("SGLANG_USE_CPU_ENGINE", "1")  # before anything imports sglang
    from dspark_sglang.profiling.hardware import detect_fingerprint
    from dspark_sglang.results import default_out, dump_json, software_versions
    from dspark_sglang.targets.smollm2 import ensure_smollm2

    model_path = Path(ensure_smollm2())
    items = json.loads(args.prompts.read_text(encoding="utf-8"))
    out = args.out or default_out("live_frontier", "live_frontier.json")
    png = args.plot or out.with_suffix(".png")
    memory: dict[str, dict[str, dict[str, float]]] = {}
    with tempfile.TemporaryDirectory(prefix="live_frontier-") as tmp:
        work = Path(tmp)
        try:
            datasets = write_prompt_sets(items, args, work)
            plan = plan_servers(args, model_path, work)
        except (ValueError, OSError) as exc:
            print(f"live_frontier: error: {exc}", file=sys.stderr)
            return 2
        loadavg_start = os.getloadavg()
        try:
            with contextlib.ExitStack() as stack:
                servers, startup = start_servers(stack, plan, args.engines, work)
                warm_up(servers, args.temperatures)
                memory = {e: {"after_start": _memory_mb(s.pid)} for e, s in servers.items()}
                runs = measure(servers, args, datasets, str(model_path), work)
                for engine, srv in servers.items():
                    memory[engine]["at_end"] = _memory_mb(srv.pid)
                print("stopping the servers", flush=True)
        except RuntimeError as exc:
            print(f"live_frontier: error: {exc}", file=sys.stderr)
            return 2
    rows = build_rows(runs, args.engines)
    machine = detect_fingerprint("cpu")
    result: dict[str, Any] = {
        "benchmark": "live_frontier",
        "default_engine": plan.default_engine,
        "machine": {
            "cpu_model": machine.device_name,
            "cores": machine.device_count,
            "isa": machine.runtime,
            "kernel": machine.driver,
        },
        "settings": {
            "engines": args.engines,
            "concurrency": args.concurrency,
            "temperatures": args.temperatures,
            "repeats": args.repeats,
            "num_prompts": {c: num_prompts(c, args.num_prompts) for c in args.concurrency},
            "output_len": args.output_len,
            "prompt_sets": {s: list(PROMPT_SETS[s]) or "every item" for s in args.prompt_set},
            "prompts_file": str(args.prompts),
            "values_file": str(args.values),
            "tier": dict(plan.tier),
            "scheduler_configs": plan.configs,
            "server_flags": {e: dict(s.server_kwargs()) for e, s in plan.specs.items()},
            "server_env": {e: dict(s.env) for e, s in plan.specs.items()},
            "drafter": str(plan.drafter),
            "dtype": plan.dtype.dtype,
            "dtype_reason": plan.dtype.describe(),
            "threads_per_server": args.threads,
            "cost_table": str(args.cost_table) if args.cost_table else None,
            "client": "python -m sglang.bench_serving --backend sglang --dataset-name sharegpt "
            "--sharegpt-output-len OUTPUT_LEN --max-concurrency C --temperature T --seed "
            "SEED+REPEAT --flush-cache --warmup-requests 0 (EOS ignored)",
            "order": "servers started once, one after the other, all alive (sleep-on-idle); "
            "one untimed warm-up per server and temperature; per repeat the cells in turn "
            "(prompt set, temperature, concurrency) and in each cell the engines in "
            "--engines order, reversed in odd repeats",
            "counters": "accept_length and drafted_share from the server's /metrics read "
            "before and after each cell (dspark_accepted_length sum / count; "
            "dspark_draft_request_steps_total{drafted}); accept_length falls back to "
            "bench_serving's (/server_info) where the server has no dspark_accepted_length",
            "frontier_method": inspect.cleandoc(matched_throughput_speedup.__doc__ or ""),
        },
        "startup_s": startup,
        "server_memory": memory,
        "loadavg_start": loadavg_start,
        "loadavg_end": os.getloadavg(),
        "versions": {**software_versions(), "sglang": md.version("sglang")},
        "rows": rows,
        "frontier": frontiers(rows),
    }
    print(table(rows))
    print(f"wrote {dump_json(out, result)}")
    plot(result, png)
    print(f"wrote {png}")
    return 0


def table(rows: Sequence[Mapping[str, Any]]) -> str:
    """The printed summary, one line per row."""

    def f(x: float | None, spec: str) -> str:
        return "-" if x is None else format(x, spec)

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


if __name__ == "__main__":
    raise SystemExit(main())
