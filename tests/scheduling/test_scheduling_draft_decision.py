"""The draft decision (``scheduling/draft_decision.py``): pricing, probes, evidence, and
that it keeps the target's distribution.

Lossless: a toy Markov target ``T``, drafter ``Q`` and confidences ``C[k, prev]`` that
depend on the token drafted before them (so a decision that sees a round's own drafts
can be biased). Each generation runs a first drafting round from a random anchor, whose
confidences are the evidence; then, batch by batch (1..4 requests, so one request's
drafts weigh in the control), the decision says whether the second round drafts (prefix
scheduler, chain verification) or is a plain step. The second round's first two tokens,
given its anchor, must follow ``T[a, y1] T[y1, y2]`` (chi-square, fixed seeds, p >
1e-3). The anticipating control decides from the second round's own confidences (what a
gate that drafted before deciding would see) and must be rejected (p < 1e-6).
"""

from __future__ import annotations

import pytest
import torch
from scipy.stats import chisquare

from dspark_sglang.sampling import sample
from dspark_sglang.scheduling.cost_table import SpsCostTable, with_fixed_step_cost
from dspark_sglang.scheduling.draft_decision import MAX_PROBE_BACKOFF, DraftDecision
from dspark_sglang.scheduling.policies import PrefixScheduler
from dspark_sglang.verify import chain_verify

B = 3
TABLE = SpsCostTable(
    sample_batch_tokens=(1, 8, 16, 32, 64, 128),
    sample_steps_per_sec=(100.0, 95.0, 80.0, 60.0, 35.0, 18.0),
    max_batch_tokens=128,
)


def _decision(draft_seconds: float, probe_every: int = 1000) -> DraftDecision:
    model = with_fixed_step_cost(TABLE, draft_seconds)
    return DraftDecision(B, probe_every, round_model=lambda: model, plain_table=TABLE)


def test_prices_a_drafting_round_against_a_plain_step() -> None:
    cheap, dear = _decision(0.001), _decision(0.05)
    keys = ["a", "b"]
    good = torch.full((2, B), 0.9)
    for d in (cheap, dear):
        d.observe(keys, good)
    price = cheap.price(keys)
    # tau = 2 + 2 * (0.9 + 0.81 + 0.729), 8 verify tokens: SPS 95 with a 1 ms draft.
    assert price.plain_tok_s == pytest.approx(2 * 100.0)
    assert price.draft_tok_s == pytest.approx((2 + 2 * 2.439) / (1 / 95.0 + 0.001))
    assert cheap.decide(keys) is True
    assert dear.decide(keys) is False  # the draft pass costs more than the drafts bring
    poor = _decision(0.001)
    poor.observe(keys, torch.full((2, B), 0.02))
    assert poor.decide(keys) is False  # nothing worth verifying: a plain step is faster


def test_no_evidence_drafts_and_a_new_request_borrows_the_mean() -> None:
    d = _decision(0.001)
    assert d.decide(["a"]) is True and d.last is not None and d.last.reason == "no_evidence"
    d.observe(["a"], torch.tensor([[0.02, 0.01, 0.01]]))
    assert d.decide(["a", "new"]) is False  # "new" priced with a's poor row
    d.observe(["a"], torch.tensor([[0.98, 0.98, 0.98]]))
    assert d.evidence["a"].tolist() == pytest.approx([0.5, 0.495, 0.495])  # the average
    assert d.decide(["a", "new"]) is True


def test_probe_after_probe_every_plain_steps_and_finished_requests_are_forgotten() -> None:
    d = _decision(0.05, probe_every=3)
    d.observe(["a", "b"], torch.full((2, B), 0.5))
    seen = [d.decide(["a", "b"]) for _ in range(4)]
    assert seen == [False, False, False, True]
    assert d.last is not None and d.last.reason == "probe"
    d.decide(["b"])
    assert set(d.evidence) == {"b"}


def test_probes_that_keep_the_batch_plain_back_off_and_a_drafting_price_resets() -> None:
    d = _decision(0.05, probe_every=2)
    keys = ["a", "b"]
    d.observe(keys, torch.full((2, B), 0.5))
    seen = [d.decide(keys) for _ in range(60)]
    probes = [i for i, drafted in enumerate(seen) if drafted]
    # Gaps of plain steps between probes: 2, 4, 8, then capped at MAX_PROBE_BACKOFF x 2.
    gaps = [b - a - 1 for a, b in zip([-1, *probes], probes, strict=False)]
    assert gaps == [2, 4, 8, 2 * MAX_PROBE_BACKOFF, 2 * MAX_PROBE_BACKOFF]
    cheap = _decision(0.0001, probe_every=2)
    cheap.observe(keys, torch.full((2, B), 0.5))
    cheap.probe_gap = 16
    cheap.observe(keys, torch.full((2, B), 0.999))
    assert cheap.decide(keys) is True and cheap.last is not None
    assert cheap.last.reason == "priced" and cheap.probe_gap == 2


def test_outcomes_correct_the_confidences_a_round_is_priced_with() -> None:
    keys = ["a", "b"]
    d = _decision(0.008)
    d.observe(keys, torch.full((2, B), 0.9))
    assert d.rho == 1.0 and d.decide(keys) is True  # 2 + 2 * 2.439 tokens pay the draft pass
    first = d.last
    d.observe_outcome(predicted=4.0, accepted=1.0)
    d.observe_outcome(predicted=4.0, accepted=1.0)
    assert d.rho == pytest.approx(0.25)
    assert d.decide(keys) is False  # the drafts the confidences promise are not accepted
    assert d.last is not None and first is not None and d.last.rho == pytest.approx(0.25)
    assert d.last.draft_tok_s == pytest.approx(
        (2 + 0.25 * 2 * 2.439) / (2 + 2 * 2.439) * first.draft_tok_s
    )
    # Recent rounds weigh more: outcomes now as good as predicted bring rho back up.
    for _ in range(30):
        d.observe_outcome(predicted=4.0, accepted=4.0)
    assert d.rho == pytest.approx(1.0, abs=0.05) and d.decide(keys) is True
    with pytest.raises(ValueError, match="accepted drafts must be finite"):
        d.observe_outcome(predicted=1.0, accepted=float("nan"))


