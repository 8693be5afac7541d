"""vLLM speculators' DSpark drafter layout: read, check, and convert to ours.

A speculators DSpark drafter is HF ``save_pretrained`` output of ``DSparkDraftModel``
(``config.json``, ``model.safetensors``). Facts relied on, from vllm-project/speculators
(paths under ``src/speculators/`` unless noted):

* ``models/dspark/config.py``: ``speculators_model_type: "dspark"`` over the DFlash config;
  ``markov_rank`` (0 disables the head), ``markov_head_type``, ``enable_confidence_head``,
  ``confidence_head_with_markov``, ``sample_from_anchor`` (default true).
  ``models/dflash/config.py``: the draft backbone in ``transformer_layer_config`` (an HF
  config, written with ``to_diff_dict``), ``draft_vocab_size``, ``block_size``,
  ``target_hidden_size``, ``aux_hidden_state_layer_ids``, ``mask_token_id``.
  ``config.py``: ``SpeculatorModelConfig.to_dict`` writes every pydantic field, so a
  missing ``sample_from_anchor`` means a checkpoint older than the field (speculators
  commit a0be7bb6, 2026-07-13), whose slot ``j`` predicts ``anchor + j`` (the 1+N layout).
* ``models/dflash/core.py``: ``fc`` ``[H, n*H]``, ``hidden_norm``, ``layers.i.*``, ``norm``,
  ``embed_tokens`` ``[V, H]`` and ``lm_head`` ``[K, H]`` (the verifier's, frozen), buffers
  ``t2d``/``d2t`` only when ``K < V``; ``verifier_*`` are not saved. Block input is the
  anchor then mask tokens; with ``sample_from_anchor`` false the slot-0 loss is masked and
  slot ``k`` is trained on token ``p + k``; ``speculators_config.proposal_methods[0].
  speculative_tokens`` is ``block_size`` if it is true, else ``block_size - 1``.
  ``models/dflash/model_definitions.py``: Qwen3 layers with q/k norms (k_norm on the
  context keys too) whatever ``transformer_layer_config.model_type`` says.
* ``models/dspark/model_definitions.py``: ``markov_head.markov_w1`` ``[V, r]``,
  ``markov_w2`` ``[K, r]``, ``gate_proj`` / ``joint_proj`` as DeepSpec's;
  ``confidence_head.proj`` with a bias. ``models/dspark/core.py``: with
  ``sample_from_anchor`` the Markov bias of slot ``k`` reads token ``p + k`` (DeepSpec's).
* ``model.py`` and ``train/vocab_mapping.py``: ``d2t[i]`` is an offset (target id
  ``= i + d2t[i]``) over ascending ids, ``t2d`` a bool mask over the verifier vocabulary.
* ``convert/dflash/converter.py`` and ``scripts/launch_vllm.py``: an aux id ``L`` is HF
  ``hidden_states[L]`` (the input of layer ``L``), DeepSpec's and ours id ``L`` is
  ``hidden_states[L + 1]``: ours ``= aux - 1``. ``L = num_hidden_layers`` (the last
  layer's output) is appended by ``launch_vllm.py`` and never an aux id.

A 1+N checkpoint is refused: its first draft comes from a mask query at ``p + 1``, ours
and SGLang's from the anchor's query at ``p``; no weight mapping makes one the other.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from dspark_sglang.model.checkpoint import CONFIG_FILE, CheckpointError
from dspark_sglang.model.config import MAX_BLOCK_SIZE, MAX_MARKOV_RANK, MAX_VOCAB_SIZE
from dspark_sglang.model.formats.common import FLOAT_DTYPES, header, load_tensors
from dspark_sglang.model.formats.deepspec import (
    ARCHITECTURE,
    DEFAULT_NUM_ANCHORS,
    MARKOV_HEAD_TYPES,
    MODEL_TYPE,
    SHARED_TENSORS,
    DeepSpecConfig,
    save_as_ours,
)
from dspark_sglang.model.formats.deepspec import (
    expected_tensors as deepspec_tensors,
)
from dspark_sglang.model.vocab import DRAFT_VOCAB_BUFFER, check_draft_vocab_ids

__all__ = ["MODEL_TYPE_KEY", "SpeculatorsConfig", "check_checkpoint", "import_to_ours"]

#: The key and value that mark a speculators DSpark config.
MODEL_TYPE_KEY, DSPARK = "speculators_model_type", "dspark"
#: ``transformer_layer_config.model_type`` values whose layers speculators builds as Qwen3
#: DFlash layers (``scripts/train.py``'s draft architectures served by vLLM).
BACKBONE_TYPES: tuple[str, ...] = ("qwen3", "llama")
VOCAB_MAPS: tuple[str, ...] = ("t2d", "d2t")
_NEED = ("block_size", "aux_hidden_state_layer_ids", "draft_vocab_size", "markov_rank")
_BACKBONE_NEED = ("vocab_size", "hidden_size")
_FIX_ANCHOR = (
    "if you know it was trained anchor-first (slot k predicts anchor+k+1), say so with "
    "sample_from_anchor=True (--sample-from-anchor true); else retrain anchor-first"
)


def _field(name: str, why: str) -> ValueError:
    return ValueError(f"speculators config.json {name}: {why}")


def _int(name: str, value: object, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise _field(name, f"{value!r} must be an int in [{lo}, {hi}]; fix it")
    return value


def _bool(name: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise _field(name, f"{value!r} must be true or false")
    return value


def _speculative_tokens(raw: Mapping[str, Any]) -> int | None:
    """``speculators_config.proposal_methods[0].speculative_tokens`` (None when absent)."""
    spec = raw.get("speculators_config")
    methods = spec.get("proposal_methods") if isinstance(spec, Mapping) else None
    first = methods[0] if isinstance(methods, list) and methods else None
    value = first.get("speculative_tokens") if isinstance(first, Mapping) else None
    return _int("speculative_tokens", value, 1, MAX_BLOCK_SIZE) if value is not None else None


@dataclasses.dataclass(frozen=True, kw_only=True)
class SpeculatorsConfig:
    """The fields of a speculators DSpark ``config.json`` an import depends on, checked one
    by one; ``backbone`` is ``transformer_layer_config`` as written."""

    backbone: Mapping[str, Any]
    block_size: int
    aux_hidden_state_layer_ids: tuple[int, ...]
    mask_token_id: int
    draft_vocab_size: int
    sample_from_anchor: bool
    markov_rank: int
    markov_head_type: str
    enable_confidence_head: bool
    confidence_head_with_markov: bool
    speculative_tokens: int | None = None
    verifier: str | None = None

    @property
    def vocab_size(self) -> int:
        return int(self.backbone["vocab_size"])

    @property
    def hidden_size(self) -> int:
        return int(self.backbone["hidden_size"])

    @property
    def reduced(self) -> bool:
        """Whether the drafter proposes over a subset of the vocabulary (``t2d``/``d2t``)."""
        return self.draft_vocab_size != self.vocab_size

    @property
    def target_layer_ids(self) -> tuple[int, ...]:
        """DeepSpec's (and our) layer ids: layer ``L``'s output is aux id ``L + 1``."""
        return tuple(a - 1 for a in self.aux_hidden_state_layer_ids)

    @classmethod
    def from_hf_dict(
        cls, raw: Mapping[str, Any], *, sample_from_anchor: bool | None = None
    ) -> SpeculatorsConfig:
        """Parse and check a speculators DSpark ``config.json``.

        ``sample_from_anchor``: the slot layout when ``config.json`` has no such field
        (checkpoints older than the field); it is never guessed, and a value that
        contradicts the file or its ``speculative_tokens`` is refused.
        """
        if not isinstance(raw, Mapping):
            raise ValueError(f"config.json must be a JSON object, got {type(raw).__name__}")
        kind = raw.get(MODEL_TYPE_KEY)
        if kind != DSPARK:
            raise _field(
                MODEL_TYPE_KEY,
                f"{kind!r} is not 'dspark' (only speculators' DSpark "
                "drafters, with a Markov and a confidence head, are imported)",
            )
        backbone = raw.get("transformer_layer_config")
        if not isinstance(backbone, Mapping):
            raise _field("transformer_layer_config", f"{backbone!r} must be an object")
        if backbone.get("model_type") not in BACKBONE_TYPES:
            raise _field(
                "transformer_layer_config.model_type",
                f"{backbone.get('model_type')!r}"
                f" is not one of {BACKBONE_TYPES} (speculators' draft layers)",
            )
        missing = [f"transformer_layer_config.{k}" for k in _BACKBONE_NEED if k not in backbone]
        missing += [k for k in _NEED if k not in raw]
        if missing:
            raise _field("missing fields", f"{missing}; speculators writes them, add them")
        block = _int("block_size", raw["block_size"], 1, MAX_BLOCK_SIZE)
        layout = cls._slot_layout(raw, sample_from_anchor)
        vocab = _int(
            "transformer_layer_config.vocab_size", backbone["vocab_size"], 2, MAX_VOCAB_SIZE
        )
        hidden = backbone.get("hidden_size")
        if raw.get("target_hidden_size") not in (None, hidden):
            raise _field(
                "target_hidden_size",
                f"{raw['target_hidden_size']} differs from "
                f"transformer_layer_config.hidden_size={hidden}; the drafter must "
                "run at the target's width (its embedding and LM head)",
            )
        ids = raw["aux_hidden_state_layer_ids"]
        if not isinstance(ids, list) or not ids:
            raise _field("aux_hidden_state_layer_ids", f"{ids!r} must be a non-empty list")
        for i, aux in enumerate(ids):
            if isinstance(aux, int) and aux == 0:
                raise _field(
                    f"aux_hidden_state_layer_ids[{i}]",
                    "0 is the embedding output (DeepSpec id -1), which SGLang never captures",
                )
            _int(f"aux_hidden_state_layer_ids[{i}]", aux, 1, 1 << 20)
        if ids != sorted(set(ids)):
            raise _field(
                "aux_hidden_state_layer_ids",
                f"{ids} must be strictly increasing (the fc input concatenates them in order)",
            )
        if raw.get("mask_token_id") is None:
            raise _field(
                "mask_token_id",
                "null (trained without --mask-token-id); the block's "
                "mask token cannot be guessed: set it to the id used in training",
            )
        head = raw.get("markov_head_type", "vanilla")
        if head not in MARKOV_HEAD_TYPES:
            raise _field("markov_head_type", f"{head!r} is not one of {MARKOV_HEAD_TYPES}")
        if raw["markov_rank"] == 0:
            raise _field(
                "markov_rank",
                "0 (no Markov head: a DFlash drafter); the import "
                "needs DSpark's Markov head, as SGLang's DSpark does",
            )
        return cls(
            backbone=dict(backbone),
            block_size=block,
            aux_hidden_state_layer_ids=tuple(ids),
            mask_token_id=_int("mask_token_id", raw["mask_token_id"], 0, vocab - 1),
            draft_vocab_size=_int("draft_vocab_size", raw["draft_vocab_size"], 1, vocab),
            sample_from_anchor=layout,
            markov_rank=_int("markov_rank", raw["markov_rank"], 1, MAX_MARKOV_RANK),
            markov_head_type=head,
            enable_confidence_head=_bool(
                "enable_confidence_head", raw.get("enable_confidence_head", True)
            ),
            confidence_head_with_markov=_bool(
                "confidence_head_with_markov", raw.get("confidence_head_with_markov", True)
            ),
            speculative_tokens=_speculative_tokens(raw),
            verifier=_verifier_name(raw),
        )

    @staticmethod
    def _slot_layout(raw: Mapping[str, Any], given: bool | None) -> bool:
        """``sample_from_anchor``: from the file or ``given``, never guessed; 1+N refused."""
        stored = raw.get("sample_from_anchor")
        if stored is not None:
            _bool("sample_from_anchor", stored)
        if given is not None and stored is not None and given != stored:
            raise _field("sample_from_anchor", f"{stored} in the file but {given} was passed")
        value = stored if stored is not None else given
        block, tokens = raw.get("block_size"), _speculative_tokens(raw)
        hint = "" if tokens is None else f" (its speculative_tokens={tokens}, block_size={block})"
        if value is None:
            raise _field(
                "sample_from_anchor",
                "missing: speculators writes it since 2026-07-13 (commit a0be7bb6); an older "
                f"DSpark checkpoint is 1+N (slot j predicts anchor+j){hint}; {_FIX_ANCHOR}",
            )
        if not value:
            raise _field(
                "sample_from_anchor",
                "false: a 1+N checkpoint (slot j predicts "
                "anchor+j, slot 0 untrained). Ours and SGLang's read slot k as "
                "anchor+k+1, so every draft would be one slot off, and no weight "
                "mapping converts it (its first draft comes from a mask query at "
                "p+1, ours from the anchor's query at p); retrain anchor-first",
            )
        if tokens is not None and tokens != block:
            raise _field(
                "sample_from_anchor",
                f"true, but speculative_tokens={tokens} != "
                f"block_size={block}, which a 1+N checkpoint writes; {_FIX_ANCHOR}",
            )
        return True

    def to_deepspec(self, num_target_layers: int) -> DeepSpecConfig:
        """The same drafter as a DeepSpec config (every backbone field checked there)."""
        last = num_target_layers - 1
        for i, aux in enumerate(self.aux_hidden_state_layer_ids):
            if aux >= last + 1:
                raise _field(
                    f"aux_hidden_state_layer_ids[{i}]",
                    f"{aux} but the target has "
                    f"{num_target_layers} layers: aux id {num_target_layers} is the "
                    "last layer's output, which SGLang never captures (DeepSpec id "
                    f"{aux - 1}); aux ids must lie in [1, {last}]",
                )
        raw = dict(self.backbone) | {
            "architectures": [ARCHITECTURE], "model_type": MODEL_TYPE,
            "tie_word_embeddings": False,  # the draft's LM head is its own tensor
            "num_target_layers": num_target_layers, "num_anchors": DEFAULT_NUM_ANCHORS,
            "block_size": self.block_size,
            "target_layer_ids": list(self.target_layer_ids), "mask_token_id": self.mask_token_id,
            "markov_rank": self.markov_rank, "markov_head_type": self.markov_head_type,
            "enable_confidence_head": self.enable_confidence_head,
            "confidence_head_with_markov": self.confidence_head_with_markov,
            "sample_from_anchor": self.sample_from_anchor, "target_name": self.verifier,
        }  # fmt: skip
        try:
            return DeepSpecConfig.from_hf_dict(raw)
        except ValueError as exc:
            raise _field("transformer_layer_config", f"{exc}") from exc


def _verifier_name(raw: Mapping[str, Any]) -> str | None:
    spec = raw.get("speculators_config")
    verifier = spec.get("verifier") if isinstance(spec, Mapping) else None
    name = verifier.get("name_or_path") if isinstance(verifier, Mapping) else None
    return name if isinstance(name, str) and name else None


def expected_tensors(cfg: SpeculatorsConfig, deep: DeepSpecConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor ``DSparkDraftModel.save_pretrained`` writes, with its shape: DeepSpec's
    names, the LM head and ``markov_w2`` over the draft vocabulary, the maps when reduced."""
    k, h, r = cfg.draft_vocab_size, cfg.hidden_size, cfg.markov_rank
    out = deepspec_tensors(deep) | {
        "lm_head.weight": (k, h),
        "markov_head.markov_w2.weight": (k, r),
    }
    return out | ({"t2d": (cfg.vocab_size,), "d2t": (k,)} if cfg.reduced else {})


