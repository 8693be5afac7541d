"""DeepSpec's drafter layout spelled out for tests, independent of our exporter.

Tensor names and shapes as DeepSpec's ``Qwen3DSparkModel`` state dict holds them and its
``save_pretrained`` writes them (deepseek-ai/DeepSpec ``deepspec/modeling/dspark/qwen3/
modeling.py``, ``markov_head.py``, ``common.py``); ``config.json`` as
``deepspec/modeling/dspark/qwen3/config.py`` builds it. Tests that need a DeepSpec
checkpoint write it through here, so a bug in ``model/formats/deepspec.py`` cannot hide
behind the same bug in the fixture.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

__all__ = [
    "deepspec_draft_config",
    "deepspec_shapes",
    "save_deepspec",
    "seeded_dense_drafter",
    "write_deepspec_like",
]


def deepspec_shapes(cfg: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    """The tensors DeepSpec's ``Qwen3DSparkModel`` state dict holds, spelled out here."""
    h, v, r, d = cfg["hidden_size"], cfg["vocab_size"], cfg["markov_rank"], cfg["head_dim"]
    q, kv, i = (
        cfg["num_attention_heads"] * d,
        cfg["num_key_value_heads"] * d,
        cfg["intermediate_size"],
    )
    shapes = {"embed_tokens.weight": (v, h), "norm.weight": (h,), "lm_head.weight": (v, h),
              "fc.weight": (h, len(cfg["target_layer_ids"]) * h), "hidden_norm.weight": (h,),
              "markov_head.markov_w1.weight": (v, r), "markov_head.markov_w2.weight": (v, r),
              "confidence_head.proj.bias": (1,)}  # fmt: skip
    for n in range(cfg["num_hidden_layers"]):
        p = f"layers.{n}."
        shapes |= {
            p + "input_layernorm.weight": (h,), p + "post_attention_layernorm.weight": (h,),
            p + "self_attn.q_proj.weight": (q, h), p + "self_attn.k_proj.weight": (kv, h),
            p + "self_attn.v_proj.weight": (kv, h), p + "self_attn.o_proj.weight": (h, q),
            p + "self_attn.q_norm.weight": (d,), p + "self_attn.k_norm.weight": (d,),
            p + "mlp.gate_proj.weight": (i, h), p + "mlp.up_proj.weight": (i, h),
            p + "mlp.down_proj.weight": (h, i),
        }  # fmt: skip
    if cfg["markov_head_type"] == "gated":
        shapes |= {"markov_head.gate_proj.weight": (r, h + r), "markov_head.gate_proj.bias": (r,)}
    if cfg["markov_head_type"] == "rnn":
        shapes |= {"markov_head.joint_proj.weight": (3 * r, 2 * r + h),
                   "markov_head.joint_proj.bias": (3 * r,)}  # fmt: skip
    shapes["confidence_head.proj.weight"] = (1, h + r * cfg["confidence_head_with_markov"])
    return shapes


def deepspec_draft_config(
    target: dict[str, Any],
    *,
    num_hidden_layers: int,
    block_size: int,
    target_layer_ids: list[int],
    mask_token_id: int,
    markov_rank: int,
    markov_head_type: str = "vanilla",
    confidence_head_with_markov: bool = True,
    dtype: str = "float32",
) -> dict[str, Any]:
    """DeepSpec's ``build_draft_config`` over a Qwen3 copy of the target's ``config.json``:
    every target key kept, then the draft fields set on top (``model_type`` is qwen3:
    DeepSpec's Qwen3 drafter deep-copies a Qwen3 target's config)."""
    return dict(target) | {
        "architectures": ["Qwen3DSparkModel"], "model_type": "qwen3",
        "num_target_layers": target["num_hidden_layers"], "num_hidden_layers": num_hidden_layers,
        "block_size": block_size, "tie_word_embeddings": False,
        "layer_types": ["full_attention"] * num_hidden_layers, "mask_token_id": mask_token_id,
        "target_layer_ids": list(target_layer_ids), "num_anchors": 512,
        "enable_confidence_head": True, "confidence_head_with_markov": confidence_head_with_markov,
        "markov_rank": markov_rank, "markov_head_type": markov_head_type, "dtype": dtype,
    }  # fmt: skip


def save_deepspec(folder: Path, cfg: dict[str, Any], tensors: dict[str, torch.Tensor]) -> Path:
    """``config.json`` + ``model.safetensors`` as ``save_pretrained`` writes them."""
    folder.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    (folder / "config.json").write_text(json.dumps(cfg, indent=2))
    return folder


def seeded_dense_drafter(target: Any, block_size: int) -> Any:
    """A seeded dense DSpark drafter for ``target`` (an ``HFTarget``), residual branches
    scaled down 100x so slot 0 mostly proposes "the anchor again", its confidence head
    leaning confident (bias 3) so ``prefix`` verifies drafts (no trained dense drafter exists;
    the embedded one is MoE, which DeepSpec cannot express)."""
    from dspark_sglang.model import DSparkConfig, DSparkDrafter

    config = DSparkConfig.for_target(
        target.spec,
        mask_token_id=target.default_mask_token_id(),
        ffn_type="dense",
        sliding_window=None,
        qk_norm=True,
        num_hidden_layers=1,
        block_size=block_size,
        markov_rank=32,
        markov_head_type="vanilla",
    )
    torch.manual_seed(0)
    model = DSparkDrafter(config, target.embed_tokens, target.lm_head).eval()
    with torch.no_grad():
        for layer in model.layers:
            layer.self_attn.o_proj.weight.mul_(0.01)
            layer.mlp.down_proj.weight.mul_(0.01)
        model.confidence_head.proj.weight.mul_(0.01)
        model.confidence_head.proj.bias.fill_(3.0)
    return model


def write_deepspec_like(drafter: Any, target: Any, target_config: Path, folder: Path) -> Path:
    """``drafter``'s weights in DeepSpec's layout as spelled out here (the target's
    ``config.json`` under ``build_draft_config``, then its embedding and LM head)."""
    c = drafter.config
    cfg = deepspec_draft_config(
        json.loads(target_config.read_text()),
        num_hidden_layers=c.num_hidden_layers,
        block_size=c.block_size,
        target_layer_ids=list(c.target_layer_ids),
        mask_token_id=c.mask_token_id,
        markov_rank=c.markov_rank,
        markov_head_type=c.markov_head_type,
        confidence_head_with_markov=c.confidence_head_with_markov,
    )
    state = drafter.state_dict()
    shared = {"embed_tokens.weight": target.embed_tokens.weight,
              "lm_head.weight": target.lm_head.weight}  # fmt: skip
    tensors = {
        name: (shared[name] if name in shared else state[name]).detach().clone().contiguous()
        for name in deepspec_shapes(cfg)
    }
    assert {k: tuple(t.shape) for k, t in tensors.items()} == deepspec_shapes(cfg)
    return save_deepspec(folder, cfg, tensors)
