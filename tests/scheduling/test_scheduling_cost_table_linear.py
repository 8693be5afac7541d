"""``additive_from_probes``: a cost table for an engine without CUDA graphs.

Checked against direct formulas at every batch size (step time exact at the probes,
linear between, clamped beyond), the SGLang encoding, validation, and the decision
they exist for: at one request on a CPU-like target (an 8-token verify 18 % dearer
than one token, probes at 1, 2, 4 and 8 tokens) Algorithm 1 on the floor staircase
stops before the seventh draft, which alone pays the whole 4 -> 8 step, and on the
linear table verifies it.
"""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from dspark_sglang.scheduling.cost_table import (
    CostTableError,
    SpsAdditiveCostTable,
    additive_from_probes,
    from_probes,
    parse_cost_table,
)
from dspark_sglang.scheduling.policies import PrefixScheduler

#: Step seconds of a CPU-like target at 1, 2, 4 and 8 verify tokens (start-up probes).
CPU_STEPS = {1: 0.0379, 2: 0.0408, 4: 0.0408, 8: 0.0448}


def _probes(steps: dict[int, float]) -> list[tuple[int, float]]:
    return [(b, 1.0 / t) for b, t in steps.items()]


def _step_times(table: SpsAdditiveCostTable, num_reqs: int, tokens: torch.Tensor) -> np.ndarray:
    return table.step_time_tensor(num_reqs, tokens).numpy()


def test_step_time_is_each_probes_and_linear_between() -> None:
    rng = random.Random(0)
    for _ in range(30):
        sizes = sorted(rng.sample(range(1, 3000), rng.randint(1, 9)))
        steps = np.cumsum([rng.uniform(0.0, 0.01) for _ in sizes]) + rng.uniform(1e-4, 0.05)
        probes = list(zip(sizes, (1.0 / steps).tolist(), strict=True))
        rng.shuffle(probes)  # any order
        table = additive_from_probes(probes)
        tokens = torch.arange(1, 3100)
        want = np.interp(tokens.numpy(), sizes, 1.0 / (1.0 / steps))  # clamped at both ends
        got = _step_times(table, 1, tokens)
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=0)
        # The request term is zero until a per-request cost is added.
        np.testing.assert_array_equal(_step_times(table, 37, tokens), got)
        assert parse_cost_table(table.to_json()) == table  # SGLang's additive JSON


def test_decreasing_step_times_and_bad_probes_are_refused() -> None:
    with pytest.raises(CostTableError, match=r"must not decrease.*non_increasing"):
        additive_from_probes([(1, 30.0), (2, 31.0)])
    with pytest.raises(CostTableError, match="no probes"):
        additive_from_probes([])
    with pytest.raises(CostTableError, match="pair"):
        additive_from_probes([(1, 2.0, 3.0)])  # type: ignore[list-item]
    with pytest.raises(CostTableError, match=r"m_probes\[0\] = 0"):
        additive_from_probes([(0, 2.0), (2, 1.0)])
    with pytest.raises(CostTableError, match="duplicate probe 2"):
        additive_from_probes([(2, 2.0), (2, 1.0)])


def test_prefix_verifies_the_seventh_draft_on_the_linear_table_only() -> None:
    # Survival 0.9, 0.8, 0.7, 0.5, 0.4, 0.35, then 0.35 x 0.4 = 0.14: the seventh draft
    # adds 3.0 % to the 4.65 tokens expected before it; its token costs 9.8 % of the
    # step on the staircase (all of 4 -> 8 tokens) and 2.3 % on the linear table.
    confidence = torch.tensor([[0.9, 0.8 / 0.9, 0.7 / 0.8, 0.5 / 0.7, 0.4 / 0.5, 0.35 / 0.4, 0.4]])
    staircase = PrefixScheduler(from_probes(_probes(CPU_STEPS)))
    linear = PrefixScheduler(additive_from_probes(_probes(CPU_STEPS)))
    assert int(staircase.decide(confidence)[0]) == 6
    assert int(linear.decide(confidence)[0]) == 7
