"""What a DSpark drafter is, as data: the target it serves and its own shape.

Two frozen dataclasses:

* ``TargetSpec`` (``config_target``): the handful of target-model facts the
  drafter depends on (vocabulary, hidden width, depth, attention geometry). It is
  read from a HuggingFace config so the drafter never guesses them.
* ``DSparkConfig`` (here): the drafter's architecture and DSpark-specific settings.
  Every field is validated in ``__post_init__`` with an error naming the field
  and the fix, because a silently wrong field (a slot convention, a target layer
  that is never captured) costs a training run, not a crash.

The on-disk form is HuggingFace-style JSON (``to_hf_dict``/``from_hf_dict``): the
top level carries the standard HF fields, ``"dspark_config"`` every DSpark field,
and ``"dflash_config"`` the three fields SGLang's DFlash/DSpark config helpers
read (``block_size``, ``target_layer_ids``, ``mask_token_id``). A top-level
``torch_dtype`` (HF's name of the stored weights' dtype, which SGLang's ``--dtype
auto`` follows) is optional so older checkpoints load. The round trip is exact and
anything unknown, missing, out of range or inconsistent is refused.

The layout's names and keys live in ``config_hf``, the field checks in
``config_checks``; every public name is importable from here too.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from dspark_sglang.model.config_checks import (
    _check_bool,
    _check_choice,
    _check_float,
    _check_int,
)
from dspark_sglang.model.config_hf import (
    _DFLASH_FIELDS,
    _HF_MIRRORED_FIELDS,
    _HF_OPTIONAL_KEYS,
    _HF_TOP_LEVEL_KEYS,
    HF_ARCHITECTURE,
    HF_MODEL_TYPE,
    HF_TORCH_DTYPES,
    check_torch_dtype,
    hf_torch_dtype,
)
from dspark_sglang.model.config_target import TargetSpec, default_target_layer_ids

__all__ = [
    "HF_ARCHITECTURE",
    "HF_MODEL_TYPE",
    "HF_TORCH_DTYPES",
    "MAX_BLOCK_SIZE",
    "MAX_HEAD_DIM",
    "MAX_HIDDEN_SIZE",
    "MAX_INTERMEDIATE_SIZE",
    "MAX_MARKOV_RANK",
    "MAX_NUM_EXPERTS",
    "MAX_NUM_HEADS",
    "MAX_NUM_LAYERS",
    "MAX_POSITIONS",
    "MAX_VOCAB_SIZE",
    "DSparkConfig",
    "FFNType",
    "MarkovHeadType",
    "SlotConvention",
    "TargetSpec",
    "check_torch_dtype",
    "default_target_layer_ids",
    "hf_torch_dtype",
]

SlotConvention = Literal["anchor_next", "dflash"]
FFNType = Literal["moe", "dense"]
MarkovHeadType = Literal["vanilla", "gated", "rnn", "none"]

MAX_BLOCK_SIZE = 16
# Size bounds, far above any real drafter or target: a config beyond one is corrupt,
# and building it would die in the allocator instead of naming the field.
MAX_VOCAB_SIZE = 2**22  # 4M tokens; the largest tokenizers have ~256k
MAX_HIDDEN_SIZE = 2**16  # the widest LLMs are 16-32k wide
MAX_INTERMEDIATE_SIZE = 2**18  # 4x the largest hidden size bound
MAX_NUM_LAYERS = 1024  # target depth (a drafter has a handful of layers)
MAX_NUM_HEADS = 1024  # attention heads, query or key/value
MAX_HEAD_DIM = 1024  # real models use 64-256
MAX_NUM_EXPERTS = 1024  # the largest MoEs route over 256-512 experts
MAX_MARKOV_RANK = 2**16  # a low-rank head; the shipped one has rank 96
MAX_POSITIONS = 2**24  # 16M tokens, beyond any context window

# dspark_config fields that may be absent (older checkpoints), with the value absence means.
_OPTIONAL_FIELDS: dict[str, Any] = {"draft_vocab_size": None, "greedy_draft_vocab_size": None}


@dataclass(frozen=True, kw_only=True)
class DSparkConfig:
    """Architecture of one DSpark drafter (see DSPARK.md, "Drafter").

    ``hidden_size`` equals ``target_hidden_size`` because the embedding and LM
    head are the target's own (shared, frozen). ``target_layer_ids`` name the
    *output* of target decoder layer ``l`` (HF ``hidden_states[l + 1]``) and never
    the last layer. ``sliding_window`` bounds how far back the block looks into
    the injected context (``None``: unbounded). ``draft_vocab_size`` ``K`` restricts
    what the drafter proposes to ``K`` target tokens (``model/vocab.py``; ``None``:
    the whole vocabulary); the token ids themselves are a checkpoint tensor.
    ``greedy_draft_vocab_size`` ``K`` gives a full-vocabulary drafter a second map
    that only SGLang's argmax draft uses (``model/vocab.py``, "The greedy map").
    """

    vocab_size: int
    hidden_size: int
    target_hidden_size: int
    num_hidden_layers: int = 3
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    max_position_embeddings: int = 32768
    block_size: int = 7
    target_layer_ids: tuple[int, ...]
    target_num_layers: int
    mask_token_id: int
    slot_convention: SlotConvention = "anchor_next"
    sliding_window: int | None = 128
    ffn_type: FFNType = "moe"
    num_experts: int = 8
    num_experts_per_tok: int = 2
    moe_intermediate_size: int
    shared_expert: bool = True
    shared_expert_intermediate_size: int
    markov_head_type: MarkovHeadType = "vanilla"
    markov_rank: int = 256
    enable_confidence_head: bool = True
    confidence_head_with_markov: bool = True
    qk_norm: bool = True
    target_name: str
    draft_vocab_size: int | None = None
    greedy_draft_vocab_size: int | None = None

    def __post_init__(self) -> None:
        o = "DSparkConfig"
        _check_int(o, "vocab_size", self.vocab_size, lo=2, hi=MAX_VOCAB_SIZE)
        _check_int(o, "hidden_size", self.hidden_size, lo=1, hi=MAX_HIDDEN_SIZE)
        _check_int(o, "target_hidden_size", self.target_hidden_size, lo=1, hi=MAX_HIDDEN_SIZE)
        if self.hidden_size != self.target_hidden_size:
            raise ValueError(
                f"{o}.hidden_size ({self.hidden_size}) must equal target_hidden_size "
                f"({self.target_hidden_size}): the drafter uses the target's embedding and "
                "LM head; set hidden_size to the target's hidden size"
            )
        _check_int(o, "num_hidden_layers", self.num_hidden_layers, lo=1, hi=MAX_NUM_LAYERS)
        _check_int(o, "num_attention_heads", self.num_attention_heads, lo=1, hi=MAX_NUM_HEADS)
        _check_int(o, "num_key_value_heads", self.num_key_value_heads, lo=1, hi=MAX_NUM_HEADS)
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"{o}.num_key_value_heads ({self.num_key_value_heads}) must divide "
                f"num_attention_heads ({self.num_attention_heads}) for grouped-query attention"
            )
        _check_int(o, "head_dim", self.head_dim, lo=2, hi=MAX_HEAD_DIM)
        if self.head_dim % 2:
            raise ValueError(
                f"{o}.head_dim must be even for rotary embeddings, got {self.head_dim}"
            )
        _check_int(o, "intermediate_size", self.intermediate_size, lo=1, hi=MAX_INTERMEDIATE_SIZE)
        object.__setattr__(self, "rms_norm_eps", _check_float(o, "rms_norm_eps", self.rms_norm_eps))
        object.__setattr__(self, "rope_theta", _check_float(o, "rope_theta", self.rope_theta))
        _check_int(o, "block_size", self.block_size, lo=1)
        if self.block_size > MAX_BLOCK_SIZE:
            raise ValueError(
                f"{o}.block_size must be <= {MAX_BLOCK_SIZE}, got {self.block_size}; "
                "use a smaller block"
            )
        _check_int(
            o, "max_position_embeddings", self.max_position_embeddings, lo=1, hi=MAX_POSITIONS
        )
        if self.max_position_embeddings < self.block_size:
            raise ValueError(
                f"{o}.max_position_embeddings ({self.max_position_embeddings}) must be >= "
                f"block_size ({self.block_size})"
            )
        self._validate_target_layers(o)
        _check_int(o, "mask_token_id", self.mask_token_id, lo=0)
        if self.mask_token_id >= self.vocab_size:
            raise ValueError(
                f"{o}.mask_token_id ({self.mask_token_id}) must be < vocab_size "
                f"({self.vocab_size}); pick a token id of the target's vocabulary"
            )
        _check_choice(o, "slot_convention", self.slot_convention, SlotConvention)
        if self.sliding_window is not None:
            _check_int(o, "sliding_window", self.sliding_window, lo=1, hi=MAX_POSITIONS)
        _check_choice(o, "ffn_type", self.ffn_type, FFNType)
        _check_int(o, "num_experts", self.num_experts, lo=1, hi=MAX_NUM_EXPERTS)
        _check_int(o, "num_experts_per_tok", self.num_experts_per_tok, lo=1)
        if self.num_experts_per_tok > self.num_experts:
            raise ValueError(
                f"{o}.num_experts_per_tok ({self.num_experts_per_tok}) must be <= "
                f"num_experts ({self.num_experts})"
            )
        _check_int(
            o, "moe_intermediate_size", self.moe_intermediate_size, lo=1, hi=MAX_INTERMEDIATE_SIZE
        )
        _check_bool(o, "shared_expert", self.shared_expert)
        shared = self.shared_expert_intermediate_size
        _check_int(o, "shared_expert_intermediate_size", shared, lo=1, hi=MAX_INTERMEDIATE_SIZE)
        _check_choice(o, "markov_head_type", self.markov_head_type, MarkovHeadType)
        _check_int(o, "markov_rank", self.markov_rank, lo=1, hi=MAX_MARKOV_RANK)
        _check_bool(o, "enable_confidence_head", self.enable_confidence_head)
        _check_bool(o, "confidence_head_with_markov", self.confidence_head_with_markov)
        if (
            self.enable_confidence_head
            and self.confidence_head_with_markov
            and self.markov_head_type == "none"
        ):
            raise ValueError(
                f"{o}.confidence_head_with_markov=True needs a Markov head (it reads "
                "E[prev] from markov_w1) but markov_head_type='none'; set "
                "confidence_head_with_markov=False or choose a Markov head"
            )
        _check_bool(o, "qk_norm", self.qk_norm)
        if self.draft_vocab_size is not None:
            _check_int(o, "draft_vocab_size", self.draft_vocab_size, lo=1, hi=self.vocab_size)
        if self.greedy_draft_vocab_size is not None:
            greedy = self.greedy_draft_vocab_size
            _check_int(o, "greedy_draft_vocab_size", greedy, lo=1, hi=self.vocab_size)
            if self.draft_vocab_size is not None:
                raise ValueError(
                    f"{o}.greedy_draft_vocab_size={greedy} needs a full-vocabulary drafter, "
                    f"but draft_vocab_size={self.draft_vocab_size}: a reduced drafter already "
                    "drafts over its map for every request; drop greedy_draft_vocab_size, or "
                    "export the full drafter with --greedy-draft-vocab-size alone"
                )
        if not isinstance(self.target_name, str) or not self.target_name:
            raise ValueError(
                f"{o}.target_name must be a non-empty string naming the target the "
                f"drafter was trained for, got {self.target_name!r}"
            )

    def _validate_target_layers(self, o: str) -> None:
        _check_int(o, "target_num_layers", self.target_num_layers, lo=2, hi=MAX_NUM_LAYERS)
        ids = self.target_layer_ids
        if isinstance(ids, list):
            ids = tuple(ids)
            object.__setattr__(self, "target_layer_ids", ids)
        if not isinstance(ids, tuple) or not ids:
            raise ValueError(f"{o}.target_layer_ids must be a non-empty tuple of ints, got {ids!r}")
        last = self.target_num_layers - 1
        for i, lid in enumerate(ids):
            _check_int(o, f"target_layer_ids[{i}]", lid, lo=0)
            if lid >= last:
                raise ValueError(
                    f"{o}.target_layer_ids[{i}]={lid} is out of range: ids must be in "
                    f"[0, {last - 1}] (the target has {self.target_num_layers} layers and its "
                    "last layer's output is never captured); use default_target_layer_ids()"
                )
        if len(set(ids)) != len(ids):
            raise ValueError(f"{o}.target_layer_ids must not repeat a layer, got {ids}")

    # ------------------------------------------------------------------ builders

    @property
    def num_context_features(self) -> int:
        """How many target layers are concatenated into one context row."""
        return len(self.target_layer_ids)

    @classmethod
    def for_target(cls, spec: TargetSpec, *, mask_token_id: int, **overrides: Any) -> DSparkConfig:
        """A sensible default drafter for ``spec`` (production shape, DSPARK.md).

        Attention geometry and RoPE follow the target (its embedding feeds the
        drafter); five target layers spread over ``[1, L-3]``; the FFN is a
        3-layer MoE whose active width (2 of 8 experts of I/4 plus a shared
        expert of I/2) matches a dense SwiGLU of width I.
        """
        inter = overrides.get("intermediate_size", 64 * math.ceil(8 * spec.hidden_size / 3 / 64))
        fields: dict[str, Any] = {
            "vocab_size": spec.vocab_size,
            "hidden_size": spec.hidden_size,
            "target_hidden_size": spec.hidden_size,
            "num_attention_heads": spec.num_attention_heads,
            "num_key_value_heads": spec.num_key_value_heads,
            "head_dim": spec.head_dim,
            "intermediate_size": inter,
            "rms_norm_eps": spec.rms_norm_eps,
            "rope_theta": spec.rope_theta,
            "max_position_embeddings": spec.max_position_embeddings,
            "target_layer_ids": default_target_layer_ids(spec.num_layers, n=5),
            "target_num_layers": spec.num_layers,
            "mask_token_id": mask_token_id,
            "moe_intermediate_size": max(1, inter // 4),
            "shared_expert_intermediate_size": max(1, inter // 2),
            "target_name": spec.name,
        }
        unknown = set(overrides) - {f.name for f in dataclasses.fields(cls)}
        if unknown:
            raise ValueError(f"DSparkConfig.for_target got unknown overrides {sorted(unknown)}")
        fields.update(overrides)
        return cls(**fields)

    # ------------------------------------------------------------------ HF JSON

    def to_dict(self) -> dict[str, Any]:
        """Every field, JSON-ready (tuples become lists); optional fields at their
        default are left out, so a drafter without them writes what older code read."""
        out = dataclasses.asdict(self)
        out["target_layer_ids"] = list(self.target_layer_ids)
        for name, default in _OPTIONAL_FIELDS.items():
            if out[name] == default:
                del out[name]
        return out

    def to_hf_dict(self, *, torch_dtype: str | None = None) -> dict[str, Any]:
        """HF ``config.json`` content (see the module docstring for the layout).

        ``torch_dtype`` (HF's name of the stored weights' dtype, e.g. ``"bfloat16"``)
        is what SGLang's ``--dtype auto`` runs the drafter at; omitted when ``None``.
        """
        d = self.to_dict()
        hf: dict[str, Any] = {"architectures": [HF_ARCHITECTURE], "model_type": HF_MODEL_TYPE}
        hf.update({k: d[k] for k in _HF_MIRRORED_FIELDS})
        if torch_dtype is not None:
            hf["torch_dtype"] = check_torch_dtype(torch_dtype)
        hf["dspark_config"] = d
        hf["dflash_config"] = {k: d[k] for k in _DFLASH_FIELDS}
        return hf

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> DSparkConfig:
        """Inverse of ``to_dict``; unknown or missing keys are refused."""
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - names)
        missing = sorted(names - set(d) - set(_OPTIONAL_FIELDS))
        if unknown:
            raise ValueError(
                f"dspark_config has unknown keys {unknown}; remove them (known: {sorted(names)})"
            )
        if missing:
            raise ValueError(f"dspark_config is missing keys {missing}; add them")
        fields = dict(d)
        if isinstance(fields["target_layer_ids"], list):
            fields["target_layer_ids"] = tuple(fields["target_layer_ids"])
        return cls(**fields)

    @classmethod
    def from_hf_dict(cls, d: Mapping[str, Any]) -> DSparkConfig:
        """Parse ``to_hf_dict`` output, checking the mirrors agree with ``dspark_config``.

        An optional ``torch_dtype`` must name a floating dtype (read it back with
        ``hf_torch_dtype``).
        """
        if not isinstance(d, Mapping):
            raise ValueError(f"DSpark HF config must be a JSON object, got {type(d).__name__}")
        unknown = sorted(set(d) - _HF_TOP_LEVEL_KEYS - _HF_OPTIONAL_KEYS)
        missing = sorted(_HF_TOP_LEVEL_KEYS - set(d))
        if unknown:
            raise ValueError(f"DSpark HF config has unknown top-level keys {unknown}; remove them")
        if missing:
            raise ValueError(f"DSpark HF config is missing top-level keys {missing}; add them")
        if d["architectures"] != [HF_ARCHITECTURE]:
            raise ValueError(
                f"DSpark HF config architectures must be [{HF_ARCHITECTURE!r}], "
                f"got {d['architectures']!r}"
            )
        if d["model_type"] != HF_MODEL_TYPE:
            raise ValueError(
                f"DSpark HF config model_type must be {HF_MODEL_TYPE!r}, got {d['model_type']!r}"
            )
        hf_torch_dtype(d)
        inner = d["dspark_config"]
        if not isinstance(inner, Mapping):
            raise ValueError("DSpark HF config dspark_config must be a JSON object")
        config = cls.from_dict(inner)
        expected = config.to_hf_dict()
        for key in _HF_MIRRORED_FIELDS:
            if d[key] != expected[key]:
                raise ValueError(
                    f"DSpark HF config top-level {key}={d[key]!r} disagrees with "
                    f"dspark_config.{key}={expected[key]!r}; make them equal"
                )
        dflash = d["dflash_config"]
        if not isinstance(dflash, Mapping) or dict(dflash) != expected["dflash_config"]:
            raise ValueError(
                f"DSpark HF config dflash_config={dflash!r} must be exactly "
                f"{expected['dflash_config']!r} (a mirror of dspark_config)"
            )
        return config
