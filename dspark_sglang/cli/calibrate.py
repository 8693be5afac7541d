"""``dspark-sglang calibrate``: fit STS temperatures from recorded rollouts.

Writes the SGLang-compatible STS JSON (``--speculative-dspark-confidence-sts-path``),
prints the per-position ECE/AUC table (on ``--eval-rollouts`` too, when given) and
optionally a report JSON and a reliability diagram, so one command turns recorded
rounds into a deployable calibration (``calibration/sts.py`` does the fitting).
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

from dspark_sglang.cli.base import Command

MAX_GRID_STEPS = 10_000  # a 0.06 % step over the default 0.05..20; the fit is linear in it


def _grid_steps(text: str) -> int:
    try:
        steps = int(text)
    except ValueError:
        steps = 0
    if not 2 <= steps <= MAX_GRID_STEPS:
        raise argparse.ArgumentTypeError(f"must be an integer in 2..{MAX_GRID_STEPS}, got {text!r}")
    return steps


def _temperature(text: str) -> float:
    try:
        t = float(text)
    except ValueError:
        t = math.nan
    if not (math.isfinite(t) and t > 0.0):
        raise argparse.ArgumentTypeError(f"must be a finite temperature > 0, got {text!r}")
    return t


def _add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--rollouts",
        nargs="+",
        required=True,
        metavar="FILE",
        help="rollout files or globs: our .pt/.jsonl (confidence_logits, accepted[, verified]) "
        "or SGLang StsDataRecorder shards (logits, prefix_mask)",
    )
    p.add_argument(
        "--eval-rollouts",
        nargs="+",
        default=None,
        metavar="FILE",
        help="held-out rollouts (other prompts than --rollouts): the temperatures are scored "
        "there, and the plot shows them; the fit's own ECE is optimistic",
    )
    p.add_argument("--out", required=True, type=Path, help="STS calibration JSON to write")
    p.add_argument(
        "--report",
        type=Path,
        default=None,
        help="JSON with the fit and held-out figures (ECE before/after per position, AUC)",
    )
    p.add_argument(
        "--plot",
        type=Path,
        default=None,
        help="reliability diagram PNG to write (on --eval-rollouts when given)",
    )
    p.add_argument("--n-bins", type=int, default=15, help="equal-width ECE bins (default 15)")
    p.add_argument(
        "--dataset",
        default=None,
        help="dataset description stored in the JSON (default: the rollout paths)",
    )
    p.add_argument(
        "--grid-min", type=_temperature, default=0.05, help="smallest temperature tried (> 0)"
    )
    p.add_argument("--grid-max", type=_temperature, default=20.0, help="largest temperature tried")
    p.add_argument(
        "--grid-steps",
        type=_grid_steps,
        default=241,
        help=f"log-spaced grid points, 2..{MAX_GRID_STEPS} (default 241)",
    )


def _run(args: argparse.Namespace) -> int:
    from dspark_sglang.calibration.rollouts import load_rollouts
    from dspark_sglang.calibration.sts import default_grid, evaluate_sts, fit_sts
    from dspark_sglang.results import dump_json, portable_path

    if args.grid_min >= args.grid_max:
        print(
            f"calibrate: error: --grid-min ({args.grid_min:g}) must be below --grid-max "
            f"({args.grid_max:g})",
            file=sys.stderr,
        )
        return 2
    try:
        data = load_rollouts(args.rollouts)
        fit = fit_sts(
            data.confidence_logits,
            data.accepted,
            default_grid(args.grid_min, args.grid_max, args.grid_steps),
            n_bins=args.n_bins,
            verified=data.verified,
        )
        held = None
        if args.eval_rollouts:
            held_data = load_rollouts(args.eval_rollouts)
            if held_data.block_size != data.block_size:
                raise ValueError(
                    f"--eval-rollouts have block size {held_data.block_size}, --rollouts "
                    f"{data.block_size}: record both with the same drafter"
                )
            held = evaluate_sts(
                held_data.confidence_logits,
                held_data.accepted,
                fit.temperatures,
                n_bins=args.n_bins,
                verified=held_data.verified,
            )
    except ValueError as exc:
        print(f"calibrate: error: {exc}", file=sys.stderr)
        return 2
    dataset = (
        args.dataset
        if args.dataset is not None
        else ",".join(portable_path(str(Path(p).resolve())) for p in args.rollouts)
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    fit.to_calibration(dataset).save(args.out)
    print("fit split:")
    print(fit.table())
    if held is not None:
        print("held-out split:")
        print(held.table())
    print(f"wrote {args.out}")
    if args.report is not None:
        report = {
            "sts_path": str(args.out),
            "rollouts": list(args.rollouts),
            "eval_rollouts": list(args.eval_rollouts or []),
            "temperatures": list(fit.temperatures),
            "fit": {
                "ece_before": list(fit.ece_before),
                "ece_after": list(fit.ece_after),
                "auc": list(fit.auc),
                "num_samples": fit.num_samples,
            },
            "held_out": None if held is None else held.to_dict(),
        }
        dump_json(args.report, report)
        print(f"wrote {args.report}")
    if args.plot is not None:
        from dspark_sglang.calibration.plots import reliability_diagram

        shown = held_data if held is not None else data
        args.plot.parent.mkdir(parents=True, exist_ok=True)
        reliability_diagram(
            args.plot,
            shown.confidence_logits,
            shown.accepted,
            fit.temperatures,
            n_bins=args.n_bins,
            verified=shown.verified,
            title="STS reliability (held-out)" if held is not None else "STS reliability (fit)",
        )
        print(f"wrote {args.plot}")
    return 0


COMMAND = Command(
    name="calibrate",
    help="Fit STS confidence temperatures from rollouts",
    description=(
        "Fit Sequential Temperature Scaling of the confidence head from rollouts "
        "and write SGLang's STS JSON."
    ),
    add_arguments=_add_arguments,
    run=_run,
)
