"""``plain_generate``: target-only decoding, the reference generator's baseline."""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch

from dspark_sglang.reference.request_state import prefill, validate_prompts
from dspark_sglang.reference.result import GenerationResult
from dspark_sglang.sampling import SamplingParams, logits_to_probs, sample
from dspark_sglang.targets.hf_target import HFTarget


@torch.inference_mode()
def plain_generate(
    target: HFTarget,
    prompts: Sequence[Sequence[int]],
    max_new_tokens: int,
    stop_token_ids: Sequence[int] = (),
    *,
    sampling: SamplingParams | None = None,
    seed: int = 0,
) -> GenerationResult:
    """Target-only autoregressive decoding, one token per forward, same sampling path.

    The baseline the speculative generator is compared with (speed) and must equal
    at temperature 0 (tokens).
    """
    sampling = sampling or SamplingParams()
    validate_prompts(prompts, target.spec.vocab_size, max_new_tokens)
    stops = frozenset(int(t) for t in stop_token_ids)
    gen = torch.Generator().manual_seed(seed)
    outputs: list[list[int]] = []
    forwards = 0
    t0 = time.perf_counter()
    for prompt in prompts:
        tok, cache, _ = prefill(target, prompt, (), sampling, gen)
        forwards += 1
        out = [tok]
        while tok not in stops and len(out) < max_new_tokens:
            logits, _, cache = target.forward(torch.tensor([[tok]]), cache)
            forwards += 1
            probs = logits_to_probs(
                logits[0, -1], sampling.temperature, sampling.top_k, sampling.top_p
            )
            tok = int(sample(probs, gen))
            out.append(tok)
        outputs.append(out)
    wall = time.perf_counter() - t0
    empty = torch.zeros(0, dtype=torch.int64)
    return GenerationResult(
        outputs=outputs,
        rounds=[[] for _ in prompts],
        position_reached=empty,
        position_accepted=empty,
        wall_time_s=wall,
        target_forwards=forwards,
        draft_forwards=0,
    )
