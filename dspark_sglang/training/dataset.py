"""The training sequences of a data directory, and anchored sequences as training batches.

Two sources of sequences, listing the same sequences in the same order (the response
shards' order) so that a run's batch plan does not depend on which one it reads:

* ``HiddenCache`` (``data.hidden_states: cache``): the hidden-state cache of
  ``datagen.cache_hidden_states``, memory-mapped, so a run only pages in the sequences
  of the current batch; bfloat16 caches and the float16 caches written before them;
* ``ResponseSequences`` (``data.hidden_states: online``): the regenerated responses
  only; the trainer computes the hidden states inside each step (``training/online.py``)
  and ``attach_hidden_states`` puts them into the batch.

``make_batch`` gathers, for a list of sequences and their anchors, everything a drafter
step needs:

* ``context_hidden`` ``[S, T, n*H]`` float32 target features (right-padded, zero past
  each sequence's end);
* ``anchors`` ``[S, A]`` (padded with the sequence's first anchor, masked);
* ``labels`` ``[S, A, B]`` = ``x_{p+k+1}`` and ``prev_tokens`` ``[S, A, B]`` =
  ``x_{p+k}`` (teacher forcing: slot k's Markov input is the true previous
  token, slot 0's is the anchor itself);
* ``valid`` ``[S, A, B]``: slot inside the sequence and anchor not padding;
* ``target_last`` ``[S, A, B, H]``: the target's last hidden state at ``p+k``,
  from which the frozen LM head gives slot k's target logits.

For token-only sequences the two hidden fields are empty (last dimension 0) until
``attach_hidden_states`` fills them; it fills them exactly as ``make_batch`` does from a
cache holding the same states.
"""

from __future__ import annotations

import dataclasses
import json
import queue
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Generic, TypeVar

import numpy as np
import torch

from dspark_sglang.training.anchors import block_validity
from dspark_sglang.training.datagen import (
    HIDDEN_DIR,
    MANIFEST_FILE,
    RESPONSES_DIR,
    load_responses,
    read_index,
)
from dspark_sglang.training.hidden_format import decode, stored_dtype


@dataclass(frozen=True)
class CachedSequence:
    """One cached sequence; ``aux`` / ``last`` are in the cache's dtype (bfloat16 or float16)."""

    tokens: torch.Tensor  # [T] int64
    aux: torch.Tensor  # [T, n*H]
    last: torch.Tensor  # [T, H]
    response_start: int


@dataclass(frozen=True)
class TokenSequence:
    """One sequence without hidden states (online mode: the target computes them)."""

    tokens: torch.Tensor  # [T] int64
    response_start: int


