"""The round profiler's engine-free parts (``round_profile.py``, ``benchmarks/round_profile.py``).

No engine is started here (the benchmark itself starts them). Covered: the
``DSPARK_PROFILE_ROUNDS`` parsing, the accumulator and its snapshot file, snapshot
subtraction, the per-phase summary (rows add up to the round, the remainder is its own
row), the hook's routing of plain steps / verify forwards / prefills, that nothing is
registered or wrapped when the variable is unset, that every wrapped name exists in
SGLang 0.5.23 and our worker, and the benchmark's repeat / median / table assembly.
"""

from __future__ import annotations

import json
import os
import pkgutil
import time
from collections import defaultdict
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from bench_scripts import load_benchmark

os.environ.setdefault("SGLANG_USE_CPU_ENGINE", "1")

from dspark_sglang.sglang_integration import round_profile as rp

REPO = Path(__file__).resolve().parents[2]


bench = load_benchmark("round_profile", "round_profile_bench")


@pytest.fixture(autouse=True)
def _fresh_profiler(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rp, "_PROFILER", None)
    monkeypatch.delenv(rp.ENV, raising=False)


def _timers(**seconds: float) -> dict[str, dict[str, float]]:
    """A delta where each named timer ran once per round (``calls`` from ``round``)."""
    rounds = seconds.pop("rounds", 1)
    return {name: {"seconds": s, "calls": int(rounds)} for name, s in seconds.items()}


# ------------------------------------------------------------------ the env variable


def test_profile_path_off_when_unset_or_blank() -> None:
    assert rp.profile_path({}) is None
    assert rp.profile_path({rp.ENV: "  "}) is None


def test_profile_path_names_the_variable_on_bad_values(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=rp.ENV):
        rp.profile_path({rp.ENV: str(tmp_path / "times.txt")})
    d = tmp_path / "dir.json"
    d.mkdir()
    with pytest.raises(ValueError, match="directory"):
        rp.profile_path({rp.ENV: str(d)})


def test_profile_path_per_tp_rank(tmp_path: Path) -> None:
    env = {rp.ENV: str(tmp_path / "p.json")}
    assert rp.profile_path(env) == tmp_path / "p.json"
    assert rp.profile_path(env, tp_rank=2) == tmp_path / "p.rank2.json"


# ------------------------------------------------------------------ the accumulator


def test_wrapped_calls_accumulate_and_the_file_round_trips(tmp_path: Path) -> None:
    prof = rp.PhaseTimes(tmp_path / "sub" / "p.json")

    def work(x: int, *, y: int) -> int:
        time.sleep(0.02)
        return x + y

    timed = prof.wrap("markov_loop", work)
    assert timed(1, y=2) == 3 and timed(2, y=2) == 4
    assert prof.calls["markov_loop"] == 2
    assert prof.seconds["markov_loop"] >= 0.04
    with pytest.raises(KeyError, match="unknown timer"):
        prof.add("markov", 0.1)
    with pytest.raises(ValueError, match="negative"):
        prof.add(rp.ROUND, -1.0)
    prof.flush()
    first = rp.read_snapshot(prof.path)
    assert first == {"markov_loop": {"seconds": prof.seconds["markov_loop"], "calls": 2}}
    with prof.timing(rp.ROUND):
        pass
    timed(0, y=0)
    prof.flush()
    assert not list(prof.path.parent.glob(".*tmp"))  # written by rename, no leftovers
    d = rp.delta(first, rp.read_snapshot(prof.path))
    assert d[rp.ROUND]["calls"] == 1 and d["markov_loop"]["calls"] == 1
    assert 0.02 <= d["markov_loop"]["seconds"] < prof.seconds["markov_loop"]
    with pytest.raises(ValueError, match="went backwards"):
        rp.delta(rp.read_snapshot(prof.path), first)
    assert rp.read_snapshot(tmp_path / "absent.json") == {}
    (tmp_path / "old.json").write_text(json.dumps({"version": 0, "timers": {}}))
    with pytest.raises(ValueError, match="version"):
        rp.read_snapshot(tmp_path / "old.json")


# ------------------------------------------------------------------ the summary


