"""Sim validation's load side reads a measured run exactly as the simulator reads its own.

The strongest check: replay a *simulated* run's per-request times as if they had
been measured (one chunk per decode step), and ``summarise_load`` must give back
the simulator's own throughput and per-user speeds. Also the client's timeline, the
closed-loop generator and the server's step probes (``bench/sim_validation/``).
"""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from dspark_sglang.bench.sim_validation.client import RequestTimeline
from dspark_sglang.bench.sim_validation.compare import prediction_error
from dspark_sglang.bench.sim_validation.load import (
    LoadRun,
    LoadSteps,
    ServerProfile,
    closed_loop,
    decode_step_time,
    load_steps,
    profile_server,
    summarise_load,
)
from dspark_sglang.planning.simulator import SimConfig, StepTimer, simulate
from dspark_sglang.planning.traces import decaying_acceptance, synthetic_traces
from dspark_sglang.planning.workload import LengthDistribution
from dspark_sglang.scheduling.cost_table import from_probes
from dspark_sglang.scheduling.policies import build_policy

_TABLE = [(1, 20.0), (4, 19.0), (16, 15.0), (64, 8.0), (256, 3.0)]


def _simulated_run(concurrency: int) -> tuple[object, LoadRun]:
    traces = synthetic_traces(
        40, 30, decaying_acceptance(0.8, 0.95, 4), auc=0.8, request_spread=0.5, seed=0
    )
    table = from_probes(_TABLE)
    lengths = LengthDistribution(prompt_tokens=(30, 50, 90), output_tokens=(20, 33, 41))
    cfg = SimConfig(
        mode="closed", concurrency=concurrency, num_requests=30, prefill="separate",
        record_decisions=False,
    )  # fmt: skip
    res = simulate(traces, table, build_policy("static", k=2), lengths, cfg)
    d = res.details
    assert d is not None
    # Rebuild per-request chunk timelines from the step records: a request emits at
    # the end of every step in which it decoded or finished its prefill.
    # Prefill-only steps (separate prefill: the decoders wait) emit nothing for them.
    ends = (d.step_start + d.step_time)[d.step_decoding > 0]
    timelines = []
    for r in range(cfg.num_requests):
        first, finish = d.req_first_token[r], d.req_finish[r]
        if np.isnan(first):  # never started before the run ended: it would start later
            first = res.sim_time + 1.0
        tail = np.isnan(finish)  # still decoding when the steady state ended
        times = [float(first)] + [float(t) for t in ends if first < t <= finish]
        if tail:
            times = [float(first)] + [float(t) for t in ends if t > first] + [res.sim_time + 1.0]
        n = len(times)
        # Token counts: 1 at the first chunk, the total at the last; spread in between.
        total = int(d.req_output_len[r]) if tail else int(d.req_emitted[r])
        tokens = [1] + [min(total, 1 + round((total - 1) * i / (n - 1))) for i in range(1, n)]
        timelines.append(
            RequestTimeline(submit=float(d.req_admit[r]), times=tuple(times), tokens=tuple(tokens))
        )
    return res, timelines


def test_summary_of_a_replayed_simulation_matches_the_simulator() -> None:
    res, timelines = _simulated_run(concurrency=3)
    d = res.details
    # Steady state ends at the first finish after the last admission.
    last_admit = float(np.nanmax(d.req_admit))
    steady_end = min(tl.finish for tl in timelines if tl.finish > last_admit)
    assert len(timelines) == 30
    live = summarise_load(LoadRun(3, tuple(timelines), steady_end), warmup_fraction=0.2)
    assert live.user_tps_p50 == pytest.approx(res.user_tps_p50, rel=1e-9)
    assert live.user_tps_p90 == pytest.approx(res.user_tps_p90, rel=1e-9)
    assert steady_end == pytest.approx(res.sim_time)
    # Throughput: same window; token timing inside a request is spread evenly here,
    # so allow the chunk granularity (one request's tokens of one step).
    assert live.throughput == pytest.approx(res.throughput, rel=0.05)
    err = prediction_error(res, live)
    assert abs(err["user_tps_p50"]) < 1e-9


