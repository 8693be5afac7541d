"""SGLang's view of a draft config.json: a non-floating ``torch_dtype`` is refused by name."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from dspark_sglang.model import DSparkConfig, DSparkDrafter, TargetSpec, save_drafter
from dspark_sglang.model.checkpoint import CheckpointError
from dspark_sglang.sglang_integration.draft_checkpoint import dspark_config_of, register_hf_config

TARGET = TargetSpec(
    name="tiny", vocab_size=64, hidden_size=32, num_layers=6, num_attention_heads=2,
    num_key_value_heads=1, head_dim=16, rope_theta=10000.0, rms_norm_eps=1e-6,
    max_position_embeddings=256,
)  # fmt: skip


def _hf_config(folder: Path):  # type: ignore[no-untyped-def]
    from transformers import AutoConfig

    register_hf_config()
    return AutoConfig.from_pretrained(str(folder))


def test_draft_config_with_an_integer_torch_dtype_is_refused(tmp_path: Path) -> None:
    config = DSparkConfig.for_target(
        TARGET, mask_token_id=1, num_hidden_layers=1, num_experts=2, markov_rank=8
    )
    emb, head = torch.nn.Embedding(64, 32), torch.nn.Linear(32, 64, bias=False)
    folder = save_drafter(DSparkDrafter(config, emb, head), tmp_path / "d", dtype=torch.bfloat16)
    assert dspark_config_of(_hf_config(folder)) == config
    path = folder / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "torch_dtype": "int32"}))
    with pytest.raises(CheckpointError, match="torch_dtype='int32' is not a floating dtype name"):
        dspark_config_of(_hf_config(folder))
