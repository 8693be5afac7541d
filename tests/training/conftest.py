"""Shared fixtures for the training tests: one thread, a tiny random Llama target and its
data cache (helpers in ``tiny_training_target``)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from tiny_training_target import EOS, PAD, TINY_LAYER_IDS, tiny_llama, tiny_prompts

from dspark_sglang.training.datagen import (
    GenerationSettings,
    cache_hidden_states,
    generate_responses,
)


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
