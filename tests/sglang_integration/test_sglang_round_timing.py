"""The worker prices rounds from the rounds it timed (``VerifyDecider.observe_round``).

No engine: the decider is loaded from a real scheduler config, and the worker's
``_forward_decode`` runs on a stand-in for SGLang's round (a fake result, a fake verify
and a fake clock), so every timing is known exactly. The table is shaped like the CPU
start-up table (an 8-token verify priced 11 % above 2 tokens, the target alone); the
verifies measured at one request cost the same from 2 to 8 tokens, and the rest of each
round 10 ms: on the table ``prefix`` stops before the seventh draft, on the measured
rounds it verifies the whole block. Which one decided shows which prices are in use.
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
    additive_from_probes,
    load_cost_table,
    with_fixed_step_cost,
)
from dspark_sglang.scheduling.round_costs import MIN_SAMPLES, WARMUP, WINDOW, RoundCosts
from dspark_sglang.sglang_integration import metrics, scheduler_bridge
from dspark_sglang.sglang_integration.scheduler_bridge import VerifyDecider

STEPS = {1: 0.0387, 2: 0.0407, 4: 0.0438, 8: 0.0454}
TABLE = additive_from_probes([(b, 1.0 / t) for b, t in STEPS.items()])
#: Survival 0.9, 0.8, 0.7, 0.5, 0.4, 0.35, 0.035: the seventh draft adds 0.75 % to the 4.65
#: tokens expected before it, and costs 0.9 % of the step on the table, nothing on flat rounds.
CONFIDENCE = torch.tensor([[0.9, 0.8 / 0.9, 0.7 / 0.8, 0.5 / 0.7, 0.4 / 0.5, 0.35 / 0.4, 0.1]])
ROOT = Path(__file__).resolve().parents[2]


def _env(tmp_path: Path, **cfg: Any) -> dict[str, str]:
    table = tmp_path / "sps.json"
    TABLE.save(table)
    path = tmp_path / "sched.yaml"
    SchedulerConfig(block_size=7, cost_table_path=str(table), **cfg).save(path)
    return {"DSPARK_SCHEDULER_CONFIG": str(path), "SGLANG_RAGGED_VERIFY_MODE": "compact"}


def _drafts(decider: VerifyDecider, confidence: torch.Tensor = CONFIDENCE) -> list[int]:
    return (decider.verify_lens(confidence, torch.device("cpu")) - 1).tolist()


def test_measured_rounds_replace_the_tables_prices_once_a_shape_has_enough(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    decider = scheduler_bridge.load_decider(7, env=_env(tmp_path, policy="prefix"))
    assert decider is not None and decider.times_rounds
    caplog.set_level(logging.INFO, logger=scheduler_bridge.__name__)
    assert _drafts(decider) == [6]  # the table: the seventh draft is not worth its token
    for k in range(WARMUP + WINDOW):
        for m in range(2, 9):
            # A shape's first WARMUP verifies (kernel builds) are left out: slow ones here.
            verify = 0.2 if k < WARMUP else 0.046
            decider.observe_round(1, m, verify + 0.01, verify)
            model = decider.cost_model
            shapes = len(model.verify) if isinstance(model, RoundCosts) else 0
            # A shape is measured at its (WARMUP + MIN_SAMPLES)-th timing, not before.
            assert shapes == (
                0 if k < WARMUP + MIN_SAMPLES - 1 else 7 if k >= WARMUP + MIN_SAMPLES else m - 1
            )
    costs = decider.cost_model
    assert isinstance(costs, RoundCosts)
    assert sorted(costs.verify) == [(1, m) for m in range(2, 9)]
    assert all(s == pytest.approx(0.046) for s, _ in costs.verify.values())
    assert costs.rest == {1: (pytest.approx(0.01), 16)}  # the window of the latest 16
    assert _drafts(decider) == [7]
    # Flat verifies, 16 samples a shape against the prior's one at each end: the fitted
    # slope is 1 / (1 + 16 * 7 * var / (range^2 / 2)) of the table's, ~0.04, so a round
    # costs 56 ms and rises by ~0.3 ms from 1 to 8 tokens (6.7 ms on the table).
    tokens = torch.arange(1, 9)
    seconds = 1.0 / costs.steps_per_sec(1, tokens)
    assert seconds.tolist() == pytest.approx([0.056] * 8, abs=5e-4)
    assert 0 < float(seconds[-1] - seconds[0]) < 5e-4
    # The device policy prices on the snapshot (the same lookup as the host's).
    dev = decider.policy.table.steps_per_sec(1, tokens)  # type: ignore[attr-defined]
    assert torch.equal(dev, costs.steps_per_sec(1, tokens))
    # Four requests are not measured: the table shifted by one request's gap, plus its rest.
    level = float(costs.verify_seconds(1, torch.tensor([1]))[0])
    gap = level - 1.0 / float(TABLE.steps_per_sec(1, torch.tensor([1]))[0])
    want = 1.0 / float(TABLE.steps_per_sec(4, torch.tensor([16]))[0]) + gap + 0.01
    assert 1.0 / float(costs.steps_per_sec(4, torch.tensor([16]))[0]) == pytest.approx(want)
    lines = [r.getMessage() for r in caplog.records if "prices rounds from" in r.getMessage()]
    # At 1, 2 and 4 shapes measured (not at every rebuild).
    assert [line.count(" ms") for line in lines] == [1 + 1, 2 + 1, 4 + 1]
    assert "1x2: 46.0 ms, 1x3: 46.0 ms, 1x4: 46.0 ms, 1x5: 46.0 ms;" in lines[-1]
    assert "per request count: 1: 10.0 ms)" in lines[-1]
    assert "slaTiers[].scheduler.draftStepSeconds" in lines[-1]


def test_the_lagged_policy_is_rebuilt_with_its_settings(tmp_path: Path) -> None:
    env = _env(tmp_path, policy="lagged", lag_steps=3, max_verify_tokens=6)
    decider = scheduler_bridge.load_decider(7, env=env)
    assert decider is not None and decider.times_rounds
    for _ in range(WARMUP + MIN_SAMPLES):
        decider.observe_round(2, 6, 0.05, 0.04)
    policy: Any = decider.policy
    assert isinstance(decider.cost_model, RoundCosts)
    assert (policy.name, policy.lag, policy.max_verify_tokens) == ("lagged(lag=3)", 3, 6)


@pytest.mark.parametrize(
    "cfg",
    [
        {"policy": "prefix", "draft_step_seconds": 0.02},  # set: the table plus it, fixed
        {"policy": "verify_all"},  # no cost table
    ],
)
def test_nothing_is_timed_when_nothing_would_use_it(tmp_path: Path, cfg: dict[str, Any]) -> None:
    decider = scheduler_bridge.load_decider(7, env=_env(tmp_path, **cfg))
    assert decider is not None and not decider.times_rounds
    if "draft_step_seconds" in cfg:
        # 20 ms of draft on a 41-45 ms target: the seventh draft is worth verifying.
        assert _drafts(decider) == [7]
        seconds = 1.0 / float(decider.cost_model.steps_per_sec(1, torch.tensor([8]))[0])  # type: ignore[union-attr]
        assert seconds == pytest.approx(STEPS[8] + 0.02)


@pytest.mark.parametrize("seconds", [None, 0.0, 0.02])
@pytest.mark.parametrize("device", ["cpu", "meta"])
def test_the_decider_prices_rounds_with_its_policys_own_cost_model(
    tmp_path: Path, seconds: float | None, device: str
) -> None:
    cfg: dict[str, Any] = {"policy": "prefix", "draft_step_seconds": seconds}
    decider = scheduler_bridge.load_decider(7, env=_env(tmp_path, **cfg), device=device)
    assert decider is not None
    table = load_cost_table(tmp_path / "sps.json")
    assert decider.cost_table == table
    # The table plus the draft, as the policy prices it (the table itself without one).
    assert decider.cost_model == with_fixed_step_cost(table, seconds or 0.0)
    if not seconds:
        assert decider.cost_model is decider.cost_table
    decider = scheduler_bridge.load_decider(7, env=_env(tmp_path, policy="static", static_k=3))
    assert decider is not None and decider.cost_model is None


def test_a_gpu_worker_times_nothing_and_says_how_to_set_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # ``meta`` stands in for a GPU here: any device but the CPU.
    caplog.set_level(logging.INFO, logger=scheduler_bridge.__name__)
    env = _env(tmp_path, policy="prefix")
    decider = scheduler_bridge.load_decider(7, env=env, device="meta")
    assert decider is not None and not decider.times_rounds
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


class FakeRound:
    """SGLang's ``_forward_decode``, its verify and the host clock.

    Round ``k`` takes ``seconds[k]``, of which its verify (the executor's ``run_compact``)
    takes ``verify[k]``; ``cap_lens[k]`` are its verify lengths (``None``: the whole block).
    """

    def __init__(
        self, seconds: list[float], verify: list[float], cap_lens: list[list[int] | None]
    ) -> None:
        self.t = 0.0
        self.seconds, self.verify, self.cap_lens = seconds, verify, cap_lens
        self.calls = 0

    def clock(self) -> float:
        return self.t

    def run_compact(self) -> str:
        self.t += self.verify[self.calls]
        return "verified"

    def forward_decode(self, worker: Any, batch: Any) -> Any:
        cap = self.cap_lens[self.calls]
        assert worker._verify_executor.run_compact() == "verified"
        self.t += self.seconds[self.calls] - self.verify[self.calls]
        self.calls += 1
        n = len(cap) if cap is not None else 2
        return types.SimpleNamespace(
            accept_lens=torch.ones(n, dtype=torch.int32),
            cap_lens=None if cap is None else torch.tensor(cap, dtype=torch.int32),
        )


def _worker(monkeypatch: pytest.MonkeyPatch, fake: FakeRound, decider: VerifyDecider) -> Any:
    from sglang.srt.speculative.dspark_components.dspark_worker_v2 import DSparkWorkerV2

    from dspark_sglang.sglang_integration.dspark_moe_worker import DSparkMoeWorker

    monkeypatch.setattr(DSparkWorkerV2, "_forward_decode", lambda w, b: fake.forward_decode(w, b))
    worker = DSparkMoeWorker.__new__(DSparkMoeWorker)
    worker._verify_planner = types.SimpleNamespace()
    worker._simulate_acc_len = 0.0
    worker._dspark_metrics = None
    worker._dspark_clock = fake.clock
    worker.verify_num_draft_tokens = 8
    worker._verify_executor = types.SimpleNamespace(
        run_compact=fake.run_compact, run_non_compact=fake.run_compact
    )
    worker._attach_decider(decider)
    return worker


@pytest.mark.sglang
def test_the_worker_times_each_round_under_its_shape(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    decider = scheduler_bridge.load_decider(7, env=_env(tmp_path, policy="prefix"))
    assert decider is not None
    # Two requests verifying 3 + 5, then 8 + 8 (no cap_lens: the whole block), each
    # shape WARMUP + MIN_SAMPLES times; the first WARMUP verifies of a shape are slow.
    per_shape = WARMUP + MIN_SAMPLES
    caps: list[list[int] | None] = [[3, 5], None] * per_shape
    verify = [0.5, 0.5] * WARMUP + [0.04, 0.05, 0.05, 0.06, 0.06, 0.07][: 2 * MIN_SAMPLES]
    rounds = [v + 0.02 for v in verify]
    fake = FakeRound(rounds, verify, caps)
    worker = _worker(monkeypatch, fake, decider)
    assert worker._dspark_round_timer is decider
    for _ in caps:
        worker._forward_decode("batch")
    costs = decider.cost_model
    assert isinstance(costs, RoundCosts)
    assert costs.verify == {
        (2, 8): (pytest.approx(0.05), MIN_SAMPLES),
        (2, 16): (pytest.approx(0.06), MIN_SAMPLES),
    }
    # The rest of every round (slow warm-up ones included): 20 ms, the latest 16 of 10.
    assert costs.rest == {2: (pytest.approx(0.02), 2 * per_shape)}
    # The policy now in use was built on those timings.
    assert worker.verify_policy(CONFIDENCE).tolist() == [7]


@pytest.mark.sglang
def test_the_worker_skips_fallback_rounds_and_survives_a_timing_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from dspark_sglang.sglang_integration import fallback

    decider = scheduler_bridge.load_decider(7, env=_env(tmp_path, policy="prefix"))
    assert decider is not None
    fake = FakeRound([0.05] * 3, [0.03] * 3, [[1, 1], [2, 3], [1, 1]])
    worker = _worker(monkeypatch, fake, decider)
    # A drafter fault this round: its time is not its shape's.
    setattr(worker._verify_planner, fallback.FORCE_PLAIN_ATTR, True)
    worker._forward_decode("batch")
    assert decider.timings.rounds == 0
    assert getattr(worker._verify_planner, fallback.FORCE_PLAIN_ATTR) is False
    worker._forward_decode("batch")
    assert list(decider.timings.rest) == [2] and decider.timings.rounds == 1
    # A broken timing never fails the round: it is logged and timing stops.
    monkeypatch.setattr(decider, "observe_round", lambda *a: 1 / 0)
    caplog.set_level(logging.WARNING)
    result = worker._forward_decode("batch")
    assert result.cap_lens.tolist() == [1, 1]
    assert worker._dspark_round_timer is None
    assert any(
        "timing decode rounds failed (ZeroDivisionError" in r.getMessage() for r in caplog.records
    )


@pytest.mark.sglang
def test_the_rounds_shape_and_its_metrics_count_the_same_verify_lengths() -> None:
    from dspark_sglang.sglang_integration.dspark_moe_worker import DSparkMoeWorker

    worker = DSparkMoeWorker.__new__(DSparkMoeWorker)
    worker._verify_planner = types.SimpleNamespace()
    worker.verify_num_draft_tokens = 8
    seen: list[torch.Tensor] = []
    worker._dspark_metrics = types.SimpleNamespace(observe_round=lambda a, v: seen.append(v))
    # cap_lens when the result has them, else the whole block for every request.
    for cap, total in (([3, 5, 1], 9), (None, 24)):
        accept = torch.ones(3, dtype=torch.int32)
        caps = None if cap is None else torch.tensor(cap, dtype=torch.int32)
        result = types.SimpleNamespace(accept_lens=accept, cap_lens=caps)
        assert worker._round_shape(result) == (3, total)
        worker._observe_round(result)
        assert seen[-1].dtype == torch.int32 and int(seen[-1].sum()) == total
        assert seen[-1] is caps if caps is not None else seen[-1].tolist() == [8, 8, 8]
    empty = types.SimpleNamespace(accept_lens=torch.ones(0, dtype=torch.int32), cap_lens=None)
    assert worker._round_shape(empty) == (0, 0)


def test_a_mtp1_or_gpu_decider_attaches_no_timer(tmp_path: Path) -> None:
    from dspark_sglang.sglang_integration.dspark_moe_worker import DSparkMoeWorker

    for cfg, device in (({"policy": "mtp1"}, "cpu"), ({"policy": "prefix"}, "meta")):
        decider = scheduler_bridge.load_decider(7, env=_env(tmp_path, **cfg), device=device)
        assert decider is not None
        worker = types.SimpleNamespace(
            _verify_planner=types.SimpleNamespace(), _simulate_acc_len=0.0
        )
        DSparkMoeWorker._attach_decider(worker, decider)  # type: ignore[arg-type]
        assert worker._dspark_round_timer is None


def test_the_gauge_counts_the_shapes_priced_from_rounds(tmp_path: Path) -> None:
    from prometheus_client import REGISTRY

    decider = scheduler_bridge.load_decider(7, env=_env(tmp_path, policy="prefix"))
    assert decider is not None
    metrics.ensure_created()
    for m in (4, 6):
        for _ in range(WARMUP + MIN_SAMPLES):
            decider.observe_round(1, m, 0.05, 0.04)
    assert REGISTRY.get_sample_value("dspark_round_cost_shapes") == 2


def test_a_decision_on_measured_rounds_reads_nothing_back(tmp_path: Path) -> None:
    from dspark_sglang.sglang_integration.sync_probe import host_syncs_raise

    decider = scheduler_bridge.load_decider(7, env=_env(tmp_path, policy="prefix"))
    assert decider is not None
    for m in (4, 8):
        for _ in range(WARMUP + MIN_SAMPLES):
            decider.observe_round(1, m, 0.06, 0.05)
    assert isinstance(decider.cost_model, RoundCosts) and decider.cost_model.verify
    # Request counts measured and not (the nearest one's gap): no .item(), .cpu(), ...
    for n in (1, 3):
        with host_syncs_raise("a decision on RoundCosts"):
            lens = decider.verify_lens(torch.full((n, 7), 0.6), torch.device("cpu"))
        assert lens.shape == (n,)
