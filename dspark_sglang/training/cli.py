"""``dspark-sglang train --config configs/<x>.yaml``: data generation and drafter training.

Stages: ``data`` builds the prompt mix, checks it is disjoint from the eval
sets, has the target regenerate responses (temperature 1) and caches hidden
states; ``train`` trains the configured drafter on that cache; ``all`` (the
default) does both. Both stages resume where they stopped (data: per shard;
train: ``--resume`` from the latest checkpoint).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from dspark_sglang.cli import Command
from dspark_sglang.training.config import TrainConfig, load_config


def _add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", required=True, type=Path, help="training config YAML (configs/)")
    p.add_argument(
        "--stage",
        choices=("data", "train", "all"),
        default="all",
        help="data: prompts -> responses -> hidden cache; train: drafter; all: both",
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
        help="override run.init_from: continue another run's checkpoint (weights, optimizer, "
        "step) under this config's schedule and data",
    )
    p.add_argument(
        "--threads",
        type=int,
        default=None,
        help="override run.threads (torch threads; 1 per process when runs share the CPUs)",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bars (CI logs)")


def load_target(cfg: TrainConfig):
    """The configured target (``smollm2`` = the converted PyPI GGUF, else an HF folder)."""
    from dspark_sglang.targets.hf_target import HFTarget
    from dspark_sglang.targets.smollm2 import ensure_smollm2

    path = ensure_smollm2() if cfg.target.name == "smollm2" else Path(cfg.target.name)
    return HFTarget(path, num_threads=cfg.run.threads)


def run_data_stage(
    cfg: TrainConfig,
    target,
    limit: int | None,
    progress: bool,
    gen_batches: int | None = None,
) -> dict[str, float]:
    """Prompts -> regenerated responses -> float16 hidden cache; returns throughput figures."""
    from dspark_sglang.data.evalsets import load_gsm8k_test, load_humaneval, load_mtbench
    from dspark_sglang.training.datagen import (
        HIDDEN_DIR,
        RESPONSES_DIR,
        EncodedPrompt,
        GenerationSettings,
        cache_hidden_states,
        generate_responses,
        throughput,
    )
    from dspark_sglang.training.prompts import assert_disjoint, build_training_prompts
    from dspark_sglang.training.trainer import resolve_layer_ids

    d = cfg.data
    prompts = build_training_prompts(d.num_math, d.num_code, d.num_chat, d.seed)
    assert_disjoint(prompts, [*load_gsm8k_test(), *load_humaneval(), *load_mtbench()])
    encoded = []
    for p in prompts:
        ids = target.encode_chat(p.chat())
        if len(ids) <= d.max_prompt_tokens:
            encoded.append(EncodedPrompt(id=p.id, domain=p.domain, prompt_ids=ids))
    if limit is not None:
        encoded = encoded[:limit]
    tok = target.tokenizer
    pad = tok.pad_token_id if tok.pad_token_id is not None else target.eos_token_ids[0]
    settings = GenerationSettings(
        max_new_tokens=d.max_new_tokens,
        batch_size=d.gen_batch_size,
        seed=d.seed,
        dtype=d.gen_dtype,
    )
    print(f"[data] {len(encoded)} prompts (of {len(prompts)}) -> {d.dir}")
    generate_responses(
        target.model,
        encoded,
        d.dir,
        settings,
        pad_token_id=pad,
        eos_token_ids=target.eos_token_ids,
        max_batches=gen_batches,
        progress=progress,
    )
    layer_ids = resolve_layer_ids(cfg, target.spec.num_layers)
    cache_hidden_states(
        target.model,
        d.dir,
        layer_ids,
        batch_size=d.hidden_batch_size,
        pad_token_id=pad,
        progress=progress,
    )
    gen = throughput(Path(d.dir) / RESPONSES_DIR)
    hid = throughput(Path(d.dir) / HIDDEN_DIR)
    figures = {
        "gen_tokens": gen["tokens"],
        "gen_tokens_per_s": gen["tokens_per_s"],
        "hidden_tokens": hid["tokens"],
        "hidden_tokens_per_s": hid["tokens_per_s"],
        "threads": cfg.run.threads,
    }
    (Path(d.dir) / "throughput.json").write_text(json.dumps(figures, indent=2))
    print(
        f"[data] generation {gen['tokens_per_s']:.1f} tok/s, hidden cache "
        f"{hid['tokens_per_s']:.1f} tok/s"
    )
    return figures


def _run(args: argparse.Namespace) -> int:
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
    if args.gen_batches is not None and args.gen_batches < 0:
        raise SystemExit(f"--gen-batches must be >= 0, got {args.gen_batches}")
    progress = not args.no_progress
    t0 = time.perf_counter()
    target = load_target(cfg)
    if args.stage in ("data", "all"):
        run_data_stage(cfg, target, args.limit_prompts, progress, args.gen_batches)
    if args.stage in ("train", "all"):
        from dspark_sglang.training.dataset import HiddenCache
        from dspark_sglang.training.trainer import Trainer

        trainer = Trainer(
            cfg,
            HiddenCache(cfg.data.dir),
            target.spec,
            target.model.config,
            target.embed_tokens,
            target.lm_head,
            target.default_mask_token_id(),
        )
        res = trainer.train(resume=args.resume, progress=progress)
        print(
            f"[train] {cfg.name}: step {res.final_step}, loss {res.first_loss:.4f} -> "
            f"{res.last_loss:.4f}, {res.steps_per_s:.3f} steps/s, "
            f"{res.anchors_per_s:.1f} anchors/s; checkpoint {res.final_checkpoint}"
        )
    print(f"[done] {time.perf_counter() - t0:.0f} s")
    return 0


def _export_args(p: argparse.ArgumentParser) -> None:
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
        "--target",
        default="smollm2",
        help="target the drafter belongs to: 'smollm2' or an HF model folder (default smollm2)",
    )


def _export(args: argparse.Namespace) -> int:
    """Checked copy of a trained drafter for shipping: loads it against its target
    (refusing any mismatch), re-saves it at ``--dtype`` and validates the STS file."""
    import shutil
    import sys

    import torch
    from transformers import AutoModelForCausalLM

    from dspark_sglang.bench.acceptance import resolve_checkpoint
    from dspark_sglang.calibration.sts import load_sts
    from dspark_sglang.model.checkpoint import CheckpointError, load_drafter, save_drafter
    from dspark_sglang.model.config import TargetSpec
    from dspark_sglang.targets.hf_target import target_name_of
    from dspark_sglang.targets.smollm2 import ensure_smollm2

    try:
        ckpt = resolve_checkpoint("--from", args.source)
        if ckpt.kind == "ar":
            raise ValueError(
                f"--from {args.source}: an EAGLE3-style AR drafter; export ships DSpark/DFlash "
                "drafters (the SGLang DSPARK_MOE model class)"
            )
        sts = load_sts(args.sts) if args.sts is not None else None
        if sts is not None and sts.block_size != ckpt.block_size:
            raise ValueError(
                f"--sts has {sts.block_size} temperatures but the drafter's block size is "
                f"{ckpt.block_size}; fit STS on this drafter's rollouts"
            )
        path = ensure_smollm2() if args.target == "smollm2" else Path(args.target)
        if not (path / "config.json").is_file():
            raise FileNotFoundError(f"--target {path}: no config.json; pass an HF model folder")
        model = AutoModelForCausalLM.from_pretrained(str(path))
        spec = TargetSpec.from_hf_config(model.config, name=target_name_of(path))
        drafter = load_drafter(
            ckpt.folder, spec, model.get_input_embeddings(), model.get_output_embeddings()
        )
    except (ValueError, FileNotFoundError, CheckpointError) as exc:
        print(f"export-drafter: error: {exc}", file=sys.stderr)
        return 2
    if args.to.exists() and not args.to.is_dir():
        print(f"export-drafter: error: --to {args.to} is a file; give a folder", file=sys.stderr)
        return 2
    # Replace what an export writes (a stale sts.json belongs to the old drafter) and
    # keep anything else, e.g. the README that documents a shipped drafter.
    for name in _EXPORTED_FILES:
        (args.to / name).unlink(missing_ok=True)
    save_drafter(drafter, args.to, dtype=getattr(torch, args.dtype))
    if args.sts is not None:
        shutil.copyfile(args.sts, args.to / "sts.json")
    size = sum(
        args.to.joinpath(n).stat().st_size for n in _EXPORTED_FILES if (args.to / n).is_file()
    )
    kept = sorted(p.name for p in args.to.iterdir() if p.name not in _EXPORTED_FILES)
    print(
        f"exported {ckpt.kind} drafter {ckpt.folder} -> {args.to} ({size / 2**20:.1f} MiB)"
        + (f"; kept {', '.join(kept)}" if kept else "")
    )
    return 0


#: The files ``export-drafter`` owns in its destination folder.
_EXPORTED_FILES = ("config.json", "model.safetensors", "sts.json")


COMMANDS: dict[str, Command] = {
    "train": (
        "Generate training data with the target and train a drafter (DSpark, DFlash, EAGLE3).",
        _add_args,
        _run,
    ),
    "export-drafter": (
        "Ship a trained DSpark drafter: check it against its target, store it in bfloat16, "
        "add its STS file.",
        _export_args,
        _export,
    ),
}
