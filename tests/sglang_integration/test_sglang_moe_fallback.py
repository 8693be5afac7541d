"""The fallback pieces without an engine: fault detection and the placeholder proposal.

Contract: a raising drafter turns the whole step into plain decoding (host path,
``FORCE_PLAIN_ATTR``); non-finite output is per *row*: only the affected requests
get the placeholder, folded on the device (``PLAIN_ROWS_ATTR``), with no host read.
"""

from __future__ import annotations

import pytest
import torch
from host_sync_guard import host_syncs_raise

from dspark_sglang.sglang_integration import fallback, metrics

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
    assert fallback.non_finite_rows(p, 2).tolist() == [False, False]


def test_non_finite_rows_are_detected_per_request() -> None:
    import msgspec

    p = _proposal(torch.zeros(1))
    bad = msgspec.structs.replace(
        p, confidence=torch.tensor([[0.5, float("nan"), 0.1], [0.5, 0.5, 0.5]])
    )
    assert fallback.non_finite_rows(bad, 2).tolist() == [True, False]
    inf = msgspec.structs.replace(
        p, confidence=torch.tensor([[0.5, 0.5, 0.1], [0.5, float("inf"), 0.1]])
    )
    assert fallback.non_finite_rows(inf, 2).tolist() == [False, True]
    # Draft logits: one -inf, or +inf and -inf (whose sum is NaN), flag their row; a row
    # of finite values as low as the off-map logit (-1e30) does not.
    logits = torch.full((3, 3, 10), -1e30)
    logits[0, 1, 2] = float("-inf")
    logits[1, 0, 0], logits[1, 2, 9] = float("inf"), float("-inf")
    block = msgspec.structs.replace(p.draft_block, corrected_logits=logits)
    assert fallback.non_finite_rows(msgspec.structs.replace(p, draft_block=block), 2).tolist() == [
        True,
        True,
    ]
    block = msgspec.structs.replace(p.draft_block, corrected_logits=logits[2:].expand(2, 3, 10))
    assert fallback.non_finite_rows(msgspec.structs.replace(p, draft_block=block), 2).tolist() == [
        False,
        False,
    ]


def _sampled_proposal() -> object:
    """Two requests, 3 drafts each, with draft logits (a sampling drafter)."""
    import msgspec

    p = _proposal(torch.zeros(1))
    logits = torch.randn(2, 3, 10)
    logits[1, 2, 4] = float("nan")  # request 1's last draft position is broken
    block = msgspec.structs.replace(
        p.draft_block,
        draft_tokens=torch.tensor([[1, 2, 3], [4, 5, 6]]),
        corrected_logits=logits,
        greedy_draft=False,
    )
    return msgspec.structs.replace(
        p,
        draft_block=block,
        confidence=torch.tensor([[0.9, 0.8, 0.7], [0.6, 0.5, 0.4]]),
        verify_ids=torch.tensor([[5, 1, 2, 3], [7, 4, 5, 6]]),
    )


def test_fold_replaces_only_the_non_finite_rows_without_host_reads() -> None:
    """Row 1 has a NaN draft logit: it becomes the placeholder (drafts = anchor,
    confidence 0, one-hot draft distribution on the anchor); row 0 is untouched; the
    planner is told to verify row 1's anchor only. All of it under the sync trap."""
    p = _sampled_proposal()

    class DraftInput:
        bonus_tokens = torch.tensor([[5], [7]])

    acc = metrics.StepMetrics(3)
    planner = _Planner()
    guard = fallback.GuardedPropose(lambda **kw: p, object(), planner, 3, step_metrics=acc)
    with host_syncs_raise("GuardedPropose.fold"):
        out = guard(bs=2, draft_input=DraftInput(), sampling_info=None)
    assert getattr(planner, fallback.PLAIN_ROWS_ATTR).tolist() == [False, True]
    assert out.draft_block.draft_tokens.tolist() == [[1, 2, 3], [7, 7, 7]]
    assert out.verify_ids.tolist() == [[5, 1, 2, 3], [7, 7, 7, 7]]
    assert out.confidence.tolist()[1] == [0.0, 0.0, 0.0]
    assert out.confidence[0].tolist() == pytest.approx([0.9, 0.8, 0.7])
    assert torch.equal(out.draft_block.corrected_logits[0], p.draft_block.corrected_logits[0])
    probs = torch.softmax(out.draft_block.corrected_logits[1], dim=-1)
    assert torch.equal(probs, torch.nn.functional.one_hot(torch.tensor([7] * 3), 10).float())
    assert guard.fallbacks == 0  # no host fallback: the fold handled it
    assert acc.non_finite.tolist() == [1]


def test_with_host_flags_a_step_without_a_bad_row_is_not_rewritten() -> None:
    """A CPU worker's guard reads the row flags: a healthy step's proposal passes through
    untouched (no pass over its draft logits); a step with a NaN row is still folded."""
    import msgspec

    healthy = _sampled_proposal()
    healthy = msgspec.structs.replace(
        healthy,
        draft_block=msgspec.structs.replace(
            healthy.draft_block,
            corrected_logits=torch.nan_to_num(healthy.draft_block.corrected_logits, nan=0.0),
        ),
    )

    class DraftInput:
        bonus_tokens = torch.tensor([[5], [7]])

    for proposal, folded in ((healthy, False), (_sampled_proposal(), True)):
        planner = _Planner()
        guard = fallback.GuardedPropose(
            lambda p=proposal, **kw: p, object(), planner, 3, host_flags=True
        )
        out = guard(bs=2, draft_input=DraftInput(), sampling_info=None)
        assert (out is not proposal) is folded
        assert getattr(planner, fallback.PLAIN_ROWS_ATTR).tolist() == [False, folded]


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
    """NaN injection must turn into plain-decoding rows even where proposals carry no
    confidences (SGLang's static ragged mode) and no draft logits (a greedy block)."""
    monkeypatch.setenv(fallback.FAULT_EVERY_ENV, "2")
    monkeypatch.setenv(fallback.FAULT_MODE_ENV, "nan")

    class DraftInput:
        bonus_tokens = torch.tensor([[11], [12]])

    planner = _Planner()
    planner.carries_confidence = with_confidence
    healthy = _proposal(torch.zeros(1) if with_confidence else None)
    assert (healthy.confidence is None) is not with_confidence
    acc = metrics.StepMetrics(3)
    guard = fallback.GuardedPropose(
        lambda **kw: healthy, object(), planner, gamma=3, step_metrics=acc
    )
    outs, plain = [], []
    for _ in range(6):
        outs.append(guard(bs=2, draft_input=DraftInput(), sampling_info=None))
        plain.append(getattr(planner, fallback.PLAIN_ROWS_ATTR).tolist())
    assert acc.non_finite.tolist() == [3]  # steps 2, 4, 6
    assert plain == [[False, False], [True, True]] * 3
    assert outs[1].draft_block.draft_tokens.tolist() == [[11, 11, 11], [12, 12, 12]]
    assert (outs[1].confidence is None) is not with_confidence
    assert guard.fallbacks == 0
