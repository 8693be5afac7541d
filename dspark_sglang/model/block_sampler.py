"""Semi-autoregressive drafting: sequential sampling over one parallel block.

Given a ``DraftBlock`` (hidden ``h_k`` and base logits ``z_k`` for slots
``k = 0..B-1``) and the anchor token ``x_p``:

    prev_0 = x_p
    for k = 0 .. B-1:
        l_k     = z_k + bias(prev_k | h_k, state)        (heads.py)
        q_k     = logits_to_probs(l_k; temperature, top_k, top_p)
        y_k     ~ q_k                                    (argmax when temperature = 0)
        prev_{k+1} = y_k
    confidence_k = ConfidenceHead(h_k, E[prev_k])        raw logit

Invariant: ``probs[:, k]`` is exactly the distribution ``y_k`` was drawn from,
over the target's whole vocabulary, so lossless verification can use it as
``p_d``; ``prev_{k+1}`` is the sampled token, never the argmax. A drafter with a
reduced vocabulary ``S`` (``model/vocab.py``) samples among its ``K`` tokens; the
index drawn is mapped to its target id and ``q_k`` is scattered into the full
vocabulary with zeros outside ``S``. Training uses ``markov_logits`` (teacher forcing: the
true previous tokens replace the samples, so no loop is needed except for the
RNN head's B-step recurrence).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dspark_sglang.model.drafter import DraftBlock, DSparkDrafter
from dspark_sglang.sampling import logits_to_probs, sample


@dataclass(frozen=True)
class DraftProposal:
    """``tokens`` ``[N, B]`` (target ids), ``probs`` ``[N, B, V]`` (float32, the processed
    distribution each token was drawn from, over the target's vocabulary) and raw
    ``confidence_logits`` ``[N, B]`` (or ``None``)."""

    tokens: torch.Tensor
    probs: torch.Tensor
    confidence_logits: torch.Tensor | None


@dataclass(frozen=True)
class MarkovLogits:
    """Teacher-forced ``logits`` ``[..., B, K]`` over the draft vocabulary (base + Markov
    bias, float32; ``K = V`` unless the drafter's vocabulary is reduced) and raw
    ``confidence_logits`` ``[..., B]`` (or ``None`` without a confidence head)."""

    logits: torch.Tensor
    confidence_logits: torch.Tensor | None


def _confidence_logits(
    drafter: DSparkDrafter, hidden: torch.Tensor, prev_tokens: torch.Tensor
) -> torch.Tensor | None:
    head = drafter.confidence_head
    if head is None:
        return None
    prev_emb = None
    if head.with_markov:
        assert drafter.markov_head is not None  # guaranteed by DSparkConfig validation
        prev_emb = drafter.markov_head.prev_embedding(prev_tokens)
    return head(hidden, prev_emb).float()


@torch.no_grad()
def sample_block(
    drafter: DSparkDrafter,
    block: DraftBlock,
    anchor_tokens: torch.Tensor,
    temperature: float | torch.Tensor = 1.0,
    top_k: int | torch.Tensor = -1,
    top_p: float | torch.Tensor = 1.0,
    generator: torch.Generator | None = None,
) -> DraftProposal:
    """Draw one block per request, left to right (see the module docstring).

    ``temperature``/``top_k``/``top_p`` are scalars or per-request tensors ``[N]``;
    ``block`` comes from ``drafter.forward_block`` for the same ``N`` requests.
    """
    hidden, base = block.hidden, block.base_logits
    n, b, _ = base.shape
    head = drafter.markov_head
    state = head.init_state(hidden[:, 0]) if head is not None else None
    prev = anchor_tokens.long()
    tokens, probs = [], []
    for k in range(b):
        logits = base[:, k]
        if head is not None:
            bias, state = head.step(prev, hidden[:, k], state)
            logits = logits + bias.float()
        q = logits_to_probs(logits, temperature, top_k, top_p)
        y = drafter.to_target_vocab(sample(q, generator))
        tokens.append(y)
        probs.append(drafter.scatter_to_target_vocab(q))
        prev = y
    token_tensor = torch.stack(tokens, dim=1)
    prev_tokens = torch.cat([anchor_tokens.long().view(n, 1), token_tensor[:, :-1]], dim=1)
    return DraftProposal(
        tokens=token_tensor,
        probs=torch.stack(probs, dim=1),
        confidence_logits=_confidence_logits(drafter, hidden, prev_tokens),
    )


def markov_logits(
    drafter: DSparkDrafter, block: DraftBlock, prev_tokens: torch.Tensor
) -> MarkovLogits:
    """Teacher-forced logits after the Markov bias, plus confidence logits.

    ``prev_tokens`` ``[..., B]`` is ``[anchor, y_1, ..., y_{B-1}]`` with the true
    tokens; leading dims match ``block`` (``[N]`` or ``[S, A]``).
    """
    logits = block.base_logits.float()
    head = drafter.markov_head
    if head is not None:
        logits = logits + head.teacher_forced(prev_tokens.long(), block.hidden).float()
    return MarkovLogits(
        logits=logits,
        confidence_logits=_confidence_logits(drafter, block.hidden, prev_tokens.long()),
    )
