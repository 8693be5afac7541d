"""Reference generator on the real SmolLM2-135M-Instruct target (slow).

Greedy speculative decoding with an untrained drafter is token-identical to the
target's own greedy decoding on 8 GSM8K prompts x 32 tokens. Plus the oracle drafter
on the real model (acceptance, partial acceptance, ragged verify lengths), and plain
decoding == transformers' ``generate`` so "the target's own greedy decoding" is
anchored to HF itself.
"""

from __future__ import annotations

import pytest
import torch
from cpu_threads import torch_threads
from reference_helpers import CyclingPolicy, OracleProposer, expected_accepts

from dspark_sglang.data.evalsets import load_gsm8k_test
from dspark_sglang.model import DSparkConfig, DSparkDrafter
from dspark_sglang.reference.generator import DSparkProposer, ReferenceGenerator, plain_generate
from dspark_sglang.sampling import SamplingParams
from dspark_sglang.scheduling.policies import build_policy
from dspark_sglang.targets.hf_target import HFTarget

pytestmark = pytest.mark.slow

GREEDY = SamplingParams(temperature=0.0)
N_PROMPTS, N_TOKENS = 8, 32


@pytest.fixture(scope="module")
def target() -> HFTarget:
    from dspark_sglang.targets.smollm2 import ensure_smollm2

    return HFTarget(ensure_smollm2(), num_threads=torch_threads())


@pytest.fixture(scope="module")
def prompts(target: HFTarget) -> list[list[int]]:
    return [target.encode_chat(p.chat()) for p in load_gsm8k_test(limit=N_PROMPTS)]


@pytest.fixture(scope="module")
def plain(target: HFTarget, prompts: list[list[int]]) -> list[list[int]]:
    """Target greedy decoding, no stop tokens (also the oracle's reference)."""
    return plain_generate(target, prompts, N_TOKENS, sampling=GREEDY).outputs


@pytest.fixture(scope="module")
def drafter(target: HFTarget) -> DSparkDrafter:
    """The production-shaped default drafter, untrained and seeded."""
    cfg = DSparkConfig.for_target(target.spec, mask_token_id=target.default_mask_token_id())
    torch.manual_seed(0)
    return DSparkDrafter(cfg, target.embed_tokens, target.lm_head).eval()


def _truncate_at_stop(tokens: list[int], stops: tuple[int, ...]) -> list[int]:
    for i, t in enumerate(tokens):
        if t in stops:
            return tokens[: i + 1]
    return tokens


def test_plain_greedy_equals_transformers_generate(
    target: HFTarget, prompts: list[list[int]], plain: list[list[int]]
) -> None:
    with torch.inference_mode():
        out = target.model.generate(
            torch.tensor([prompts[0]]), max_new_tokens=24, do_sample=False, eos_token_id=None
        )
    assert out[0, len(prompts[0]) :].tolist() == plain[0][:24]


def test_greedy_speculative_is_token_identical(
    target: HFTarget, prompts: list[list[int]], plain: list[list[int]], drafter: DSparkDrafter
) -> None:
    assert drafter.config.block_size == 7
    stops = target.eos_token_ids
    gen = ReferenceGenerator(target, drafter, build_policy("verify_all"), sampling=GREEDY)
    res = gen.generate(prompts, N_TOKENS, stop_token_ids=stops)
    expected = [_truncate_at_stop(p, stops) for p in plain]
    assert len(res.outputs) == N_PROMPTS >= 8
    assert res.outputs == expected
    assert sum(len(o) for o in res.outputs) >= N_PROMPTS * N_TOKENS * 0.9
    # The untrained drafter is (almost) never right: every round verified all 7
    # drafts, so the match above is the target correcting them, token by token.
    assert all(lv == 7 for r in res.rounds for lv, _ in r)
    assert res.accept_length_mean < 1.5


def test_oracle_on_smollm2_ragged_partial_acceptance(
    target: HFTarget, prompts: list[list[int]], plain: list[list[int]], drafter: DSparkDrafter
) -> None:
    n_prompts, n_new = 2, 24  # the oracle reads a block past n_new: 24 + 7 + 1 <= N_TOKENS
    refs = [p + r for p, r in zip(prompts[:n_prompts], plain[:n_prompts], strict=True)]
    oracle = OracleProposer(
        DSparkProposer(drafter),
        refs,
        lambda rid, rnd: (2 * rid + 3 * rnd + 2) % 8,
        target.spec.vocab_size,
    )
    gen = ReferenceGenerator(target, oracle, CyclingPolicy(), sampling=GREEDY)
    res = gen.generate(prompts[:n_prompts], n_new)
    assert oracle.anchor_mismatches == 0
    assert res.outputs == [r[:n_new] for r in plain[:n_prompts]]
    for rid, rounds in enumerate(res.rounds):
        assert rounds == expected_accepts(rounds, oracle.ks[rid])
    verify_lens = {lv for r in res.rounds for lv, _ in r}
    accepts = {a for r in res.rounds for _, a in r}
    assert len(verify_lens) >= 5 and len(accepts) >= 4
    assert res.accept_length_mean > 2.0
