"""Shared fixtures: the SmolLM2 target, its HF greedy reference, one CPU engine."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from hf_greedy import hf_greedy

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
def prompt_ids(smollm2_path: Path) -> list[list[int]]:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(smollm2_path)
    return [tok(p, add_special_tokens=False)["input_ids"] for p in PROMPTS]


@pytest.fixture(scope="session")
def hf_reference(smollm2_path: Path, prompt_ids: list[list[int]]) -> list[list[int]]:
    return hf_greedy(smollm2_path, prompt_ids, NEW_TOKENS)


@pytest.fixture(scope="module")
def plain_engine(smollm2_path: Path) -> Iterator[Any]:
    from dspark_sglang.sglang_integration.engine import CpuEngineSpec, cpu_engine

    with cpu_engine(CpuEngineSpec(model_path=str(smollm2_path))) as engine:
        yield engine


def _shaped_seeded_drafter(
    target: Any,
    block_size: int = 4,
    sliding_window: int = 16,
    num_hidden_layers: int = 2,
    markov_rank: int = 32,
    draft_vocab_size: int | None = None,
) -> Any:
    """A seeded random DSpark drafter whose drafts SGLang sometimes accepts.

    Residual branches (attention ``o_proj``, expert and shared-expert ``down_proj``)
    are scaled down 100x, so the block's hidden state stays close to the normed
    input embedding: with SmolLM2's tied LM head slot 0 mostly proposes "the anchor
    again", accepted whenever the target repeats a token, while attention, window
    and MoE still shape every logit. 4 experts (top 2); by default 2 MoE layers and a
    rank-32 Markov head. With ``draft_vocab_size`` the caller installs the token map.
    """
    from dspark_sglang.model import DSparkConfig, DSparkDrafter

    config = DSparkConfig.for_target(
        target.spec,
        mask_token_id=target.default_mask_token_id(),
        num_hidden_layers=num_hidden_layers,
        block_size=block_size,
        sliding_window=sliding_window,
        num_experts=4,
        num_experts_per_tok=2,
        markov_rank=markov_rank,
        draft_vocab_size=draft_vocab_size,
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
    """``make(target, block_size=4, sliding_window=16, ...)`` -> the shaped seeded drafter."""
    return _shaped_seeded_drafter


def _verify_all_engine_outputs(
    model_path: Path,
    drafter: Any,
    workdir: Path,
    prompts: list[list[int]],
    n: int,
    env: dict[str, str] | None = None,
    sampling: dict[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """``drafter`` saved with ``save_drafter`` and run by DSPARK_MOE, every slot verified
    (``env``: more of the engine's environment; ``sampling``: request parameters over
    ``generate_outputs``' greedy ones). The engine's seed is fixed."""
    from dspark_sglang.model import save_drafter
    from dspark_sglang.sglang_integration.engine import (
        CpuEngineSpec,
        cpu_engine,
        generate_outputs,
    )

    folder = save_drafter(drafter, workdir / "draft")
    spec = CpuEngineSpec(
        model_path=str(model_path),
        overrides={
            "speculative_algorithm": "DSPARK_MOE",
            "speculative_draft_model_path": str(folder),
            "random_seed": 0,
        },
        # Verify every drafted slot, as ReferenceGenerator's VerifyAll does.
        env={"SGLANG_RAGGED_VERIFY_MODE": "static", **(env or {})},
    )
    with cpu_engine(spec) as engine:
        return generate_outputs(engine, prompts, n, sampling)


def _greedy_verify_all_reference(
    target: Any, drafter: Any, prompts: list[list[int]], n: int
) -> Any:
    """``ReferenceGenerator`` greedy + ``VerifyAll``: what SGLang's counts must equal."""
    from dspark_sglang.reference.generator import ReferenceGenerator
    from dspark_sglang.sampling import SamplingParams
    from dspark_sglang.scheduling.policies import VerifyAll

    gen = ReferenceGenerator(target, drafter, VerifyAll(), sampling=SamplingParams(temperature=0.0))
    return gen.generate(prompts, n)


@pytest.fixture(scope="session")
def verify_all_engine_outputs() -> Any:
    """``run(model_path, drafter, workdir, prompts, n, env=None, sampling=None)`` ->
    DSPARK_MOE outputs (meta_info)."""
    return _verify_all_engine_outputs


@pytest.fixture(scope="session")
def greedy_verify_all_reference() -> Any:
    """``run(target, drafter, prompts, n)`` -> the reference generator's greedy result."""
    return _greedy_verify_all_reference


@pytest.fixture(scope="session")
def hf_greedy_fn() -> Any:
    """``hf_greedy`` as a fixture: test modules cannot import from conftest reliably
    (several directories have a ``conftest`` module and pytest imports only one by name)."""
    return hf_greedy