class HiddenCache:
    """All indexed hidden shards of a data directory, as one list of sequences.

    The manifest's ``dtype`` says how the states are stored (``hidden_format``); an
    unknown or missing one, or a shard whose arrays do not match it, is refused with
    the fix named.
    """

    has_hidden_states = True

    def __init__(self, data_dir: str | Path) -> None:
        root = Path(data_dir) / HIDDEN_DIR
        if not (root / MANIFEST_FILE).exists():
            raise FileNotFoundError(
                f"no hidden-state cache under {root}; run the data generation first "
                "(`dspark-sglang train --config ... --stage data`), or set "
                "data.hidden_states: online to compute the states while training"
            )
        self.manifest = json.loads((root / MANIFEST_FILE).read_text())
        self.layer_ids: tuple[int, ...] = tuple(self.manifest["layer_ids"])
        self.stored = stored_dtype(self.manifest.get("dtype"), str(root / MANIFEST_FILE))
        self.dtype: str = self.stored.name
        self._shards: list[dict[str, np.ndarray]] = []
        self._where: list[tuple[int, int]] = []
        self.ids: list[str] = []
        for _, entry in sorted(read_index(root).items()):
            d = root / entry.shard
            files = {
                "tokens": "tokens.npy",
                "aux": self.stored.file("aux"),
                "last": self.stored.file("last"),
                "offsets": "offsets.npy",
                "response_start": "response_start.npy",
            }
            missing = sorted(f for f in files.values() if not (d / f).exists())
            if missing:
                raise ValueError(
                    f"{d} lacks {missing} for a {self.dtype} cache ({root / MANIFEST_FILE}); "
                    f"delete {root} and rerun the data stage"
                )
            shard = {name: np.load(d / f, mmap_mode="r") for name, f in files.items()}
            for name in ("aux", "last"):
                if shard[name].dtype != self.stored.numpy_dtype:
                    raise ValueError(
                        f"{d / files[name]} holds {shard[name].dtype}, not the "
                        f"{self.stored.numpy_dtype} of a {self.dtype} cache; delete {root} "
                        "and rerun the data stage"
                    )
            k = len(self._shards)
            self._shards.append(shard)
            n = len(shard["response_start"])
            self._where.extend((k, j) for j in range(n))
            self.ids.extend(json.loads((d / "ids.json").read_text()))
        self.seq_lens = [
            int(self._shards[k]["offsets"][j + 1] - self._shards[k]["offsets"][j])
            for k, j in self._where
        ]
        self.response_starts = [int(self._shards[k]["response_start"][j]) for k, j in self._where]

    def __len__(self) -> int:
        return len(self._where)

    def __getitem__(self, i: int) -> CachedSequence:
        k, j = self._where[i]
        s = self._shards[k]
        lo, hi = int(s["offsets"][j]), int(s["offsets"][j + 1])
        return CachedSequence(
            tokens=torch.from_numpy(np.asarray(s["tokens"][lo:hi], dtype=np.int64)),
            aux=decode(s["aux"][lo:hi], self.stored),
            last=decode(s["last"][lo:hi], self.stored),
            response_start=int(s["response_start"][j]),
        )


class ResponseSequences:
    """All indexed response shards of a data directory as token sequences (online mode).

    Invariant: for a directory whose hidden cache covers every response shard, ``ids``,
    ``seq_lens``, ``response_starts`` and every sequence's tokens equal the
    ``HiddenCache``'s, so both sources give the same batch plan.
    """

    has_hidden_states = False
    layer_ids = None

    def __init__(self, data_dir: str | Path) -> None:
        root = Path(data_dir) / RESPONSES_DIR
        if not (root / MANIFEST_FILE).exists():
            raise FileNotFoundError(
                f"no regenerated responses under {root}; run the data generation first "
                "(`dspark-sglang train --config ... --stage data`)"
            )
        records = load_responses(data_dir)
        self.ids = [r.id for r in records]
        self.seq_lens = [len(r.prompt_ids) + len(r.response_ids) for r in records]
        self.response_starts = [len(r.prompt_ids) for r in records]
        self._offsets = np.concatenate([[0], np.cumsum(self.seq_lens)]).astype(np.int64)
        self._tokens = np.array(
            [t for r in records for t in (*r.prompt_ids, *r.response_ids)], dtype=np.int64
        )

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> TokenSequence:
        lo, hi = int(self._offsets[i]), int(self._offsets[i + 1])
        return TokenSequence(torch.from_numpy(self._tokens[lo:hi].copy()), self.response_starts[i])


