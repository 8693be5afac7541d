"""Finite but absurd cost-table values are refused, naming the field, the value and the bound."""

from __future__ import annotations

import pytest

from dspark_sglang.scheduling.cost_table import (
    MAX_BATCH_TOKENS,
    MAX_STEPS_PER_SEC,
    CostTableError,
    SpsAdditiveCostTable,
    SpsCostTable,
    parse_cost_table,
)


def _stair(**over: object) -> dict[str, object]:
    return {"sample_batch_tokens": [1, 8], "sample_steps_per_sec": [50.0, 40.0],
            "max_batch_tokens": 8, **over}  # fmt: skip


def _add(**over: object) -> dict[str, object]:
    return {"bias_seconds": 0.01, "bs_probes": [1], "alpha_seconds": [0.0], "m_probes": [1, 64],
            "theta_seconds": [0.0, 0.002], **over}  # fmt: skip


@pytest.mark.parametrize(
    ("cls", "fields", "message"),
    [
        (SpsCostTable, _stair(max_batch_tokens=10**30),
         f"max_batch_tokens = {10**30} is above the bound 1048576 (MAX_BATCH_TOKENS"),
        (SpsCostTable, _stair(sample_steps_per_sec=[1e300, 40.0]),
         "sample_steps_per_sec[0] = 1e+300 is above the bound 1e+06 (MAX_STEPS_PER_SEC"),
        (SpsCostTable, _stair(sample_batch_tokens=[1, 2**21], max_batch_tokens=2**21),
         "sample_batch_tokens[1] = 2097152 is above the bound 1048576"),
        (SpsAdditiveCostTable, _add(bias_seconds=1e-300),
         "bias_seconds = 1e-300 is outside [1e-06, 3600] s"),
        (SpsAdditiveCostTable, _add(theta_seconds=[0.0, 1e10]),
         "theta_seconds[1] = 10000000000.0 is above the bound 3600 (MAX_STEP_SECONDS"),
        (SpsAdditiveCostTable, _add(bs_probes=[10**12]),
         "bs_probes[0] = 1000000000000 is above the bound 1048576"),
    ],
)  # fmt: skip
def test_absurd_values_are_refused_with_the_bound(
    cls: type[SpsCostTable] | type[SpsAdditiveCostTable],
    fields: dict[str, object],
    message: str,
) -> None:
    with pytest.raises(CostTableError) as info:
        cls(**fields)  # type: ignore[arg-type]
    assert message in str(info.value)


def test_json_above_the_bound_is_refused_and_the_bound_itself_loads() -> None:
    text = '{"sample_batch_tokens":[1],"sample_steps_per_sec":[1e300],"max_batch_tokens":1}'
    with pytest.raises(CostTableError, match=r"sample_steps_per_sec\[0\] = 1e\+300"):
        parse_cost_table(text)
    edge = SpsCostTable(
        sample_batch_tokens=(1,),
        sample_steps_per_sec=(MAX_STEPS_PER_SEC,),
        max_batch_tokens=MAX_BATCH_TOKENS,
    )
    assert parse_cost_table(edge.to_json()) == edge
