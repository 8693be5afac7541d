"""The layers of our MoE + sliding-window drafter's SGLang model class.

``moe_draft_model.DSparkMoEDraftModel`` builds its decoder layers from these:

* ``windowed_block_attention`` / ``DSparkWindowedAttention``: our anchor-relative
  sliding window over the draft KV pool (every query of a block anchored at ``p`` sees
  context positions ``[p - W, p - 1]`` plus its whole block), computed with static
  shapes so it is graph-capturable. A drafter without a window uses SGLang's attention
  backend unchanged.
* ``dense_expert_mix`` / ``DSparkInferenceMoE``: ``model/moe.py``'s top-k routed MoE
  FFN with the routed experts evaluated densely over all tokens (no host sync, static
  shapes).
* ``DSparkMoEDecoderLayer``: SGLang's DFlash decoder layer with the windowed attention.

Why each differs from SGLang's dense class is in ``moe_draft_model``'s docstring.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from sglang.srt.model_executor.forward_batch_info import ForwardBatch
from sglang.srt.model_executor.forward_context import get_req_to_token_pool, get_token_to_kv_pool
from sglang.srt.models.dflash import DFlashAttention, DFlashDecoderLayer
from sglang.srt.models.utils import apply_qk_norm

from dspark_sglang.model.moe import MoEFFN, route


def windowed_block_attention(
    q: torch.Tensor,
    k_block: torch.Tensor,
    v_block: torch.Tensor,
    *,
    key_buffer: torch.Tensor,
    value_buffer: torch.Tensor,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    prefix_lens: torch.Tensor,
    window: int,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    scaling: float,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
) -> torch.Tensor:
    """Anchor-relative sliding-window attention of ``bs`` uniform blocks.

    Request ``b`` owns query rows ``b*Q .. b*Q+Q-1`` (``q`` ``[bs*Q, H*D]``,
    already normed and rotated); its anchor sits at position ``p_b =
    prefix_lens[b]``. Keys: the context rows of positions ``p_b - W .. p_b - 1``
    (those ``>= 0``) read from the pool via ``req_to_token`` (stored normed and
    rotated by context injection), then the block's own ``k_block``/``v_block``.

    Invariant: every query of block ``b`` attends exactly to
    ``{t : max(0, p_b - W) <= t < p_b} U block_b`` -- ``attention.py``'s mask.
    """
    bs = prefix_lens.shape[0]
    q_len = q.shape[0] // bs
    device = q.device
    offsets = torch.arange(window, device=device)
    ctx_pos = prefix_lens.long()[:, None] - window + offsets  # [bs, W]
    valid = ctx_pos >= 0
    locs = req_to_token[req_pool_indices.long()[:, None], ctx_pos.clamp(min=0)].long()
    k_ctx = key_buffer[locs].to(q.dtype).view(bs, window, num_kv_heads, head_dim)
    v_ctx = value_buffer[locs].to(q.dtype).view(bs, window, num_kv_heads, head_dim)
    if k_scale != 1.0:
        k_ctx = k_ctx * k_scale
    if v_scale != 1.0:
        v_ctx = v_ctx * v_scale
    k_all = torch.cat([k_ctx, k_block.view(bs, q_len, num_kv_heads, head_dim)], dim=1)
    v_all = torch.cat([v_ctx, v_block.view(bs, q_len, num_kv_heads, head_dim)], dim=1)
    mask = torch.cat([valid, valid.new_ones(bs, q_len)], dim=1)  # [bs, W + Q]
    qh = q.view(bs, q_len, num_heads, head_dim).transpose(1, 2)
    kh, vh = k_all.transpose(1, 2), v_all.transpose(1, 2)
    groups = num_heads // num_kv_heads
    if groups > 1:
        # GQA by a static expand (query head h reads kv head h // groups).
        kv_len = kh.shape[2]
        kh = kh[:, :, None].expand(bs, num_kv_heads, groups, kv_len, head_dim)
        vh = vh[:, :, None].expand(bs, num_kv_heads, groups, kv_len, head_dim)
        kh = kh.reshape(bs, num_heads, kv_len, head_dim)
        vh = vh.reshape(bs, num_heads, kv_len, head_dim)
    out = F.scaled_dot_product_attention(
        qh, kh, vh, attn_mask=mask[:, None, None, :], scale=scaling
    )
    return out.transpose(1, 2).reshape(bs * q_len, num_heads * head_dim)


class DSparkWindowedAttention(DFlashAttention):
    """SGLang's draft attention with our anchor-relative window (when the drafter has one)."""

    dspark_window: int | None = None

    def forward(
        self, positions: torch.Tensor, hidden_states: torch.Tensor, forward_batch: ForwardBatch
    ) -> torch.Tensor:
        if self.dspark_window is None or hidden_states.shape[0] == 0:
            return super().forward(positions, hidden_states, forward_batch)
        qkv, _ = self.qkv_proj(hidden_states)
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q, k = apply_qk_norm(q, k, self.q_norm, self.k_norm, self.head_dim, allow_inplace=False)
        q, k = self.rotary_emb(positions, q, k)
        pool = get_token_to_kv_pool()
        layer_id = self.attn.layer_id
        out = windowed_block_attention(
            q,
            k,
            v,
            key_buffer=pool.get_key_buffer(layer_id),
            value_buffer=pool.get_value_buffer(layer_id),
            req_to_token=get_req_to_token_pool().req_to_token,
            req_pool_indices=forward_batch.req_pool_indices,
            prefix_lens=forward_batch.seq_lens,
            window=self.dspark_window,
            num_heads=self.num_heads,
            num_kv_heads=self.num_kv_heads,
            head_dim=self.head_dim,
            scaling=self.scaling,
            k_scale=float(self.attn.k_scale_float or 1.0),
            v_scale=float(self.attn.v_scale_float or 1.0),
        )
        output, _ = self.o_proj(out)
        return output


