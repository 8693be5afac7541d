"""The drafter training loop (DSpark, DFlash-style and EAGLE3-style drafters alike).

One step: pack sequences with their sampled anchors into a batch, run
the drafter on every anchor's block (teacher forcing), apply the frozen LM
head to the *target's* last hidden states at the same positions to get
the target distributions, and minimise ``losses.dspark_loss`` (+ a small MoE
load-balancing term over the real anchors' rows, ``balance_loss``). The target,
its embedding and its LM head are frozen; only the drafter's own parameters are
in the optimizer.

Hidden states come from the cache (``data.hidden_states: cache``, ``HiddenCache``) or
from the frozen target itself, run on each batch once it is on ``run.device``
(``online``: ``ResponseSequences`` + ``OnlineHiddenStates``, ``Trainer.device_batch``).
The batch plan is the same either way.

Reproducibility is structural: the batch plan of epoch ``e`` (sequence
order, anchors, packing) is a pure function of ``(run.seed, e)``, so a resumed
run rebuilds the same plan and skips the batches already done; the checkpoint
holds drafter weights (through the drafter's own save function), optimizer,
scheduler and RNG states, and the position in the plan. Resumed and
uninterrupted runs therefore produce identical weights (a test checks bitwise
equality on CPU with fixed threads).

Devices and processes: ``run.device`` (cpu, cuda, cuda:N) holds the frozen
embedding / LM head, the drafter and every tensor of a step; ``run.autocast``
applies on that device type; a background thread prepares the next
``run.prefetch`` batches. Under ``torchrun`` each process trains on its share of
every global batch under DDP or, with ``run.parallel: fsdp``, with the drafter sharded
over the processes (FSDP2), the loss and the MoE balancing statistics normalised over
the global batch (``training/distributed.py``); rank 0 writes checkpoints (one format
for every mode and world size) and logs, and a checkpoint resumes at any world size.
"""

from __future__ import annotations

import copy
import json
import math
import random
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from tqdm.auto import tqdm

from dspark_sglang.model import (
    DraftBlock,
    DSparkConfig,
    DSparkDrafter,
    TargetSpec,
    default_target_layer_ids,
    load_drafter,
    markov_logits,
    save_drafter,
)
from dspark_sglang.model.ar_drafter import (
    ARDrafter,
    ARDrafterConfig,
    load_ar_drafter,
    save_ar_drafter,
)
from dspark_sglang.model.moe import MoEFFN
from dspark_sglang.model.vocab import DRAFT_VOCAB_BUFFER
from dspark_sglang.training.anchors import pack_batches, sample_anchors
from dspark_sglang.training.config import TrainConfig
from dspark_sglang.training.dataset import (
    HiddenCache,
    Prefetcher,
    ResponseSequences,
    TrainBatch,
    make_batch,
)
from dspark_sglang.training.distributed import (
    DistContext,
    all_reduce_sum,
    barrier,
    full_optimizer_state,
    full_state,
    full_tensor,
    init_distributed,
    resolve_device,
    shard_batch,
    shard_optimizer_state,
    wrap_ddp,
    wrap_fsdp,
)
from dspark_sglang.training.losses import LossTerms, dspark_loss, loss_denominators
from dspark_sglang.training.online import OnlineHiddenStates
from dspark_sglang.training.token_map import (
    REPORT_FILE,
    build_draft_vocab,
    coverage_report,
    response_token_counts,
)

Drafter = DSparkDrafter | ARDrafter
#: Where a run's sequences come from: the hidden cache, or the responses (online mode).
Sequences = HiddenCache | ResponseSequences
STATE_FILE = "train_state.pt"
DRAFTER_DIR = "drafter"


# --------------------------------------------------------------------------- drafters


def resolve_layer_ids(cfg: TrainConfig, num_layers: int) -> tuple[int, ...]:
    """The target layers every drafter of this config reads (explicit or the default 5)."""
    if cfg.target.layer_ids is not None:
        return cfg.target.layer_ids
    return default_target_layer_ids(num_layers, n=5)


