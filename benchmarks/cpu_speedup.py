"""Speed of speculative decoding in SGLang's CPU engine: plain vs DSPARK_MOE vs NGRAM, side by side.

The project's headline speed figure. In one run, on the same prompts, SGLang's real CPU
engine (``sglang_integration.engine``) decodes with

* ``plain``: no speculation;
* ``--speculative-algorithm DSPARK_MOE`` with the embedded drafter
  (``dspark_sglang/assets/drafters/smollm2/``, or ``--drafter``), once per verify policy in
  ``--policies``: ``sglang`` is SGLang's own decision (the whole block, ragged verify
  mode ``static``, no scheduler config); any other name is our policy, routed through a
  ``SchedulerConfig`` file as ``dspark-sglang demo --policy`` writes it (with the
  drafter's ``sts.json``; ``prefix`` / ``lagged`` without ``--cost-table`` measure their
  cost table when the worker starts);
* ``--speculative-algorithm NGRAM``: SGLang's prompt-lookup speculation (no drafter, its
  default settings), the no-training peer; ``--no-ngram`` leaves it out.

The grid: prompt sets (``--sets``, chat template applied: GSM8K test, HumanEval, MT-Bench
first turns) x concurrency levels (``--concurrency``) x temperatures (``--temperatures``).
Every cell has its own ``--prompts-per-cell`` prompts ``n`` (default 8, at least the
highest concurrency), distinct from every other cell's: cell ``j`` of a set, counting that
set's cells in grid order (concurrency-major, then temperature), takes the set's prompts
``j*n .. j*n+n-1``, so a set needs ``n`` x (concurrency levels x temperatures) prompts and
the run stops with an error naming the flags when it has fewer. Every engine gets the same
prompts in the same cell, so each plain-vs-speculative comparison stays paired. A cell at
concurrency ``c`` keeps ``c`` requests in flight (``engine.generate_in_flight``: SGLang's
``async_generate``, the next prompt sent as soon as a request finishes, in prompt order),
as a server under ``c`` concurrent clients; its tokens/s is the tokens generated over the
cell's wall time. (Batches of ``c`` prompts, each waiting for its slowest request, would
charge a speculative engine, whose requests finish in different numbers of rounds, for
stragglers that plain decoding never has.)
``--max-new-tokens`` (default 64) per request, EOS ignored, so every engine generates the
same number of tokens. Temperature 0 is greedy; temperature > 0 samples with no top-k /
top-p, the engines seeded with ``--seed``.

Each repeat starts every engine once, each in its own process
(``sglang_integration.engine_process``), one after the other in an order rotated by one
engine per repeat, and keeps them all alive for the repeat: an engine waiting for its
turn sleeps (SGLang's ``sleep_on_idle``) and takes no CPU from the one being timed. Each
gets an untimed warm-up request per temperature (on a different prompt). Then the cells
run set by set, and within a cell the engines take turns, in the start order in even
cells and reversed in odd ones (``engine_process.turns``), so every engine's figure for a
cell is timed within a minute or so of the others' and the machine's drift hits them
alike. Right before its turn in a cell an engine prefills that cell's prompts once,
untimed (one token each), so every timed cell finds its prompts' prefill in the radix
cache: the cells time decoding, the part speculation changes. NGRAM's n-gram corpus still
holds what the engine generated in earlier cells, but for other prompts, never the
cell's own.

A row is one cell and one speculative engine, against the plain engine's same cell of the
same repeat: tokens/s of both, their ratio (per repeat, then median and range over
``--repeats``), SGLang's accepted length per verify round (completion tokens over
``spec_verify_ct`` from ``meta_info``, bonus token included, as the demo reads it), and,
at temperature 0, whether every output was token-identical to plain's in every repeat
(greedy verification is lossless) and, where one was not, whether each divergence is a
numerical near-tie (``lossless``, the demo's rule in ``greedy_check``: the plain engine
computes, untimed after each greedy cell, the target's best tokens along its outputs; a
divergence where both tokens are within the dtype's rounding tolerance of the target's
best is a near-tie, anything else a bug). Each row keeps every repeat's raw figures.

On CPU SGLang's NGRAM verifies greedily whatever the temperature (``eagle_sample``: no
sampling-verify kernel on CPU), so at temperature > 0 its outputs are the target's greedy
continuations, not samples: those rows carry a ``note``. DSPARK_MOE samples its verify on
CPU (``cpu_sampling.py``).

Usage: ``python benchmarks/cpu_speedup.py [--sets gsm8k humaneval mtbench]
[--concurrency 1 4 8] [--temperatures 0 1] [--policies sglang mtp1 prefix] [--no-ngram]
[--prompts-per-cell 8] [--max-new-tokens 64] [--repeats 3] [--dtype auto] [--threads 1]
[--out FILE]``. Without ``--out`` the JSON goes to a fresh run folder,
``<cache>/runs/bench/cpu_speedup-<UTC time>/cpu_speedup.json``; the committed result is
``--out benchmarks/results/cpu_speedup.json``. Exit 1 when a greedy row has a divergence
that is not a near-tie. Timings on shared machines are noisy: the JSON records the load
average; read the ratios, measured side by side in one run.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata as md
import math
import os
import statistics
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dspark_sglang.results import default_out, dump_json, software_versions
from dspark_sglang.sglang_integration.launch import SGLANG_DECISION

SETS = ("gsm8k", "humaneval", "mtbench")
DSPARK = "DSPARK_MOE"
NGRAM = "NGRAM"
PLAIN = "plain"
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


@dataclass(frozen=True)
class Engine:
    """One engine of the run: ``plain``, ``DSPARK_MOE`` with a policy, or ``NGRAM``."""

    algorithm: str
    policy: str | None = None

    def __post_init__(self) -> None:
        if self.algorithm not in (PLAIN, DSPARK, NGRAM):
            raise ValueError(f"Engine.algorithm must be plain, {DSPARK} or {NGRAM}")
        if (self.algorithm == DSPARK) != (self.policy is not None):
            raise ValueError("Engine.policy is given for DSPARK_MOE engines only")

    @property
    def label(self) -> str:
        return f"{self.algorithm}/{self.policy}" if self.policy else self.algorithm


@dataclass(frozen=True)
class Cell:
    """One point of the grid."""

    prompt_set: str
    concurrency: int
    temperature: float

    @property
    def label(self) -> str:
        return f"{self.prompt_set} c={self.concurrency} T={self.temperature:g}"


def grid(
    sets: Sequence[str], concurrency: Sequence[int], temperatures: Sequence[float]
) -> list[Cell]:
    """Every cell, set-major (the order each engine runs them in)."""
    return [Cell(s, c, float(t)) for s in sets for c in concurrency for t in temperatures]


def engines(policies: Sequence[str], ngram: bool) -> list[Engine]:
    """Plain first, then DSPARK_MOE per policy, then NGRAM (the first repeat's start order)."""
    out = [Engine(PLAIN)] + [Engine(DSPARK, p) for p in policies]
    return [*out, Engine(NGRAM)] if ngram else out


def rotated(items: Sequence[Any], repeat: int) -> list[Any]:
    """``items`` started ``repeat`` places on (repeat 0: as given): no engine always first."""
    if not items:
        return []
    k = repeat % len(items)
    return [*items[k:], *items[:k]]


def check_cell_size(num_prompts: int, concurrency: int) -> None:
    """A cell must hold at least ``concurrency`` prompts, or it never has that many in flight."""
    if concurrency < 1:
        raise ValueError(f"concurrency must be >= 1, got {concurrency}")
    if num_prompts < concurrency:
        raise ValueError(
            f"{num_prompts} prompts cannot keep {concurrency} requests in flight: "
            "--prompts-per-cell must be at least the highest --concurrency"
        )


def cell_prompt_slices(cells: Sequence[Cell], per_cell: int) -> dict[Cell, range]:
    """Which prompts of its set each cell sends: cell ``j`` of a set, counting that set's
    cells in the order given, takes prompts ``j*per_cell .. j*per_cell+per_cell-1``.

    No two cells share a prompt, so nothing a speculative engine learnt from one cell's
    outputs (NGRAM's n-gram corpus) is replayed in another; every engine uses the same map.
    """
    if per_cell < 1:
        raise ValueError(f"--prompts-per-cell must be >= 1, got {per_cell}")
    if len(set(cells)) != len(cells):
        raise ValueError("cells lists a cell twice")
    seen: dict[str, int] = {}
    out = {}
    for cell in cells:
        j = seen.get(cell.prompt_set, 0)
        seen[cell.prompt_set] = j + 1
        out[cell] = range(j * per_cell, (j + 1) * per_cell)
    return out


def prompts_needed(cells: Sequence[Cell], per_cell: int) -> dict[str, int]:
    """Prompts each set must have: ``per_cell`` x that set's cells."""
    slices = cell_prompt_slices(cells, per_cell)
    need: dict[str, int] = {}
    for cell, idx in slices.items():
        need[cell.prompt_set] = max(need.get(cell.prompt_set, 0), idx.stop)
    return need


def check_set_size(name: str, available: int, needed: int, per_cell: int) -> None:
    """Raise ``ValueError`` naming the flags when eval set ``name`` is too small for the grid."""
    if available < needed:
        raise ValueError(
            f"eval set {name!r} has {available} prompts; the grid needs {needed}: "
            f"--prompts-per-cell {per_cell} distinct prompts for each of its "
            f"{needed // per_cell} cells (--concurrency levels x --temperatures). Lower "
            "--prompts-per-cell or give fewer --concurrency / --temperatures values"
        )


def cell_prompts(
    cells: Sequence[Cell], per_set: Mapping[str, Sequence[Any]], per_cell: int
) -> dict[Cell, list[Any]]:
    """Each cell's own prompts, taken from its set's list by ``cell_prompt_slices``; built
    once per run, so every engine sends the same prompts in the same cell. ``ValueError``
    naming the flags when a set's list is too short for the grid."""
    slices = cell_prompt_slices(cells, per_cell)
    for name, needed in prompts_needed(cells, per_cell).items():
        check_set_size(name, len(per_set.get(name, ())), needed, per_cell)
    return {c: [per_set[c.prompt_set][i] for i in idx] for c, idx in slices.items()}


def spread(values: Sequence[float]) -> dict[str, float]:
    """Median and range of one figure over the repeats."""
    if not values:
        raise ValueError("no values to summarise")
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


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


# --------------------------------------------------------------------------- arguments


def parser() -> argparse.ArgumentParser:
    from dspark_sglang.cli.base import context_copy_ngram
    from dspark_sglang.model.context_copy import DEFAULT_NGRAM
    from dspark_sglang.sglang_integration.demo import ENGINE_POLICIES
    from dspark_sglang.targets.smollm2 import DEFAULT_DRAFTER_DIR

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sets", nargs="+", choices=SETS, default=list(SETS))
    ap.add_argument("--concurrency", nargs="+", type=int, default=[1, 4, 8])
    ap.add_argument("--temperatures", nargs="+", type=float, default=[0.0, 1.0])
    ap.add_argument(
        "--policies",
        nargs="*",
        choices=(SGLANG_DECISION, *ENGINE_POLICIES),
        default=[SGLANG_DECISION, "mtp1", "prefix"],
        help="DSPARK_MOE verify policies, one engine each ('sglang': SGLang's own decision; "
        "give the flag with no name for no DSPARK_MOE engine)",
    )
    ap.add_argument(
        "--ngram",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also run SGLang's NGRAM speculation (default: yes)",
    )
    ap.add_argument(
        "--prompts-per-cell",
        type=int,
        default=8,
        help="distinct prompts per cell (each cell its own; a set needs this x its cells); "
        "at least the highest --concurrency",
    )
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--dtype", choices=("auto", "float32", "bfloat16"), default="auto")
    ap.add_argument("--threads", type=int, default=1, help="OpenMP threads per scheduler")
    ap.add_argument("--drafter", type=Path, default=DEFAULT_DRAFTER_DIR)
    ap.add_argument("--static-k", type=int, default=None, help="drafts for policy static")
    ap.add_argument(
        "--cost-table",
        type=Path,
        default=None,
        help="SPS cost table for prefix/lagged (default: measured when the worker starts)",
    )
    ap.add_argument("--sts", type=Path, default=None, help="STS file (default: the drafter's)")
    ap.add_argument(
        "--context-copy",
        type=context_copy_ngram,
        default=None,
        metavar="N",
        help="context copies in every DSPARK_MOE policy's scheduler config (N trailing "
        f"tokens; 0 = off; 'sglang' has no config, so no copies). Default: {DEFAULT_NGRAM} "
        "when every --temperatures is 0, else off (one config serves every cell)",
    )
    ap.add_argument(
        "--mem-fraction-static",
        type=float,
        default=0.25,
        help="SGLang's share of RAM for weights + KV pool, every engine (a wide margin: "
        "SGLang re-measures free RAM at start-up, which drifts when other jobs run)",
    )
    ap.add_argument(
        "--max-total-tokens",
        type=int,
        default=8192,
        help="KV pool cap in tokens, every engine (keeps the wide margin's memory small)",
    )
    ap.add_argument("--seed", type=int, default=0, help="engines' random seed")
    ap.add_argument(
        "--out",
        type=Path,
        default=None,
        help="result JSON (default: cpu_speedup.json in a fresh run folder, "
        "<cache>/runs/bench/cpu_speedup-<UTC time>/)",
    )
    return ap


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Parsed and checked flags; a bad one exits 2 with a message naming it."""
    ap = parser()
    args = ap.parse_args(argv)
    for name in ("prompts_per_cell", "max_new_tokens", "repeats", "threads", "max_total_tokens"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    for flag, values in (
        ("--sets", args.sets),
        ("--concurrency", args.concurrency),
        ("--temperatures", args.temperatures),
        ("--policies", args.policies),
    ):
        if len(set(values)) != len(values):
            ap.error(f"{flag} lists a value twice: {values}")
    if min(args.concurrency) < 1:
        ap.error(f"--concurrency levels must be >= 1, got {args.concurrency}")
    if min(args.temperatures) < 0 or not all(math.isfinite(t) for t in args.temperatures):
        ap.error(f"--temperatures must be finite and >= 0, got {args.temperatures}")
    if args.prompts_per_cell < max(args.concurrency):
        ap.error(
            f"--prompts-per-cell {args.prompts_per_cell} cannot fill a call at concurrency "
            f"{max(args.concurrency)}: give at least {max(args.concurrency)}"
        )
    if not args.policies and not args.ngram:
        ap.error("nothing to compare: give --policies or drop --no-ngram")
    if args.context_copy is None:
        from dspark_sglang.model.context_copy import default_ngram

        args.context_copy = default_ngram(all(t == 0 for t in args.temperatures))
    if not 0 < args.mem_fraction_static < 1:
        ap.error(f"--mem-fraction-static must be in (0, 1), got {args.mem_fraction_static}")
    from dspark_sglang.scheduling.config import NEEDS_COST_TABLE
    from dspark_sglang.sglang_integration.demo import split_policy

    base_policies = {split_policy(p)[0] for p in args.policies}
    if args.cost_table is not None and not base_policies & set(NEEDS_COST_TABLE):
        ap.error(f"--cost-table feeds policies {'/'.join(NEEDS_COST_TABLE)}: none is selected")
    if ("static" in args.policies) != (args.static_k is not None):
        ap.error("--static-k goes with policy static, and policy static needs --static-k")
    if args.sts is not None and not set(args.policies) - {SGLANG_DECISION}:
        ap.error("--sts feeds our policies; SGLang's own decision (policy sglang) reads none")
    for flag, value in (("--cost-table", args.cost_table), ("--sts", args.sts)):
        if value is not None and not value.is_file():
            ap.error(f"{flag} {value}: no such file")
    return args


# --------------------------------------------------------------------------- engines


def _console() -> Any:
    from rich.console import Console

    return Console(stderr=True)


def engine_specs(
    args: argparse.Namespace, all_engines: Sequence[Engine], model_path: Path, dtype: Any, tmp: str
) -> tuple[dict[str, Any], dict[str, Any], Path | None]:
    """``CpuEngineSpec`` per engine label, each policy's scheduler config, the drafter.

    Everything is validated here, before any engine starts (SGLang kills its parent when a
    scheduler dies during start-up): the drafter checkpoint against the target, the STS
    file and cost table of every policy.
    """
    import yaml

    from dspark_sglang.sglang_integration.demo import resolve_drafter, write_scheduler_config
    from dspark_sglang.sglang_integration.engine import CpuEngineSpec
    from dspark_sglang.sglang_integration.launch import scheduler_env
    from dspark_sglang.targets.smollm2 import DEFAULT_DRAFTER_DIR

    console = _console()
    drafter_dir = None
    if any(e.algorithm == DSPARK for e in all_engines):
        given = None if args.drafter == DEFAULT_DRAFTER_DIR else args.drafter
        drafter_dir, trained = resolve_drafter(
            model_path, given, DEFAULT_DRAFTER_DIR, args.seed, Path(tmp), console
        )
        if not trained:
            raise ValueError(
                f"no trained drafter in {DEFAULT_DRAFTER_DIR}: a speed benchmark of an "
                "untrained drafter measures nothing; pass --drafter or restore the embedded one"
            )
    base = {
        "host": "127.0.0.1",
        "log_level": "error",
        "dtype": dtype.dtype,
        "mem_fraction_static": args.mem_fraction_static,
        "max_total_tokens": args.max_total_tokens,
        "random_seed": args.seed,
        # The engines of a repeat are alive together; the ones waiting sleep.
        "sleep_on_idle": True,
    }
    # One engine per policy serves every cell, so it drafts by argmax only when every
    # request of the run is greedy; run temperature 0 on its own to measure that tier.
    all_greedy = all(t == 0 for t in args.temperatures)
    specs: dict[str, Any] = {}
    configs: dict[str, Any] = {}
    for eng in all_engines:
        overrides: dict[str, Any] = dict(base)
        env: dict[str, str] = {}
        if eng.algorithm == DSPARK:
            policy_args = argparse.Namespace(
                policy=None if eng.policy == SGLANG_DECISION else eng.policy,
                sts=args.sts,
                cost_table=args.cost_table,
                static_k=args.static_k,
                context_copy=args.context_copy,
            )
            workdir = Path(tmp) / str(eng.policy)
            workdir.mkdir()
            config = write_scheduler_config(
                policy_args, drafter_dir, workdir, console, dtype.dtype, greedy_only=all_greedy
            )
            # Parsed, so that dump_json makes its paths portable.
            configs[str(eng.policy)] = (
                yaml.safe_load(config.read_text()) if config is not None else None
            )
            overrides["speculative_algorithm"] = DSPARK
            overrides["speculative_draft_model_path"] = str(drafter_dir)
            # SGLang's own decision or the policy's ragged mode and config, and whatever
            # else a DSPARK_MOE server needs: scheduler_env is the one place that knows.
            # An all-greedy grid is a greedy-only tier: argmax drafts (greedy_draft).
            env = scheduler_env(config, greedy_draft=all_greedy)
        elif eng.algorithm == NGRAM:
            overrides["speculative_algorithm"] = NGRAM
        specs[eng.label] = CpuEngineSpec(
            model_path=str(model_path), overrides=overrides, env=env, omp_threads=args.threads
        )
    return specs, configs, drafter_dir


def encoded_prompts(tokenizer: Any, name: str, n: int, per_cell: int) -> list[tuple[int, ...]]:
    """The first ``n`` prompts of eval set ``name`` (``prompts_needed``) through the target's
    chat template; ``ValueError`` naming the flags when the set has fewer."""
    from dspark_sglang.data.evalsets import load_eval_set

    prompts = load_eval_set(name, limit=n)
    check_set_size(name, len(prompts), n, per_cell)
    out = []
    for p in prompts:
        ids = tokenizer.apply_chat_template(
            p.chat(), add_generation_prompt=True, tokenize=True, return_dict=False
        )
        if isinstance(ids, Mapping):  # some tokenizers return a BatchEncoding regardless
            ids = ids["input_ids"]
        out.append(tuple(int(t) for t in ids))
    return out


def sampling(temperature: float) -> dict[str, Any]:
    """SGLang sampling params on top of ``generate_outputs``' (greedy, EOS ignored)."""
    return {"temperature": temperature} if temperature > 0 else {}


def run_repeat(
    all_engines: Sequence[Engine],
    specs: Mapping[str, Any],
    cells: Sequence[Cell],
    prompts: Mapping[Cell, Sequence[Sequence[int]]],
    warmup: Sequence[int],
    max_new_tokens: int,
    repeat: int,
    console: Any,
) -> tuple[dict[str, dict[Cell, Any]], dict[str, float], list[list[str]]]:
    """One repeat: start every engine, then every cell with the engines taking turns.

    Returns ``({label: {cell: EngineRun}}, {label: start-up s}, per cell the engine order)``.
    ``prompts[cell]`` is the cell's own prompts (``cell_prompt_slices``). Right before its
    turn in a cell an engine prefills the cell's prompts once, untimed (one token each),
    so every timed cell finds its prompts in the radix cache alike. After its turn in a
    greedy cell the plain engine also computes, untimed, the target's best tokens along its
    outputs (``demo.target_top_tokens``).
    """
    from dspark_sglang.sglang_integration.demo import target_top_tokens
    from dspark_sglang.sglang_integration.demo_report import EngineRun
    from dspark_sglang.sglang_integration.engine import generate_outputs, timed_in_flight
    from dspark_sglang.sglang_integration.engine_process import engine_processes, turns

    start_order = [e.label for e in rotated(all_engines, repeat)]
    algorithm = {e.label: e.algorithm for e in all_engines}
    width = len(start_order)
    flat = turns(start_order, len(cells))
    orders = [flat[j * width : (j + 1) * width] for j in range(len(cells))]
    out: dict[str, dict[Cell, Any]] = {label: {} for label in start_order}
    with contextlib.ExitStack() as stack:
        with console.status(
            f"repeat {repeat + 1}: starting {', '.join(start_order)}, one after the other, "
            "each in its own process (~20-60 s each)"
        ):
            procs = stack.enter_context(
                engine_processes({label: specs[label] for label in start_order})
            )
            for proc in procs.values():
                for temperature in sorted({c.temperature for c in cells}):
                    proc.call(generate_outputs, [list(warmup)], 8, sampling(temperature))
        for cell, order in zip(cells, orders, strict=True):
            own = prompts[cell]
            check_cell_size(len(own), cell.concurrency)
            sent = [list(p) for p in own]
            for label in order:
                proc = procs[label]
                proc.call(generate_outputs, sent, 1)  # untimed: prefills cached
                wall, outputs = proc.call(
                    timed_in_flight,
                    sent,
                    max_new_tokens,
                    cell.concurrency,
                    sampling(cell.temperature),
                )
                tops: tuple[Any, ...] = ()
                if algorithm[label] == PLAIN and cell.temperature == 0:
                    tops = proc.call(target_top_tokens, sent, [o["output_ids"] for o in outputs])
                out[label][cell] = run = EngineRun.from_outputs(label, outputs, wall, tops)
                console.print(
                    f"{label}: {cell.label}: {run.tokens_per_second:.2f} tok/s", highlight=False
                )
        startups = {label: float(procs[label].startup_s or 0.0) for label in start_order}
    return out, startups, orders


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("SGLANG_USE_CPU_ENGINE", "1")  # before anything imports sglang
    from dspark_sglang.sglang_integration.cpu_dtype import choose_cpu_dtype, read_cpuinfo
    from dspark_sglang.sglang_integration.demo import _target_spec
    from dspark_sglang.targets.smollm2 import ensure_smollm2

    console = _console()
    model_path = Path(ensure_smollm2())
    dtype = choose_cpu_dtype(args.dtype, read_cpuinfo() if args.dtype == "auto" else None)
    console.print(dtype.describe(), highlight=False)
    cells = grid(args.sets, args.concurrency, args.temperatures)
    all_engines = engines(args.policies, args.ngram)
    speculative = all_engines[1:]
    with tempfile.TemporaryDirectory(prefix="cpu_speedup-") as tmp:
        try:
            specs, configs, drafter_dir = engine_specs(args, all_engines, model_path, dtype, tmp)
        except (ValueError, OSError) as exc:
            print(f"cpu_speedup: error: {exc}", file=sys.stderr)
            return 2
        _, tokenizer = _target_spec(model_path)
        slices = cell_prompt_slices(cells, args.prompts_per_cell)
        try:
            per_set = {
                s: encoded_prompts(tokenizer, s, n, args.prompts_per_cell)
                for s, n in prompts_needed(cells, args.prompts_per_cell).items()
            }
            # One map for every engine: the plain-vs-speculative comparisons stay paired.
            prompts = cell_prompts(cells, per_set, args.prompts_per_cell)
        except ValueError as exc:
            print(f"cpu_speedup: error: {exc}", file=sys.stderr)
            return 2
        warmup = tokenizer("Hello", add_special_tokens=False)["input_ids"]
        result: dict[str, Any] = {
            "settings": {
                "target": "smollm2 (SmolLM2-135M-Instruct)",
                "drafter": str(drafter_dir) if drafter_dir else None,
                "sets": args.sets,
                "concurrency": args.concurrency,
                "temperatures": args.temperatures,
                "policies": args.policies,
                "context_copy_ngram": args.context_copy,
                "ngram": args.ngram,
                "prompts_per_cell": args.prompts_per_cell,
                # Per set, per cell in the grid's order of that set's cells.
                "prompt_tokens": {
                    s: [[len(p) for p in prompts[c]] for c in cells if c.prompt_set == s]
                    for s in args.sets
                },
                "prompt_indices": {
                    s: [[slices[c].start, slices[c].stop] for c in cells if c.prompt_set == s]
                    for s in args.sets
                },
                "max_new_tokens": args.max_new_tokens,
                "sampling": "EOS ignored; temperature 0 greedy, else temperature only "
                "(no top-k / top-p), engines seeded with --seed",
                "seed": args.seed,
                "dtype": dtype.dtype,
                "dtype_reason": dtype.describe(),
                "threads": args.threads,
                "mem_fraction_static": args.mem_fraction_static,
                "max_total_tokens": args.max_total_tokens,
                "cost_table": str(args.cost_table) if args.cost_table else None,
                "scheduler_configs": configs,
                "repeats": args.repeats,
                "cell": "each cell its own prompts: cell j of a set (grid order: concurrency, "
                "then temperature) sends the set's prompts j*n .. j*n+n-1 (n = "
                "prompts_per_cell; prompt_indices), the same for every engine; concurrency c: "
                "c requests in flight, the next prompt sent as one finishes (async_generate); "
                "tok/s = tokens / wall time of the cell",
                "order": "each repeat starts every engine once, each in its own process, one "
                "after the other in an order rotated by one per repeat, all alive for the "
                "repeat (sleep_on_idle: a waiting engine sleeps); untimed warm-up per "
                "temperature; then cell by cell the engines take turns, in the start order in "
                "even cells and reversed in odd ones (raw[].cell_orders); right before its "
                "turn an engine's untimed one-token pass over the cell's prompts puts their "
                "prefill in the radix cache; NGRAM's corpus carries earlier cells' outputs, "
                "for other prompts",
                "sglang_engine": "CPU engine (intel_amx attention, pytorch sampling)",
            },
            "versions": {**software_versions(), "sglang": md.version("sglang")},
            "loadavg_start": os.getloadavg(),
        }
        runs: dict[str, list[dict[Cell, Any]]] = {e.label: [] for e in all_engines}
        raw: list[dict[str, Any]] = []
        try:
            for rep in range(args.repeats):
                rep_runs, starts, orders = run_repeat(
                    all_engines,
                    specs,
                    cells,
                    prompts,
                    warmup,
                    args.max_new_tokens,
                    rep,
                    console,
                )
                for label, cell_runs in rep_runs.items():
                    runs[label].append(cell_runs)
                raw.append(
                    {
                        "order": [e.label for e in rotated(all_engines, rep)],
                        "cell_orders": orders,
                        "engine_startup_s": starts,
                        "cells": [
                            {
                                "prompt_set": c.prompt_set,
                                "concurrency": c.concurrency,
                                "temperature": c.temperature,
                                **{
                                    e.label: {
                                        "tokens": runs[e.label][rep][c].num_tokens,
                                        "wall_s": runs[e.label][rep][c].wall_s,
                                        "verify_rounds": runs[e.label][rep][c].verify_rounds,
                                        "correct_drafts": runs[e.label][rep][c].correct_drafts,
                                    }
                                    for e in all_engines
                                },
                            }
                            for c in cells
                        ],
                    }
                )
        except RuntimeError as exc:  # SGLang reports a failed start-up as RuntimeError
            print(f"cpu_speedup: error: SGLang's engine failed: {exc}", file=sys.stderr)
            return 2
    result["loadavg_end"] = os.getloadavg()
    result["rows"] = rows = build_rows(runs, cells, speculative, dtype.dtype)
    for row in rows:
        check_row(row)
    result["raw"] = raw
    print(table(rows))
    out = args.out or default_out("cpu_speedup", "cpu_speedup.json")
    print(f"wrote {dump_json(out, result)}")
    for r in not_identical(rows):
        kind = "near-ties only" if r["lossless"] else "MISMATCH"
        print(
            f"not identical to plain ({kind}): {r['prompt_set']} c={r['concurrency']} "
            f"{r['algorithm']}/{r['policy']} (identical outputs per repeat: "
            f"{[x['identical_outputs'] for x in r['repeats']]} of {r['repeats'][0]['outputs']}; "
            f"near-ties {[x['near_ties'] for x in r['repeats']]}, "
            f"mismatches {[x['mismatches'] for x in r['repeats']]})"
        )
        for rep in r["repeats"]:
            for d in rep["divergences"]:
                print(f"  {d}")
    return 1 if not_lossless(rows) else 0


if __name__ == "__main__":
    raise SystemExit(main())