def test_load_steps_recovers_the_decode_step_and_each_arrivals_prefill() -> None:
    # In a replayed simulation the truth is known: every decode step of the full batch
    # takes the table's time at 3 requests x (1 + k) tokens, and an arrival holds the
    # others up by exactly the prefill step(s) run for it (separate prefill).
    c = 3
    res, timelines = _simulated_run(concurrency=c)
    d = res.details
    last_admit = float(np.nanmax(d.req_admit))
    steady_end = min(tl.finish for tl in timelines if tl.finish > last_admit)
    steps = load_steps(LoadRun(c, tuple(timelines), steady_end))
    t_lo = max(tl.times[2] for tl in timelines[:c])
    assert steps.window == (t_lo, steady_end)
    timer = StepTimer(from_probes(_TABLE))
    step = timer(c, c * 3)
    assert steps.quiet_step_s == pytest.approx(step, rel=1e-9)
    gaps = [g for _, g in steps.quiet_gaps]
    assert min(gaps) == pytest.approx(step, rel=1e-9)  # no gap spans an arrival's prefill
    assert max(gaps) == pytest.approx(step, rel=1e-9)
    prefill_only = d.step_decoding == 0
    expected = [
        float(
            d.step_time[
                prefill_only & (d.step_start >= tl.submit) & (d.step_start < tl.first)
            ].sum()
        )
        for tl in timelines[c:]
        if t_lo <= tl.submit <= steady_end
    ]
    assert len(expected) >= 10
    assert list(steps.arrival_stall_s) == pytest.approx(expected, rel=1e-9)
    summary = steps.to_dict()
    assert summary["arrivals"] == len(expected)
    assert summary["arrival_stall_total_s"] == pytest.approx(sum(expected))
    assert summary["window_s"] == pytest.approx(steady_end - t_lo)
    # Every quiet step is the same here, so each time bin's median is that step.
    by_time = summary["quiet_step_by_time"]
    assert sum(b["gaps"] for b in by_time) == len(steps.quiet_gaps)
    assert all(b["median_s"] == pytest.approx(step, rel=1e-9) for b in by_time)


def test_quiet_steps_binned_by_time_show_a_drifting_machine() -> None:
    gaps = ((10.0, 0.5), (20.0, 0.5), (35.0, 0.6), (40.0, 0.7), (95.0, 0.55))
    steps = LoadSteps(quiet_gaps=gaps, arrival_stall_s=(), window=(10.0, 100.0))
    # Bins count from the window's start; an empty bin is left out.
    assert steps.quiet_step_by_time(30.0) == [
        {"from_s": 0.0, "median_s": pytest.approx(0.5), "gaps": 3},
        {"from_s": 30.0, "median_s": pytest.approx(0.7), "gaps": 1},
        {"from_s": 60.0, "median_s": pytest.approx(0.55), "gaps": 1},
    ]
    by20 = steps.quiet_step_by_time(20.0)
    assert [b["from_s"] for b in by20] == [0.0, 20.0, 80.0]
    assert [b["median_s"] for b in by20] == pytest.approx([0.5, 0.65, 0.55])
    with pytest.raises(ValueError, match="bin_s must be > 0"):
        steps.quiet_step_by_time(0.0)


def test_load_steps_needs_a_steady_window() -> None:
    tl = RequestTimeline(0.0, (1.0, 2.0, 3.0), (1, 2, 3))
    with pytest.raises(ValueError, match="quiet chunk gaps"):
        load_steps(LoadRun(1, (tl,), steady_end=3.0))


def test_emitted_between_counts_chunk_increments() -> None:
    tl = RequestTimeline(submit=0.0, times=(1.0, 2.0, 3.0, 4.0), tokens=(1, 3, 4, 7))
    assert tl.emitted_between(0.0, 10.0) == 7
    assert tl.emitted_between(1.5, 3.0) == 3  # chunks at 2.0 (+2) and 3.0 (+1)
    assert tl.emitted_between(4.0, 9.0) == 0
    with pytest.raises(ValueError, match="cumulative"):
        RequestTimeline(submit=0.0, times=(1.0, 2.0), tokens=(3, 2))
    with pytest.raises(ValueError, match="at least one chunk"):
        RequestTimeline(submit=0.0, times=(), tokens=())


def test_decode_step_time_uses_only_the_full_batch_window() -> None:
    # Two requests, steps of 0.1 s while both run; the second keeps going at 0.05 s.
    a = RequestTimeline(0.0, tuple(0.5 + 0.1 * i for i in range(10)), tuple(range(1, 11)))
    b_times = tuple(0.5 + 0.1 * i for i in range(10)) + tuple(1.4 + 0.05 * i for i in range(1, 9))
    b = RequestTimeline(0.0, b_times, tuple(range(1, len(b_times) + 1)))
    assert decode_step_time([a, b]) == pytest.approx(0.1)
    with pytest.raises(ValueError, match="raise the probe's max_new_tokens"):
        decode_step_time([RequestTimeline(0.0, (1.0, 1.1), (1, 2))])


