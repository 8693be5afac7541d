"""The DSpark drafter backbone: one parallel pass over a block (DSPARK.md, "Drafter").

For a request whose last accepted token ``x_p`` sits at absolute position ``p``:

    x^0      = [Emb(x_p), Emb(m), ..., Emb(m)]          B rows, positions p .. p+B-1
    c        = hidden_norm(fc(concat_l h_t^(l)))          target context rows (positions < p)
    for each draft layer:
        x    = x + Attn(input_layernorm(x) | context c)  (attention.py: c -> extra K/V)
        x    = x + FFN(post_attention_layernorm(x))     (moe.py: MoE or dense SwiGLU)
    h        = norm(x)                                   [B, H]
    z        = LMHead_S(h)                               base logits; slot k predicts x_{p+k+1}

``m`` is ``mask_token_id``; ``Emb`` and ``LMHead`` are the target's, shared and
frozen, and deliberately *not* submodules: they never appear in ``parameters()``
or in a saved drafter checkpoint. ``LMHead_S`` is the LM head over the draft
vocabulary ``S``: all ``V`` rows, or the ``K`` rows of a reduced drafter
(``model/vocab.py``), whose logits then have ``K`` columns. The sequential Markov
head and confidence head (heads.py) run on ``(h, z)`` afterwards (block_sampler.py).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
from torch import nn

from dspark_sglang.model.attention import (
    DSparkAttention,
    RMSNorm,
    RotaryEmbedding,
    context_visibility,
)
from dspark_sglang.model.config import DSparkConfig
from dspark_sglang.model.heads import (
    ConfidenceHead,
    MarkovHead,
    build_confidence_head,
    build_markov_head,
)
from dspark_sglang.model.moe import DenseFFN, ExpertBank, MoEFFN
from dspark_sglang.model.vocab import (
    DRAFT_VOCAB_BUFFER,
    GREEDY_DRAFT_VOCAB_BUFFER,
    DraftVocab,
    MappedRows,
    scatter_to_vocab,
)


@dataclass(frozen=True)
class DraftBlock:
    """Output of one parallel drafter pass (leading dims ``[N]`` or ``[S, A]``).

    ``hidden`` ``[..., B, H]`` is after the final norm (it also feeds the Markov
    and confidence heads); ``base_logits`` ``[..., B, K]`` are float32 LM-head
    logits over the draft vocabulary (``K = V`` unless it is reduced) before any
    Markov bias; ``aux_loss`` is the summed MoE load-balancing
    loss of all layers (0 for dense FFNs).
    """

    hidden: torch.Tensor
    base_logits: torch.Tensor
    aux_loss: torch.Tensor


@dataclass(frozen=True)
class AnchorHidden:
    """Output of ``forward_anchors``: ``hidden`` ``[S, A, B, H]`` and the MoE aux loss.

    Base logits are left to the caller (``DSparkDrafter.compute_base_logits``),
    because training applies the LM head to sampled positions only.
    """

    hidden: torch.Tensor
    aux_loss: torch.Tensor


class DSparkDecoderLayer(nn.Module):
    """Pre-norm transformer layer whose attention also reads the injected context."""

    def __init__(self, config: DSparkConfig) -> None:
        super().__init__()
        h = config.hidden_size
        self.input_layernorm = RMSNorm(h, config.rms_norm_eps)
        self.self_attn = DSparkAttention(
            h,
            config.num_attention_heads,
            config.num_key_value_heads,
            config.head_dim,
            config.rms_norm_eps,
            config.qk_norm,
        )
        self.post_attention_layernorm = RMSNorm(h, config.rms_norm_eps)
        self.mlp: MoEFFN | DenseFFN
        if config.ffn_type == "moe":
            self.mlp = MoEFFN(
                h,
                config.num_experts,
                config.num_experts_per_tok,
                config.moe_intermediate_size,
                config.shared_expert_intermediate_size if config.shared_expert else None,
            )
        else:
            self.mlp = DenseFFN(h, config.intermediate_size)

    def forward(
        self,
        x: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor],
        context: torch.Tensor,
        context_rope: tuple[torch.Tensor, torch.Tensor],
        mask: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        x = x + self.self_attn(self.input_layernorm(x), rope, context, context_rope, mask)
        y, aux = self.mlp(self.post_attention_layernorm(x))
        return x + y, aux


class DSparkDrafter(nn.Module):
    """DSpark draft model over a shared, frozen target embedding and LM head."""

    def __init__(
        self, config: DSparkConfig, embed_tokens: nn.Embedding, lm_head: nn.Linear
    ) -> None:
        super().__init__()
        if tuple(embed_tokens.weight.shape) != (config.vocab_size, config.hidden_size):
            raise ValueError(
                f"embed_tokens has shape {tuple(embed_tokens.weight.shape)}, the config needs "
                f"(vocab_size={config.vocab_size}, hidden_size={config.hidden_size}); pass the "
                "target's input embedding"
            )
        if tuple(lm_head.weight.shape) != (config.vocab_size, config.hidden_size):
            raise ValueError(
                f"lm_head has shape {tuple(lm_head.weight.shape)}, the config needs "
                f"(vocab_size={config.vocab_size}, hidden_size={config.hidden_size}); pass the "
                "target's LM head"
            )
        self.config = config
        embed_tokens.requires_grad_(False)
        lm_head.requires_grad_(False)
        # A tuple is not registered by nn.Module: the target's modules stay out of
        # parameters(), state_dict() and .to() (they belong to the target).
        self._shared: tuple[nn.Embedding, nn.Linear] = (embed_tokens, lm_head)

        h = config.hidden_size
        self.fc = nn.Linear(config.num_context_features * config.target_hidden_size, h, bias=False)
        self.hidden_norm = RMSNorm(h, config.rms_norm_eps)
        self.layers = nn.ModuleList(
            [DSparkDecoderLayer(config) for _ in range(config.num_hidden_layers)]
        )
        self.norm = RMSNorm(h, config.rms_norm_eps)
        self.rotary = RotaryEmbedding(config.head_dim, config.rope_theta)
        self.markov_head: MarkovHead | None = build_markov_head(config)
        self.confidence_head: ConfidenceHead | None = build_confidence_head(config)
        if config.draft_vocab_size is not None:
            # The token map: saved with the weights, set by set_draft_vocab before training.
            self.register_buffer(
                DRAFT_VOCAB_BUFFER, torch.arange(config.draft_vocab_size, dtype=torch.int64)
            )
        if config.greedy_draft_vocab_size is not None:
            # The greedy map: saved with the weights, never used for drafting here.
            self.register_buffer(
                GREEDY_DRAFT_VOCAB_BUFFER,
                torch.arange(config.greedy_draft_vocab_size, dtype=torch.int64),
            )
        self._lm_head_rows = MappedRows()
        self.reset_parameters()

    # ------------------------------------------------------------------ plumbing

    @property
    def embed_tokens(self) -> nn.Embedding:
        return self._shared[0]

    @property
    def lm_head(self) -> nn.Linear:
        return self._shared[1]

    @property
    def block_size(self) -> int:
        return self.config.block_size

    @property
    def draft_vocab(self) -> DraftVocab | None:
        """The reduced draft vocabulary, ``None`` when the drafter covers all of it."""
        if self.config.draft_vocab_size is None:
            return None
        return DraftVocab(getattr(self, DRAFT_VOCAB_BUFFER).cpu(), self.config.vocab_size)

    @property
    def greedy_vocab(self) -> DraftVocab | None:
        """The greedy map SGLang's argmax draft uses (``None`` when there is none)."""
        if self.config.greedy_draft_vocab_size is None:
            return None
        return DraftVocab(getattr(self, GREEDY_DRAFT_VOCAB_BUFFER).cpu(), self.config.vocab_size)

    @torch.no_grad()
    def with_greedy_vocab(self, vocab: DraftVocab | None) -> DSparkDrafter:
        """A copy of this drafter carrying ``vocab`` as its greedy map (``None``: none).

        Drafting is unchanged (the map only matters to SGLang's argmax draft), so every
        weight is shared by value; the drafter must cover the whole vocabulary.
        """
        if vocab is not None and vocab.vocab_size != self.config.vocab_size:
            raise ValueError(
                f"greedy map over a {vocab.vocab_size}-token vocabulary, but the drafter's "
                f"target has {self.config.vocab_size}; build the map for this target"
            )
        size = None if vocab is None else vocab.size
        config = replace(self.config, greedy_draft_vocab_size=size)  # validates
        out = DSparkDrafter(config, self.embed_tokens, self.lm_head)
        state = self.state_dict()
        state.pop(GREEDY_DRAFT_VOCAB_BUFFER, None)
        if vocab is not None:
            state[GREEDY_DRAFT_VOCAB_BUFFER] = vocab.ids.clone()
        out.load_state_dict(state)
        return out.to(next(self.parameters()).device)

    @torch.no_grad()
    def set_draft_vocab(self, vocab: DraftVocab) -> None:
        """Install the token map (``DraftVocab.from_counts`` on the training data)."""
        if self.config.draft_vocab_size is None:
            raise ValueError(
                "this drafter covers the whole vocabulary (draft_vocab_size is null); build "
                "it with draft_vocab_size=K to give it a token map"
            )
        if vocab.size != self.config.draft_vocab_size or vocab.vocab_size != self.config.vocab_size:
            raise ValueError(
                f"token map of {vocab.size} of {vocab.vocab_size} tokens, but the drafter has "
                f"draft_vocab_size={self.config.draft_vocab_size} of {self.config.vocab_size}"
            )
        buf = getattr(self, DRAFT_VOCAB_BUFFER)
        buf.copy_(vocab.ids.to(buf.device))
        self._lm_head_rows.clear()

    @torch.no_grad()
    def restricted_to(self, vocab: DraftVocab) -> DSparkDrafter:
        """A copy of this drafter that drafts over ``vocab`` only (no retraining).

        Its logits are this drafter's logits at the map's tokens: the LM head is the
        target's restricted to ``vocab.ids`` and the Markov head's output keeps the rows
        of those tokens, so its draft distribution is this drafter's conditioned on the
        map (renormalised over it). Verification stays lossless for any draft
        distribution; what is lost is the drafter's mass outside the map. Everything
        else (backbone, confidence head, the Markov input table) is shared by value.
        ``vocab`` must lie inside this drafter's own map when it has one. A greedy map
        is dropped: the copy drafts over ``vocab`` for every request.
        """
        if vocab.vocab_size != self.config.vocab_size:
            raise ValueError(
                f"token map over a {vocab.vocab_size}-token vocabulary, but the drafter's "
                f"target has {self.config.vocab_size}; build the map for this target"
            )
        own = self.draft_vocab
        rows = vocab.ids
        if own is not None:
            rows = own.target_to_draft()[vocab.ids]
            if bool((rows < 0).any()):
                raise ValueError(
                    "the token map holds tokens outside this drafter's own map "
                    f"(draft_vocab_size={own.size}); a drafter can only be narrowed"
                )
        config = replace(self.config, draft_vocab_size=vocab.size, greedy_draft_vocab_size=None)
        out = DSparkDrafter(config, self.embed_tokens, self.lm_head)
        state = self.state_dict()
        state.pop(GREEDY_DRAFT_VOCAB_BUFFER, None)
        state[DRAFT_VOCAB_BUFFER] = vocab.ids.clone()
        for name, t in state.items():
            if name.endswith("markov_w2.weight"):
                state[name] = t[rows.to(t.device)].clone()
        out.load_state_dict(state)
        return out.to(next(self.parameters()).device)

    def to_target_vocab(self, draft_index: torch.Tensor) -> torch.Tensor:
        """Draft-vocabulary indices -> target token ids (identity without a token map)."""
        if self.config.draft_vocab_size is None:
            return draft_index
        return getattr(self, DRAFT_VOCAB_BUFFER)[draft_index.long()]

    def scatter_to_target_vocab(self, values: torch.Tensor, fill: float = 0.0) -> torch.Tensor:
        """``[..., K]`` over the draft vocabulary -> ``[..., V]`` (``fill`` outside it)."""
        if self.config.draft_vocab_size is None:
            return values
        return scatter_to_vocab(
            values, getattr(self, DRAFT_VOCAB_BUFFER), self.config.vocab_size, fill
        )

    @torch.no_grad()
    def reset_parameters(self, std: float = 0.02) -> None:
        """Normal(0, std) matrices, zero biases, unit norms (HF-style init)."""
        for module in self.modules():
            if isinstance(module, nn.Linear | nn.Embedding):
                nn.init.normal_(module.weight, std=std)
                if isinstance(module, nn.Linear) and module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, RMSNorm):
                nn.init.ones_(module.weight)
            elif isinstance(module, ExpertBank):
                nn.init.normal_(module.gate_up_proj, std=std)
                nn.init.normal_(module.down_proj, std=std)

    def project_context(self, context_hidden: torch.Tensor) -> torch.Tensor:
        """``c = hidden_norm(fc(concat_l h^(l)))``: ``[..., n*H_t] -> [..., H]``."""
        expected = self.fc.in_features
        if context_hidden.shape[-1] != expected:
            raise ValueError(
                f"context_hidden has {context_hidden.shape[-1]} features, expected {expected} "
                f"({self.config.num_context_features} target layers x "
                f"{self.config.target_hidden_size}); capture target_layer_ids="
                f"{self.config.target_layer_ids}"
            )
        return self.hidden_norm(self.fc(context_hidden.to(self.fc.weight.dtype)))

    def block_input_ids(self, anchor_tokens: torch.Tensor) -> torch.Tensor:
        """``[..., B]``: the anchor followed by ``B-1`` mask tokens."""
        ids = anchor_tokens.new_full(
            (*anchor_tokens.shape, self.block_size), self.config.mask_token_id
        )
        ids[..., 0] = anchor_tokens
        return ids

    def compute_base_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Target LM head on draft hidden states, as float32 logits ``[..., K]``.

        A reduced drafter multiplies by the ``K`` rows of the frozen LM head it drafts
        over, gathered once and reused while the head's storage and the map are unchanged.
        """
        head = self.lm_head
        if self.config.draft_vocab_size is None:
            return head(hidden.to(head.weight.dtype)).float()
        weight = head.weight
        ids = getattr(self, DRAFT_VOCAB_BUFFER)
        rows = self._lm_head_rows.get(weight, ids)
        bias = None if head.bias is None else head.bias.detach()[ids.to(weight.device)]
        return torch.nn.functional.linear(hidden.to(rows.dtype), rows, bias).float()

    def _run_layers(
        self,
        x: torch.Tensor,
        positions: torch.Tensor,
        context: torch.Tensor,
        context_positions: torch.Tensor,
        mask: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Shared by both entry points: ``x [N,Q,H]`` -> ``(norm(x_L) [N,Q,H], aux)``."""
        rope = self.rotary(positions)
        context_rope = self.rotary(context_positions)
        aux = x.new_zeros((), dtype=torch.float32)
        for layer in self.layers:
            x, layer_aux = layer(x, rope, context, context_rope, mask)
            aux = aux + layer_aux
        return self.norm(x), aux

    # ------------------------------------------------------------------ inference

    def forward_block(
        self,
        context_hidden: torch.Tensor,
        context_positions: torch.Tensor,
        context_valid: torch.Tensor,
        anchor_tokens: torch.Tensor,
        anchor_positions: torch.Tensor,
    ) -> DraftBlock:
        """One block per request for ``N`` requests.

        ``context_hidden`` ``[N, C, n*H_t]`` (raw concatenated target layers),
        ``context_positions`` ``[N, C]`` int64 absolute positions,
        ``context_valid`` ``[N, C]`` bool (False = padding of a ragged batch),
        ``anchor_tokens``/``anchor_positions`` ``[N]``. Rows at positions ``>= p``
        or ``< p - W`` are masked, so callers may pass a superset of the context.
        """
        n, b = anchor_tokens.shape[0], self.block_size
        x = self.embed_tokens(self.block_input_ids(anchor_tokens)).to(self.fc.weight.dtype)
        positions = anchor_positions.long().unsqueeze(-1) + torch.arange(b, device=x.device)
        context = self.project_context(context_hidden)
        ctx_mask = context_visibility(
            context_positions.long(),
            context_valid.bool(),
            anchor_positions.long().unsqueeze(-1),
            self.config.sliding_window,
        ).expand(n, b, -1)
        block_mask = torch.ones(n, b, b, dtype=torch.bool, device=x.device)
        mask = torch.cat([ctx_mask, block_mask], dim=-1)
        hidden, aux = self._run_layers(x, positions, context, context_positions.long(), mask)
        return DraftBlock(hidden=hidden, base_logits=self.compute_base_logits(hidden), aux_loss=aux)

    def forward(
        self,
        context_hidden: torch.Tensor,
        context_positions: torch.Tensor,
        context_valid: torch.Tensor,
        anchor_tokens: torch.Tensor,
        anchor_positions: torch.Tensor,
    ) -> DraftBlock:
        """Alias of ``forward_block``."""
        return self.forward_block(
            context_hidden, context_positions, context_valid, anchor_tokens, anchor_positions
        )

    # ------------------------------------------------------------------ training

    def forward_anchors(
        self,
        context_hidden: torch.Tensor,
        anchors: torch.Tensor,
        anchor_tokens: torch.Tensor,
        context_valid: torch.Tensor | None = None,
    ) -> AnchorHidden:
        """Many blocks per sequence in one pass (training).

        ``context_hidden`` ``[S, T, n*H_t]`` holds the target hidden states of
        positions ``0..T-1``; ``anchors`` ``[S, A]`` are anchor positions and
        ``anchor_tokens`` ``[S, A]`` the tokens there; ``context_valid`` ``[S, T]``
        marks real (non-padding) positions. The ``A*B`` block rows of a sequence
        form one query set and one mask: row ``(a, j)`` sees context ``t`` iff
        ``t < p_a`` (and within the window) and block rows ``(a, *)`` only, so the
        result equals ``A`` separate ``forward_block`` calls.
        """
        s, t = context_hidden.shape[:2]
        a, b = anchors.shape[1], self.block_size
        device = context_hidden.device
        anchors = anchors.long()
        x = self.embed_tokens(self.block_input_ids(anchor_tokens)).to(self.fc.weight.dtype)
        x = x.reshape(s, a * b, -1)
        positions = (anchors.unsqueeze(-1) + torch.arange(b, device=device)).reshape(s, a * b)
        context_positions = torch.arange(t, device=device).expand(s, t)
        if context_valid is None:
            context_valid = torch.ones(s, t, dtype=torch.bool, device=device)
        ctx_mask = context_visibility(
            context_positions, context_valid.bool(), anchors, self.config.sliding_window
        )  # [S, A, T]
        ctx_mask = ctx_mask.unsqueeze(2).expand(s, a, b, t).reshape(s, a * b, t)
        block_of_row = torch.arange(a, device=device).repeat_interleave(b)
        block_mask = (block_of_row[:, None] == block_of_row[None, :]).expand(s, -1, -1)
        mask = torch.cat([ctx_mask, block_mask], dim=-1)
        context = self.project_context(context_hidden)
        hidden, aux = self._run_layers(x, positions, context, context_positions, mask)
        return AnchorHidden(hidden=hidden.reshape(s, a, b, -1), aux_loss=aux)
