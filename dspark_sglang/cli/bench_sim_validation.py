"""``dspark-sglang bench sim-validation``: the serving simulator against a live SGLang server.

Parses the flags into ``ValidationSettings`` (bad input is refused before any
server starts), starts SGLang's CPU server with DSPARK_MOE and our static-k policy
unless ``--base-url`` names one, and hands the run to ``bench/sim_validation/``;
prints the predicted vs measured table and writes the JSON and the plot. With
``--resimulate RUN.json ...`` it starts no server: it re-simulates stored runs with
today's simulator (``sim_validation.compare.resimulate_run``), prints, writes nothing.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from dspark_sglang.cli.base import (
    CommaJoin,
    Command,
    RawDefaultsHelpFormatter,
    UsageError,
    resolve_outputs,
)

_SIMVAL_HELP = "Serving simulator vs a live SGLang server on CPU."
_SIMVAL_DESCRIPTION = """\
Check the simulator's predictions against a real server. Starts SGLang's HTTP
server on 127.0.0.1 (SmolLM2 target, DSPARK_MOE with the drafter, our static-k
policy, radix cache off) unless --base-url points at one already running with the
same settings, then:
  1. profiles the server: decode step time at 1..max(concurrency) requests and
     prefill time of a few real prompts -> an SGLang SpsCostTable of this server;
  2. for each --concurrency c: times the decode step at c requests again (the
     machine's speed drifts), then runs a closed loop of real eval prompts (GSM8K,
     HumanEval, MT-Bench, chat template, temperature 1, EOS ignored);
  3. simulates the same load on that level's table, replaying --traces
     (acceptance of the same drafter recorded by `bench acceptance --traces-dir`),
     timed as the server streams: the first token arrives with the first
     speculative round, and a client's next request joins one step late.
Prints predicted vs measured throughput and per-user speed (p50, p90) with the
relative error, and splits each load's time into its own quiet decode step (vs the
probe's) and what arrivals held the others up (vs the simulator's prefill charge);
writes a JSON (--out) and a PNG (--plot). The load never feeds
the table: the prediction is out of sample. Timings on a shared machine are
noisy; run it when nothing else is running.

--resimulate RUN.json ... starts no server: each stored run's levels are simulated
again on their stored tables, once with the run's own settings (which must give back
its stored predictions) and once with today's simulator timing; prints the errors
before -> now, writes nothing.
"""
_SIMVAL_EPILOG = """\
example (about 20 minutes on 2 cores; writes to a fresh run folder, printed at the end):
  dspark-sglang bench sim-validation --concurrency 1,2,4 --static-k 2
the committed result (benchmarks/README.md):
  dspark-sglang bench sim-validation --concurrency 1,2,4 --static-k 2 \\
      --out benchmarks/results/sim_validation.json
re-simulate it with today's simulator (seconds, no server, writes nothing):
  dspark-sglang bench sim-validation --resimulate benchmarks/results/sim_validation.json
