"""MoE routing, the vectorised expert dispatch, and the Switch aux loss."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from dspark_sglang.model.moe import DenseFFN, MoEFFN, load_balancing_loss, route


def _randomise(module: torch.nn.Module, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.3)


def test_route_topk_weights_renormalised() -> None:
    logits = torch.randn(50, 6, generator=torch.Generator().manual_seed(0))
    weights, experts, probs = route(logits, top_k=3)
    torch.testing.assert_close(weights.sum(-1), torch.ones(50))
    torch.testing.assert_close(probs, torch.softmax(logits, -1))
    # the chosen experts are the 3 most probable, weights proportional to their probs
    assert torch.equal(experts, probs.topk(3, dim=-1).indices)
    chosen = probs.gather(-1, experts)
    torch.testing.assert_close(weights, chosen / chosen.sum(-1, keepdim=True))


def test_moe_equals_per_token_reference() -> None:
    torch.manual_seed(0)
    moe = MoEFFN(
        16, num_experts=5, top_k=2, moe_intermediate_size=12, shared_expert_intermediate_size=8
    )
    _randomise(moe, 1)
    x = torch.randn(3, 7, 16, generator=torch.Generator().manual_seed(2))
    y, aux = moe(x)

    tokens = x.reshape(-1, 16)
    probs = torch.softmax(moe.gate(tokens), -1)
    inter = 12
    expected = []
    for t in range(tokens.shape[0]):  # the slow, obviously-correct definition
        top = probs[t].topk(2)
        out = torch.zeros(16)
        for w, e in zip(top.values / top.values.sum(), top.indices.tolist(), strict=True):
            gu = moe.experts.gate_up_proj[e]
            h = F.silu(gu[:inter] @ tokens[t]) * (gu[inter:] @ tokens[t])
            out = out + w * (moe.experts.down_proj[e] @ h)
        expected.append(out + moe.shared_expert(tokens[t]))  # type: ignore[misc]
    torch.testing.assert_close(y, torch.stack(expected).reshape(3, 7, 16), rtol=1e-5, atol=1e-5)
    chosen = probs.topk(2, dim=-1).indices.flatten()
    f = torch.bincount(chosen, minlength=5).float() / chosen.numel()
    torch.testing.assert_close(aux, 5 * (f * probs.mean(0)).sum())


def test_dense_equals_single_expert_top1_moe_exactly() -> None:
    torch.manual_seed(0)
    dense = DenseFFN(16, 24)
    _randomise(dense, 3)
    moe = MoEFFN(
        16, num_experts=1, top_k=1, moe_intermediate_size=24, shared_expert_intermediate_size=None
    )
    with torch.no_grad():
        moe.experts.gate_up_proj[0].copy_(torch.cat([dense.gate_proj.weight, dense.up_proj.weight]))
        moe.experts.down_proj[0].copy_(dense.down_proj.weight)
    x = torch.randn(4, 6, 16, generator=torch.Generator().manual_seed(4))
    y_dense, aux_dense = dense(x)
    y_moe, aux_moe = moe(x)
    assert torch.equal(y_dense, y_moe)
    assert aux_dense.item() == 0.0 and aux_moe.detach().item() == 1.0


def test_load_balancing_loss_is_one_when_balanced_and_grows_when_collapsed() -> None:
    experts_balanced = torch.arange(8).reshape(4, 2)  # every expert used once
    uniform = torch.full((4, 8), 1 / 8)
    torch.testing.assert_close(load_balancing_loss(uniform, experts_balanced), torch.tensor(1.0))
    collapsed_probs = torch.tensor([[0.9] + [0.1 / 7] * 7] * 4)
    collapsed = torch.zeros(4, 1, dtype=torch.long)
    # E * f_0 * P_0 = 8 * 1 * 0.9
    torch.testing.assert_close(load_balancing_loss(collapsed_probs, collapsed), torch.tensor(7.2))


def test_moe_gradients_reach_router_and_experts() -> None:
    torch.manual_seed(0)
    moe = MoEFFN(
        16, num_experts=4, top_k=2, moe_intermediate_size=8, shared_expert_intermediate_size=8
    )
    x = torch.randn(10, 16)
    y, aux = moe(x)
    (y.square().sum() + aux).backward()
    assert moe.gate.weight.grad is not None and moe.gate.weight.grad.abs().sum() > 0
    assert moe.experts.gate_up_proj.grad is not None
    assert moe.experts.gate_up_proj.grad.abs().sum() > 0
