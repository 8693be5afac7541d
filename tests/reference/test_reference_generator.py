"""Reference generator on a tiny random Llama target (fast; no SmolLM2 needed).

Covers: greedy identity with plain decoding under every policy shape, oracle
acceptance/partial acceptance with ragged verify lengths (accepted counts equal
what the oracle implies), stop tokens and max_new_tokens truncation, the sliding
context window, and, statistically, that sampled outputs follow the target's
exact distribution.
"""

from __future__ import annotations

import pytest
import torch
from reference_helpers import (
    TINY_VOCAB,
    CyclingPolicy,
    OracleProposer,
    expected_accepts,
    tiny_drafter,
    tiny_target,
)
from scipy.stats import chi2

from dspark_sglang.reference.generator import (
    DSparkProposer,
    ReferenceGenerator,
    plain_generate,
)
from dspark_sglang.sampling import SamplingParams
from dspark_sglang.scheduling import from_probes
from dspark_sglang.scheduling.policies import build_policy
from dspark_sglang.targets.hf_target import HFTarget

GREEDY = SamplingParams(temperature=0.0)
PROMPTS = [[1, 2, 3], [4, 0, 1, 2, 2], [3], [2, 2, 1, 0, 4, 3, 1]]


@pytest.fixture(scope="module")
def target() -> HFTarget:
    return tiny_target(seed=0)


@pytest.fixture(scope="module")
def plain_ref(target: HFTarget) -> list[list[int]]:
    """Greedy continuation long enough for every oracle draft (max_new 20 + B 4)."""
    return plain_generate(target, PROMPTS, 24, sampling=GREEDY).outputs


def _prefix_policy() -> object:
    # A real SPS staircase (made-up numbers): verifying more tokens costs steps/s.
    table = from_probes([(1, 100.0), (4, 95.0), (8, 80.0), (16, 50.0), (64, 10.0)])
    return build_policy("prefix", table)


@pytest.mark.parametrize(
    "policy_name", ["verify_all", "mtp1", "none", "static3", "prefix", "cycling"]
)
def test_greedy_untrained_drafter_matches_plain(
    target: HFTarget, plain_ref: list[list[int]], policy_name: str
) -> None:
    policy = {
        "static3": lambda: build_policy("static", k=3),
        "prefix": _prefix_policy,
        "cycling": CyclingPolicy,
    }.get(policy_name, lambda: build_policy(policy_name))()
    gen = ReferenceGenerator(target, tiny_drafter(target), policy, sampling=GREEDY)
    res = gen.generate(PROMPTS, 20)
    assert res.outputs == [r[:20] for r in plain_ref]
    assert all(len(o) == 20 for o in res.outputs)
    # Every round emits accepted + 1 tokens; the rounds account for all tokens
    # (first token comes from the prefill, the last round may overshoot).
    for out, rounds in zip(res.outputs, res.rounds, strict=True):
        emitted = 1 + sum(a + 1 for _, a in rounds)
        assert emitted >= len(out) and emitted - (rounds[-1][1] + 1) < len(out)
        assert all(0 <= a <= lv <= 4 for lv, a in rounds)
    assert res.target_forwards == len(PROMPTS) + res.num_rounds


@pytest.mark.parametrize("ngram", [1, 2])
@pytest.mark.parametrize("policy_name", ["verify_all", "prefix"])
def test_greedy_context_copies_match_plain(
    target: HFTarget, plain_ref: list[list[int]], policy_name: str, ngram: int
) -> None:
    """Drafts copied from the context change what is proposed, never what is emitted."""
    policy = _prefix_policy() if policy_name == "prefix" else build_policy(policy_name)
    gen = ReferenceGenerator(
        target, tiny_drafter(target), policy, sampling=GREEDY, context_copy_ngram=ngram
    )
    res = gen.generate(PROMPTS, 20)
    assert res.outputs == [r[:20] for r in plain_ref]
    # Copies were proposed and verified (the prompts repeat tokens of a 5-token vocab).
    assert res.copies_reached > 0
    assert 0 <= res.copies_accepted <= res.copies_reached
    assert res.copies_reached <= int(res.position_reached.sum())


