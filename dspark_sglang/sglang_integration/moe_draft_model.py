"""Our MoE + sliding-window DSpark drafter as an SGLang model class.

Why a subclass of SGLang's dense ``DSparkDraftModel``: ``DSparkWorkerV2``
already drives a draft through that class's interface (``forward`` over a
``ForwardBatch``, ``write_target_hidden_kv`` for context injection,
``project_target_hidden``, ``compute_base_logits``, the Markov and
confidence heads, ``attach_shared_modules`` for the target's embedding and LM
head). Our drafter (``dspark_sglang/model/``) differs from the dense class in
exactly three places, and only those are replaced here:

1. **FFN.** Each layer's MLP is our top-k routed MoE with a shared expert
   (``model/moe.py``'s modules and router, so parameters, routing and expert
   math are the training code's own; the load-balancing loss is not computed
   at inference). The routed experts are evaluated densely over all tokens
   (``dense_expert_mix``), not grouped per expert as in training: grouping
   needs a host sync and data-dependent shapes, which CUDA graphs cannot hold.
   The whole draft forward is free of host syncs (tested).
2. **Sliding window.** Ours is anchor-relative: every query of a block
   anchored at ``p`` sees context positions ``[p - W, p - 1]`` plus its whole
   block (bidirectional). SGLang's ``RadixAttention.sliding_window_size`` is
   query-relative (key ``j`` visible iff ``q_pos - j <= window``) and, in the
   CPU kernels, only applied to causal layers, while the DSpark block is
   non-causal (``ENCODER_ONLY``). No ``sliding_window_size`` value means the
   same as ours, so windowed layers compute their attention here over the
   draft KV pool: ``W`` context rows gathered through ``req_to_token`` plus the
   block's own keys, one masked softmax (static shapes: graph-capturable).
   Layers of a drafter without a window use SGLang's backend unchanged.
3. **A reduced draft vocabulary** (``draft_vocab_size``, ``model/vocab.py``). SGLang's
   draft loop samples over the target's vocabulary and verification reads those
   step logits, so the class keeps SGLang's shapes: base logits are computed for
   the ``K`` mapped tokens only and scattered into ``V`` columns with
   ``OFF_MAP_LOGIT`` elsewhere, and the Markov head's ``K``-row ``W2`` bias is scattered with 0.
   Drafts are then target ids, the draft distribution is zero outside the map and
   verification is unchanged (lossless). Under tensor parallelism the target's
   full logits are masked instead (same values, no saving).
   A full-vocabulary drafter's *greedy map* (``greedy_draft_vocab_size``) takes the
   same path when SGLang drafts by argmax (``SGLANG_DSPARK_USE_GREEDY_DRAFT`` on
   when the class is built): ``markov_w2``'s rows of the map are kept at load. With
   the argmax draft off the map is validated and ignored.
4. **Config and weight names.** The checkpoint ``save_drafter`` writes is read
   as is: ``config.json`` (``model_type`` ``dspark_moe``, our ``dspark_config``)
   through a transformers config class registered by the plugin, and
   ``model.safetensors`` through our own strict ``load_weights`` (``q/k/v_proj``
   -> SGLang's fused ``qkv_proj``; every other name is SGLang's already).

Convention check: SGLang's default ``sample_from_anchor=True`` feeds
``[anchor, mask x (gamma-1)]`` and reads all ``gamma`` rows, i.e. slot ``k``
predicts ``p + k + 1`` -- our ``anchor_next`` convention with ``gamma = B``.
A ``dflash``-convention checkpoint is refused.

Where the parts live: the windowed attention, the dense expert mix and the decoder
layer (points 1 and 2) are in ``moe_draft_layers``, the reduced-vocabulary Markov head
(point 3) in ``moe_draft_vocab``; this module holds the class (config, base logits,
token-map install, strict weight loading), its registration with SGLang and the
start-up check, and re-exports the layers' and head's public names.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

import torch
from sglang.srt.environ import envs
from sglang.srt.model_loader.weight_utils import default_weight_loader
from sglang.srt.models.dspark import DSparkDraftModel

from dspark_sglang.model.checkpoint import CheckpointError
from dspark_sglang.model.config import HF_ARCHITECTURE, DSparkConfig
from dspark_sglang.model.vocab import (
    DRAFT_VOCAB_BUFFER,
    GREEDY_DRAFT_VOCAB_BUFFER,
    GREEDY_DRAFT_VOCAB_SIZE_KEY,
    MappedRows,
    check_draft_vocab_ids,
    check_greedy_draft_vocab_ids,
    scatter_to_vocab,
)
from dspark_sglang.sglang_integration import cpu_linear
from dspark_sglang.sglang_integration.draft_checkpoint import check_against_target, dspark_config_of
from dspark_sglang.sglang_integration.moe_draft_layers import (
    DSparkInferenceMoE,
    DSparkMoEDecoderLayer,
    DSparkWindowedAttention,
    dense_expert_mix,
    windowed_block_attention,
)
from dspark_sglang.sglang_integration.moe_draft_vocab import DraftVocabBias, draft_vocab_head

__all__ = [
    "ARCHITECTURE",
    "OFF_MAP_LOGIT",
    "DSparkInferenceMoE",
    "DSparkMoEDecoderLayer",
    "DSparkMoEDraftModel",
    "DSparkWindowedAttention",
    "DraftVocabBias",
    "EntryClass",
    "check_loaded_draft",
    "dense_expert_mix",
    "register_model_class",
    "windowed_block_attention",
]

logger = logging.getLogger(__name__)

#: The ``architectures`` name our checkpoints carry, resolved by ``ModelRegistry``.
ARCHITECTURE = HF_ARCHITECTURE
#: Base logit of a token outside a reduced draft vocabulary: finite, so SGLang 0.5.23's
#: verify path (which miscounts accepted drafts when the kept step logits hold -inf) is
#: unaffected, yet far enough below any real logit that its probability after softmax is
#: exactly 0 in float32 and bfloat16, also after dividing by a temperature.
OFF_MAP_LOGIT = -1e30


# --------------------------------------------------------------------------- config


def _sglang_fields(config: DSparkConfig) -> dict[str, Any]:
    """Top-level attributes SGLang's dense DSpark/DFlash classes read from the HF config."""
    return {
        "markov_rank": config.markov_rank,
        "markov_head_type": config.markov_head_type,
        "enable_confidence_head": config.enable_confidence_head,
        "confidence_head_with_markov": config.confidence_head_with_markov,
        "sample_from_anchor": True,
        "block_size": config.block_size,
        "attention_bias": False,
        "hidden_act": "silu",
        # Windowing is ours (see the module docstring); SGLang's layers stay full.
        "layer_types": None,
    }


