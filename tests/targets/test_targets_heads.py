"""``targets.heads``: a target with only its embedding and LM head in memory, for training
from a hidden-state cache and exporting without the whole target on one device."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from tiny_hf_targets import save_tiny_target
from transformers import AutoModelForCausalLM

from dspark_sglang.targets.heads import heads_only_model
from dspark_sglang.targets.hf_target import HFTarget
from dspark_sglang.training.config import TrainConfig
from dspark_sglang.training.pipeline import target_weights


@pytest.fixture(scope="module")
def tiny(smollm2_path: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("heads")
    return {k: save_tiny_target(k, root / k, smollm2_path) for k in ("qwen3", "llama3")}


@pytest.mark.parametrize("kind", ["qwen3", "llama3"])
def test_the_heads_equal_the_full_loads_and_nothing_else_is_in_memory(
    kind: str, tiny: dict[str, Path]
) -> None:
    full = AutoModelForCausalLM.from_pretrained(str(tiny[kind]))
    heads = heads_only_model(tiny[kind])
    for get in ("get_input_embeddings", "get_output_embeddings"):
        a, b = getattr(full, get)().weight, getattr(heads, get)().weight
        assert torch.equal(a, b) and not b.is_meta and not b.requires_grad
    # Qwen3 ties its head to the embedding (as the full load does); Llama-3 does not.
    tied = heads.get_output_embeddings().weight is heads.get_input_embeddings().weight
    assert tied == (kind == "qwen3")
    layer_params = list(heads.get_decoder().layers.parameters())
    assert layer_params and all(p.is_meta for p in layer_params)
    with pytest.raises(NotImplementedError):
        heads(torch.tensor([[1, 2, 3]]))
    target = HFTarget(tiny[kind], weights="heads")
    assert target.spec == HFTarget(tiny[kind]).spec and target.device == torch.device("cpu")


def test_a_sharded_checkpoint_is_read_through_its_index(
    tiny: dict[str, Path], tmp_path: Path
) -> None:
    full = AutoModelForCausalLM.from_pretrained(str(tiny["llama3"]))
    full.save_pretrained(tmp_path, max_shard_size="2MB")
    assert (tmp_path / "model.safetensors.index.json").is_file()
    heads = heads_only_model(tmp_path)
    assert torch.equal(heads.lm_head.weight, full.lm_head.weight)


def test_a_checkpoint_without_the_head_is_refused_naming_the_tensor(
    tiny: dict[str, Path], tmp_path: Path
) -> None:
    src = tiny["llama3"]
    for f in src.iterdir():
        if f.name != "model.safetensors":
            (tmp_path / f.name).write_bytes(f.read_bytes())
    tensors = load_file(str(src / "model.safetensors"))
    del tensors["lm_head.weight"]
    save_file(tensors, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(ValueError, match=r"no tensor 'lm_head\.weight' \(the LM head\)"):
        heads_only_model(tmp_path)
    (tmp_path / "model.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match=r"neither model\.safetensors nor"):
        heads_only_model(tmp_path)


@pytest.mark.parametrize(
    ("data", "stages", "weights"),
    [
        ({}, ("data", "train"), "full"),  # HF generator and HF hidden pass
        ({"generator": "sglang"}, ("data",), "full"),  # HF hidden pass
        ({"generator": "sglang", "hidden_states": "sglang"}, ("data", "train"), "heads"),
        ({}, ("train",), "heads"),  # trains from the cache
        ({"generator": "sglang", "hidden_states": "online"}, ("data",), "heads"),
        ({"generator": "sglang", "hidden_states": "online"}, ("train",), "full"),
    ],
)
def test_the_target_is_loaded_whole_only_where_a_stage_runs_it(
    data: dict[str, str], stages: tuple[str, ...], weights: str
) -> None:
    cfg = TrainConfig.from_dict({"name": "w", "data": data})
    assert target_weights(cfg, stages) == weights