def test_context_copy_settings_are_checked(target: HFTarget) -> None:
    drafter, policy = tiny_drafter(target), build_policy("verify_all")
    with pytest.raises(ValueError, match="context_copy_ngram must be an integer >= 0"):
        ReferenceGenerator(target, drafter, policy, context_copy_ngram=-1)
    with pytest.raises(ValueError, match="copy_confidence must be a probability"):
        ReferenceGenerator(target, drafter, policy, context_copy_ngram=2, copy_confidence=1.5)


@pytest.mark.parametrize("k", [0, 1, 2, 4])
@pytest.mark.parametrize("policy_name", ["verify_all", "cycling"])
def test_oracle_acceptance_equals_what_the_oracle_implies(
    target: HFTarget, plain_ref: list[list[int]], k: int, policy_name: str
) -> None:
    policy = CyclingPolicy() if policy_name == "cycling" else build_policy("verify_all")
    refs = [p + r for p, r in zip(PROMPTS, plain_ref, strict=True)]
    oracle = OracleProposer(
        DSparkProposer(tiny_drafter(target)), refs, lambda _rid, _rnd: k, TINY_VOCAB
    )
    gen = ReferenceGenerator(target, oracle, policy, sampling=GREEDY)
    res = gen.generate(PROMPTS, 20)
    assert oracle.anchor_mismatches == 0
    assert res.outputs == [r[:20] for r in plain_ref]
    for rid, rounds in enumerate(res.rounds):
        assert rounds == expected_accepts(rounds, oracle.ks[rid])
    if policy_name == "cycling":
        assert {lv for r in res.rounds for lv, _ in r} == {0, 1, 2, 3, 4}  # really ragged
    # Position-wise: drafts before k always survive once reached, draft k never does.
    acc, reached = res.position_accepted, res.position_reached
    assert torch.equal(acc[:k], reached[:k])
    if k < 4:
        assert int(acc[k]) == 0 and int(reached[k]) > 0
    if policy_name == "verify_all":
        assert res.accept_length_mean == pytest.approx(k + 1)


def test_oracle_varying_k_per_round_and_request(
    target: HFTarget, plain_ref: list[list[int]]
) -> None:
    refs = [p + r for p, r in zip(PROMPTS, plain_ref, strict=True)]
    oracle = OracleProposer(
        DSparkProposer(tiny_drafter(target)),
        refs,
        lambda rid, rnd: (3 * rid + 2 * rnd + 1) % 5,
        TINY_VOCAB,
    )
    res = ReferenceGenerator(target, oracle, CyclingPolicy(), sampling=GREEDY).generate(PROMPTS, 20)
    assert res.outputs == [r[:20] for r in plain_ref]
    for rid, rounds in enumerate(res.rounds):
        assert rounds == expected_accepts(rounds, oracle.ks[rid])
    assert len({a for r in res.rounds for _, a in r}) >= 4  # partial acceptance of many lengths


def test_full_oracle_emits_block_plus_one_per_round(
    target: HFTarget, plain_ref: list[list[int]]
) -> None:
    refs = [p + r for p, r in zip(PROMPTS, plain_ref, strict=True)]
    oracle = OracleProposer(
        DSparkProposer(tiny_drafter(target)), refs, lambda _r, _n: 4, TINY_VOCAB
    )
    res = ReferenceGenerator(target, oracle, build_policy("verify_all"), sampling=GREEDY).generate(
        PROMPTS, 20
    )
    # 1 prefill token + 5 per round: 19 remaining tokens need exactly 4 rounds.
    assert [len(r) for r in res.rounds] == [4] * len(PROMPTS)
    assert all(r == [(4, 4)] * 4 for r in res.rounds)
    assert res.outputs == [r[:20] for r in plain_ref]
    assert torch.equal(res.position_accepted, torch.full((4,), 4 * len(PROMPTS)))


def test_stop_token_truncates_like_plain_decoding(
    target: HFTarget, plain_ref: list[list[int]]
) -> None:
    # Stop at a token that occurs in the greedy outputs, mid-block under a full oracle.
    stop = plain_ref[0][6]
    refs = [p + r for p, r in zip(PROMPTS, plain_ref, strict=True)]
    oracle = OracleProposer(
        DSparkProposer(tiny_drafter(target)), refs, lambda _r, _n: 4, TINY_VOCAB
    )
    gen = ReferenceGenerator(target, oracle, build_policy("verify_all"), sampling=GREEDY)
    res = gen.generate(PROMPTS, 20, stop_token_ids=[stop])
    plain = plain_generate(target, PROMPTS, 20, [stop], sampling=GREEDY)
    assert res.outputs == plain.outputs
    for out, ref in zip(res.outputs, plain_ref, strict=True):
        cut = ref[:20].index(stop) + 1 if stop in ref[:20] else 20
        assert out == ref[:cut]
    assert len(res.outputs[0]) <= 7


