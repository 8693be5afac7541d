"""The HuggingFace ``config.json`` layout of a DSpark drafter: fixed names and keys.

The architecture and model type SGLang dispatches on, which top-level fields mirror
a ``DSparkConfig`` field, which three form the ``dflash_config`` SGLang's helpers
read, and the optional ``torch_dtype`` with its check. ``DSparkConfig.to_hf_dict``
and ``from_hf_dict`` (in ``config``) write and read the layout.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = [
    "HF_ARCHITECTURE",
    "HF_MODEL_TYPE",
    "HF_TORCH_DTYPES",
    "check_torch_dtype",
    "hf_torch_dtype",
]

# HF ``torch_dtype`` names a drafter checkpoint may declare for its floating weights.
HF_TORCH_DTYPES: tuple[str, ...] = ("float32", "bfloat16", "float16", "float64")

HF_ARCHITECTURE = "DSparkMoEDraftModel"
HF_MODEL_TYPE = "dspark_moe"

# Top-level HF fields that mirror a DSparkConfig field of the same name.
_HF_MIRRORED_FIELDS: tuple[str, ...] = (
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "intermediate_size",
    "rms_norm_eps",
    "rope_theta",
    "vocab_size",
    "max_position_embeddings",
    "sliding_window",
)
_DFLASH_FIELDS: tuple[str, ...] = ("block_size", "target_layer_ids", "mask_token_id")
_HF_TOP_LEVEL_KEYS: frozenset[str] = frozenset(
    {"architectures", "model_type", "dspark_config", "dflash_config", *_HF_MIRRORED_FIELDS}
)
_HF_OPTIONAL_KEYS: frozenset[str] = frozenset({"torch_dtype"})  # absent in old checkpoints


def check_torch_dtype(value: object) -> str:
    """A ``torch_dtype`` name from ``config.json`` (HF spelling, e.g. ``"bfloat16"``)."""
    if value not in HF_TORCH_DTYPES:
        raise ValueError(
            f"DSpark HF config torch_dtype={value!r} is not a floating dtype name; set it to "
            f"one of {list(HF_TORCH_DTYPES)} (the dtype of model.safetensors) or remove it"
        )
    return str(value)


def hf_torch_dtype(d: Mapping[str, Any]) -> str | None:
    """The validated ``torch_dtype`` of an HF config dict, ``None`` when absent (old ones)."""
    value = d.get("torch_dtype")
    return None if value is None else check_torch_dtype(value)
