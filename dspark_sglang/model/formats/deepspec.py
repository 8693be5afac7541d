"""DeepSpec's DSpark drafter layout: read, check, and convert to and from ours.

A DeepSpec drafter is HF ``save_pretrained`` output (``config.json``, ``model.safetensors``)
that SGLang's dense ``Qwen3DSparkModel`` loads directly. Facts relied on (DeepSpec:
deepseek-ai/DeepSpec; SGLang 0.5.23 under ``sglang/srt/``):

* ``deepspec/modeling/dspark/qwen3/config.py``: the target's config copied, then
  ``architectures=["Qwen3DSparkModel"]``, ``num_target_layers``, draft ``num_hidden_layers``,
  ``block_size``, ``tie_word_embeddings=False``, ``layer_types`` all ``full_attention``,
  ``mask_token_id``, ``target_layer_ids``, ``num_anchors``, ``enable_confidence_head``
  (+ ``confidence_head_with_markov``), ``markov_rank`` (+ ``markov_head_type``).
  ``requirements.txt``: transformers 5 (``dtype``, ``rope_parameters``, unsharded saves).
* ``deepspec/modeling/dspark/qwen3/modeling.py``: names without ``model.``
  (``expected_tensors``); q/k/v/o biases iff ``attention_bias``; ``q_norm``/``k_norm`` always
  (``k_norm`` on context keys too); ``fc`` ``[H, n*H]``; confidence input ``H (+ r)``; slot
  ``k`` is labelled ``anchor + k + 1``, slot 0's previous token is the anchor.
* ``deepspec/modeling/dspark/common.py``: blocks see context before the anchor and their
  whole block; ``AcceptRatePredictor`` has a bias; ids strictly increasing in
  ``{-1} U [0, num_target_layers - 1]``; id ``L`` is HF ``hidden_states[L + 1]``
  (``scripts/data/prepare_target_cache.py`` hooks ``layers[L]``): ours, ids map unchanged.
* ``deepspec/modeling/dspark/markov_head.py``: ``markov_w1`` ``Embedding(V, r)``,
  ``markov_w2`` ``Linear(r, V)``, gated ``gate_proj`` ``Linear(H + r, r)``, rnn ``joint_proj``
  ``Linear(2r + H, 3r)``. ``deepspec/trainer/ckpt_manager.py``: ``_orig_mod.`` stripped;
  ``deepspec/trainer/base_trainer.py``: ``embed_tokens``/``lm_head`` are the target's.
* SGLang ``models/dspark.py``: skips ``embed_tokens.``/``lm_head.``; needs ``markov_rank > 0``;
  builds the confidence head (with bias) unless ``SGLANG_RAGGED_VERIFY_MODE=static``,
  whatever ``enable_confidence_head`` says, and refuses a checkpoint without its weights; a
  missing Markov tensor stays at init (refused here). ``models/dflash.py``: ignores unknown
  names; reads ``attention_bias``, ``hidden_act``, ``head_dim``, ``use_gemma_norm``,
  ``is_causal``, ``layer_types`` (``sliding_attention``: causal, query-windowed), RoPE keys,
  ``partial_rotary_factor``, ``rope_is_neox_style``.
* SGLang ``speculative/dspark_components/dspark_config.py``: ``dflash_config``,
  ``dspark_config`` and ``dspark_*`` keys override the top level; ``sample_from_anchor``
  (default true): ``gamma = block_size`` rows from the anchor, slot ``k`` predicts ``p+k+1``.
* SGLang ``speculative/dflash_utils.py`` refuses ids outside ``[0, layers)``; its Qwen3
  target (``models/qwen3.py``) captures id ``L`` before layer ``L + 1`` inside its layer
  loop, so the last layer is never captured: ids must be ``<= layers - 2``, though neither
  DeepSpec nor SGLang's parser refuses ``layers - 1``.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file
from torch import nn

from dspark_sglang.model import config as C
from dspark_sglang.model.checkpoint import CONFIG_FILE, WEIGHTS_FILE, CheckpointError, save_drafter
from dspark_sglang.model.config import HF_TORCH_DTYPES, MAX_BLOCK_SIZE, DSparkConfig
from dspark_sglang.model.drafter import DSparkDrafter
from dspark_sglang.model.formats.common import FLOAT_DTYPES as _FLOAT_DTYPES
from dspark_sglang.model.formats.common import header as _header
from dspark_sglang.model.formats.common import load_tensors as _load_tensors
from dspark_sglang.model.formats.common import one_dtype as _one_dtype
from dspark_sglang.model.formats.common import same_shapes as _same_shapes

ARCHITECTURE = "Qwen3DSparkModel"
MODEL_TYPE = "qwen3"
MARKOV_HEAD_TYPES: tuple[str, ...] = ("vanilla", "gated", "rnn")
#: DeepSpec's training-only anchors per sequence (``config/dspark/*.py``); its model class
#: asserts the field, our format does not keep it.
DEFAULT_NUM_ANCHORS = 512
#: The target's frozen embedding and LM head: stored by DeepSpec, never by us.
SHARED_TENSORS: tuple[str, ...] = ("embed_tokens.weight", "lm_head.weight")
# Keys of other layouts; SGLang would read them over DeepSpec's top-level fields.
_FOREIGN_KEYS: tuple[str, ...] = (
    "dflash_config", "dspark_config", "speculators_model_type", "speculators_config",
    "transformer_layer_config", "dspark_block_size", "dspark_markov_rank",
    "dspark_markov_head_type", "dspark_noise_token_id", "dspark_target_layer_ids",
)  # fmt: skip
# Same name and meaning in DeepSpecConfig and DSparkConfig (layer id L: layer L's output).
_COMMON: tuple[str, ...] = (
    "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
    "num_key_value_heads", "head_dim", "intermediate_size", "rms_norm_eps", "rope_theta",
    "max_position_embeddings", "block_size", "mask_token_id", "markov_head_type",
    "markov_rank", "enable_confidence_head", "confidence_head_with_markov", "target_layer_ids",
)  # fmt: skip
# Integer sizes and bounds: beyond one, config.json is corrupt (refused before allocating).
_SIZES: dict[str, tuple[int, int]] = {
    "hidden_size": (1, C.MAX_HIDDEN_SIZE), "num_hidden_layers": (1, C.MAX_NUM_LAYERS),
    "num_attention_heads": (1, C.MAX_NUM_HEADS), "num_key_value_heads": (1, C.MAX_NUM_HEADS),
    "head_dim": (2, C.MAX_HEAD_DIM), "intermediate_size": (1, C.MAX_INTERMEDIATE_SIZE),
    "vocab_size": (2, C.MAX_VOCAB_SIZE), "max_position_embeddings": (1, C.MAX_POSITIONS),
    "num_target_layers": (2, C.MAX_NUM_LAYERS), "block_size": (1, C.MAX_POSITIONS),
    "num_anchors": (1, C.MAX_POSITIONS), "markov_rank": (1, C.MAX_MARKOV_RANK),
}  # fmt: skip
_BOOLS = ("enable_confidence_head", "confidence_head_with_markov", "tie_word_embeddings",
          "attention_bias", "sample_from_anchor")  # fmt: skip
# Fields with one possible value: DeepSpec's Qwen3 drafter's, what our drafter computes.
_FIXED: dict[str, tuple[Any, str]] = {
    "architectures": ((ARCHITECTURE,), "only DeepSpec's Qwen3 drafter is read"),
    "model_type": (MODEL_TYPE, "the drafter is a Qwen3 stack"),
    "enable_confidence_head": (True, "SGLang builds the confidence head (unless "
        "SGLANG_RAGGED_VERIFY_MODE=static) and refuses a checkpoint without it"),
    "tie_word_embeddings": (False, "DeepSpec stores an untied lm_head"),
    "attention_bias": (False, "our attention has no biases"),
    "hidden_act": ("silu", "the MLP is a SiLU SwiGLU"),
    "sample_from_anchor": (True, "a 1+N layout (slot 0 masked) is one slot off"),
}  # fmt: skip
_REQUIRED: tuple[str, ...] = (*_SIZES, "architectures", "model_type", "target_layer_ids",
    "mask_token_id", "enable_confidence_head", "rms_norm_eps")  # fmt: skip
# Absent: the value DeepSpec's, HF Qwen3's or SGLang's code then uses (None: refused).
_OPTIONAL: dict[str, Any] = {
    "markov_head_type": None, "confidence_head_with_markov": None,
    "tie_word_embeddings": False, "attention_bias": False, "hidden_act": "silu",
    "sample_from_anchor": True, "target_name": None,
}  # fmt: skip


def _int(name: str, value: object, lo: int, hi: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"DeepSpecConfig.{name} must be an int, got {value!r}; set an integer")
    if not lo <= value <= hi:
        big = value > hi and name in _SIZES
        why = " (far beyond any real model: config.json is corrupt)" * big
        why += " (SGLang's DSpark requires a Markov head)" * (name == "markov_rank")
        why += " (SGLang refuses -1, DeepSpec's embedding output)" * (value == -1)
        raise ValueError(f"DeepSpecConfig.{name}={value} must lie in [{lo}, {hi}]{why}; fix it")


@dataclasses.dataclass(frozen=True, kw_only=True)
class DeepSpecConfig:
    """The fields of a DeepSpec ``config.json`` we and SGLang depend on; anything DeepSpec,
    SGLang's dense class or our drafter would read differently is refused, named."""

    architectures: tuple[str, ...] = (ARCHITECTURE,)
    model_type: str = MODEL_TYPE
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    max_position_embeddings: int
    num_target_layers: int
    block_size: int
    target_layer_ids: tuple[int, ...]
    mask_token_id: int
    num_anchors: int = DEFAULT_NUM_ANCHORS
    markov_rank: int
    markov_head_type: str | None
    enable_confidence_head: bool = True
    confidence_head_with_markov: bool | None
    rms_norm_eps: float
    rope_theta: float
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    hidden_act: str = "silu"
    sample_from_anchor: bool = True
    torch_dtype: str | None = None
    target_name: str | None = None

    def __post_init__(self) -> None:
        o = "DeepSpecConfig"
        for name in ("architectures", "target_layer_ids"):
            if isinstance(getattr(self, name), list):
                object.__setattr__(self, name, tuple(getattr(self, name)))
        for name, (lo, hi) in _SIZES.items():
            _int(name, getattr(self, name), lo, hi)
        for name in _BOOLS:
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{o}.{name} must be true or false, got {getattr(self, name)!r}")
        for name, (want, why) in _FIXED.items():
            if getattr(self, name) != want:
                raise ValueError(f"{o}.{name}={getattr(self, name)!r} is not {want!r}: {why}")
        if self.head_dim % 2 or self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"{o}.head_dim={self.head_dim} must be even (RoPE) and num_key_value_heads="
                f"{self.num_key_value_heads} must divide num_attention_heads"
            )
        _int("mask_token_id", self.mask_token_id, 0, self.vocab_size - 1)
        self._check_layer_ids(o)
        if self.markov_head_type not in MARKOV_HEAD_TYPES:
            raise ValueError(
                f"{o}.markov_head_type must be one of {MARKOV_HEAD_TYPES} (DeepSpec's and "
                f"SGLang's heads), got {self.markov_head_type!r}"
            )
        for name in ("rms_norm_eps", "rope_theta"):
            value = getattr(self, name)
            if type(value) not in (int, float) or not (math.isfinite(value) and value > 0):
                raise ValueError(f"{o}.{name} must be a finite number > 0, got {value!r}")
            object.__setattr__(self, name, float(value))
        if self.torch_dtype not in (None, *HF_TORCH_DTYPES):
            raise ValueError(f"{o}.torch_dtype={self.torch_dtype!r} is not a floating dtype")
        if self.target_name is not None and not (
            self.target_name and type(self.target_name) is str
        ):
            raise ValueError(f"{o}.target_name must be a non-empty string or absent")

    def _check_layer_ids(self, o: str) -> None:
        ids, last = self.target_layer_ids, self.num_target_layers - 1
        if not isinstance(ids, tuple) or not ids:
            raise ValueError(f"{o}.target_layer_ids must be a non-empty list of ints, got {ids!r}")
        for i, lid in enumerate(ids):
            _int(f"target_layer_ids[{i}]", lid, 0, last)
            if lid == last:
                raise ValueError(
                    f"{o}.target_layer_ids[{i}]={lid} names the target's last layer "
                    f"(num_target_layers={self.num_target_layers}), whose output SGLang never "
                    f"captures; ids must lie in [0, {last - 1}]"
                )
        if len(set(ids)) != len(ids) or list(ids) != sorted(ids):
            raise ValueError(
                f"{o}.target_layer_ids must be strictly increasing (no layer twice; DeepSpec "
                f"concatenates them in order), got {list(ids)}"
            )

    @classmethod
    def from_hf_dict(cls, raw: Mapping[str, Any]) -> DeepSpecConfig:
        """Parse a DeepSpec ``config.json``; copied target keys are ignored unless a loader
        would then compute something our drafter does not (refused by name)."""
        if not isinstance(raw, Mapping):
            raise ValueError(f"config.json must be a JSON object, got {type(raw).__name__}")
        if foreign := [k for k in _FOREIGN_KEYS if k in raw]:
            raise ValueError(f"config.json has {foreign}: another layout than DeepSpec's (SGLang "
                             "reads them over the top level); use its own tool")  # fmt: skip
        _refuse_other_attention(raw)
        if missing := [k for k in _REQUIRED if k not in raw]:
            raise ValueError(f"config.json is missing {missing}: DeepSpec's build_draft_config "
                             "writes them (head_dim via the Qwen3 target); add them")  # fmt: skip
        fields = {k: raw[k] for k in _REQUIRED} | {k: raw.get(k, v) for k, v in _OPTIONAL.items()}
        fields["torch_dtype"] = raw.get("dtype") or raw.get("torch_dtype")  # v5 or v4 name
        return cls(**fields, rope_theta=_rope_theta(raw))

    def to_hf_dict(self) -> dict[str, Any]:
        """``config.json`` content (transformers 5 spelling), every convention field explicit."""
        out = {k: v for k, v in dataclasses.asdict(self).items() if v is not None}
        out["dtype"] = out.pop("torch_dtype", None)
        return out | {  # tuples are written as JSON lists
            "rope_parameters": {"rope_type": "default", "rope_theta": self.rope_theta},
            "rope_scaling": None, "partial_rotary_factor": 1.0, "use_sliding_window": False,
            "sliding_window": None, "layer_types": ["full_attention"] * self.num_hidden_layers,
            "attention_dropout": 0.0,
        }  # fmt: skip