def build_drafter(
    cfg: TrainConfig,
    spec: TargetSpec,
    hf_config: Any,
    embed_tokens: nn.Embedding,
    lm_head: nn.Linear,
    mask_token_id: int,
) -> Drafter:
    """A freshly initialised drafter of ``cfg.drafter.kind`` for the target ``spec``."""
    torch.manual_seed(cfg.run.seed)
    layer_ids = resolve_layer_ids(cfg, spec.num_layers)
    overrides = dict(cfg.drafter.model)
    if cfg.drafter.kind == "eagle3":
        base: dict[str, Any] = {
            "hidden_size": spec.hidden_size,
            "vocab_size": spec.vocab_size,
            "target_layer_ids": layer_ids,
            "num_attention_heads": spec.num_attention_heads,
            "num_key_value_heads": spec.num_key_value_heads,
            "intermediate_size": int(getattr(hf_config, "intermediate_size", 4 * spec.hidden_size)),
            "rope_theta": spec.rope_theta,
            "rms_norm_eps": spec.rms_norm_eps,
            "block_size": cfg.drafter.block_size,
        }
        base.update(overrides)
        return ARDrafter(ARDrafterConfig.from_dict(base), embed_tokens, lm_head)
    if cfg.drafter.kind == "dflash":
        overrides.setdefault("markov_head_type", "none")
        overrides.setdefault("enable_confidence_head", False)
        overrides.setdefault("confidence_head_with_markov", False)
    dcfg = DSparkConfig.for_target(
        spec,
        mask_token_id=mask_token_id,
        block_size=cfg.drafter.block_size,
        target_layer_ids=layer_ids,
        **overrides,
    )
    return DSparkDrafter(dcfg, embed_tokens, lm_head)


def save_any_drafter(
    drafter: Drafter, path: Path, state: dict[str, torch.Tensor] | None = None
) -> None:
    """Save either drafter kind; ``state`` (whole tensors) replaces its ``state_dict()``."""
    if isinstance(drafter, ARDrafter):
        save_ar_drafter(drafter, path, state)
    else:
        save_drafter(drafter, path, state=state)


def load_any_drafter(
    path: Path, kind: str, spec: TargetSpec, embed_tokens: nn.Embedding, lm_head: nn.Linear
) -> Drafter:
    if kind == "eagle3":
        return load_ar_drafter(path, embed_tokens, lm_head)
    return load_drafter(path, spec, embed_tokens, lm_head)


@dataclass(frozen=True)
class DraftOutputs:
    """Per valid anchor ``N``: logits ``[N, B, V]`` (after any Markov bias), confidence
    logits ``[N, B]`` or None, and the drafter's own MoE auxiliary loss (scalar, over every
    block row including padding anchors; the training loss uses ``balance_loss``)."""

    logits: torch.Tensor
    conf_logits: torch.Tensor | None
    aux_loss: torch.Tensor


def draft_outputs(drafter: Drafter, batch: TrainBatch) -> DraftOutputs:
    """Teacher-forced drafter outputs at the batch's real (non-padding) anchors only.

    The LM head runs on ``N x B`` rows, never on the whole sequence.
    """
    sel = batch.anchor_mask
    if isinstance(drafter, ARDrafter):
        hidden = drafter.forward_train(batch.context_hidden, batch.tokens, batch.anchors)[sel]
        logits = drafter.lm_head(hidden).float()
        return DraftOutputs(logits, None, logits.new_zeros(()))
    T = batch.tokens.shape[1]
    positions = torch.arange(T, device=batch.tokens.device)
    ctx_valid = positions.unsqueeze(0) < batch.seq_lens.unsqueeze(1)
    ah = drafter.forward_anchors(
        batch.context_hidden, batch.anchors, batch.anchor_tokens, ctx_valid
    )
    hidden = ah.hidden[sel]
    block = DraftBlock(
        hidden=hidden, base_logits=drafter.compute_base_logits(hidden), aux_loss=ah.aux_loss
    )
    ml = markov_logits(drafter, block, batch.prev_tokens[sel])
    return DraftOutputs(ml.logits, ml.confidence_logits, ah.aux_loss)


class DraftStep(nn.Module):
    """The drafter's whole training forward as one ``forward`` (what DDP wraps and FSDP
    shards).

    DDP synchronises gradients of what runs through its ``forward`` (FSDP gathers the
    weights of what runs there); the trainer calls several drafter entry points
    (``forward_anchors``, the heads), so they run here. The MoE routers' logits are
    captured with forward hooks on their ``gate`` for ``balance_loss``.
    """

    def __init__(self, drafter: Drafter) -> None:
        super().__init__()
        self.drafter = drafter
        self._gates = [(m.gate, m.top_k) for m in drafter.modules() if isinstance(m, MoEFFN)]

    def forward(
        self, batch: TrainBatch
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor, tuple[torch.Tensor, ...]]:
        captured: list[torch.Tensor] = []
        handles = [
            gate.register_forward_hook(lambda _m, _a, out: captured.append(out))
            for gate, _ in self._gates
        ]
        try:
            out = draft_outputs(self.drafter, batch)
        finally:
            for h in handles:
                h.remove()
        return out.logits, out.conf_logits, out.aux_loss, tuple(captured)

    def router_top_k(self) -> list[int]:
        return [k for _, k in self._gates]