"""
_DEFAULT_TRACES = "benchmarks/results/traces/smollm2_dspark_{gsm8k,humaneval,mtbench}.jsonl"

#: Names the result file and its run folder (committed copy: results/sim_validation.json).
BENCHMARK = "sim_validation"


def _add_arguments(v: argparse.ArgumentParser) -> None:
    v.add_argument(
        "--drafter",
        type=Path,
        default=None,
        help="DSpark checkpoint folder served by DSPARK_MOE (default: the embedded SmolLM2 one)",
    )
    v.add_argument(
        "--traces",
        nargs="+",
        default=None,
        help=f"acceptance traces of that drafter (default: {_DEFAULT_TRACES})",
    )
    v.add_argument("--static-k", type=int, default=2, help="drafts verified per request and step")
    v.add_argument(
        "--concurrency",
        action=CommaJoin,
        default="1,2,4",
        help="comma-separated closed-loop levels",
    )
    v.add_argument(
        "--requests-per-client",
        type=int,
        default=4,
        help="requests per level = this x level, at least --min-requests",
    )
    v.add_argument(
        "--min-requests",
        type=int,
        default=12,
        help="fewest requests run at any level (warm-up included): low levels need enough "
        "requests for their acceptance to match the traces'",
    )
    v.add_argument("--max-new-tokens", type=int, default=64, help="output tokens per request")
    v.add_argument(
        "--num-prompts",
        type=int,
        default=10,
        help="first N prompts of each eval set (with --resimulate: the stored runs' value)",
    )
    v.add_argument(
        "--probes-after",
        type=int,
        default=0,
        help="after each level's load, time the decode step at c requests this many more "
        "times, one probe each: whether the machine's speed moved while the load ran "
        "(stored per level as probes_after; 0: none)",
    )
    v.add_argument("--threads", type=int, default=1, help="OpenMP threads of the server")
    v.add_argument("--base-url", default=None, help="use this running server instead")
    v.add_argument("--seed", type=int, default=0, help="simulator seed")
    v.add_argument(
        "--out",
        type=Path,
        default=None,
        help="JSON: server profile, cost table, predicted and measured figures, errors. "
        "None: sim_validation.json in a fresh run folder, "
        "<cache>/runs/bench/sim_validation-<UTC time>/ (printed at the end); the committed "
        "result is written only by --out benchmarks/results/sim_validation.json",
    )
    v.add_argument(
        "--plot",
        type=Path,
        default=None,
        help="PNG: predicted vs measured against concurrency. "
        "None: beside --out, same name with .png",
    )
    v.add_argument(
        "--resimulate",
        nargs="+",
        type=Path,
        default=None,
        metavar="RUN.json",
        help="start no server: re-simulate these stored runs with today's simulator, "
        "print the table, write nothing",
    )


def _simval_settings(args: argparse.Namespace) -> Any:
    from dspark_sglang.bench.sim_validation import ValidationSettings

    try:
        levels = tuple(int(x) for x in args.concurrency.split(",") if x.strip())
    except ValueError as exc:
        raise UsageError(
            f"--concurrency {args.concurrency!r}: give comma-separated integers, e.g. 1,2,4"
        ) from exc
    if args.num_prompts < 1:
        raise UsageError(f"--num-prompts must be >= 1, got {args.num_prompts}")
    if args.threads < 1:
        raise UsageError(f"--threads must be >= 1, got {args.threads}")
    try:
        return ValidationSettings(
            static_k=args.static_k,
            concurrencies=levels,
            requests_per_client=args.requests_per_client,
            min_requests=args.min_requests,
            max_new_tokens=args.max_new_tokens,
            probes_after=args.probes_after,
            seed=args.seed,
        )
    except ValueError as exc:
        raise UsageError(f"bench sim-validation: {exc}") from exc


def _resimulate(args: argparse.Namespace) -> int:
    """``--resimulate``: stored runs simulated again, printed; no server, nothing written."""
    import json

    from rich.console import Console
    from rich.table import Table

    from dspark_sglang.bench.sim_validation import resimulate_run, validation_prompts
    from dspark_sglang.targets.smollm2 import ensure_smollm2_with_status

    console = Console(width=max(Console().width, 110))
    try:
        given = [f for f, v in (("--out", args.out), ("--plot", args.plot)) if v is not None]
        if args.base_url:
            given.append("--base-url")
        if given:
            raise UsageError(
                f"--resimulate starts no server and writes nothing: drop {', '.join(given)}"
            )
        if args.num_prompts < 1:
            raise UsageError(f"--num-prompts must be >= 1, got {args.num_prompts}")
        runs = []
        for path in args.resimulate:
            if not path.is_file():
                raise UsageError(f"--resimulate {path}: no such file; give a run's JSON")
            runs.append((path, json.loads(path.read_text())))
        prompts, domains = validation_prompts(ensure_smollm2_with_status(console), args.num_prompts)
        levels = [
            (path, resimulate_run(run, prompts, domains, name=path.name)) for path, run in runs
        ]
    except (ValueError, FileNotFoundError, OSError, KeyError) as exc:
        print(f"bench sim-validation: error: {exc}", file=sys.stderr)
        return 2
    tab = Table(title="stored runs re-simulated: as run -> with today's timing")
    for col in ("run", "c", "throughput err", "TTFT live / sim, s", "per-user p50 err"):
        tab.add_column(col, justify="right")
    for path, run_levels in levels:
        for lv in run_levels:
            old, new = lv.error("as_run"), lv.error("today")
            tab.add_row(
                path.name,
                str(lv.concurrency),
                f"{old['throughput']:+.1%} -> {new['throughput']:+.1%}",
                f"{lv.measured.ttft_p50:.2f} / {lv.as_run.ttft_p50:.2f} -> {lv.today.ttft_p50:.2f}",
                f"{old['user_tps_p50']:+.1%} -> {new['user_tps_p50']:+.1%}",
            )
    console.print(tab)
    return 0


def _run(args: argparse.Namespace) -> int:
    if args.resimulate:
        return _resimulate(args)
    import contextlib
    import datetime as _dt
    import tempfile

    from rich.console import Console
    from rich.table import Table

    from dspark_sglang.bench.sim_validation import (
        EVAL_SETS,
        plot_report,
        run_validation,
        server_spec,
        validation_prompts,
        write_report,
    )
    from dspark_sglang.planning.traces import load_traces_many
    from dspark_sglang.results import software_versions
    from dspark_sglang.sglang_integration.server import cpu_server
    from dspark_sglang.targets.smollm2 import DEFAULT_DRAFTER_DIR, ensure_smollm2_with_status

    console = Console()
    try:
        settings = _simval_settings(args)
        resolve_outputs(args, BENCHMARK)
        drafter = (args.drafter or DEFAULT_DRAFTER_DIR).resolve()
        if not (drafter / "config.json").is_file():
            raise UsageError(f"--drafter {drafter}: no config.json; pass a checkpoint folder")
        trace_files = args.traces or [
            f"benchmarks/results/traces/smollm2_dspark_{d}.jsonl" for d in EVAL_SETS
        ]
        traces = load_traces_many(trace_files)
        model_path = ensure_smollm2_with_status(console)
        prompts, domains = validation_prompts(model_path, args.num_prompts)
    except (ValueError, FileNotFoundError, OSError) as exc:
        print(f"bench sim-validation: error: {exc}", file=sys.stderr)
        return 2
    with contextlib.ExitStack() as stack:
        if args.base_url:
            base_url = args.base_url.rstrip("/")
        else:
            tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="dspark-simval-")))
            spec = server_spec(model_path, drafter, settings.static_k, args.threads, tmp)
            console.print(
                f"starting SGLang server (DSPARK_MOE, {drafter.name}, static k={settings.static_k})"
            )
            base_url = stack.enter_context(cpu_server(spec, tmp / "server.log")).base_url
        profile, table, points = run_validation(
            base_url, prompts, domains, traces, settings, progress=console.print
        )
    table_out = Table(title="simulator vs live SGLang server (closed loop): live / simulated")
    for col in ("clients", "throughput tok/s", "per-user p50", "per-user p90", "accepted/round"):
        table_out.add_column(col, justify="right")
    for p in points:
        m, s, e = p.measured, p.predicted, p.error
        table_out.add_row(
            str(m.concurrency),
            f"{m.throughput:.2f} / {s.throughput:.2f} ({e['throughput']:+.1%})",
            f"{m.user_tps_p50:.2f} / {s.user_tps_p50:.2f} ({e['user_tps_p50']:+.1%})",
            f"{m.user_tps_p90:.2f} / {s.user_tps_p90:.2f} ({e['user_tps_p90']:+.1%})",
            f"{m.mean_accept_len:.2f} / {s.mean_accept_len:.2f}",
        )
    console.print(table_out)
    meta = {
        "benchmark": "sim-validation",
        "date": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "versions": software_versions(),
        "drafter": str(drafter),
        "traces": [str(t) for t in trace_files],
        "settings": settings.to_dict(),
        "server": {
            "base_url": args.base_url or "started here (127.0.0.1)",
            "threads": args.threads,
        },
    }
    write_report(args.out, profile, table, points, meta)
    plot_report(args.plot, points, f"simulator vs live SGLang (CPU, static k={settings.static_k})")
    console.print(f"wrote {args.out} and {args.plot}")
    return 0


COMMAND = Command(
    name="sim-validation",
    help=_SIMVAL_HELP,
    description=_SIMVAL_DESCRIPTION,
    epilog=_SIMVAL_EPILOG,
    formatter_class=RawDefaultsHelpFormatter,
    add_arguments=_add_arguments,
    run=_run,
)
