"""The drafter a training config names: build a fresh one, save and load either kind.

``Drafter`` is the union of the two drafter classes training handles: the block-parallel
DSpark / DFlash-style ``DSparkDrafter`` and the autoregressive EAGLE3-style ``ARDrafter``.
``load_init_drafter`` starts a run from a drafter folder (``run.init_from``: an imported or
exported drafter) once its config is the one this run's config describes.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
from torch import nn

from dspark_sglang.model import (
    CheckpointError,
    DSparkConfig,
    DSparkDrafter,
    TargetSpec,
    default_target_layer_ids,
    load_drafter,
    save_drafter,
)
from dspark_sglang.model.ar_drafter import (
    ARDrafter,
    ARDrafterConfig,
    load_ar_drafter,
    save_ar_drafter,
)
from dspark_sglang.model.checkpoint import CONFIG_FILE, WEIGHTS_FILE
from dspark_sglang.model.discovery import AR_CONFIG
from dspark_sglang.training.config import TrainConfig

Drafter = DSparkDrafter | ARDrafter

AR_WEIGHTS = "ar_drafter.safetensors"  # save_ar_drafter's
#: (config, weights) file names of a drafter folder, DSpark/DFlash then AR.
_DRAFTER_FILES = ((CONFIG_FILE, WEIGHTS_FILE), (AR_CONFIG, AR_WEIGHTS))
#: Config fields set outside ``drafter.model``, and where.
_SETTINGS = {
    "block_size": "drafter.block_size",
    "target_layer_ids": "target.layer_ids",
    "mask_token_id": "data.mask_token_id",
}
#: What only an MoE FFN reads: a dense drafter's folder may hold any value (an import's 1s).
_MOE_FIELDS = (
    "num_experts",
    "num_experts_per_tok",
    "moe_intermediate_size",
    "shared_expert",
    "shared_expert_intermediate_size",
)
#: Fields the target decides (``load_drafter`` refuses most of them first, by name).
_TARGET_FIELDS = ("vocab_size", "hidden_size", "target_hidden_size", "target_num_layers")


def resolve_layer_ids(cfg: TrainConfig, num_layers: int) -> tuple[int, ...]:
    """The target layers every drafter of this config reads (explicit or the default 5);
    an explicit id outside ``[0, num_layers - 2]`` is refused naming ``target.layer_ids``."""
    if cfg.target.layer_ids is not None:
        bad = [i for i in cfg.target.layer_ids if not 0 <= i < num_layers - 1]
        if bad:
            raise ValueError(
                f"target.layer_ids {list(cfg.target.layer_ids)} has {bad} outside "
                f"[0, {num_layers - 2}] for this {num_layers}-layer target (the last layer's "
                "output is the final state, never a context layer)"
            )
        return cfg.target.layer_ids
    return default_target_layer_ids(num_layers, n=5)


def drafter_config(
    cfg: TrainConfig, spec: TargetSpec, hf_config: Any, mask_token_id: int
) -> DSparkConfig | ARDrafterConfig:
    """The architecture ``cfg``'s drafter section describes for the target ``spec``."""
    layer_ids = resolve_layer_ids(cfg, spec.num_layers)
    overrides = dict(cfg.drafter.model)
    if cfg.drafter.kind == "eagle3":
        base: dict[str, Any] = {
            "hidden_size": spec.hidden_size,
            "vocab_size": spec.vocab_size,
            "target_layer_ids": layer_ids,
            "num_attention_heads": spec.num_attention_heads,
            "num_key_value_heads": spec.num_key_value_heads,
            "intermediate_size": int(getattr(hf_config, "intermediate_size", 4 * spec.hidden_size)),
            "rope_theta": spec.rope_theta,
            "rms_norm_eps": spec.rms_norm_eps,
            "block_size": cfg.drafter.block_size,
        }
        base.update(overrides)
        return ARDrafterConfig.from_dict(base)
    if cfg.drafter.kind == "dflash":
        overrides.setdefault("markov_head_type", "none")
        overrides.setdefault("enable_confidence_head", False)
        overrides.setdefault("confidence_head_with_markov", False)
    return DSparkConfig.for_target(
        spec,
        mask_token_id=mask_token_id,
        block_size=cfg.drafter.block_size,
        target_layer_ids=layer_ids,
        **overrides,
    )