def _refuse_other_attention(raw: Mapping[str, Any]) -> None:
    """Keys under which DeepSpec or SGLang would compute another attention than ours."""

    def bad(key: str, why: str) -> ValueError:
        return ValueError(f"config.json {key}={raw[key]!r}: {why}; our drafter cannot express it")

    for key in ("rope_scaling", "rope_parameters"):
        rope = raw.get(key)
        if rope is not None and (
            not isinstance(rope, Mapping)
            or set(rope) - {"rope_type", "type", "rope_theta", "partial_rotary_factor"}
            or rope.get("rope_type", rope.get("type", "default")) != "default"
            or rope.get("partial_rotary_factor", 1.0) != 1.0
        ):
            raise bad(key, "not plain RoPE")
    if raw.get("partial_rotary_factor", 1.0) != 1.0:
        raise bad("partial_rotary_factor", "partial RoPE")
    types = raw.get("layer_types")
    if types is not None and types != ["full_attention"] * raw.get("num_hidden_layers", -1):
        raise bad("layer_types", "DeepSpec writes one 'full_attention' per draft layer")
    for key in ("use_sliding_window", "is_causal", "use_gemma_norm", "attention_sink_bias"):
        if raw.get(key) not in (None, False):
            raise bad(key, "the block attends bidirectionally over plain RMSNorm features")
    for key in ("rope_is_neox_style", "is_neox_style"):
        if raw.get(key) not in (None, True):
            raise bad(key, "our RoPE is rotate-half (neox) style")