def test_summary_rows_add_up_to_the_round_and_keep_the_remainder() -> None:
    draft = {"draft_forward": 4.0, "draft_base_logits": 2.0, "markov_loop": 10.0}
    others = {
        "confidence": 1.0,
        "verify_window": 0.5,
        "verify_budget": 0.25,
        "verify_layout": 0.25,
        "verify_forward": 30.0,
        "accept": 1.0,
        "commit_hidden": 2.0,
        "observers": 0.5,
        "dspark_metrics": 0.5,
    }
    inside = sum(draft.values()) + others["confidence"]
    propose = inside + 1.5  # 1.5 s of propose no draft phase covers
    measured = propose + sum(v for k, v in others.items() if k != "confidence")
    spec = _timers(
        rounds=10, round=measured + 3.0, propose=propose, verify_model_forward=25.0, **draft
    )
    spec.update(_timers(rounds=10, **others))
    s = rp.summarize(spec)
    rows = {r["phase"]: r for r in s["phases"]}
    assert [r["phase"] for r in s["phases"]] == [p.name for p in rp.PHASES]
    assert s["rounds"] == 10 and s["round_ms"] == pytest.approx(1e3 * (measured + 3.0) / 10)
    assert rows["draft_rest"]["ms_per_round"] == pytest.approx(150.0)
    assert rows["unattributed"]["ms_per_round"] == pytest.approx(300.0)
    assert rows["markov_loop"]["share"] == pytest.approx(10.0 / (measured + 3.0))
    assert sum(r["ms_per_round"] for r in s["phases"]) == pytest.approx(s["round_ms"])
    assert sum(r["share"] for r in s["phases"]) == pytest.approx(1.0)
    assert s["verify_model_forward_ms_per_round"] == pytest.approx(2500.0)
    # A phase that never ran counts 0; no round at all is an error, not a division by 0.
    bare = rp.summarize(_timers(rounds=2, round=1.0, propose=0.25))
    assert {r["phase"]: r["ms_per_round"] for r in bare["phases"]}["unattributed"] == (
        pytest.approx(375.0)
    )
    with pytest.raises(ValueError, match="no DSPARK_MOE decode round"):
        rp.summarize(_timers(plain_step=1.0))
    assert rp.plain_step_ms(_timers(rounds=4, plain_step=0.2)) == (pytest.approx(50.0), 4)
    with pytest.raises(ValueError, match="no plain decode step"):
        rp.plain_step_ms(_timers(round=1.0))


# ------------------------------------------------------------------ in the engine process


def test_nothing_is_registered_or_wrapped_when_unset(monkeypatch: pytest.MonkeyPatch) -> None:
    from sglang.srt.plugins.hook_registry import HookRegistry

    monkeypatch.setattr(HookRegistry, "_hooks", defaultdict(list))
    assert rp.install() is False
    assert dict(HookRegistry._hooks) == {}
    worker = SimpleNamespace(_proposer=SimpleNamespace(propose=len))
    assert rp.instrument_worker(worker) is None
    assert worker._proposer.propose is len


