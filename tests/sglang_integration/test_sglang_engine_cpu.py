"""Goal 1: SGLang's real Engine on CPU (plain decoding) equals HF transformers."""

from __future__ import annotations

from typing import Any

import pytest

from dspark_sglang.sglang_integration.engine import generate_ids

pytestmark = [pytest.mark.sglang, pytest.mark.slow]

NEW_TOKENS = 64  # as the hf_reference fixture (conftest.py)


def test_plain_greedy_matches_hf(
    plain_engine: Any, prompt_ids: list[list[int]], hf_reference: list[list[int]]
) -> None:
    got = generate_ids(plain_engine, prompt_ids, NEW_TOKENS)
    assert [len(g) for g in got] == [NEW_TOKENS] * len(prompt_ids)
    for i, (g, ref) in enumerate(zip(got, hf_reference, strict=True)):
        first = next((k for k in range(len(g)) if g[k] != ref[k]), None)
        assert g == ref, f"prompt {i}: first mismatch at token {first}"
