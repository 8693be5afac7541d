"""Draft attention: block queries over [injected target context ; own block].

Equations (per draft layer, per request; DSPARK.md "Target context injection"):

    c            = hidden_norm(fc(concat_l h_t^(l)))           context rows, [C, H]
    q, k, v      = Wq x, Wk x, Wv x                              block rows,   [B, ...]
    k_c, v_c     = Wk c, Wv c                                    same projections
    q, k, k_c    = RMSNorm_head(.)  (if qk_norm), then RoPE at absolute positions
    out          = softmax(q [k_c ; k]^T / sqrt(d) + mask) [v_c ; v]

The mask lets block query of a block anchored at ``p`` see context row ``t``
iff ``valid[t] and pos[t] < p and (W is None or pos[t] >= p - W)`` and every
row of its own block (bidirectional); blocks never see each other. Because a
block always sees itself, no softmax row is empty.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class RMSNorm(nn.Module):
    """``x / rms(x) * w`` computed in float32 (Llama/Qwen3), cast back to the input dtype."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return (self.weight.float() * x32).to(x.dtype)


class RotaryEmbedding(nn.Module):
    """Neox ("rotate-half") RoPE at arbitrary absolute positions.

    ``inv_freq_i = theta^(-2i/d)``; a vector at position ``m`` is rotated by
    ``x cos(m f) + rotate_half(x) sin(m f)`` with ``f = [inv_freq, inv_freq]``.
    The frequencies are a non-persistent buffer (never in a checkpoint).
    """

    def __init__(self, head_dim: int, theta: float) -> None:
        super().__init__()
        # float32, the same formula as SGLang's rotary cache and HF's default RoPE.
        inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def forward(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``cos, sin`` of shape ``[*positions.shape, head_dim]`` (float32)."""
        angles = positions.to(torch.float32).unsqueeze(-1) * self.inv_freq
        emb = torch.cat([angles, angles], dim=-1)
        return emb.cos(), emb.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x`` ``[N, heads, L, d]`` by ``cos/sin`` ``[N, L, d]`` (rotate-half form)."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    return (x.float() * cos + rotated.float() * sin).to(x.dtype)


def context_visibility(
    context_positions: torch.Tensor,
    context_valid: torch.Tensor,
    anchor_positions: torch.Tensor,
    window: int | None,
) -> torch.Tensor:
    """Which context rows each anchor may see: ``[N, A, C]`` bool.

    ``context_positions``/``context_valid`` are ``[N, C]``, ``anchor_positions``
    ``[N, A]``. Row ``t`` is visible to anchor ``p`` iff it is valid, strictly
    before ``p`` and, with a window ``W``, not before ``p - W``.
    """
    pos = context_positions.unsqueeze(1)  # [N, 1, C]
    p = anchor_positions.unsqueeze(-1)  # [N, A, 1]
    visible = context_valid.unsqueeze(1) & (pos < p)
    if window is not None:
        visible = visible & (pos >= p - window)
    return visible


class DSparkAttention(nn.Module):
    """GQA self-attention of block tokens over ``[context ; block]`` keys.

    Parameter names follow HF/SGLang (``q_proj``, ``k_proj``, ``v_proj``,
    ``o_proj``, ``q_norm``, ``k_norm``) so SGLang's DFlash/DSpark loader maps them.
    """

    def __init__(
        self,
        hidden_size: int,
        num_heads: int,
        num_kv_heads: int,
        head_dim: int,
        rms_norm_eps: float,
        qk_norm: bool,
    ) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.q_proj = nn.Linear(hidden_size, num_heads * head_dim, bias=False)
        self.k_proj = nn.Linear(hidden_size, num_kv_heads * head_dim, bias=False)
        self.v_proj = nn.Linear(hidden_size, num_kv_heads * head_dim, bias=False)
        self.o_proj = nn.Linear(num_heads * head_dim, hidden_size, bias=False)
        self.q_norm: RMSNorm | None = RMSNorm(head_dim, rms_norm_eps) if qk_norm else None
        self.k_norm: RMSNorm | None = RMSNorm(head_dim, rms_norm_eps) if qk_norm else None

    def _heads(self, x: torch.Tensor, heads: int) -> torch.Tensor:
        """``[N, L, heads*d]`` -> ``[N, heads, L, d]``."""
        n, length, _ = x.shape
        return x.view(n, length, heads, self.head_dim).transpose(1, 2)

    def project_kv(
        self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys (normed, rotated) and values of rows ``x`` ``[N, L, H]``."""
        k = self._heads(self.k_proj(x), self.num_kv_heads)
        v = self._heads(self.v_proj(x), self.num_kv_heads)
        if self.k_norm is not None:
            k = self.k_norm(k)
        return apply_rope(k, *rope), v

    def forward(
        self,
        x: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor],
        context: torch.Tensor,
        context_rope: tuple[torch.Tensor, torch.Tensor],
        mask: torch.Tensor,
    ) -> torch.Tensor:
        """Attend block rows ``x`` ``[N, Q, H]`` over ``[context [N, C, H] ; x]``.

        ``mask`` is ``[N, Q, C + Q]`` bool (True = may attend).
        """
        q = self._heads(self.q_proj(x), self.num_heads)
        if self.q_norm is not None:
            q = self.q_norm(q)
        q = apply_rope(q, *rope)
        k_blk, v_blk = self.project_kv(x, rope)
        k_ctx, v_ctx = self.project_kv(context, context_rope)
        k = torch.cat([k_ctx, k_blk], dim=2)
        v = torch.cat([v_ctx, v_blk], dim=2)
        groups = self.num_heads // self.num_kv_heads
        if groups > 1:
            k = k.repeat_interleave(groups, dim=1)
            v = v.repeat_interleave(groups, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask.unsqueeze(1))
        n, _, length, _ = out.shape
        return self.o_proj(out.transpose(1, 2).reshape(n, length, -1))
