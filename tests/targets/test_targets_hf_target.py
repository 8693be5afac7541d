"""HFTarget: hidden-state capture, incremental forward, KV crop, mask token.

Fast checks run on a tiny random Llama (a real transformers model); the same
properties are re-checked on SmolLM2-135M (slow).
"""

from __future__ import annotations

import pytest
import torch
from cpu_threads import torch_threads
from transformers import LlamaConfig, LlamaForCausalLM

from dspark_sglang.model import default_target_layer_ids
from dspark_sglang.targets.hf_target import HFTarget, default_mask_token_id

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def tiny() -> HFTarget:
    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=50,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=5,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        tie_word_embeddings=True,
    )
    return HFTarget.from_model(LlamaForCausalLM(cfg), name="tiny")


def _reference_hidden(target: HFTarget, ids: torch.Tensor) -> tuple[torch.Tensor, ...]:
    with torch.inference_mode():
        out = target.model(input_ids=ids, output_hidden_states=True)
    return out.logits.float(), *out.hidden_states


def _check_capture(target: HFTarget, ids: torch.Tensor, layer_ids: tuple[int, ...]) -> None:
    logits, captured, cache = target.forward(ids, None, 0, layer_ids)
    ref_logits, *hidden = _reference_hidden(target, ids)
    h = target.spec.hidden_size
    assert captured.shape == (1, ids.shape[1], len(layer_ids) * h)
    for j, lid in enumerate(layer_ids):
        torch.testing.assert_close(
            captured[..., j * h : (j + 1) * h], hidden[lid + 1], rtol=0, atol=1e-5
        )
    torch.testing.assert_close(logits, ref_logits, rtol=0, atol=1e-4)
    assert cache.get_seq_length() == ids.shape[1]


def test_capture_equals_hf_output_hidden_states(tiny: HFTarget) -> None:
    ids = torch.randint(0, 50, (1, 17), generator=torch.Generator().manual_seed(1))
    _check_capture(tiny, ids, (0, 2, 3))
    _check_capture(tiny, ids, (3, 1))  # order of ids is the order of concatenation


def test_incremental_forward_equals_full_forward(tiny: HFTarget) -> None:
    ids = torch.randint(0, 50, (1, 20), generator=torch.Generator().manual_seed(2))
    full_logits, full_cap, _ = tiny.forward(ids, None, 0, (1, 2))
    cache = None
    logits_parts, cap_parts = [], []
    for lo, hi in [(0, 7), (7, 8), (8, 13), (13, 20)]:
        lg, cap, cache = tiny.forward(ids[:, lo:hi], cache, lo, (1, 2))
        logits_parts.append(lg)
        cap_parts.append(cap)
    torch.testing.assert_close(torch.cat(logits_parts, 1), full_logits, rtol=0, atol=1e-4)
    torch.testing.assert_close(torch.cat(cap_parts, 1), full_cap, rtol=0, atol=1e-5)


def test_crop_then_refeed_equals_fresh_run(tiny: HFTarget) -> None:
    """Rejected drafts are cropped away: the cache must forget them exactly."""
    g = torch.Generator().manual_seed(3)
    prefix = torch.randint(0, 50, (1, 9), generator=g)
    rejected = torch.randint(0, 50, (1, 5), generator=g)
    replacement = torch.randint(0, 50, (1, 4), generator=g)
    _, _, cache = tiny.forward(prefix, None, 0, ())
    tiny.forward(rejected, cache, 9, ())
    assert cache.get_seq_length() == 14
    HFTarget.crop_cache(cache, 11)  # keep 2 of the 5 "drafts"
    assert cache.get_seq_length() == 11
    lg, cap, cache = tiny.forward(replacement, cache, 11, (2,))
    fresh_ids = torch.cat([prefix, rejected[:, :2], replacement], 1)
    ref_lg, ref_cap, _ = tiny.forward(fresh_ids, None, 0, (2,))
    torch.testing.assert_close(lg, ref_lg[:, -4:], rtol=0, atol=1e-4)
    torch.testing.assert_close(cap, ref_cap[:, -4:], rtol=0, atol=1e-5)
    HFTarget.crop_cache(cache, cache.get_seq_length())  # a no-op crop is allowed
    with pytest.raises(ValueError, match="cannot crop"):
        HFTarget.crop_cache(cache, cache.get_seq_length() + 1)