def test_max_new_tokens_overshoot_is_dropped(target: HFTarget, plain_ref: list[list[int]]) -> None:
    refs = [p + r for p, r in zip(PROMPTS, plain_ref, strict=True)]
    oracle = OracleProposer(
        DSparkProposer(tiny_drafter(target)), refs, lambda _r, _n: 4, TINY_VOCAB
    )
    gen = ReferenceGenerator(target, oracle, build_policy("verify_all"), sampling=GREEDY)
    for n in (1, 2, 7, 13):
        res = gen.generate(PROMPTS, n)
        assert res.outputs == [r[:n] for r in plain_ref]


def test_sliding_window_context_is_the_last_w_positions(target: HFTarget) -> None:
    """The drafter sees exactly the last W hidden states, whatever the history length."""
    seen: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []

    class Spy(DSparkProposer):
        def propose(self, inputs, sampling, generator):  # type: ignore[no-untyped-def]
            seen.append((inputs.context_positions, inputs.context_valid, inputs.anchor_positions))
            return super().propose(inputs, sampling, generator)

    window = 5
    gen = ReferenceGenerator(
        target,
        Spy(tiny_drafter(target, sliding_window=window)),
        build_policy("verify_all"),
        sampling=GREEDY,
    )
    gen.generate(PROMPTS, 12)
    assert seen
    for pos, valid, anchors in seen:
        for i in range(anchors.numel()):
            got = pos[i][valid[i]].tolist()
            p = int(anchors[i])
            assert got == list(range(max(0, p - window), p))


def test_policy_returning_bad_lengths_is_refused(target: HFTarget) -> None:
    class Bad(CyclingPolicy):
        def decide(self, confidence: torch.Tensor) -> torch.Tensor:
            return torch.full((confidence.shape[0],), confidence.shape[1] + 1)

    gen = ReferenceGenerator(target, tiny_drafter(target), Bad(), sampling=GREEDY)
    with pytest.raises(ValueError, match="verify lengths"):
        gen.generate(PROMPTS[:1], 4)


def test_sts_temperatures_are_validated_and_applied(target: HFTarget) -> None:
    drafter = tiny_drafter(target)
    with pytest.raises(ValueError, match="sts_temperatures has 2 values"):
        ReferenceGenerator(target, drafter, build_policy("none"), sts_temperatures=[1.0, 1.0])
    with pytest.raises(ValueError, match="finite and > 0"):
        ReferenceGenerator(target, drafter, build_policy("none"), sts_temperatures=[1, 0, 1, 1])
    temps = [0.5, 1.0, 2.0, 4.0]
    gen = ReferenceGenerator(target, drafter, build_policy("none"), sts_temperatures=temps)
    z = torch.tensor([[1.0, -2.0, 3.0, 0.5]])
    from dspark_sglang.model import DraftProposal

    prop = DraftProposal(
        tokens=torch.zeros(1, 4, dtype=torch.long), probs=torch.zeros(1, 4, 6), confidence_logits=z
    )
    expected = torch.sigmoid(z / torch.tensor(temps))
    assert torch.allclose(gen.confidence(prop), expected)


def test_prompt_validation(target: HFTarget) -> None:
    gen = ReferenceGenerator(target, tiny_drafter(target), build_policy("none"))
    with pytest.raises(ValueError, match="empty"):
        gen.generate([[]], 3)
    with pytest.raises(ValueError, match="outside"):
        gen.generate([[TINY_VOCAB]], 3)
    with pytest.raises(ValueError, match="max_new_tokens"):
        gen.generate([[1]], 0)


# --------------------------------------------------------------------------- statistics