def build_drafter(
    cfg: TrainConfig,
    spec: TargetSpec,
    hf_config: Any,
    embed_tokens: nn.Embedding,
    lm_head: nn.Linear,
    mask_token_id: int,
) -> Drafter:
    """A freshly initialised drafter of ``cfg.drafter.kind`` for the target ``spec``."""
    torch.manual_seed(cfg.run.seed)
    config = drafter_config(cfg, spec, hf_config, mask_token_id)
    if isinstance(config, ARDrafterConfig):
        return ARDrafter(config, embed_tokens, lm_head)
    return DSparkDrafter(config, embed_tokens, lm_head)


def save_any_drafter(
    drafter: Drafter, path: Path, state: dict[str, torch.Tensor] | None = None
) -> None:
    """Save either drafter kind; ``state`` (whole tensors) replaces its ``state_dict()``."""
    if isinstance(drafter, ARDrafter):
        save_ar_drafter(drafter, path, state)
    else:
        save_drafter(drafter, path, state=state)


def load_any_drafter(
    path: Path, kind: str, spec: TargetSpec, embed_tokens: nn.Embedding, lm_head: nn.Linear
) -> Drafter:
    if kind == "eagle3":
        return load_ar_drafter(path, embed_tokens, lm_head)
    return load_drafter(path, spec, embed_tokens, lm_head)


def is_drafter_folder(path: Path) -> bool:
    """A drafter's own folder: ``config.json`` + ``model.safetensors`` (DSpark/DFlash, as
    ``export-drafter`` and ``import-drafter`` write it) or the EAGLE3-style AR pair."""
    return any((path / c).is_file() and (path / w).is_file() for c, w in _DRAFTER_FILES)


def load_init_drafter(
    cfg: TrainConfig,
    folder: Path,
    spec: TargetSpec,
    hf_config: Any,
    embed_tokens: nn.Embedding,
    lm_head: nn.Linear,
    mask_token_id: int,
) -> Drafter:
    """The drafter in ``folder`` (``run.init_from``), refused unless it is the one this
    run's drafter section, target and mask token describe (the run's checkpoints and
    ``config.json`` must say what was trained). Its token map is kept; a greedy map (a
    shipping setting, ``export-drafter --greedy-draft-vocab-size``) is dropped."""
    where = f"run.init_from={folder}"
    want = drafter_config(cfg, spec, hf_config, mask_token_id)
    is_ar = (folder / AR_CONFIG).is_file()
    if is_ar != isinstance(want, ARDrafterConfig):
        has = "an EAGLE3-style drafter (ar_config.json)" if is_ar else "a DSpark/DFlash drafter"
        fix = "eagle3" if is_ar else "dspark (or dflash, without a Markov head)"
        raise ValueError(
            f"{where} holds {has} but drafter.kind is {cfg.drafter.kind!r}; set drafter.kind: {fix}"
        )
    drafter: Drafter
    try:
        if is_ar:
            drafter = load_ar_drafter(folder, embed_tokens, lm_head)
        else:
            drafter = load_drafter(folder, spec, embed_tokens, lm_head)
    except (ValueError, TypeError) as exc:  # each names the field or tensor and the fix
        raise CheckpointError(f"{where}: {exc}") from exc
    if isinstance(drafter, DSparkDrafter) and drafter.config.greedy_draft_vocab_size is not None:
        drafter = drafter.with_greedy_vocab(None)
    found, expected = asdict(drafter.config), asdict(want)
    unused = _MOE_FIELDS if found.get("ffn_type") == expected.get("ffn_type") == "dense" else ()
    diffs = [
        f"{k} is {_yaml(v)} there, {_yaml(expected[k])} here ({_fix(k, v, cfg)})"
        for k, v in found.items()
        if v != expected[k] and k not in unused
    ]
    if diffs:
        raise ValueError(
            f"{where} is not the drafter this run's config describes: {'; '.join(diffs)}. "
            "The config must describe the drafter it starts from: change it, or start from a "
            "drafter that matches it"
        )
    return drafter


def _fix(name: str, value: Any, cfg: TrainConfig) -> str:
    """How a run's config gets drafter field ``name`` to the folder's ``value``."""
    if name in _TARGET_FIELDS or name == "target_name":
        return "a drafter for another target: set target.name to its target"
    if name == "markov_head_type" and (value == "none") != (cfg.drafter.kind == "dflash"):
        return "set drafter.kind: " + ("dflash" if value == "none" else "dspark")
    return f"set {_SETTINGS.get(name, f'drafter.model.{name}')}: {_yaml(value)}"


def _yaml(value: Any) -> str:
    """A config value as YAML/JSON writes it (``null``, ``true``, ``[1, 3]``)."""
    return json.dumps(list(value) if isinstance(value, tuple) else value)
