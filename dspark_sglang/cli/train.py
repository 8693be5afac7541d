"""``dspark-sglang train --config configs/<x>.yaml``: data generation and drafter training.

Stages (``training/pipeline.py``): ``data`` builds the prompt mix, checks it is
disjoint from the eval sets, has the target regenerate responses (temperature 1)
and caches hidden states (captured by SGLang as it samples with ``data.hidden_states:
sglang``; not with ``online``); ``train`` trains the
configured drafter on that cache, or online with the target computing them per batch;
``all`` (the default) does both. Both stages resume where they stopped (data: per
shard; train: ``--resume`` from the latest checkpoint). Flags override config fields.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

from dspark_sglang.cli.base import Command


def _add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", required=True, type=Path, help="training config YAML (configs/)")
    p.add_argument(
        "--stage",
        choices=("data", "train", "all"),
        default="all",
        help="data: prompts -> responses -> hidden cache (captured in the same pass with "
        "data.hidden_states: sglang; responses only with online); train: drafter; all: both",
    )
    p.add_argument(
        "--resume",
        action="store_true",
        help="continue training from the latest checkpoint in run.out_dir",
    )
    p.add_argument("--max-steps", type=int, default=None, help="override optim.max_steps")
    p.add_argument(
        "--limit-prompts",
        type=int,
        default=None,
        help="use only the first N prompts of the mix (dry runs, sizing)",
    )
    p.add_argument(
        "--gen-batches",
        type=int,
        default=None,
        help="time-box the data stage: generate at most N new response batches, then cache "
        "the hidden states of every batch generated so far (0: cache only). Rerun without it "
        "to generate the rest; training uses whatever batches are cached",
    )
    p.add_argument("--data-dir", type=Path, default=None, help="override data.dir")
    p.add_argument("--out-dir", type=Path, default=None, help="override run.out_dir")
    p.add_argument(
        "--init-from",
        type=Path,
        default=None,
        metavar="PATH",
        help="override run.init_from: a training run or checkpoint to continue (weights, "
        "optimizer, step), or a drafter folder (import-drafter / export-drafter output) to "
        "fine-tune from step 0 (weights only; the config must describe that drafter)",
    )
    p.add_argument(
        "--threads",
        type=int,
        default=None,
        help="override run.threads (torch threads; 1 per process when runs share the CPUs)",
    )
    p.add_argument(
        "--device",
        default=None,
        help="override run.device: cpu, cuda or cuda:N (under torchrun, cuda = each "
        "process's cuda:LOCAL_RANK)",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bars (CI logs)")


def _run(args: argparse.Namespace) -> int:
    from dspark_sglang.training.config import load_config
    from dspark_sglang.training.pipeline import load_target, run_data_stage, run_train_stage

    cfg = load_config(args.config)
    if args.max_steps is not None:
        cfg = cfg.with_overrides(optim={"max_steps": args.max_steps})
    if args.data_dir is not None:
        cfg = cfg.with_overrides(data={"dir": str(args.data_dir.resolve())})
    if args.out_dir is not None:
        cfg = cfg.with_overrides(run={"out_dir": str(args.out_dir.resolve())})
    if args.init_from is not None:
        cfg = cfg.with_overrides(run={"init_from": str(args.init_from.resolve())})
    if args.threads is not None:
        cfg = cfg.with_overrides(run={"threads": args.threads})
    if args.device is not None:
        cfg = cfg.with_overrides(run={"device": args.device})
    if args.stage in ("data", "all") and int(os.environ.get("WORLD_SIZE", "1")) > 1:
        raise SystemExit(
            "the data stage runs in one process: run --stage data without torchrun first, "
            "then torchrun ... train --stage train"
        )
    if args.gen_batches is not None and args.gen_batches < 0:
        raise SystemExit(f"--gen-batches must be >= 0, got {args.gen_batches}")
    progress = not args.no_progress
    t0 = time.perf_counter()
    stages = ("data", "train") if args.stage == "all" else (args.stage,)
    target = load_target(cfg, stages)
    if args.stage in ("data", "all"):
        run_data_stage(cfg, target, args.limit_prompts, progress, args.gen_batches)
    if args.stage in ("train", "all"):
        from dspark_sglang.training.distributed import shutdown

        try:
            res = run_train_stage(cfg, target, resume=args.resume, progress=progress)
        finally:
            shutdown()  # leave the torchrun process group (no-op with one process)
        if int(os.environ.get("RANK", "0")) == 0:
            print(
                f"[train] {cfg.name}: step {res.final_step}, loss {res.first_loss:.4f} -> "
                f"{res.last_loss:.4f}, {res.steps_per_s:.3f} steps/s, "
                f"{res.anchors_per_s:.1f} anchors/s; checkpoint {res.final_checkpoint}"
            )
    print(f"[done] {time.perf_counter() - t0:.0f} s")
    return 0


COMMAND = Command(
    name="train",
    help="Generate training data and train a drafter",
    description=(
        "Generate training data with the target and train a drafter (DSpark, DFlash, EAGLE3)."
    ),
    add_arguments=_add_arguments,
    run=_run,
)
