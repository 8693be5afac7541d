"""Tiny random targets shaped like real families, built with their real config classes.

Both reuse SmolLM2's tokenizer files (a real 49152-token BPE vocabulary) and differ where
a family-specific assumption could hide:

* ``qwen3``: ``Qwen3Config`` / ``Qwen3ForCausalLM``, tied embeddings (as Qwen3-0.6B..4B),
  ``head_dim`` stated (32, so ``heads * head_dim != hidden_size``), q/k norms, ChatML.
* ``llama3``: ``LlamaConfig`` / ``LlamaForCausalLM``, an untied LM head (as Llama-3-8B),
  ``rope_theta`` 500000, grouped-query attention and Llama-3's chat template
  (``<|start_header_id|>`` ... ``<|eot_id|>``, spelled out as text: SmolLM2's vocabulary
  has no such special tokens, and the tokenizer has no mask token to detect).

Seed and ``initializer_range`` 0.1 give peaked logits, so greedy decoding is far from
fp32 ties (the Qwen3 engine test measures the gap).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch

TOKENIZER_FILES: tuple[str, ...] = (
    "tokenizer.json",
    "tokenizer_config.json",
    "chat_template.jinja",
)
TARGET_SEED = 1
TARGET_INIT_RANGE = 0.1
LLAMA3_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m['role'] }}"
    "<|end_header_id|>\n\n{{ m['content'] }}<|eot_id|>{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)


def save_tiny_target(kind: str, folder: Path, tokenizer_src: Path) -> Path:
    """Write a tiny random ``kind`` (``qwen3`` | ``llama3``) causal LM into ``folder``."""
    from transformers import (
        AutoConfig,
        AutoTokenizer,
        LlamaConfig,
        LlamaForCausalLM,
        Qwen3Config,
        Qwen3ForCausalLM,
    )

    tok = AutoTokenizer.from_pretrained(tokenizer_src)
    smol = AutoConfig.from_pretrained(tokenizer_src)
    common = {
        "vocab_size": smol.vocab_size,
        "hidden_size": 64,
        "num_hidden_layers": 6,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "intermediate_size": 128,
        "max_position_embeddings": 2048,
        "initializer_range": TARGET_INIT_RANGE,
        "bos_token_id": tok.bos_token_id,
        "eos_token_id": tok.eos_token_id,
    }
    if kind == "qwen3":
        config = Qwen3Config(**common, head_dim=32, tie_word_embeddings=True)
        model_cls = Qwen3ForCausalLM
    elif kind == "llama3":
        rope = {"rope_type": "default", "rope_theta": 500000.0}
        config = LlamaConfig(**common, tie_word_embeddings=False, rope_parameters=rope)
        model_cls = LlamaForCausalLM
    else:
        raise ValueError(f"unknown tiny target kind {kind!r}")
    torch.manual_seed(TARGET_SEED)
    model = model_cls(config).to(torch.float32).eval()
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder, safe_serialization=True)
    for name in TOKENIZER_FILES:
        shutil.copy(tokenizer_src / name, folder / name)
    if kind == "llama3":
        (folder / "chat_template.jinja").write_text(LLAMA3_TEMPLATE)
        cfg = json.loads((folder / "tokenizer_config.json").read_text())
        cfg.pop("chat_template", None)
        cfg.pop("mask_token", None)
        (folder / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2))
    saved = AutoConfig.from_pretrained(folder)
    assert saved.model_type == {"qwen3": "qwen3", "llama3": "llama"}[kind]
    return folder
