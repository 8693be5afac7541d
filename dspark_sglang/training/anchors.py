"""Anchor sampling and anchor-bounded packing of cached sequences into batches.

A training *block* is anchored at position ``p`` of a cached sequence
(``slot_convention = "anchor_next"``): the drafter sees the anchor token
``x_p``, the target context at positions ``< p``, and slot ``k`` (0-based)
predicts ``x_{p+k+1}``. The target distribution for slot ``k`` is the frozen
LM head applied to the target's last hidden state at ``p+k``.

Anchors are drawn only from the response (the part the target generated), as
at serving time the drafter only ever continues a response:
``response_start <= p <= T-2`` so at least slot 0 has a label. Blocks may run
past the end of the sequence; those slots are marked invalid and the loss's
cumulative validity mask drops them.

Packing is bounded by anchors (the cost driver: LM-head calls scale with
anchors x B) and by padded context tokens (the drafter's context attention
scales with ``S x T_max``); batches are whole sequences, so a sequence's
context is never split.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class AnchorConfig:
    """How many anchors per sequence and how big a batch may get."""

    anchors_per_seq: int = 64
    block_size: int = 7
    max_anchors_per_batch: int = 128
    max_tokens_per_batch: int = 4096

    def __post_init__(self) -> None:
        for name in ("anchors_per_seq", "block_size", "max_anchors_per_batch"):
            value = getattr(self, name)
            if not (isinstance(value, int) and value >= 1):
                raise ValueError(f"anchors.{name} must be an integer >= 1, got {value!r}")
        if self.max_anchors_per_batch < self.anchors_per_seq:
            raise ValueError(
                f"anchors.max_anchors_per_batch ({self.max_anchors_per_batch}) must be >= "
                f"anchors.anchors_per_seq ({self.anchors_per_seq}) so one sequence fits a batch"
            )
        if not (isinstance(self.max_tokens_per_batch, int) and self.max_tokens_per_batch >= 2):
            raise ValueError(
                f"anchors.max_tokens_per_batch must be an integer >= 2, got "
                f"{self.max_tokens_per_batch!r}"
            )


def anchor_candidates(seq_len: int, response_start: int) -> torch.Tensor:
    """All legal anchor positions of one sequence: ``max(1, response_start) .. seq_len-2``."""
    lo = max(1, response_start)
    return torch.arange(lo, max(lo, seq_len - 1), dtype=torch.long)


def sample_anchors(
    seq_len: int, response_start: int, num_anchors: int, generator: torch.Generator
) -> torch.Tensor:
    """Up to ``num_anchors`` distinct legal anchors, sorted ascending (``[A]``, A may be 0).

    Uniform without replacement; fewer when the response is short.
    """
    cands = anchor_candidates(seq_len, response_start)
    if cands.numel() <= num_anchors:
        return cands
    pick = torch.randperm(cands.numel(), generator=generator)[:num_anchors]
    return cands[pick.sort().values]


def block_validity(
    anchors: torch.Tensor, seq_len: int | torch.Tensor, block_size: int
) -> torch.Tensor:
    """``valid[..., k] = anchor + k + 1 < seq_len`` (bool, ``anchors.shape + (B,)``).

    Already monotone in k; the loss still applies the cumulative product so
    that any extra per-slot invalidity (padding) also stops supervision.
    """
    k = torch.arange(block_size, device=anchors.device)
    length = torch.as_tensor(seq_len, device=anchors.device)
    while length.dim() < anchors.dim():
        length = length.unsqueeze(-1)
    return (anchors.unsqueeze(-1) + k + 1) < length.unsqueeze(-1)


def pack_batches(
    seq_lens: Sequence[int],
    anchor_counts: Sequence[int],
    config: AnchorConfig,
    order: Sequence[int] | None = None,
) -> list[list[int]]:
    """Greedy packing of sequence indices (in ``order``) into batches.

    Invariant: each batch has ``sum(anchors) <= max_anchors_per_batch`` and
    ``len(batch) * max(seq_len) <= max_tokens_per_batch`` unless it holds a
    single sequence (a sequence longer than the token budget still trains,
    alone). Sequences with no anchors are skipped.
    """
    if len(seq_lens) != len(anchor_counts):
        raise ValueError("seq_lens and anchor_counts must have the same length")
    idx = list(range(len(seq_lens))) if order is None else list(order)
    batches: list[list[int]] = []
    cur: list[int] = []
    cur_anchors = 0
    cur_max_len = 0
    for i in idx:
        a = int(anchor_counts[i])
        if a == 0:
            continue
        length = int(seq_lens[i])
        new_max = max(cur_max_len, length)
        fits = (
            cur_anchors + a <= config.max_anchors_per_batch
            and (len(cur) + 1) * new_max <= config.max_tokens_per_batch
        )
        if cur and not fits:
            batches.append(cur)
            cur, cur_anchors, new_max = [], 0, length
        cur.append(i)
        cur_anchors += a
        cur_max_len = new_max
    if cur:
        batches.append(cur)
    return batches
