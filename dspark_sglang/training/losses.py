"""The DSpark training objective (DSPARK.md, "Training").

Every drafter in the comparison is trained with this one function so that the
acceptance numbers differ only by architecture, never by objective:

    loss = w_ce * CE + w_l1 * L1 + w_bce * BCE          (defaults 0.1 / 0.9 / 1.0)

Each term is a *weighted mean* over the block slots of all anchors, with weight
``w_k * m_k``: ``w_k = exp(-k / gamma)`` (k counted from 0, gamma = 4 for B = 7)
favours early slots, whose acceptance gates every later one, and ``m_k`` is the
cumulative product of the per-slot validity (supervision stops at the first
invalid label, e.g. past the end of the sequence or on anchor padding).

* CE: cross-entropy of the draft logits against the ground-truth next token.
* L1: ``|| softmax(draft) - softmax(target) ||_1`` (the full L1, range [0, 2]).
  ``1 - L1/2 = sum_v min(p_d, p_t)`` is exactly the chain-sampling acceptance
  probability of one draft token, so L1 is the quantity speculative decoding
  pays for, while CE keeps the mode right.
* BCE: binary cross-entropy (with logits) of the confidence head against the
  detached label ``a* = clamp(1 - L1/2, 0, 1)``: the confidence head learns to
  predict the acceptance probability without pushing gradients into the draft
  distribution through its own label.

A drafter with a reduced vocabulary ``S`` (``model/vocab.py``) has draft logits over
its ``K`` tokens only. L1 stays the exact total variation over the whole vocabulary
(the target's mass outside ``S`` counts in full), so the confidence label is still
the true acceptance probability; CE is left out (weight 0) at slots whose label is
outside ``S``, where the drafter can put no mass.

The draft logits are the ones tokens are drawn from (after the Markov bias,
teacher-forced on the ground-truth previous token). Drafters without a Markov
head (DFlash-style) or without a confidence head pass ``conf_logits=None`` and
the BCE term is reported as 0 and not added.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from dspark_sglang.model.vocab import reduced_l1
from dspark_sglang.sampling import logits_to_probs


@dataclass(frozen=True)
class LossConfig:
    """Weights of the three terms and the position-decay constant."""

    ce_weight: float = 0.1
    l1_weight: float = 0.9
    bce_weight: float = 1.0
    gamma: float = 4.0

    def __post_init__(self) -> None:
        for name in ("ce_weight", "l1_weight", "bce_weight"):
            value = getattr(self, name)
            if not (isinstance(value, int | float) and value >= 0.0 and math.isfinite(value)):
                raise ValueError(f"loss.{name} must be a finite number >= 0, got {value!r}")
        if not (isinstance(self.gamma, int | float) and self.gamma > 0.0):
            raise ValueError(
                f"loss.gamma must be > 0 (the position-decay constant, 4 for B = 7), "
                f"got {self.gamma!r}"
            )


@dataclass(frozen=True)
class LossTerms:
    """The total loss (differentiable) plus its parts and per-slot diagnostics.

    ``accept_per_slot[k]`` is the weighted mean of ``1 - L1_k/2`` over valid
    slots k: the expected single-token acceptance probability, the number a
    training log should show going up.
    """

    total: torch.Tensor
    ce: torch.Tensor
    l1: torch.Tensor
    bce: torch.Tensor
    accept_per_slot: torch.Tensor  # [B], detached

    def as_floats(self) -> dict[str, float]:
        return {
            "loss": float(self.total.detach()),
            "ce": float(self.ce.detach()),
            "l1": float(self.l1.detach()),
            "bce": float(self.bce.detach()),
        }


def position_weights(
    block_size: int, gamma: float, device: torch.device | None = None
) -> torch.Tensor:
    """``w_k = exp(-k / gamma)`` for ``k = 0 .. block_size-1`` (float32, ``[B]``)."""
    k = torch.arange(block_size, dtype=torch.float32, device=device)
    return torch.exp(-k / gamma)


def cumulative_validity(valid: torch.Tensor) -> torch.Tensor:
    """Cumulative product along the block axis: once a slot is invalid, so is every later one."""
    return torch.cumprod(valid.to(torch.float32), dim=-1)


def _weighted_mean(
    values: torch.Tensor, weights: torch.Tensor, denom: torch.Tensor
) -> torch.Tensor:
    return (values * weights).sum() / denom


def loss_denominators(valid: torch.Tensor, gamma: float) -> torch.Tensor:
    """``[1 + B]`` float32: ``sum(w*m)`` over all slots, then per slot k (see ``dspark_loss``).

    What a trainer all-reduces (sums) over the processes sharing one global batch, so
    each process's ``dspark_loss(..., denominators=...)`` is its share of the global mean.
    """
    block = valid.shape[-1]
    mask = cumulative_validity(valid.reshape(-1, block))
    weights = mask * position_weights(block, gamma, valid.device)
    return torch.cat([weights.sum().reshape(1), weights.sum(0)])


def dspark_loss(
    draft_logits: torch.Tensor,
    target_logits: torch.Tensor,
    labels: torch.Tensor,
    valid: torch.Tensor,
    conf_logits: torch.Tensor | None,
    config: LossConfig = LossConfig(),
    denominators: torch.Tensor | None = None,
    draft_vocab_ids: torch.Tensor | None = None,
) -> LossTerms:
    """Weighted DSpark loss over a batch of blocks.

    Shapes: ``draft_logits``/``target_logits`` ``[..., B, V]``, ``labels``/``valid``
    ``[..., B]`` (leading dims are anchors, flattened here), ``conf_logits``
    ``[..., B]`` or None. With ``draft_vocab_ids`` ``[K]`` (a reduced drafter's token
    map) ``draft_logits`` are ``[..., B, K]`` over those tokens; labels stay target ids.
    Labels at invalid slots may hold anything (they are replaced by 0 before the CE
    gather and then weighted by 0).

    Invariant: with ``m = cumprod(valid)`` and ``w_k = exp(-k/gamma)``, each
    term equals ``sum(w*m*term) / sum(w*m)``; an all-invalid batch gives 0.

    ``denominators`` (``loss_denominators`` summed over the processes of one global
    batch) replaces this batch's own ``sum(w*m)`` (and per-slot sums): every term, and
    ``accept_per_slot``, is then this batch's share of the global weighted mean, and the
    shares of all processes add up to it.
    """
    draft_width = target_logits.shape[-1] if draft_vocab_ids is None else draft_vocab_ids.numel()
    if draft_logits.shape[:-1] != target_logits.shape[:-1] or draft_logits.shape[-1] != draft_width:
        raise ValueError(
            f"draft_logits {tuple(draft_logits.shape)} and target_logits "
            f"{tuple(target_logits.shape)} must have the same shape but for the last axis, "
            f"the draft vocabulary ({draft_width} columns)"
        )
    block, vocab = target_logits.shape[-2:]
    if labels.shape != draft_logits.shape[:-1] or valid.shape != labels.shape:
        raise ValueError(
            f"labels {tuple(labels.shape)} and valid {tuple(valid.shape)} must be "
            f"{tuple(draft_logits.shape[:-1])} (the logits without the vocab axis)"
        )
    draft = draft_logits.reshape(-1, block, draft_width).float()
    target = target_logits.reshape(-1, block, vocab).float()
    mask = cumulative_validity(valid.reshape(-1, block))
    weights = mask * position_weights(block, config.gamma, draft.device)
    if denominators is None:
        denom = weights.sum().clamp_min(1e-12)
        per_slot_den = weights.sum(0).clamp_min(1e-12)
    else:
        if denominators.shape != (1 + block,):
            raise ValueError(
                f"denominators must be [1 + B] = [{1 + block}] (loss_denominators), got "
                f"{tuple(denominators.shape)}"
            )
        den = denominators.to(device=draft.device, dtype=torch.float32)
        denom, per_slot_den = den[0].clamp_min(1e-12), den[1:].clamp_min(1e-12)
    safe_labels = torch.where(mask > 0, labels.reshape(-1, block), torch.zeros_like(mask).long())
    ce_weight = torch.ones_like(mask)
    if draft_vocab_ids is not None:
        ids = draft_vocab_ids.to(draft.device)
        to_draft = torch.full((vocab,), -1, dtype=torch.long, device=draft.device)
        to_draft[ids] = torch.arange(ids.numel(), device=draft.device)
        safe_labels = to_draft[safe_labels]
        ce_weight = (safe_labels >= 0).to(mask.dtype)
        safe_labels = safe_labels.clamp_min(0)

    ce = F.cross_entropy(draft.reshape(-1, draft_width), safe_labels.reshape(-1), reduction="none")
    ce = ce.reshape(mask.shape) * ce_weight

    p_draft = logits_to_probs(draft)
    with torch.no_grad():
        p_target = logits_to_probs(target)
    if draft_vocab_ids is None:
        l1 = (p_draft - p_target).abs().sum(-1)
    else:
        l1 = reduced_l1(p_draft, p_target, draft_vocab_ids)
    accept = (1.0 - l1.detach() / 2.0).clamp(0.0, 1.0)

    ce_mean = _weighted_mean(ce, weights, denom)
    l1_mean = _weighted_mean(l1, weights, denom)
    total = config.ce_weight * ce_mean + config.l1_weight * l1_mean
    if conf_logits is not None:
        if conf_logits.shape != labels.shape:
            raise ValueError(
                f"conf_logits {tuple(conf_logits.shape)} must match labels {tuple(labels.shape)}"
            )
        bce = F.binary_cross_entropy_with_logits(
            conf_logits.reshape(mask.shape).float(), accept, reduction="none"
        )
        bce_mean = _weighted_mean(bce, weights, denom)
        total = total + config.bce_weight * bce_mean
    else:
        bce_mean = torch.zeros((), device=draft.device)

    accept_per_slot = (accept * weights).sum(0) / per_slot_den
    return LossTerms(
        total=total, ce=ce_mean, l1=l1_mean, bce=bce_mean, accept_per_slot=accept_per_slot
    )