def _rope_theta(raw: Mapping[str, Any]) -> Any:
    top, params = raw.get("rope_theta"), raw.get("rope_parameters")
    nested = params.get("rope_theta") if isinstance(params, Mapping) else None
    if top is not None and nested is not None and top != nested:
        raise ValueError(f"config.json rope_theta={top!r} but rope_parameters has {nested!r}")
    if top is None and nested is None:
        raise ValueError("config.json has neither rope_theta nor rope_parameters['rope_theta']")
    return top if top is not None else nested


def expected_tensors(cfg: DeepSpecConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor name DeepSpec's ``Qwen3DSparkModel`` saves, with its shape."""
    h, v, r, d = cfg.hidden_size, cfg.vocab_size, cfg.markov_rank, cfg.head_dim
    q, kv, i = cfg.num_attention_heads * d, cfg.num_key_value_heads * d, cfg.intermediate_size
    out = {"embed_tokens.weight": (v, h), "fc.weight": (h, len(cfg.target_layer_ids) * h),
           "hidden_norm.weight": (h,)}  # fmt: skip
    layer = {
        "input_layernorm": (h,), "self_attn.q_proj": (q, h), "self_attn.k_proj": (kv, h),
        "self_attn.v_proj": (kv, h), "self_attn.o_proj": (h, q), "self_attn.q_norm": (d,),
        "self_attn.k_norm": (d,), "post_attention_layernorm": (h,), "mlp.gate_proj": (i, h),
        "mlp.up_proj": (i, h), "mlp.down_proj": (h, i),
    }  # fmt: skip
    for n in range(cfg.num_hidden_layers):
        out |= {f"layers.{n}.{k}.weight": shape for k, shape in layer.items()}
    w = "markov_head.markov_w"
    out |= {"norm.weight": (h,), "lm_head.weight": (v, h), w + "1.weight": (v, r),
            w + "2.weight": (v, r)}  # fmt: skip
    if cfg.markov_head_type == "gated":
        out |= {"markov_head.gate_proj.weight": (r, h + r), "markov_head.gate_proj.bias": (r,)}
    if cfg.markov_head_type == "rnn":
        out |= {"markov_head.joint_proj.weight": (3 * r, 2 * r + h),
                "markov_head.joint_proj.bias": (3 * r,)}  # fmt: skip
    width = h + (r if cfg.confidence_head_with_markov else 0)
    return out | {"confidence_head.proj.weight": (1, width), "confidence_head.proj.bias": (1,)}


# --------------------------------------------------------------------------- files


def _check_target(cfg: DeepSpecConfig, target: Mapping[str, Any], where: Path) -> None:
    t = target["text_config"] if isinstance(target.get("text_config"), Mapping) else target
    keys = {"hidden_size": "hidden_size", "vocab_size": "vocab_size",
            "num_target_layers": "num_hidden_layers"}  # fmt: skip
    if any(type(t.get(k)) is not int for k in keys.values()):
        raise CheckpointError(f"the target config lacks one of {list(keys.values())}")
    layers = t["num_hidden_layers"]
    for i, lid in enumerate(cfg.target_layer_ids):
        if lid >= layers - 1:
            raise CheckpointError(
                f"{where}: target_layer_ids[{i}]={lid} but the target has {layers} layers: ids "
                f"must lie in [0, {layers - 2}] (SGLang captures layer L's output before layer "
                "L+1 runs, never the last layer's); use a drafter trained for this target"
            )
    for ours, theirs in keys.items():
        if getattr(cfg, ours) != t[theirs]:
            raise CheckpointError(
                f"{where}: {ours}={getattr(cfg, ours)} but the target's {theirs} is {t[theirs]}; "
                "use a drafter trained for this target"
            )


def check_checkpoint(
    folder: str | Path, target_hf_config: Mapping[str, Any] | None = None
) -> DeepSpecConfig:
    """Refuse a DeepSpec drafter folder that SGLang or our converter would misread.

    Reads ``config.json`` and the safetensors header only; every refusal names the field or
    tensor. ``target_hf_config`` (the target's ``config.json`` as a dict) adds the checks
    against the target. Returns the validated config.
    """
    folder = Path(folder)
    try:
        cfg = DeepSpecConfig.from_hf_dict(json.loads((folder / CONFIG_FILE).read_text()))
    except (OSError, ValueError) as exc:  # JSONDecodeError is a ValueError
        raise CheckpointError(f"{folder / CONFIG_FILE}: {exc}") from exc
    if cfg.block_size > MAX_BLOCK_SIZE:
        raise CheckpointError(
            f"{folder}: block_size={cfg.block_size} > {MAX_BLOCK_SIZE}, the largest block served "
            "here; use a drafter trained with a smaller block"
        )
    stored = _header(folder)  # shapes and dtypes from the header alone
    want = expected_tensors(cfg)
    missing, unexpected = sorted(set(want) - set(stored)), sorted(set(stored) - set(want))
    if missing or unexpected:
        raise CheckpointError(
            f"{folder}: tensors missing {missing}, unexpected {unexpected} against config.json "
            "(SGLang would refuse, ignore or leave them at random init)"
        )
    for name, (code, shape) in sorted(stored.items()):
        if code not in _FLOAT_DTYPES:
            raise CheckpointError(f"{folder}: tensor {name!r} has dtype {code}, not a float")
        if shape != want[name]:
            hint = " ([hidden_size, len(target_layer_ids) * hidden_size])" * (name == "fc.weight")
            raise CheckpointError(
                f"{folder}: tensor {name!r} has shape {shape}, config.json implies "
                f"{want[name]}{hint}; the weights and config.json disagree"
            )
    if target_hf_config is not None:
        _check_target(cfg, target_hf_config, folder)
    return cfg


# --------------------------------------------------------------------------- conversion


# What DeepSpec cannot express (a Markov head 'none' is refused by DeepSpecConfig).
_INEXPRESSIBLE: tuple[tuple[str, Any, str], ...] = (
    ("ffn_type", "dense", "DeepSpec's Qwen3DSparkModel (and SGLang's dense class) has one "
     "dense SwiGLU MLP per layer, no routed experts; serve it in our own format"),
    ("sliding_window", None, "DeepSpec's layers see the whole context; SGLang's "
     "sliding_attention is causal and query-relative, not our anchor-relative window"),
    ("slot_convention", "anchor_next", "DeepSpec blocks are anchor-first"),
    ("qk_norm", True, "DeepSpec's attention always has q_norm and k_norm"),
    ("enable_confidence_head", True, "SGLang needs the confidence head"),
    ("draft_vocab_size", None, "DeepSpec's LM head and markov_w2 cover the whole vocabulary"),
    ("greedy_draft_vocab_size", None, "the greedy map has no DeepSpec tensor"),
)  # fmt: skip


def export_from_ours(
    drafter_dir: str | Path,
    out_dir: str | Path,
    *,
    embed_tokens: torch.Tensor,
    lm_head: torch.Tensor,
    num_anchors: int = DEFAULT_NUM_ANCHORS,
) -> Path:
    """Write our drafter (``save_drafter``'s folder) in DeepSpec's layout into ``out_dir``.

    DeepSpec stores the target's embedding and LM head (``[V, H]`` each), ours does not:
    pass the target's; they are stored at the drafter's dtype. Whatever DeepSpec cannot
    express is refused, naming the field, before anything is written.
    """
    src, out = Path(drafter_dir), Path(out_dir)
    try:
        ours = DSparkConfig.from_hf_dict(json.loads((src / CONFIG_FILE).read_text()))
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"{src / CONFIG_FILE}: {exc}") from exc
    problems = [
        f"{name}={getattr(ours, name)!r} ({want!r} needed: {why})"
        for name, want, why in _INEXPRESSIBLE
        if getattr(ours, name) != want
    ]
    if problems:
        raise CheckpointError(f"{src} cannot be written as DeepSpec's: {'; '.join(problems)}")
    # Our tensor names are DeepSpec's (ours follow SGLang's dense class, whose names are
    # DeepSpec's); checked name by name below against the shapes the config implies.
    state = _load_tensors(src)
    dtype = _one_dtype(state, src)
    for name, tensor in zip(SHARED_TENSORS, (embed_tokens, lm_head), strict=True):
        state[name] = tensor.detach().to("cpu", getattr(torch, dtype), copy=True).contiguous()
    cfg = DeepSpecConfig(**{k: getattr(ours, k) for k in _COMMON}, torch_dtype=dtype,
        num_target_layers=ours.target_num_layers, num_anchors=num_anchors,
        target_name=ours.target_name)  # fmt: skip
    _same_shapes(state, expected_tensors(cfg), f"{src} in DeepSpec's names")
    out.mkdir(parents=True, exist_ok=True)
    save_file(state, str(out / WEIGHTS_FILE), metadata={"format": "pt"})
    (out / CONFIG_FILE).write_text(json.dumps(cfg.to_hf_dict(), indent=2) + "\n")
    check_checkpoint(out)
    return out


