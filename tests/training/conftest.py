"""Shared fixtures for the training tests: a tiny random Llama target and its data cache.

A real (random-weight) HF Llama exercises the real generate / hidden-state
code paths in seconds; only tests that need SmolLM2 itself are marked slow.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from dspark_sglang.training.datagen import (
    EncodedPrompt,
    GenerationSettings,
    cache_hidden_states,
    generate_responses,
)

TINY_VOCAB = 96
TINY_LAYERS = 6
TINY_LAYER_IDS = (1, 2, 3)
PAD, EOS = 0, 2


def tiny_llama(seed: int = 0) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=TINY_VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=TINY_LAYERS,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        bos_token_id=1,
        eos_token_id=EOS,
        pad_token_id=PAD,
        rms_norm_eps=1e-6,
    )
    model = LlamaForCausalLM(cfg).eval()
    # Sharpen the random LM head so the target is far from uniform: a drafter
    # then has something learnable to match.
    with torch.no_grad():
        model.lm_head.weight.mul_(8.0)
    return model


def tiny_prompts(n: int, seed: int = 0) -> list[EncodedPrompt]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        length = int(torch.randint(4, 12, (1,), generator=g))
        ids = torch.randint(3, TINY_VOCAB, (length,), generator=g).tolist()
        out.append(
            EncodedPrompt(id=f"p{i:03d}", domain=("math", "code", "chat")[i % 3], prompt_ids=ids)
        )
    return out


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    """Single-threaded torch: on shared 2-core machines two OpenMP threads under load
    are ~30x slower than one (spin-waiting), and results must not depend on it."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def tiny_target_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("tiny_target")
    tiny_llama().save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def tiny_data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch.set_num_threads(1)
    out = tmp_path_factory.mktemp("tiny_data")
    model = tiny_llama()
    settings = GenerationSettings(max_new_tokens=40, batch_size=4, seed=0)
    generate_responses(
        model,
        tiny_prompts(16),
        out,
        settings,
        pad_token_id=PAD,
        eos_token_ids=[EOS],
        progress=False,
    )
    cache_hidden_states(model, out, TINY_LAYER_IDS, batch_size=4, pad_token_id=PAD, progress=False)
    return out
