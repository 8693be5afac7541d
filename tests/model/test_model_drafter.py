"""The drafter backbone: shapes, shared target modules, masks, and forward_anchors."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from dspark_sglang.model.drafter import DraftBlock, DSparkDrafter

N, C = 3, 30
FEATURES = 3 * 64  # 3 target layers x H_t


def _inputs(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        "context_hidden": torch.randn(N, C, FEATURES, generator=g),
        "context_positions": torch.arange(C).expand(N, C).clone(),
        "context_valid": torch.ones(N, C, dtype=torch.bool),
        "anchor_tokens": torch.tensor([5, 17, 300]),
        "anchor_positions": torch.tensor([12, 20, 29]),
    }


def _run(drafter: DSparkDrafter, inputs: dict[str, torch.Tensor]) -> DraftBlock:
    with torch.no_grad():
        return drafter.forward_block(**inputs)


def test_shapes_and_block_input(make_drafter: Callable[..., DSparkDrafter]) -> None:
    drafter = make_drafter()
    block = _run(drafter, _inputs())
    assert block.hidden.shape == (N, 7, 64)
    assert block.base_logits.shape == (N, 7, 512) and block.base_logits.dtype == torch.float32
    assert block.aux_loss.ndim == 0 and torch.isfinite(block.aux_loss)
    ids = drafter.block_input_ids(torch.tensor([5, 9]))
    assert ids.tolist() == [[5, 1, 1, 1, 1, 1, 1], [9, 1, 1, 1, 1, 1, 1]]
    torch.testing.assert_close(block.base_logits, drafter.lm_head(block.hidden))


def test_target_embedding_and_head_are_shared_frozen_and_not_saved(
    make_drafter: Callable[..., DSparkDrafter],
) -> None:
    drafter = make_drafter()
    own = {id(p) for p in drafter.parameters()}
    assert id(drafter.embed_tokens.weight) not in own and id(drafter.lm_head.weight) not in own
    assert not drafter.embed_tokens.weight.requires_grad
    assert not drafter.lm_head.weight.requires_grad
    assert not any(k.startswith(("embed_tokens", "lm_head")) for k in drafter.state_dict())
    assert not any("inv_freq" in k for k in drafter.state_dict())
    # Training: gradients reach the drafter but never the target's modules.
    drafter.train()
    block = drafter.forward_block(**_inputs())
    (block.base_logits.logsumexp(-1).mean() + block.aux_loss).backward()
    assert drafter.fc.weight.grad is not None and drafter.fc.weight.grad.abs().sum() > 0
    assert drafter.layers[0].self_attn.k_proj.weight.grad is not None
    assert drafter.embed_tokens.weight.grad is None and drafter.lm_head.weight.grad is None


@pytest.mark.parametrize("overrides", [{}, {"ffn_type": "dense", "qk_norm": False}])
def test_invisible_context_rows_do_not_matter(
    make_drafter: Callable[..., DSparkDrafter], overrides: dict[str, object]
) -> None:
    """Rows at positions >= p, < p - W, or marked padding can be anything."""
    drafter = make_drafter(**overrides)
    base = _inputs()
    ref = _run(drafter, base)
    pos = base["context_positions"]
    p = base["anchor_positions"][:, None]
    window = drafter.config.sliding_window
    assert window == 8
    invisible = (pos >= p) | (pos < p - window)
    padded = dict(base)
    padded["context_valid"] = base["context_valid"].clone()
    padded["context_valid"][1, 15] = False  # a padding row inside request 1's window
    ref_padded = _run(drafter, padded)
    invisible_padded = invisible.clone()
    invisible_padded[1, 15] = True
    noisy = dict(padded)
    noisy["context_hidden"] = base["context_hidden"] + 100.0 * invisible_padded[..., None] * (
        torch.randn(N, C, FEATURES, generator=torch.Generator().manual_seed(7))
    )
    out = _run(drafter, noisy)
    torch.testing.assert_close(out.hidden, ref_padded.hidden, rtol=0, atol=1e-6)
    torch.testing.assert_close(out.base_logits, ref_padded.base_logits, rtol=0, atol=1e-5)
    # ... while the padding flag itself did matter (the row was visible before).
    assert not torch.allclose(ref_padded.hidden[1], ref.hidden[1], atol=1e-4)


def test_each_visible_context_row_matters_and_requests_are_independent(
    make_drafter: Callable[..., DSparkDrafter],
) -> None:
    drafter = make_drafter()
    base = _inputs()
    ref = _run(drafter, base)
    for i, (lo, hi) in enumerate([(4, 12), (12, 20), (21, 29)]):
        for t in (lo, hi - 1):  # both ends of the window [p - W, p)
            noisy = dict(base)
            noisy["context_hidden"] = base["context_hidden"].clone()
            noisy["context_hidden"][i, t] += 3.0
            out = _run(drafter, noisy)
            for j in range(N):
                changed = not torch.allclose(out.hidden[j], ref.hidden[j], atol=1e-5)
                assert changed == (j == i), (i, t, j)
    # Changing one request's anchor token changes only that request's block.
    other = dict(base)
    other["anchor_tokens"] = torch.tensor([5, 18, 300])
    out = _run(drafter, other)
    # (Not bit-exact: the MoE groups a different token set per expert, so the
    # matmul blocking differs; 1e-6 is float32 rounding, a real leak is O(1e-1).)
    torch.testing.assert_close(out.hidden[[0, 2]], ref.hidden[[0, 2]], rtol=0, atol=1e-6)
    assert not torch.allclose(out.hidden[1], ref.hidden[1], atol=1e-5)


def test_block_positions_are_bidirectional(make_drafter: Callable[..., DSparkDrafter]) -> None:
    """Every slot depends on the anchor, and the anchor slot depends on the later
    (mask) slots: a shorter block with the same weights changes slot 0."""
    drafter = make_drafter()
    ref = _run(drafter, _inputs())
    other = _inputs()
    other["anchor_tokens"] = torch.tensor([6, 17, 300])
    out = _run(drafter, other)
    assert all(not torch.allclose(out.hidden[0, k], ref.hidden[0, k], atol=1e-5) for k in range(7))
    short = make_drafter(block_size=3)
    short_out = _run(short, _inputs())
    assert not torch.allclose(short_out.hidden[0, 0], ref.hidden[0, 0], atol=1e-5)


def test_ragged_context_padding_equals_unpadded_request(
    make_drafter: Callable[..., DSparkDrafter],
) -> None:
    drafter = make_drafter(sliding_window=None)
    base = _inputs()
    # Request 0 really has only 10 context rows: left-aligned, then padding.
    padded = dict(base)
    padded["context_valid"] = base["context_valid"].clone()
    padded["context_valid"][0, 10:] = False
    padded["anchor_positions"] = torch.tensor([10, 20, 29])
    batched = _run(drafter, padded)
    alone = _run(
        drafter,
        {
            "context_hidden": base["context_hidden"][:1, :10],
            "context_positions": base["context_positions"][:1, :10],
            "context_valid": torch.ones(1, 10, dtype=torch.bool),
            "anchor_tokens": base["anchor_tokens"][:1],
            "anchor_positions": torch.tensor([10]),
        },
    )
    torch.testing.assert_close(batched.hidden[:1], alone.hidden, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "overrides",
    [{}, {"sliding_window": None, "ffn_type": "dense"}, {"sliding_window": 3, "block_size": 4}],
)
def test_forward_anchors_equals_per_anchor_forward_block(
    make_drafter: Callable[..., DSparkDrafter], overrides: dict[str, object]
) -> None:
    drafter = make_drafter(**overrides)
    g = torch.Generator().manual_seed(11)
    s, t = 2, 24
    context = torch.randn(s, t, FEATURES, generator=g)
    anchors = torch.tensor([[0, 5, 13, 23], [2, 9, 10, 17]])
    tokens = torch.randint(0, 512, (s, 4), generator=g)
    valid = torch.ones(s, t, dtype=torch.bool)
    valid[1, 18:] = False  # sequence 1 is 18 tokens long
    with torch.no_grad():
        out = drafter.forward_anchors(context, anchors, tokens, context_valid=valid)
        assert out.hidden.shape == (s, 4, drafter.block_size, 64)
        for i in range(s):
            ref = drafter.forward_block(
                context[i].expand(4, t, FEATURES),
                torch.arange(t).expand(4, t),
                valid[i].expand(4, t),
                tokens[i],
                anchors[i],
            )
            torch.testing.assert_close(out.hidden[i], ref.hidden, rtol=1e-4, atol=1e-5)


def test_context_feature_width_is_checked(make_drafter: Callable[..., DSparkDrafter]) -> None:
    drafter = make_drafter()
    bad = _inputs()
    bad["context_hidden"] = bad["context_hidden"][..., :64]
    with pytest.raises(ValueError, match="target_layer_ids"):
        _run(drafter, bad)