def import_to_ours(
    folder: str | Path, out_dir: str | Path, *, target_name: str | None = None
) -> Path:
    """Write a DeepSpec drafter as our checkpoint (``load_drafter``'s format) into ``out_dir``.

    Tensors are written unchanged (same dtype, same bytes) except the target's embedding and
    LM head, which our format does not store. ``target_name`` is needed unless config.json
    has one (an exported drafter): DeepSpec does not record the target it was trained for.
    """
    folder = Path(folder)
    cfg = check_checkpoint(folder)
    name = target_name or cfg.target_name
    if not name:
        raise CheckpointError(
            f"{folder / CONFIG_FILE} names no target (DeepSpec does not record it); pass "
            "target_name= (e.g. 'Qwen/Qwen3-8B')"
        )
    state = {k: t for k, t in _load_tensors(folder).items() if k not in SHARED_TENSORS}
    return save_as_ours(cfg, state, out_dir, target_name=name, where=folder)


def save_as_ours(
    cfg: DeepSpecConfig,
    state: dict[str, torch.Tensor],
    out_dir: str | Path,
    *,
    target_name: str,
    where: Path,
    draft_vocab_size: int | None = None,
) -> Path:
    """Write ``state`` (DeepSpec's names, shared tensors dropped; with a reduced vocabulary
    its ``draft_vocab_ids`` too) as our dense checkpoint of ``cfg`` into ``out_dir``."""
    _one_dtype({k: t for k, t in state.items() if t.is_floating_point()}, where)
    inter = cfg.intermediate_size
    ours = DSparkConfig(
        **{k: getattr(cfg, k) for k in _COMMON},
        target_hidden_size=cfg.hidden_size, target_num_layers=cfg.num_target_layers,
        target_name=target_name, slot_convention="anchor_next", sliding_window=None,
        qk_norm=True, draft_vocab_size=draft_vocab_size,
        ffn_type="dense",  # the MoE fields below are unused by a dense drafter
        num_experts=1, num_experts_per_tok=1, moe_intermediate_size=inter,
        shared_expert=False, shared_expert_intermediate_size=inter,
    )  # fmt: skip
    with torch.device("meta"):
        v, h = cfg.vocab_size, cfg.hidden_size
        skeleton = DSparkDrafter(ours, nn.Embedding(v, h), nn.Linear(h, v, bias=False))
    want = {k: tuple(t.shape) for k, t in skeleton.state_dict().items()}
    _same_shapes(state, want, f"{where} in our names")
    return save_drafter(skeleton, out_dir, state=state)
