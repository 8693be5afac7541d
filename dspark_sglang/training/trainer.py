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
equality on CPU with fixed threads). ``run.init_from`` continues another run's
checkpoint, or starts from a drafter folder's weights (``drafters.load_init_drafter``).

Devices and processes: ``run.device`` (cpu, cuda, cuda:N) holds the frozen
embedding / LM head, the drafter and every tensor of a step; ``run.autocast``
applies on that device type; a background thread prepares the next
``run.prefetch`` batches. Under ``torchrun`` each process trains on its share of
every global batch under DDP or, with ``run.parallel: fsdp``, with the drafter sharded
over the processes (FSDP2), the loss and the MoE balancing statistics normalised over
the global batch (``training/distributed.py``); rank 0 writes checkpoints (one format
for every mode and world size) and logs, and a checkpoint resumes at any world size.

The pieces live next to this module and are re-exported here: ``drafters`` (build,
save, load), ``train_step`` (forward, loss, backward), ``batch_plan`` (epochs, batches,
shards), ``optimizer`` (AdamW and the LR schedule), ``checkpoints`` (format, RNG states)
and ``train_log`` (logged figures, ``log.jsonl``, the loss-curve plot). This module
holds the ``Trainer`` that runs them over one run directory.
"""

from __future__ import annotations

import copy
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn
from tqdm.auto import tqdm

from dspark_sglang.model import DSparkDrafter, TargetSpec
from dspark_sglang.training.batch_plan import (
    Sequences,
    Shard,
    check_sequences,
    epoch_plan,
    iterate_batches,
    iterate_shards,
)
from dspark_sglang.training.checkpoints import (
    DRAFTER_DIR,
    STATE_FILE,
    init_checkpoint,
    latest_checkpoint,
    rng_state,
    set_rng_state,
    write_checkpoint,
)
from dspark_sglang.training.config import TrainConfig
from dspark_sglang.training.dataset import Prefetcher, TrainBatch
from dspark_sglang.training.distributed import (
    DistContext,
    barrier,
    full_optimizer_state,
    full_state,
    full_tensor,
    init_distributed,
    resolve_device,
    shard_optimizer_state,
)
from dspark_sglang.training.drafters import (
    Drafter,
    build_drafter,
    is_drafter_folder,
    load_any_drafter,
    load_init_drafter,
    resolve_layer_ids,
    save_any_drafter,
)
from dspark_sglang.training.online import OnlineHiddenStates
from dspark_sglang.training.optimizer import lr_lambda, make_optimizer
from dspark_sglang.training.token_map import (
    REPORT_FILE,
    build_draft_vocab,
    coverage_report,
    response_token_counts,
)
from dspark_sglang.training.train_log import global_figures, plot_curves, read_log
from dspark_sglang.training.train_step import (
    DraftOutputs,
    DraftStep,
    backward,
    balance_loss,
    batch_loss,
    draft_outputs,
    parallel_step,
)

__all__ = [
    "DRAFTER_DIR",
    "STATE_FILE",
    "DraftOutputs",
    "DraftStep",
    "Drafter",
    "Sequences",
    "Shard",
    "TrainResult",
    "Trainer",
    "backward",
    "balance_loss",
    "batch_loss",
    "build_drafter",
    "draft_outputs",
    "epoch_plan",
    "init_checkpoint",
    "iterate_batches",
    "iterate_shards",
    "latest_checkpoint",
    "load_any_drafter",
    "lr_lambda",
    "parallel_step",
    "plot_curves",
    "resolve_layer_ids",
    "save_any_drafter",
]

#: The RNG snapshot under its former private name here (the device tests import it).
_rng_state = rng_state


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
        check_sequences(cfg, cache, online, self.device, layer_ids, spec.name)

    def device_batch(self, data: TrainBatch, non_blocking: bool = False) -> TrainBatch:
        """``data`` on ``run.device``, with the target's hidden states when online."""
        batch = data.to(self.device, non_blocking=non_blocking)
        if self.online is not None:
            batch = self.online.attach(batch, self.cfg.drafter.block_size)
        return batch

    def _make_optimizer(self, drafter: Drafter) -> tuple[torch.optim.Optimizer, Any]:
        """AdamW and its LR schedule for this run (``optimizer.make_optimizer``): over the
        *unwrapped* drafter, and under FSDP after sharding."""
        return make_optimizer(self.cfg, drafter)

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
        return write_checkpoint(
            self.out_dir,
            self.cfg,
            drafter,
            opt,
            sched,
            step,
            epoch,
            batch,
            self.device,
            world_size,
            weights,
            optimizer_state,
        )

    def _restore(self, ckpt: Path) -> tuple[Drafter, dict[str, Any]]:
        """A checkpoint's (whole) drafter on this device and its train state."""
        state = torch.load(ckpt / STATE_FILE, weights_only=False, map_location="cpu")
        drafter = load_any_drafter(
            ckpt / DRAFTER_DIR, self.cfg.drafter.kind, self.spec, self.embed_tokens, self.lm_head
        ).to(self.device)
        return drafter, state

    def _init_drafter(self, folder: Path) -> Drafter:
        """A drafter folder's drafter (``run.init_from``) on this device, once checked."""
        return load_init_drafter(
            self.cfg,
            folder,
            self.spec,
            self.hf_config,
            self.embed_tokens,
            self.lm_head,
            self.mask_token_id,
        ).to(self.device)

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
        start = None  # a drafter folder: its weights, and a fresh run from step 0
        if init is not None and is_drafter_folder(init):
            start, init = init, None
        history: list[dict[str, Any]] = []
        source = ckpt if ckpt is not None else init
        state: dict[str, Any] = {}
        if source is not None:
            drafter, state = self._restore(source)
        elif start is not None:
            drafter = self._init_drafter(start)
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
            set_rng_state(state["rng"], self.device)
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
            set_rng_state(state["rng"], self.device)
            epoch, batch = int(state["epoch"]) + 1, 0
            history = [r for r in read_log(init.parent.parent / "log.jsonl") if r["step"] <= step]
        else:
            torch.manual_seed(cfg.run.seed)
            step, epoch, batch = 0, 0, 0
        log_path = self.out_dir / "log.jsonl"
        if init is None:
            history = [r for r in read_log(log_path) if r["step"] <= step]
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
                total, parts, accept = global_figures(loss, terms, ctx)
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
