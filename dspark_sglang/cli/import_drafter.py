"""``dspark-sglang import-drafter``: a drafter in another project's layout becomes ours.

``--format deepspec`` (``training/deepspec_io.py``): a DeepSpec ``Qwen3DSparkModel``
folder, checked against ``--target`` and written as our checkpoint, which ``load_drafter``
and DSPARK_MOE's own draft class read. ``--format speculators``
(``training/speculators_io.py``): a vLLM speculators DSpark folder, its layer ids shifted
and its reduced vocabulary carried; a 1+N checkpoint is refused, and a file without
``sample_from_anchor`` needs ``--sample-from-anchor``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from dspark_sglang.cli.base import Command

FORMATS = ("deepspec", "speculators")


def _add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--format",
        required=True,
        choices=FORMATS,
        help="the layout of --from: deepspec (DeepSpec's Qwen3DSparkModel save_pretrained "
        "folder: config.json with the draft fields at the top level, model.safetensors) or "
        "speculators (vLLM speculators' DSpark: speculators_model_type dspark)",
    )
    p.add_argument("--from", dest="source", required=True, type=Path, help="the drafter folder")
    p.add_argument("--to", required=True, type=Path, help="a new folder to write ours into")
    p.add_argument(
        "--target",
        default="smollm2",
        help="the target the drafter was trained for: 'smollm2' or an HF model folder "
        "(DeepSpec does not record it; its hidden size, vocabulary and depth are checked "
        "against the drafter, and its folder name becomes the drafter's target_name)",
    )
    p.add_argument(
        "--sample-from-anchor",
        choices=("true", "false"),
        default=None,
        help="speculators only: the slot layout of a config.json without sample_from_anchor "
        "(speculators before 2026-07-13, whose DSpark was 1+N); never guessed. true: slot k "
        "predicts anchor+k+1 (imported); false: 1+N (refused: one slot off)",
    )


def _run(args: argparse.Namespace) -> int:
    from dspark_sglang.training.deepspec_io import import_deepspec
    from dspark_sglang.training.speculators_io import import_speculators

    try:
        if args.format == "speculators":
            anchor = None if args.sample_from_anchor is None else args.sample_from_anchor == "true"
            out = import_speculators(
                args.source, args.to, target=args.target, sample_from_anchor=anchor
            )
        elif args.sample_from_anchor is not None:
            raise ValueError("--sample-from-anchor is for --format speculators only")
        else:
            out = import_deepspec(args.source, args.to, target=args.target)
    except (ValueError, FileNotFoundError) as exc:  # CheckpointError is a ValueError
        print(f"import-drafter: error: {exc}", file=sys.stderr)
        return 2
    print(f"imported {args.source} ({args.format}) -> {out}")
    return 0


COMMAND = Command(
    name="import-drafter",
    help="Convert a DeepSpec or speculators drafter to ours",
    description=(
        "Convert a drafter in another project's layout into ours (checked against its "
        "target). DSPARK_MOE serves a DeepSpec folder as it is; import it to train, "
        "calibrate or benchmark it with this project's tools."
    ),
    add_arguments=_add_arguments,
    run=_run,
)