def test_server_profile_refuses_overlapping_decode_and_prefill_probes() -> None:
    ok = ServerProfile(3, {1: 0.1, 4: 0.2}, {40: 0.3, 90: 0.5})
    assert [b for b, _ in ok.probes()] == [3, 12, 40, 90]
    assert ok.probes()[0][1] == pytest.approx(10.0)
    with pytest.raises(ValueError, match="lower the largest decode batch"):
        ServerProfile(3, {1: 0.1, 16: 0.2}, {40: 0.3}).probes()


def test_closed_loop_keeps_the_concurrency_and_hands_out_every_request() -> None:
    lock = threading.Lock()
    state = {"now": 0, "peak": 0}

    def send(i: int) -> RequestTimeline:
        with lock:
            state["now"] += 1
            state["peak"] = max(state["peak"], state["now"])
        t0 = time.perf_counter()
        time.sleep(0.01 * (1 + i % 3))
        t1 = time.perf_counter()
        with lock:
            state["now"] -= 1
        return RequestTimeline(t0, (t0 + 1e-4, t1), (1, 5 + i))

    run = closed_loop(send, num_requests=9, concurrency=3)
    assert [tl.output_tokens for tl in run.timelines] == [5 + i for i in range(9)]
    assert state["peak"] == 3
    assert run.steady_end <= max(tl.finish for tl in run.timelines)
    with pytest.raises(ValueError, match="concurrency"):
        closed_loop(send, num_requests=2, concurrency=3)

    def failing(i: int) -> RequestTimeline:
        raise ConnectionError("server went away")

    with pytest.raises(RuntimeError, match="server went away"):
        closed_loop(failing, num_requests=4, concurrency=2)


def test_profile_server_times_decode_batches_and_prefills() -> None:
    barrier = threading.Barrier(2)  # times out unless both decode probes run at once
    decoded: list[list[int]] = []
    # Step time per decode batch, in order: a slow warm-up, then three repeats, one an
    # outlier. Only the repeats' median may reach the profile.
    steps = [0.5, 0.5, 0.015, 0.015, 0.09, 0.09, 0.017, 0.017]
    lock = threading.Lock()

    def send(ids: list[int], max_new: int) -> RequestTimeline:
        t0 = time.perf_counter()
        if max_new == 1:  # prefill probe: time to first token grows with the prompt
            return RequestTimeline(t0, (t0 + 1e-4 * len(ids),), (1,))
        with lock:
            step = steps[len(decoded)]
            decoded.append(list(ids))
        barrier.wait(timeout=5)
        times = tuple(t0 + step * i for i in range(max_new))
        return RequestTimeline(t0, times, tuple(range(1, max_new + 1)))

    prof = profile_server(
        send, [[1, 2, 3], [4, 5]], [2], [[0] * 50, [0] * 80], verify_tokens_per_request=3,
        decode_tokens=12, prefill_repeats=2, decode_repeats=3,
    )  # fmt: skip
    assert len(decoded) == 8  # warm-up + 3 repeats, two requests each
    assert sorted(decoded[:2]) == [[1, 2, 3], [4, 5]]  # one request per given prompt
    assert prof.decode_seconds == {2: pytest.approx(0.017)}
    # A fresher probe replaces its batch size's entry and nothing else.
    fresh = prof.with_decode({2: 0.02})
    assert fresh.decode_seconds == {2: 0.02} and fresh.prefill_seconds == prof.prefill_seconds
    assert prof.decode_seconds == {2: pytest.approx(0.017)}
    # Without the warm-up, the first decode batch is already a recorded repeat.
    decoded.clear()
    steps[:] = [0.04, 0.04, 0.5, 0.5, 0.03, 0.03]
    again = profile_server(
        send, [[1, 2, 3], [4, 5]], [2], [], verify_tokens_per_request=3, decode_tokens=12,
        decode_repeats=3, warmup=False,
    )  # fmt: skip
    assert len(decoded) == 6 and again.decode_seconds == {2: pytest.approx(0.04)}
    assert again.prefill_seconds == {}
    assert prof.prefill_seconds == {50: pytest.approx(0.005), 80: pytest.approx(0.008)}
    assert [b for b, _ in prof.probes()] == [6, 50, 80]