def _exact_joint(target: HFTarget, prompt: list[int], n: int, v: int) -> torch.Tensor:
    """P(x_1..x_n | prompt) for every sequence, by enumeration (``[v] * n``)."""
    prefixes: list[list[int]] = [[]]
    probs = torch.ones(1, dtype=torch.float64)
    for _ in range(n):
        ids = torch.tensor([[*prompt, *p] for p in prefixes])
        with torch.inference_mode():
            logits = target.model(input_ids=ids).logits[:, -1].double()
        step = torch.softmax(logits, -1)  # temperature 1, no top-k/p
        probs = (probs.unsqueeze(1) * step).reshape(-1)
        prefixes = [[*p, t] for p in prefixes for t in range(v)]
    return probs.reshape([v] * n)


def _chi2_pvalue(counts: torch.Tensor, probs: torch.Tensor, min_expected: float = 5.0) -> float:
    """Pearson chi-square goodness of fit; cells with expected < 5 are pooled."""
    total = counts.sum()
    expected = probs * total
    big = expected >= min_expected
    obs = torch.cat([counts[big], counts[~big].sum().reshape(1)])
    exp = torch.cat([expected[big], expected[~big].sum().reshape(1)])
    keep = exp > 0
    stat = float(((obs[keep] - exp[keep]) ** 2 / exp[keep]).sum())
    dof = int(keep.sum()) - 1
    return float(chi2.sf(stat, dof))


@pytest.mark.parametrize(
    ("policy_name", "ngram"), [("verify_all", 0), ("cycling", 0), ("verify_all", 1)]
)
def test_sampled_output_follows_the_target_distribution(policy_name: str, ngram: int) -> None:
    """Chi-square test of the first 3 sampled tokens against the exact target joint.

    600 samples (fixed seeds), vocabulary 4 -> 64 cells, pooled below 5 expected.
    Null: speculative sampling is lossless. We require p > 1e-3 (a correct
    implementation fails this 0.1 % of the time for a random seed; the seeds are
    fixed). Power check: the drafter's own distribution is far from the target's
    (total variation > 0.2), so verification really has to correct it. With
    ``ngram`` 1 most drafts are context copies (every token of the prompt is
    followed by another), verified against one-hot draft distributions.
    """
    v, n_tok, n_samples = 4, 3, 600
    target = tiny_target(seed=3, vocab=v, layers=2)
    drafter = tiny_drafter(target, block_size=3, seed=4)
    prompt = [1, 2, 3, 0]
    policy = CyclingPolicy() if policy_name == "cycling" else build_policy("verify_all")
    gen = ReferenceGenerator(
        target,
        drafter,
        policy,
        sampling=SamplingParams(1.0),
        seed=11,
        context_copy_ngram=ngram,
    )
    res = gen.generate([prompt] * n_samples, n_tok)
    if ngram:  # copies were verified, some accepted and some rejected
        assert 0 < res.copies_accepted < res.copies_reached
    assert all(len(o) == n_tok for o in res.outputs)
    counts = torch.zeros([v] * n_tok, dtype=torch.float64)
    for out in res.outputs:
        counts[tuple(out)] += 1
    exact = _exact_joint(target, prompt, n_tok, v)
    assert float(exact.sum()) == pytest.approx(1.0)
    p_value = _chi2_pvalue(counts.reshape(-1), exact.reshape(-1))
    assert p_value > 1e-3, f"chi-square p={p_value:.2e}: outputs deviate from the target"
    # Verification did real work: drafts were both accepted and rejected.
    accepted = [a for r in res.rounds for lv, a in r if lv > 0]
    assert 0 < sum(1 for a in accepted if a > 0) < len(accepted)
    # Power: the drafter's first-token distribution differs from the target's.
    ctx_ids = torch.tensor([prompt])
    _, cap, _ = target.forward(ctx_ids, None, 0, drafter.config.target_layer_ids)
    with torch.inference_mode():
        block = drafter.forward_block(
            cap[:, :-1],
            torch.arange(len(prompt) - 1).unsqueeze(0),
            torch.ones(1, len(prompt) - 1, dtype=torch.bool),
            ctx_ids[:, -1],
            torch.tensor([len(prompt) - 1]),
        )
        p_draft = torch.softmax(block.base_logits[0, 0].double(), -1)
        logits = target.model(input_ids=ctx_ids).logits[0, -1].double()
    p_target = torch.softmax(logits, -1)
    assert 0.5 * float((p_draft - p_target).abs().sum()) > 0.2