def parallel_step(drafter: Drafter, ctx: DistContext, parallel: str) -> nn.Module:
    """``DraftStep(drafter)`` ready for ``ctx``'s processes: under DDP (``parallel="ddp"``)
    or sharded with FSDP2 (``"fsdp"``: each DSpark decoder layer is its own shard group,
    the rest of the drafter the step's). With one process, the step itself.

    The drafter's frozen target modules are not sharded: a DSpark drafter does not
    register them (no parameters of its own), an EAGLE3 one does and they are ignored as
    frozen. After ``"fsdp"`` the drafter's parameters are new (DTensor) objects: build the
    optimizer afterwards.
    """
    step = DraftStep(drafter)
    if parallel == "fsdp":
        blocks = list(drafter.layers) if isinstance(drafter, DSparkDrafter) else []
        return wrap_fsdp(step, ctx, blocks)
    if parallel != "ddp":
        raise ValueError(f"run.parallel must be 'ddp' or 'fsdp', got {parallel!r}")
    return wrap_ddp(step, ctx)


def balance_loss(
    router_logits: tuple[torch.Tensor, ...] | list[torch.Tensor],
    top_k: list[int],
    row_mask: torch.Tensor,
    ctx: DistContext | None = None,
) -> torch.Tensor:
    """MoE load-balancing loss over the real (non-padding) rows of the global batch.

    Per MoE layer, the Switch loss ``E * sum_e f_e * P_e`` (``model/moe.py``) with
    ``f_e`` the share of routing slots that went to expert ``e`` and ``P_e`` the mean
    router probability, both over the rows ``row_mask`` marks (rows of padding anchors
    are left out), summed over layers. With several processes the expert counts and
    the row count are all-reduced first and this process returns its share
    ``E * sum_e f_e * (sum of its rows' p_e) / N_global``: the shares sum to the loss
    of the whole global batch, with the same gradient (``f`` carries none).
    """
    device = row_mask.device
    if len(router_logits) != len(top_k):
        raise RuntimeError(
            f"captured {len(router_logits)} router calls for {len(top_k)} MoE layers; "
            "an MoE layer ran more than once per step"
        )
    if not router_logits:
        return torch.zeros((), device=device)
    m = row_mask.reshape(-1).to(torch.float32)
    probs_l, local = [], [m.sum().reshape(1)]
    for logits, k in zip(router_logits, top_k, strict=True):
        if logits.shape[0] != m.numel():
            raise RuntimeError(
                f"an MoE router saw {logits.shape[0]} rows but the batch has {m.numel()} "
                "block rows (S * A * B); the drafter's row layout changed"
            )
        probs = torch.softmax(logits.float(), dim=-1)  # as model/moe.py's route()
        experts = torch.topk(probs, k, dim=-1).indices
        counts = torch.zeros(probs.shape[-1], device=device, dtype=torch.float32)
        counts.index_add_(0, experts.reshape(-1), m.repeat_interleave(k))
        probs_l.append(probs)
        local.append(counts)
    stats = torch.cat(local).detach()
    if ctx is not None:
        all_reduce_sum(stats, ctx)
    n = stats[0].clamp_min(1.0)
    total = torch.zeros((), device=device)
    offset = 1
    for probs, k in zip(probs_l, top_k, strict=True):
        e = probs.shape[-1]
        f = stats[offset : offset + e] / (n * k)
        offset += e
        p_share = (probs * m[:, None]).sum(0) / n
        total = total + e * (f * p_share).sum()
    return total