def test_logits_to_keep_returns_the_last_rows(tiny: HFTarget) -> None:
    ids = torch.randint(0, 50, (1, 12), generator=torch.Generator().manual_seed(4))
    full, _, _ = tiny.forward(ids, None, 0, ())
    last, cap, _ = tiny.forward(ids, None, 0, (0,), logits_to_keep=1)
    assert last.shape == (1, 1, 50) and cap.shape[1] == 12
    torch.testing.assert_close(last[:, 0], full[:, -1], rtol=0, atol=1e-5)


def test_bad_inputs_are_refused(tiny: HFTarget) -> None:
    ids = torch.tensor([[1, 2, 3]])
    with pytest.raises(ValueError, match="last layer"):
        tiny.forward(ids, None, 0, (4,))
    with pytest.raises(ValueError, match=r"\[1, T\]"):
        tiny.forward(torch.tensor([[1], [2]]), None, 0, ())
    _, _, cache = tiny.forward(ids, None, 0, ())
    with pytest.raises(ValueError, match="position_offset=2"):
        tiny.forward(ids, cache, 2, ())
    with pytest.raises(ValueError, match="without a tokenizer"):
        tiny.encode_chat([{"role": "user", "content": "hi"}])


def test_spec_and_shared_modules(tiny: HFTarget) -> None:
    assert tiny.spec.num_layers == 5 and tiny.spec.vocab_size == 50
    assert tiny.spec.head_dim == 8 and tiny.spec.num_key_value_heads == 2
    assert tiny.embed_tokens.weight.shape == (50, 32)
    assert tiny.lm_head.weight.shape == (50, 32)
    assert not any(p.requires_grad for p in tiny.model.parameters())


# --------------------------------------------------------------------------- SmolLM2


@pytest.fixture(scope="module")
def smollm2() -> HFTarget:
    from dspark_sglang.targets.smollm2 import ensure_smollm2

    return HFTarget(ensure_smollm2(), num_threads=torch_threads())


@pytest.mark.slow
def test_smollm2_capture_crop_and_spec(smollm2: HFTarget) -> None:
    spec = smollm2.spec
    assert (spec.name, spec.vocab_size, spec.hidden_size, spec.num_layers) == (
        "SmolLM2-135M-Instruct",
        49152,
        576,
        30,
    )
    ids = torch.tensor([smollm2.encode_chat([{"role": "user", "content": "What is 7 * 8?"}])])
    layers = default_target_layer_ids(spec.num_layers)
    assert max(layers) < spec.num_layers - 1 and len(layers) == 5
    _check_capture(smollm2, ids, layers)
    # Crop correctness on the real model.
    t = ids.shape[1]
    _, _, cache = smollm2.forward(ids[:, : t - 4], None, 0, ())
    smollm2.forward(torch.tensor([[5, 6, 7]]), cache, t - 4, ())
    HFTarget.crop_cache(cache, t - 4)
    lg, _, _ = smollm2.forward(ids[:, t - 4 :], cache, t - 4, ())
    ref, _, _ = smollm2.forward(ids, None, 0, ())
    torch.testing.assert_close(lg, ref[:, -4:], rtol=0, atol=1e-3)


@pytest.mark.slow
def test_smollm2_mask_token_and_chat_template(smollm2: HFTarget) -> None:
    tok = smollm2.tokenizer
    assert tok is not None
    mask = default_mask_token_id(tok)
    assert mask == smollm2.default_mask_token_id() == 16
    assert tok.convert_ids_to_tokens(mask) == "<empty_output>"
    assert mask not in (tok.eos_token_id, tok.bos_token_id, tok.pad_token_id)
    ids = smollm2.encode_chat([{"role": "user", "content": "Tom has 3 apples. <b>Why?</b>"}])
    assert mask not in ids
    text = tok.decode(ids)
    assert text.startswith("<|im_start|>system\n") and text.endswith("<|im_start|>assistant\n")
    assert smollm2.eos_token_ids == (2,)
