"""Reading the hidden-state cache and turning anchored sequences into training batches.

The cache (``datagen.cache_hidden_states``) is memory-mapped, so a run only
pages in the sequences of the current batch. ``make_batch`` gathers, for a
list of sequences and their anchors, everything a drafter step needs:

* ``context_hidden`` ``[S, T, n*H]`` float32 target features (right-padded);
* ``anchors`` ``[S, A]`` (padded with the sequence's first anchor, masked);
* ``labels`` ``[S, A, B]`` = ``x_{p+k+1}`` and ``prev_tokens`` ``[S, A, B]`` =
  ``x_{p+k}`` (teacher forcing: slot k's Markov input is the true previous
  token, slot 0's is the anchor itself);
* ``valid`` ``[S, A, B]``: slot inside the sequence and anchor not padding;
* ``target_last`` ``[S, A, B, H]``: the target's last hidden state at ``p+k``,
  from which the frozen LM head gives slot k's target logits.
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
from dspark_sglang.training.datagen import HIDDEN_DIR, MANIFEST_FILE, read_index


@dataclass(frozen=True)
class CachedSequence:
    tokens: torch.Tensor  # [T] int64
    aux: np.ndarray  # [T, n*H] float16 (memmap view)
    last: np.ndarray  # [T, H] float16 (memmap view)
    response_start: int


class HiddenCache:
    """All indexed hidden shards of a data directory, as one list of sequences."""

    def __init__(self, data_dir: str | Path) -> None:
        root = Path(data_dir) / HIDDEN_DIR
        if not (root / MANIFEST_FILE).exists():
            raise FileNotFoundError(
                f"no hidden-state cache under {root}; run the data generation first "
                "(`dspark-sglang train --config ... --stage data`)"
            )
        self.manifest = json.loads((root / MANIFEST_FILE).read_text())
        self.layer_ids: tuple[int, ...] = tuple(self.manifest["layer_ids"])
        self._shards: list[dict[str, np.ndarray]] = []
        self._where: list[tuple[int, int]] = []
        self.ids: list[str] = []
        for _, entry in sorted(read_index(root).items()):
            d = root / entry.shard
            shard = {
                name: np.load(d / f"{name}.npy", mmap_mode="r")
                for name in ("tokens", "aux", "last", "offsets", "response_start")
            }
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
            aux=s["aux"][lo:hi],
            last=s["last"][lo:hi],
            response_start=int(s["response_start"][j]),
        )


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


def make_batch(
    seqs: Sequence[CachedSequence], anchors: Sequence[torch.Tensor], block_size: int
) -> TrainBatch:
    """Pad and gather one batch (see the module docstring for every field)."""
    if len(seqs) != len(anchors) or not seqs:
        raise ValueError("make_batch needs one anchor tensor per sequence and >= 1 sequence")
    S = len(seqs)
    T = max(len(s.tokens) for s in seqs)
    A = max(int(a.numel()) for a in anchors)
    if A == 0:
        raise ValueError("make_batch got sequences without anchors; pack_batches skips those")
    n_h = seqs[0].aux.shape[1]
    H = seqs[0].last.shape[1]
    tokens = torch.zeros(S, T, dtype=torch.long)
    ctx = torch.zeros(S, T, n_h, dtype=torch.float32)
    last = torch.zeros(S, T, H, dtype=torch.float32)
    anc = torch.zeros(S, A, dtype=torch.long)
    amask = torch.zeros(S, A, dtype=torch.bool)
    lens = torch.tensor([len(s.tokens) for s in seqs], dtype=torch.long)
    for i, (s, a) in enumerate(zip(seqs, anchors, strict=True)):
        n = len(s.tokens)
        tokens[i, :n] = s.tokens
        ctx[i, :n] = torch.from_numpy(np.asarray(s.aux, dtype=np.float32))
        last[i, :n] = torch.from_numpy(np.asarray(s.last, dtype=np.float32))
        anc[i, : a.numel()] = a
        anc[i, a.numel() :] = a[0] if a.numel() else 1
        amask[i, : a.numel()] = True
    k = torch.arange(block_size)
    pos_label = (anc.unsqueeze(-1) + k + 1).clamp(max=T - 1)  # [S, A, B]
    pos_prev = (anc.unsqueeze(-1) + k).clamp(max=T - 1)
    flat = lambda x: x.reshape(S, -1)  # noqa: E731
    labels = tokens.gather(1, flat(pos_label)).view(S, A, block_size)
    prev = tokens.gather(1, flat(pos_prev)).view(S, A, block_size)
    valid = block_validity(anc, lens, block_size) & amask.unsqueeze(-1)
    tl = last.gather(1, flat(pos_prev).unsqueeze(-1).expand(-1, -1, H)).view(S, A, block_size, H)
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
        target_last=tl,
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
