"""The worker's draft-cost measurement (``scheduler_bridge.DraftStepTimer``), without an engine.

A fake clock and a fake ``propose`` stand in for the drafter: each call advances the
clock by a known number of seconds, so the measured median is known exactly. The
table is shaped like a CPU target (a 2-token verify costs 1.6 plain steps, 8 tokens
1.8), where ``prefix`` verifies nothing on the target-only table and the whole block
once a 0.8-step draft pass is counted: the decision shows which table is in use.
With an additive table (what a CPU worker profiles at start-up) the pass is measured
per batch size and becomes the table's request term.
"""

from __future__ import annotations

import json
import logging
import types
from pathlib import Path
from typing import Any

import pytest
import torch

from dspark_sglang.scheduling.config import SchedulerConfig
from dspark_sglang.scheduling.cost_table import (
    SpsCostTable,
    additive_from_probes,
    with_cost_per_request_count,
    with_fixed_step_cost,
)
from dspark_sglang.scheduling.policies import PrefixScheduler
from dspark_sglang.sglang_integration import scheduler_bridge
from dspark_sglang.sglang_integration.scheduler_bridge import (
    DRAFT_TIMING_ROUNDS,
    DraftStepTimer,
    VerifyDecider,
)

TABLE = SpsCostTable(
    sample_batch_tokens=tuple(range(1, 9)),
    sample_steps_per_sec=tuple(1.0 / t for t in (1.0, 1.6, 1.63, 1.66, 1.69, 1.72, 1.75, 1.8)),
    max_batch_tokens=8,
)
CONFIDENCE = torch.tensor([[0.36, 0.9, 0.9, 0.9, 0.9, 0.9, 0.9]])
ROOT = Path(__file__).resolve().parents[2]
#: Draft passes of the first rounds: a slow first one (warm-up), median 0.8 s.
DRAFT_SECONDS = (5.0, 0.8, 0.7, 0.8, 0.9, 0.8, 0.75, 0.85)


class FakeDrafter:
    """``propose`` and clock of a drafter whose k-th call takes ``seconds[k]``."""

    def __init__(self, seconds: tuple[float, ...]) -> None:
        self.t = 0.0
        self.seconds = seconds
        self.calls: list[dict[str, Any]] = []

    def clock(self) -> float:
        return self.t

    def propose(self, **kw: Any) -> str:
        self.t += self.seconds[len(self.calls) % len(self.seconds)]
        self.calls.append(kw)
        return f"proposal {len(self.calls)}"


def _env(tmp_path: Path, table_kind: Any = TABLE, **cfg: Any) -> dict[str, str]:
    table = tmp_path / "sps.json"
    table_kind.save(table)
    path = tmp_path / "sched.yaml"
    SchedulerConfig(block_size=7, cost_table_path=str(table), **cfg).save(path)
    return {"DSPARK_SCHEDULER_CONFIG": str(path), "SGLANG_RAGGED_VERIFY_MODE": "cap-accept"}


def _drafts(decider: VerifyDecider) -> int:
    return int(decider.verify_lens(CONFIDENCE, torch.device("cpu"))[0]) - 1


