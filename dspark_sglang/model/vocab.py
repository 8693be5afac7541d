"""The reduced draft vocabulary: which target tokens the drafter can propose.

A drafter with ``draft_vocab_size = K`` drafts over the ``K`` target tokens
``S = ids[0] < ids[1] < ... < ids[K-1]`` (the most frequent tokens of its
training data, EAGLE-3's token map). Its LM head is the target's LM head
restricted to the rows ``S`` and its Markov head's output projection has ``K``
rows, so the per-slot vocabulary work shrinks by ``V / K``. Inputs stay in the
target vocabulary: the anchor and every previous token are target ids, and the
Markov head's input table ``E`` stays ``V x r``.

Losslessness: the draft distribution over the full vocabulary is the reduced
one scattered into ``S`` and zero elsewhere (:meth:`DraftVocab.scatter`), so
verification compares ``p_d`` and ``p_t`` over the whole vocabulary as before;
a target token outside ``S`` is never drafted but is still produced by the
residual and bonus samples. Training keeps the total-variation term exact: the
target's mass outside ``S`` counts in full (:func:`reduced_l1`).

The greedy map: a full-vocabulary drafter may also carry a second map,
``greedy_draft_vocab_size = K`` with the ids in the tensor ``greedy_draft_vocab``.
Drafting ignores it; SGLang's ``DSPARK_MOE`` model class drafts over it exactly as
over a ``draft_vocab_size`` map, but only when SGLang drafts by argmax
(``SGLANG_DSPARK_USE_GREEDY_DRAFT=1``, a greedy-only tier): a greedy request loses a
draft only where the target's argmax lies outside the map, while sampled requests
would lose every sample outside it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch

#: Name of the drafter buffer (and checkpoint tensor) holding ``S`` as int64 ``[K]``.
DRAFT_VOCAB_BUFFER = "draft_vocab_ids"
#: Config key (``dspark_config``) of the token map's size ``K``.
DRAFT_VOCAB_SIZE_KEY = "draft_vocab_size"
#: Name of the drafter buffer (and checkpoint tensor) holding the greedy map, int64 ``[K]``.
GREEDY_DRAFT_VOCAB_BUFFER = "greedy_draft_vocab"
#: Config key (``dspark_config``) of the greedy map's size ``K``.
GREEDY_DRAFT_VOCAB_SIZE_KEY = "greedy_draft_vocab_size"


def check_draft_vocab_ids(
    ids: torch.Tensor,
    vocab_size: int,
    draft_vocab_size: int,
    *,
    tensor_name: str = DRAFT_VOCAB_BUFFER,
    size_key: str = DRAFT_VOCAB_SIZE_KEY,
) -> None:
    """Refuse a token map that is not ``draft_vocab_size`` distinct ascending ids in ``[0, V)``.

    ``tensor_name``/``size_key``: the checkpoint tensor and config key the errors name
    (the greedy map passes its own).
    """
    if ids.dtype != torch.int64 or ids.dim() != 1:
        raise ValueError(
            f"{tensor_name} must be a 1-D int64 tensor, got {ids.dtype} of shape "
            f"{tuple(ids.shape)}; rebuild the map with DraftVocab.from_counts"
        )
    if ids.numel() != draft_vocab_size:
        raise ValueError(
            f"{tensor_name} has {ids.numel()} ids but {size_key}={draft_vocab_size}; "
            "the token map and config.json disagree (re-save the drafter)"
        )
    ids = ids.detach().cpu()
    if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= vocab_size):
        raise ValueError(
            f"{tensor_name} holds ids outside the target vocabulary [0, {vocab_size}); "
            "the token map was built for another target (re-train the drafter for this one)"
        )
    if ids.numel() > 1 and not bool((ids[1:] > ids[:-1]).all()):
        raise ValueError(
            f"{tensor_name} must be strictly ascending (distinct ids, sorted); "
            "rebuild the map with DraftVocab.from_counts"
        )


@dataclass(frozen=True)
class DraftVocab:
    """``ids`` ``[K]`` int64 (ascending target ids) and the target's ``vocab_size`` ``V``."""

    ids: torch.Tensor
    vocab_size: int

    def __post_init__(self) -> None:
        check_draft_vocab_ids(self.ids, self.vocab_size, int(self.ids.numel()))

    @property
    def size(self) -> int:
        return int(self.ids.numel())

    @classmethod
    def from_counts(
        cls, counts: torch.Tensor, size: int, *, always: Iterable[int] = ()
    ) -> DraftVocab:
        """The ``size`` most frequent tokens of ``counts`` ``[V]``, plus every id in ``always``.

        Ties are broken by the lower id, so the map is a pure function of the counts.
        ``always`` (e.g. the EOS ids) is included whatever its counts and takes places
        from the least frequent tokens.
        """
        vocab = int(counts.numel())
        if not 1 <= size <= vocab:
            raise ValueError(
                f"draft_vocab_size must be in [1, {vocab}] (the target's vocabulary), got {size}"
            )
        forced = sorted({int(t) for t in always})
        bad = [t for t in forced if not 0 <= t < vocab]
        if bad:
            raise ValueError(f"token ids {bad} to always include are outside [0, {vocab})")
        if len(forced) > size:
            raise ValueError(
                f"draft_vocab_size={size} is smaller than the {len(forced)} tokens that must "
                "be in it (EOS and special tokens); raise draft_vocab_size"
            )
        # Sort by (-count, id): a stable sort of ids by descending count.
        order = torch.sort(-counts.double().cpu(), stable=True).indices
        keep = set(forced)
        for t in order.tolist():
            if len(keep) >= size:
                break
            keep.add(int(t))
        return cls(torch.tensor(sorted(keep), dtype=torch.int64), vocab)

    def target_to_draft(self, device: torch.device | None = None) -> torch.Tensor:
        """``[V]`` int64: the draft index of each target id, ``-1`` outside ``S``."""
        out = torch.full((self.vocab_size,), -1, dtype=torch.int64)
        out[self.ids] = torch.arange(self.size, dtype=torch.int64)
        return out.to(device) if device is not None else out