def batch_loss(
    drafter: Drafter | nn.Module,
    lm_head: nn.Linear,
    batch: TrainBatch,
    cfg: TrainConfig,
    ctx: DistContext | None = None,
) -> tuple[torch.Tensor, LossTerms]:
    """Total training loss of one batch (DSpark loss + weighted MoE aux loss) and its parts.

    ``drafter`` is a drafter, its ``DraftStep`` (possibly FSDP-sharded) or the DDP-wrapped
    ``DraftStep``. With ``ctx`` of several processes, ``batch`` is this process's share of
    a global batch and the result is this share of the global loss (the denominators are
    all-reduced): the shares of all processes sum to the loss one process computes on the
    whole batch.
    """
    step = drafter if isinstance(drafter, DraftStep) else getattr(drafter, "module", None)
    if not isinstance(step, DraftStep):
        step = DraftStep(drafter)  # type: ignore[arg-type]
        drafter = step
    device_type = batch.tokens.device.type
    bf16 = cfg.run.autocast == "bfloat16"
    with torch.autocast(device_type, dtype=torch.bfloat16, enabled=bf16):
        logits, conf, _, router = drafter(batch)
        sel = batch.anchor_mask
        with torch.no_grad():
            target_logits = lm_head(batch.target_last[sel]).float()
    conf = None if conf is None else conf.float()
    inner = step.drafter
    vocab_ids = None
    if isinstance(inner, DSparkDrafter) and inner.config.draft_vocab_size is not None:
        vocab_ids = getattr(inner, DRAFT_VOCAB_BUFFER)
    denominators = None
    if ctx is not None and ctx.enabled:
        denominators = all_reduce_sum(loss_denominators(batch.valid[sel], cfg.loss.gamma), ctx)
    # The loss itself (softmaxes, L1 over the vocabulary, BCE) always runs in float32.
    terms = dspark_loss(
        logits.float(),
        target_logits,
        batch.labels[sel],
        batch.valid[sel],
        conf,
        cfg.loss,
        denominators=denominators,
        draft_vocab_ids=vocab_ids,
    )
    rows = batch.anchor_mask.unsqueeze(-1).expand(*batch.anchor_mask.shape, cfg.drafter.block_size)
    aux = balance_loss(router, step.router_top_k(), rows, ctx)
    return terms.total + cfg.optim.aux_loss_weight * aux, terms


def backward(loss: torch.Tensor, ctx: DistContext | None = None) -> None:
    """Gradients of the global loss from this process's share of it.

    DDP and FSDP average gradients over the ranks; each ``batch_loss`` is a share of the
    global mean (the shares sum to it), so each rank back-propagates ``world_size`` times
    its share and the average is the gradient of the sum.
    """
    (loss * ctx.world_size if ctx is not None and ctx.enabled else loss).backward()


# --------------------------------------------------------------------------- schedule / plan


def lr_lambda(cfg: TrainConfig) -> Any:
    """Linear warm-up to 1, then cosine from 1 to ``min_lr_ratio`` at ``max_steps``."""
    o = cfg.optim

    def f(step: int) -> float:
        if step < o.warmup_steps:
            return (step + 1) / o.warmup_steps
        span = max(1, o.max_steps - o.warmup_steps)
        progress = min(1.0, (step - o.warmup_steps) / span)
        return o.min_lr_ratio + (1 - o.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))

    return f


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


# --------------------------------------------------------------------------- checkpoints


def latest_checkpoint(out_dir: Path) -> Path | None:
    ckpts = sorted((out_dir / "checkpoints").glob("step-*"))
    ckpts = [c for c in ckpts if (c / STATE_FILE).exists()]
    return ckpts[-1] if ckpts else None


def init_checkpoint(cfg: TrainConfig) -> Path:
    """The checkpoint ``run.init_from`` names, checked against this config.

    Only the schedule and the data may differ from the source run: a different drafter
    would load weights into the wrong shapes (or silently keep the source's model).
    """
    assert cfg.run.init_from is not None
    src = Path(cfg.run.init_from)
    ckpt = src if (src / STATE_FILE).exists() else latest_checkpoint(src)
    if ckpt is None:
        raise FileNotFoundError(
            f"run.init_from={src} is neither a checkpoint (with {STATE_FILE}) nor a run "
            "directory with checkpoints/step-*; point it at a finished training run"
        )
    src_cfg_path = ckpt.parent.parent / "config.json"
    if src_cfg_path.exists():
        src_cfg = json.loads(src_cfg_path.read_text())
        this_cfg = json.loads(json.dumps(cfg.to_dict()))  # as config.json stores it
        for key in ("drafter", "target", "loss", "anchors"):
            if src_cfg.get(key) != this_cfg[key]:
                raise ValueError(
                    f"run.init_from={ckpt} was trained with a different '{key}' section "
                    f"({src_cfg_path}); only data, optim and run may change when continuing"
                )
    return ckpt


def _rng_state(device: torch.device | None = None) -> dict[str, Any]:
    """CPU torch, Python and NumPy generators, and every visible GPU's when training on CUDA."""
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "python": random.getstate(),
        "numpy": np.random.get_state(),
    }
    if device is not None and device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict[str, Any], device: torch.device | None = None) -> None:
    """Inverse of ``_rng_state``; GPU states are restored when this run is on CUDA too
    (the first ``device_count`` of them: a resume on fewer GPUs keeps those it has)."""
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    if "cuda" in state and device is not None and device.type == "cuda":
        for i, s in enumerate(state["cuda"][: torch.cuda.device_count()]):
            torch.cuda.set_rng_state(s, i)


