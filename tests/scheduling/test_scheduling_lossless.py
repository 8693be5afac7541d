"""Scheduled verification keeps the target's distribution, under every policy.

A toy Markov "language model" over a small vocabulary: the target draws the next
token from ``T[prev]``, the drafter from a different ``Q[prev]`` (sequentially, so
draft k depends on draft k-1, like the Markov head), and the confidence of draft k
is ``C[k, prev]``: it depends on the token actually drafted before it, which is
exactly what makes an anticipating scheduler biased. Every generation starts from
a random anchor; we record its first two output tokens (continuing with plain
target sampling when a round emitted only one) and chi-square test them against
the exact target law ``pi(a) T[a, y1] T[y1, y2]``.

Each policy, in both implementations (the NumPy policies and their device twins of
``scheduling/device_policies.py``), is run on >= 200k independent generations in
batches of random size (1..96 requests, so the cross-request ranking and the early
stop are exercised); the lagged policy's budget comes from earlier batches. Fixed
seeds; a correct implementation passes with p > 0.001, and the Appendix-A test
shows the same machinery rejects a biased scheduler with p < 1e-6.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from scipy.stats import chisquare

from dspark_sglang.sampling import sample
from dspark_sglang.scheduling.cost_table import SpsCostTable
from dspark_sglang.scheduling.device_policies import device_twin
from dspark_sglang.scheduling.policies import (
    AnticipatingGlobalSearch,
    LaggedBudgetScheduler,
    PrefixScheduler,
    SchedulingPolicy,
    StaticK,
    VerifyAll,
)
from dspark_sglang.verify import chain_verify

NUM_GENERATIONS = 200_000
P_ACCEPT = 1e-3


def chi2_pvalue(observed: torch.Tensor, probs: torch.Tensor) -> float:
    """Pearson chi-square p-value of counts against exact probabilities (all cells > 0)."""
    probs = probs.double().reshape(-1)
    obs = observed.double().reshape(-1)
    assert (probs > 0).all()
    expected = probs / probs.sum() * obs.sum()
    assert float(expected.min()) >= 5.0, "too few samples for a chi-square test"
    return float(chisquare(obs.numpy(), expected.numpy()).pvalue)


class ToyMarkovSetup:
    """Target ``T``, draft ``Q``, confidences ``C[k, prev]`` and anchor law ``pi``."""

    def __init__(self, v: int, b: int, seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        self.v, self.b = v, b
        self.pi = torch.softmax(0.5 * torch.randn(v, generator=g), 0)
        # Target rows bounded away from 0 so every test cell has a healthy count.
        self.T = 0.04 + 0.8 * torch.softmax(1.5 * torch.randn(v, v, generator=g), 1)
        self.T = self.T / self.T.sum(1, keepdim=True)
        q = torch.softmax(1.5 * torch.randn(v, v, generator=g), 1)
        q[:, v - 1] = 0.0  # the drafter never proposes the last token: residual must
        self.Q = q / q.sum(1, keepdim=True)
        # c_k depends strongly on the previous (drafted) token: high after token 0.
        self.C = torch.rand(b, v, generator=g) * 0.5 + 0.1
        self.C[:, 0] = 0.95

    def draft(self, n: int, gen: torch.Generator) -> dict[str, torch.Tensor]:
        """Anchors, sequential drafts and everything verification needs."""
        anchors = sample(self.pi.expand(n, self.v), gen)
        prev = [anchors]
        for _ in range(self.b):
            prev.append(sample(self.Q[prev[-1]], gen))
        prevs = torch.stack(prev, 1)  # [n, b + 1]: anchor, d_0, ..., d_{b-1}
        return {
            "anchors": anchors,
            "drafts": prevs[:, 1:],
            "draft_probs": self.Q[prevs[:, :-1]],  # row k: law of d_k given prev_k
            "target_probs": self.T[prevs],  # row k: target after anchor + d_<k
            "confidence": self.C[torch.arange(self.b), prevs[:, :-1]],
        }

    def exact_joint(self) -> tuple[torch.Tensor, torch.Tensor]:
        """P(anchor, y1) [V, V] and P(anchor, y1, y2) [V, V, V] under the target."""
        first = self.pi[:, None].double() * self.T.double()
        return first, first[:, :, None] * self.T.double()[None, :, :]


def run_policy(
    setup: ToyMarkovSetup,
    decide: Callable[[torch.Tensor], torch.Tensor],
    batch_sizes: list[int],
    seed: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Draft all generations, schedule them batch by batch, verify, emit 2 tokens.

    Returns ``(anchors, y1, y2, verify_lens)``. Verification of different requests
    is independent, so one ``chain_verify`` call over all of them is equivalent to
    one call per batch.
    """
    gen = torch.Generator().manual_seed(seed)
    n = sum(batch_sizes)
    d = setup.draft(n, gen)
    lens = torch.empty(n, dtype=torch.int64)
    start = 0
    for size in batch_sizes:
        lens[start : start + size] = decide(d["confidence"][start : start + size])
        start += size
    res = chain_verify(d["drafts"], d["draft_probs"], d["target_probs"], lens, gen)
    y1 = res.tokens[:, 0]
    y2 = torch.where(res.num_emitted >= 2, res.tokens[:, 1], sample(setup.T[y1], gen))
    return d["anchors"], y1, y2, lens


