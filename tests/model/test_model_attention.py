"""RMSNorm, RoPE and the context-visibility rule of the draft attention."""

from __future__ import annotations

import torch
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

from dspark_sglang.model.attention import (
    DSparkAttention,
    RMSNorm,
    RotaryEmbedding,
    apply_rope,
    context_visibility,
)


def test_rmsnorm_matches_formula() -> None:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 5, 8, generator=g)
    norm = RMSNorm(8, eps=1e-6)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(8, generator=g))
    expected = x / torch.sqrt((x * x).mean(-1, keepdim=True) + 1e-6) * norm.weight
    torch.testing.assert_close(norm(x), expected)


def test_rope_matches_transformers_llama_at_absolute_positions() -> None:
    head_dim, theta = 16, 50000.0
    cfg = LlamaConfig(
        hidden_size=64,
        num_attention_heads=4,
        head_dim=head_dim,
        rope_parameters={"rope_type": "default", "rope_theta": theta},
    )
    hf_rope = LlamaRotaryEmbedding(cfg)
    g = torch.Generator().manual_seed(1)
    q = torch.randn(2, 4, 6, head_dim, generator=g)
    k = torch.randn(2, 4, 6, head_dim, generator=g)
    positions = torch.tensor([[0, 1, 2, 100, 101, 500], [7, 3, 9, 11, 1000, 4]])
    # float32 angles at position 1000 carry ~1e-5 rounding in either implementation.
    cos_hf, sin_hf = hf_rope(q, positions)
    q_hf, k_hf = apply_rotary_pos_emb(q, k, cos_hf, sin_hf)
    cos, sin = RotaryEmbedding(head_dim, theta)(positions)
    torch.testing.assert_close(apply_rope(q, cos, sin), q_hf, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(apply_rope(k, cos, sin), k_hf, rtol=1e-4, atol=1e-4)


def test_rope_scores_depend_only_on_relative_position() -> None:
    rope = RotaryEmbedding(16, 10000.0)
    g = torch.Generator().manual_seed(2)
    q, k = torch.randn(1, 1, 1, 16, generator=g), torch.randn(1, 1, 1, 16, generator=g)

    def score(m: int, n: int) -> float:
        qm = apply_rope(q, *rope(torch.tensor([[m]])))
        kn = apply_rope(k, *rope(torch.tensor([[n]])))
        return float((qm * kn).sum())

    assert abs(score(10, 3) - score(107, 100)) < 1e-4
    assert abs(score(10, 3) - score(10, 4)) > 1e-3


def test_context_visibility_truth_table() -> None:
    pos = torch.arange(10).expand(2, 10)
    valid = torch.ones(2, 10, dtype=torch.bool)
    valid[1, 6] = False
    anchors = torch.tensor([[5, 0], [9, 7]])
    vis = context_visibility(pos, valid, anchors, window=3)
    assert vis[0, 0].nonzero().flatten().tolist() == [2, 3, 4]
    assert vis[0, 1].nonzero().flatten().tolist() == []
    assert vis[1, 0].nonzero().flatten().tolist() == [7, 8]  # 6 is padding
    assert vis[1, 1].nonzero().flatten().tolist() == [4, 5]
    unbounded = context_visibility(pos, valid, anchors, window=None)
    assert unbounded[0, 0].nonzero().flatten().tolist() == [0, 1, 2, 3, 4]


def test_attention_gqa_equals_explicit_softmax() -> None:
    """One layer against a hand-written masked softmax over [context ; block]."""
    torch.manual_seed(3)
    attn = DSparkAttention(
        32, num_heads=4, num_kv_heads=2, head_dim=8, rms_norm_eps=1e-6, qk_norm=True
    )
    rope = RotaryEmbedding(8, 10000.0)
    x, ctx = torch.randn(1, 3, 32), torch.randn(1, 5, 32)
    pos, ctx_pos = torch.tensor([[5, 6, 7]]), torch.arange(5).unsqueeze(0)
    mask = torch.ones(1, 3, 8, dtype=torch.bool)
    mask[0, :, 1] = False
    out = attn(x, rope(pos), ctx, rope(ctx_pos), mask)

    def heads(t: torch.Tensor, h: int) -> torch.Tensor:
        return t.view(1, -1, h, 8).transpose(1, 2)

    q = apply_rope(attn.q_norm(heads(attn.q_proj(x), 4)), *rope(pos))  # type: ignore[misc]
    keys = torch.cat([ctx, x], dim=1)
    k_pos = torch.cat([ctx_pos, pos], dim=1)
    k = apply_rope(attn.k_norm(heads(attn.k_proj(keys), 2)), *rope(k_pos))  # type: ignore[misc]
    v = heads(attn.v_proj(keys), 2)
    k, v = k[:, [0, 0, 1, 1]], v[:, [0, 0, 1, 1]]  # query head h uses kv head h // 2
    scores = (q @ k.transpose(-1, -2)) / 8**0.5
    scores = scores.masked_fill(~mask.unsqueeze(1), float("-inf"))
    expected = attn.o_proj((scores.softmax(-1) @ v).transpose(1, 2).reshape(1, 3, 32))
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-6)