# --------------------------------------------------------------------------- files


def _read(folder: Path, sample_from_anchor: bool | None) -> SpeculatorsConfig:
    try:
        raw = json.loads((folder / CONFIG_FILE).read_text())
        return SpeculatorsConfig.from_hf_dict(raw, sample_from_anchor=sample_from_anchor)
    except (OSError, ValueError) as exc:  # JSONDecodeError is a ValueError
        raise CheckpointError(f"{folder / CONFIG_FILE}: {exc}") from exc


def _target_fields(target: Mapping[str, Any]) -> dict[str, int]:
    t = target["text_config"] if isinstance(target.get("text_config"), Mapping) else target
    keys = ("hidden_size", "vocab_size", "num_hidden_layers")
    if any(type(t.get(k)) is not int for k in keys):
        raise CheckpointError(f"the target config lacks one of {list(keys)}")
    return {k: t[k] for k in keys}


def check_checkpoint(
    folder: str | Path,
    target_hf_config: Mapping[str, Any],
    *,
    sample_from_anchor: bool | None = None,
) -> tuple[SpeculatorsConfig, DeepSpecConfig]:
    """Refuse a speculators DSpark folder we would misread, from ``config.json`` and the
    safetensors header only (no tensor data). The target's ``config.json`` is needed:
    speculators does not record the verifier's depth. Every refusal names the field or
    tensor. Returns the config and its DeepSpec form."""
    folder = Path(folder)
    cfg = _read(folder, sample_from_anchor)
    target = _target_fields(target_hf_config)
    for ours, theirs in (("hidden_size", "hidden_size"), ("vocab_size", "vocab_size")):
        if getattr(cfg, ours) != target[theirs]:
            raise CheckpointError(
                f"{folder}: transformer_layer_config.{ours}={getattr(cfg, ours)} but the "
                f"target's {theirs} is {target[theirs]}; use a drafter trained for this target"
            )
    try:
        deep = cfg.to_deepspec(target["num_hidden_layers"])
    except ValueError as exc:
        raise CheckpointError(f"{folder / CONFIG_FILE}: {exc}") from exc
    stored, want = header(folder), expected_tensors(cfg, deep)
    optional = set(SHARED_TENSORS)  # the verifier's own, frozen: we do not store them
    missing = sorted(set(want) - set(stored) - optional)
    unexpected = sorted(set(stored) - set(want))
    if missing or unexpected:
        raise CheckpointError(
            f"{folder}: tensors missing {missing}, unexpected {unexpected} against config.json"
        )
    codes = {"t2d": ("BOOL",), "d2t": ("I64",)}
    for name, (code, shape) in sorted(stored.items()):
        if code not in codes.get(name, FLOAT_DTYPES):
            raise CheckpointError(
                f"{folder}: tensor {name!r} has dtype {code}, not {codes.get(name, 'a float')}"
            )
        if shape != want[name]:
            hint = " ([hidden_size, len(aux_hidden_state_layer_ids) * hidden_size])" * (
                name == "fc.weight"
            )
            raise CheckpointError(
                f"{folder}: tensor {name!r} has shape {shape}, config.json implies "
                f"{want[name]}{hint}; the weights and config.json disagree"
            )
    return cfg, deep


