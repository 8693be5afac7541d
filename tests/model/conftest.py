"""Tiny drafter fixtures (H=64, V=512) shared by the drafter tests."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn

from dspark_sglang.model.config import DSparkConfig, TargetSpec
from dspark_sglang.model.drafter import DSparkDrafter

torch.set_num_threads(1)

TINY_TARGET = TargetSpec(
    name="tiny-target",
    vocab_size=512,
    hidden_size=64,
    num_layers=8,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    rope_theta=10000.0,
    rms_norm_eps=1e-6,
    max_position_embeddings=1024,
)


def tiny_config(**overrides: Any) -> DSparkConfig:
    """Small but complete: 2 MoE layers, 3 target layers, window 8, rank 32."""
    fields: dict[str, Any] = {
        "num_hidden_layers": 2,
        "target_layer_ids": (1, 3, 5),
        "markov_rank": 32,
        "sliding_window": 8,
        "num_experts": 4,
        "num_experts_per_tok": 2,
        "mask_token_id": 1,
    }
    fields.update(overrides)
    return DSparkConfig.for_target(TINY_TARGET, **fields)


def target_modules(seed: int = 0) -> tuple[nn.Embedding, nn.Linear]:
    """A stand-in target embedding and LM head (the drafter only needs their weights)."""
    g = torch.Generator().manual_seed(seed)
    emb = nn.Embedding(TINY_TARGET.vocab_size, TINY_TARGET.hidden_size)
    head = nn.Linear(TINY_TARGET.hidden_size, TINY_TARGET.vocab_size, bias=False)
    with torch.no_grad():
        emb.weight.copy_(torch.randn(emb.weight.shape, generator=g))
        head.weight.copy_(torch.randn(head.weight.shape, generator=g) * 0.5)
    return emb, head


def build_drafter(seed: int = 0, **overrides: Any) -> DSparkDrafter:
    """A drafter with larger-than-default random weights so every term matters."""
    torch.manual_seed(seed)
    emb, head = target_modules(seed)
    drafter = DSparkDrafter(tiny_config(**overrides), emb, head)
    drafter.reset_parameters(std=0.1)
    if drafter.markov_head is not None:  # a bias comparable to the base logits
        with torch.no_grad():
            for p in drafter.markov_head.parameters():
                p.normal_(0.0, 0.5)
    return drafter.eval()


@pytest.fixture
def make_drafter() -> Callable[..., DSparkDrafter]:
    return build_drafter


@pytest.fixture
def tiny_target() -> TargetSpec:
    return TINY_TARGET


@pytest.fixture
def make_config() -> Callable[..., DSparkConfig]:
    return tiny_config


@pytest.fixture
def make_target_modules() -> Callable[..., tuple[nn.Embedding, nn.Linear]]:
    return target_modules
