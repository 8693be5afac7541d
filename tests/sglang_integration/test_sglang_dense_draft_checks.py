"""A DeepSpec-layout drafter (and SGLang's native dense layout) at DSPARK_MOE's start-up
gates, without an engine: the block size the launch reads, the launch check of the folder,
the worker's header check against the target before SGLang builds the draft, and the
check of what SGLang parsed once it has. Checkpoints are written through
``tests/deepspec_layout.py`` (DeepSpec's names and shapes spelled out), sized to a tiny
Qwen3-like target (V=512, H=64, 8 layers).
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from deepspec_layout import deepspec_draft_config, deepspec_shapes, save_deepspec
from sglang_runtime import single_process_runtime

from dspark_sglang.model.checkpoint import CheckpointError, load_drafter
from dspark_sglang.scheduling.config import SchedulerConfig
from dspark_sglang.sglang_integration import dense_draft_checks, launch

TARGET: dict[str, Any] = {
    "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 64,
    "vocab_size": 512, "num_hidden_layers": 8, "num_attention_heads": 4,
    "num_key_value_heads": 2, "head_dim": 16, "intermediate_size": 96, "rms_norm_eps": 1e-6,
    "rope_parameters": {"rope_type": "default", "rope_theta": 1e4}, "hidden_act": "silu",
    "max_position_embeddings": 1024, "attention_bias": False,
}  # fmt: skip


def write_folder(folder: Path, drop: str | None = None, **draft: Any) -> Path:
    fields = dict(num_hidden_layers=1, block_size=7, target_layer_ids=[1, 3, 5],
                  mask_token_id=1, markov_rank=32) | draft  # fmt: skip
    cfg = deepspec_draft_config(TARGET, **fields)
    g = torch.Generator().manual_seed(0)
    tensors = {k: torch.randn(s, generator=g) for k, s in deepspec_shapes(cfg).items()}
    if drop:
        del tensors[drop]
    return save_deepspec(folder, cfg, tensors)


def test_the_block_size_of_each_layout(tmp_path: Path) -> None:
    deepspec = write_folder(tmp_path / "ds")
    assert launch.drafter_block_size(deepspec) == 7  # DeepSpec: the top level only
    native = tmp_path / "native"
    native.mkdir()
    raw: dict[str, Any] = {
        "architectures": ["DSparkDraftModel"],
        "dflash_config": {"block_size": 4},
    }
    (native / "config.json").write_text(json.dumps(raw))
    assert launch.drafter_block_size(native) == 4  # SGLang's nesting
    (native / "config.json").write_text(json.dumps(raw | {"block_size": 7}))
    with pytest.raises(launch.LaunchError, match=r"dflash_config\.block_size=4, block_size=7"):
        launch.drafter_block_size(native)  # SGLang would draft 4 where the top level says 7
    (native / "config.json").write_text(json.dumps({"block_size": 0}))
    with pytest.raises(launch.LaunchError, match=r"block_size must be an integer >= 1, got 0"):
        launch.drafter_block_size(native)
    (native / "config.json").write_text(json.dumps({"architectures": ["X"]}))
    with pytest.raises(launch.LaunchError, match=r"none of dspark_block_size, .*, block_size"):
        launch.drafter_block_size(native)


def test_the_launch_checks_a_deepspec_folder_as_ours(tmp_path: Path) -> None:
    folder = write_folder(tmp_path / "ds")
    launch.check_server_args(None, str(folder), env={})
    launch.check_server_args(8, str(folder), env={})
    with pytest.raises(launch.LaunchError, match=r"its block_size is 7, so SGLang needs 8"):
        launch.check_server_args(5, str(folder), env={})
    cfg = tmp_path / "tier.yaml"
    SchedulerConfig(block_size=4, policy="mtp1").save(cfg)
    env = {launch.CONFIG_ENV: str(cfg), launch.RAGGED_MODE_ENV: "compact"}
    with pytest.raises(launch.LaunchError, match=r"block_size=4 but the drafter proposes 7"):
        launch.check_server_args(None, str(folder), env=env)
    broken = write_folder(tmp_path / "broken", drop="confidence_head.proj.bias")
    with pytest.raises(CheckpointError, match=r"missing \['confidence_head\.proj\.bias'\]"):
        launch.check_server_args(None, str(broken), env={})
    (broken / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match=r"model\.safetensors is missing"):
        launch.check_server_args(None, str(broken), env={})


def test_our_loader_names_the_import_command(tmp_path: Path) -> None:
    folder = write_folder(tmp_path / "ds")
    with pytest.raises(CheckpointError, match=r"DeepSpec-layout.*import-drafter --format deepspec"):
        load_drafter(folder, None, None, None)  # type: ignore[arg-type]


def _worker(folder: Path, target: dict[str, Any]) -> SimpleNamespace:
    draft = SimpleNamespace(model_path=str(folder))
    runner = SimpleNamespace(
        spec_aux_config=SimpleNamespace(draft_model_config=draft),
        model_config=SimpleNamespace(hf_text_config=target),
    )
    return SimpleNamespace(model_runner=runner)


def test_the_worker_checks_the_folder_against_the_target_before_loading(tmp_path: Path) -> None:
    folder = write_folder(tmp_path / "ds", target_layer_ids=[1, 3, 6])
    with single_process_runtime():
        dense_draft_checks.check_folder_before_load(_worker(folder, TARGET))
        with pytest.raises(CheckpointError, match=r"target_layer_ids\[2\]=6 but the target has 7"):
            dense_draft_checks.check_folder_before_load(
                _worker(folder, TARGET | {"num_hidden_layers": 7})
            )
        with pytest.raises(CheckpointError, match=r"vocab_size=512 but the target's vocab_size"):
            dense_draft_checks.check_folder_before_load(
                _worker(folder, TARGET | {"vocab_size": 1024})
            )


def _loaded(folder: Path) -> Any:
    """SGLang's dense class as the worker holds it once built; only its config is read."""
    from sglang.srt.models.dspark import Qwen3DSparkModel
    from transformers import AutoConfig

    model = Qwen3DSparkModel.__new__(Qwen3DSparkModel)
    object.__setattr__(model, "config", AutoConfig.from_pretrained(folder))
    return model


