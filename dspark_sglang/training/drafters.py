"""The drafter a training config names: build a fresh one, save and load either kind.

``Drafter`` is the union of the two drafter classes training handles: the block-parallel
DSpark / DFlash-style ``DSparkDrafter`` and the autoregressive EAGLE3-style ``ARDrafter``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from dspark_sglang.model import (
    DSparkConfig,
    DSparkDrafter,
    TargetSpec,
    default_target_layer_ids,
    load_drafter,
    save_drafter,
)
from dspark_sglang.model.ar_drafter import (
    ARDrafter,
    ARDrafterConfig,
    load_ar_drafter,
    save_ar_drafter,
)
from dspark_sglang.training.config import TrainConfig

Drafter = DSparkDrafter | ARDrafter


def resolve_layer_ids(cfg: TrainConfig, num_layers: int) -> tuple[int, ...]:
    """The target layers every drafter of this config reads (explicit or the default 5)."""
    if cfg.target.layer_ids is not None:
        return cfg.target.layer_ids
    return default_target_layer_ids(num_layers, n=5)


def build_drafter(
    cfg: TrainConfig,
    spec: TargetSpec,
    hf_config: Any,
    embed_tokens: nn.Embedding,
    lm_head: nn.Linear,
    mask_token_id: int,
) -> Drafter:
    """A freshly initialised drafter of ``cfg.drafter.kind`` for the target ``spec``."""
    torch.manual_seed(cfg.run.seed)
    layer_ids = resolve_layer_ids(cfg, spec.num_layers)
    overrides = dict(cfg.drafter.model)
    if cfg.drafter.kind == "eagle3":
        base: dict[str, Any] = {
            "hidden_size": spec.hidden_size,
            "vocab_size": spec.vocab_size,
            "target_layer_ids": layer_ids,
            "num_attention_heads": spec.num_attention_heads,
            "num_key_value_heads": spec.num_key_value_heads,
            "intermediate_size": int(getattr(hf_config, "intermediate_size", 4 * spec.hidden_size)),
            "rope_theta": spec.rope_theta,
            "rms_norm_eps": spec.rms_norm_eps,
            "block_size": cfg.drafter.block_size,
        }
        base.update(overrides)
        return ARDrafter(ARDrafterConfig.from_dict(base), embed_tokens, lm_head)
    if cfg.drafter.kind == "dflash":
        overrides.setdefault("markov_head_type", "none")
        overrides.setdefault("enable_confidence_head", False)
        overrides.setdefault("confidence_head_with_markov", False)
    dcfg = DSparkConfig.for_target(
        spec,
        mask_token_id=mask_token_id,
        block_size=cfg.drafter.block_size,
        target_layer_ids=layer_ids,
        **overrides,
    )
    return DSparkDrafter(dcfg, embed_tokens, lm_head)


def save_any_drafter(
    drafter: Drafter, path: Path, state: dict[str, torch.Tensor] | None = None
) -> None:
    """Save either drafter kind; ``state`` (whole tensors) replaces its ``state_dict()``."""
    if isinstance(drafter, ARDrafter):
        save_ar_drafter(drafter, path, state)
    else:
        save_drafter(drafter, path, state=state)


def load_any_drafter(
    path: Path, kind: str, spec: TargetSpec, embed_tokens: nn.Embedding, lm_head: nn.Linear
) -> Drafter:
    if kind == "eagle3":
        return load_ar_drafter(path, embed_tokens, lm_head)
    return load_drafter(path, spec, embed_tokens, lm_head)
