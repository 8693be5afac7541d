"""``dspark-sglang import-drafter``: a drafter in another project's layout becomes ours.

``--format deepspec`` (``training/deepspec_io.py``): a DeepSpec ``Qwen3DSparkModel``
folder, checked against ``--target`` and written as our checkpoint, which ``load_drafter``
and DSPARK_MOE's own draft class read.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from dspark_sglang.cli.base import Command

FORMATS = ("deepspec",)


def _add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--format",
        required=True,
        choices=FORMATS,
        help="the layout of --from: deepspec (DeepSpec's Qwen3DSparkModel save_pretrained "
        "folder: config.json with the draft fields at the top level, model.safetensors)",
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


def _run(args: argparse.Namespace) -> int:
    from dspark_sglang.training.deepspec_io import import_deepspec

    try:
        out = import_deepspec(args.source, args.to, target=args.target)
    except (ValueError, FileNotFoundError) as exc:  # CheckpointError is a ValueError
        print(f"import-drafter: error: {exc}", file=sys.stderr)
        return 2
    print(f"imported {args.source} ({args.format}) -> {out}")
    return 0


COMMAND = Command(
    name="import-drafter",
    help="Convert a DeepSpec drafter into ours, checked",
    description=(
        "Convert a drafter in another project's layout into ours (checked against its "
        "target). DSPARK_MOE serves a DeepSpec folder as it is; import it to train, "
        "calibrate or benchmark it with this project's tools."
    ),
    add_arguments=_add_arguments,
    run=_run,
)
