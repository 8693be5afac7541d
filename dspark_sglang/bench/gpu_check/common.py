"""What every GPU check shares: problem sizes, the result row, the target geometry."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import torch

PAPER_VOCAB = 151936


@dataclass(frozen=True)
class Sizes:
    """Problem sizes of one run (``full`` on a GPU, ``small`` for the CPU test)."""

    policy_cases: int
    policy_max_n: int
    policy_block: int
    lagged_steps: int
    graph_requests: int
    graph_context: int
    verify_requests: int
    verify_block: int
    verify_vocab: int
    train_vocab: int
    train_anchors: int
    train_seq_len: int
    train_steps: int
    tiny_target: bool


FULL = Sizes(
    policy_cases=48,
    policy_max_n=256,
    policy_block=7,
    lagged_steps=6,
    graph_requests=16,
    graph_context=256,
    verify_requests=32,
    verify_block=7,
    verify_vocab=PAPER_VOCAB,
    train_vocab=PAPER_VOCAB,
    train_anchors=512,
    train_seq_len=2048,
    train_steps=5,
    tiny_target=False,
)
SMALL = Sizes(
    policy_cases=6,
    policy_max_n=16,
    policy_block=5,
    lagged_steps=4,
    graph_requests=3,
    graph_context=24,
    verify_requests=16,
    verify_block=5,
    verify_vocab=64,
    train_vocab=512,
    train_anchors=8,
    train_seq_len=64,
    train_steps=2,
    tiny_target=True,
)


@dataclass
class Row:
    """One check's outcome: ``status`` is ``pass``, ``fail`` or ``error``."""

    check: str
    status: str
    detail: str
    metrics: dict[str, Any] = field(default_factory=dict)


def verdict(ok: bool) -> str:
    return "pass" if ok else "fail"


def target_spec(sizes: Sizes, vocab_size: int) -> Any:
    """SmolLM2's geometry with ``vocab_size`` tokens, or a tiny target for ``--small``."""
    from dspark_sglang.model.config import TargetSpec
    from dspark_sglang.targets.smollm2 import SMOLLM2_GEOMETRY

    if not sizes.tiny_target:
        return dataclasses.replace(SMOLLM2_GEOMETRY, vocab_size=vocab_size)
    return TargetSpec(
        name="tiny",
        vocab_size=vocab_size,
        hidden_size=64,
        num_layers=30,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        rope_theta=10000.0,
        rms_norm_eps=1e-5,
        max_position_embeddings=4096,
    )


def shared_modules(spec: Any, device: torch.device) -> tuple[torch.nn.Embedding, torch.nn.Linear]:
    emb = torch.nn.Embedding(spec.vocab_size, spec.hidden_size, device=device)
    head = torch.nn.Linear(spec.hidden_size, spec.vocab_size, bias=False, device=device)
    torch.nn.init.normal_(emb.weight, std=0.02)
    torch.nn.init.normal_(head.weight, std=0.02)
    return emb, head
