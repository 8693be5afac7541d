"""SGLang's NGRAM (prompt lookup) speculation on CPU, the no-training peer to compare with.

It runs on the reference ``sgl_kernel`` tree ops (``reconstruct_indices_from_tree_mask``,
``verify_tree_greedy_cpu``) and SGLang's own n-gram corpus (a C++ module SGLang
JIT-compiles with the host compiler on first use). Greedy output must equal the
target's (HF transformers), every request must have been verified speculatively, and
on a prompt that repeats itself the corpus's drafts must actually be accepted.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from dspark_sglang.sglang_integration.engine import CpuEngineSpec, cpu_engine, generate_outputs

pytestmark = [pytest.mark.sglang, pytest.mark.slow]

NEW_TOKENS = 32
REPEATING = "one two three four, one two three four, one two three four, one two"


def test_ngram_greedy_equals_target_and_accepts_drafts(
    smollm2_path: Path, prompt_ids: list[list[int]], hf_greedy_fn: Any
) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(smollm2_path)
    prompts = [prompt_ids[6], tok(REPEATING, add_special_tokens=False)["input_ids"]]
    reference = hf_greedy_fn(smollm2_path, prompts, NEW_TOKENS)
    spec = CpuEngineSpec(
        model_path=str(smollm2_path),
        overrides={
            "speculative_algorithm": "NGRAM",
            # SGLang sizes the KV pool from free RAM before and after start-up; on a
            # machine running other jobs that drifts past the default 8% margin.
            # A wider margin with the pool capped keeps the memory use the same.
            "mem_fraction_static": 0.25,
            "max_total_tokens": 4096,
        },
    )
    with cpu_engine(spec) as engine:
        outs = generate_outputs(engine, prompts, NEW_TOKENS)
    for i, (o, ref) in enumerate(zip(outs, reference, strict=True)):
        assert list(o["output_ids"]) == ref, f"prompt {i} differs from the target's greedy output"
        assert o["meta_info"].get("spec_verify_ct", 0) > 0, f"prompt {i}: no speculative verify"
    repeating = outs[1]["meta_info"]
    assert repeating["spec_num_correct_drafts"] > 0, "no NGRAM draft was accepted"
    assert repeating["spec_verify_ct"] < NEW_TOKENS
