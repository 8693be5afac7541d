"""The batch plan: which sequences and anchors make up each global batch of each epoch,
and each process's share of it.

``epoch_plan`` is a pure function of ``(run.seed, epoch)`` and the sequences, so a
resumed run rebuilds the same plan at any world size and skips the batches done.
``check_sequences`` refuses sequences that do not fit ``data.hidden_states``.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from dspark_sglang.training.anchors import pack_batches, sample_anchors
from dspark_sglang.training.config import TrainConfig
from dspark_sglang.training.dataset import HiddenCache, ResponseSequences, TrainBatch, make_batch
from dspark_sglang.training.distributed import shard_batch

if TYPE_CHECKING:
    from dspark_sglang.training.online import OnlineHiddenStates

#: Where a run's sequences come from: the hidden cache, or the responses (online mode).
Sequences = HiddenCache | ResponseSequences


def epoch_plan(
    cache: Sequences, cfg: TrainConfig, epoch: int
) -> tuple[list[list[int]], list[torch.Tensor]]:
    """Batches (lists of sequence indices) and per-sequence anchors for one epoch.

    A pure function of ``(run.seed, epoch)`` and the sequences' lengths and response
    starts, so resumption can rebuild it, and the hidden cache and the responses of the
    same data give the same plan.
    """
    g = torch.Generator().manual_seed(cfg.run.seed * 1_000_003 + epoch)
    order = torch.randperm(len(cache), generator=g).tolist()
    anchors = [
        sample_anchors(cache.seq_lens[i], cache.response_starts[i], cfg.anchors.anchors_per_seq, g)
        for i in range(len(cache))
    ]
    batches = pack_batches(cache.seq_lens, [a.numel() for a in anchors], cfg.anchors, order)
    return batches, anchors


@dataclass(frozen=True)
class Shard:
    """This process's part of global batch ``batch`` of ``epoch`` (all of it with one)."""

    epoch: int
    batch: int
    data: TrainBatch
    global_anchors: int


def iterate_shards(
    cache: Sequences,
    cfg: TrainConfig,
    start_epoch: int,
    start_batch: int,
    rank: int = 0,
    world_size: int = 1,
    pin_memory: bool = False,
) -> Iterator[Shard]:
    """The global batches from ``(start_epoch, start_batch)`` on, cut for ``rank``.

    The plan is the same at every world size; ``shard_batch`` splits each global batch's
    sequences. A rank left without sequences gets a batch with every anchor masked out
    (it weighs nothing but keeps the collectives in step). Batches of ``ResponseSequences``
    carry no hidden states yet (``Trainer.device_batch`` adds them).
    """
    epoch, skip = start_epoch, start_batch
    while True:
        batches, anchors = epoch_plan(cache, cfg, epoch)
        if not batches:
            raise ValueError(
                "the training data has no sequence with a legal anchor (responses empty?)"
            )
        for b in range(skip, len(batches)):
            idx = batches[b]
            mine = shard_batch(idx, cache.seq_lens, world_size, rank)
            take = mine or idx[:1]
            tb = make_batch(
                [cache[i] for i in take], [anchors[i] for i in take], cfg.drafter.block_size
            )
            if not mine:
                tb = tb.without_anchors()
            if pin_memory:
                tb = tb.pin_memory()
            yield Shard(epoch, b, tb, sum(int(anchors[i].numel()) for i in idx))
        epoch, skip = epoch + 1, 0


def iterate_batches(
    cache: Sequences, cfg: TrainConfig, start_epoch: int, start_batch: int
) -> Iterator[tuple[int, int, TrainBatch]]:
    """``(epoch, batch index, whole global batch)`` from ``(start_epoch, start_batch)`` on."""
    for sh in iterate_shards(cache, cfg, start_epoch, start_batch):
        yield sh.epoch, sh.batch, sh.data


def check_sequences(
    cfg: TrainConfig,
    cache: Sequences,
    online: OnlineHiddenStates | None,
    device: torch.device,
    layer_ids: tuple[int, ...],
    target_name: str | None = None,
) -> None:
    """Refuse sequences that do not fit ``data.hidden_states``: ``cache`` / ``sglang`` need
    a ``HiddenCache`` of ``layer_ids`` (of ``target_name``, where its manifest names the
    target) and no online target; ``online`` needs ``ResponseSequences`` and an
    ``OnlineHiddenStates`` of ``layer_ids`` on ``device``."""
    if cfg.data.hidden_states == "online":
        if online is None or cache.has_hidden_states:
            raise ValueError(
                "data.hidden_states is 'online': the trainer needs the responses "
                "(ResponseSequences) and the frozen target (OnlineHiddenStates), got "
                f"{type(cache).__name__} and {type(online).__name__}"
            )
        if online.device != device:
            raise ValueError(
                f"the online target is on {online.device} but run.device is "
                f"{device}; build OnlineHiddenStates on run.device"
            )
        if online.layer_ids != tuple(layer_ids):
            raise ValueError(
                f"the online target gives layers {online.layer_ids} but this config "
                f"uses {layer_ids} (target.layer_ids)"
            )
    else:
        if online is not None or not cache.has_hidden_states:
            raise ValueError(
                "data.hidden_states is 'cache': the trainer reads a HiddenCache and runs "
                f"no target, got {type(cache).__name__} and {type(online).__name__}; "
                "set data.hidden_states: online to run the target while training"
            )
        if tuple(cache.layer_ids) != tuple(layer_ids):
            raise ValueError(
                f"the hidden cache holds target layers {cache.layer_ids} but this config "
                f"uses {layer_ids}; set target.layer_ids to match or regenerate the cache"
            )
        cached = getattr(cache, "manifest", {}).get("target")
        if cached is not None and target_name is not None and cached != target_name:
            raise ValueError(
                f"the hidden cache in {cfg.data.dir} holds the states of target {cached!r} but "
                f"target.name is {target_name!r}; point target.name at that model or data.dir "
                "at a cache of this one"
            )
