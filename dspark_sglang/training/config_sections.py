"""The target, drafter, optim and run sections of a training config.

Each is a frozen dataclass that validates its own fields (the ``data`` section is in
``config_data``; ``anchors`` and ``loss`` live with the code they configure).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

from dspark_sglang.training.config_checks import COMPUTE_DTYPES, check_int, check_number

DrafterKind = Literal["dspark", "dflash", "eagle3"]

TARGET_DTYPES = ("float32", "bfloat16", "float16")
#: How several training processes (torchrun) share the drafter: ``ddp`` replicates it on
#: every rank, ``fsdp`` shards its trainable weights, gradients and optimizer state.
PARALLEL_MODES = ("ddp", "fsdp")
_DEVICE_RE = re.compile(r"cpu|cuda(:[0-9]+)?")


@dataclass(frozen=True)
class TargetConfig:
    """Which target, and which of its layers feed the drafter (None: the drafter default)."""

    name: str = "smollm2"
    layer_ids: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(
                f"target.name must be 'smollm2' or a path to an HF model folder, got {self.name!r}"
            )
        if self.layer_ids is not None:
            ids = tuple(self.layer_ids)
            if not ids or any(isinstance(i, bool) or not isinstance(i, int) or i < 0 for i in ids):
                raise ValueError(f"target.layer_ids must be a list of ints >= 0, got {ids!r}")
            object.__setattr__(self, "layer_ids", ids)


@dataclass(frozen=True)
class DrafterSection:
    """Drafter kind, block size, and architecture overrides for its config class."""

    kind: DrafterKind = "dspark"
    block_size: int = 7
    model: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.kind not in get_args(DrafterKind):
            raise ValueError(
                f"drafter.kind must be one of {get_args(DrafterKind)}, got {self.kind!r}"
            )
        check_int("drafter", "block_size", self.block_size)
        if not isinstance(self.model, Mapping):
            raise ValueError(f"drafter.model must be a mapping of overrides, got {self.model!r}")
        for banned in ("block_size", "target_layer_ids"):
            if banned in self.model:
                raise ValueError(
                    f"drafter.model.{banned} is set elsewhere: use drafter.block_size / "
                    "target.layer_ids so all drafters and the data cache agree"
                )
        if "greedy_draft_vocab_size" in self.model:
            raise ValueError(
                "drafter.model.greedy_draft_vocab_size is not a training setting: the greedy "
                "map is added when shipping, with export-drafter --greedy-draft-vocab-size K "
                "--draft-vocab-data DIR; drop it from drafter.model"
            )
        if self.kind == "dflash" and self.model.get("markov_head_type", "none") != "none":
            raise ValueError(
                "drafter.kind 'dflash' is the parallel drafter without a sequential head; "
                "drop drafter.model.markov_head_type or use kind 'dspark'"
            )


@dataclass(frozen=True)
class OptimConfig:
    """AdamW with linear warm-up then cosine decay to ``min_lr_ratio * lr``."""

    lr: float = 1e-3
    weight_decay: float = 0.01
    beta1: float = 0.9
    beta2: float = 0.95
    warmup_steps: int = 50
    max_steps: int = 2000
    min_lr_ratio: float = 0.1
    grad_clip: float = 1.0
    aux_loss_weight: float = 0.01
    # The Markov head is a low-rank token-transition table: each row only learns when
    # its token occurs, so it lags the backbone at the backbone's rate.
    markov_lr_scale: float = 1.0

    def __post_init__(self) -> None:
        check_number("optim", "lr", self.lr, lo=1e-12, hi=1.0)
        check_number("optim", "markov_lr_scale", self.markov_lr_scale, lo=1e-6, hi=1000.0)
        check_number("optim", "weight_decay", self.weight_decay)
        check_number("optim", "beta1", self.beta1, hi=0.99999)
        check_number("optim", "beta2", self.beta2, hi=0.99999)
        check_int("optim", "warmup_steps", self.warmup_steps, lo=0)
        check_int("optim", "max_steps", self.max_steps)
        check_number("optim", "min_lr_ratio", self.min_lr_ratio, hi=1.0)
        check_number("optim", "grad_clip", self.grad_clip, lo=1e-9)
        check_number("optim", "aux_loss_weight", self.aux_loss_weight)


@dataclass(frozen=True)
class RunConfig:
    """Where outputs go and how often; ``threads`` is explicit (shared CPUs)."""

    out_dir: str = "runs/train/dspark_smollm2"
    checkpoint_every: int = 250
    keep_checkpoints: int = 2
    log_every: int = 10
    threads: int = 2
    seed: int = 0
    # Continue another run (its out_dir, or one of its checkpoints/step-N): weights, optimizer
    # moments and step count carry over, the LR schedule and the data are this config's. Or
    # start from a drafter folder (config.json + model.safetensors: import-drafter's or
    # export-drafter's output): its weights only, then a fresh run from step 0; the drafter
    # and target sections must describe that drafter.
    init_from: str | None = None
    # Mixed precision for the drafter's forward: bfloat16 runs its matmuls (most of all the
    # full-vocabulary LM head) on AMX; weights, optimizer state and the loss stay float32.
    # It applies on run.device's type (CPU autocast or CUDA autocast).
    autocast: str = "float32"
    # Where the target, the drafter and every training tensor live: cpu, cuda or cuda:N.
    # Under torchrun with several processes, "cuda" means each process's cuda:LOCAL_RANK.
    device: str = "cpu"
    # Precision the target is loaded in (its frozen embedding / LM head are shared with the
    # drafter; the trainer keeps a float32 copy of them unless run.autocast is set).
    target_dtype: str = "float32"
    # Batches prepared ahead of the training step by a background thread (0: none). The
    # batches and their order do not depend on it.
    prefetch: int = 2
    # Several processes (torchrun): "ddp" keeps a full drafter, its gradients and AdamW
    # state on every rank; "fsdp" (FSDP2) shards them over the ranks (a drafter too big to
    # replicate). Same loss, same checkpoints; one process ignores it.
    parallel: str = "ddp"

    def __post_init__(self) -> None:
        if not isinstance(self.out_dir, str) or not self.out_dir:
            raise ValueError(f"run.out_dir must be a non-empty path, got {self.out_dir!r}")
        if self.init_from is not None and (
            not isinstance(self.init_from, str) or not self.init_from
        ):
            raise ValueError(
                "run.init_from must be the path of a training run, a checkpoint or a drafter "
                f"folder, got {self.init_from!r}; omit it to start from random weights"
            )
        for name in ("checkpoint_every", "keep_checkpoints", "log_every", "threads"):
            check_int("run", name, getattr(self, name))
        check_int("run", "seed", self.seed, lo=0)
        if self.autocast not in COMPUTE_DTYPES:
            raise ValueError(
                f"run.autocast must be one of {COMPUTE_DTYPES} (float32 = no autocast), "
                f"got {self.autocast!r}"
            )
        if not isinstance(self.device, str) or not _DEVICE_RE.fullmatch(self.device):
            raise ValueError(
                f"run.device must be 'cpu', 'cuda' or 'cuda:N' (N a GPU index), got {self.device!r}"
            )
        if self.target_dtype not in TARGET_DTYPES:
            raise ValueError(
                f"run.target_dtype must be one of {TARGET_DTYPES}, got {self.target_dtype!r}"
            )
        check_int("run", "prefetch", self.prefetch, lo=0)
        if self.parallel not in PARALLEL_MODES:
            raise ValueError(
                f"run.parallel must be one of {PARALLEL_MODES} (ddp: a full drafter per "
                f"process, fsdp: the drafter sharded over the processes), got {self.parallel!r}"
            )
