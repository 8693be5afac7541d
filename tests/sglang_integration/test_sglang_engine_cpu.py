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


def test_demo_passes_start_from_an_empty_radix_cache(
    plain_engine: Any, prompt_ids: list[list[int]]
) -> None:
    """The demo times every pass from an empty radix cache, so passes compute the same prefill.

    Without the flush a repeated prompt is served from the cache (``cached_tokens`` > 0)
    and only its last token is prefilled: another kernel path, whose rounding can flip
    a bfloat16 near-tie between passes.
    """
    from dspark_sglang.sglang_integration.demo import flush_radix_cache
    from dspark_sglang.sglang_integration.engine import generate_outputs

    prompt = [prompt_ids[0]]

    def cached() -> int:
        return int(generate_outputs(plain_engine, prompt, 2)[0]["meta_info"]["cached_tokens"])

    flush_radix_cache(plain_engine)
    assert cached() == 0
    assert cached() > 0  # the same prompt again, no flush: served from the cache
    flush_radix_cache(plain_engine)
    assert cached() == 0
