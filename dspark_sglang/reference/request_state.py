"""Per-request state of a reference-generator run and the steps plain decoding shares.

``Request`` is one request's mutable state (the invariant is the generator module's:
the cache holds positions ``0 .. anchor-1``, the kept hidden states cover the same
positions, the anchor is the last emitted token). ``validate_prompts`` checks the
prompts, ``prefill`` runs a prompt and samples its first token, ``emit_tokens``
appends tokens as plain decoding would stop.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from transformers import DynamicCache

from dspark_sglang.sampling import SamplingParams, logits_to_probs, sample
from dspark_sglang.targets.hf_target import HFTarget


@dataclass
class Request:
    """Mutable per-request state; see the invariant in ``generator.py``."""

    rid: int
    tokens: list[int]  # prompt + emitted; the last one is the anchor
    cache: DynamicCache | None
    hidden: torch.Tensor  # [K, n*H] captured hidden states of positions hidden_start..
    hidden_start: int
    output: list[int] = field(default_factory=list)
    rounds: list[tuple[int, int]] = field(default_factory=list)
    confidence: list[torch.Tensor] = field(default_factory=list)  # raw logits [B] per round
    done: bool = False

    @property
    def anchor_position(self) -> int:
        return len(self.tokens) - 1


def validate_prompts(prompts: Sequence[Sequence[int]], vocab: int, max_new_tokens: int) -> None:
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    for i, p in enumerate(prompts):
        if len(p) == 0:
            raise ValueError(f"prompts[{i}] is empty; every prompt needs at least one token")
        bad = [t for t in p if not 0 <= int(t) < vocab]
        if bad:
            raise ValueError(f"prompts[{i}] has token ids outside [0, {vocab}): {bad[:5]}")


def emit_tokens(req: Request, new: Sequence[int], max_new: int, stops: frozenset[int]) -> int:
    """Append ``new`` as plain decoding would: stop after a stop token or ``max_new``.

    Returns how many of ``new`` were kept.
    """
    kept = 0
    for tok in new:
        req.output.append(tok)
        req.tokens.append(tok)
        kept += 1
        if tok in stops or len(req.output) >= max_new:
            req.done = True
            break
    return kept


def prefill(
    target: HFTarget,
    prompt: Sequence[int],
    layer_ids: Sequence[int],
    sampling: SamplingParams,
    generator: torch.Generator,
) -> tuple[int, DynamicCache, torch.Tensor]:
    """Run the prompt, sample the first token. Returns ``(token, cache, captured [P, n*H])``."""
    ids = torch.tensor([list(prompt)], dtype=torch.long)
    logits, captured, cache = target.forward(ids, None, 0, layer_ids, logits_to_keep=1)
    probs = logits_to_probs(logits[0, -1], sampling.temperature, sampling.top_k, sampling.top_p)
    return int(sample(probs, generator)), cache, captured[0]
