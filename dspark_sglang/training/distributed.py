"""Devices and several training processes (``torchrun``) for the drafter trainer.

One process is the default and needs nothing from this module but ``resolve_device``.
Under ``torchrun`` (``WORLD_SIZE > 1`` in the environment) every process runs the same
trainer on its share of the *same global batch*:

* the batch plan (sequence order, anchors, packing) is a pure function of
  ``(run.seed, epoch)`` and is computed identically on every rank; ``shard_batch``
  splits each global batch's sequences between the ranks deterministically, so the data
  order depends on the global step only and a checkpoint resumes at any world size;
* the loss is a weighted mean over the valid block slots of the *global* batch: every
  rank all-reduces the denominators (``all_reduce_sum``) and returns its share of the
  numerator, so the shares sum to the one-process loss; DDP averages gradients over the
  ranks, so the trainer multiplies its share by the world size and the averaged gradient
  is the gradient of the global loss (a test compares against one process);
* the MoE load-balancing loss uses the global expert counts and router-probability
  sums the same way (``trainer.balance_loss``);
* rank 0 alone writes checkpoints, logs and plots; the others wait at a barrier.

Two ways to hold the drafter (``run.parallel``): ``ddp`` (``wrap_ddp``) keeps a full
copy, its gradients and its AdamW state on every rank and all-reduces the gradients;
``fsdp`` (``wrap_fsdp``, torch's FSDP2) shards every trainable parameter over the ranks
(dim 0), gathers a block's weights just before it runs and reduce-scatters its gradients,
so each rank holds ``1/world_size`` of the weights, gradients and optimizer state. Both
average the gradients over the ranks, so the loss scaling above is the same. FSDP's
parameters are DTensors: the optimizer must be built *after* ``wrap_fsdp`` (it replaces
the module's parameters), and checkpoints go through ``full_state`` /
``full_optimizer_state`` (gathered on every rank, written by rank 0 in the one-process
format) and back through ``shard_optimizer_state``, so a checkpoint resumes at any world
size under either mode. Frozen parameters (the target's embedding and LM head an EAGLE3
drafter registers) are left out of the shards and stay whole on every rank.

Backends: ``gloo`` on CPU, ``nccl`` on CUDA. ``init_distributed`` is a no-op (one
process, rank 0) when ``WORLD_SIZE`` is unset or 1.
"""

from __future__ import annotations

import datetime
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import nn


@dataclass(frozen=True)
class DistContext:
    """This process's place in the run: rank, world size, local rank and device."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))

    @property
    def enabled(self) -> bool:
        """More than one process (collectives run; otherwise they are no-ops)."""
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        """Rank 0: the process that writes checkpoints, logs and plots."""
        return self.rank == 0


def _env_int(name: str, default: int | None = None) -> int:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        if default is None:
            raise ValueError(
                f"{name} is not set: start several training processes with torchrun "
                "(it sets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT)"
            )
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not an integer (set by torchrun)") from None
    if value < 0:
        raise ValueError(f"{name}={value} must be >= 0")
    return value


def world_from_env() -> tuple[int, int, int]:
    """``(rank, world_size, local_rank)`` from torchrun's variables (``(0, 1, 0)`` if unset)."""
    world = _env_int("WORLD_SIZE", 1)
    if world < 1:
        raise ValueError(f"WORLD_SIZE={world} must be >= 1")
    if world == 1:
        return 0, 1, 0
    rank = _env_int("RANK")
    if rank >= world:
        raise ValueError(f"RANK={rank} must be < WORLD_SIZE={world}")
    return rank, world, _env_int("LOCAL_RANK", rank)


