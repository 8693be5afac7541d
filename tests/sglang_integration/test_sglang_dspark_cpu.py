"""Goal 2: SGLang's built-in DSPARK worker on CPU, through our plugin's bridges.

A randomly initialised dense draft (SGLang's own ``DSparkDraftModel`` format,
``dummy`` weights) is never accepted, so under greedy verification the output
must be exactly the target's greedy continuation (HF transformers, which the
plain-decoding test shows SGLang reproduces), while speculation demonstrably
ran (``spec_verify_ct`` > 0 for every request).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from dspark_sglang.sglang_integration.dense_draft import write_dense_dspark_draft
from dspark_sglang.sglang_integration.engine import CpuEngineSpec, cpu_engine, generate_outputs

pytestmark = [pytest.mark.sglang, pytest.mark.slow]

NEW_TOKENS = 64  # as the hf_reference fixture (conftest.py)


def _spec(target: Path, draft: Path, algorithm: str) -> CpuEngineSpec:
    return CpuEngineSpec(
        model_path=str(target),
        overrides={
            "speculative_algorithm": algorithm,
            "speculative_draft_model_path": str(draft),
            "speculative_draft_load_format": "dummy",
        },
    )


@pytest.fixture(scope="module")
def draft_dir(smollm2_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_dense_dspark_draft(smollm2_path, tmp_path_factory.mktemp("dspark_draft"))


@pytest.fixture(scope="module")
def dspark_engine(smollm2_path: Path, draft_dir: Path) -> Iterator[Any]:
    with cpu_engine(_spec(smollm2_path, draft_dir, "DSPARK")) as engine:
        yield engine


def _assert_speculative_greedy(outs: list[dict[str, Any]], reference: list[list[int]]) -> None:
    for i, (o, ref) in enumerate(zip(outs, reference, strict=True)):
        assert list(o["output_ids"]) == ref, f"prompt {i} differs from the target's greedy output"
        meta = o["meta_info"]
        assert meta.get("spec_verify_ct", 0) > 0, f"prompt {i}: no speculative verify ran"
        # Every verify round emits at least the correction/bonus token.
        assert 1.0 <= meta["spec_accept_length"] <= 5.0


def test_dspark_moe_runs_like_dspark_and_leaves_no_processes(
    smollm2_path: Path,
    draft_dir: Path,
    prompt_ids: list[list[int]],
    hf_reference: list[list[int]],
) -> None:
    """Our registered algorithm runs end to end; the engine's processes are reaped.

    Runs first in this module, before the module-scoped DSPARK engine starts, so
    only one engine is alive at a time.
    """
    me = psutil.Process()
    before = {p.pid for p in me.children(recursive=True)}
    with cpu_engine(_spec(smollm2_path, draft_dir, "DSPARK_MOE")) as engine:
        spawned = {p.pid for p in me.children(recursive=True)} - before
        assert spawned, "the engine should run its scheduler in child processes"
        outs = generate_outputs(engine, prompt_ids, NEW_TOKENS)
    _assert_speculative_greedy(outs, hf_reference)
    alive = [
        pid
        for pid in spawned
        if psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    ]
    assert alive == [], f"engine processes left running: {alive}"


def test_dspark_greedy_equals_plain_decoding(
    dspark_engine: Any, prompt_ids: list[list[int]], hf_reference: list[list[int]]
) -> None:
    _assert_speculative_greedy(
        generate_outputs(dspark_engine, prompt_ids, NEW_TOKENS), hf_reference
    )
