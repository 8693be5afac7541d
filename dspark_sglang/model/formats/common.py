"""Safetensors plumbing every foreign-layout reader shares (DeepSpec, speculators).

One home for: opening the weights file without reading data (the header is parsed and
validated), reading every tensor, and the two checks a conversion applies before it
writes (names and shapes match, one floating dtype).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open

from dspark_sglang.model.checkpoint import WEIGHTS_FILE, CheckpointError
from dspark_sglang.model.config import HF_TORCH_DTYPES

__all__ = ["FLOAT_DTYPES", "header", "load_tensors", "one_dtype", "open_weights", "same_shapes"]

#: safetensors header codes of floating dtypes.
FLOAT_DTYPES: tuple[str, ...] = ("F16", "BF16", "F32", "F64")


def open_weights(folder: Path) -> Any:
    """``safe_open`` on the weights: the header is parsed and validated, no data is read."""
    path = folder / WEIGHTS_FILE
    if not path.is_file():
        raise CheckpointError(f"{path} is missing (shards are not read); merge them into it")
    try:
        return safe_open(str(path), framework="pt")
    except Exception as exc:  # safetensors raises its own error types
        raise CheckpointError(f"{path} is not a readable safetensors file: {exc}") from exc


def header(folder: Path) -> dict[str, tuple[str, tuple[int, ...]]]:
    """``{name: (dtype code, shape)}`` from the safetensors header alone."""
    with open_weights(folder) as f:
        slices = {name: f.get_slice(name) for name in f.keys()}  # noqa: SIM118 (not a dict)
        return {k: (s.get_dtype(), tuple(s.get_shape())) for k, s in slices.items()}


def load_tensors(folder: Path) -> dict[str, torch.Tensor]:
    """Every tensor of ``folder``'s weights file (this reads the data)."""
    with open_weights(folder) as f:
        return {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 (not a dict)


def same_shapes(state: Mapping[str, torch.Tensor], want: Mapping[str, Any], what: str) -> None:
    """Refuse ``state`` unless it holds exactly the names of ``want`` at those shapes."""
    got = {k: tuple(t.shape) for k, t in state.items()}
    diff = sorted(k for k in set(got) | set(want) if got.get(k) != want.get(k))
    if diff:
        raise CheckpointError(f"{what}: tensors {diff} are missing, unexpected or misshapen")


def one_dtype(state: Mapping[str, torch.Tensor], where: Path) -> str:
    """The one floating dtype (HF name) every tensor of ``state`` is stored in."""
    dtypes = sorted({str(t.dtype).removeprefix("torch.") for t in state.values()})
    if len(dtypes) != 1 or dtypes[0] not in HF_TORCH_DTYPES:
        raise CheckpointError(f"{where}: tensors stored as {dtypes}; cast them to one float dtype")
    return dtypes[0]
