"""Checkpoint gates on dtypes and sizes: refused from the header, before anything is built."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from torch import nn

from dspark_sglang.model.checkpoint import CheckpointError, load_drafter, save_drafter
from dspark_sglang.model.config import DSparkConfig, TargetSpec
from dspark_sglang.model.drafter import DSparkDrafter

Modules = Callable[..., tuple[nn.Embedding, nn.Linear]]


@pytest.fixture
def saved(tmp_path: Path, make_drafter: Callable[..., DSparkDrafter]) -> Path:
    return save_drafter(make_drafter(), tmp_path / "ckpt")


def _load(folder: Path, target: TargetSpec, modules: Modules) -> DSparkDrafter:
    emb, head = modules()
    return load_drafter(folder, target, emb, head)


def _edit_hf(folder: Path, edit: Callable[[dict[str, object]], None]) -> None:
    path = folder / "config.json"
    hf = json.loads(path.read_text())
    edit(hf)
    path.write_text(json.dumps(hf))


def test_refuses_an_integer_tensor_naming_its_dtype(
    saved: Path, tiny_target: TargetSpec, make_target_modules: Modules
) -> None:
    path = saved / "model.safetensors"
    state = load_file(str(path))
    state["fc.weight"] = state["fc.weight"].to(torch.int32)
    save_file(state, str(path))
    _edit_hf(saved, lambda hf: hf.pop("torch_dtype", None))  # only the tensor is wrong
    with pytest.raises(
        CheckpointError, match=r"'fc\.weight' has dtype int32, expected a floating dtype \(float32"
    ):
        _load(saved, tiny_target, make_target_modules)


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"num_experts": 1_000_000}, "num_experts=1000000"),
        ({"hidden_size": 3_000_000, "target_hidden_size": 3_000_000}, "hidden_size=3000000"),
        ({"moe_intermediate_size": 10**7}, "moe_intermediate_size=10000000"),
    ],
)
def test_config_sizes_are_bounded(
    make_config: Callable[..., DSparkConfig], overrides: dict[str, int], field: str
) -> None:
    with pytest.raises(ValueError, match=f"{field} is out of range \\(at most"):
        make_config(**overrides)


def test_shape_disagreement_is_refused_before_the_model_is_built(
    saved: Path,
    tiny_target: TargetSpec,
    make_target_modules: Modules,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def edit(hf: dict[str, object]) -> None:
        inner = hf["dspark_config"]
        assert isinstance(inner, dict)
        inner["num_experts"] = 1000  # in range, but the weights hold 4 experts

    _edit_hf(saved, edit)
    built: list[str] = []
    real_init = DSparkDrafter.__init__

    def spy(self: DSparkDrafter, *args: object, **kwargs: object) -> None:
        built.append(torch.get_default_device().type)
        real_init(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(DSparkDrafter, "__init__", spy)
    with pytest.raises(
        CheckpointError,
        match=r"the checkpoint and config\.json disagree; check config\.json num_experts=1000",
    ):
        _load(saved, tiny_target, make_target_modules)
    assert built == ["meta"]  # only the allocation-free skeleton


def test_saved_config_carries_torch_dtype_and_old_configs_still_load(
    tmp_path: Path,
    make_drafter: Callable[..., DSparkDrafter],
    tiny_target: TargetSpec,
    make_target_modules: Modules,
) -> None:
    drafter = make_drafter()
    for dtype, name in ((None, "float32"), (torch.bfloat16, "bfloat16")):
        folder = save_drafter(drafter, tmp_path / name, dtype=dtype)
        assert json.loads((folder / "config.json").read_text())["torch_dtype"] == name
        assert _load(folder, tiny_target, make_target_modules).config == drafter.config
    _edit_hf(folder, lambda hf: hf.pop("torch_dtype"))  # written before the field existed
    assert _load(folder, tiny_target, make_target_modules).config == drafter.config


@pytest.mark.parametrize(
    ("torch_dtype", "message"),
    [
        ("int32", "torch_dtype='int32' is not a floating dtype name"),
        ("fp32", "torch_dtype='fp32' is not a floating dtype name"),
        ("float16", "stored as float32 but config.json has torch_dtype='float16'"),
    ],
)
def test_refuses_a_bad_or_wrong_torch_dtype(
    saved: Path,
    tiny_target: TargetSpec,
    make_target_modules: Modules,
    torch_dtype: str,
    message: str,
) -> None:
    _edit_hf(saved, lambda hf: hf.update(torch_dtype=torch_dtype))
    with pytest.raises(CheckpointError, match=message):
        _load(saved, tiny_target, make_target_modules)
