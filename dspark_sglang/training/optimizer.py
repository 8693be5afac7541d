"""The optimizer and LR schedule of a run: AdamW parameter groups, linear warm-up then
cosine decay (``optim`` section)."""

from __future__ import annotations

import math
from typing import Any

import torch

from dspark_sglang.training.config import TrainConfig
from dspark_sglang.training.drafters import Drafter


def lr_lambda(cfg: TrainConfig) -> Any:
    """Linear warm-up to 1, then cosine from 1 to ``min_lr_ratio`` at ``max_steps``."""
    o = cfg.optim

    def f(step: int) -> float:
        if step < o.warmup_steps:
            return (step + 1) / o.warmup_steps
        span = max(1, o.max_steps - o.warmup_steps)
        progress = min(1.0, (step - o.warmup_steps) / span)
        return o.min_lr_ratio + (1 - o.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))

    return f


def make_optimizer(cfg: TrainConfig, drafter: Drafter) -> tuple[torch.optim.Optimizer, Any]:
    """AdamW over the *unwrapped* drafter's parameters (the same groups at any world
    size, so optimizer state moves between them): decayed matrices, undecayed
    vectors, and the Markov head at ``optim.markov_lr_scale`` times the rate, with the
    ``lr_lambda`` schedule. Under FSDP, call it after sharding: the groups then hold the
    sharded parameters."""
    o = cfg.optim
    named = [(n, p) for n, p in drafter.named_parameters() if p.requires_grad]
    markov = [p for n, p in named if n.startswith("markov_head.")]
    rest = [p for n, p in named if not n.startswith("markov_head.")]
    groups: list[dict[str, Any]] = [
        {"params": [p for p in rest if p.dim() >= 2], "weight_decay": o.weight_decay},
        {"params": [p for p in rest if p.dim() < 2], "weight_decay": 0.0},
    ]
    if markov:
        groups.append(
            {"params": markov, "weight_decay": o.weight_decay, "lr": o.lr * o.markov_lr_scale}
        )
    opt = torch.optim.AdamW(groups, lr=o.lr, betas=(o.beta1, o.beta2))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda(cfg))
    return opt, sched
