"""Our lagged budget equals SGLang's ``compute_verify_token_budget``.

Where the semantics coincide: both take survival values ``A [N', B]`` of a past
step, sort them descending, and pick the first global argmax over the cost
staircase of ``(N' + sum of the top-j A) * SPS(N' + j)`` (SGLang: ``tau / step_time``
for the additive table). Inputs are chosen so the documented differences
(docs/sglang_integration.md, "Budget: ours vs SGLang's") do not apply: every
survival value is >= SGLang's ``survival_eps`` (1e-6; SGLang drops smaller ones,
we keep them) and the table's ``max_batch_tokens`` is never binding (we cap the
budget with it, SGLang does not). Fixed seed; exact equality of the integer
budget is required on every one of the 1200 random inputs.
"""

from __future__ import annotations

import msgspec
import pytest
import torch

from dspark_sglang.scheduling.cost_table import SpsAdditiveCostTable, SpsCostTable
from dspark_sglang.scheduling.policies import LaggedBudgetScheduler, survival

planner = pytest.importorskip(
    "sglang.srt.speculative.dspark_components.dspark_planner",
    reason="SGLang 0.5.23 is part of the project venv",
)
sgl_sps = pytest.importorskip("sglang.srt.speculative.dspark_components.dspark_sps")

N_CASES = 600  # per table kind: 1200 in all


def _random_staircase(g: torch.Generator, max_tokens: int) -> SpsCostTable:
    """A decreasing staircase (bigger batches take longer) with random probes."""
    n_probes = int(torch.randint(1, 8, (1,), generator=g))
    probes = torch.randperm(max_tokens, generator=g)[:n_probes].add_(1).sort().values
    rates = torch.rand(probes.numel(), generator=g, dtype=torch.float64).mul_(90).add_(10)
    rates = rates.sort(descending=True).values
    return SpsCostTable(
        sample_batch_tokens=tuple(int(p) for p in probes),
        sample_steps_per_sec=tuple(float(r) for r in rates),
        max_batch_tokens=10 * max_tokens,  # never binding (see module docstring)
    )


def _random_additive(g: torch.Generator, max_tokens: int) -> SpsAdditiveCostTable:
    def probes(hi: int) -> tuple[int, ...]:
        k = int(torch.randint(1, 5, (1,), generator=g))
        return tuple(int(p) for p in torch.randperm(hi, generator=g)[:k].add_(1).sort().values)

    bs, m = probes(64), probes(max_tokens)
    rand = torch.rand(len(m), generator=g, dtype=torch.float64).cumsum(0).mul_(1e-3)
    return SpsAdditiveCostTable(
        bias_seconds=float(torch.rand(1, generator=g, dtype=torch.float64)) * 1e-2 + 1e-3,
        bs_probes=bs,
        alpha_seconds=tuple(float(x) for x in torch.rand(len(bs), generator=g).double() * 1e-3),
        m_probes=m,
        theta_seconds=tuple(float(x) for x in rand),
    )


def _sglang_table(ours: SpsCostTable | SpsAdditiveCostTable) -> object:
    """The same table parsed by SGLang's own struct (byte-compatible JSON)."""
    cls = sgl_sps.SpsCostTable if isinstance(ours, SpsCostTable) else sgl_sps.SpsAdditiveCostTable
    return msgspec.json.decode(ours.to_json().encode(), type=cls)


def _random_survival(g: torch.Generator) -> torch.Tensor:
    n = int(torch.randint(1, 33, (1,), generator=g))
    b = int(torch.randint(1, 9, (1,), generator=g))
    # Conditional acceptances in [0.05, 1]: survival stays >= 0.05**8 > 1e-6 (eps).
    conf = torch.rand(n, b, generator=g).mul_(0.95).add_(0.05)
    return survival(conf)


@pytest.mark.parametrize("kind", ["staircase", "additive"])
def test_lagged_budget_matches_sglang_compute_verify_token_budget(kind: str) -> None:
    g = torch.Generator().manual_seed(20260 + (kind == "additive"))
    mismatches: list[tuple[int, int, int]] = []
    nontrivial = 0
    for case in range(N_CASES):
        surv = _random_survival(g)
        n, b = surv.shape
        make = _random_staircase if kind == "staircase" else _random_additive
        ours_table = make(g, n * (b + 1))
        ours = LaggedBudgetScheduler(ours_table, lag=1).stale_budget(surv)
        theirs = planner.compute_verify_token_budget(
            history_survival_probs=surv.clone(),
            sps_table=_sglang_table(ours_table),
            cfg=planner.DSparkScheduleConfig(gamma=b),
        ).budget
        nontrivial += 0 < theirs < n * b
        if ours != theirs:
            mismatches.append((case, ours, theirs))
    assert mismatches == [], f"{len(mismatches)} of {N_CASES} differ (case, ours, SGLang's)"
    # The inputs must exercise interior optima, not only "none" or "all".
    assert nontrivial >= N_CASES // 10, f"only {nontrivial} interior budgets"


def test_sglang_drops_tiny_survival_but_we_keep_it() -> None:
    """A documented difference: SGLang filters survival < 1e-6 before ranking.

    With a flat table every admitted draft only adds expected tokens, so the
    argmax admits everything it considers: SGLang stops at the filtered set,
    we admit all candidates.
    """
    surv = torch.tensor([[0.9, 0.5, 1e-7]], dtype=torch.float32)
    flat = SpsCostTable(sample_batch_tokens=(1,), sample_steps_per_sec=(10.0,), max_batch_tokens=8)
    ours = LaggedBudgetScheduler(flat, lag=1).stale_budget(surv)
    theirs = planner.compute_verify_token_budget(
        history_survival_probs=surv,
        sps_table=_sglang_table(flat),
        cfg=planner.DSparkScheduleConfig(gamma=3),
    ).budget
    assert (ours, theirs) == (3, 2)


def test_we_cap_budget_at_max_batch_tokens_sglang_does_not() -> None:
    """A documented difference: our budget respects the table's ``max_batch_tokens``."""
    surv = torch.ones(4, 4, dtype=torch.float32)
    table = SpsCostTable(
        sample_batch_tokens=(1,), sample_steps_per_sec=(10.0,), max_batch_tokens=10
    )
    ours = LaggedBudgetScheduler(table, lag=1).stale_budget(surv)
    theirs = planner.compute_verify_token_budget(
        history_survival_probs=surv,
        sps_table=_sglang_table(table),
        cfg=planner.DSparkScheduleConfig(gamma=4),
    ).budget
    assert (ours, theirs) == (10 - 4, 16)
