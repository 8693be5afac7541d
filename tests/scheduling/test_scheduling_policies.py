"""Scheduling policies against slow pure-Python references (exact equality)."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from dspark_sglang.scheduling.cost_table import CostModel, SpsAdditiveCostTable, SpsCostTable
from dspark_sglang.scheduling.policies import (
    POLICY_NAMES,
    AnticipatingGlobalSearch,
    LaggedBudgetScheduler,
    NoSpeculation,
    PrefixScheduler,
    SchedulingPolicy,
    StaticK,
    VerifyAll,
    build_policy,
    survival,
)

# --------------------------------------------------------------------------- references


def sps_list(cost: CostModel, n: int, most: int) -> list[float]:
    """``SPS(n + j)`` for ``j = 0..most`` as Python floats (one table query per case;
    the lookup itself is cost_table's business and tested there)."""
    return [float(x) for x in cost.steps_per_sec(n, n + torch.arange(most + 1))]


def ref_survival(conf: list[list[float]]) -> list[list[float]]:
    """Running products in double, rounded to float32 as the policies document."""
    out = []
    for row in conf:
        acc, vals = 1.0, []
        for c in row:
            acc *= c
            vals.append(float(np.float32(acc)))
        out.append(vals)
    return out


def ref_order(surv: list[list[float]]) -> list[tuple[float, int, int]]:
    """Candidates (A, k, i) by A desc, then position k, then request i."""
    cands = [(a, k, i) for i, row in enumerate(surv) for k, a in enumerate(row)]
    return sorted(cands, key=lambda t: (-t[0], t[1], t[2]))


def ref_prefix(conf: list[list[float]], cost: CostModel, cap: int | None) -> list[int]:
    """DSPARK Algorithm 1, literally: admit while theta improves, stop at once otherwise."""
    n = len(conf)
    surv = ref_survival(conf)
    order = ref_order(surv)
    if cap is not None:
        order = order[: max(0, cap - n)]
    sps = sps_list(cost, n, len(order))
    lens = [0] * n
    b, tau = n, float(n)
    best = tau * sps[b - n]
    for a, _k, i in order:
        theta = (tau + a) * sps[b + 1 - n]
        if not theta > best:
            break
        b, tau, best = b + 1, tau + a, theta
        lens[i] += 1
    return lens


def ref_budget(surv: list[list[float]], cost: CostModel, cap: int | None) -> int:
    """Brute force: argmax over j of (N + sum of the top-j survivals) * SPS(N + j)."""
    n = len(surv)
    values = sorted((a for row in surv for a in row), reverse=True)
    most = len(values) if cap is None else min(len(values), max(0, cap - n))
    sps = sps_list(cost, n, most)
    best_j, best, tau = 0, float(n) * sps[0], float(n)
    for j in range(1, most + 1):
        tau += values[j - 1]
        theta = tau * sps[j]
        if theta > best:  # strict: the first maximum wins ties
            best_j, best = j, theta
    return best_j


def ref_top(surv: list[list[float]], drafts: int) -> list[int]:
    lens = [0] * len(surv)
    for _a, _k, i in ref_order(surv)[:drafts]:
        lens[i] += 1
    return lens


# --------------------------------------------------------------------------- random inputs


def random_staircase(rng: random.Random) -> SpsCostTable:
    probes = sorted(rng.sample(range(1, 120), rng.randint(1, 8)))
    rates = [rng.choice([100.0, 97.5, 90.0, 80.0, 55.5, 40.0, 33.3]) for _ in probes]
    if rng.random() < 0.7:  # mostly monotone staircases, sometimes noisy ones
        rates.sort(reverse=True)
    return SpsCostTable(
        sample_batch_tokens=tuple(probes),
        sample_steps_per_sec=tuple(rates),
        max_batch_tokens=probes[-1] + rng.randint(0, 200),
    )


def random_additive(rng: random.Random) -> SpsAdditiveCostTable:
    return SpsAdditiveCostTable(
        bias_seconds=rng.uniform(0.005, 0.02),
        bs_probes=(1, 16, 64),
        alpha_seconds=(0.0, rng.uniform(0, 0.003), rng.uniform(0.003, 0.01)),
        m_probes=(1, 32, 128, 512),
        theta_seconds=(0.0, 0.001, rng.uniform(0.002, 0.01), rng.uniform(0.01, 0.05)),
    )


def random_conf(rng: random.Random, n: int, b: int) -> list[list[float]]:
    """Continuous values, or a small discrete set so exact ties (and 0s/1s) are common."""
    if rng.random() < 0.5:
        pool = [0.0, 0.25, 0.5, 0.9, 1.0]
        return [[rng.choice(pool) for _ in range(b)] for _ in range(n)]
    return [[float(np.float32(rng.random())) for _ in range(b)] for _ in range(n)]


def as_tensor(conf: list[list[float]], b: int) -> torch.Tensor:
    return torch.tensor(conf, dtype=torch.float32).reshape(len(conf), b)


# --------------------------------------------------------------------------- Algorithm 1


def test_prefix_scheduler_equals_reference_on_600_random_cases() -> None:
    rng = random.Random(12345)
    nonzero = 0
    for case in range(600):
        cost = random_staircase(rng) if case % 3 else random_additive(rng)
        n, b = rng.randint(1, 40), rng.randint(1, 8)
        cap = rng.choice([None, None, rng.randint(1, 3 * n * b)])
        conf = random_conf(rng, n, b)
        got = PrefixScheduler(cost, max_verify_tokens=cap).decide(as_tensor(conf, b))
        table_cap = getattr(cost, "max_batch_tokens", None)
        effective_cap = (
            min(c for c in (cap, table_cap) if c is not None) if cap or table_cap else None
        )
        want = ref_prefix(conf, cost, effective_cap)
        assert got.dtype == torch.int64
        assert got.tolist() == want, f"case {case}: n={n} b={b} cap={cap}"
        nonzero += int(any(want))
    # The cases exercise real decisions, not only the trivial "verify nothing".
    assert 150 < nonzero < 600


def test_prefix_scheduler_early_stop_on_a_hand_example() -> None:
    """theta: 1.0 (b=1), 0.9 (b=2) -> stop at once, although b=3 would score 1.134."""
    cost = SpsCostTable(
        sample_batch_tokens=(1, 2, 3), sample_steps_per_sec=(1.0, 0.5, 0.45), max_batch_tokens=3
    )
    conf = torch.tensor([[0.8, 0.9]])
    assert PrefixScheduler(cost).decide(conf).tolist() == [0]
    assert AnticipatingGlobalSearch(cost).decide(conf).tolist() == [2]
    # A flatter table admits both drafts.
    flat = SpsCostTable(sample_batch_tokens=(1,), sample_steps_per_sec=(1.0,), max_batch_tokens=9)
    assert PrefixScheduler(flat).decide(conf).tolist() == [2]


@pytest.mark.parametrize("cap", [1, 5, 12, 40])
def test_budgets_respect_max_verify_tokens(cap: int) -> None:
    flat = SpsCostTable(
        sample_batch_tokens=(1,), sample_steps_per_sec=(1.0,), max_batch_tokens=10**6
    )
    gen = torch.Generator().manual_seed(cap)
    conf = torch.rand(8, 5, generator=gen) * 0.5 + 0.5
    policies: list[SchedulingPolicy] = [
        PrefixScheduler(flat, max_verify_tokens=cap),
        LaggedBudgetScheduler(flat, lag=1, max_verify_tokens=cap),
    ]
    for policy in policies:
        for step in range(3):  # the lagged one: fallback step, then stale budgets
            lens = policy.decide(conf)
            assert 8 + int(lens.sum()) <= max(cap, 8)
            if step or isinstance(policy, PrefixScheduler):
                # A flat table wants every draft, so the cap (or N*B) is binding.
                assert 8 + int(lens.sum()) == min(max(cap, 8), 8 + 40)


def test_cost_table_max_batch_tokens_is_the_default_cap() -> None:
    table = SpsCostTable(sample_batch_tokens=(1,), sample_steps_per_sec=(1.0,), max_batch_tokens=20)
    conf = torch.full((8, 5), 0.9)
    assert int(PrefixScheduler(table).decide(conf).sum()) == 12
    # An explicit cap can only tighten the engine's limit.
    assert int(PrefixScheduler(table, max_verify_tokens=15).decide(conf).sum()) == 7
    assert int(PrefixScheduler(table, max_verify_tokens=30).decide(conf).sum()) == 12


def test_non_anticipation_later_confidences_never_change_earlier_admissions() -> None:
    """Changing c_{i,j} for j > k must not change whether draft k of request i is verified.

    This is the structural form of "the decision on token k does not look at token k":
    c_{i,k+1} is computed from draft k. The biased global search fails it.
    """
    rng = random.Random(7)
    table = random_staircase(rng)
    violations = {"prefix": 0, "lagged": 0, "global": 0}
    for _ in range(300):
        table = random_staircase(rng) if rng.random() < 0.3 else table
        n, b = rng.randint(1, 12), rng.randint(2, 6)
        conf = as_tensor(random_conf(rng, n, b), b)
        i, k = rng.randrange(n), rng.randrange(b - 1)
        other = conf.clone()
        other[i, k + 1 :] = torch.rand(
            b - k - 1, generator=torch.Generator().manual_seed(rng.randrange(10**6))
        )
        history = as_tensor(random_conf(rng, n, b), b)
        for key, make in (
            ("prefix", lambda t=table: PrefixScheduler(t)),
            ("lagged", lambda t=table: LaggedBudgetScheduler(t, lag=1)),
            ("global", lambda t=table: AnticipatingGlobalSearch(t)),
        ):
            a, c = make(), make()
            if key == "lagged":
                a.decide(history)
                c.decide(history)
            la, lc = a.decide(conf)[i].item(), c.decide(other)[i].item()
            violations[key] += int(min(la, k + 1) != min(lc, k + 1))
    assert violations["prefix"] == 0
    assert violations["lagged"] == 0
    assert violations["global"] > 0  # the property has teeth


# --------------------------------------------------------------------------- lagged variant


def test_lagged_budget_equals_brute_force_argmax_over_stale_survival() -> None:
    rng = random.Random(99)
    checked = 0
    for case in range(40):
        cost = random_staircase(rng) if case % 2 else random_additive(rng)
        b, lag = rng.randint(1, 7), rng.randint(1, 3)
        policy = LaggedBudgetScheduler(cost, lag=lag)
        cap = getattr(cost, "max_batch_tokens", None)
        n = rng.randint(1, 30)
        confs: list[list[list[float]]] = []
        for step in range(6):
            conf = random_conf(rng, n, b)
            confs.append(conf)
            lens = policy.decide(as_tensor(conf, b))
            surv_now = ref_survival(conf)
            most = n * b if cap is None else min(n * b, max(0, cap - n))
            if step < lag:
                drafts = min(n, most)  # documented fallback: one draft per request
            else:
                drafts = min(ref_budget(ref_survival(confs[step - lag]), cost, cap), most)
                checked += 1
            assert lens.tolist() == ref_top(surv_now, drafts), f"case {case} step {step}"
            assert policy.last_budget == n + drafts
    assert checked > 100


def test_lagged_budget_keeps_the_mean_per_request_when_the_batch_changes() -> None:
    flat = SpsCostTable(
        sample_batch_tokens=(1,), sample_steps_per_sec=(1.0,), max_batch_tokens=10**6
    )
    policy = LaggedBudgetScheduler(flat, lag=1)
    # Stale step: 4 requests, flat SPS -> every draft of 3 positions: j* = 12 (3 / request).
    policy.decide(torch.full((4, 3), 0.5))
    lens = policy.decide(torch.full((6, 3), 0.5))  # 6 requests now: round(12 * 6 / 4) = 18
    assert int(lens.sum()) == 18
    lens = policy.decide(torch.full((3, 3), 0.5))  # stale j* = 18 for 6 -> 9 for 3
    assert int(lens.sum()) == 9
    policy.reset()
    assert int(policy.decide(torch.full((5, 3), 0.5)).sum()) == 5  # fallback again
    assert LaggedBudgetScheduler(flat, lag=1).stale_budget(survival(torch.full((4, 3), 0.5))) == 12


def test_lagged_survives_empty_batches() -> None:
    flat = SpsCostTable(
        sample_batch_tokens=(1,), sample_steps_per_sec=(1.0,), max_batch_tokens=10**6
    )
    policy = LaggedBudgetScheduler(flat, lag=1)
    assert policy.decide(torch.zeros(0, 4)).shape == (0,)
    assert int(policy.decide(torch.full((3, 4), 0.5)).sum()) == 3  # stale batch empty: fallback


# --------------------------------------------------------------------------- simple policies


def test_static_verify_all_and_none() -> None:
    conf = torch.rand(5, 4, generator=torch.Generator().manual_seed(0))
    assert StaticK(2).decide(conf).tolist() == [2] * 5
    assert StaticK(9).decide(conf).tolist() == [4] * 5
    assert VerifyAll().decide(conf).tolist() == [4] * 5
    assert NoSpeculation().decide(conf).tolist() == [0] * 5
    assert StaticK(1).name == "mtp1"


def test_build_policy_names_and_errors() -> None:
    table = SpsCostTable(sample_batch_tokens=(1,), sample_steps_per_sec=(1.0,), max_batch_tokens=64)
    built = {
        name: build_policy(name, table, **({"k": 3} if name == "static" else {}))
        for name in POLICY_NAMES
    }
    assert isinstance(built["prefix"], PrefixScheduler)
    assert isinstance(built["lagged"], LaggedBudgetScheduler) and built["lagged"].lag == 2
    assert isinstance(built["static"], StaticK) and built["static"].k == 3
    assert isinstance(built["mtp1"], StaticK) and built["mtp1"].k == 1
    assert isinstance(built["verify_all"], VerifyAll)
    assert isinstance(built["none"], NoSpeculation)
    assert build_policy("lagged", table, lag=3).name == "lagged(lag=3)"
    with pytest.raises(ValueError, match="unknown scheduling policy 'greedy'"):
        build_policy("greedy", table)
    with pytest.raises(TypeError, match="needs a cost model"):
        build_policy("prefix", None)
    with pytest.raises(ValueError, match="needs k="):
        build_policy("static", None)
    with pytest.raises(ValueError, match="lag must be an int >= 1"):
        build_policy("lagged", table, lag=0)


def test_confidence_validation_names_the_problem() -> None:
    policy = PrefixScheduler(
        SpsCostTable(sample_batch_tokens=(1,), sample_steps_per_sec=(1.0,), max_batch_tokens=9)
    )
    with pytest.raises(ValueError, match=r"must be \[N, B\]"):
        policy.decide(torch.rand(4))
    with pytest.raises(ValueError, match=r"probabilities in \[0, 1\]"):
        policy.decide(torch.tensor([[0.5, 1.5]]))
    with pytest.raises(ValueError, match="nan"):
        policy.decide(torch.tensor([[0.5, float("nan")]]))
    with pytest.raises(ValueError, match="max_verify_tokens must be >= 1"):
        PrefixScheduler(
            SpsCostTable(sample_batch_tokens=(1,), sample_steps_per_sec=(1.0,), max_batch_tokens=9),
            0,
        )


def test_survival_is_the_cumulative_product() -> None:
    conf = torch.tensor([[0.5, 0.5, 1.0], [1.0, 0.0, 0.7], [-0.0, 1.0, 1.0]])
    surv = survival(conf)
    assert surv.tolist() == [[0.5, 0.25, 0.25], [1.0, 0.0, 0.0], [0.0, 0.0, 0.0]]
    assert (surv.view(torch.int32) >= 0).all()  # -0.0 normalised for the sort key
