"""Metric names/values and the config checks of the DSPARK_MOE scheduler bridge (no engine)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from prometheus_client import REGISTRY

from dspark_sglang.scheduling.config import SchedulerConfig
from dspark_sglang.scheduling.policies import policy_from_config
from dspark_sglang.sglang_integration import metrics, scheduler_bridge


def _value(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def test_position_acceptance_is_conditional() -> None:
    pos = metrics.PositionAcceptance(3)
    # accepted drafts 0, 1, 3 with 3 verified each; one round verified only 1 draft.
    pos.update(torch.tensor([0, 1, 3, 1]), torch.tensor([3, 3, 3, 1]))
    # pos1: reached by all 4, accepted by 3. pos2: reached by rounds with >= 1
    # accepted and >= 2 verified (rounds 1, 2), accepted by round 2 only. pos3: round 2.
    assert pos.ratios().tolist() == pytest.approx([3 / 4, 1 / 2, 1 / 1])


def test_observe_round_and_decision_export_the_contracted_names() -> None:
    before_rounds = _value("dspark_rounds_total")
    before_hist = _value("dspark_accepted_length_count")
    before_sum = _value("dspark_accepted_length_sum")
    metrics.observe_round(torch.tensor([1, 3]), torch.tensor([5, 5]), metrics.PositionAcceptance(4))
    metrics.observe_decision(1e-4, 10)
    metrics.count_fallback("draft_error")
    assert _value("dspark_rounds_total") == before_rounds + 1
    assert _value("dspark_accepted_length_count") == before_hist + 2
    assert _value("dspark_accepted_length_sum") == before_sum + 4
    assert _value("dspark_position_acceptance_ratio", position="1") == pytest.approx(0.5)
    assert _value("dspark_verify_budget_tokens_count") >= 1
    assert _value("dspark_scheduler_decision_seconds_count") >= 1
    assert _value("dspark_fallback_total", reason="draft_error") >= 1


def test_decider_adds_the_anchor_and_logs(tmp_path: Path) -> None:
    cfg = SchedulerConfig(block_size=4, policy="static", static_k=2)
    log = tmp_path / "d.jsonl"
    d = scheduler_bridge.VerifyDecider(cfg, policy_from_config(cfg), log)
    lens = d.verify_lens(torch.full((3, 4), 0.5), torch.device("cpu"))
    assert lens.tolist() == [3, 3, 3] and lens.dtype == torch.int32
    assert '"verify_lens": [3, 3, 3]' in log.read_text()


def test_no_config_keeps_sglang(tmp_path: Path) -> None:
    assert scheduler_bridge.load_decider(4, env={}) is None


def test_config_must_match_the_worker(tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    SchedulerConfig(block_size=8, policy="mtp1").save(path)
    env = {"DSPARK_SCHEDULER_CONFIG": str(path), "SGLANG_RAGGED_VERIFY_MODE": "cap-accept"}
    with pytest.raises(ValueError, match="block_size: 4"):
        scheduler_bridge.load_decider(4, env=env)
    SchedulerConfig(block_size=4, policy="mtp1").save(path)
    with pytest.raises(ValueError, match="SGLANG_RAGGED_VERIFY_MODE=cap-accept"):
        scheduler_bridge.load_decider(4, env={"DSPARK_SCHEDULER_CONFIG": str(path)})
    decider = scheduler_bridge.load_decider(4, env=env)
    assert decider is not None and decider.policy.name == "mtp1"
