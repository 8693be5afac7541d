"""`bench sim-validation`'s settings, comparison and report are sound (its flags: tests/cli/).

The full run (a live CPU server, minutes) is a benchmark, not a test: its output is
committed as benchmarks/results/sim_validation.{json,png}. The client and load code it
uses are tested in tests/bench/test_bench_sim_validation_load.py and, against a real
server, in tests/sglang_integration/test_sglang_moe_server.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from dspark_sglang.bench.sim_validation import (
    OLD_TIMING,
    LiveMeasurement,
    LoadSteps,
    ValidationPoint,
    ValidationSettings,
    interleave_prompts,
    pick_decode_prompts,
    pick_prefill_prompts,
    resimulate_run,
    stored_settings,
)
from dspark_sglang.planning.simulator import SimConfig, simulate
from dspark_sglang.planning.traces import decaying_acceptance, synthetic_traces
from dspark_sglang.planning.workload import LengthDistribution
from dspark_sglang.scheduling.cost_table import from_probes
from dspark_sglang.scheduling.policies import build_policy

REPO = Path(__file__).resolve().parents[2]


def test_prefill_probes_span_the_prompt_lengths() -> None:
    prompts = [[0] * n for n in (40, 41, 55, 80, 80, 120, 200)]
    picked = [len(p) for p in pick_prefill_prompts(prompts, 3)]
    assert picked == [40, 55, 200]  # distinct lengths 40..200, evenly by rank
    assert [len(p) for p in pick_prefill_prompts(prompts, 10)] == [40, 41, 55, 80, 120, 200]
    s = ValidationSettings(
        static_k=2, concurrencies=(1, 4), requests_per_client=3, max_new_tokens=8
    )
    # Per client at high levels; never fewer than min_requests (12 by default) at low ones.
    assert [s.num_requests(c) for c in (1, 2, 4, 5)] == [12, 12, 12, 15]
    s = ValidationSettings(
        static_k=2, concurrencies=(1,), requests_per_client=3, max_new_tokens=8, min_requests=2
    )
    assert s.num_requests(1) == 3


def test_decode_probes_use_the_loads_typical_context() -> None:
    # A step's cost grows with the context it attends over: the decode probe takes the
    # prompts nearest the load's median length (ties by order), never just the first one.
    prompts = [[i] * n for i, n in enumerate((200, 40, 81, 79, 120, 80))]
    picked = pick_decode_prompts(prompts, 3)
    assert [len(p) for p in picked] == [81, 80, 79]  # median 80.5; 81 and 80 tie, by order
    assert [p[0] for p in picked] == [2, 5, 3]
    assert len(pick_decode_prompts(prompts, 10)) == len(prompts)
    with pytest.raises(ValueError, match="at least one prompt"):
        pick_decode_prompts([], 2)
    with pytest.raises(ValueError, match="profile_repeats must be >= 1"):
        ValidationSettings(
            static_k=2, concurrencies=(1,), requests_per_client=2, max_new_tokens=8,
            profile_repeats=0,
        )  # fmt: skip
    with pytest.raises(ValueError, match="profile_decode_tokens"):
        ValidationSettings(
            static_k=2, concurrencies=(1,), requests_per_client=2, max_new_tokens=8,
            profile_decode_tokens=2,
        )  # fmt: skip


@pytest.mark.parametrize(
    ("field", "value"), [("first_token", "prefil"), ("closed_admission", "at_once")]
)
def test_settings_refuse_an_unknown_simulator_timing(field: str, value: str) -> None:
    kw = {"static_k": 2, "concurrencies": (1,), "requests_per_client": 2, "max_new_tokens": 8}
    with pytest.raises(ValueError, match=field):
        ValidationSettings(**kw, **{field: value})
    # The defaults model what the live server does (benchmarks/README.md, "TTFT").
    ok = ValidationSettings(**kw)
    assert (ok.first_token, ok.closed_admission) == ("first_round", "next_step")


def test_prompts_interleave_the_sets_and_skip_a_short_one() -> None:
    by_set = {"a": [[1], [2], [3]], "b": [[10]], "c": [[20], [21]]}
    prompts, domains = interleave_prompts(by_set, ["a", "b", "c"], 3)
    assert prompts == [[1], [10], [20], [2], [21], [3]]
    assert domains == ["a", "b", "c", "a", "c", "a"]


def test_point_reports_the_loads_steps_against_the_probe_and_the_prefill_charge() -> None:
    traces = synthetic_traces(20, 20, decaying_acceptance(0.8, 0.9, 4), auc=0.8, seed=0)
    table = from_probes([(1, 20.0), (16, 10.0), (128, 4.0)])
    lengths = LengthDistribution(prompt_tokens=(40, 100), output_tokens=(16, 16))
    cfg = SimConfig(mode="closed", concurrency=2, num_requests=20, prefill="separate")
    predicted = simulate(traces, table, build_policy("static", k=2), lengths, cfg)
    measured = LiveMeasurement(2, throughput=5.0, user_tps_p50=3.0, user_tps_p90=2.0)
    steps = LoadSteps(
        quiet_gaps=((0.0, 0.5), (0.5, 0.6), (1.1, 0.7)),
        arrival_stall_s=(0.3, 0.5),
        window=(0.0, 1.8),
    )
    out = ValidationPoint(predicted, measured, table, probe_step_s=0.5, steps=steps).to_dict()
    d = out["load_steps"]
    assert d["quiet_step_s"] == pytest.approx(0.6)
    assert d["quiet_vs_probe"] == pytest.approx(0.2)
    assert d["arrivals"] == 2 and d["arrival_stall_total_s"] == pytest.approx(0.8)
    # The simulator's charge: its prefill-only steps over the requests it admitted (each
    # prompt is one step here, timed at 1 / SPS(b = prompt length)).
    det = predicted.details
    assert det is not None
    admitted = int((~np.isnan(det.req_admit)).sum())
    prefill_steps = det.step_time[det.step_decoding == 0]
    assert prefill_steps.size == admitted
    assert d["simulated_prefill_per_request_s"] == pytest.approx(prefill_steps.sum() / admitted)
    assert "load_steps" not in ValidationPoint(predicted, measured, table).to_dict()
    # Probes right after the load are stored only when taken.
    assert "probes_after" not in out
    after = ((1.5, 0.55), (30.2, 0.61))
    out = ValidationPoint(predicted, measured, table, 0.5, steps, after).to_dict()
    assert out["probes_after"] == [
        {"after_s": 1.5, "step_s": 0.55},
        {"after_s": 30.2, "step_s": 0.61},
    ]
    with pytest.raises(ValueError, match="probes_after must be >= 0"):
        ValidationSettings(
            static_k=2, concurrencies=(1,), requests_per_client=2, max_new_tokens=8,
            probes_after=-1,
        )  # fmt: skip


def test_stored_settings_read_back_what_a_run_wrote_and_the_old_timing() -> None:
    s = ValidationSettings(
        static_k=2, concurrencies=(1, 2), requests_per_client=3, max_new_tokens=8,
        probes_after=2,
    )  # fmt: skip
    run = json.loads(json.dumps({"settings": s.to_dict()}))
    assert stored_settings(run) == s
    # A run written before first_token / closed_admission existed was simulated without
    # them; one written before probes_after took none.
    old = {k: v for k, v in run["settings"].items() if k not in (*OLD_TIMING, "probes_after")}
    back = stored_settings({"settings": old})
    assert (back.first_token, back.closed_admission) == ("prefill", "at_finish")
    assert back.probes_after == 0
    with pytest.raises(ValueError, match="does not have"):
        stored_settings({"settings": {**run["settings"], "new_knob": 1}})


def test_resimulation_needs_each_levels_table() -> None:
    run = {"points": [{"concurrency": 1, "predicted": {}, "measured": {}}], "traces": []}
    with pytest.raises(ValueError, match="each level's own cost table"):
        resimulate_run(run, [[1, 2]], ["gsm8k"], name="old.json")


@pytest.mark.parametrize(
    "name", sorted(p.name for p in (REPO / "benchmarks/results").glob("sim_validation*.json"))
)
def test_committed_validation_is_consistent(name: str) -> None:
    """Every committed run: >= 3 concurrency levels, each error as stated.

    Whether the errors meet the 15 % aim is a measured figure (benchmarks/README.md),
    not something CI re-measures.
    """
    data = json.loads((REPO / "benchmarks/results" / name).read_text())
    levels = [p["concurrency"] for p in data["points"]]
    assert len(set(levels)) >= 3
    for p in data["points"]:
        for key in ("throughput", "user_tps_p50", "user_tps_p90"):
            measured = p["measured"][key]
            predicted = p["predicted"][key]
            assert p["error"][key] == pytest.approx(predicted / measured - 1.0)
            assert measured > 0 and predicted > 0
        steps = p.get("load_steps")  # runs since the step breakdown was added
        if steps and "probe_step_s" in steps:
            assert steps["quiet_vs_probe"] == pytest.approx(
                steps["quiet_step_s"] / steps["probe_step_s"] - 1.0
            )
    # The table the prediction used came from the server profile, not from the load.
    assert (
        data["cost_table"]["sample_batch_tokens"][0]
        == data["server_profile"]["verify_tokens_per_request"]
    )