def test_plain_steps_timed_price_the_plain_option() -> None:
    d = _decision(0.001)
    assert d.plain_seconds(4) == pytest.approx(1 / TABLE.lookup(4))
    for _ in range(5):
        d.observe_plain(4, 0.05, 0.04)
    assert d.plain_seconds(4) == pytest.approx(0.05)


def test_malformed_inputs_are_refused_by_name() -> None:
    with pytest.raises(ValueError, match="probe_every"):
        _decision(0.001, probe_every=0)
    with pytest.raises(ValueError, match=r"confidence must be \[2, 3\]"):
        _decision(0.001).observe(["a", "b"], torch.ones(1, B))


# ------------------------------------------------------------------------- lossless

V = 4
NUM = 120_000


def _toy(seed: int = 3) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    pi = torch.softmax(0.3 * torch.randn(V, generator=g), 0)
    t = 0.05 + torch.softmax(1.2 * torch.randn(V, V, generator=g), 1)
    t = t / t.sum(1, keepdim=True)
    q = torch.softmax(1.2 * torch.randn(V, V, generator=g), 1)
    c = torch.rand(B, V, generator=g) * 0.3 + 0.05
    c[:, 0] = 0.97  # confident right after token 0: the decision depends on the drafts
    return pi, t, q, c


def _draft(anchors: torch.Tensor, q: torch.Tensor, c: torch.Tensor, gen: torch.Generator):
    prev = [anchors]
    for _ in range(B):
        prev.append(sample(q[prev[-1]], gen))
    prevs = torch.stack(prev, 1)
    return prevs, c[torch.arange(B), prevs[:, :-1]]


def _run(anticipating: bool, seed: int) -> tuple[torch.Tensor, torch.Tensor, int]:
    """``(counts [V, V, V] of (anchor, y1, y2) of the second round, expected, drafted)``."""
    pi, t, q, c = _toy()
    gen = torch.Generator().manual_seed(seed)
    a0 = sample(pi.expand(NUM, V), gen)
    prevs, conf1 = _draft(a0, q, c, gen)
    first = chain_verify(prevs[:, 1:], q[prevs[:, :-1]], t[prevs], torch.full((NUM,), B), gen)
    a1 = first.tokens.gather(1, (first.num_emitted - 1).unsqueeze(1)).squeeze(1)
    prevs2, conf2 = _draft(a1, q, c, gen)
    model = with_fixed_step_cost(TABLE, 0.003)
    policy = PrefixScheduler(model)
    drafts = torch.zeros(NUM, dtype=torch.bool)
    lens = torch.zeros(NUM, dtype=torch.int64)
    sizes = torch.randint(1, 5, (NUM,), generator=gen).tolist()
    start = 0
    while start < NUM:
        end = min(NUM, start + sizes[start])
        keys = list(range(start, end))
        d = DraftDecision(B, 1000, round_model=lambda: model, plain_table=TABLE)
        # The gate decides before the draft pass from earlier rounds only; the control
        # sees this round's confidences, as a gate that drafted first would.
        d.observe(keys, (conf2 if anticipating else conf1)[start:end])
        if d.decide(keys):
            drafts[start:end] = True
            lens[start:end] = policy.decide(conf2[start:end])
        start = end
    second = chain_verify(prevs2[:, 1:], q[prevs2[:, :-1]], t[prevs2], lens, gen)
    plain1 = sample(t[a1], gen)
    y1 = torch.where(drafts, second.tokens[:, 0], plain1)
    emitted2 = drafts & (second.num_emitted >= 2)
    y2 = torch.where(emitted2, second.tokens[:, 1], sample(t[y1], gen))
    counts = torch.bincount((a1 * V + y1) * V + y2, minlength=V**3).double().view(V, V, V)
    td = t.double() / t.double().sum(1, keepdim=True)
    expected = counts.sum((1, 2))[:, None, None] * td[:, :, None] * td[None, :, :]
    return counts, expected, int(drafts.sum())


def _pvalue(counts: torch.Tensor, expected: torch.Tensor) -> float:
    assert float(expected.min()) >= 5.0
    # Degrees of freedom: the anchor's marginal is matched exactly (V constraints).
    stat = chisquare(counts.reshape(-1).numpy(), expected.reshape(-1).numpy(), ddof=V - 1)
    return float(stat.pvalue)


def test_the_decision_keeps_the_target_distribution() -> None:
    counts, expected, drafted = _run(anticipating=False, seed=21)
    # Not degenerate: both plain and drafting rounds occur often.
    assert 0.2 * NUM < drafted < 0.8 * NUM, drafted
    p = _pvalue(counts, expected)
    assert p > 1e-3, f"the draft decision changed the output distribution (p={p:.2e})"


def test_an_anticipating_decision_is_rejected() -> None:
    counts, expected, drafted = _run(anticipating=True, seed=21)
    assert 0.2 * NUM < drafted < 0.8 * NUM, drafted
    p = _pvalue(counts, expected)
    assert p < 1e-6, f"the control should be biased (p={p:.2e})"
