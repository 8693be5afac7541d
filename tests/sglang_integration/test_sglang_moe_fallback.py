"""The fallback pieces without an engine: fault detection and the placeholder proposal."""

from __future__ import annotations

import pytest
import torch

from dspark_sglang.sglang_integration import fallback

dspark_draft = pytest.importorskip("sglang.srt.speculative.dspark_components.dspark_draft")


def _proposal(confidence: torch.Tensor | None) -> object:
    return fallback.plain_decoding_proposal(
        anchor=torch.tensor([5, 7]),
        gamma=3,
        block_width=3,
        sampling_info=None,
        with_confidence=confidence is not None,
    )


def test_placeholder_proposal_drafts_the_anchor_with_zero_confidence() -> None:
    p = _proposal(torch.zeros(1))
    assert p.draft_block.draft_tokens.tolist() == [[5, 5, 5], [7, 7, 7]]
    assert p.draft_block_ids[:, 0].tolist() == [5, 7]
    assert p.draft_block.greedy_draft and p.draft_block.corrected_logits is None
    assert p.confidence is not None and float(p.confidence.abs().sum()) == 0.0
    assert fallback.non_finite_reason(p) is None


def test_non_finite_confidence_is_detected() -> None:
    import msgspec

    p = _proposal(torch.zeros(1))
    bad = msgspec.structs.replace(p, confidence=torch.tensor([[0.5, float("nan"), 0.1]] * 2))
    assert fallback.non_finite_reason(bad) == "non_finite"
    inf = msgspec.structs.replace(p, confidence=torch.tensor([[0.5, float("inf"), 0.1]] * 2))
    assert fallback.non_finite_reason(inf) == "non_finite"


class _Planner:
    carries_confidence = True


def test_guard_turns_a_raising_drafter_into_plain_decoding(monkeypatch: pytest.MonkeyPatch) -> None:
    """A drafter that raises: the guard returns the placeholder and marks the planner."""
    monkeypatch.delenv(fallback.FAULT_EVERY_ENV, raising=False)

    def broken(**kw: object) -> object:
        raise RuntimeError("CUDA error: device-side assert")

    class DraftInput:
        bonus_tokens = torch.tensor([[11], [12]])

    planner = _Planner()
    guard = fallback.GuardedPropose(broken, object(), planner, gamma=2)
    p = guard(bs=2, draft_input=DraftInput(), sampling_info=None)
    assert getattr(planner, fallback.FORCE_PLAIN_ATTR) is True
    assert p.draft_block.draft_tokens.tolist() == [[11, 11], [12, 12]]
    assert guard.fallbacks == 1


@pytest.mark.parametrize("with_confidence", [True, False])
def test_nan_injection_falls_back_in_every_ragged_mode(
    monkeypatch: pytest.MonkeyPatch, with_confidence: bool
) -> None:
    """NaN injection must turn into a fallback even where proposals carry no confidences
    (SGLang's static ragged mode) and no draft logits (a greedy draft block)."""
    monkeypatch.setenv(fallback.FAULT_EVERY_ENV, "2")
    monkeypatch.setenv(fallback.FAULT_MODE_ENV, "nan")

    class DraftInput:
        bonus_tokens = torch.tensor([[11], [12]])

    planner = _Planner()
    planner.carries_confidence = with_confidence
    healthy = _proposal(torch.zeros(1) if with_confidence else None)
    assert (healthy.confidence is None) is not with_confidence
    guard = fallback.GuardedPropose(lambda **kw: healthy, object(), planner, gamma=3)
    outs = [guard(bs=2, draft_input=DraftInput(), sampling_info=None) for _ in range(6)]
    assert guard.fallbacks == 3  # steps 2, 4, 6
    assert outs[0] is healthy and outs[1] is not healthy
    assert getattr(planner, fallback.FORCE_PLAIN_ATTR) is True
