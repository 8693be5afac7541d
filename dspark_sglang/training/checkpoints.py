"""Training checkpoints: ``checkpoints/step-NNNNNN/`` of a run directory.

Each holds the drafter (``drafter/``, the drafter's own save format) and ``train_state.pt``
(optimizer, scheduler and RNG states, the position in the batch plan and the config).
A directory only gets its ``step-*`` name once complete, so an interrupted write is
never mistaken for a checkpoint. ``run.init_from`` names such a checkpoint (or its run) to
continue it, or a drafter folder to start from its weights (``init_checkpoint``).
"""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

from dspark_sglang.training.config import TrainConfig
from dspark_sglang.training.drafters import Drafter, is_drafter_folder, save_any_drafter

STATE_FILE = "train_state.pt"
DRAFTER_DIR = "drafter"


def latest_checkpoint(out_dir: Path) -> Path | None:
    ckpts = sorted((out_dir / "checkpoints").glob("step-*"))
    ckpts = [c for c in ckpts if (c / STATE_FILE).exists()]
    return ckpts[-1] if ckpts else None


def init_checkpoint(cfg: TrainConfig) -> Path:
    """What ``run.init_from`` names: a training checkpoint (with ``STATE_FILE``), checked
    against this config, or a drafter folder (``is_drafter_folder``; the trainer checks it
    against this run's drafter with ``load_init_drafter``).

    From a checkpoint only the schedule and the data may differ from the source run: a
    different drafter would load weights into the wrong shapes (or silently keep the
    source's model).
    """
    assert cfg.run.init_from is not None
    src = Path(cfg.run.init_from)
    ckpt = src if (src / STATE_FILE).exists() else latest_checkpoint(src)
    if ckpt is None and is_drafter_folder(src):
        return src
    if ckpt is None:
        missing = "" if src.exists() else " (it does not exist)"
        raise FileNotFoundError(
            f"run.init_from={src}{missing} is neither a training run or checkpoint (a run's "
            f"out_dir with checkpoints/step-*, or a step-* folder with {STATE_FILE}: weights, "
            "optimizer and step carry over) nor a drafter folder (config.json + "
            "model.safetensors, as import-drafter and export-drafter write it: its weights "
            "start a fresh run); point it at one of them"
        )
    src_cfg_path = ckpt.parent.parent / "config.json"
    if src_cfg_path.exists():
        src_cfg = json.loads(src_cfg_path.read_text())
        this_cfg = json.loads(json.dumps(cfg.to_dict()))  # as config.json stores it
        for key in ("drafter", "target", "loss", "anchors"):
            if src_cfg.get(key) != this_cfg[key]:
                raise ValueError(
                    f"run.init_from={ckpt} was trained with a different '{key}' section "
                    f"({src_cfg_path}); only data, optim and run may change when continuing"
                )
    return ckpt


def rng_state(device: torch.device | None = None) -> dict[str, Any]:
    """CPU torch, Python and NumPy generators, and every visible GPU's when training on CUDA."""
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "python": random.getstate(),
        "numpy": np.random.get_state(),
    }
    if device is not None and device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any], device: torch.device | None = None) -> None:
    """Inverse of ``rng_state``; GPU states are restored when this run is on CUDA too
    (the first ``device_count`` of them: a resume on fewer GPUs keeps those it has)."""
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    if "cuda" in state and device is not None and device.type == "cuda":
        for i, s in enumerate(state["cuda"][: torch.cuda.device_count()]):
            torch.cuda.set_rng_state(s, i)


def write_checkpoint(
    out_dir: Path,
    cfg: TrainConfig,
    drafter: Drafter,
    opt: torch.optim.Optimizer,
    sched: Any,
    step: int,
    epoch: int,
    batch: int,
    device: torch.device,
    world_size: int = 1,
    weights: dict[str, torch.Tensor] | None = None,
    optimizer_state: dict[str, Any] | None = None,
) -> Path:
    """Write ``out_dir/checkpoints/step-NNNNNN`` and drop all but the newest
    ``run.keep_checkpoints`` (``Trainer.save_checkpoint`` says what goes in)."""
    root = out_dir / "checkpoints"
    final = root / f"step-{step:06d}"
    tmp = root / f".tmp-step-{step:06d}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    save_any_drafter(drafter, tmp / DRAFTER_DIR, weights)
    torch.save(
        {
            "step": step,
            "epoch": epoch,
            "batch": batch,
            "optimizer": opt.state_dict() if optimizer_state is None else optimizer_state,
            "scheduler": sched.state_dict(),
            "rng": rng_state(device),
            "config": cfg.to_dict(),
            "world_size": world_size,  # informational: any world size may resume
        },
        tmp / STATE_FILE,
    )
    shutil.rmtree(final, ignore_errors=True)
    tmp.rename(final)
    keep = sorted(c for c in root.glob("step-*") if (c / STATE_FILE).exists())
    for old in keep[: -cfg.run.keep_checkpoints]:
        shutil.rmtree(old, ignore_errors=True)
    return final
