"""Engines in their own processes, alive together, taking turns (``engine_process``)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from dspark_sglang.sglang_integration.engine import CpuEngineSpec
from dspark_sglang.sglang_integration.engine_process import EngineProcess, engine_processes, turns

NEW_TOKENS = 64  # as the hf_reference fixture (conftest.py)


def _greedy(engine: Any, prompts: list[list[int]], n: int) -> list[list[int]]:
    from dspark_sglang.sglang_integration.engine import generate_ids

    return generate_ids(engine, prompts, n)


def _boom(engine: Any, message: str) -> None:
    raise ValueError(message)


def _scheduler(proc: EngineProcess) -> psutil.Process:
    kids = psutil.Process(proc.pid).children(recursive=True)
    found = [p for p in kids if "scheduler" in p.name()]
    assert len(found) == 1, [p.name() for p in kids]
    return found[0]


def _cpu_seconds(p: psutil.Process) -> float:
    t = p.cpu_times()
    return t.user + t.system


def test_passes_alternate_so_linear_drift_hits_each_engine_alike() -> None:
    assert turns(["a", "b"], 3) == ["a", "b", "b", "a", "a", "b"]
    assert turns(["a", "b", "c"], 2) == ["a", "b", "c", "c", "b", "a"]
    assert turns(["a"], 2) == ["a", "a"]


def test_engines_that_would_poll_while_waiting_are_refused_before_starting() -> None:
    spec = CpuEngineSpec(model_path="/nonexistent")
    with (
        pytest.raises(ValueError, match=r"sleep_on_idle=True"),
        engine_processes({"a": spec, "b": spec}),
    ):
        pass


@pytest.fixture(scope="module")
def two_engines(smollm2_path: Path) -> Iterator[dict[str, EngineProcess]]:
    spec = CpuEngineSpec(model_path=str(smollm2_path), overrides={"sleep_on_idle": True})
    with engine_processes({"a": spec, "b": spec}) as engines:
        yield engines


@pytest.mark.sglang
@pytest.mark.slow
def test_each_engine_is_sglangs_and_matches_hf(
    two_engines: dict[str, EngineProcess],
    prompt_ids: list[list[int]],
    hf_reference: list[list[int]],
) -> None:
    for label, engine in two_engines.items():
        got = engine.call(_greedy, prompt_ids[:2], NEW_TOKENS)
        assert got == hf_reference[:2], label


@pytest.mark.sglang
@pytest.mark.slow
def test_timed_passes_run_in_the_engines_process(
    two_engines: dict[str, EngineProcess],
    prompt_ids: list[list[int]],
    hf_reference: list[list[int]],
) -> None:
    """What the demo, ``cpu_speedup`` and ``round_profile`` send: a pass timed in the child."""
    from dspark_sglang.sglang_integration.engine import timed_in_batches, timed_in_flight

    engine = two_engines["b"]
    for timed in (timed_in_batches, timed_in_flight):
        wall, outputs = engine.call(timed, prompt_ids[:3], NEW_TOKENS, 2)
        assert [o["output_ids"] for o in outputs] == hf_reference[:3], timed.__name__
        assert wall > 0


@pytest.mark.sglang
@pytest.mark.slow
def test_an_error_in_a_call_comes_back_typed_and_the_engine_lives_on(
    two_engines: dict[str, EngineProcess], prompt_ids: list[list[int]]
) -> None:
    engine = two_engines["a"]
    with pytest.raises(ValueError, match="no such thing") as info:
        engine.call(_boom, "no such thing")
    assert any("raised in the engine process for a" in n for n in info.value.__notes__)
    assert len(engine.call(_greedy, prompt_ids[:1], 4)[0]) == 4


@pytest.mark.sglang
@pytest.mark.slow
def test_the_engine_waiting_for_its_turn_takes_no_cpu(
    two_engines: dict[str, EngineProcess], prompt_ids: list[list[int]]
) -> None:
    """While one engine decodes, the other's scheduler sleeps on its sockets.

    CPU seconds, not wall time: the waiting scheduler's must stay below a tenth of the
    working one's. A scheduler that polls (no ``sleep_on_idle``) spends about as much
    as the working one.
    """
    busy, idle = _scheduler(two_engines["a"]), _scheduler(two_engines["b"])
    busy0, idle0 = _cpu_seconds(busy), _cpu_seconds(idle)
    two_engines["a"].call(_greedy, prompt_ids[:2], NEW_TOKENS)
    worked, waited = _cpu_seconds(busy) - busy0, _cpu_seconds(idle) - idle0
    assert worked > 0.5, worked
    assert waited < 0.1 * worked, (waited, worked)


@pytest.mark.sglang
@pytest.mark.slow
def test_every_engine_process_is_gone_after_the_block(smollm2_path: Path) -> None:
    me = psutil.Process()
    before = {p.pid for p in me.children(recursive=True)}
    spec = CpuEngineSpec(model_path=str(smollm2_path))
    with engine_processes({"only": spec}) as engines:
        family = {p.pid for p in psutil.Process(engines["only"].pid).children(recursive=True)}
        family.add(engines["only"].pid)
        assert len(family) >= 2  # the engine's process and at least SGLang's scheduler
    left = {p.pid for p in me.children(recursive=True)} - before
    assert not left & family, left
