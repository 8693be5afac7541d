"""``dspark-sglang calibrate``: fit STS temperatures from held-out rollouts.

Writes the SGLang-compatible STS JSON (``--speculative-dspark-confidence-sts-path``),
prints the per-position ECE/AUC table and optionally a reliability diagram, so
one command turns recorded rounds into a deployable calibration.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from dspark_sglang.cli import Command

__all__ = ["COMMANDS"]


def _add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--rollouts",
        nargs="+",
        required=True,
        metavar="FILE",
        help="rollout files or globs: our .pt/.jsonl (confidence_logits, accepted[, verified]) "
        "or SGLang StsDataRecorder shards (logits, prefix_mask)",
    )
    p.add_argument("--out", required=True, type=Path, help="STS calibration JSON to write")
    p.add_argument("--plot", type=Path, default=None, help="reliability diagram PNG to write")
    p.add_argument("--n-bins", type=int, default=15, help="equal-width ECE bins (default 15)")
    p.add_argument(
        "--dataset",
        default=None,
        help="dataset description stored in the JSON (default: the rollout paths)",
    )
    p.add_argument("--grid-min", type=float, default=0.05, help="smallest temperature tried")
    p.add_argument("--grid-max", type=float, default=20.0, help="largest temperature tried")
    p.add_argument("--grid-steps", type=int, default=241, help="log-spaced grid points")


def _run(args: argparse.Namespace) -> int:
    from dspark_sglang.calibration.rollouts import load_rollouts
    from dspark_sglang.calibration.sts import default_grid, fit_sts

    try:
        data = load_rollouts(args.rollouts)
        fit = fit_sts(
            data.confidence_logits,
            data.accepted,
            default_grid(args.grid_min, args.grid_max, args.grid_steps),
            n_bins=args.n_bins,
            verified=data.verified,
        )
    except ValueError as exc:
        print(f"calibrate: error: {exc}", file=sys.stderr)
        return 2
    dataset = args.dataset if args.dataset is not None else ",".join(args.rollouts)
    fit.to_calibration(dataset).save(args.out)
    print(fit.table())
    print(f"wrote {args.out}")
    if args.plot is not None:
        from dspark_sglang.calibration.plots import reliability_diagram

        reliability_diagram(
            args.plot,
            data.confidence_logits,
            data.accepted,
            fit.temperatures,
            n_bins=args.n_bins,
            verified=data.verified,
        )
        print(f"wrote {args.plot}")
    return 0


COMMANDS: dict[str, Command] = {
    "calibrate": (
        "Fit Sequential Temperature Scaling of the confidence head from rollouts "
        "and write SGLang's STS JSON.",
        _add_arguments,
        _run,
    )
}