# --------------------------------------------------------------------------- model


class DSparkMoEDraftModel(DSparkDraftModel):
    """SGLang draft class for checkpoints written by ``save_drafter`` (``DSparkMoEDraftModel``).

    ``dspark_draft_vocab_size``: the ``K`` of the map it drafts over (``None``: the whole
    vocabulary), the checkpoint's ``draft_vocab_size`` or, under the argmax draft, its
    ``greedy_draft_vocab_size``; ``dspark_uses_greedy_map`` says which.
    """

    #: The markov_w2 weight a greedy map slices at load (its checkpoint name).
    _MARKOV_W2 = "markov_head.markov_w2.weight"

    decoder_layer_cls = DSparkMoEDecoderLayer
    # The fused context-KV kernels assume SGLang's dense layout; keep the plain path.
    supports_fused_context_kv = False

    def __init__(self, config: Any, quant_config: Any = None, prefix: str = "") -> None:
        if quant_config is not None:
            raise CheckpointError(
                "DSparkMoEDraftModel does not support quantized drafts; load it unquantized"
            )
        dspark = dspark_config_of(config)
        for key, value in _sglang_fields(dspark).items():
            setattr(config, key, value)
        super().__init__(config=config, quant_config=None, prefix=prefix)
        self.dspark_config = dspark
        for layer in self.layers:
            layer.self_attn.dspark_window = dspark.sliding_window
            if dspark.ffn_type == "moe":
                layer.mlp = DSparkInferenceMoE(
                    dspark.hidden_size,
                    dspark.num_experts,
                    dspark.num_experts_per_tok,
                    dspark.moe_intermediate_size,
                    dspark.shared_expert_intermediate_size if dspark.shared_expert else None,
                )
        if not dspark.enable_confidence_head:
            # SGLang builds a head in non-static ragged modes whatever the flag says.
            self.confidence_head = None
        self._lm_head_rows = MappedRows()
        # Read when the class is built, as SGLang's worker reads it when it starts.
        self.dspark_uses_greedy_map = dspark.greedy_draft_vocab_size is not None and bool(
            envs.SGLANG_DSPARK_USE_GREEDY_DRAFT.get()
        )
        self.dspark_draft_vocab_size = (
            dspark.greedy_draft_vocab_size
            if self.dspark_uses_greedy_map
            else dspark.draft_vocab_size
        )
        if self.dspark_draft_vocab_size is not None:
            self.markov_head = draft_vocab_head(
                self.markov_head, self.dspark_draft_vocab_size, dspark.hidden_size
            )
            in_map = torch.zeros(dspark.vocab_size, dtype=torch.bool)
            self.register_buffer("draft_vocab_mask", in_map, persistent=False)

    def compute_base_logits(self, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """SGLang's base logits; with a reduced vocabulary ``OFF_MAP_LOGIT`` outside the map.

        Single rank with a plain LM head: only the ``K`` mapped rows are multiplied
        (gathered once), then scattered into ``V`` columns. Otherwise (TP, quantized or
        muP heads) SGLang's own logits are masked: the same values at full cost.
        """
        if self.dspark_draft_vocab_size is None:
            return super().compute_base_logits(hidden)
        head = self.lm_head
        ids = self.markov_head.draft_vocab_ids
        weight = getattr(head, "weight", None)
        plain = (
            isinstance(weight, torch.Tensor)
            and weight.dim() == 2
            and weight.is_floating_point()
            and int(getattr(head, "tp_size", 1)) == 1
            and not getattr(self, "logits_mup_width_multiplier", None)
            and getattr(self, "_base_logits_gatherer", None) is None
        )
        if not plain:
            full, features = super().compute_base_logits(hidden)
            return full.masked_fill(~self.draft_vocab_mask, OFF_MAP_LOGIT), features
        assert isinstance(weight, torch.Tensor)
        reduced = cpu_linear.linear(hidden.to(weight.dtype), self._lm_head_rows.get(weight, ids))
        vocab = self.dspark_config.vocab_size
        return scatter_to_vocab(reduced, ids, vocab, OFF_MAP_LOGIT), hidden

    def _load_draft_vocab(self, name: str, tensor: torch.Tensor) -> None:
        """Validate the checkpoint's token map and install it in the head and the mask."""
        cfg = self.dspark_config
        if cfg.draft_vocab_size is None:
            raise CheckpointError(
                f"draft checkpoint has a token map {name!r} but config.json has no "
                "draft_vocab_size; the weights do not match config.json (re-save the drafter)"
            )
        try:
            check_draft_vocab_ids(tensor, cfg.vocab_size, cfg.draft_vocab_size)
        except ValueError as exc:
            raise CheckpointError(f"draft checkpoint: {exc}") from exc
        self._install_draft_vocab(tensor)

    def _load_greedy_vocab(self, name: str, tensor: torch.Tensor) -> None:
        """Validate the checkpoint's greedy map; install it when the argmax draft is on."""
        cfg = self.dspark_config
        if cfg.greedy_draft_vocab_size is None:
            raise CheckpointError(
                f"draft checkpoint has a greedy map {name!r} but config.json has no "
                f"{GREEDY_DRAFT_VOCAB_SIZE_KEY}; the weights do not match config.json "
                "(re-save the drafter)"
            )
        try:
            check_greedy_draft_vocab_ids(tensor, cfg.vocab_size, cfg.greedy_draft_vocab_size)
        except ValueError as exc:
            raise CheckpointError(f"draft checkpoint: {exc}") from exc
        if self.dspark_uses_greedy_map:
            self._install_draft_vocab(tensor)

    def _install_draft_vocab(self, tensor: torch.Tensor) -> None:
        """Put a validated token map into the Markov head and the mask."""
        with torch.no_grad():
            ids = self.markov_head.draft_vocab_ids
            ids.copy_(tensor.to(ids.device))
            self.draft_vocab_mask.zero_()
            self.draft_vocab_mask[ids] = True
        self._lm_head_rows.clear()

    def _fused_kv_write_bundle(self, pool: Any) -> None:
        """Never fuse: the fused write is a bf16 kernel tuned for SGLang's dense drafts."""
        del pool
        return None

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Strict load of ``save_drafter``'s tensors (names are ours; see the module docstring).

        Every checkpoint tensor must land on a parameter of the same shape and
        every parameter must be loaded; non-finite weights are refused.
        """
        params = dict(self.named_parameters())
        fused = {
            "q_proj": ("qkv_proj", "q"),
            "k_proj": ("qkv_proj", "k"),
            "v_proj": ("qkv_proj", "v"),
        }
        if self.dspark_config.ffn_type == "dense":
            fused |= {"gate_proj": ("gate_up_proj", 0), "up_proj": ("gate_up_proj", 1)}
        loaded: set[str] = set()
        unexpected: list[str] = []
        from sglang.srt.runtime_context import get_parallel

        tp_size = int(get_parallel().tp_size)
        full_w2: torch.Tensor | None = None  # the V-row markov_w2 a greedy map slices
        for name, tensor in weights:
            if name == DRAFT_VOCAB_BUFFER:
                self._load_draft_vocab(name, tensor)
                loaded.add(name)
                continue
            if name == GREEDY_DRAFT_VOCAB_BUFFER:
                self._load_greedy_vocab(name, tensor)
                loaded.add(name)
                continue
            if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
                raise CheckpointError(
                    f"draft tensor {name!r} has non-finite values (NaN/inf); the training "
                    "run diverged, use an earlier checkpoint"
                )
            if self.dspark_uses_greedy_map and name == self._MARKOV_W2:
                full_w2 = tensor  # sliced once the map is known (tensors come in any order)
                loaded.add(name)
                continue
            if name.startswith("confidence_head.") and self.confidence_head is None:
                continue  # SGLang's static ragged mode builds no confidence head
            parts = name.split(".")
            target, shard = name, None
            if len(parts) >= 3 and parts[-2] in fused and not name.startswith("markov_head."):
                fused_name, shard = fused[parts[-2]]
                target = ".".join([*parts[:-2], fused_name, parts[-1]])
            param = params.get(target)
            if param is None:
                unexpected.append(name)
                continue
            if shard is None:
                # Under TP, SGLang's parallel layers hold this rank's slice and their
                # weight_loader narrows the full tensor and checks the slice's shape;
                # everything else (and every tensor at TP 1) is checked here.
                sharded = tp_size > 1 and hasattr(param, "weight_loader")
                if not sharded and tuple(param.shape) != tuple(tensor.shape):
                    raise CheckpointError(
                        f"draft tensor {name!r} has shape {tuple(tensor.shape)}, the model built "
                        f"from config.json needs {tuple(param.shape)}; the weights do not match "
                        "config.json (re-save the drafter)"
                    )
                getattr(param, "weight_loader", default_weight_loader)(param, tensor)
            else:
                param.weight_loader(param, tensor, shard)
            loaded.add(target)
        if unexpected:
            raise CheckpointError(
                f"draft checkpoint has tensors {sorted(unexpected)} that DSparkMoEDraftModel "
                "does not have; the weights do not match config.json (re-save the drafter)"
            )
        expected = set(params)
        if self.dspark_config.draft_vocab_size is not None:
            expected.add(DRAFT_VOCAB_BUFFER)
        if self.dspark_config.greedy_draft_vocab_size is not None:
            expected.add(GREEDY_DRAFT_VOCAB_BUFFER)
        missing = sorted(expected - loaded)
        if missing:
            raise CheckpointError(
                f"draft checkpoint is missing tensors for {missing}; the weights do not match "
                "config.json (re-save the drafter)"
            )
        self._finish_greedy_map(full_w2)

    def _finish_greedy_map(self, full_w2: torch.Tensor | None) -> None:
        """Keep ``markov_w2``'s rows of the greedy map (argmax draft on); log which map is used."""
        cfg = self.dspark_config
        if cfg.greedy_draft_vocab_size is None:
            return
        if not self.dspark_uses_greedy_map:
            logger.info(
                "DSPARK_MOE: the drafter's %d-token greedy map is ignored because the argmax "
                "draft is off (SGLANG_DSPARK_USE_GREEDY_DRAFT); drafting over the whole "
                "vocabulary",
                cfg.greedy_draft_vocab_size,
            )
            return
        assert full_w2 is not None  # the missing-tensor check above
        w2 = self.markov_head.markov_w2.weight
        want = (cfg.vocab_size, w2.shape[1])
        if tuple(full_w2.shape) != want:
            raise CheckpointError(
                f"draft tensor {self._MARKOV_W2!r} has shape {tuple(full_w2.shape)}, the model "
                f"built from config.json needs {want}; the weights do not match config.json "
                "(re-save the drafter)"
            )
        ids = self.markov_head.draft_vocab_ids
        with torch.no_grad():
            w2.copy_(full_w2.to(w2.device)[ids.to(w2.device)])
        logger.info(
            "DSPARK_MOE: greedy draft over the drafter's %d-token greedy map",
            cfg.greedy_draft_vocab_size,
        )


def register_model_class() -> None:
    """Add ``DSparkMoEDraftModel`` to SGLang's ``ModelRegistry`` (idempotent).

    ``ModelRegistry.register(package)`` imports every module of a package of
    model files; we have one class, so it is put into the registry's
    architecture table directly, which is what ``resolve_model_cls`` reads.
    """
    from sglang.srt.models.registry import ModelRegistry

    existing = ModelRegistry.models.get(ARCHITECTURE)
    if existing is None:
        ModelRegistry.models[ARCHITECTURE] = DSparkMoEDraftModel
        logger.info("dspark_sglang: registered draft model class %s", ARCHITECTURE)
    elif existing is not DSparkMoEDraftModel:
        raise RuntimeError(
            f"SGLang's ModelRegistry already maps {ARCHITECTURE} to {existing!r}; "
            "two plugins define the same architecture"
        )


def check_loaded_draft(draft_model: Any, target_worker: Any, gamma: int) -> None:
    """Start-up gate for the draft beside the target SGLang loaded: ours, or SGLang's dense
    class (``dense_draft_checks``); other drafts pass."""
    target_hf = target_worker.model_runner.model_config.hf_text_config
    if not isinstance(draft_model, DSparkMoEDraftModel):
        from dspark_sglang.sglang_integration.dense_draft_checks import check_loaded_dense_draft

        return check_loaded_dense_draft(draft_model, target_hf, gamma)
    check_against_target(draft_model.dspark_config, target_hf, gamma)


EntryClass = [DSparkMoEDraftModel]