@pytest.mark.parametrize(
    ("target", "gamma", "match"),
    [
        (TARGET | {"num_hidden_layers": 6}, 7, r"target_layer_ids\[2\]=5 but the target has 6 "
         r"layers: ids must lie in \[0, 4\]"),
        (TARGET | {"hidden_size": 128}, 7, r"hidden_size=64 but the target's hidden_size is 128"),
        (TARGET | {"vocab_size": 1024}, 7, r"vocab_size=512 but the target's vocab_size is 1024"),
        (TARGET, 6, r"block_size=7 but SGLang drafts 6 tokens.*--speculative-num-draft-tokens 8"),
    ],
)  # fmt: skip
def test_the_loaded_dense_draft_is_checked_by_name(
    tmp_path: Path, target: dict[str, Any], gamma: int, match: str
) -> None:
    model = _loaded(write_folder(tmp_path / "ds"))
    dense_draft_checks.check_loaded_dense_draft(model, TARGET, 7)
    with pytest.raises(CheckpointError, match=match):
        dense_draft_checks.check_loaded_dense_draft(model, target, gamma)


def test_the_loaded_check_reads_sglangs_nesting_and_passes_other_classes(tmp_path: Path) -> None:
    folder = write_folder(tmp_path / "ds")
    raw = json.loads((folder / "config.json").read_text())
    raw["dflash_config"] = {"block_size": 4, "target_layer_ids": [1, 3, 7]}  # SGLang reads these
    (folder / "config.json").write_text(json.dumps(raw))
    with pytest.raises(CheckpointError, match=r"target_layer_ids\[2\]=7 but the target has 8"):
        dense_draft_checks.check_loaded_dense_draft(_loaded(folder), TARGET, 4)
    dense_draft_checks.check_loaded_dense_draft(torch.nn.Linear(1, 1), TARGET, 4)
