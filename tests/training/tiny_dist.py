"""Several gloo training processes on 127.0.0.1 for the distributed tests.

A plain module (not ``conftest``) so spawned children can import the task functions by
name. The parent owns the rendezvous: a TCPStore server on a socket it binds to
127.0.0.1 itself (a random free port; a TCPStore would otherwise listen on every
interface), and the children join as its clients with ``GLOO_SOCKET_IFNAME=lo`` so
gloo's own connections stay on the loopback interface too.
"""

from __future__ import annotations

import datetime
import os
import socket
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from tiny_training_target import TINY_LAYER_IDS, tiny_llama
from torch.distributed.tensor import DTensor

from dspark_sglang.model import TargetSpec
from dspark_sglang.training.config import TrainConfig
from dspark_sglang.training.dataset import HiddenCache, ResponseSequences
from dspark_sglang.training.distributed import DistContext, init_distributed, shutdown
from dspark_sglang.training.online import OnlineHiddenStates
from dspark_sglang.training.trainer import Trainer

TIMEOUT_S = 120


def tiny_cfg(kind: str, data_dir: Path, out_dir: Path, steps: int, **sections: Any) -> TrainConfig:
    """The trainer tests' tiny config (1-layer MoE drafters, block size 4)."""
    model: dict[str, object] = {}
    if kind in ("dspark", "dflash"):
        model = {
            "num_hidden_layers": 1,
            "num_experts": 4,
            "num_experts_per_tok": 2,
            "sliding_window": 16,
        }
        if kind == "dspark":
            model["markov_rank"] = 16
    raw: dict[str, Any] = {
        "name": f"tiny_{kind}",
        "target": {"name": "tiny", "layer_ids": list(TINY_LAYER_IDS)},
        "data": {"dir": str(data_dir)},
        "drafter": {"kind": kind, "block_size": 4, "model": model},
        "anchors": {"anchors_per_seq": 8, "max_anchors_per_batch": 24, "max_tokens_per_batch": 256},
        "optim": {"lr": 3e-3, "warmup_steps": 2, "max_steps": steps},
        "run": {"out_dir": str(out_dir), "checkpoint_every": 5, "log_every": 1, "threads": 1},
    }
    for key, values in sections.items():
        raw[key] = {**raw.get(key, {}), **values}
    return TrainConfig.from_dict(raw)


#: ``tiny_trainer``'s default for ``online``: decided by ``data.hidden_states``.
FROM_CONFIG: Any = object()


def tiny_trainer(
    cfg: TrainConfig, target: Any = None, online: OnlineHiddenStates | None = FROM_CONFIG
) -> Trainer:
    """A trainer on the tiny target (``target``, default ``tiny_llama()``): on its hidden
    cache, or on its responses with ``online`` computing the states. By default ``online``
    follows ``data.hidden_states`` (the target on ``cpu``); passed explicitly, it alone
    decides the source, so a test can hand the trainer a mismatched pair."""
    target = tiny_llama() if target is None else target
    spec = TargetSpec.from_hf_config(target.config, name="tiny")
    if online is FROM_CONFIG:
        online = None
        if cfg.data.hidden_states == "online":
            online = OnlineHiddenStates(target, TINY_LAYER_IDS, "cpu")
    sequences = ResponseSequences(cfg.data.dir) if online else HiddenCache(cfg.data.dir)
    return Trainer(
        cfg,
        sequences,
        spec,
        target.config,
        target.get_input_embeddings(),
        target.get_output_embeddings(),
        mask_token_id=3,
        online=online,
    )


# --------------------------------------------------------------------------- launching