def check_greedy_draft_vocab_ids(ids: torch.Tensor, vocab_size: int, size: int) -> None:
    """``check_draft_vocab_ids`` for a drafter's greedy map (its errors name the greedy
    map's tensor and config key)."""
    check_draft_vocab_ids(
        ids,
        vocab_size,
        size,
        tensor_name=GREEDY_DRAFT_VOCAB_BUFFER,
        size_key=GREEDY_DRAFT_VOCAB_SIZE_KEY,
    )


class MappedRows:
    """The rows ``ids`` of a frozen weight (an LM head), gathered once and reused.

    The gather is redone when the weight's storage, device, dtype or version, or the
    map's version, changes, or after ``clear``.
    """

    def __init__(self) -> None:
        self._key: tuple[object, ...] | None = None
        self._rows: torch.Tensor | None = None

    def clear(self) -> None:
        self._key, self._rows = None, None

    def get(self, weight: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        key = (weight.data_ptr(), weight.device, weight.dtype, weight._version, ids._version)
        if self._rows is None or self._key != key:
            self._key, self._rows = key, weight.detach()[ids.to(weight.device)]
        return self._rows


def scatter_to_vocab(values: torch.Tensor, ids: torch.Tensor, vocab_size: int, fill: float):
    """``values`` ``[..., K]`` at columns ``ids`` of a ``[..., V]`` tensor, ``fill`` elsewhere.

    ``ids`` are distinct (a token map), so one ``index_copy_`` along the last dimension
    places them: on CPU a few times faster than ``scatter`` with an expanded index, which
    walks a ``[..., K]`` index tensor (a draft's base logits every round).
    """
    out = values.new_full((*values.shape[:-1], vocab_size), fill)
    return out.index_copy_(-1, ids.to(values.device), values)


def reduced_l1(
    p_draft: torch.Tensor, p_target_full: torch.Tensor, ids: torch.Tensor
) -> torch.Tensor:
    """``|| p_d - p_t ||_1`` over the full vocabulary for a draft supported on ``S``.

    ``p_draft`` ``[..., K]`` (zero outside ``S`` by construction), ``p_target_full``
    ``[..., V]``: ``sum_{v in S} |p_d(v) - p_t(v)| + sum_{v not in S} p_t(v)``, the second
    sum being ``1 - sum_{v in S} p_t(v)``, so ``1 - L1/2`` stays the exact acceptance
    probability of one drafted token.
    """
    p_t_s = p_target_full.gather(-1, ids.to(p_target_full.device).expand(*p_draft.shape))
    outside = (1.0 - p_t_s.sum(-1)).clamp_min(0.0)
    return (p_draft - p_t_s).abs().sum(-1) + outside