def draft_vocab_ids(cfg: SpeculatorsConfig, t2d: torch.Tensor, d2t: torch.Tensor) -> torch.Tensor:
    """Our token map (ascending target ids) from speculators' ``d2t`` offsets, checked
    against its ``t2d`` mask: both must name the same ``draft_vocab_size`` tokens."""
    ids = torch.arange(cfg.draft_vocab_size, dtype=torch.int64) + d2t.to(torch.int64)
    check_draft_vocab_ids(ids, cfg.vocab_size, cfg.draft_vocab_size, tensor_name="d2t")
    if not torch.equal(t2d.nonzero().flatten(), ids):
        raise ValueError(
            "t2d and d2t name different tokens (d2t holds offsets: target id = i + d2t[i]); "
            "the vocabulary maps are corrupt, rebuild them with build_vocab_mapping"
        )
    return ids


def import_to_ours(
    folder: str | Path,
    out_dir: str | Path,
    *,
    target_hf_config: Mapping[str, Any],
    target_name: str,
    sample_from_anchor: bool | None = None,
) -> Path:
    """Write a speculators DSpark drafter as our checkpoint into ``out_dir``.

    Checked first (:func:`check_checkpoint`); layer ids shifted to ours; a reduced
    vocabulary becomes our token map (``markov_w2`` keeps its ``K`` rows); the verifier's
    ``embed_tokens``/``lm_head`` are dropped (ours shares the target's). Every other
    tensor is written unchanged (same dtype and bytes).
    """
    folder = Path(folder)
    cfg, deep = check_checkpoint(folder, target_hf_config, sample_from_anchor=sample_from_anchor)
    state = {k: t for k, t in load_tensors(folder).items() if k not in SHARED_TENSORS}
    vocab_size = None
    if cfg.reduced:
        try:
            state[DRAFT_VOCAB_BUFFER] = draft_vocab_ids(cfg, state.pop("t2d"), state.pop("d2t"))
        except ValueError as exc:
            raise CheckpointError(f"{folder}: {exc}") from exc
        vocab_size = cfg.draft_vocab_size
    return save_as_ours(
        deep, state, out_dir, target_name=target_name, where=folder, draft_vocab_size=vocab_size
    )
