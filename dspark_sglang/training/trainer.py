"""The drafter training loop (DSpark, DFlash-style and EAGLE3-style drafters alike).

One step: pack cached sequences with their sampled anchors into a batch, run
the drafter on every anchor's block (teacher forcing), apply the frozen LM
head to the *target's* cached last hidden states at the same positions to get
the target distributions, and minimise ``losses.dspark_loss`` (+ a small MoE
load-balancing term). The target, its embedding and its LM head are frozen;
only the drafter's own parameters are in the optimizer.

Reproducibility is structural: the batch plan of epoch ``e`` (sequence
order, anchors, packing) is a pure function of ``(run.seed, e)``, so a resumed
run rebuilds the same plan and skips the batches already done; the checkpoint
holds drafter weights (through the drafter's own save function), optimizer,
scheduler and RNG states, and the position in the plan. Resumed and
uninterrupted runs therefore produce identical weights (a test checks bitwise
equality on CPU with fixed threads).
"""

from __future__ import annotations

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
from dspark_sglang.training.anchors import pack_batches, sample_anchors
from dspark_sglang.model.ar_drafter import (
    ARDrafter,
    ARDrafterConfig,
    load_ar_drafter,
    save_ar_drafter,
)
from dspark_sglang.training.config import TrainConfig
from dspark_sglang.training.dataset import HiddenCache, TrainBatch, make_batch
from dspark_sglang.training.losses import LossTerms, dspark_loss

Drafter = DSparkDrafter | ARDrafter
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


def save_any_drafter(drafter: Drafter, path: Path) -> None:
    if isinstance(drafter, ARDrafter):
        save_ar_drafter(drafter, path)
    else:
        save_drafter(drafter, path)


def load_any_drafter(
    path: Path, kind: str, spec: TargetSpec, embed_tokens: nn.Embedding, lm_head: nn.Linear
) -> Drafter:
    if kind == "eagle3":
        return load_ar_drafter(path, embed_tokens, lm_head)
    return load_drafter(path, spec, embed_tokens, lm_head)


@dataclass(frozen=True)
class DraftOutputs:
    """Per valid anchor ``N``: logits ``[N, B, V]`` (after any Markov bias), confidence
    logits ``[N, B]`` or None, and the MoE auxiliary loss (scalar)."""

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
    ctx_valid = torch.arange(T).unsqueeze(0) < batch.seq_lens.unsqueeze(1)
    ah = drafter.forward_anchors(
        batch.context_hidden, batch.anchors, batch.anchor_tokens, ctx_valid
    )
    hidden = ah.hidden[sel]
    block = DraftBlock(
        hidden=hidden, base_logits=drafter.compute_base_logits(hidden), aux_loss=ah.aux_loss
    )
    ml = markov_logits(drafter, block, batch.prev_tokens[sel])
    return DraftOutputs(ml.logits, ml.confidence_logits, ah.aux_loss)


def batch_loss(
    drafter: Drafter, lm_head: nn.Linear, batch: TrainBatch, cfg: TrainConfig
) -> tuple[torch.Tensor, LossTerms]:
    """Total training loss of one batch (DSpark loss + weighted MoE aux loss) and its parts."""
    bf16 = cfg.run.autocast == "bfloat16"
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        out = draft_outputs(drafter, batch)
        sel = batch.anchor_mask
        with torch.no_grad():
            target_logits = lm_head(batch.target_last[sel]).float()
    conf = None if out.conf_logits is None else out.conf_logits.float()
    # The loss itself (softmaxes, L1 over the vocabulary, BCE) always runs in float32.
    terms = dspark_loss(
        out.logits.float(), target_logits, batch.labels[sel], batch.valid[sel], conf, cfg.loss
    )
    return terms.total + cfg.optim.aux_loss_weight * out.aux_loss.float(), terms


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
    cache: HiddenCache, cfg: TrainConfig, epoch: int
) -> tuple[list[list[int]], list[torch.Tensor]]:
    """Batches (lists of sequence indices) and per-sequence anchors for one epoch.

    A pure function of ``(run.seed, epoch)`` and the cache, so resumption can
    rebuild it.
    """
    g = torch.Generator().manual_seed(cfg.run.seed * 1_000_003 + epoch)
    order = torch.randperm(len(cache), generator=g).tolist()
    anchors = [
        sample_anchors(cache.seq_lens[i], cache.response_starts[i], cfg.anchors.anchors_per_seq, g)
        for i in range(len(cache))
    ]
    batches = pack_batches(cache.seq_lens, [a.numel() for a in anchors], cfg.anchors, order)
    return batches, anchors


