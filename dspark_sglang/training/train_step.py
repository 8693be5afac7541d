"""One training step's forward and loss: the drafter's outputs at the real anchors,
the DSpark loss against the frozen LM head's target distributions, the MoE balancing
term, and the backward pass of this process's share of the global loss.

``DraftStep`` is the module DDP wraps and FSDP shards (``parallel_step``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from dspark_sglang.model import DraftBlock, DSparkDrafter, markov_logits
from dspark_sglang.model.ar_drafter import ARDrafter
from dspark_sglang.model.moe import MoEFFN
from dspark_sglang.model.vocab import DRAFT_VOCAB_BUFFER
from dspark_sglang.training.config import TrainConfig
from dspark_sglang.training.dataset import TrainBatch
from dspark_sglang.training.distributed import DistContext, all_reduce_sum, wrap_ddp, wrap_fsdp
from dspark_sglang.training.drafters import Drafter
from dspark_sglang.training.losses import LossTerms, dspark_loss, loss_denominators


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
