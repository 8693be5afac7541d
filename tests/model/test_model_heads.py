"""Each Markov head and the confidence head against a direct hand computation."""

from __future__ import annotations

import torch

from dspark_sglang.model.heads import (
    ConfidenceHead,
    GatedMarkovHead,
    RNNMarkovHead,
    VanillaMarkovHead,
    calibrated_confidence,
)

V, R, H = 40, 6, 10


def _randomise(module: torch.nn.Module, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=g))


def _inputs(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    prev = torch.randint(0, V, (3, 5), generator=g)  # [N, B]
    hidden = torch.randn(3, 5, H, generator=g)
    return prev, hidden


def test_vanilla_bias_is_w2_of_embedding() -> None:
    head = VanillaMarkovHead(V, R)
    _randomise(head, 1)
    prev, hidden = _inputs()
    e = head.markov_w1.weight[prev]  # E[prev]
    expected = e @ head.markov_w2.weight.T
    torch.testing.assert_close(head.teacher_forced(prev, hidden), expected)
    bias, state = head.step(prev[:, 2], hidden[:, 2], None)
    torch.testing.assert_close(bias, expected[:, 2])
    assert state is None
    assert set(head.state_dict()) == {"markov_w1.weight", "markov_w2.weight"}


def test_gated_bias_gates_embedding_by_hidden() -> None:
    head = GatedMarkovHead(V, R, H)
    _randomise(head, 2)
    prev, hidden = _inputs(1)
    e = head.markov_w1.weight[prev]
    gw, gb = head.gate_proj.weight, head.gate_proj.bias
    gate = torch.sigmoid(torch.cat([hidden, e], -1) @ gw.T + gb)
    expected = (gate * e) @ head.markov_w2.weight.T
    torch.testing.assert_close(head.teacher_forced(prev, hidden), expected)
    torch.testing.assert_close(head.step(prev[:, 4], hidden[:, 4], None)[0], expected[:, 4])
    assert tuple(gw.shape) == (R, H + R)


def test_rnn_recurrence_by_hand() -> None:
    head = RNNMarkovHead(V, R, H)
    _randomise(head, 3)
    prev, hidden = _inputs(2)
    jw, jb = head.joint_proj.weight, head.joint_proj.bias
    assert tuple(jw.shape) == (3 * R, 2 * R + H)
    w2 = head.markov_w2.weight
    s = torch.zeros(3, R)  # s_0 = 0
    expected = []
    for k in range(5):
        e = head.markov_w1.weight[prev[:, k]]
        z = torch.cat([s, e, hidden[:, k]], -1) @ jw.T + jb  # [s ; E[prev] ; h]
        g, c, o = torch.sigmoid(z[:, :R]), torch.tanh(z[:, R : 2 * R]), z[:, 2 * R :]
        expected.append(torch.tanh(o) @ w2.T)
        s = g * s + (1 - g) * c
    expected_t = torch.stack(expected, 1)
    torch.testing.assert_close(head.teacher_forced(prev, hidden), expected_t)
    # The step API carries the same state the recurrence defines.
    state = head.init_state(hidden[:, 0])
    for k in range(5):
        bias, state = head.step(prev[:, k], hidden[:, k], state)
        torch.testing.assert_close(bias, expected_t[:, k])
    # And the bias depends on earlier tokens, not only the previous one.
    changed = prev.clone()
    changed[:, 0] = (changed[:, 0] + 1) % V
    assert not torch.allclose(head.teacher_forced(changed, hidden)[:, 3], expected_t[:, 3])


def test_confidence_head_with_and_without_markov() -> None:
    _, hidden = _inputs(3)
    e = torch.randn(3, 5, R, generator=torch.Generator().manual_seed(9))
    with_m = ConfidenceHead(H, R, with_markov=True)
    _randomise(with_m, 4)
    expected = torch.cat([hidden, e], -1) @ with_m.proj.weight[0] + with_m.proj.bias
    torch.testing.assert_close(with_m(hidden, e), expected)
    without = ConfidenceHead(H, R, with_markov=False)
    _randomise(without, 5)
    expected2 = hidden @ without.proj.weight[0] + without.proj.bias
    torch.testing.assert_close(without(hidden), expected2)
    assert set(with_m.state_dict()) == {"proj.weight", "proj.bias"}


def test_sts_calibration_divides_each_position_by_its_temperature() -> None:
    logits = torch.tensor([[2.0, -1.0, 0.5]])
    temps = torch.tensor([1.0, 2.0, 0.5])
    expected = torch.sigmoid(torch.tensor([[2.0, -0.5, 1.0]]))
    torch.testing.assert_close(calibrated_confidence(logits, temps), expected)
