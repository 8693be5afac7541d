"""Goal 3: tensor parallelism (tp_size=2) of the target on CPU over gloo."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from dspark_sglang.sglang_integration.engine import CpuEngineSpec, cpu_engine, generate_ids

pytestmark = [pytest.mark.sglang, pytest.mark.slow]

NEW_TOKENS = 64  # as the hf_reference fixture (conftest.py)


@pytest.fixture(scope="module")
def tp2_engine(smollm2_path: Path) -> Iterator[Any]:
    spec = CpuEngineSpec(
        model_path=str(smollm2_path),
        overrides={"tp_size": 2},
        # One core per rank; without it SGLang's CPU TP refuses to pick cores.
        env={"SGLANG_CPU_OMP_THREADS_BIND": "0|1"},
    )
    with cpu_engine(spec) as engine:
        yield engine


def test_tp2_plain_greedy_matches_hf(
    tp2_engine: Any, prompt_ids: list[list[int]], hf_reference: list[list[int]]
) -> None:
    schedulers = [
        p
        for p in psutil.Process().children(recursive=True)
        if "scheduler" in " ".join(p.cmdline()) or p.name().startswith("sglang::schedul")
    ]
    assert len(schedulers) == 2, "tp_size=2 should run one scheduler process per rank"
    got = generate_ids(tp2_engine, prompt_ids, NEW_TOKENS)
    for i, (g, ref) in enumerate(zip(got, hf_reference, strict=True)):
        first = next((k for k in range(len(g)) if g[k] != ref[k]), None)
        assert g == ref, f"prompt {i}: first mismatch at token {first}"
