"""vLLM speculators' DSpark drafter layout spelled out for tests, independent of our importer.

``config.json`` as ``SpeculatorModelConfig.to_dict`` writes it for ``DSparkSpeculatorConfig``
(every pydantic field; ``transformer_layer_config`` through transformers' ``to_diff_dict``;
``speculative_tokens`` from ``DFlashDraftModel._build_base_config_kwargs``); tensors as
``DSparkDraftModel.save_pretrained`` writes them: DeepSpec's names, ``lm_head`` and
``markov_w2`` over the draft vocabulary, ``t2d`` (bool mask over the verifier vocabulary)
and ``d2t`` (offsets: target id = i + d2t[i]) only when the vocabulary is reduced
(vllm-project/speculators ``src/speculators/{config.py,model.py}``,
``models/dflash/{config,core}.py``, ``models/dspark/``, ``train/vocab_mapping.py``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from deepspec_layout import deepspec_shapes
from safetensors.torch import save_file

__all__ = [
    "from_drafter",
    "save_speculators",
    "speculators_config",
    "speculators_shapes",
    "vocab_maps",
]


def speculators_config(
    backbone: dict[str, Any],
    *,
    block_size: int,
    aux_hidden_state_layer_ids: list[int],
    mask_token_id: int | None,
    draft_vocab_size: int,
    markov_rank: int,
    markov_head_type: str = "vanilla",
    confidence_head_with_markov: bool = True,
    sample_from_anchor: bool | None = True,
    verifier: str = "tiny-qwen3",
) -> dict[str, Any]:
    """A DSpark speculator's ``config.json``; ``sample_from_anchor=None`` writes a file from
    before the field existed (its DSpark was 1+N: ``speculative_tokens = block_size - 1``)."""
    anchor_first = bool(sample_from_anchor)
    cfg: dict[str, Any] = {
        "architectures": ["DSparkSpeculator"], "transformers_version": "5.19.0",
        "speculators_model_type": "dspark", "speculators_version": "0.6.0",
        "speculators_config": {
            "algorithm": "dspark", "default_proposal_method": "greedy",
            "proposal_methods": [{
                "proposal_type": "greedy", "verifier_accept_k": 1, "accept_tolerance": 0.0,
                "speculative_tokens": block_size if anchor_first else block_size - 1,
            }],
            "verifier": {"name_or_path": verifier, "architectures": ["Qwen3ForCausalLM"]},
        },
        "transformer_layer_config": backbone, "draft_vocab_size": draft_vocab_size,
        "block_size": block_size, "target_hidden_size": None,
        "aux_hidden_state_layer_ids": list(aux_hidden_state_layer_ids),
        "mask_token_id": mask_token_id, "sliding_window_non_causal": False,
        "markov_rank": markov_rank, "markov_head_type": markov_head_type,
        "enable_confidence_head": True, "confidence_head_with_markov": confidence_head_with_markov,
    }  # fmt: skip
    if sample_from_anchor is not None:
        cfg["sample_from_anchor"] = sample_from_anchor
    return cfg


def speculators_shapes(cfg: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    """The tensors ``DSparkDraftModel.save_pretrained`` writes, with their shapes."""
    b = cfg["transformer_layer_config"]
    v, k, h, r = b["vocab_size"], cfg["draft_vocab_size"], b["hidden_size"], cfg["markov_rank"]
    flat = dict(b) | {k2: cfg[k2] for k2 in ("markov_rank", "markov_head_type",
                                             "confidence_head_with_markov")}  # fmt: skip
    flat["target_layer_ids"] = cfg["aux_hidden_state_layer_ids"]  # only its length matters
    shapes = deepspec_shapes(flat) | {
        "lm_head.weight": (k, h),
        "markov_head.markov_w2.weight": (k, r),
    }
    return shapes | ({"t2d": (v,), "d2t": (k,)} if k != v else {})


def vocab_maps(ids: torch.Tensor, vocab_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(t2d, d2t)`` for the ascending target ids ``ids`` (``build_vocab_mappings_...``)."""
    t2d = torch.zeros(vocab_size, dtype=torch.bool)
    t2d[ids] = True
    return t2d, ids.long() - torch.arange(ids.numel(), dtype=torch.long)


def save_speculators(folder: Path, cfg: dict[str, Any], tensors: dict[str, torch.Tensor]) -> Path:
    """``config.json`` + ``model.safetensors`` as ``save_pretrained`` writes them."""
    folder.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    (folder / "config.json").write_text(json.dumps(cfg, indent=2))
    return folder


def from_drafter(drafter: Any, **overrides: Any) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """``(config.json, tensors)`` of one of our dense drafters as ``DSparkDraftModel.
    save_pretrained`` would write the same weights: layer ids as HF ``hidden_states``
    indices (ours + 1), the target's embedding and LM head (its rows at the token map when
    reduced), ``t2d``/``d2t`` instead of our ``draft_vocab_ids``. ``overrides``: config."""
    from transformers import Qwen3Config

    c = drafter.config
    backbone = Qwen3Config(
        vocab_size=c.vocab_size, hidden_size=c.hidden_size,
        intermediate_size=c.intermediate_size, num_hidden_layers=c.num_hidden_layers,
        num_attention_heads=c.num_attention_heads, num_key_value_heads=c.num_key_value_heads,
        head_dim=c.head_dim, max_position_embeddings=c.max_position_embeddings,
        rms_norm_eps=c.rms_norm_eps, tie_word_embeddings=False,
    ).to_diff_dict()  # fmt: skip
    vocab = drafter.draft_vocab
    fields = {
        "block_size": c.block_size, "mask_token_id": c.mask_token_id,
        "aux_hidden_state_layer_ids": [i + 1 for i in c.target_layer_ids],
        "draft_vocab_size": c.vocab_size if vocab is None else vocab.size,
        "markov_rank": c.markov_rank, "markov_head_type": c.markov_head_type,
        "confidence_head_with_markov": c.confidence_head_with_markov,
    } | overrides  # fmt: skip
    state = {k: t.detach().clone() for k, t in drafter.state_dict().items()}
    head = drafter.lm_head.weight.detach()
    state["embed_tokens.weight"] = drafter.embed_tokens.weight.detach().clone()
    state["lm_head.weight"] = head.clone()
    if vocab is not None:
        del state["draft_vocab_ids"]
        state["lm_head.weight"] = head[vocab.ids].clone()
        state["t2d"], state["d2t"] = vocab_maps(vocab.ids, c.vocab_size)
    return speculators_config(backbone, **fields), state
