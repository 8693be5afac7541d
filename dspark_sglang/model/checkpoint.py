"""Drafter checkpoints: an HF-style folder (``config.json`` + ``model.safetensors``).

Only the drafter's own weights are saved; the target's embedding and LM head are
re-attached at load time. Loading is a gate, not a convenience: a checkpoint
trained with the other slot convention, another block size, another target or
other target layers would load "fine" and silently draft garbage (acceptance
~1), so every such disagreement is refused with an error naming the field and
the fix. Tensor names, shapes and dtypes are checked against the config from the
safetensors header before anything is allocated (the expected shapes come from a
``meta``-device model), then every weight must be finite. ``config.json`` carries
HF's ``torch_dtype`` (the stored weights' dtype, what SGLang's ``--dtype auto``
uses); checkpoints written before it existed load without it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from torch import nn

from dspark_sglang.model.config import (
    HF_TORCH_DTYPES,
    DSparkConfig,
    SlotConvention,
    TargetSpec,
    hf_torch_dtype,
)
from dspark_sglang.model.drafter import DSparkDrafter
from dspark_sglang.model.vocab import (
    DRAFT_VOCAB_BUFFER,
    GREEDY_DRAFT_VOCAB_BUFFER,
    check_draft_vocab_ids,
    check_greedy_draft_vocab_ids,
)

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
# safetensors header dtype codes, by torch name; the floating ones are HF_TORCH_DTYPES.
_SAFETENSORS_DTYPES = {
    "F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16",
    "I64": "int64", "I32": "int32", "I16": "int16", "I8": "int8", "U8": "uint8", "BOOL": "bool",
}  # fmt: skip


class CheckpointError(ValueError):
    """A drafter checkpoint that must not be used with this target/request."""


def save_drafter(
    drafter: DSparkDrafter,
    path: str | Path,
    *,
    dtype: torch.dtype | None = None,
    state: Mapping[str, torch.Tensor] | None = None,
) -> Path:
    """Write ``config.json`` and ``model.safetensors`` into folder ``path``; returns it.

    ``state`` replaces ``drafter.state_dict()`` (the same keys, whole tensors): the
    weights of a drafter whose parameters are sharded over processes, gathered.

    ``dtype`` (e.g. ``torch.bfloat16``) stores floating tensors at that precision: a
    shipped checkpoint at half the size. Loading casts back to the module's dtype.
    ``config.json`` records the stored dtype as ``torch_dtype``.
    """
    if dtype is not None and _torch_name(dtype) not in HF_TORCH_DTYPES:
        raise ValueError(
            f"dtype must be a floating dtype ({', '.join(HF_TORCH_DTYPES)}; e.g. "
            f"torch.bfloat16), got {dtype}"
        )
    state = {
        k: (v.to(dtype) if dtype is not None and v.is_floating_point() else v)
        .detach()
        .contiguous()
        .cpu()
        for k, v in (drafter.state_dict() if state is None else state).items()
    }
    stored = sorted({_torch_name(v.dtype) for v in state.values() if v.is_floating_point()})
    if len(stored) != 1 or stored[0] not in HF_TORCH_DTYPES:
        raise ValueError(
            f"the drafter's floating weights are {stored}; pass dtype= (one of "
            f"{', '.join(HF_TORCH_DTYPES)}) to store them at one precision"
        )
    folder = Path(path)
    folder.mkdir(parents=True, exist_ok=True)
    save_file(state, str(folder / WEIGHTS_FILE), metadata={"format": "pt"})
    hf = drafter.config.to_hf_dict(torch_dtype=stored[0])
    text = json.dumps(hf, indent=2, sort_keys=False) + "\n"
    (folder / CONFIG_FILE).write_text(text)
    return folder


def _torch_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _read_config(folder: Path) -> tuple[DSparkConfig, str | None]:
    """The validated config and its ``torch_dtype`` (``None`` in older checkpoints)."""
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
    from dspark_sglang.model.formats.layout import (
        IMPORT_COMMAND,
        SPECULATORS_IMPORT_COMMAND,
        is_deepspec_config,
        is_speculators_config,
    )

    if is_deepspec_config(raw):
        raise CheckpointError(
            f"{cfg_path}: a DeepSpec-layout drafter, not ours; convert it with `{IMPORT_COMMAND}`"
            " (SGLang's DSPARK_MOE serves it as it is)"
        )
    if is_speculators_config(raw):
        raise CheckpointError(
            f"{cfg_path}: a vLLM speculators DSpark drafter, not ours; convert it with "
            f"`{SPECULATORS_IMPORT_COMMAND}`"
        )
    try:
        return DSparkConfig.from_hf_dict(raw), hf_torch_dtype(raw)
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


def _stored_tensors(weights_path: Path) -> dict[str, tuple[tuple[int, ...], str]]:
    """Name -> (shape, torch dtype name) from the safetensors header; nothing is loaded."""
    try:
        with safe_open(str(weights_path), framework="pt") as f:
            slices = {name: f.get_slice(name) for name in f.keys()}  # noqa: SIM118
            return {
                name: (
                    tuple(sl.get_shape()),
                    _SAFETENSORS_DTYPES.get(sl.get_dtype(), sl.get_dtype()),
                )
                for name, sl in slices.items()
            }
    except Exception as exc:  # safetensors raises its own error types
        raise CheckpointError(f"{weights_path} is not a readable safetensors file: {exc}") from exc


def _implied_tensors(
    config: DSparkConfig, embed_tokens: nn.Embedding, lm_head: nn.Linear
) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    """Name -> (shape, dtype) of the drafter ``config`` describes, built on ``meta`` (free)."""
    with torch.device("meta"):
        skeleton = DSparkDrafter(config, embed_tokens, lm_head)
    return {k: (tuple(v.shape), v.dtype) for k, v in skeleton.state_dict().items()}


def _size_fields(config: DSparkConfig, sizes: set[int]) -> str:
    """``"; check config.json num_experts=1000"``: the config fields with one of ``sizes``."""
    fields = [
        f"{k}={v}"
        for k, v in config.to_dict().items()
        if isinstance(v, int) and not isinstance(v, bool) and v in sizes
    ]
    return f"; check config.json {', '.join(fields)}" if fields else ""


def _check_tensors(
    weights_path: Path,
    config: DSparkConfig,
    torch_dtype: str | None,
    stored: dict[str, tuple[tuple[int, ...], str]],
    implied: dict[str, tuple[tuple[int, ...], torch.dtype]],
) -> None:
    """Refuse a tensor set, shape or dtype that disagrees with ``config.json``."""
    missing = sorted(set(implied) - set(stored))
    unexpected = sorted(set(stored) - set(implied))
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
    for name, (shape, dtype) in stored.items():
        want_shape, want_dtype = implied[name]
        if want_dtype.is_floating_point and dtype not in HF_TORCH_DTYPES:
            raise CheckpointError(
                f"{weights_path}: tensor {name!r} has dtype {dtype}, expected a floating dtype "
                f"({_torch_name(want_dtype)}, or one of {', '.join(HF_TORCH_DTYPES)}: cast on "
                "load); the weights are not a drafter's, re-save the drafter"
            )
        if not want_dtype.is_floating_point and dtype != _torch_name(want_dtype):
            raise CheckpointError(
                f"{weights_path}: tensor {name!r} has dtype {dtype}, expected "
                f"{_torch_name(want_dtype)}; re-save the drafter"
            )
        if want_dtype.is_floating_point and torch_dtype is not None and dtype != torch_dtype:
            raise CheckpointError(
                f"{weights_path}: tensor {name!r} is stored as {dtype} but config.json has "
                f"torch_dtype={torch_dtype!r}; the weights do not match config.json (re-save "
                "the drafter)"
            )
        if shape != want_shape:
            differ = {w for g, w in zip(shape, want_shape, strict=False) if g != w}
            raise CheckpointError(
                f"{weights_path}: tensor {name!r} has shape {shape}, config.json implies "
                f"{want_shape}: the checkpoint and config.json disagree"
                f"{_size_fields(config, differ)}; re-save the drafter or fix config.json"
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
    config, torch_dtype = _read_config(folder)
    check_compatible(
        config, target, block_size=block_size, expected_slot_convention=expected_slot_convention
    )
    weights_path = folder / WEIGHTS_FILE
    if not weights_path.is_file():
        raise CheckpointError(f"{weights_path} is missing; save the drafter with save_drafter")
    implied = _implied_tensors(config, embed_tokens, lm_head)
    _check_tensors(weights_path, config, torch_dtype, _stored_tensors(weights_path), implied)
    try:
        state = load_file(str(weights_path))
    except Exception as exc:  # safetensors raises its own error types
        raise CheckpointError(f"{weights_path} is not a readable safetensors file: {exc}") from exc
    for name, tensor in state.items():
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            raise CheckpointError(
                f"{weights_path}: tensor {name!r} has non-finite values (NaN/inf); the "
                "training run diverged, use an earlier checkpoint"
            )
    if config.draft_vocab_size is not None:
        try:
            check_draft_vocab_ids(
                state[DRAFT_VOCAB_BUFFER], config.vocab_size, config.draft_vocab_size
            )
        except ValueError as exc:
            raise CheckpointError(f"{weights_path}: {exc}") from exc
    if config.greedy_draft_vocab_size is not None:
        try:
            check_greedy_draft_vocab_ids(
                state[GREEDY_DRAFT_VOCAB_BUFFER], config.vocab_size, config.greedy_draft_vocab_size
            )
        except ValueError as exc:
            raise CheckpointError(f"{weights_path}: {exc}") from exc
    drafter = DSparkDrafter(config, embed_tokens, lm_head)
    drafter.load_state_dict(state, strict=True)
    return drafter
