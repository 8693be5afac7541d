"""The target-model facts a drafter depends on, read from its HuggingFace config.

``TargetSpec`` holds the vocabulary, hidden width, depth and attention geometry of
the target so the drafter never guesses them; ``default_target_layer_ids`` picks
which of its layers' outputs feed the drafter by default.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from dspark_sglang.model.config_checks import _check_float, _check_int

__all__ = ["TargetSpec", "default_target_layer_ids"]


def default_target_layer_ids(num_layers: int, n: int = 5) -> tuple[int, ...]:
    """``n`` target layers spread evenly over ``[1, L-3]`` (DSpark/DFlash default).

    The last layer is never returned: its output is not captured as a hidden
    state (the LM head consumes it). Small targets yield fewer, distinct ids.
    """
    _check_int("default_target_layer_ids", "num_layers", num_layers, lo=2)
    _check_int("default_target_layer_ids", "n", n, lo=1)
    lo = min(1, num_layers - 2)
    hi = max(lo, num_layers - 3)
    if n == 1:
        return (lo,)
    ids = sorted({round(lo + i * (hi - lo) / (n - 1)) for i in range(n)})
    return tuple(int(i) for i in ids)


@dataclass(frozen=True)
class TargetSpec:
    """The target-model facts a drafter is built against and checked against."""

    name: str
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rope_theta: float
    rms_norm_eps: float
    max_position_embeddings: int

    def __post_init__(self) -> None:
        o = "TargetSpec"
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"{o}.name must be a non-empty string, got {self.name!r}")
        _check_int(o, "vocab_size", self.vocab_size, lo=2)
        _check_int(o, "hidden_size", self.hidden_size, lo=1)
        _check_int(o, "num_layers", self.num_layers, lo=2)
        _check_int(o, "num_attention_heads", self.num_attention_heads, lo=1)
        _check_int(o, "num_key_value_heads", self.num_key_value_heads, lo=1)
        _check_int(o, "head_dim", self.head_dim, lo=2)
        _check_int(o, "max_position_embeddings", self.max_position_embeddings, lo=1)
        object.__setattr__(self, "rope_theta", _check_float(o, "rope_theta", self.rope_theta))
        object.__setattr__(self, "rms_norm_eps", _check_float(o, "rms_norm_eps", self.rms_norm_eps))

    @classmethod
    def from_hf_config(cls, cfg: Any, name: str) -> TargetSpec:
        """Read a Llama/SmolLM2/Qwen3 HF config (object or dict).

        transformers 5 keeps ``rope_theta`` inside ``rope_parameters``; older
        configs have it at the top level. ``head_dim`` defaults to
        ``hidden_size // num_attention_heads`` (Llama), Qwen3 states it.
        """

        def get(key: str, default: Any = None) -> Any:
            if isinstance(cfg, Mapping):
                return cfg.get(key, default)
            return getattr(cfg, key, default)

        def need(key: str) -> Any:
            value = get(key)
            if value is None:
                raise ValueError(f"target HF config for {name!r} has no {key!r}")
            return value

        hidden = int(need("hidden_size"))
        heads = int(need("num_attention_heads"))
        kv_heads = get("num_key_value_heads")
        head_dim = get("head_dim")
        rope_theta = get("rope_theta")
        if rope_theta is None:
            rope_params = get("rope_parameters") or {}
            rope_theta = rope_params.get("rope_theta") if isinstance(rope_params, Mapping) else None
        if rope_theta is None:
            raise ValueError(
                f"target HF config for {name!r} has neither rope_theta nor "
                "rope_parameters['rope_theta']"
            )
        return cls(
            name=name,
            vocab_size=int(need("vocab_size")),
            hidden_size=hidden,
            num_layers=int(need("num_hidden_layers")),
            num_attention_heads=heads,
            num_key_value_heads=int(kv_heads) if kv_heads is not None else heads,
            head_dim=int(head_dim) if head_dim is not None else hidden // heads,
            rope_theta=float(rope_theta),
            rms_norm_eps=float(need("rms_norm_eps")),
            max_position_embeddings=int(need("max_position_embeddings")),
        )
