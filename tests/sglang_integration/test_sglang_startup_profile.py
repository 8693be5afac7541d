"""The start-up SPS staircase (``startup_profile``): probes, table, wiring into the policy.

The timing is faked deterministically: each probe step advances a fake clock by
``step_seconds(b)``, so the measured table is known exactly. The SGLang model
runner part (``runner_step_factory``) is exercised by the engine test in
``test_sglang_moe_scheduler.py``.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from dspark_sglang.profiling.measure import MeasureConfig
from dspark_sglang.scheduling.config import SchedulerConfig
from dspark_sglang.scheduling.cost_table import (
    SpsAdditiveCostTable,
    SpsCostTable,
    parse_cost_table,
)
from dspark_sglang.sglang_integration import scheduler_bridge, startup_profile
from dspark_sglang.sglang_integration.startup_profile import (
    build_table,
    extrapolate,
    probe_points,
    verify_cap,
)


def step_seconds(b: int) -> float:
    """A staircase: a fixed cost, a per-token slope, and a cliff past 64 tokens."""
    return 0.010 + 0.0001 * b + (0.004 if b > 64 else 0.0)


class FakeDevice:
    """``make_step`` and clock of a device whose steps take ``step_seconds(b)``."""

    def __init__(self, seconds: Callable[[int], float]) -> None:
        self.t = 0.0
        self.seconds = seconds
        self.prepared: list[int] = []

    def clock(self) -> float:
        return self.t

    def make_step(self, b: int) -> Callable[[], None]:
        self.prepared.append(b)

        def step() -> None:
            self.t += self.seconds(b)

        return step


def test_probe_points_double_up_to_the_cap() -> None:
    assert probe_points(1) == (1,)
    assert probe_points(8) == (1, 2, 4, 8)
    assert probe_points(20) == (1, 2, 4, 8, 16, 20)
    with pytest.raises(ValueError, match="verify cap must be an integer >= 1"):
        probe_points(0)


def test_verify_cap_is_the_tiers_or_the_pool() -> None:
    cfg = SchedulerConfig(block_size=4, policy="prefix")
    assert verify_cap(cfg, 48) == 48 * 5
    capped = SchedulerConfig(block_size=4, policy="prefix", max_verify_tokens=40)
    assert verify_cap(capped, 48) == 40
    assert verify_cap(capped, 2) == 10


def test_table_is_one_over_the_step_time_at_each_probe() -> None:
    dev = FakeDevice(step_seconds)
    table = build_table(dev.make_step, 128, clock=dev.clock)
    assert table.sample_batch_tokens == probe_points(128)
    for b, sps in zip(table.sample_batch_tokens, table.sample_steps_per_sec, strict=True):
        assert sps == pytest.approx(1.0 / step_seconds(b), rel=1e-9)
    assert table.max_batch_tokens == 128
    # The cliff past 64 tokens is in the table: the policy sees it.
    assert table.lookup(128) < table.lookup(64) * 0.8
    # The same validation and encoding as a loaded table (SGLang's JSON).
    assert parse_cost_table(table.to_json()) == table
    m = startup_profile.STARTUP_MEASURE
    assert len(dev.prepared) == len(probe_points(128)) * m.rounds


def test_without_graphs_the_table_is_linear_between_the_probes() -> None:
    dev = FakeDevice(step_seconds)
    stairs = build_table(dev.make_step, 128, clock=dev.clock)
    table = build_table(dev.make_step, 128, clock=dev.clock, linear=True)
    assert isinstance(table, SpsAdditiveCostTable) and table.m_probes == probe_points(128)
    # The same measured step time at every probe, linear between them (the fake's own
    # step time is linear in tokens except at its cliff), where the staircase keeps the
    # smaller probe's rate.
    for b in range(1, 129):
        got = table.step_time(num_reqs=1, budget=b - 1)
        if b in probe_points(128) or b <= 64:
            assert got == pytest.approx(step_seconds(b), rel=1e-9), b
        assert 1.0 / stairs.lookup(b) <= got + 1e-12
    assert table.step_time(num_reqs=1, budget=5) > 1.0 / stairs.lookup(6)
    assert parse_cost_table(table.to_json()) == table
    assert "linear between probes" in startup_profile.summary(table, 1.0)
    assert "staircase, max_batch_tokens=128" in startup_profile.summary(stairs, 1.0)


def test_beyond_the_largest_probe_the_step_time_is_extrapolated() -> None:
    dev = FakeDevice(step_seconds)
    table = build_table(
        dev.make_step, 240, clock=dev.clock, max_probe=32, measure=MeasureConfig(1, 1, 1)
    )
    assert max(dev.prepared) == 32  # nothing larger was run
    assert table.sample_batch_tokens == (*probe_points(32), 240)
    # Linear in tokens past 32 with the 16..32 slope (no cliff there in the fake).
    assert 1.0 / table.lookup(240) == pytest.approx(step_seconds(240) - 0.004, rel=1e-9)
    assert table.max_batch_tokens == 240


def test_a_probe_timed_faster_than_a_smaller_one_is_pooled_with_it() -> None:
    # 2 tokens timed slower than 4 and 8 (noise): the three are pooled to their mean.
    noisy = {1: 0.036, 2: 0.047, 4: 0.040, 8: 0.043}
    dev = FakeDevice(lambda b: noisy[b])
    table = build_table(dev.make_step, 8, clock=dev.clock)
    steps = [1.0 / s for s in table.sample_steps_per_sec]
    assert steps == pytest.approx([0.036, 0.130 / 3, 0.130 / 3, 0.130 / 3])
    ordered = [(1, 30.0), (2, 25.0), (4, 25.0)]
    assert startup_profile.non_increasing(ordered) == ordered


def test_extrapolation_never_makes_a_larger_batch_faster() -> None:
    # A noisy decrease between the last two probes: slope floored at 0.
    assert extrapolate([(8, 100.0), (16, 120.0)], 64) == (64, 120.0)
    assert extrapolate([(8, 100.0)], 64) == (64, 100.0)
    with pytest.raises(ValueError, match="not beyond the last probe 16"):
        extrapolate([(8, 100.0), (16, 120.0)], 16)


def _env(tmp_path: Path, cfg: SchedulerConfig, **extra: str) -> dict[str, str]:
    path = tmp_path / "sched.yaml"
    cfg.save(path)
    return {
        "DSPARK_SCHEDULER_CONFIG": str(path),
        "SGLANG_RAGGED_VERIFY_MODE": "cap-accept",
        **extra,
    }


def test_the_policy_schedules_with_the_profiled_table(tmp_path: Path) -> None:
    dev = FakeDevice(step_seconds)
    cfg = SchedulerConfig(block_size=4, policy="prefix", max_verify_tokens=64)
    env = _env(tmp_path, cfg)
    assert startup_profile.requested(env) == cfg
    seen: list[SchedulerConfig] = []

    tables: list[SpsCostTable] = []

    def profile(c: SchedulerConfig) -> SpsCostTable:
        seen.append(c)
        tables.append(build_table(dev.make_step, verify_cap(c, 8), clock=dev.clock))
        return tables[-1]

    decider = scheduler_bridge.load_decider(4, env=env, profile=profile)
    assert decider is not None and seen == [cfg]
    # The decider runs the device twin of the policy, built on the measured table.
    (table,) = tables
    assert table.sample_batch_tokens == probe_points(40)
    dev_table = decider.policy.table  # type: ignore[attr-defined]
    assert dev_table._probes.tolist() == list(table.sample_batch_tokens)
    assert dev_table._rates.tolist() == list(table.sample_steps_per_sec)


def test_a_table_from_the_config_is_not_profiled(tmp_path: Path) -> None:
    table_file = tmp_path / "sps.json"
    dev = FakeDevice(step_seconds)
    build_table(dev.make_step, 8, clock=dev.clock).save(table_file)
    cfg = SchedulerConfig(block_size=4, policy="prefix", cost_table_path=str(table_file))
    env = _env(tmp_path, cfg)
    assert startup_profile.requested(env) is None

    def profile(c: SchedulerConfig) -> SpsCostTable:
        raise AssertionError("a config with cost_table_path must not be profiled")

    decider = scheduler_bridge.load_decider(4, env=env, profile=profile)
    assert decider is not None


def test_without_a_profiler_the_worker_refuses(tmp_path: Path) -> None:
    env = _env(tmp_path, SchedulerConfig(block_size=4, policy="lagged"))
    with pytest.raises(ValueError, match="asks for a start-up cost table; no profiler given"):
        scheduler_bridge.load_decider(4, env=env)


def test_where_the_table_is_written(tmp_path: Path) -> None:
    assert startup_profile.table_path({}) is None
    log = tmp_path / "decisions.jsonl"
    assert startup_profile.table_path({"DSPARK_DECISION_LOG": str(log)}) == (
        tmp_path / "decisions.startup_cost_table.json"
    )
    given = tmp_path / "t.json"
    env = {"DSPARK_DECISION_LOG": str(log), startup_profile.TABLE_PATH_ENV: str(given)}
    assert startup_profile.table_path(env) == given


def test_cpu_with_one_thread_times_the_thread() -> None:
    import time

    import torch

    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert startup_profile.clock_for("cpu") is time.thread_time
        assert startup_profile.clock_for("cuda:0") is time.perf_counter
        torch.set_num_threads(2)
        assert startup_profile.clock_for("cpu") is time.perf_counter
    finally:
        torch.set_num_threads(threads)