@dataclass(frozen=True)
class TrainResult:
    out_dir: Path
    final_step: int
    final_checkpoint: Path
    steps_per_s: float
    anchors_per_s: float
    first_loss: float
    last_loss: float


class Trainer:
    """Owns one run directory: ``checkpoints/step-NNNNNN/``, ``log.jsonl``, ``loss_curves.png``.

    ``run.device`` is resolved here (an error naming it when CUDA is asked for and
    absent); the frozen embedding and LM head move there (a float32 copy when the
    target was loaded at lower precision and ``run.autocast`` is float32).

    ``cache`` is the run's sequences: a ``HiddenCache`` for ``data.hidden_states: cache``;
    ``ResponseSequences`` and ``online`` (the frozen target on ``run.device``) for
    ``online``. Any other combination is refused.
    """

    def __init__(
        self,
        cfg: TrainConfig,
        cache: Sequences,
        spec: TargetSpec,
        hf_config: Any,
        embed_tokens: nn.Embedding,
        lm_head: nn.Linear,
        mask_token_id: int,
        online: OnlineHiddenStates | None = None,
    ) -> None:
        self.cfg = cfg
        self.cache = cache
        self.spec = spec
        self.device = resolve_device(cfg.run.device)
        self.embed_tokens = _frozen_on(embed_tokens, self.device, cfg.run.autocast)
        self.lm_head = _frozen_on(lm_head, self.device, cfg.run.autocast)
        self.hf_config = hf_config
        self.mask_token_id = mask_token_id
        self.out_dir = Path(cfg.run.out_dir)
        self.online = online
        layer_ids = resolve_layer_ids(cfg, spec.num_layers)
        if cfg.data.hidden_states == "online":
            if online is None or cache.has_hidden_states:
                raise ValueError(
                    "data.hidden_states is 'online': the trainer needs the responses "
                    "(ResponseSequences) and the frozen target (OnlineHiddenStates), got "
                    f"{type(cache).__name__} and {type(online).__name__}"
                )
            if online.device != self.device:
                raise ValueError(
                    f"the online target is on {online.device} but run.device is "
                    f"{self.device}; build OnlineHiddenStates on run.device"
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

    def device_batch(self, data: TrainBatch, non_blocking: bool = False) -> TrainBatch:
        """``data`` on ``run.device``, with the target's hidden states when online."""
        batch = data.to(self.device, non_blocking=non_blocking)
        if self.online is not None:
            batch = self.online.attach(batch, self.cfg.drafter.block_size)
        return batch

    def _make_optimizer(self, drafter: Drafter) -> tuple[torch.optim.Optimizer, Any]:
        """AdamW over the *unwrapped* drafter's parameters (the same groups at any world
        size, so optimizer state moves between them): decayed matrices, undecayed
        vectors, and the Markov head at ``optim.markov_lr_scale`` times the rate.
        Under FSDP, call it after sharding: the groups then hold the sharded parameters."""
        o = self.cfg.optim
        named = [(n, p) for n, p in drafter.named_parameters() if p.requires_grad]
        markov = [p for n, p in named if n.startswith("markov_head.")]
        rest = [p for n, p in named if not n.startswith("markov_head.")]
        groups: list[dict[str, Any]] = [
            {"params": [p for p in rest if p.dim() >= 2], "weight_decay": o.weight_decay},
            {"params": [p for p in rest if p.dim() < 2], "weight_decay": 0.0},
        ]
        if markov:
            groups.append(
                {"params": markov, "weight_decay": o.weight_decay, "lr": o.lr * o.markov_lr_scale}
            )
        opt = torch.optim.AdamW(groups, lr=o.lr, betas=(o.beta1, o.beta2))
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda(self.cfg))
        return opt, sched

    def save_checkpoint(
        self,
        drafter: Drafter,
        opt: torch.optim.Optimizer,
        sched: Any,
        step: int,
        epoch: int,
        batch: int,
        world_size: int = 1,
        weights: dict[str, torch.Tensor] | None = None,
        optimizer_state: dict[str, Any] | None = None,
    ) -> Path:
        """Write ``checkpoints/step-NNNNNN`` (call on rank 0 only): the unwrapped drafter,
        optimizer, schedule, RNG states and the position in the global batch plan.

        ``weights`` and ``optimizer_state`` (``full_states``: a sharded drafter's, gathered
        whole) replace the drafter's and optimizer's own state dicts, so the files are the
        same whichever way the run was split."""
        root = self.out_dir / "checkpoints"
        final = root / f"step-{step:06d}"
        tmp = root / f".tmp-step-{step:06d}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        save_any_drafter(drafter, tmp / DRAFTER_DIR, weights)
        torch.save(
            {
                "step": step,
                "epoch": epoch,
                "batch": batch,
                "optimizer": opt.state_dict() if optimizer_state is None else optimizer_state,
                "scheduler": sched.state_dict(),
                "rng": _rng_state(self.device),
                "config": self.cfg.to_dict(),
                "world_size": world_size,  # informational: any world size may resume
            },
            tmp / STATE_FILE,
        )
        shutil.rmtree(final, ignore_errors=True)
        tmp.rename(final)
        keep = sorted(c for c in root.glob("step-*") if (c / STATE_FILE).exists())
        for old in keep[: -self.cfg.run.keep_checkpoints]:
            shutil.rmtree(old, ignore_errors=True)
        return final

    def _restore(self, ckpt: Path) -> tuple[Drafter, dict[str, Any]]:
        """A checkpoint's (whole) drafter on this device and its train state."""
        state = torch.load(ckpt / STATE_FILE, weights_only=False, map_location="cpu")
        drafter = load_any_drafter(
            ckpt / DRAFTER_DIR, self.cfg.drafter.kind, self.spec, self.embed_tokens, self.lm_head
        ).to(self.device)
        return drafter, state

    def _load_optimizer(
        self, opt: torch.optim.Optimizer, full: dict[str, Any], ctx: DistContext
    ) -> None:
        """A checkpoint's (one-process format) optimizer state into ``opt``, cut to this
        rank's shards when the drafter is sharded."""
        sharded = ctx.enabled and self.cfg.run.parallel == "fsdp"
        opt.load_state_dict(shard_optimizer_state(opt, full) if sharded else full)

    def full_states(
        self, drafter: Drafter, opt: torch.optim.Optimizer, ctx: DistContext
    ) -> tuple[dict[str, torch.Tensor] | None, dict[str, Any] | None]:
        """The drafter's weights and the optimizer state gathered whole when FSDP shards
        them (a collective: every rank calls it), else ``(None, None)`` (their own state
        dicts are already whole). The frozen target modules are left out."""
        if not (ctx.enabled and self.cfg.run.parallel == "fsdp"):
            return None, None
        frozen = {n for n, p in drafter.named_parameters() if not p.requires_grad}
        weights = {k: v for k, v in drafter.state_dict().items() if k not in frozen}
        return full_state(weights), full_optimizer_state(opt)

    def _install_draft_vocab(self, drafter: Drafter, main: bool) -> None:
        """A fresh reduced drafter gets its token map from this run's responses (a resumed
        or ``init_from`` drafter keeps its checkpoint's); rank 0 records the coverage."""
        if not isinstance(drafter, DSparkDrafter) or drafter.config.draft_vocab_size is None:
            return
        data, config = self.cfg.data.dir, drafter.config
        counts = response_token_counts(data, config.vocab_size)
        vocab = build_draft_vocab(data, config.vocab_size, config.draft_vocab_size, counts)
        drafter.set_draft_vocab(vocab)
        if main:
            self.out_dir.mkdir(parents=True, exist_ok=True)
            report = coverage_report(counts, vocab)
            (self.out_dir / REPORT_FILE).write_text(json.dumps(report, indent=2) + "\n")

    def train(
        self, resume: bool = False, progress: bool = True, stop_at: int | None = None
    ) -> TrainResult:
        """Run to ``optim.max_steps``; with ``resume`` continue from the latest checkpoint.

        ``stop_at`` ends the session early at that step (with a checkpoint) without
        changing the schedule, so a long run can be split across sessions.

        Under torchrun (or in an initialised process group) every process calls this;
        the run directory must be the same folder for all (a shared filesystem).
        """
        cfg = self.cfg
        torch.set_num_threads(cfg.run.threads)
        ctx = init_distributed(cfg.run.device)
        if ctx.device != self.device:
            raise RuntimeError(f"process device {ctx.device} != trainer device {self.device}")
        main = ctx.is_main
        if main:
            self.out_dir.mkdir(parents=True, exist_ok=True)
        barrier(ctx)
        ckpt = latest_checkpoint(self.out_dir) if resume else None
        if resume and ckpt is None:
            raise FileNotFoundError(
                f"--resume given but {self.out_dir}/checkpoints has no checkpoint"
            )
        if not resume and latest_checkpoint(self.out_dir) is not None:
            raise FileExistsError(
                f"{self.out_dir} already has checkpoints; pass --resume to continue or use a "
                "new run.out_dir"
            )
        init = init_checkpoint(cfg) if ckpt is None and cfg.run.init_from else None
        history: list[dict[str, Any]] = []
        source = ckpt if ckpt is not None else init
        state: dict[str, Any] = {}
        if source is not None:
            drafter, state = self._restore(source)
        else:
            drafter = build_drafter(
                cfg, self.spec, self.hf_config, self.embed_tokens, self.lm_head, self.mask_token_id
            ).to(self.device)
            self._install_draft_vocab(drafter, main)
        drafter.train()
        # DDP over the whole forward, or the drafter sharded (FSDP); either way the
        # optimizer is built afterwards from the unwrapped drafter's (then sharded) params.
        model = parallel_step(drafter, ctx, cfg.run.parallel)
        opt, sched = self._make_optimizer(drafter)
        if ckpt is not None:
            self._load_optimizer(opt, state["optimizer"], ctx)
            sched.load_state_dict(state["scheduler"])
            _set_rng_state(state["rng"], self.device)
            step, epoch, batch = int(state["step"]), int(state["epoch"]), int(state["batch"])
        elif init is not None:
            # Only the AdamW moments carry over; lr, betas and weight decay are this config's.
            own = [{k: v for k, v in g.items() if k != "params"} for g in opt.param_groups]
            self._load_optimizer(opt, state["optimizer"], ctx)
            for group, mine in zip(opt.param_groups, own, strict=True):
                group.update(mine)
            step = int(state["step"])
            if step >= cfg.optim.max_steps:
                raise ValueError(
                    f"run.init_from={init} is already at step {step}; set optim.max_steps "
                    f"above it (got {cfg.optim.max_steps})"
                )
            # This config's schedule from the inherited step on (a warm restart when
            # max_steps grew), and a fresh epoch: the data may not be the source's.
            sched.last_epoch = step
            for group, base, lam in zip(
                opt.param_groups, sched.base_lrs, sched.lr_lambdas, strict=True
            ):
                group["lr"] = base * lam(step)
            sched._last_lr = [g["lr"] for g in opt.param_groups]
            _set_rng_state(state["rng"], self.device)
            epoch, batch = int(state["epoch"]) + 1, 0
            history = [r for r in _read_log(init.parent.parent / "log.jsonl") if r["step"] <= step]
        else:
            torch.manual_seed(cfg.run.seed)
            step, epoch, batch = 0, 0, 0
        log_path = self.out_dir / "log.jsonl"
        if init is None:
            history = [r for r in _read_log(log_path) if r["step"] <= step]
        barrier(ctx)  # every rank has read the old log before rank 0 rewrites it
        if main:
            log_path.write_text("".join(json.dumps(r) + "\n" for r in history))
            (self.out_dir / "config.json").write_text(json.dumps(cfg.to_dict(), indent=2))

        trainable = [p for p in drafter.parameters() if p.requires_grad]
        bar = tqdm(
            total=cfg.optim.max_steps,
            initial=step,
            desc=f"train {cfg.name}",
            unit="step",
            disable=not (progress and main),
        )
        t_start, steps_done, anchors_done = time.perf_counter(), 0, 0
        last_ckpt = ckpt
        pin = self.device.type == "cuda"
        shards = Prefetcher(
            iterate_shards(self.cache, cfg, epoch, batch, ctx.rank, ctx.world_size, pin_memory=pin),
            cfg.run.prefetch,
        )
        log = log_path.open("a") if main else None
        try:
            end = cfg.optim.max_steps if stop_at is None else min(stop_at, cfg.optim.max_steps)
            while step < end:
                sh = next(shards)
                epoch, b = sh.epoch, sh.batch
                tb = self.device_batch(sh.data, non_blocking=pin)
                loss, terms = batch_loss(model, self.lm_head, tb, cfg, ctx)
                opt.zero_grad(set_to_none=True)
                backward(loss, ctx)
                # Over the global gradient: FSDP's sharded gradients give a DTensor norm.
                gnorm = torch.nn.utils.clip_grad_norm_(trainable, cfg.optim.grad_clip)
                gnorm = float(full_tensor(gnorm))
                lr = opt.param_groups[0]["lr"]
                opt.step()
                sched.step()
                step += 1
                steps_done += 1
                anchors_done += sh.global_anchors
                total, parts, accept = _global_figures(loss, terms, ctx)
                if step % cfg.run.log_every == 0 or step == 1 or step == cfg.optim.max_steps:
                    rec = {
                        "step": step,
                        "epoch": epoch,
                        "lr": lr,
                        "grad_norm": gnorm,
                        "anchors": sh.global_anchors,
                        **parts,
                        "total": total,
                        "accept_per_slot": [round(x, 5) for x in accept],
                    }
                    if log is not None:
                        log.write(json.dumps(rec) + "\n")
                        log.flush()
                    history.append(rec)
                bar.update(1)
                bar.set_postfix(loss=f"{total:.3f}", acc0=f"{accept[0]:.2f}")
                if step % cfg.run.checkpoint_every == 0 or step == end:
                    root = self.out_dir / "checkpoints"
                    weights, opt_state = self.full_states(drafter, opt, ctx)
                    if main:
                        last_ckpt = self.save_checkpoint(
                            drafter,
                            opt,
                            sched,
                            step,
                            epoch,
                            b + 1,
                            ctx.world_size,
                            weights=weights,
                            optimizer_state=opt_state,
                        )
                        plot_curves(history, self.out_dir / "loss_curves.png", cfg.name)
                    else:
                        last_ckpt = root / f"step-{step:06d}"
                    barrier(ctx)
        finally:
            shards.close()
            if log is not None:
                log.close()
        bar.close()
        elapsed = time.perf_counter() - t_start
        assert last_ckpt is not None
        result = TrainResult(
            out_dir=self.out_dir,
            final_step=step,
            final_checkpoint=last_ckpt,
            steps_per_s=steps_done / elapsed if elapsed > 0 else 0.0,
            anchors_per_s=anchors_done / elapsed if elapsed > 0 else 0.0,
            first_loss=history[0]["total"] if history else float("nan"),
            last_loss=history[-1]["total"] if history else float("nan"),
        )
        if main:
            summary = {
                k: (str(v) if isinstance(v, Path) else v) for k, v in result.__dict__.items()
            }
            summary["threads"] = cfg.run.threads
            summary["device"] = str(self.device)
            summary["world_size"] = ctx.world_size
            (self.out_dir / "summary.json").write_text(json.dumps(summary, indent=2))
        barrier(ctx)
        self.drafter = drafter  # under FSDP with several processes: this rank's shards
        return result


