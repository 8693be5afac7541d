"""Checkpoint round trip (bit-exact) and every refusal."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from torch import nn

from dspark_sglang.model.block_sampler import sample_block
from dspark_sglang.model.checkpoint import CheckpointError, load_drafter, save_drafter
from dspark_sglang.model.config import TargetSpec
from dspark_sglang.model.drafter import DSparkDrafter

Modules = Callable[..., tuple[nn.Embedding, nn.Linear]]


def _inputs() -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(0)
    return (
        torch.randn(2, 12, 3 * 64, generator=g),
        torch.arange(12).expand(2, 12),
        torch.ones(2, 12, dtype=torch.bool),
        torch.tensor([3, 4]),
        torch.tensor([12, 7]),
    )


@pytest.mark.parametrize(
    "overrides",
    [
        {},
        {"markov_head_type": "rnn", "ffn_type": "dense", "sliding_window": None},
        {"markov_head_type": "gated", "confidence_head_with_markov": False, "qk_norm": False},
    ],
)
def test_round_trip_is_bit_exact(
    tmp_path: Path,
    make_drafter: Callable[..., DSparkDrafter],
    tiny_target: TargetSpec,
    make_target_modules: Modules,
    overrides: dict[str, object],
) -> None:
    drafter = make_drafter(**overrides)
    folder = save_drafter(drafter, tmp_path / "ckpt")
    assert sorted(p.name for p in folder.iterdir()) == ["config.json", "model.safetensors"]
    saved = load_file(str(folder / "model.safetensors"))
    assert not any(k.startswith(("embed_tokens", "lm_head")) for k in saved)
    emb, head = make_target_modules()
    loaded = load_drafter(folder, tiny_target, emb, head, block_size=7)
    assert loaded.config == drafter.config
    with torch.no_grad():
        a = drafter.forward_block(*_inputs())
        b = loaded.forward_block(*_inputs())
    assert torch.equal(a.hidden, b.hidden) and torch.equal(a.base_logits, b.base_logits)
    pa = sample_block(drafter, a, torch.tensor([3, 4]), generator=torch.Generator().manual_seed(1))
    pb = sample_block(loaded, b, torch.tensor([3, 4]), generator=torch.Generator().manual_seed(1))
    assert torch.equal(pa.tokens, pb.tokens) and torch.equal(pa.probs, pb.probs)
    if pa.confidence_logits is not None:
        assert pb.confidence_logits is not None
        assert torch.equal(pa.confidence_logits, pb.confidence_logits)


def test_bfloat16_export_halves_the_file_and_loads_as_float32(
    tmp_path: Path,
    make_drafter: Callable[..., DSparkDrafter],
    tiny_target: TargetSpec,
    make_target_modules: Modules,
) -> None:
    drafter = make_drafter()
    full = save_drafter(drafter, tmp_path / "fp32")
    half = save_drafter(drafter, tmp_path / "bf16", dtype=torch.bfloat16)
    stored = load_file(str(half / "model.safetensors"))
    assert {t.dtype for t in stored.values() if t.is_floating_point()} == {torch.bfloat16}
    size = (half / "model.safetensors").stat().st_size
    assert size < 0.55 * (full / "model.safetensors").stat().st_size
    emb, head = make_target_modules()
    loaded = load_drafter(half, tiny_target, emb, head, block_size=7)
    for name, p in loaded.state_dict().items():
        ref = drafter.state_dict()[name]
        assert p.dtype == ref.dtype  # cast back to the module's precision on load
        assert torch.equal(p, ref.to(torch.bfloat16).to(ref.dtype)), name
    with pytest.raises(ValueError, match="floating dtype"):
        save_drafter(drafter, tmp_path / "int", dtype=torch.int8)


@pytest.fixture
def saved(tmp_path: Path, make_drafter: Callable[..., DSparkDrafter]) -> Path:
    return save_drafter(make_drafter(), tmp_path / "ckpt")


def _load(folder: Path, target: TargetSpec, modules: Modules, **kwargs: object) -> DSparkDrafter:
    emb, head = modules()
    return load_drafter(folder, target, emb, head, **kwargs)  # type: ignore[arg-type]


def _edit_config(folder: Path, **changes: object) -> None:
    path = folder / "config.json"
    hf = json.loads(path.read_text())
    hf["dspark_config"].update(changes)
    for key in ("block_size", "target_layer_ids", "mask_token_id"):
        hf["dflash_config"][key] = hf["dspark_config"][key]
    for key in hf:
        if key in hf["dspark_config"]:
            hf[key] = hf["dspark_config"][key]
    path.write_text(json.dumps(hf))


def test_refuses_other_slot_convention(
    saved: Path, tiny_target: TargetSpec, make_target_modules: Modules
) -> None:
    _edit_config(saved, slot_convention="dflash")
    with pytest.raises(CheckpointError, match="slot_convention='dflash'"):
        _load(saved, tiny_target, make_target_modules)
    # ... unless that convention is what the caller expects.
    assert _load(saved, tiny_target, make_target_modules, expected_slot_convention="dflash")


def test_refuses_block_size_mismatch(
    saved: Path, tiny_target: TargetSpec, make_target_modules: Modules
) -> None:
    with pytest.raises(CheckpointError, match="block_size=7 but block_size=5"):
        _load(saved, tiny_target, make_target_modules, block_size=5)
    assert _load(saved, tiny_target, make_target_modules, block_size=None).block_size == 7


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"name": "other-target"}, "target_name='tiny-target'"),
        ({"vocab_size": 600}, "vocab_size=512"),
        ({"hidden_size": 128, "head_dim": 32}, "hidden_size=64"),
        ({"num_layers": 4}, "target_layer_ids\\[1\\]=3"),  # 3 and 5 out of range
        ({"num_layers": 6}, "target_layer_ids\\[2\\]=5"),  # 5 is the last layer
        ({"num_layers": 10}, "target_num_layers=8"),
    ],
)
def test_refuses_other_target(
    saved: Path,
    tiny_target: TargetSpec,
    make_target_modules: Modules,
    change: dict[str, object],
    message: str,
) -> None:
    target = dataclasses.replace(tiny_target, **change)  # type: ignore[arg-type]
    with pytest.raises(CheckpointError, match=message):
        _load(saved, target, make_target_modules)


def test_refuses_missing_or_bad_config(
    saved: Path, tiny_target: TargetSpec, make_target_modules: Modules
) -> None:
    cfg = saved / "config.json"
    text = cfg.read_text()
    cfg.write_text("{not json")
    with pytest.raises(CheckpointError, match="not valid JSON"):
        _load(saved, tiny_target, make_target_modules)
    hf = json.loads(text)
    hf["dspark_config"]["unknown_field"] = 1
    cfg.write_text(json.dumps(hf))
    with pytest.raises(CheckpointError, match="unknown keys \\['unknown_field'\\]"):
        _load(saved, tiny_target, make_target_modules)
    cfg.unlink()
    with pytest.raises(CheckpointError, match=r"config\.json"):
        _load(saved, tiny_target, make_target_modules)


def _edit_weights(folder: Path, edit: Callable[[dict[str, torch.Tensor]], None]) -> None:
    path = folder / "model.safetensors"
    state = load_file(str(path))
    edit(state)
    save_file(state, str(path))


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda s: s.pop("layers.1.self_attn.k_proj.weight"), "missing tensors"),
        (lambda s: s.update({"lm_head.weight": torch.zeros(512, 64)}), "unexpected tensors"),
        (lambda s: s.update({"fc.weight": torch.zeros(64, 4 * 64)}), "'fc.weight' has shape"),
        (
            lambda s: s["markov_head.markov_w2.weight"].__setitem__((3, 4), float("nan")),
            "'markov_head.markov_w2.weight' has non-finite",
        ),
        (
            lambda s: s["layers.0.mlp.experts.down_proj"].__setitem__((0, 0, 0), float("inf")),
            "non-finite",
        ),
    ],
)
def test_refuses_bad_tensors(
    saved: Path,
    tiny_target: TargetSpec,
    make_target_modules: Modules,
    edit: Callable[[dict[str, torch.Tensor]], None],
    message: str,
) -> None:
    _edit_weights(saved, edit)
    with pytest.raises(CheckpointError, match=message):
        _load(saved, tiny_target, make_target_modules)


def test_refuses_missing_weights_file(
    saved: Path, tiny_target: TargetSpec, make_target_modules: Modules
) -> None:
    (saved / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match=r"model\.safetensors is missing"):
        _load(saved, tiny_target, make_target_modules)


def test_checkpoint_error_is_a_value_error() -> None:
    assert issubclass(CheckpointError, ValueError)
