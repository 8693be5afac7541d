"""HF transformers greedy decoding: the reference SGLang's greedy output must equal."""

from __future__ import annotations

from pathlib import Path

import torch


def hf_greedy(model_path: Path, prompts: list[list[int]], n: int) -> list[list[int]]:
    """HF transformers greedy continuation (KV cache, no early stop), fp32."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
    outs: list[list[int]] = []
    with torch.inference_mode():
        for ids in prompts:
            x = torch.tensor([ids])
            out = model(input_ids=x, use_cache=True)
            past, toks = out.past_key_values, []
            for _ in range(n):
                nxt = int(out.logits[0, -1].argmax())
                toks.append(nxt)
                out = model(input_ids=torch.tensor([[nxt]]), past_key_values=past, use_cache=True)
                past = out.past_key_values
            outs.append(toks)
    return outs
