"""A reduced-map drafter's draft step, taken in the map's ``K`` columns.

SGLang's draft loop (``dspark_draft.draft_markov_block``) calls ``_draft_step`` once per
draft position. Per row the step is::

    value = round_to_step_dtype(base + bias)                  over the target's V columns
    token = lowest index among the maxima of value            (argmax draft, no logits kept)
    token ~ softmax(value / T), by Gumbel-max; logits_out = value   (sampled draft)

A drafter with a reduced map of ``K`` ascending ids (``moe_draft_model.DraftVocabBias``: a
reduced ``draft_vocab_size`` or, under the argmax draft, its greedy map) has ``base =
OFF_MAP_LOGIT`` and ``bias = 0`` outside the map, so an unmapped column can never win the
argmax and has probability 0 (``exp(-1e30 / T)`` is 0 in float32). SGLang's step still
spends its work on all ``V`` columns: scattering the bias, copying, rounding, drawing noise
for, masking and reducing ``V`` values, seven times a round. This step works in the ``K``
mapped columns::

    value_K = round_to_step_dtype(base[:, ids] + bias_K)
    argmax draft:  token = ids[lowest index among the maxima of value_K]
    sampled draft: token = ids[argmax(value_K / T - log E)], E ~ Exp(1) iid;
                   logits_out = base (off the map), value_K at ids

Invariants. Argmax: the same token as SGLang's, bit for bit: the mapped columns' values are
the same numbers in the same dtype; the map is strictly ascending (checked at load), so the
lowest ``j`` among the maxima is the lowest target id among them; a row with NaNs takes its
first NaN, as in SGLang's reference. Sampled: ``logits_out`` equals SGLang's bit for bit (an
unmapped column of SGLang's is ``base + 0``), and the token is drawn from
``softmax(logits_out / T)``, the law SGLang's step draws from and verification checks the
draft against, so the output stays lossless. The noise comes from the process's torch
generator for the draft-noise key (``cpu_draft_noise``), so the draws are not SGLang's own;
rows at temperature 0 take the argmax as above. CPU engines only: on a GPU SGLang's fused
kernel keeps the sampled step.

It is an AROUND hook of SGLang's ``HookRegistry`` on ``_draft_step``: every other call
(heads without a map, sharded heads, sampled steps on a GPU) runs SGLang's step unchanged.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from dspark_sglang.sglang_integration.cpu_draft_noise import generator_for, random_words

#: SGLang's per-position draft step, wrapped by :func:`step_in_map`.
DRAFT_STEP = "sglang.srt.speculative.dspark_components.dspark_draft._draft_step"


def applies(markov_head: Any, logits_out: torch.Tensor | None) -> bool:
    """An argmax step (no step logits kept) of an unsharded head with a reduced map."""
    return logits_out is None and _has_map(markov_head)


def applies_sampled(
    markov_head: Any, base_logits: torch.Tensor, logits_out: torch.Tensor | None
) -> bool:
    """A sampled step (step logits kept) of an unsharded head with a reduced map, on CPU."""
    return (
        logits_out is not None
        and _has_map(markov_head)
        and not base_logits.is_cuda
        and tuple(logits_out.shape) == tuple(base_logits.shape)
    )


def _has_map(markov_head: Any) -> bool:
    from dspark_sglang.sglang_integration.moe_draft_model import DraftVocabBias

    return (
        isinstance(markov_head, DraftVocabBias)
        and getattr(markov_head, "vocab_shard", None) is None
    )


def _first_max(value: torch.Tensor) -> torch.Tensor:
    """Per row, the lowest index among the maxima; a row with NaNs takes its first NaN."""
    nan = value.isnan()
    # torch.argmax returns the first maximal index, also of the boolean mask.
    best = torch.where(nan, -torch.inf, value).argmax(dim=1)
    first_nan = nan.to(torch.uint8).argmax(dim=1)
    return torch.where(nan.any(dim=1), first_nan, best)


def argmax_in_map(
    base: torch.Tensor, bias: torch.Tensor, ids: torch.Tensor, step_dtype: torch.dtype
) -> torch.Tensor:
    """``ids[j]``, ``j`` the lowest index among the maxima of the rounded ``base + bias``.

    ``base`` ``[N, K]`` and ``bias`` ``[N, K]`` are the mapped columns; the sum is taken in
    float32 and rounded to ``step_dtype``, as SGLang's step does. A row with NaNs takes
    its first NaN, as in SGLang's reference.
    """
    value = (base.float() + bias.float()).to(step_dtype).float()
    return ids.index_select(0, _first_max(value))


def sample_in_map(
    base_logits: torch.Tensor,
    bias: torch.Tensor,
    ids: torch.Tensor,
    temperatures: torch.Tensor,
    logits_out: torch.Tensor,
    generator: torch.Generator,
) -> torch.Tensor:
    """Draw each row's token from ``softmax(value / T)`` over the map; fill ``logits_out``.

    ``base_logits`` ``[N, V]`` (``OFF_MAP_LOGIT`` off the map), ``bias`` ``[N, K]`` (the
    mapped columns), ``temperatures`` ``[N]`` float32 (0: the row takes the argmax),
    ``logits_out`` ``[N, V]`` in the step dtype: written as SGLang's step writes it.
    Gumbel-max with the exponential noise SGLang uses (``-log1p(-u)``, ``u`` from 32-bit
    words), from ``generator``.
    """
    step_dtype = logits_out.dtype
    value = (base_logits.index_select(1, ids).float() + bias.float()).to(step_dtype)
    logits_out.copy_(base_logits)
    logits_out.index_copy_(1, ids, value)
    value = value.float()
    uniform = (random_words(tuple(value.shape), generator).float() + 0.5) * 2.0**-32
    sampled = temperatures != 0
    scale = torch.where(sampled, temperatures, 1.0)[:, None]
    noised = value / scale - torch.log(-torch.log1p(-uniform))
    keys = torch.where(sampled[:, None], noised, value)
    return ids.index_select(0, _first_max(keys))


def step_in_map(
    original: Callable[..., Any],
    markov_head: Any,
    prev_tokens: torch.Tensor,
    base_logits: torch.Tensor,
    *,
    hidden_states: torch.Tensor | None,
    state: torch.Tensor | None,
    temperatures: torch.Tensor,
    noise: Any,
    step: int,
    logits_out: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """AROUND hook on SGLang's ``_draft_step``: the step in the map's columns."""
    argmax = applies(markov_head, logits_out)
    if not argmax and not applies_sampled(markov_head, base_logits, logits_out):
        return original(
            markov_head,
            prev_tokens,
            base_logits,
            hidden_states=hidden_states,
            state=state,
            temperatures=temperatures,
            noise=noise,
            step=step,
            logits_out=logits_out,
        )
    ids = markov_head.draft_vocab_ids
    bias, state = markov_head.reduced_step_bias(
        prev_tokens, hidden_states=hidden_states, state=state
    )
    if argmax:
        step_dtype = markov_head.step_logits_dtype(base_logits.dtype)
        return argmax_in_map(base_logits.index_select(-1, ids), bias, ids, step_dtype), state
    assert logits_out is not None  # applies_sampled
    token = sample_in_map(
        base_logits, bias, ids, temperatures, logits_out, generator_for(int(noise.key))
    )
    return token, state


def install() -> None:
    """Register the hook (every process: a draft may be built in any scheduler)."""
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    HookRegistry.register(DRAFT_STEP, step_in_map, HookType.AROUND)