def test_install_registers_the_timing_hooks_when_set(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    monkeypatch.setattr(HookRegistry, "_hooks", defaultdict(list))
    monkeypatch.setenv(rp.ENV, str(tmp_path / "p.json"))
    assert rp.install() is True
    assert set(HookRegistry._hooks) == {*rp._HOOKED_FUNCTIONS, rp.TARGET_FORWARD}
    assert all(t is HookType.AROUND for hooks in HookRegistry._hooks.values() for t, _, _ in hooks)


def test_target_forward_hook_times_decode_steps_and_verify_forwards(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    path = tmp_path / "p.json"
    monkeypatch.setenv(rp.ENV, str(path))
    seen: list[Any] = []

    def forward(worker: Any, batch: Any = None, **kw: Any) -> str:
        seen.append(batch)
        return "out"

    decode = SimpleNamespace(forward_mode=ForwardMode.DECODE)
    extend = SimpleNamespace(forward_mode=ForwardMode.EXTEND)
    assert rp.target_forward_hook(forward, None, decode) == "out"
    assert rp.read_snapshot(path)[rp.PLAIN_STEP]["calls"] == 1  # flushed after the step
    rp.target_forward_hook(forward, None, extend)
    rp.target_forward_hook(forward, None, batch=None, is_verify=True)
    # A verify forward of 3 requests and 12 tokens is also timed under its shape.
    fb = SimpleNamespace(batch_size=3, input_ids=torch.zeros(12, dtype=torch.int64))
    rp.target_forward_hook(forward, None, batch=None, forward_batch=fb, is_verify=True)
    rp.target_forward_hook(forward, None, batch=None, forward_batch=fb, is_verify=True)
    calls = rp.profiler().calls
    # Prefill untimed; the first verify had no forward batch to read a shape from.
    assert calls == {rp.PLAIN_STEP: 1, rp.VERIFY_MODEL_FORWARD: 3, "verify@3x12": 2}
    assert seen == [decode, extend, None, None, None]
    rows = rp.verify_shapes(rp.profiler().snapshot()["timers"])
    assert [(r["requests"], r["tokens"], r["calls"]) for r in rows] == [(3, 12, 2)]
    assert rows[0]["ms"] == pytest.approx(1e3 * rp.profiler().seconds["verify@3x12"] / 2)


def test_verify_shapes_are_rows_sorted_by_requests_then_tokens() -> None:
    timers = {
        rp.ROUND: {"seconds": 9.0, "calls": 3},
        rp.shape_timer(4, 9): {"seconds": 0.3, "calls": 3},
        rp.shape_timer(1, 8): {"seconds": 0.2, "calls": 4},
        rp.shape_timer(1, 2): {"seconds": 0.1, "calls": 2},
    }
    assert rp.verify_shapes(timers) == [
        {"requests": 1, "tokens": 2, "calls": 2, "ms": pytest.approx(50.0)},
        {"requests": 1, "tokens": 8, "calls": 4, "ms": pytest.approx(50.0)},
        {"requests": 4, "tokens": 9, "calls": 3, "ms": pytest.approx(100.0)},
    ]
    with pytest.raises(ValueError, match="a token each"):
        rp.shape_timer(4, 3)
    # Shape timers subtract like any other (two snapshots of one pass).
    later = {**timers, rp.shape_timer(1, 2): {"seconds": 0.4, "calls": 5}}
    assert rp.verify_shapes(rp.delta(timers, later)) == [
        {"requests": 1, "tokens": 2, "calls": 3, "ms": pytest.approx(100.0)}
    ]


def test_every_wrapped_name_exists_in_sglang_and_our_worker() -> None:
    """A renamed SGLang method would silently drop a phase: fail here instead."""
    from sglang.srt.speculative.dspark_components.dspark_draft import DraftBlockProposer
    from sglang.srt.speculative.dspark_components.dspark_observability import (
        DsparkStepObservers,
    )
    from sglang.srt.speculative.dspark_components.dspark_planner import DSparkVerifyPlanner
    from sglang.srt.speculative.dspark_components.dspark_verify import TargetVerifyExecutor

    from dspark_sglang.sglang_integration.dspark_moe_worker import DSparkMoeWorker
    from dspark_sglang.sglang_integration.moe_draft_model import DSparkMoEDraftModel

    for target in (*rp._HOOKED_FUNCTIONS, rp.TARGET_FORWARD):
        assert callable(pkgutil.resolve_name(target)), target
    owners = {
        "proposer": DraftBlockProposer,
        "model": DSparkMoEDraftModel,
        "planner": DSparkVerifyPlanner,
        "executor": TargetVerifyExecutor,
        "observers": DsparkStepObservers,
        "worker": DSparkMoeWorker,
    }
    wrapped = {
        "proposer": ("propose", "_run_forward"),
        "model": ("compute_base_logits", "compute_confidence"),
        "planner": ("resolve_verify_token_budget", "schedule_layout"),
        "executor": ("run_non_compact", "run_compact", "accept_and_finalize", "commit_hidden"),
        "observers": ("observe_verify_step",),
        "worker": ("_observe_round", "_forward_decode"),
    }
    for owner, names in wrapped.items():
        for name in names:
            assert callable(getattr(owners[owner], name, None)), f"{owner}.{name}"


# ------------------------------------------------------------------ the benchmark's assembly


def _repeat(round_s: float, unattributed_s: float, plain_s: float, verify_rounds: int) -> dict:
    """One repeat's result from deltas: 10 rounds, ``unattributed_s`` of them unseen."""
    phases = {"draft_forward": 2.0, "markov_loop": 4.0, "verify_forward": round_s - 6.0}
    phases["verify_forward"] -= unattributed_s
    spec = _timers(rounds=10, round=round_s, propose=6.0, **phases)
    plain = _timers(rounds=20, plain_step=plain_s)
    return bench.repeat_result(plain, spec, spec_tokens=30, verify_rounds=verify_rounds)


def test_repeat_result_relates_the_round_to_the_plain_step() -> None:
    r = _repeat(round_s=18.0, unattributed_s=0.18, plain_s=20.0, verify_rounds=10)
    assert r["plain_step_ms"] == pytest.approx(1000.0)
    assert r["round_over_plain_step"] == pytest.approx(1.8)
    assert r["tokens_per_round"] == pytest.approx(3.0)
    assert r["tokens_per_round_over_ratio"] == pytest.approx(3.0 / 1.8)
    rows = {row["phase"]: row for row in r["phases"]}
    assert rows["markov_loop"]["plain_steps"] == pytest.approx(0.4)


def test_combine_takes_medians_and_flags_a_large_remainder() -> None:
    good = [
        _repeat(18.0, 0.18, 20.0, 10),
        _repeat(20.0, 0.2, 20.0, 10),
        _repeat(19.0, 0.19, 19.0, 10),
    ]
    c = bench.combine(good, tolerance=0.05)
    assert c["round_ms"] == {"median": 1900.0, "min": 1800.0, "max": 2000.0}
    # ratios 1.8, 2.0 and 1900 / 950 = 2.0: the median of the ratios, not a ratio of medians
    assert c["round_over_plain_step"]["median"] == pytest.approx(2.0)
    markov = next(p for p in c["phases"] if p["phase"] == "markov_loop")
    assert markov["ms_per_round"]["median"] == pytest.approx(400.0)
    assert c["sanity"]["ok"] is True
    assert c["sanity"]["unattributed_share"]["median"] == pytest.approx(0.01)
    assert sum(g["median"] for g in c["group_share"].values()) == pytest.approx(1.0)
    text = bench.table(c)
    for p in rp.PHASES:
        assert p.label in text
    assert "DSPARK_MOE round" in text and "plain decode step" in text and ": ok" in text
    bad = bench.combine([*good[:2], _repeat(20.0, 2.0, 20.0, 10)], tolerance=0.05)
    assert bad["sanity"]["ok"] is False and "FAILED" in bench.table(bad)
    with pytest.raises(ValueError, match="tolerance"):
        bench.combine(good, tolerance=5.0)
    with pytest.raises(ValueError, match="no repeats"):
        bench.combine([], tolerance=0.05)


def test_verify_shapes_are_pooled_over_the_repeats_in_plain_steps() -> None:
    reps = [_repeat(18.0, 0.18, 20.0, 10), _repeat(20.0, 0.2, 40.0, 10)]
    # 3 verifies of 10 ms, then 1 of 50 ms, at 1 x 8; 2 of 20 ms at 4 x 9 in one repeat.
    reps[0]["verify_shapes"] = [
        {"requests": 1, "tokens": 8, "calls": 3, "ms": 10.0},
        {"requests": 4, "tokens": 9, "calls": 2, "ms": 20.0},
    ]
    reps[1]["verify_shapes"] = [{"requests": 1, "tokens": 8, "calls": 1, "ms": 50.0}]
    rows = bench.combine(reps, tolerance=0.05)["verify_by_shape"]
    step = 1500.0  # the median of the repeats' plain steps, 1000 and 2000 ms
    assert rows == [
        {"requests": 1, "tokens": 8, "calls": 4, "ms": 20.0, "plain_steps": 20.0 / step},
        {"requests": 4, "tokens": 9, "calls": 2, "ms": 20.0, "plain_steps": 20.0 / step},
    ]
    text = bench.table(bench.combine(reps, tolerance=0.05))
    assert "target verify forward by shape" in text and "       4      9      2    20.00" in text


def test_cli_rejects_bad_flags_before_starting_anything(capsys: pytest.CaptureFixture) -> None:
    for argv, msg in (
        (["--repeats", "0"], "--repeats must be >= 1"),
        (["--new-tokens", "1"], "--new-tokens must be >= 2"),
        (["--tolerance", "2"], "--tolerance must be a fraction"),
        (["--mem-fraction-static", "0"], "--mem-fraction-static must be in (0, 1)"),
        (["--static-k", "2"], "give --policy too"),
        (["--policy", "nope"], "invalid choice"),
    ):
        with pytest.raises(SystemExit) as exc:
            bench.main(argv)
        assert exc.value.code == 2
        assert msg in capsys.readouterr().err


def test_the_benchmarks_flags_make_a_demo_plan(smollm2_path: Path, tmp_path: Path) -> None:
    """``plan_demo`` reads every field it needs from the benchmark's flags (no engine)."""
    import argparse

    from rich.console import Console

    from dspark_sglang.sglang_integration.demo import plan_demo
    from dspark_sglang.targets.smollm2 import DEFAULT_DRAFTER_DIR

    args = argparse.Namespace(
        drafter=DEFAULT_DRAFTER_DIR,
        seed=0,
        policy=None,
        sts=None,
        cost_table=None,
        static_k=None,
        num_prompts=2,
        new_tokens=8,
        threads=1,
        dtype="float32",
        concurrency=2,
    )
    plan = plan_demo(
        bench.demo_plan_args(args), smollm2_path, DEFAULT_DRAFTER_DIR, tmp_path, Console()
    )
    assert plan.trained and len(plan.prompts) == 2
    assert (plan.concurrency, plan.max_new_tokens, plan.omp_threads) == (2, 8, 1)
