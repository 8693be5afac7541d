"""Metric names/values and the config checks of the DSPARK_MOE scheduler bridge (no engine)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from host_sync_guard import host_syncs_raise
from prometheus_client import REGISTRY

from dspark_sglang.scheduling.config import SchedulerConfig
from dspark_sglang.scheduling.device_policies import DeviceStaticK
from dspark_sglang.scheduling.policies import policy_from_config
from dspark_sglang.sglang_integration import metrics, scheduler_bridge


def _value(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def test_position_acceptance_is_conditional() -> None:
    acc = metrics.StepMetrics(3)
    # accepted drafts 0, 1, 3 with 3 verified each; one round verified only 1 draft.
    acc.observe_round(torch.tensor([0, 1, 3, 1]) + 1, torch.tensor([3, 3, 3, 1]) + 1)
    acc.flush()
    # pos1: reached by all 4, accepted by 3. pos2: reached by rounds with >= 1
    # accepted and >= 2 verified (rounds 1, 2), accepted by round 2 only. pos3: round 2.
    got = [_value("dspark_position_acceptance_ratio", position=str(k)) for k in (1, 2, 3)]
    assert got == pytest.approx([3 / 4, 1 / 2, 1 / 1])


def test_step_metrics_accumulate_without_host_reads_and_flush_exact_values() -> None:
    """The per-step updates run under the host-sync trap; one flush publishes them."""
    before = {
        n: _value(n)
        for n in (
            "dspark_rounds_total",
            "dspark_accepted_length_count",
            "dspark_accepted_length_sum",
            "dspark_verify_budget_tokens_count",
            "dspark_verify_budget_tokens_sum",
        )
    }
    le4 = _value("dspark_accepted_length_bucket", le="4.0")
    budget_le8 = _value("dspark_verify_budget_tokens_bucket", le="8.0")
    nan_before = _value("dspark_fallback_total", reason="non_finite")
    acc = metrics.StepMetrics(4)
    with host_syncs_raise("StepMetrics updates"):
        acc.observe_round(torch.tensor([1, 3]), torch.tensor([5, 5]))
        acc.observe_round(torch.tensor([5]), torch.tensor([5]))
        acc.observe_budget(torch.tensor([5, 2], dtype=torch.int32))  # 7 tokens
        acc.count_non_finite(torch.tensor(True))
        acc.count_non_finite(torch.tensor(False))
        snap = acc.snapshot()
    assert _value("dspark_rounds_total") == before["dspark_rounds_total"]  # not flushed yet
    acc.flush(snap.cpu())
    assert _value("dspark_rounds_total") == before["dspark_rounds_total"] + 2
    assert _value("dspark_accepted_length_count") == before["dspark_accepted_length_count"] + 3
    assert _value("dspark_accepted_length_sum") == before["dspark_accepted_length_sum"] + 9
    assert _value("dspark_accepted_length_bucket", le="4.0") == le4 + 2  # 1 and 3
    assert _value("dspark_verify_budget_tokens_count") == (
        before["dspark_verify_budget_tokens_count"] + 1
    )
    budget_sum = before["dspark_verify_budget_tokens_sum"]
    assert _value("dspark_verify_budget_tokens_sum") == budget_sum + 7
    assert _value("dspark_verify_budget_tokens_bucket", le="8.0") == budget_le8 + 1
    assert _value("dspark_fallback_total", reason="non_finite") == nan_before + 1
    # pos1: reached by 3 rounds, accepted by 2 (emitted 3 and 5).
    assert _value("dspark_position_acceptance_ratio", position="1") == pytest.approx(2 / 3)
    # Flushing the same (or an older) snapshot again adds nothing.
    acc.flush(snap.cpu())
    acc.flush()
    assert _value("dspark_rounds_total") == before["dspark_rounds_total"] + 2


def test_host_counters_export_the_contracted_names() -> None:
    metrics.observe_decision_seconds(1e-4)
    metrics.count_fallback("draft_error")
    assert _value("dspark_scheduler_decision_seconds_count") >= 1
    assert _value("dspark_fallback_total", reason="draft_error") >= 1


def test_decider_adds_the_anchor_and_logs(tmp_path: Path) -> None:
    cfg = SchedulerConfig(block_size=4, policy="static", static_k=2)
    log = tmp_path / "d.jsonl"
    d = scheduler_bridge.VerifyDecider(cfg, policy_from_config(cfg), log)
    lens = d.verify_lens(torch.full((3, 4), 0.5), torch.device("cpu"))
    assert lens.tolist() == [3, 3, 3] and lens.dtype == torch.int32
    assert '"verify_lens": [3, 3, 3]' in log.read_text()


def test_decider_runs_the_device_twin_without_host_reads() -> None:
    """No decision log: the decision and its budget histogram never read back."""
    cfg = SchedulerConfig(block_size=4, policy="static", static_k=2)
    acc = metrics.StepMetrics(4)
    d = scheduler_bridge.VerifyDecider(cfg, policy_from_config(cfg), step_metrics=acc)
    assert isinstance(d.policy, DeviceStaticK)
    with host_syncs_raise("VerifyDecider.verify_lens"):
        lens = d.verify_lens(torch.full((3, 4), 0.5), torch.device("cpu"))
    assert lens.tolist() == [3, 3, 3]
    assert acc.budget_sum.tolist() == [9]


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
