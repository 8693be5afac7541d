"""The argmax draft step of a drafter with a reduced token map, taken in the map's columns.

SGLang's draft loop (``dspark_draft.draft_markov_block``) calls ``_draft_step`` once per
draft position. Under the argmax draft (``SGLANG_DSPARK_USE_GREEDY_DRAFT``, no step logits
kept) that step is, per row::

    token = lowest index among the maxima of round_to_step_dtype(base + bias)

over the target's ``V`` columns. A drafter with a reduced map of ``K`` ascending ids
(``moe_draft_model.DraftVocabBias``: a reduced ``draft_vocab_size`` or, under the argmax
draft, its greedy map) has ``base = OFF_MAP_LOGIT`` and ``bias = 0`` outside the map, so
the maximum is always a mapped token, and SGLang's step spends its work on the ``V - K``
columns that can never win: scattering the bias into ``V`` columns, copying, rounding,
masking and reducing ``V`` values, seven times a round.

This step computes the same token from the ``K`` mapped columns only::

    j     = lowest index among the maxima of round_to_step_dtype(base[:, ids] + bias_K)
    token = ids[j]

Invariant (why it is the same token, bit for bit): the mapped columns' values are the
same numbers in the same dtype; the map is strictly ascending (checked at load), so the
lowest ``j`` among the maxima is the lowest target id among them; and a row with NaNs
takes its first NaN, as in SGLang's reference. It is an AROUND hook of SGLang's
``HookRegistry`` on ``_draft_step``: every other call (sampled drafts, kept step logits,
heads without a map, sharded heads) runs SGLang's step unchanged. Drafts only propose
tokens; verification decides what is emitted, so the step could not make output lossy
even if it differed; it is held to identical drafts anyway (tested against SGLang's).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

#: SGLang's per-position draft step, wrapped by :func:`reduced_greedy_step`.
DRAFT_STEP = "sglang.srt.speculative.dspark_components.dspark_draft._draft_step"


def applies(markov_head: Any, logits_out: torch.Tensor | None) -> bool:
    """An argmax step (no step logits kept) of an unsharded head with a reduced map."""
    from dspark_sglang.sglang_integration.moe_draft_model import DraftVocabBias

    return (
        logits_out is None
        and isinstance(markov_head, DraftVocabBias)
        and getattr(markov_head, "vocab_shard", None) is None
    )


def argmax_in_map(
    base: torch.Tensor, bias: torch.Tensor, ids: torch.Tensor, step_dtype: torch.dtype
) -> torch.Tensor:
    """``ids[j]``, ``j`` the lowest index among the maxima of the rounded ``base + bias``.

    ``base`` ``[N, K]`` and ``bias`` ``[N, K]`` are the mapped columns; the sum is taken in
    float32 and rounded to ``step_dtype``, as SGLang's step does. A row with NaNs takes
    its first NaN, as in SGLang's reference.
    """
    value = (base.float() + bias.float()).to(step_dtype).float()
    nan = value.isnan()
    # torch.argmax returns the first maximal index, also of the boolean mask.
    best = torch.where(nan, -torch.inf, value).argmax(dim=1)
    first_nan = nan.to(torch.uint8).argmax(dim=1)
    return ids.index_select(0, torch.where(nan.any(dim=1), first_nan, best))


def reduced_greedy_step(
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
    """AROUND hook on SGLang's ``_draft_step``: the argmax step in the map's columns."""
    if not applies(markov_head, logits_out):
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
    base = base_logits.index_select(-1, ids)
    step_dtype = markov_head.step_logits_dtype(base_logits.dtype)
    return argmax_in_map(base, bias, ids, step_dtype), state


def install() -> None:
    """Register the hook (every process: a draft may be built in any scheduler)."""
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    HookRegistry.register(DRAFT_STEP, reduced_greedy_step, HookType.AROUND)
