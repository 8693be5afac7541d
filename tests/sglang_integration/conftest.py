"""Shared fixtures: the SmolLM2 target, its HF greedy reference, one CPU engine."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

# Must be set before anything imports sglang: its is_cpu() probe is cached.
os.environ.setdefault("SGLANG_USE_CPU_ENGINE", "1")
torch.set_num_threads(1)  # shared 2-core machines: 1 thread is faster

#: Mixed lengths on purpose (batching pads nothing in SGLang, so lengths matter).
PROMPTS: tuple[str, ...] = (
    "The capital of France is",
    "def fibonacci(n):",
    "Write a haiku about the sea.",
    "Q: What is 17 times 23? A:",
    "Once upon a time, in a small village at the edge of a dark forest, there lived",
    "List three primary colors:",
    "import numpy as np\nx = np.arange(10)\n",
    "The quick brown fox",
)
NEW_TOKENS = 64


@pytest.fixture(scope="session")
def smollm2_path() -> Path:
    from dspark_sglang.targets.smollm2 import ensure_smollm2

    return ensure_smollm2()


@pytest.fixture(scope="session")
def prompt_ids(smollm2_path: Path) -> list[list[int]]:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(smollm2_path)
    return [tok(p, add_special_tokens=False)["input_ids"] for p in PROMPTS]


def hf_greedy(model_path: Path, prompts: list[list[int]], n: int) -> list[list[int]]:
    """HF transformers greedy continuation (KV cache, no early stop), fp32."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
    outs: list[list[int]] = []
    with torch.inference_mode():
        for ids in prompts:
            x = torch.tensor([ids])
            out = model(input_ids=x, use_cache=True)
            past, toks = out.past_key_values, []
            for _ in range(n):
                nxt = int(out.logits[0, -1].argmax())
                toks.append(nxt)
                out = model(input_ids=torch.tensor([[nxt]]), past_key_values=past, use_cache=True)
                past = out.past_key_values
            outs.append(toks)
    return outs


@pytest.fixture(scope="session")
def hf_reference(smollm2_path: Path, prompt_ids: list[list[int]]) -> list[list[int]]:
    return hf_greedy(smollm2_path, prompt_ids, NEW_TOKENS)


@pytest.fixture(scope="module")
def plain_engine(smollm2_path: Path) -> Iterator[Any]:
    from dspark_sglang.sglang_integration.engine import CpuEngineSpec, cpu_engine

    with cpu_engine(CpuEngineSpec(model_path=str(smollm2_path))) as engine:
        yield engine


def _shaped_seeded_drafter(target: Any, block_size: int = 4, sliding_window: int = 16) -> Any:
    """A seeded random DSpark drafter whose drafts SGLang sometimes accepts.

    Residual branches (attention ``o_proj``, expert and shared-expert ``down_proj``)
    are scaled down 100x, so the block's hidden state stays close to the normed
    input embedding: with SmolLM2's tied LM head slot 0 mostly proposes "the anchor
    again", accepted whenever the target repeats a token, while attention, window
    and MoE still shape every logit. 2 MoE layers, 4 experts (top 2), rank-32 Markov.
    """
    from dspark_sglang.model import DSparkConfig, DSparkDrafter

    config = DSparkConfig.for_target(
        target.spec,
        mask_token_id=target.default_mask_token_id(),
        num_hidden_layers=2,
        block_size=block_size,
        sliding_window=sliding_window,
        num_experts=4,
        num_experts_per_tok=2,
        markov_rank=32,
    )
    torch.manual_seed(0)
    model = DSparkDrafter(config, target.embed_tokens, target.lm_head).eval()
    with torch.no_grad():
        for layer in model.layers:
            layer.self_attn.o_proj.weight.mul_(0.01)
            layer.mlp.experts.down_proj.mul_(0.01)
            layer.mlp.shared_expert.down_proj.weight.mul_(0.01)
    return model


@pytest.fixture(scope="session")
def shaped_drafter() -> Any:
    """``make(target, block_size=4, sliding_window=16)`` -> the shaped seeded drafter."""
    return _shaped_seeded_drafter


@pytest.fixture(scope="session")
def hf_greedy_fn() -> Any:
    """``hf_greedy`` as a fixture: test modules cannot import from conftest reliably
    (several directories have a ``conftest`` module and pytest imports only one by name)."""
    return hf_greedy
