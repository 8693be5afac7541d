"""DSPARK_MOE with the target sharded ``tp_size=2`` on CPU.

Why: plain decoding with ``tp_size=2`` is covered by ``test_sglang_tp_cpu.py``;
speculative decoding adds the drafter worker, the verify forward and the
draft/target KV bookkeeping on top, each of which could assume one rank. The
drafter is the shaped seeded one of ``conftest.py`` (residual
branches scaled down 100x so slot 0 often repeats the anchor and is accepted
sometimes), saved with ``save_drafter`` and loaded by SGLang through the plugin.

Checked on 4 prompts of mixed lengths x 32 tokens: greedy output equals HF's
greedy continuation (the first 32 of the session's 64-token reference; greedy
is prefix-consistent), every request went through at least one verify, and our
``dspark_*`` metrics count each verify once (TP rank 0 records; both ranks run
the worker), i.e. as many accepted-length observations as SGLang's verify rounds.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from prom_samples import read_metrics

from dspark_sglang.model import save_drafter
from dspark_sglang.sglang_integration.engine import CpuEngineSpec, cpu_engine, generate_outputs

pytestmark = [pytest.mark.sglang, pytest.mark.slow]

NEW_TOKENS = 32
#: Short, short, long, multi-line: mixed prompt lengths (indices into conftest.PROMPTS).
PROMPT_SUBSET = (0, 1, 4, 6)


@pytest.fixture(scope="module")
def tp2_moe_outputs(
    smollm2_path: Path,
    prompt_ids: list[list[int]],
    tmp_path_factory: pytest.TempPathFactory,
    shaped_drafter: Any,
) -> dict[str, Any]:
    from dspark_sglang.targets.hf_target import HFTarget

    target = HFTarget(smollm2_path)
    drafter = shaped_drafter(target)
    folder = save_drafter(drafter, tmp_path_factory.mktemp("moe_tp2") / "draft")
    del drafter, target
    prom = tmp_path_factory.mktemp("moe_tp2_prom")
    spec = CpuEngineSpec(
        model_path=str(smollm2_path),
        overrides={
            "tp_size": 2,
            "speculative_algorithm": "DSPARK_MOE",
            "speculative_draft_model_path": str(folder),
            # No enable_metrics: a second in-process engine with it collides with
            # test_sglang_moe_scheduler's in SGLang's own registry (sglang:startup_*);
            # PROMETHEUS_MULTIPROC_DIR alone puts our metrics in the directory.
        },
        # One core per rank (SGLang's CPU TP needs an explicit binding).
        env={
            "SGLANG_CPU_OMP_THREADS_BIND": "0|1",
            "SGLANG_RAGGED_VERIFY_MODE": "static",
            "PROMETHEUS_MULTIPROC_DIR": str(prom),
        },
    )
    prompts = [prompt_ids[i] for i in PROMPT_SUBSET]
    with cpu_engine(spec) as engine:
        outs = generate_outputs(engine, prompts, NEW_TOKENS)
        return {"outs": outs, "metrics": read_metrics(prom)}


def test_tp2_dspark_moe_greedy_matches_hf(
    tp2_moe_outputs: dict[str, Any], hf_reference: list[list[int]]
) -> None:
    refs = [hf_reference[i][:NEW_TOKENS] for i in PROMPT_SUBSET]
    for i, (o, ref) in enumerate(zip(tp2_moe_outputs["outs"], refs, strict=True)):
        got = list(o["output_ids"])
        first = next((k for k in range(len(ref)) if k >= len(got) or got[k] != ref[k]), None)
        assert got == ref, f"prompt {PROMPT_SUBSET[i]}: first mismatch at token {first}"


def test_tp2_dspark_moe_verifies(tp2_moe_outputs: dict[str, Any]) -> None:
    for i, o in enumerate(tp2_moe_outputs["outs"]):
        ct = int(o["meta_info"]["spec_verify_ct"])
        assert ct > 0, f"prompt {PROMPT_SUBSET[i]}: no speculative verify ran (spec_verify_ct=0)"


def test_tp2_metrics_count_each_verify_once(tp2_moe_outputs: dict[str, Any]) -> None:
    """Both TP ranks run the worker; only rank 0 records, so counts are single-rank counts."""
    verifies = [int(o["meta_info"]["spec_verify_ct"]) for o in tp2_moe_outputs["outs"]]
    m = tp2_moe_outputs["metrics"]
    # One accepted-length observation per request per verify round.
    assert m[("dspark_accepted_length_count", ())] == sum(verifies)
    # A round (decode step) verifies every running request once.
    assert max(verifies) <= m[("dspark_rounds_total", ())] <= sum(verifies)
