"""``with_fixed_step_cost``: a fixed time added to every step of a cost table.

Exactness against ``1 / (1 / SPS(b) + seconds)`` at many batch sizes for both table
kinds, the other fields kept, validation, and the decision it exists for: on a table
shaped like a CPU target (a 2-token verify costs 1.6 plain steps, an 8-token one 1.8)
Algorithm 1 verifies nothing when the draft pass is ignored and the whole block when
it is counted.
"""

from __future__ import annotations

import math
import random

import pytest
import torch

from dspark_sglang.scheduling.cost_table import (
    MAX_STEP_SECONDS,
    CostTableError,
    SpsAdditiveCostTable,
    SpsCostTable,
    with_fixed_step_cost,
)
from dspark_sglang.scheduling.policies import PrefixScheduler

BATCH = torch.cat((torch.arange(0, 64), torch.arange(64, 5000, 7)))
SECONDS = (1e-6, 0.0125, 0.4, 37.5)
ULPS_8 = 2.0**-50  # the additive table's documented bound (8 ulps relative)


def _staircases(rng: random.Random) -> list[SpsCostTable]:
    out = [
        SpsCostTable(sample_batch_tokens=(1,), sample_steps_per_sec=(1.0,), max_batch_tokens=1),
        SpsCostTable(
            sample_batch_tokens=(3, 5, 1_000_003),
            sample_steps_per_sec=(100.0, 99.99999999999999, 1e-05),
            max_batch_tokens=1_048_573,
        ),
    ]
    for _ in range(20):
        probes = sorted(rng.sample(range(1, 4000), rng.randint(1, 12)))
        rates = tuple(10 ** rng.uniform(-2, 5) for _ in probes)
        out.append(
            SpsCostTable(
                sample_batch_tokens=tuple(probes),
                sample_steps_per_sec=rates,
                max_batch_tokens=probes[-1] + rng.randint(0, 100),
            )
        )
    return out


def _additives(rng: random.Random) -> list[SpsAdditiveCostTable]:
    out = [SpsAdditiveCostTable(bias_seconds=0.1, bs_probes=(1,), alpha_seconds=(0.0,),
                                m_probes=(1,), theta_seconds=(1e-05,))]  # fmt: skip
    for _ in range(20):
        bs = tuple(sorted(rng.sample(range(1, 200), rng.randint(1, 4))))
        m = tuple(sorted(rng.sample(range(1, 4000), rng.randint(1, 6))))
        out.append(
            SpsAdditiveCostTable(
                bias_seconds=10 ** rng.uniform(-5, 0),
                bs_probes=bs,
                alpha_seconds=tuple(rng.uniform(0.0, 0.01) for _ in bs),
                m_probes=m,
                theta_seconds=tuple(sorted(rng.uniform(0.0, 0.2) for _ in m)),
            )
        )
    return out


@pytest.mark.parametrize("seconds", SECONDS)
def test_staircase_is_exact_at_every_batch_size(seconds: float) -> None:
    for table in _staircases(random.Random(11)):
        new = with_fixed_step_cost(table, seconds)
        assert isinstance(new, SpsCostTable)
        assert new.sample_batch_tokens == table.sample_batch_tokens
        assert new.max_batch_tokens == table.max_batch_tokens
        old_sps = table.steps_per_sec(0, BATCH)
        want = 1.0 / (1.0 / old_sps + seconds)
        assert torch.equal(new.steps_per_sec(0, BATCH), want), table
        # The scalar lookup (SGLang's) too, at the probes and between them.
        for b in (0, 1, *table.sample_batch_tokens, table.max_batch_tokens + 7):
            assert new.lookup(b) == 1.0 / (1.0 / table.lookup(b) + seconds)


@pytest.mark.parametrize("seconds", SECONDS)
def test_additive_is_within_8_ulps_at_every_batch_size(seconds: float) -> None:
    worst = 0.0
    for table in _additives(random.Random(12)):
        new = with_fixed_step_cost(table, seconds)
        assert isinstance(new, SpsAdditiveCostTable)
        assert new.bias_seconds == table.bias_seconds + seconds
        assert (new.bs_probes, new.alpha_seconds) == (table.bs_probes, table.alpha_seconds)
        assert (new.m_probes, new.theta_seconds) == (table.m_probes, table.theta_seconds)
        for n in (0, 7, 500):
            want = 1.0 / (table.step_time_tensor(n, BATCH) + seconds)
            got = new.steps_per_sec(n, BATCH)
            rel = float(((got - want).abs() / want).max())
            worst = max(worst, rel)
            assert rel <= ULPS_8, (table, n, rel)
    assert worst < ULPS_8