def _frozen_on(module: nn.Module, device: torch.device, autocast: str) -> Any:
    """A frozen target module on ``device``; a float32 copy if it is stored at lower
    precision and no autocast would reconcile it with the float32 drafter."""
    module.requires_grad_(False)
    weight = next(module.parameters())
    if weight.dtype != torch.float32 and autocast == "float32":
        module = copy.deepcopy(module).float()
    return module.to(device)


def _global_figures(
    loss: torch.Tensor, terms: LossTerms, ctx: DistContext
) -> tuple[float, dict[str, float], list[float]]:
    """The logged numbers of the global batch: this process's shares summed over ranks
    (one all-reduce; with one process they are the numbers themselves, bit for bit)."""
    vec = torch.cat(
        [
            torch.stack([loss.detach(), terms.total.detach(), terms.ce, terms.l1, terms.bce])
            .detach()
            .float(),
            terms.accept_per_slot.detach().float(),
        ]
    )
    vals = all_reduce_sum(vec, ctx).tolist()
    parts = {"loss": vals[1], "ce": vals[2], "l1": vals[3], "bce": vals[4]}
    return vals[0], parts, vals[5:]


def _read_log(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out


def plot_curves(history: list[dict[str, Any]], path: Path, title: str) -> None:
    """Loss terms and per-slot expected acceptance (1 - L1/2) against step, as PNG."""
    if not history:
        return
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [r["step"] for r in history]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    for key in ("total", "ce", "l1", "bce"):
        ax1.plot(steps, [r[key] for r in history], label=key)
    ax1.set_xlabel("step")
    ax1.set_ylabel("loss")
    ax1.set_yscale("log")
    ax1.legend()
    ax1.set_title(f"{title}: loss terms")
    slots = len(history[-1]["accept_per_slot"])
    for k in range(slots):
        ax2.plot(steps, [r["accept_per_slot"][k] for r in history], label=f"slot {k}")
    ax2.set_xlabel("step")
    ax2.set_ylabel("E[accept] = 1 - L1/2")
    ax2.set_ylim(0, 1)
    ax2.legend(fontsize=7)
    ax2.set_title("expected single-token acceptance per slot")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