def test_the_median_of_the_first_rounds_is_added_between_rounds(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    decider = scheduler_bridge.load_decider(7, env=_env(tmp_path, policy="prefix"))
    assert decider is not None and decider.times_draft_step
    assert decider.cost_table == TABLE
    drafter = FakeDrafter(DRAFT_SECONDS)
    timer = DraftStepTimer(drafter.propose, decider, clock=drafter.clock)
    caplog.set_level(logging.INFO, logger=scheduler_bridge.__name__)
    for r in range(DRAFT_TIMING_ROUNDS):
        assert timer(bs=1, round=r) == f"proposal {r + 1}"  # arguments and result pass through
        # This round decides on the table as loaded, whatever its own draft took.
        assert _drafts(decider) == 0
    assert timer.seconds == {1: pytest.approx(list(DRAFT_SECONDS))}
    assert decider.measured_draft_seconds == {} and decider.draft_step_seconds(1) is None
    # The next round: the switch comes before it drafts, from the 8 rounds before.
    timer(bs=1)
    assert decider.measured_draft_seconds == {1: pytest.approx(0.8)}
    assert _drafts(decider) == 7
    want = with_fixed_step_cost(TABLE, decider.measured_draft_seconds[1])
    assert decider.policy.table._rates.tolist() == list(want.sample_steps_per_sec)  # type: ignore[attr-defined]
    assert not decider.times_draft_step
    lines = [r.getMessage() for r in caplog.records if "draft pass measured" in r.getMessage()]
    assert lines == [
        "DSPARK_MOE: draft pass measured at 0.800000 s per step with 1 request(s) (median "
        "of 8 decode rounds); policy prefix now adds it to the cost table's step time (set "
        "draft_step_seconds in the scheduler config, Helm chart "
        "slaTiers[].scheduler.draftStepSeconds, to use a fixed value)"
    ]
    # Once, for a staircase: later rounds at any batch size pass straight through,
    # untimed, and the policy stays.
    policy = decider.policy
    for r in range(20):
        timer(bs=1 + r % 3)
    assert decider.policy is policy and timer.done and timer.seconds == {}
    assert decider.draft_step_seconds(3) == pytest.approx(0.8)
    assert len(drafter.calls) == DRAFT_TIMING_ROUNDS + 21


def test_the_lagged_policy_is_rebuilt_with_its_settings(tmp_path: Path) -> None:
    env = _env(tmp_path, policy="lagged", lag_steps=3, max_verify_tokens=6)
    decider = scheduler_bridge.load_decider(7, env=env)
    assert decider is not None and decider.times_draft_step
    drafter = FakeDrafter((0.01,))
    timer = DraftStepTimer(drafter.propose, decider, rounds=2, clock=drafter.clock)
    for _ in range(3):
        timer(bs=2)
    assert decider.measured_draft_seconds == {2: pytest.approx(0.01)}
    policy: Any = decider.policy
    assert (policy.name, policy.lag, policy.max_verify_tokens) == ("lagged(lag=3)", 3, 6)


@pytest.mark.parametrize(
    "cfg",
    [
        {"policy": "prefix", "draft_step_seconds": 0.8},  # set: used as is
        {"policy": "prefix", "draft_step_seconds": 0},  # 0: the target-only model
        {"policy": "verify_all"},  # no cost table
    ],
)
def test_nothing_is_timed_when_nothing_would_use_it(tmp_path: Path, cfg: dict[str, Any]) -> None:
    decider = scheduler_bridge.load_decider(7, env=_env(tmp_path, **cfg))
    assert decider is not None and not decider.times_draft_step
    if cfg.get("draft_step_seconds") == 0.8:
        assert _drafts(decider) == 7  # from the first round on
    elif "draft_step_seconds" in cfg:
        assert _drafts(decider) == 0


def test_a_gpu_worker_times_nothing_and_says_how_to_set_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # ``meta`` stands in for a GPU here: any device but the CPU.
    caplog.set_level(logging.INFO, logger=scheduler_bridge.__name__)
    env = _env(tmp_path, policy="prefix")
    decider = scheduler_bridge.load_decider(7, env=env, device="meta")
    assert decider is not None and not decider.times_draft_step
    (line,) = [
        r.getMessage() for r in caplog.records if "draft_step_seconds is unset" in r.getMessage()
    ]
    assert "runs on meta" in line and "target-only cost table" in line
    assert f"Set draft_step_seconds in {env['DSPARK_SCHEDULER_CONFIG']}" in line
    assert "(Helm chart: slaTiers[].scheduler.draftStepSeconds)" in line
    # The value the line names is one the chart's schema has.
    schema = json.loads((ROOT / "helm/dspark-sglang/values.schema.json").read_text())
    scheduler = schema["properties"]["slaTiers"]["items"]["properties"]["scheduler"]
    assert scheduler["properties"]["draftStepSeconds"]["type"] == "number"


def test_the_worker_wraps_propose_only_when_it_times(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dspark_sglang.sglang_integration.dspark_moe_worker import DSparkMoeWorker

    for cfg, wrapped in (({"policy": "prefix"}, True), ({"policy": "mtp1"}, False)):
        decider = scheduler_bridge.load_decider(7, env=_env(tmp_path, **cfg))
        assert decider is not None
        drafter = FakeDrafter((0.5,))
        worker = types.SimpleNamespace(
            _verify_planner=types.SimpleNamespace(),
            _simulate_acc_len=0.0,
            _proposer=types.SimpleNamespace(propose=drafter.propose),
        )
        DSparkMoeWorker._attach_decider(worker, decider)  # type: ignore[arg-type]
        propose = worker._proposer.propose
        assert isinstance(propose, DraftStepTimer) == wrapped
        if wrapped:
            assert propose.propose == drafter.propose and propose.decider is decider
        # The worker's verify_policy follows the decider's current policy.
        decider.policy = types.SimpleNamespace(decide=lambda c: "rebuilt")  # type: ignore[assignment]
        assert worker.verify_policy(CONFIDENCE) == "rebuilt"


#: A CPU-like start-up table (additive, linear between probes up to 4 requests x 8).
LINEAR = additive_from_probes(
    [(b, 1.0 / t) for b, t in ((1, 1.0), (2, 1.6), (4, 1.66), (8, 1.8), (16, 3.0), (32, 5.4))]
)


def test_an_additive_table_gets_the_draft_pass_per_batch_size(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    decider = scheduler_bridge.load_decider(7, env=_env(tmp_path, LINEAR, policy="prefix"))
    assert decider is not None and decider.times_draft_step and decider.times_per_batch_size
    per_size = {1: 0.8, 4: 2.6}
    drafter = FakeDrafter((0.8, 0.8, 2.6, 2.6))
    timer = DraftStepTimer(drafter.propose, decider, rounds=2, clock=drafter.clock)
    caplog.set_level(logging.INFO, logger=scheduler_bridge.__name__)
    four = torch.full((4, 7), 0.5)
    timer(bs=1)
    timer(bs=1)
    timer(bs=4)  # the switch for 1 request comes first
    assert decider.measured_draft_seconds == {1: pytest.approx(0.8)}
    # 4 requests are priced with the 1-request pass until they are measured.
    assert decider.draft_step_seconds(4) == pytest.approx(0.8)
    before = decider.verify_lens(four, torch.device("cpu")).tolist()
    timer(bs=4)
    timer(bs=1)  # measured: passes through untimed
    assert decider.measured_draft_seconds == {1: pytest.approx(0.8), 4: pytest.approx(2.6)}
    assert timer.seconds == {} and not timer.done and decider.times_draft_step
    assert decider.draft_step_seconds(2) == pytest.approx(0.8 + (2.6 - 0.8) / 3)
    assert decider.draft_step_seconds(9) == pytest.approx(2.6)
    # The policy runs on the table plus the pass at each batch size (linear between).
    want = with_cost_per_request_count(LINEAR, sorted(per_size.items()))
    after = decider.verify_lens(four, torch.device("cpu")).tolist()
    assert after == (PrefixScheduler(want).decide(four) + 1).tolist()
    # A 2.6 s pass at 4 requests makes drafts cheaper than the 0.8 s priced before.
    assert sum(after) > sum(before)
    # One request keeps its own 0.8 s pass: a first draft at 0.3 is not worth verifying
    # there (it would be at 2.6 s).
    assert decider.verify_lens(torch.full((1, 7), 0.3), torch.device("cpu")).tolist() == [1]
    sizes = [r.getMessage() for r in caplog.records if "draft pass measured" in r.getMessage()]
    assert [line.split(" request(s)")[0][-1] for line in sizes] == ["1", "4"]
    assert all("at that batch size, linear between the sizes measured" in x for x in sizes)