def resolve_device(
    spec: str, local_rank: int | None = None, world_size: int | None = None
) -> torch.device:
    """The ``torch.device`` that ``run.device`` names on this machine, checked.

    ``cpu``; ``cuda`` (this process's GPU: ``cuda:LOCAL_RANK`` under torchrun, else
    ``cuda:0``); ``cuda:N`` (one process only: with several, each takes its LOCAL_RANK).
    Raises ``ValueError`` naming ``run.device`` when CUDA is asked for and absent.
    """
    if local_rank is None or world_size is None:
        _, env_world, env_local = world_from_env()
        local_rank = env_local if local_rank is None else local_rank
        world_size = env_world if world_size is None else world_size
    if spec == "cpu":
        return torch.device("cpu")
    if spec != "cuda" and not (spec.startswith("cuda:") and spec[5:].isdigit()):
        raise ValueError(f"run.device must be 'cpu', 'cuda' or 'cuda:N', got {spec!r}")
    if not torch.cuda.is_available():
        raise ValueError(
            f"run.device={spec!r} but CUDA is not available here (torch {torch.__version__}, "
            "torch.cuda.is_available() is False); use run.device: cpu (or --device cpu), "
            "or install a CUDA build of torch on a machine with a GPU"
        )
    count = torch.cuda.device_count()
    if spec == "cuda":
        index = local_rank if world_size > 1 else 0
    else:
        index = int(spec[5:])
        if world_size > 1:
            raise ValueError(
                f"run.device={spec!r} names one GPU but {world_size} processes are running; "
                "use run.device: cuda (each process takes cuda:LOCAL_RANK)"
            )
    if index >= count:
        raise ValueError(
            f"run.device={spec!r} needs GPU {index} but this machine has {count} visible "
            "GPU(s) (CUDA_VISIBLE_DEVICES); lower --nproc-per-node or the index"
        )
    return torch.device("cuda", index)


def init_distributed(
    device: str = "cpu",
    store: dist.Store | None = None,
    timeout_s: float = 1800.0,
) -> DistContext:
    """Join the torchrun process group (or reuse one already initialised) on ``device``.

    With ``WORLD_SIZE`` unset or 1 (and no group initialised) nothing is initialised:
    the context says rank 0 of 1. ``store`` replaces the ``env://`` rendezvous
    (MASTER_ADDR/MASTER_PORT), e.g. a client of a TCPStore bound to 127.0.0.1 in tests.
    """
    if dist.is_available() and dist.is_initialized():
        rank, world = dist.get_rank(), dist.get_world_size()
        local = _env_int("LOCAL_RANK", rank) if world > 1 else 0
        return DistContext(rank, world, local, resolve_device(device, local, world))
    rank, world, local = world_from_env()
    dev = resolve_device(device, local, world)
    if world == 1:
        return DistContext(device=dev)
    if not dist.is_available():
        raise RuntimeError("this torch build has no torch.distributed; run one process")
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    backend = "nccl" if dev.type == "cuda" else "gloo"
    kwargs: dict[str, object] = {
        "backend": backend,
        "rank": rank,
        "world_size": world,
        "timeout": datetime.timedelta(seconds=timeout_s),
    }
    if store is not None:
        kwargs["store"] = store
    else:
        kwargs["init_method"] = "env://"
    dist.init_process_group(**kwargs)  # type: ignore[arg-type]
    return DistContext(rank, world, local, dev)


