"""Drafter checkpoints: an HF-style folder (``config.json`` + ``model.safetensors``).

Only the drafter's own weights are saved; the target's embedding and LM head are
re-attached at load time. Loading is a gate, not a convenience: a checkpoint
trained with the other slot convention, another block size, another target or
other target layers would load "fine" and silently draft garbage (acceptance
~1), so every such disagreement is refused with an error naming the field and
the fix. Tensor sets must match exactly and every weight must be finite.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from dspark_sglang.model.config import DSparkConfig, SlotConvention, TargetSpec
from dspark_sglang.model.drafter import DSparkDrafter

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"


class CheckpointError(ValueError):
    """A drafter checkpoint that must not be used with this target/request."""


def save_drafter(
    drafter: DSparkDrafter, path: str | Path, *, dtype: torch.dtype | None = None
) -> Path:
    """Write ``config.json`` and ``model.safetensors`` into folder ``path``; returns it.

    ``dtype`` (e.g. ``torch.bfloat16``) stores floating tensors at that precision: a
    shipped checkpoint at half the size. Loading casts back to the module's dtype.
    """
    if dtype is not None and not dtype.is_floating_point:
        raise ValueError(f"dtype must be a floating dtype (e.g. torch.bfloat16), got {dtype}")
    folder = Path(path)
    folder.mkdir(parents=True, exist_ok=True)
    state = {
        k: (v.to(dtype) if dtype is not None and v.is_floating_point() else v)
        .detach()
        .contiguous()
        .cpu()
        for k, v in drafter.state_dict().items()
    }
    save_file(state, str(folder / WEIGHTS_FILE), metadata={"format": "pt"})
    text = json.dumps(drafter.config.to_hf_dict(), indent=2, sort_keys=False) + "\n"
    (folder / CONFIG_FILE).write_text(text)
    return folder


def _read_config(folder: Path) -> DSparkConfig:
    cfg_path = folder / CONFIG_FILE
    if not cfg_path.is_file():
        raise CheckpointError(
            f"{cfg_path} is missing: a drafter checkpoint folder needs config.json "
            "(write it with save_drafter)"
        )
    try:
        raw = json.loads(cfg_path.read_text())
    except json.JSONDecodeError as exc:
        raise CheckpointError(f"{cfg_path} is not valid JSON: {exc}") from exc
    try:
        return DSparkConfig.from_hf_dict(raw)
    except ValueError as exc:
        raise CheckpointError(f"{cfg_path}: {exc}") from exc


def check_compatible(
    config: DSparkConfig,
    target: TargetSpec,
    *,
    block_size: int | None,
    expected_slot_convention: SlotConvention,
) -> None:
    """Refuse a drafter config that disagrees with the target or the request."""
    if config.slot_convention != expected_slot_convention:
        raise CheckpointError(
            f"checkpoint slot_convention={config.slot_convention!r} but "
            f"{expected_slot_convention!r} is required: the two conventions shift every "
            "draft slot by one token; retrain or convert the drafter"
        )
    if block_size is not None and config.block_size != block_size:
        raise CheckpointError(
            f"checkpoint block_size={config.block_size} but block_size={block_size} was "
            f"requested; request block_size={config.block_size} (or None) or use a drafter "
            f"trained with block_size={block_size}"
        )
    if config.target_name != target.name:
        raise CheckpointError(
            f"checkpoint target_name={config.target_name!r} but the target is "
            f"{target.name!r}; use a drafter trained for {target.name!r}"
        )
    if config.vocab_size != target.vocab_size:
        raise CheckpointError(
            f"checkpoint vocab_size={config.vocab_size} but the target's is "
            f"{target.vocab_size}; use a drafter trained for this target"
        )
    if config.hidden_size != target.hidden_size or config.target_hidden_size != target.hidden_size:
        raise CheckpointError(
            f"checkpoint hidden_size={config.hidden_size} (target_hidden_size="
            f"{config.target_hidden_size}) but the target's hidden size is "
            f"{target.hidden_size}; use a drafter trained for this target"
        )
    last = target.num_layers - 1
    for i, lid in enumerate(config.target_layer_ids):
        if not 0 <= lid < last:
            raise CheckpointError(
                f"checkpoint target_layer_ids[{i}]={lid} is invalid for {target.name!r} "
                f"({target.num_layers} layers): ids must be in [0, {last - 1}] and never the "
                "last layer; use a drafter trained for this target"
            )
    if config.target_num_layers != target.num_layers:
        raise CheckpointError(
            f"checkpoint target_num_layers={config.target_num_layers} but the target has "
            f"{target.num_layers} layers; use a drafter trained for this target"
        )


def load_drafter(
    path: str | Path,
    target: TargetSpec,
    embed_tokens: nn.Embedding,
    lm_head: nn.Linear,
    *,
    block_size: int | None = None,
    expected_slot_convention: SlotConvention = "anchor_next",
) -> DSparkDrafter:
    """Load a drafter saved by ``save_drafter`` onto ``target``'s embedding and LM head."""
    folder = Path(path)
    config = _read_config(folder)
    check_compatible(
        config, target, block_size=block_size, expected_slot_convention=expected_slot_convention
    )
    weights_path = folder / WEIGHTS_FILE
    if not weights_path.is_file():
        raise CheckpointError(f"{weights_path} is missing; save the drafter with save_drafter")
    try:
        state = load_file(str(weights_path))
    except Exception as exc:  # safetensors raises its own error types
        raise CheckpointError(f"{weights_path} is not a readable safetensors file: {exc}") from exc

    drafter = DSparkDrafter(config, embed_tokens, lm_head)
    expected = drafter.state_dict()
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    if missing:
        raise CheckpointError(
            f"{weights_path} is missing tensors {missing}; the weights do not match "
            "config.json (re-save the drafter)"
        )
    if unexpected:
        raise CheckpointError(
            f"{weights_path} has unexpected tensors {unexpected}; the weights do not match "
            "config.json (re-save the drafter)"
        )
    for name, tensor in state.items():
        want = tuple(expected[name].shape)
        if tuple(tensor.shape) != want:
            raise CheckpointError(
                f"{weights_path}: tensor {name!r} has shape {tuple(tensor.shape)}, config.json "
                f"implies {want}; the weights do not match config.json"
            )
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            raise CheckpointError(
                f"{weights_path}: tensor {name!r} has non-finite values (NaN/inf); the "
                "training run diverged, use an earlier checkpoint"
            )
    drafter.load_state_dict(state, strict=True)
    return drafter
