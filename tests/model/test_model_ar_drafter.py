"""The EAGLE3-style AR drafter: step-by-step inference computes what training trains."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from dspark_sglang.model.ar_drafter import (
    ARDrafter,
    ARDrafterConfig,
    load_ar_drafter,
    save_ar_drafter,
)

V, H = 50, 32


def _drafter(seed: int = 0) -> ARDrafter:
    torch.manual_seed(seed)
    cfg = ARDrafterConfig(
        hidden_size=H,
        vocab_size=V,
        target_layer_ids=(0, 1),
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=64,
        block_size=4,
    )
    return ARDrafter(cfg, nn.Embedding(V, H), nn.Linear(H, V, bias=False)).eval()


def test_propose_with_teacher_forcing_equals_training_forward() -> None:
    d = _drafter()
    g = torch.Generator().manual_seed(1)
    ctx, tok = torch.randn(2, 20, 2 * H, generator=g), torch.randint(0, V, (2, 20), generator=g)
    anchors = torch.tensor([[1, 9, 15], [5, 10, 14]])
    with torch.no_grad():
        train_logits = d.lm_head(d.forward_train(ctx, tok, anchors))  # [S, A, B, V]
    for s in range(2):
        for a in range(3):
            p = int(anchors[s, a])
            _, probs, logits = d.propose(
                ctx[s : s + 1, :p],
                tok[s : s + 1, : p + 1],
                forced_tokens=tok[s : s + 1, p + 1 : p + 5],
            )
            torch.testing.assert_close(logits[0], train_logits[s, a], atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(probs[0].sum(-1), torch.ones(4))


def test_context_after_the_anchor_is_never_seen() -> None:
    d = _drafter()
    ctx, tok = torch.randn(1, 20, 2 * H), torch.randint(0, V, (1, 20))
    anchors = torch.tensor([[8]])
    ctx2, tok2 = ctx.clone(), tok.clone()
    ctx2[:, 8:] = torch.randn(1, 12, 2 * H)  # positions >= p: not available at serving time
    tok2[:, 13:] = (tok2[:, 13:] + 1) % V  # beyond the block's teacher-forced tokens
    with torch.no_grad():
        torch.testing.assert_close(
            d.forward_train(ctx, tok, anchors), d.forward_train(ctx2, tok2, anchors)
        )


def test_sampled_proposals_follow_their_reported_distribution() -> None:
    # 4000 one-token proposals from a fixed context: the empirical distribution of
    # token 0 must match the returned probs (chi-square, p = 0.001).
    d = _drafter()
    ctx, tok = torch.randn(1, 6, 2 * H), torch.randint(0, V, (1, 7))
    n = 4000
    g = torch.Generator().manual_seed(0)
    toks, probs, _ = d.propose(
        ctx.expand(n, -1, -1), tok.expand(n, -1), num_tokens=1, temperature=0.7, generator=g
    )
    p = probs[0, 0]
    assert torch.allclose(probs[:, 0], p.expand(n, -1))
    counts = torch.bincount(toks[:, 0], minlength=V).float()
    big = p * n >= 5
    obs = torch.cat([counts[big], counts[~big].sum().view(1)])
    exp = torch.cat([p[big] * n, (p[~big] * n).sum().view(1)])
    chi2 = float(((obs - exp) ** 2 / exp.clamp_min(1e-9)).sum())  # empty pool: 0/eps = 0
    from scipy.stats import chi2 as chi2_dist

    assert chi2 < chi2_dist.ppf(0.999, int(big.sum()))


def test_save_load_round_trip_and_frozen_shared_weights(tmp_path: Path) -> None:
    d = _drafter()
    assert not any(p.requires_grad for p in d.embed_tokens.parameters())
    assert not any(p.requires_grad for p in d.lm_head.parameters())
    save_ar_drafter(d, tmp_path)
    d2 = load_ar_drafter(tmp_path, d.embed_tokens, d.lm_head)
    for (k, a), (_, b) in zip(d.state_dict().items(), d2.state_dict().items(), strict=True):
        assert torch.equal(a, b), k
    (tmp_path / "ar_config.json").write_text(
        (tmp_path / "ar_config.json").read_text().replace('"anchor_next"', '"dflash"')
    )
    with pytest.raises(ValueError, match="slot_convention"):
        load_ar_drafter(tmp_path, d.embed_tokens, d.lm_head)


def test_bad_config_is_refused() -> None:
    with pytest.raises(ValueError, match="num_attention_heads"):
        ARDrafterConfig(hidden_size=30, vocab_size=V, target_layer_ids=(0,), num_attention_heads=4)
    with pytest.raises(ValueError, match="unknown ar_drafter config keys"):
        ARDrafterConfig.from_dict(
            {"hidden_size": 8, "vocab_size": 8, "target_layer_ids": [0], "layers": 2}
        )
