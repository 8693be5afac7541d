"""The CPU verify-shaped forward: it must compute what a real verify step computes."""

from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM

from dspark_sglang.profiling.backend import Backend, HFVerifyBackend, SimulatedBackend


def _tiny_llama() -> LlamaForCausalLM:
    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=300,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
    )
    return LlamaForCausalLM(cfg).eval()


@pytest.mark.parametrize("batch_tokens", [1, 6, 12, 13])
def test_packed_verify_step_equals_each_request_verified_alone(batch_tokens: int) -> None:
    """The packed ragged forward computes, for every request, exactly the logits of
    verifying that request's tokens on its own over the same cached context."""
    torch.set_num_threads(1)
    model = _tiny_llama()
    be = HFVerifyBackend(model, "tiny", context_len=20, verify_width=4, max_batch_tokens=16)
    assert isinstance(be, Backend)
    step = be.prepare(batch_tokens)
    batch = be.current
    assert batch is not None and sum(batch.widths) == batch_tokens
    assert batch.num_requests == -(-batch_tokens // 4)
    ctx = [
        (layer.keys[:, :, :20].clone(), layer.values[:, :, :20].clone())
        for layer in batch.cache.layers
    ]
    step()
    first = batch.last_logits.clone()
    step()  # the cache was rewound: a second step sees the same context
    assert torch.equal(batch.last_logits, first)
    assert all(int(layer.cumulative_length) == 20 for layer in batch.cache.layers)
    assert first.shape == (1, batch_tokens, 300)  # logits for every verify token

    refs, start = [], 0
    for w in batch.widths:
        ref_cache = DynamicCache()
        for i, (k, v) in enumerate(ctx):
            ref_cache.update(k.clone(), v.clone(), i)
        with torch.inference_mode():
            refs.append(
                model(
                    input_ids=batch.input_ids[:, start : start + w],
                    position_ids=torch.arange(20, 20 + w).unsqueeze(0),
                    past_key_values=ref_cache,
                    use_cache=True,
                ).logits
            )
        start += w
    torch.testing.assert_close(first, torch.cat(refs, dim=1), rtol=1e-4, atol=1e-4)


def test_backend_rejects_out_of_range_sizes_and_bad_settings() -> None:
    be = HFVerifyBackend(_tiny_llama(), "tiny", context_len=4, max_batch_tokens=8)
    with pytest.raises(ValueError, match="outside"):
        be.prepare(9)
    with pytest.raises(ValueError, match="context_len"):
        HFVerifyBackend(_tiny_llama(), "tiny", context_len=0)
    with pytest.raises(ValueError, match="target_width"):
        HFVerifyBackend(_tiny_llama(), "tiny", verify_width=0)
    with pytest.raises(ValueError, match="clock must be one of"):
        HFVerifyBackend(_tiny_llama(), "tiny", clock="tsc")
    torch.set_num_threads(2)
    try:
        with pytest.raises(ValueError, match=r"needs torch\.set_num_threads"):
            HFVerifyBackend(_tiny_llama(), "tiny", clock="thread_cpu")
    finally:
        torch.set_num_threads(1)
    cpu_timed = HFVerifyBackend(_tiny_llama(), "tiny", clock="thread_cpu", max_batch_tokens=4)
    assert cpu_timed.info.settings["clock"] == "thread_cpu"
    t0 = cpu_timed.now()
    cpu_timed.prepare(4)()
    assert cpu_timed.now() > t0  # the forward's own CPU time is visible to the clock
    sim = SimulatedBackend(lambda b: -1.0, max_batch_tokens=4)
    with pytest.raises(ValueError, match="must be positive"):
        sim.prepare(2)
