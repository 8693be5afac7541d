"""``dspark-sglang calibrate``: fit STS temperatures from recorded rollouts.

Writes the SGLang-compatible STS JSON (``--speculative-dspark-confidence-sts-path``),
prints the per-position table (temperature, ECE and AUC before/after; on
``--eval-rollouts`` too, when given) and optionally a report JSON and a reliability
diagram, so one command turns recorded rounds into a deployable calibration
(``calibration/sts.py`` does the fitting).

AUC before is the conditional AUC of the raw logit (``StsFit.auc``); AUC after is the
same statistic of the calibrated confidence ``sigmoid(z / T)`` in float32. Temperature
scaling preserves order, so the two agree unless a tiny temperature saturates confidences
at exactly 1.0, which the runbook (deploy/runbooks/recalibrate-sts.md) checks for.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from dspark_sglang.cli.base import Command

if TYPE_CHECKING:  # torch loads only when the command runs (fast --help)
    import torch

MAX_GRID_STEPS = 10_000  # a 0.06 % step over the default 0.05..20; the fit is linear in it

#: ``bench acceptance --traces-dir`` writes planner traces next to the rollouts; a trace
#: file given to ``--rollouts`` fails on its first extra field with this text.
_TRACE_FIELD_ERROR = "unknown field `request_id`"


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


def calibrated_aucs(
    logits: torch.Tensor,
    accepted: torch.Tensor,
    verified: torch.Tensor | None,
    temperatures: Sequence[float],
) -> tuple[float, ...]:
    """Per-position conditional AUC of the calibrated confidence ``sigmoid(z_k / T_k)``.

    Same rounds and outcome as ``StsFit.auc`` (draft ``k`` accepted, among rounds whose
    earlier drafts passed and that verified draft ``k``), scored on the float32
    confidence the STS file produces instead of the raw logit.
    """
    import torch

    from dspark_sglang.calibration.sts import _conditional_auc

    z = logits.to(torch.float32)
    temps = torch.as_tensor(list(temperatures), dtype=torch.float32)
    conf = torch.sigmoid(z / temps)
    return tuple(_conditional_auc(conf[:, k], accepted, verified, k)[0] for k in range(z.shape[1]))


def auc_table(
    ece_before: Sequence[float],
    ece_after: Sequence[float],
    auc_before: Sequence[float],
    auc_after: Sequence[float],
    num_tested: Sequence[int],
    temperatures: Sequence[float],
    summary: str,
) -> str:
    """One row per draft position (1-based): T, ECE before/after, AUC before/after, n."""
    head = (
        f"{'pos':>3}  {'T':>8}  {'ECE before':>10}  {'ECE after':>9}  "
        f"{'AUC before':>10}  {'AUC after':>9}  {'n':>8}"
    )
    lines = [head]
    rows = zip(temperatures, ece_before, ece_after, auc_before, auc_after, num_tested, strict=True)
    for k, (t, eb, ea, ab, aa, n) in enumerate(rows, start=1):
        lines.append(
            f"{k:>3}  {t:>8.4f}  {eb:>10.4f}  {ea:>9.4f}  {ab:>10.4f}  {aa:>9.4f}  {n:>8d}"
        )
    lines.append(summary)
    return "\n".join(lines)


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
        fit_auc_after = calibrated_aucs(
            data.confidence_logits, data.accepted, data.verified, fit.temperatures
        )
        held_auc_after = (
            None
            if held is None
            else calibrated_aucs(
                held_data.confidence_logits,
                held_data.accepted,
                held_data.verified,
                fit.temperatures,
            )
        )
    except ValueError as exc:
        hint = ""
        if _TRACE_FIELD_ERROR in str(exc):
            hint = (
                " (this is a planner trace file: `bench acceptance --traces-dir DIR` writes "
                "those as DIR/<drafter>/<set>.jsonl; calibrate reads the rollouts beside "
                "them, DIR/<drafter>/rollouts_<set>.jsonl)"
            )
        print(f"calibrate: error: {exc}{hint}", file=sys.stderr)
        return 2
    dataset = (
        args.dataset
        if args.dataset is not None
        else ",".join(portable_path(str(Path(p).resolve())) for p in args.rollouts)
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    fit.to_calibration(dataset).save(args.out)
    mean_b = sum(fit.ece_before) / len(fit.ece_before)
    mean_a = sum(fit.ece_after) / len(fit.ece_after)
    print("fit split:")
    print(
        auc_table(
            fit.ece_before,
            fit.ece_after,
            fit.auc,
            fit_auc_after,
            fit.num_tested,
            fit.temperatures,
            f"mean ECE before {mean_b:.4f}, after {mean_a:.4f}; {fit.num_samples} rounds",
        )
    )
    if held is not None and held_auc_after is not None:
        print("held-out split:")
        print(
            auc_table(
                held.ece_before,
                held.ece_after,
                held.auc,
                held_auc_after,
                held.num_tested,
                fit.temperatures,
                f"held-out mean ECE before {held.mean_ece_before:.4f}, after "
                f"{held.mean_ece_after:.4f}; {held.num_samples} rounds",
            )
        )
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
                "auc_after": list(fit_auc_after),
                "num_samples": fit.num_samples,
            },
            "held_out": None
            if held is None or held_auc_after is None
            else {**held.to_dict(), "auc_after": list(held_auc_after)},
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