@dataclass(frozen=True)
class TrainBatch:
    tokens: torch.Tensor  # [S, T] int64 (padded with 0)
    seq_lens: torch.Tensor  # [S]
    context_hidden: torch.Tensor  # [S, T, n*H] float32
    anchors: torch.Tensor  # [S, A]
    anchor_tokens: torch.Tensor  # [S, A]
    anchor_mask: torch.Tensor  # [S, A] bool
    labels: torch.Tensor  # [S, A, B]
    prev_tokens: torch.Tensor  # [S, A, B]
    valid: torch.Tensor  # [S, A, B] bool
    target_last: torch.Tensor  # [S, A, B, H] float32

    @property
    def num_anchors(self) -> int:
        return int(self.anchor_mask.sum())

    @property
    def has_hidden_states(self) -> bool:
        """False for a batch of token-only sequences before ``attach_hidden_states``."""
        return self.context_hidden.shape[-1] > 0

    def _map(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> TrainBatch:
        return TrainBatch(**{f.name: fn(getattr(self, f.name)) for f in dataclasses.fields(self)})

    def to(self, device: torch.device | str, non_blocking: bool = False) -> TrainBatch:
        """Every field on ``device`` (``non_blocking`` from pinned memory onto a GPU)."""
        return self._map(lambda t: t.to(device, non_blocking=non_blocking))

    def pin_memory(self) -> TrainBatch:
        """Page-locked copies, so the copy to a GPU can overlap the previous step."""
        return self._map(lambda t: t.pin_memory())

    def without_anchors(self) -> TrainBatch:
        """The same tensors with every anchor masked out: a batch that weighs nothing.

        A process whose share of a global batch is empty (fewer sequences than
        processes) still runs forward and backward on this, so the collectives of
        every process line up; its loss, gradients and MoE statistics are zero.
        """
        return dataclasses.replace(
            self,
            anchor_mask=torch.zeros_like(self.anchor_mask),
            valid=torch.zeros_like(self.valid),
        )


def _block_positions(anchors: torch.Tensor, block_size: int, width: int) -> torch.Tensor:
    """``[S, A, B]`` positions ``p + k`` of every block slot, clamped into the batch."""
    k = torch.arange(block_size, device=anchors.device)
    return (anchors.unsqueeze(-1) + k).clamp(max=width - 1)


def _gather_block_states(
    last: torch.Tensor, anchors: torch.Tensor, block_size: int
) -> torch.Tensor:
    """``[S, A, B, H]``: ``last [S, T, H]`` at every block slot's position ``p + k``."""
    S, T, H = last.shape
    pos = _block_positions(anchors, block_size, T).reshape(S, -1)
    A = anchors.shape[1]
    return last.gather(1, pos.unsqueeze(-1).expand(-1, -1, H)).view(S, A, block_size, H)


def make_batch(
    seqs: Sequence[CachedSequence] | Sequence[TokenSequence],
    anchors: Sequence[torch.Tensor],
    block_size: int,
) -> TrainBatch:
    """Pad and gather one batch (see the module docstring for every field).

    ``TokenSequence``s give a batch with empty hidden fields (``has_hidden_states``
    False); a batch mixing them with ``CachedSequence``s is refused.
    """
    if len(seqs) != len(anchors) or not seqs:
        raise ValueError("make_batch needs one anchor tensor per sequence and >= 1 sequence")
    cached = [isinstance(s, CachedSequence) for s in seqs]
    if any(cached) and not all(cached):
        raise ValueError("make_batch got cached and token-only sequences in one batch")
    S = len(seqs)
    T = max(len(s.tokens) for s in seqs)
    A = max(int(a.numel()) for a in anchors)
    if A == 0:
        raise ValueError("make_batch got sequences without anchors; pack_batches skips those")
    n_h = seqs[0].aux.shape[1] if all(cached) else 0  # type: ignore[union-attr]
    H = seqs[0].last.shape[1] if all(cached) else 0  # type: ignore[union-attr]
    tokens = torch.zeros(S, T, dtype=torch.long)
    ctx = torch.zeros(S, T, n_h, dtype=torch.float32)
    last = torch.zeros(S, T, H, dtype=torch.float32)
    anc = torch.zeros(S, A, dtype=torch.long)
    amask = torch.zeros(S, A, dtype=torch.bool)
    lens = torch.tensor([len(s.tokens) for s in seqs], dtype=torch.long)
    for i, (s, a) in enumerate(zip(seqs, anchors, strict=True)):
        n = len(s.tokens)
        tokens[i, :n] = s.tokens
        if isinstance(s, CachedSequence):
            ctx[i, :n] = s.aux.float()
            last[i, :n] = s.last.float()
        anc[i, : a.numel()] = a
        anc[i, a.numel() :] = a[0] if a.numel() else 1
        amask[i, : a.numel()] = True
    pos_prev = _block_positions(anc, block_size, T)
    pos_label = (pos_prev + 1).clamp(max=T - 1)
    flat = lambda x: x.reshape(S, -1)  # noqa: E731
    labels = tokens.gather(1, flat(pos_label)).view(S, A, block_size)
    prev = tokens.gather(1, flat(pos_prev)).view(S, A, block_size)
    valid = block_validity(anc, lens, block_size) & amask.unsqueeze(-1)
    return TrainBatch(
        tokens=tokens,
        seq_lens=lens,
        context_hidden=ctx,
        anchors=anc,
        anchor_tokens=tokens.gather(1, anc),
        anchor_mask=amask,
        labels=labels,
        prev_tokens=prev,
        valid=valid,
        target_last=_gather_block_states(last, anc, block_size),
    )


def attach_hidden_states(
    batch: TrainBatch, aux: torch.Tensor, last: torch.Tensor, block_size: int
) -> TrainBatch:
    """``batch`` (token-only) with the target's states of its sequences filled in.

    ``aux [S, T, n*H]`` / ``last [S, T, H]`` are the target's states for ``batch.tokens``
    in any dtype, on the batch's device; positions past a sequence's end are zeroed and the
    states become float32, so the result equals ``make_batch`` on a cache holding ``aux``
    and ``last`` in that dtype, bit for bit.
    """
    if batch.has_hidden_states:
        raise ValueError("attach_hidden_states got a batch that already has hidden states")
    S, T = batch.tokens.shape
    if aux.shape[:2] != (S, T) or last.shape[:2] != (S, T):
        raise ValueError(
            f"hidden states of shape {tuple(aux.shape)} / {tuple(last.shape)} for a batch "
            f"of {S} sequences x {T} tokens"
        )
    positions = torch.arange(T, device=batch.tokens.device)
    inside = (positions.unsqueeze(0) < batch.seq_lens.unsqueeze(1)).unsqueeze(-1)
    zero = torch.zeros((), dtype=torch.float32, device=batch.tokens.device)
    ctx = torch.where(inside, aux.float(), zero)
    final = torch.where(inside, last.float(), zero)
    return dataclasses.replace(
        batch,
        context_hidden=ctx,
        target_last=_gather_block_states(final, batch.anchors, block_size),
    )


T = TypeVar("T")


class Prefetcher(Generic[T]):
    """Runs an iterator ``depth`` items ahead in a background thread, in its order.

    The items and their order are exactly the wrapped iterator's (one producer, a FIFO
    queue), so training is as deterministic as without it; only the time spent in
    ``make_batch`` (memory-mapped reads, padding, pinning) overlaps the training step.
    An exception in the producer is raised by ``next`` at the item where it happened.
    ``depth = 0`` iterates synchronously. Call ``close`` (or use ``with``) to stop it.
    """

    _DONE = object()

    def __init__(self, items: Iterator[T], depth: int) -> None:
        if depth < 0:
            raise ValueError(f"prefetch depth must be >= 0, got {depth}")
        self._items = items
        self._depth = depth
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if depth > 0:
            self._queue: queue.Queue[object] = queue.Queue(maxsize=depth)
            self._thread = threading.Thread(target=self._produce, daemon=True, name="prefetch")
            self._thread.start()

    def _put(self, item: object) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def _produce(self) -> None:
        try:
            for item in self._items:
                if not self._put(item):
                    return
        except BaseException as exc:  # handed to the consumer, raised there
            self._put(_Raised(exc))
            return
        self._put(self._DONE)

    def __iter__(self) -> Prefetcher[T]:
        return self

    def __next__(self) -> T:
        if self._thread is None:
            return next(self._items)
        item = self._queue.get()
        if item is self._DONE:
            self._queue.put(item)  # later calls stop too
            raise StopIteration
        if isinstance(item, _Raised):
            raise item.exc
        return item  # type: ignore[return-value]

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10.0)

    def __enter__(self) -> Prefetcher[T]:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass(frozen=True)
class _Raised:
    exc: BaseException
