"""The draft gate around the decision (``draft_gate``), without an engine.

* Off where SGLang defers the draft context's KV to the next draft pass
  (``SGLANG_DSPARK_DEFER_CONTEXT_KV``): a plain step would leave that commit pending.
  SGLang builds the deferred commit during its graph capture, after our worker installed
  the gate in its constructor; the check after the capture removes the gate and says why.
* A drafting round's outcome reaches the decision as the drafts its confidences predicted
  for the lengths verified and the drafts accepted (the decision's acceptance correction).
"""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest
import torch

pytestmark = pytest.mark.sglang


def _worker(commit: object | None) -> SimpleNamespace:
    guard = SimpleNamespace(draft_gate="gate")
    return SimpleNamespace(_dspark_guard=guard, _deferred_commit=lambda: commit)


def test_a_deferred_commit_built_at_capture_removes_the_gate(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from dspark_sglang.sglang_integration.dspark_moe_worker import (
        _drop_gate_under_deferred_commit,
    )

    kept, dropped = _worker(None), _worker(object())
    with caplog.at_level(logging.WARNING):
        _drop_gate_under_deferred_commit(kept)
        assert kept._dspark_guard.draft_gate == "gate" and not caplog.records
        _drop_gate_under_deferred_commit(dropped)
    assert dropped._dspark_guard.draft_gate is None
    assert "SGLANG_DSPARK_DEFER_CONTEXT_KV" in caplog.text


def test_a_rounds_outcome_is_the_predicted_and_the_accepted_drafts() -> None:
    from dspark_sglang.scheduling.cost_table import SpsCostTable
    from dspark_sglang.scheduling.draft_decision import DraftDecision
    from dspark_sglang.sglang_integration.draft_gate import DraftGate

    table = SpsCostTable(
        sample_batch_tokens=(1, 64), sample_steps_per_sec=(20.0, 10.0), max_batch_tokens=64
    )
    decision = DraftDecision(3, 8, round_model=lambda: table, plain_table=table)
    gate = DraftGate(decision, records=False)
    batch = SimpleNamespace(reqs=[SimpleNamespace(rid="a"), SimpleNamespace(rid="b")])
    conf = torch.tensor([[0.5, 0.5, 0.5], [0.8, 0.5, 0.1]])
    gate.observe(batch, 2, SimpleNamespace(confidence=conf))
    # Verified: a's anchor and 2 drafts, b's anchor and 3; accepted: 1 draft, then 0.
    gate.observe_outcome(torch.tensor([3, 4]), torch.tensor([2, 1]))
    assert decision.predicted == pytest.approx((0.5 + 0.25) + (0.8 + 0.4 + 0.04))
    assert decision.accepted == 1.0
    gate.observe_outcome(torch.tensor([3, 4]), torch.tensor([2, 1]))  # no round: nothing
    assert decision.accepted == 1.0
