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
(``--max-total-tokens``: all servers are alive together, ~2.2 GB PSS each in bfloat16;
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
items, at ``--math-code-concurrency`` only) x a concurrency (``--concurrency``,
bench_serving's ``--max-concurrency``, every request sent at once otherwise) x a
temperature. Each engine runs each cell once per repeat as one ``bench_serving`` subprocess:
``--dataset-name sharegpt``, ``--num-prompts`` (default ``max(8, 2 x concurrency)``),
``--sharegpt-output-len`` (``--output-len``, EOS ignored, bench_serving's default),
``--temperature``, ``--seed`` (``--seed`` + repeat: the same prompts for every engine in a
repeat, other prompts in the next), ``--flush-cache`` (a cold radix cache: TTFT includes the
prefill) and ``--warmup-requests 0`` (each server got an untimed warm-up per temperature
after start-up instead, so the server's counters read around a cell hold the cell only),
``--output-file`` (JSONL) for the figures: output throughput, median TPOT (per-user speed =
1000 / median TPOT ms) and median TTFT. The accepted length per verify round (bonus token
included) and the share of request-steps that drafted come from the server's ``/metrics``
read right before and after the cell: ``dspark_accepted_length`` (sum / count of the cell's
rounds) and ``dspark_draft_request_steps_total{drafted="true"|"false"}``; null where the
server has no such series (plain decoding; a worker without the counter). bench_serving's
own accept length (``/server_info``, SGLang's counter since the cell's flush, updated every
decode log interval) is kept beside it in ``repeats``. Within a repeat the cells run in turn
and, in each cell, the engines take turns in ``--engines`` order (plain first), reversed in
odd repeats, so the machine's drift hits every engine of a cell alike.

JSON (``--out``, default a fresh run folder): ``rows``, one per (prompt set, concurrency,
temperature, engine): ``output_tok_s``, ``user_tok_s``, ``median_ttft_ms``,
``accept_length``, ``ratio_to_plain`` (the engine's output throughput over plain's in the
same cell and repeat) and ``drafted_share``, each the median over the repeats with its
``<name>_range`` [min, max], and ``repeats`` (every repeat's raw figures);
``default_engine``; ``machine``; ``settings``; ``frontier`` (``rows.frontiers``). A PNG of
the frontiers goes beside it (``--plot``).

Resuming. Every measured cell is appended to a record as soon as it is read (``--cells``,
default ``<out stem>.cells.jsonl`` beside ``--out``; ``bench.live_frontier.cells``). Run
again with the same ``--out`` (or ``--cells``) and settings and the grid resumes: a
(repeat, cell) whose engines are all recorded is not measured again, one cut short is
measured again whole, and the rows are built from every recorded cell of the grid. A
record measured with other settings (flags, scheduler configs, prompts, the code's commit)
is refused, naming the setting. The server-free parts live in ``dspark_sglang.bench.
live_frontier`` (engines, client, rows, cells, plot, servers); this script runs them.

Usage: ``python benchmarks/live_frontier.py [--engines plain mtp1 ...] [--concurrency 1 2 4
8 16 32] [--temperatures 0 1] [--repeats 3] [--num-prompts N] [--output-len 64]
[--prompt-set all math_code] [--math-code-concurrency 1] [--out FILE] [--cells FILE]``. The
full grid (8 engines x 26 cells x 3 repeats) runs for about 5 hours on 2 cores (resume it
across sittings); a smoke run: ``--engines plain prefix
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
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from dspark_sglang.bench.live_frontier.cells import (
    CellRecord,
    file_sha256,
    source_commit,
)
from dspark_sglang.bench.live_frontier.client import run_cell
from dspark_sglang.bench.live_frontier.engines import (
    ENGINES,
    PLAIN,
    PROMPT_SETS,
    num_prompts,
    select_prompts,
)
from dspark_sglang.bench.live_frontier.plot import plot
from dspark_sglang.bench.live_frontier.rows import (
    Cell,
    build_rows,
    frontiers,
    matched_throughput_speedup,
    table,
    turn_order,
)
from dspark_sglang.bench.live_frontier.servers import (
    Plan,
    memory_mb,
    plan_servers,
    start_servers,
    warm_up,
)

REPO = Path(__file__).resolve().parents[1]
DEFAULT_PROMPTS = REPO / "benchmarks" / "data" / "mixed_prompts.json"
DEFAULT_VALUES = REPO / "helm" / "dspark-sglang" / "values.yaml"


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
    ap.add_argument(
        "--math-code-concurrency",
        nargs="+",
        type=int,
        default=[1],
        help="the concurrencies of --concurrency at which prompt set math_code runs",
    )
    ap.add_argument("--prompts", type=Path, default=DEFAULT_PROMPTS, help="ShareGPT prompt file")
    ap.add_argument(
        "--values",
        type=Path,
        default=DEFAULT_VALUES,
        help="chart values: the first slaTiers entry",
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
        "--cell-timeout",
        type=float,
        default=1800.0,
        help="seconds one bench_serving may take",
    )
    ap.add_argument(
        "--out",
        type=Path,
        default=None,
        help="result JSON (default: live_frontier.json in a fresh run folder, "
        "<cache>/runs/bench/live_frontier-<UTC time>/)",
    )
    ap.add_argument("--plot", type=Path, default=None, help="PNG (default: beside --out)")
    ap.add_argument(
        "--cells",
        type=Path,
        default=None,
        help="the per-cell record (default: beside --out, <stem>.cells.jsonl); given an "
        "existing one measured with the same settings, the run resumes from it",
    )
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
    if not set(args.math_code_concurrency) <= set(args.concurrency):
        ap.error(
            f"--math-code-concurrency {args.math_code_concurrency} must be among --concurrency "
            f"{args.concurrency}"
        )
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


def grid(args: argparse.Namespace) -> list[Cell]:
    """Every cell, in the order a repeat runs them: prompt set, temperature, concurrency
    (``math_code`` at ``--math-code-concurrency`` only)."""
    return [
        Cell(s, c, float(t))
        for s in args.prompt_set
        for t in args.temperatures
        for c in args.concurrency
        if s != "math_code" or c in args.math_code_concurrency
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


def measure(
    servers: Mapping[str, Any],
    args: argparse.Namespace,
    datasets: Mapping[str, Path],
    tokenizer: str,
    workdir: Path,
    record: CellRecord,
) -> None:
    """Every repeat, cell and engine (``turn_order``) not yet in ``record``, added to it."""
    cells = grid(args)
    todo = [
        (r, c) for r in range(args.repeats) for c in cells if not record.done(r, c, args.engines)
    ]
    total = len(todo) * len(args.engines)
    if len(todo) < args.repeats * len(cells):
        print(f"resuming {record.path}: {len(todo)} of {args.repeats * len(cells)} cells to run")
    done = 0
    for rep, cell in todo:
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
            record.add(rep, cell, engine, fig)
            acc = fig["accept_length"]
            print(
                f"[{done}/{total}] {tag}: {fig['output_tok_s']:.2f} tok/s, "
                f"{fig['user_tok_s']:.2f} tok/s/user, TTFT {fig['median_ttft_ms']:.0f} ms"
                + (f", accept {acc:.2f}" if acc is not None else ""),
                flush=True,
            )


def record_settings(args: argparse.Namespace, plan: Plan) -> dict[str, Any]:
    """What a cell's figures depend on (``cells``: a resumed record must match them)."""
    from dspark_sglang.results import portable

    return portable(
        {
            "commit": source_commit(),
            "engines": list(args.engines),
            "server_flags": {e: dict(s.server_kwargs()) for e, s in plan.specs.items()},
            "scheduler_configs": plan.configs,
            "output_len": args.output_len,
            "num_prompts": args.num_prompts,
            "prompts_sha256": file_sha256(args.prompts),
            "values_sha256": file_sha256(args.values),
            "threads_per_server": args.threads,
            "seed": args.seed,
        }
    )


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
    startup: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="live_frontier-") as tmp:
        work = Path(tmp)
        try:
            datasets = write_prompt_sets(items, args, work)
            plan = plan_servers(args, model_path, work)
            cells_path = args.cells or out.with_name(out.stem + ".cells.jsonl")
            record = CellRecord(cells_path, record_settings(args, plan))
        except (ValueError, OSError) as exc:
            print(f"live_frontier: error: {exc}", file=sys.stderr)
            return 2
        loadavg_start = os.getloadavg()
        pending = any(
            not record.done(r, c, args.engines) for r in range(args.repeats) for c in grid(args)
        )
        try:
            with contextlib.ExitStack() as stack:
                servers = {}
                if pending:
                    servers, startup = start_servers(stack, plan, args.engines, work)
                    warm_up(servers, args.temperatures)
                memory = {e: {"after_start": memory_mb(s.pid)} for e, s in servers.items()}
                measure(servers, args, datasets, str(model_path), work, record)
                for engine, srv in servers.items():
                    memory[engine]["at_end"] = memory_mb(srv.pid)
                print("stopping the servers", flush=True)
        except RuntimeError as exc:
            print(
                f"live_frontier: error: {exc} (measured cells are in {cells_path})",
                file=sys.stderr,
            )
            return 2
    rows = build_rows(record.runs(grid(args), args.engines, args.repeats), args.engines)
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
            "commit": record.settings["commit"],
            "cells_record": str(cells_path),
            "engines": args.engines,
            "concurrency": args.concurrency,
            "math_code_concurrency": args.math_code_concurrency,
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


if __name__ == "__main__":
    raise SystemExit(main())