def iterate_batches(
    cache: HiddenCache, cfg: TrainConfig, start_epoch: int, start_batch: int
) -> Iterator[tuple[int, int, TrainBatch]]:
    epoch, skip = start_epoch, start_batch
    while True:
        batches, anchors = epoch_plan(cache, cfg, epoch)
        if not batches:
            raise ValueError(
                "the hidden cache has no sequence with a legal anchor (responses empty?)"
            )
        for b in range(skip, len(batches)):
            idx = batches[b]
            yield (
                epoch,
                b,
                make_batch(
                    [cache[i] for i in idx], [anchors[i] for i in idx], cfg.drafter.block_size
                ),
            )
        epoch, skip = epoch + 1, 0


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


def _rng_state() -> dict[str, Any]:
    return {
        "torch": torch.get_rng_state(),
        "python": random.getstate(),
        "numpy": np.random.get_state(),
    }


def _set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])


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
    """Owns one run directory: ``checkpoints/step-NNNNNN/``, ``log.jsonl``, ``loss_curves.png``."""

    def __init__(
        self,
        cfg: TrainConfig,
        cache: HiddenCache,
        spec: TargetSpec,
        hf_config: Any,
        embed_tokens: nn.Embedding,
        lm_head: nn.Linear,
        mask_token_id: int,
    ) -> None:
        self.cfg = cfg
        self.cache = cache
        self.spec = spec
        self.embed_tokens = embed_tokens.requires_grad_(False)
        self.lm_head = lm_head.requires_grad_(False)
        self.hf_config = hf_config
        self.mask_token_id = mask_token_id
        self.out_dir = Path(cfg.run.out_dir)
        layer_ids = resolve_layer_ids(cfg, spec.num_layers)
        if tuple(cache.layer_ids) != tuple(layer_ids):
            raise ValueError(
                f"the hidden cache holds target layers {cache.layer_ids} but this config uses "
                f"{layer_ids}; set target.layer_ids to match or regenerate the cache"
            )

    def _make_optimizer(self, drafter: Drafter) -> tuple[torch.optim.Optimizer, Any]:
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
    ) -> Path:
        root = self.out_dir / "checkpoints"
        final = root / f"step-{step:06d}"
        tmp = root / f".tmp-step-{step:06d}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        save_any_drafter(drafter, tmp / DRAFTER_DIR)
        torch.save(
            {
                "step": step,
                "epoch": epoch,
                "batch": batch,
                "optimizer": opt.state_dict(),
                "scheduler": sched.state_dict(),
                "rng": _rng_state(),
                "config": self.cfg.to_dict(),
            },
            tmp / STATE_FILE,
        )
        shutil.rmtree(final, ignore_errors=True)
        tmp.rename(final)
        keep = sorted(c for c in root.glob("step-*") if (c / STATE_FILE).exists())
        for old in keep[: -self.cfg.run.keep_checkpoints]:
            shutil.rmtree(old, ignore_errors=True)
        return final

    def _restore(self, ckpt: Path) -> tuple[Drafter, torch.optim.Optimizer, Any, dict[str, Any]]:
        """A checkpoint's drafter, a fresh optimizer + schedule for it, and its train state."""
        state = torch.load(ckpt / STATE_FILE, weights_only=False)
        drafter = load_any_drafter(
            ckpt / DRAFTER_DIR, self.cfg.drafter.kind, self.spec, self.embed_tokens, self.lm_head
        )
        opt, sched = self._make_optimizer(drafter)
        return drafter, opt, sched, state

    def train(
        self, resume: bool = False, progress: bool = True, stop_at: int | None = None
    ) -> TrainResult:
        """Run to ``optim.max_steps``; with ``resume`` continue from the latest checkpoint.

        ``stop_at`` ends the session early at that step (with a checkpoint) without
        changing the schedule, so a long run can be split across sessions.
        """
        cfg = self.cfg
        torch.set_num_threads(cfg.run.threads)
        self.out_dir.mkdir(parents=True, exist_ok=True)
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
        if ckpt is not None:
            drafter, opt, sched, state = self._restore(ckpt)
            opt.load_state_dict(state["optimizer"])
            sched.load_state_dict(state["scheduler"])
            _set_rng_state(state["rng"])
            step, epoch, batch = int(state["step"]), int(state["epoch"]), int(state["batch"])
        elif init is not None:
            drafter, opt, sched, state = self._restore(init)
            # Only the AdamW moments carry over; lr, betas and weight decay are this config's.
            own = [{k: v for k, v in g.items() if k != "params"} for g in opt.param_groups]
            opt.load_state_dict(state["optimizer"])
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
            _set_rng_state(state["rng"])
            epoch, batch = int(state["epoch"]) + 1, 0
            history = [r for r in _read_log(init.parent.parent / "log.jsonl") if r["step"] <= step]
        else:
            drafter = build_drafter(
                cfg, self.spec, self.hf_config, self.embed_tokens, self.lm_head, self.mask_token_id
            )
            opt, sched = self._make_optimizer(drafter)
            torch.manual_seed(cfg.run.seed)
            step, epoch, batch = 0, 0, 0
        log_path = self.out_dir / "log.jsonl"
        if init is None:
            history = [r for r in _read_log(log_path) if r["step"] <= step]
        log_path.write_text("".join(json.dumps(r) + "\n" for r in history))
        (self.out_dir / "config.json").write_text(json.dumps(cfg.to_dict(), indent=2))

        drafter.train()
        trainable = [p for p in drafter.parameters() if p.requires_grad]
        bar = tqdm(
            total=cfg.optim.max_steps,
            initial=step,
            desc=f"train {cfg.name}",
            unit="step",
            disable=not progress,
        )
        t_start, steps_done, anchors_done = time.perf_counter(), 0, 0
        last_ckpt = ckpt
        it = iterate_batches(self.cache, cfg, epoch, batch)
        with log_path.open("a") as log:
            end = cfg.optim.max_steps if stop_at is None else min(stop_at, cfg.optim.max_steps)
            while step < end:
                epoch, b, tb = next(it)
                loss, terms = batch_loss(drafter, self.lm_head, tb, cfg)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                gnorm = float(torch.nn.utils.clip_grad_norm_(trainable, cfg.optim.grad_clip))
                lr = opt.param_groups[0]["lr"]
                opt.step()
                sched.step()
                step += 1
                steps_done += 1
                anchors_done += tb.num_anchors
                if step % cfg.run.log_every == 0 or step == 1 or step == cfg.optim.max_steps:
                    rec = {
                        "step": step,
                        "epoch": epoch,
                        "lr": lr,
                        "grad_norm": gnorm,
                        "anchors": tb.num_anchors,
                        **terms.as_floats(),
                        "total": float(loss.detach()),
                        "accept_per_slot": [round(float(x), 5) for x in terms.accept_per_slot],
                    }
                    log.write(json.dumps(rec) + "\n")
                    log.flush()
                    history.append(rec)
                bar.update(1)
                bar.set_postfix(
                    loss=f"{float(loss.detach()):.3f}",
                    acc0=f"{float(terms.accept_per_slot[0]):.2f}",
                )
                if step % cfg.run.checkpoint_every == 0 or step == end:
                    last_ckpt = self.save_checkpoint(drafter, opt, sched, step, epoch, b + 1)
                    plot_curves(history, self.out_dir / "loss_curves.png", cfg.name)
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
        summary = {k: (str(v) if isinstance(v, Path) else v) for k, v in result.__dict__.items()}
        summary["threads"] = cfg.run.threads
        (self.out_dir / "summary.json").write_text(json.dumps(summary, indent=2))
        self.drafter = drafter
        return result


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