def dense_expert_mix(
    x: torch.Tensor,
    gate_up_proj: torch.Tensor,
    down_proj: torch.Tensor,
    experts: torch.Tensor,
    weights: torch.Tensor,
) -> torch.Tensor:
    """``sum_{e in S_t} g_{t,e} SwiGLU_e(x_t)`` with static shapes and no host sync.

    Why dense: ``ExpertBank.forward`` groups tokens per expert with
    ``bincount(...).tolist()`` -- a device-to-host sync and data-dependent
    shapes, which stall the GPU every step and cannot be captured in a CUDA
    graph. The drafter is small (few experts, ``bs * gamma`` tokens), so every
    expert runs on every token (``E / k`` times the routed FLOPs, weights read
    once, as in the grouped form) and the outputs are combined with the routing
    weights scattered into a ``[T, E]`` matrix.

    Invariant: equals ``ExpertBank.forward(x, experts, weights)`` -- an expert
    outside a token's top-k contributes exactly nothing (selected by mask, not
    multiplied by 0, so a non-finite output of an unselected expert cannot leak).
    ``x`` ``[T, H]``; ``gate_up_proj`` ``[E, 2I, H]``; ``down_proj`` ``[E, H, I]``;
    ``experts``/``weights`` ``[T, k]``.
    """
    num_tokens, num_experts = x.shape[0], gate_up_proj.shape[0]
    inter = down_proj.shape[-1]
    combine = x.new_zeros(num_tokens, num_experts).scatter(1, experts, weights.to(x.dtype))
    chosen = torch.zeros(num_tokens, num_experts, dtype=torch.bool, device=x.device).scatter(
        1, experts, True
    )
    h = torch.matmul(x, gate_up_proj.transpose(1, 2))  # [E, T, 2I]
    act = F.silu(h[..., :inter]) * h[..., inter:]
    y = torch.matmul(act, down_proj.transpose(1, 2))  # [E, T, H]
    y = torch.where(chosen.t()[..., None], y * combine.t()[..., None], 0.0)
    return y.sum(0)


class DSparkInferenceMoE(MoEFFN):
    """``model/moe.py``'s MoE FFN returning only ``y`` (SGLang's MLP interface).

    Same parameters, routing (``route``: softmax, top-k, renormalised) and
    shared expert as training; the routed experts go through
    :func:`dense_expert_mix` so the forward is graph-capturable.
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        shape = x.shape
        tokens = x.reshape(-1, shape[-1])
        weights, experts, _ = route(self.gate(tokens), self.top_k)
        bank = self.experts
        y = dense_expert_mix(tokens, bank.gate_up_proj, bank.down_proj, experts, weights)
        if self.shared_expert is not None:
            y = y + self.shared_expert(tokens)
        return y.reshape(shape)


class DSparkMoEDecoderLayer(DFlashDecoderLayer):
    attention_cls = DSparkWindowedAttention
