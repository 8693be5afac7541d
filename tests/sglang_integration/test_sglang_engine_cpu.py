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


def test_in_flight_requests_never_exceed_the_concurrency_and_come_back_in_order(
    plain_engine: Any, prompt_ids: list[list[int]]
) -> None:
    """``generate_in_flight`` on the real engine: its greedy outputs are the batch call's,
    in prompt order, and at most ``concurrency`` requests are ever awaiting SGLang (the
    engine's own ``async_generate``, counted around each call)."""
    import asyncio

    from dspark_sglang.sglang_integration.engine import generate_in_batches, generate_in_flight

    prompts = prompt_ids[:5]
    want = generate_ids(plain_engine, prompts, 6)
    real = plain_engine.async_generate
    live, peak = 0, 0

    async def counted(**kw: Any) -> Any:
        nonlocal live, peak
        live += 1
        peak = max(peak, live)
        try:
            await asyncio.sleep(0)  # let every waiting request try to enter
            return await real(**kw)
        finally:
            live -= 1

    plain_engine.async_generate = counted
    try:
        outs = generate_in_flight(plain_engine, prompts, 6, 2)
    finally:
        del plain_engine.async_generate
    assert [list(o["output_ids"]) for o in outs] == want
    assert peak == 2
    # The batched twin gives the same outputs, in the same order.
    batched = generate_in_batches(plain_engine, prompts, 6, 2)
    assert [list(o["output_ids"]) for o in batched] == want
