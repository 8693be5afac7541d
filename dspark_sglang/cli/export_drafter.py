"""``dspark-sglang export-drafter``: a trained run becomes a shippable drafter folder.

Checks the drafter against its target, stores it at ``--dtype`` (bfloat16 by
default) and ships a validated STS file beside it (``training/export.py``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from dspark_sglang.cli.base import Command
from dspark_sglang.training.export import DRAFT_VOCAB_RANKINGS


def _add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--from",
        dest="source",
        required=True,
        type=Path,
        help="a DSpark/DFlash checkpoint: a training run's out_dir (latest step), a "
        "step-NNNNNN folder or its drafter/ folder",
    )
    p.add_argument("--to", required=True, type=Path, help="folder to write (config + weights)")
    p.add_argument(
        "--format",
        choices=FORMATS,
        default="ours",
        help="ours (default): the layout DSPARK_MOE's own draft class loads; deepspec: "
        "DeepSpec's Qwen3DSparkModel layout (architectures, draft fields at the top level, "
        "the target's embedding and LM head stored), which SGLang's own DSPARK and dense "
        "draft class load, written into a new folder. Only a dense drafter without a "
        "sliding window or token map has a DeepSpec form: anything else is refused, naming "
        "the field (docs/use-a-drafter-you-already-have.md)",
    )
    p.add_argument(
        "--dtype",
        choices=("bfloat16", "float16", "float32"),
        default="bfloat16",
        help="stored precision of the weights (default bfloat16: half the size; loading "
        "casts back to float32)",
    )
    p.add_argument(
        "--sts",
        type=Path,
        default=None,
        help="STS calibration JSON to ship beside the weights as sts.json (validated)",
    )
    p.add_argument(
        "--sts-greedy",
        type=Path,
        default=None,
        help="STS calibration JSON fitted on greedy rollouts (bench acceptance --temperature "
        "0), shipped as sts_greedy.json: greedy-only tiers use it instead of sts.json",
    )
    p.add_argument(
        "--target",
        default="smollm2",
        help="target the drafter belongs to: 'smollm2' or an HF model folder (default smollm2)",
    )
    p.add_argument(
        "--draft-vocab-size",
        type=int,
        default=None,
        metavar="K",
        help="ship the drafter narrowed to the K most frequent response tokens (and EOS) of "
        "--draft-vocab-data, without retraining: a cheaper draft pass; the coverage of the "
        "map is printed (drafts outside it are lost)",
    )
    p.add_argument(
        "--greedy-draft-vocab-size",
        type=int,
        default=None,
        metavar="K",
        help="ship the full drafter plus a greedy map of the K most frequent response tokens "
        "(and EOS) of --draft-vocab-data, ranked as --draft-vocab-by says: SGLang drafts over "
        "the map only when it drafts by argmax (SGLANG_DSPARK_USE_GREEDY_DRAFT=1, greedy-only "
        "tiers) and over the whole vocabulary otherwise; the map's coverage is printed",
    )
    p.add_argument(
        "--narrow-to-greedy-map",
        action="store_true",
        help="ship a drafter that carries a greedy map narrowed to it (no data needed): "
        "sampled requests then draft over the map too, which makes a sampled round cheaper "
        "on a CPU engine and loses the drafter's mass outside the map",
    )
    p.add_argument(
        "--draft-vocab-data",
        type=Path,
        default=None,
        metavar="DIR",
        help="a data-stage folder (dspark-sglang train --stage data) whose regenerated "
        "responses the token map is counted from",
    )
    p.add_argument(
        "--draft-vocab-by",
        choices=DRAFT_VOCAB_RANKINGS,
        default="count",
        help="how the map ranks tokens: count (how often the responses hold each token; "
        "default) or mass (the target's temperature-1 probability of each token summed over "
        "the response positions: one target forward pass over the data, and it ranks the "
        "tokens the responses never sampled too, which a few thousand replies leave at zero)",
    )


FORMATS = ("ours", "deepspec")
#: Flags of our own layout only: DeepSpec's has no token map.
_OURS_ONLY = ("draft_vocab_size", "greedy_draft_vocab_size", "narrow_to_greedy_map",
              "draft_vocab_data")  # fmt: skip


def _run_deepspec(args: argparse.Namespace) -> int:
    from dspark_sglang.training.deepspec_io import export_deepspec

    given = [f"--{k.replace('_', '-')}" for k in _OURS_ONLY if getattr(args, k)]
    if given:
        print(
            f"export-drafter: error: {', '.join(given)}: DeepSpec's layout has no token map "
            "(its LM head and Markov head cover the whole vocabulary); drop them or use "
            "--format ours",
            file=sys.stderr,
        )
        return 2
    try:
        dest = export_deepspec(
            args.source,
            args.to,
            target=args.target,
            dtype=args.dtype,
            sts=args.sts,
            sts_greedy=args.sts_greedy,
        )
    except (ValueError, FileNotFoundError) as exc:
        print(f"export-drafter: error: {exc}", file=sys.stderr)
        return 2
    print(f"exported {args.source} -> {dest} in DeepSpec's layout (architectures Qwen3DSparkModel)")
    return 0


def _run(args: argparse.Namespace) -> int:
    from dspark_sglang.training.export import export_drafter

    if args.format == "deepspec":
        return _run_deepspec(args)
    try:
        res = export_drafter(
            args.source,
            args.to,
            dtype=args.dtype,
            sts=args.sts,
            sts_greedy=args.sts_greedy,
            target=args.target,
            draft_vocab_size=args.draft_vocab_size,
            draft_vocab_data=args.draft_vocab_data,
            draft_vocab_by=args.draft_vocab_by,
            greedy_draft_vocab_size=args.greedy_draft_vocab_size,
            narrow_to_greedy_map=args.narrow_to_greedy_map,
            progress=True,
        )
    except (ValueError, FileNotFoundError) as exc:  # CheckpointError is a ValueError
        print(f"export-drafter: error: {exc}", file=sys.stderr)
        return 2
    print(
        f"exported {res.kind} drafter {res.source} -> {res.dest} ({res.size_bytes / 2**20:.1f} MiB)"
        + (f"; kept {', '.join(res.kept)}" if res.kept else "")
    )
    if res.narrowed_to_greedy_map is not None:
        print(f"token map: the drafter's {res.narrowed_to_greedy_map}-token greedy map")
    for label, cov in (("token map", res.draft_vocab), ("greedy map", res.greedy_draft_vocab)):
        if cov is not None:
            print(f"{label}: {_coverage_line(cov)}")
    return 0


def _coverage_line(cov: dict[str, object]) -> str:
    """``8192 of 49152 tokens, covering 99.1% of 1234 response tokens ...``."""
    return (
        f"{cov['draft_vocab_size']} of {cov['vocab_size']} tokens, covering "
        f"{float(cov['coverage']):.1%} of {cov['response_tokens']} response tokens"
        + (
            f" and {float(cov['mass_coverage']):.1%} of the target's probability there"
            if "mass_coverage" in cov
            else ""
        )
    )


COMMAND = Command(
    name="export-drafter",
    help="Ship a trained drafter: checked, bfloat16, with STS",
    description=(
        "Ship a trained DSpark drafter: check it against its target, store it in bfloat16, "
        "add its STS file."
    ),
    add_arguments=_add_arguments,
    run=_run,
)