def _entry(rank: int, world: int, port: int, fn: Callable[..., None], args: tuple) -> None:
    os.environ.update(
        RANK=str(rank),
        WORLD_SIZE=str(world),
        LOCAL_RANK=str(rank),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        GLOO_SOCKET_IFNAME="lo",
    )
    torch.set_num_threads(1)
    store = dist.TCPStore(
        "127.0.0.1", port, world, False, timeout=datetime.timedelta(seconds=TIMEOUT_S)
    )
    ctx = init_distributed("cpu", store=store, timeout_s=TIMEOUT_S)
    assert (ctx.rank, ctx.world_size) == (rank, world)
    try:
        fn(ctx, *args)
        if dist.is_initialized():  # a CLI task leaves the group itself, as under torchrun
            dist.barrier()  # every rank is done before any leaves the group
    except BaseException:
        shutdown()
        raise
    shutdown()
    # The task's results are written; skip the interpreter's teardown. Destroying gloo's
    # threads there has aborted a rank after all its work was done ("terminate called
    # without an active exception", SIGABRT) on a loaded 2-core CI machine, failing a
    # test whose results were complete; an exit without teardown cannot.
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(0)


def run_ranks(world: int, fn: Callable[..., None], *args: Any) -> None:
    """Run ``fn(ctx, *args)`` in ``world`` fresh gloo processes; raise if any fails."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    port = sock.getsockname()[1]
    fd = sock.detach()  # the store owns (and closes) the listening socket from here on
    server = dist.TCPStore(
        "127.0.0.1",
        port,
        world,
        True,
        timeout=datetime.timedelta(seconds=TIMEOUT_S),
        wait_for_workers=False,
        master_listen_fd=fd,
        use_libuv=True,
    )
    try:
        mp.start_processes(
            _entry, args=(world, port, fn, args), nprocs=world, join=True, start_method="spawn"
        )
    finally:
        del server


# --------------------------------------------------------------------------- tasks


def grads_task(ctx: DistContext, cases: list[tuple[str, dict[str, Any], int]], out: str) -> None:
    """Per case ``(name, config, global batch)``: one step on that global batch under
    ``run.parallel`` (DDP or FSDP); this rank's loss share, the global loss, the gradients
    (FSDP's shards gathered whole) and the local denominators are saved to
    ``out/{name}-rank{r}.pt``."""
    from dspark_sglang.training.distributed import all_reduce_sum, full_tensor
    from dspark_sglang.training.losses import loss_denominators
    from dspark_sglang.training.trainer import (
        backward,
        batch_loss,
        build_drafter,
        iterate_shards,
        parallel_step,
    )

    for name, cfg_raw, global_batch in cases:
        cfg = TrainConfig.from_dict(cfg_raw)
        tr = tiny_trainer(cfg)
        drafter = build_drafter(cfg, tr.spec, tr.hf_config, tr.embed_tokens, tr.lm_head, 3)
        drafter.train()
        model = parallel_step(drafter, ctx, cfg.run.parallel)
        sh = next(iterate_shards(tr.cache, cfg, 0, global_batch, ctx.rank, ctx.world_size))
        assert sh.batch == global_batch
        data = tr.device_batch(sh.data)  # online: this rank's target forward on its share
        loss, _ = batch_loss(model, tr.lm_head, data, cfg, ctx)
        backward(loss, ctx)
        sel = data.anchor_mask
        torch.save(
            {
                "share": float(loss.detach()),
                "loss": float(all_reduce_sum(loss.detach().clone(), ctx)),
                "local_den": loss_denominators(data.valid[sel], cfg.loss.gamma),
                "anchors": data.num_anchors,
                "sharded": {n for n, p in drafter.named_parameters() if isinstance(p, DTensor)},
                "trainable": {n for n, p in drafter.named_parameters() if p.requires_grad},
                "grads": {
                    n: full_tensor(p.grad).clone()
                    for n, p in drafter.named_parameters()
                    if p.requires_grad and p.grad is not None
                },
            },
            Path(out) / f"{name}-rank{ctx.rank}.pt",
        )


def train_task(
    ctx: DistContext, cfg_raw: dict[str, Any], resume: bool, stop_at: int | None
) -> None:
    cfg = TrainConfig.from_dict(cfg_raw)
    tiny_trainer(cfg).train(resume=resume, progress=False, stop_at=stop_at)


def cli_task(ctx: DistContext, argv: list[str]) -> None:
    """``dspark-sglang train ...`` in this rank, as torchrun would start it."""
    from dspark_sglang.cli import main

    assert main(argv) == 0
