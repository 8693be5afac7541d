"""A target's causal-LM module with only its input embedding and LM head in memory.

Why: training a drafter from a hidden-state cache, and exporting it, read two pieces of
the target: the embedding the drafter shares and the LM head that turns cached final
states into target logits. A target served with tensor parallelism does not fit one
device; its two heads do (vocabulary x hidden size each). ``heads_only_model`` builds the
model on PyTorch's ``meta`` device (shapes, no storage), then reads just those tensors
from the folder's safetensors files. Every other parameter stays on ``meta``: a forward
through the decoder raises instead of computing with garbage.

Invariant: ``get_input_embeddings()`` / ``get_output_embeddings()`` hold the same values
as ``AutoModelForCausalLM.from_pretrained`` at the same dtype; a tied head is the
embedding itself, as there.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import safe_open
from torch import nn
from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedModel

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"


def _param_name(model: nn.Module, module: nn.Module) -> str:
    for name, sub in model.named_modules():
        if sub is module:
            return f"{name}.weight" if name else "weight"
    raise ValueError(f"{type(module).__name__} is not a submodule of {type(model).__name__}")


def _files_by_key(folder: Path) -> dict[str, Path]:
    """Which safetensors file holds each tensor name (the index, or the single file)."""
    index = folder / INDEX_FILE
    if index.is_file():
        weight_map = json.loads(index.read_text()).get("weight_map")
        if not isinstance(weight_map, dict):
            raise ValueError(f"{index} has no weight_map object; re-save the model")
        return {k: folder / v for k, v in weight_map.items()}
    single = folder / SINGLE_FILE
    if not single.is_file():
        raise FileNotFoundError(
            f"{folder} has neither {SINGLE_FILE} nor {INDEX_FILE}: save the target with "
            "save_pretrained(..., safe_serialization=True)"
        )
    with safe_open(str(single), framework="pt") as f:
        return dict.fromkeys(f.keys(), single)


def _read(
    files: dict[str, Path], key: str, dtype: torch.dtype, device: torch.device
) -> torch.Tensor:
    with safe_open(str(files[key]), framework="pt", device="cpu") as f:
        return f.get_tensor(key).to(device=device, dtype=dtype)


def heads_only_model(
    folder: str | Path, dtype: torch.dtype | None = None, device: str | torch.device = "cpu"
) -> PreTrainedModel:
    """The causal LM of ``folder`` with its embedding and LM head loaded, the rest on
    ``meta`` (module docstring). ``dtype`` None is ``from_pretrained``'s default: the
    checkpoint's own (``config.json``'s ``dtype``), float32 where it names none. Raises
    ``ValueError`` naming the missing tensor when the checkpoint does not store them under
    the module's own names."""
    folder = Path(folder)
    device = torch.device(device)
    config = AutoConfig.from_pretrained(str(folder))
    if dtype is None:
        dtype = getattr(config, "dtype", None) or torch.float32
        if isinstance(dtype, str):
            dtype = getattr(torch, dtype)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    files = _files_by_key(folder)
    embed, head = model.get_input_embeddings(), model.get_output_embeddings()
    embed_key, head_key = _param_name(model, embed), _param_name(model, head)
    if embed_key not in files:
        raise ValueError(
            f"{folder}: no tensor {embed_key!r} in its safetensors files (the target's "
            "input embedding); this checkpoint names its weights differently from "
            f"{type(model).__name__}: re-save it with save_pretrained"
        )
    embed.weight = nn.Parameter(_read(files, embed_key, dtype, device), requires_grad=False)
    tied = bool(getattr(config.get_text_config(), "tie_word_embeddings", False))
    if tied and head_key not in files:
        head.weight = embed.weight
    elif head_key in files:
        head.weight = nn.Parameter(_read(files, head_key, dtype, device), requires_grad=False)
        bias_key = head_key.removesuffix("weight") + "bias"
        if getattr(head, "bias", None) is not None and bias_key in files:
            head.bias = nn.Parameter(_read(files, bias_key, dtype, device), requires_grad=False)
    else:
        raise ValueError(
            f"{folder}: no tensor {head_key!r} (the LM head) and tie_word_embeddings is "
            "false in its config.json; the checkpoint is incomplete"
        )
    model.eval()
    model.requires_grad_(False)
    return model
