"""The DSpark loss against hand computations on tiny tensors (pure-Python math)."""

from __future__ import annotations

import math

import pytest
import torch

from dspark_sglang.training.losses import (
    LossConfig,
    cumulative_validity,
    dspark_loss,
    position_weights,
)


def _softmax(xs: list[float]) -> list[float]:
    m = max(xs)
    e = [math.exp(x - m) for x in xs]
    return [v / sum(e) for v in e]


def _sigmoid(z: float) -> float:
    return 1.0 / (1.0 + math.exp(-z))


DRAFT = [[1.0, 0.0, -1.0], [0.5, 0.5, 0.0], [0.0, 3.0, 0.0]]
TARGET = [[0.0, 0.0, 0.0], [2.0, 0.0, 0.0], [0.0, 0.0, 3.0]]
LABELS = [0, 2, 1]
CONF = [0.3, -0.2, 1.5]


def _hand(valid_upto: int, gamma: float, with_conf: bool = True) -> dict[str, float]:
    """Weighted means over slots 0..valid_upto-1, computed with the math module."""
    w = [math.exp(-k / gamma) for k in range(valid_upto)]
    ce, l1, bce = [], [], []
    for k in range(valid_upto):
        p = _softmax(DRAFT[k])
        q = _softmax(TARGET[k])
        ce.append(-math.log(p[LABELS[k]]))
        dist = sum(abs(a - b) for a, b in zip(p, q, strict=True))
        l1.append(dist)
        a = min(1.0, max(0.0, 1 - dist / 2))
        s = _sigmoid(CONF[k])
        bce.append(-(a * math.log(s) + (1 - a) * math.log(1 - s)))
    den = sum(w)
    out = {
        "ce": sum(x * y for x, y in zip(w, ce, strict=True)) / den,
        "l1": sum(x * y for x, y in zip(w, l1, strict=True)) / den,
        "bce": sum(x * y for x, y in zip(w, bce, strict=True)) / den if with_conf else 0.0,
    }
    out["loss"] = 0.1 * out["ce"] + 0.9 * out["l1"] + 1.0 * out["bce"]
    return out


def _tensors(valid: list[bool]) -> tuple[torch.Tensor, ...]:
    return (
        torch.tensor([DRAFT], requires_grad=True),
        torch.tensor([TARGET]),
        torch.tensor([LABELS]),
        torch.tensor([valid]),
        torch.tensor([CONF], requires_grad=True),
    )


def test_each_term_matches_hand_computation() -> None:
    draft, target, labels, valid, conf = _tensors([True, True, True])
    terms = dspark_loss(draft, target, labels, valid, conf, LossConfig(gamma=4.0))
    hand = _hand(3, 4.0)
    for key, value in terms.as_floats().items():
        assert value == pytest.approx(hand[key], rel=1e-5, abs=1e-6), key


def test_gamma_changes_position_weights() -> None:
    draft, target, labels, valid, conf = _tensors([True, True, True])
    terms = dspark_loss(draft, target, labels, valid, conf, LossConfig(gamma=0.5))
    assert terms.as_floats()["l1"] == pytest.approx(_hand(3, 0.5)["l1"], rel=1e-5)
    assert position_weights(3, 4.0).tolist() == pytest.approx(
        [1.0, math.exp(-0.25), math.exp(-0.5)]
    )


def test_validity_is_cumulative_so_later_valid_slots_are_dropped() -> None:
    # Slot 1 invalid -> slot 2 must not count either, even though it is marked valid.
    draft, target, labels, valid, conf = _tensors([True, False, True])
    terms = dspark_loss(draft, target, labels, valid, conf, LossConfig())
    hand = _hand(1, 4.0)
    for key, value in terms.as_floats().items():
        assert value == pytest.approx(hand[key], rel=1e-5, abs=1e-6), key
    assert cumulative_validity(torch.tensor([[1, 0, 1], [1, 1, 0]])).tolist() == [
        [1.0, 0.0, 0.0],
        [1.0, 1.0, 0.0],
    ]


def test_invalid_slots_may_hold_garbage_labels() -> None:
    draft, target, _, valid, conf = _tensors([True, True, False])
    labels = torch.tensor([[0, 2, -100]])  # an out-of-vocab label at an invalid slot
    terms = dspark_loss(draft, target, labels, valid, conf, LossConfig())
    assert terms.as_floats()["loss"] == pytest.approx(_hand(2, 4.0)["loss"], rel=1e-5)


def test_no_confidence_head_means_no_bce() -> None:
    draft, target, labels, valid, _ = _tensors([True, True, True])
    terms = dspark_loss(draft, target, labels, valid, None, LossConfig())
    hand = _hand(3, 4.0, with_conf=False)
    assert terms.as_floats()["bce"] == 0.0
    assert terms.as_floats()["loss"] == pytest.approx(hand["loss"], rel=1e-5)


def test_confidence_label_is_detached() -> None:
    draft, target, labels, valid, conf = _tensors([True, True, True])
    cfg = LossConfig(ce_weight=0.0, l1_weight=0.0, bce_weight=1.0)
    dspark_loss(draft, target, labels, valid, conf, cfg).total.backward()
    assert draft.grad is None or torch.count_nonzero(draft.grad) == 0
    assert conf.grad is not None and torch.count_nonzero(conf.grad) == 3


def test_l1_is_full_l1_in_zero_to_two() -> None:
    same = torch.tensor([[[0.0, 1.0, 2.0]]])
    opposite_d = torch.tensor([[[60.0, 0.0, 0.0]]])
    opposite_t = torch.tensor([[[0.0, 60.0, 0.0]]])
    lab, val = torch.tensor([[0]]), torch.tensor([[True]])
    assert float(dspark_loss(same, same, lab, val, None).l1) == pytest.approx(0.0, abs=1e-7)
    far = dspark_loss(opposite_d, opposite_t, lab, val, None)
    assert float(far.l1) == pytest.approx(2.0, abs=1e-6)
    assert float(far.accept_per_slot[0]) == pytest.approx(0.0, abs=1e-6)


def test_all_invalid_batch_gives_zero_not_nan() -> None:
    draft, target, labels, _, conf = _tensors([True, True, True])
    terms = dspark_loss(draft, target, labels, torch.zeros(1, 3, dtype=torch.bool), conf)
    assert float(terms.total.detach()) == 0.0


def test_bad_config_and_shapes_are_refused() -> None:
    with pytest.raises(ValueError, match="gamma"):
        LossConfig(gamma=0.0)
    with pytest.raises(ValueError, match="ce_weight"):
        LossConfig(ce_weight=-1.0)
    draft, target, labels, valid, conf = _tensors([True, True, True])
    with pytest.raises(ValueError, match="same shape"):
        dspark_loss(draft, target[..., :2], labels, valid, conf)
