"""A tiny random Llama target and prompts for the training tests.

A plain module with a unique name (not ``conftest``): with several conftest files in
the tree pytest registers only one module called ``conftest``, so importing helpers
from it breaks selective runs.

A real (random-weight) HF Llama exercises the real generate / hidden-state
code paths in seconds; only tests that need SmolLM2 itself are marked slow.
"""

from __future__ import annotations

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from dspark_sglang.training.datagen import EncodedPrompt

TINY_VOCAB = 96
TINY_LAYERS = 6
TINY_LAYER_IDS = (1, 2, 3)
PAD, EOS = 0, 2


def tiny_llama(seed: int = 0) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=TINY_VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=TINY_LAYERS,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        bos_token_id=1,
        eos_token_id=EOS,
        pad_token_id=PAD,
        rms_norm_eps=1e-6,
    )
    model = LlamaForCausalLM(cfg).eval()
    # Sharpen the random LM head so the target is far from uniform: a drafter
    # then has something learnable to match.
    with torch.no_grad():
        model.lm_head.weight.mul_(8.0)
    return model


def tiny_prompts(n: int, seed: int = 0) -> list[EncodedPrompt]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        length = int(torch.randint(4, 12, (1,), generator=g))
        ids = torch.randint(3, TINY_VOCAB, (length,), generator=g).tolist()
        out.append(
            EncodedPrompt(id=f"p{i:03d}", domain=("math", "code", "chat")[i % 3], prompt_ids=ids)
        )
    return out