def shutdown() -> None:
    """Leave the process group if one is initialised (end of a torchrun job)."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def all_reduce_sum(tensor: torch.Tensor, ctx: DistContext) -> torch.Tensor:
    """``tensor`` summed over the ranks, in place (unchanged with one process).

    Used for non-differentiable statistics only (denominators, expert counts, logged
    numbers); gradients are reduced by DDP.
    """
    if ctx.enabled:
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return tensor


def barrier(ctx: DistContext) -> None:
    if ctx.enabled:
        if ctx.device.type == "cuda":
            dist.barrier(device_ids=[ctx.device.index])
        else:
            dist.barrier()


def shard_batch(
    indices: Sequence[int], seq_lens: Sequence[int], world_size: int, rank: int
) -> list[int]:
    """Rank ``rank``'s sequences of one global batch (a deterministic partition).

    Longest sequence first onto the rank with the fewest tokens so far (ties: the
    lower rank, then the earlier position in the batch); each rank's list keeps the
    batch's order. Every index goes to exactly one rank; a rank gets none when the
    batch has fewer sequences than ranks.
    """
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is not in [0, {world_size})")
    if world_size == 1:
        return list(indices)
    load = [0] * world_size
    owner: dict[int, int] = {}
    by_length = sorted(range(len(indices)), key=lambda j: (-int(seq_lens[indices[j]]), j))
    for j in by_length:
        r = min(range(world_size), key=lambda q: (load[q], q))
        owner[j] = r
        load[r] += int(seq_lens[indices[j]])
    return [indices[j] for j in range(len(indices)) if owner[j] == rank]


def wrap_ddp(module: nn.Module, ctx: DistContext) -> nn.Module:
    """``module`` under DistributedDataParallel (itself with one process).

    Parameters are broadcast from rank 0 at construction, so every rank starts from
    rank 0's weights. ``static_graph``: the drafter's step runs the same modules every
    time (a rank with an empty share runs them on a zero-weight batch), so DDP learns
    once which parameters get gradients; a parameter that never gets one would make the
    default setting wait for it forever, and ``find_unused_parameters`` would search the
    autograd graph every step.
    """
    if not ctx.enabled:
        return module
    from torch.nn.parallel import DistributedDataParallel

    return DistributedDataParallel(
        module,
        device_ids=[ctx.device.index] if ctx.device.type == "cuda" else None,
        static_graph=True,
    )


def wrap_fsdp(module: nn.Module, ctx: DistContext, blocks: Iterable[nn.Module] = ()) -> nn.Module:
    """``module`` sharded with FSDP2 over all ranks (itself, untouched, with one process).

    Each of ``blocks`` (modules whose own ``forward`` runs, e.g. decoder layers) becomes
    its own shard group, gathered only while it runs; ``module`` (whose ``forward`` is the
    whole step) holds the rest. Parameters that need no gradient are ignored: they stay
    ordinary tensors, whole on every rank. Trainable parameters and buffers are first
    broadcast from rank 0, so every rank shards the same weights (as DDP starts from rank
    0's). Build the optimizer from the module's parameters *after* this call.
    """
    if not ctx.enabled:
        return module
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    with torch.no_grad():
        for t in [p for p in module.parameters() if p.requires_grad] + list(module.buffers()):
            dist.broadcast(t, src=0)
    frozen = {p for p in module.parameters() if not p.requires_grad}
    mesh = init_device_mesh(ctx.device.type, (ctx.world_size,))
    for block in blocks:
        fully_shard(block, mesh=mesh, ignored_params=frozen)
    fully_shard(module, mesh=mesh, ignored_params=frozen)
    return module


def full_tensor(t: torch.Tensor) -> torch.Tensor:
    """The whole tensor: a DTensor's shards gathered (a collective: every rank calls it in
    the same order), any other tensor itself."""
    from torch.distributed.tensor import DTensor

    return t.full_tensor() if isinstance(t, DTensor) else t


def full_state(state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A module's ``state_dict()`` with every sharded tensor gathered whole, on the CPU.

    Collective under FSDP (every rank calls it; the order is the state dict's, the same on
    every rank); the result is what one process's ``state_dict()`` holds.
    """
    return {k: full_tensor(v).detach().cpu() for k, v in state.items()}


def full_optimizer_state(opt: torch.optim.Optimizer) -> dict[str, Any]:
    """``opt.state_dict()`` with its sharded moments gathered whole, on the CPU: the same
    parameter indices, groups and shapes as a one-process optimizer's (collective)."""
    sd = opt.state_dict()
    state = {
        i: {k: full_tensor(v).detach().cpu() if torch.is_tensor(v) else v for k, v in s.items()}
        for i, s in sorted(sd["state"].items())
    }
    return {"state": state, "param_groups": sd["param_groups"]}


def shard_optimizer_state(opt: torch.optim.Optimizer, full: Mapping[str, Any]) -> dict[str, Any]:
    """A one-process optimizer state (``full``) cut to this rank's shards of ``opt``'s
    parameters, for ``opt.load_state_dict``. Every rank holds ``full`` (read from the
    checkpoint), so each takes its own slice without communication; a tensor of a
    parameter's full shape is sharded like the parameter, anything else (``step``) kept."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    params = [p for g in opt.param_groups for p in g["params"]]
    state: dict[int, dict[str, Any]] = {}
    for i, s in full["state"].items():
        p = params[int(i)]
        out = {}
        for k, v in s.items():
            if isinstance(p, DTensor) and torch.is_tensor(v) and v.shape == p.shape:
                v = distribute_tensor(
                    v.to(p.device_mesh.device_type), p.device_mesh, p.placements, src_data_rank=None
                )
            out[k] = v
        state[int(i)] = out
    return {"state": state, "param_groups": full["param_groups"]}