def test_zero_returns_an_equal_table() -> None:
    rng = random.Random(13)
    for table in [*_staircases(rng), *_additives(rng)]:
        assert with_fixed_step_cost(table, 0) == table
        assert with_fixed_step_cost(table, 0.0).to_json() == table.to_json()


def test_the_result_is_a_valid_table_of_the_same_format() -> None:
    stair = _staircases(random.Random(14))[3]
    new = with_fixed_step_cost(stair, 0.25)
    assert SpsCostTable.from_json(new.to_json()) == new
    add = _additives(random.Random(15))[2]
    new_add = with_fixed_step_cost(add, 0.25)
    assert SpsAdditiveCostTable.from_json(new_add.to_json()) == new_add


@pytest.mark.parametrize(
    ("seconds", "msg"),
    [
        (-0.1, "seconds = -0.1 must be finite and in [0, 3600]"),
        (math.nan, "seconds = nan must be finite"),
        (math.inf, "seconds = inf must be finite"),
        (MAX_STEP_SECONDS * 2, "seconds = 7200.0 must be finite and in [0, 3600]"),
        ("0.1", "seconds must be a number (seconds per step), got '0.1' (str)"),
        (True, "seconds must be a number (seconds per step), got True (bool)"),
        (None, "seconds must be a number (seconds per step), got None"),
    ],
)
def test_bad_seconds_are_refused_naming_the_argument(seconds: object, msg: str) -> None:
    table = _staircases(random.Random(16))[0]
    with pytest.raises(CostTableError) as info:
        with_fixed_step_cost(table, seconds)  # type: ignore[arg-type]
    assert msg in str(info.value)


def test_only_cost_tables_are_transformed() -> None:
    with pytest.raises(TypeError, match="needs an SpsCostTable or SpsAdditiveCostTable"):
        with_fixed_step_cost(object(), 0.1)  # type: ignore[arg-type]


# A CPU target in units of one plain decode step (1 s): verifying 2 tokens (anchor + 1
# draft) costs 1.6 steps, 8 tokens 1.8 steps. One request, a block of 7 drafts whose
# first is accepted with probability 0.36 and the rest, given the earlier ones, 0.9.
CPU_STEP_TIMES = (1.0, 1.6, 1.63, 1.66, 1.69, 1.72, 1.75, 1.8)
CPU_TABLE = SpsCostTable(
    sample_batch_tokens=tuple(range(1, 9)),
    sample_steps_per_sec=tuple(1.0 / t for t in CPU_STEP_TIMES),
    max_batch_tokens=8,
)
CPU_CONFIDENCE = torch.tensor([[0.36, 0.9, 0.9, 0.9, 0.9, 0.9, 0.9]])


def test_prefix_verifies_the_whole_block_once_the_draft_pass_is_counted() -> None:
    # Target only: theta goes 1/1.0 -> 1.36/1.6, so Algorithm 1 stops before the first draft.
    assert PrefixScheduler(CPU_TABLE).decide(CPU_CONFIDENCE).tolist() == [0]
    # A 0.8-step draft pass: 1/1.8 -> 1.36/2.4 -> ... -> 2.88/2.6, every draft improves.
    with_draft = with_fixed_step_cost(CPU_TABLE, 0.8)
    assert PrefixScheduler(with_draft).decide(CPU_CONFIDENCE).tolist() == [7]
    # The early stop looks one draft ahead: a 0.4-step draft pass is not enough to
    # admit the first draft (1.36/2.0 < 1/1.4), although the whole block (2.88/2.2)
    # would beat verifying nothing.
    assert PrefixScheduler(with_fixed_step_cost(CPU_TABLE, 0.4)).decide(
        CPU_CONFIDENCE
    ).tolist() == [0]