def random_batch_sizes(total: int, low: int, high: int, seed: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    sizes: list[int] = []
    while sum(sizes) < total:
        sizes.append(int(torch.randint(low, high + 1, (1,), generator=g)))
    return sizes


# A tile-like staircase: flat inside 64-token tiles, 10 % slower per tile. With
# 1..96 requests per batch the prefix scheduler's cut falls at varying survival
# levels, so verify lengths 0..3 all occur and depend on the drafted tokens.
_TILES = range(1, 4096, 64)
STAIRCASE = SpsCostTable(
    sample_batch_tokens=tuple(_TILES),
    sample_steps_per_sec=tuple(100.0 * 0.9**t for t in range(len(_TILES))),
    max_batch_tokens=8192,
)

POLICIES: dict[str, Callable[[], SchedulingPolicy]] = {
    "prefix": lambda: PrefixScheduler(STAIRCASE),
    "lagged": lambda: LaggedBudgetScheduler(STAIRCASE, lag=2),
    "static2": lambda: StaticK(2),
    "mtp1": lambda: StaticK(1),
    "verify_all": lambda: VerifyAll(),
}


IMPLEMENTATIONS = ("numpy", "device")


def make(policy: SchedulingPolicy, impl: str) -> SchedulingPolicy:
    """The host policy itself, or its device twin (on CPU here)."""
    return policy if impl == "numpy" else device_twin(policy)


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
@pytest.mark.parametrize("name", list(POLICIES))
def test_scheduled_chain_verification_is_lossless(name: str, impl: str) -> None:
    setup = ToyMarkovSetup(v=5, b=3, seed=11)
    sizes = random_batch_sizes(NUM_GENERATIONS, 1, 96, seed=5)
    policy = make(POLICIES[name](), impl)
    anchors, y1, y2, lens = run_policy(setup, policy.decide, sizes, seed=100 + len(name))
    v = setup.v
    first, joint = setup.exact_joint()
    p_first = chi2_pvalue(torch.bincount(anchors * v + y1, minlength=v * v), first)
    p_joint = chi2_pvalue(torch.bincount((anchors * v + y1) * v + y2, minlength=v**3), joint)
    assert p_first > P_ACCEPT, f"{name}: first token deviates from the target (p={p_first:.2e})"
    assert p_joint > P_ACCEPT, f"{name}: 2-token joint deviates from the target (p={p_joint:.2e})"
    # The scenario is not degenerate: the adaptive policies pick varied lengths.
    if name in ("prefix", "lagged"):
        counts = torch.bincount(lens, minlength=setup.b + 1)
        assert (counts > NUM_GENERATIONS // 100).all(), f"{name}: length counts {counts.tolist()}"


# --------------------------------------------------------------------------- Appendix A

TOKEN_A, TOKEN_B = 0, 1
APPENDIX_A_COST = SpsCostTable(
    sample_batch_tokens=(1, 2, 3), sample_steps_per_sec=(1.0, 0.5, 0.45), max_batch_tokens=3
)


class AppendixASetup(ToyMarkovSetup):
    """One request, B = 2, target (0.7, 0.3), draft (0.5, 0.5), c_1 = 0.8.

    c_2 = 0.9 after x_1 = A and 0.1 after x_1 = B: the global search's theta for
    b = 3 is 0.45 * (1.8 + 0.8 c_2) = 1.134 > 1.0 only after A, so it verifies
    both drafts iff x_1 = A (and none otherwise); the prefix scheduler stops at
    b = 2 (theta 0.9 < 1.0) and verifies none.
    """

    def __init__(self) -> None:
        self.v, self.b = 2, 2
        self.pi = torch.tensor([1.0, 0.0])  # the anchor itself is irrelevant here
        self.T = torch.tensor([[0.7, 0.3], [0.7, 0.3]])
        self.Q = torch.tensor([[0.5, 0.5], [0.5, 0.5]])
        self.C = torch.tensor([[0.8, 0.8], [0.9, 0.1]])  # C[k, prev]


def per_request(policy: SchedulingPolicy) -> Callable[[torch.Tensor], torch.Tensor]:
    """Schedule each request alone (N = 1), as in Appendix A.

    The policies compared here are stateless and deterministic, so the real
    ``decide`` is called once per distinct confidence row and its answer reused.
    """

    def decide(conf: torch.Tensor) -> torch.Tensor:
        rows, inverse = torch.unique(conf, dim=0, return_inverse=True)
        lens = torch.cat([policy.decide(rows[j : j + 1]) for j in range(rows.shape[0])])
        return lens[inverse]

    return decide


def appendix_a(policy: SchedulingPolicy) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    setup = AppendixASetup()
    _, y1, _, lens = run_policy(setup, per_request(policy), [NUM_GENERATIONS], seed=2026)
    gen = torch.Generator().manual_seed(2026)
    drafts = setup.draft(NUM_GENERATIONS, gen)["drafts"]  # same seed: the same drafts
    return y1, lens, drafts


def test_appendix_a_global_search_is_biased_and_detected() -> None:
    y1, lens, drafts = appendix_a(AnticipatingGlobalSearch(APPENDIX_A_COST))
    # The construction does what Appendix A says: verify both iff x_1 = A.
    assert torch.equal(lens, torch.where(drafts[:, 0] == TOKEN_A, 2, 0))
    p_a = float((y1 == TOKEN_A).double().mean())
    assert abs(p_a - 0.85) < 0.01, f"P(A) = {p_a:.4f}, Appendix A predicts 0.85"
    pvalue = chi2_pvalue(torch.bincount(y1, minlength=2), torch.tensor([0.7, 0.3]))
    assert pvalue < 1e-6, f"the chi-square test failed to detect the bias (p={pvalue:.2e})"


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
def test_appendix_a_prefix_scheduler_is_exact(impl: str) -> None:
    y1, lens, _ = appendix_a(make(PrefixScheduler(APPENDIX_A_COST), impl))
    assert (lens == 0).all()  # the early stop at b = 2
    p_a = float((y1 == TOKEN_A).double().mean())
    assert abs(p_a - 0.70) < 0.01
    pvalue = chi2_pvalue(torch.bincount(y1, minlength=2), torch.tensor([0.7, 0.3]))
    assert pvalue > P_ACCEPT, f"prefix scheduler deviates from the target (p={pvalue:.2e})"
