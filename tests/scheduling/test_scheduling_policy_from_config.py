"""``policy_from_config``: the one translation from a scheduler config to a policy.

The plugin, the reference demo, the simulator and the planner all build their
policies through it, so these tests pin what each config field becomes: the policy
class, ``static_k``, ``lag_steps`` and ``max_verify_tokens``, the cost table read from
``cost_table_path`` or handed over as ``cost_model`` (plus ``draft_step_seconds``), and
the names that need a table.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from synthetic_inputs import staircase

from dspark_sglang.scheduling.config import (
    NEEDS_COST_TABLE,
    POLICIES,
    ConfigError,
    SchedulerConfig,
    num_draft_tokens,
)
from dspark_sglang.scheduling.cost_table import SpsAdditiveCostTable, with_fixed_step_cost
from dspark_sglang.scheduling.policies import (
    IN_MEMORY_COST_TABLE,
    POLICY_NAMES,
    LaggedBudgetScheduler,
    NoSpeculation,
    PrefixScheduler,
    StaticK,
    VerifyAll,
    policy_from_config,
)

TABLE = staircase()


def _cfg(policy: str, **kw: object) -> SchedulerConfig:
    if policy in NEEDS_COST_TABLE:
        kw.setdefault("cost_table_path", IN_MEMORY_COST_TABLE)
    if policy == "static":
        kw.setdefault("static_k", 3)
    return SchedulerConfig(block_size=5, policy=policy, **kw)  # type: ignore[arg-type]


def test_every_policy_name_has_one_home() -> None:
    assert POLICY_NAMES == POLICIES
    assert set(NEEDS_COST_TABLE) <= set(POLICIES)


def test_each_policy_and_its_settings() -> None:
    built = {p: policy_from_config(_cfg(p), cost_model=TABLE) for p in POLICIES}
    assert isinstance(built["prefix"], PrefixScheduler)
    assert isinstance(built["lagged"], LaggedBudgetScheduler) and built["lagged"].lag == 2
    assert isinstance(built["static"], StaticK) and built["static"].k == 3
    assert isinstance(built["mtp1"], StaticK) and built["mtp1"].k == 1
    assert isinstance(built["verify_all"], VerifyAll)
    assert isinstance(built["none"], NoSpeculation)
    assert built["prefix"].cost_model is TABLE and built["lagged"].cost_model is TABLE

    lagged = policy_from_config(_cfg("lagged", lag_steps=4, max_verify_tokens=40), cost_model=TABLE)
    assert isinstance(lagged, LaggedBudgetScheduler)
    assert lagged.lag == 4 and lagged.max_verify_tokens == 40
    prefix = policy_from_config(_cfg("prefix", max_verify_tokens=30), cost_model=TABLE)
    assert isinstance(prefix, PrefixScheduler) and prefix.max_verify_tokens == 30


def test_cost_table_comes_from_the_path_or_the_caller(tmp_path: Path) -> None:
    path = tmp_path / "sps.json"
    TABLE.save(path)
    loaded = policy_from_config(_cfg("prefix", cost_table_path=str(path)))
    assert isinstance(loaded, PrefixScheduler) and loaded.cost_model == TABLE
    with pytest.raises(ValueError, match="cost_model="):
        policy_from_config(_cfg("prefix"))  # in memory, but no table handed over


@pytest.mark.parametrize("policy", NEEDS_COST_TABLE)
def test_draft_step_seconds_is_added_to_the_table(policy: str, tmp_path: Path) -> None:
    built = policy_from_config(_cfg(policy, draft_step_seconds=0.02), cost_model=TABLE)
    assert isinstance(built, PrefixScheduler | LaggedBudgetScheduler)
    assert built.cost_model == with_fixed_step_cost(TABLE, 0.02) != TABLE
    # Read from a file too; 0 (and unset) keep the target-only table.
    path = tmp_path / "sps.json"
    TABLE.save(path)
    from_file = policy_from_config(_cfg(policy, cost_table_path=str(path), draft_step_seconds=0.02))
    assert from_file.cost_model == built.cost_model  # type: ignore[attr-defined]
    for cfg in (_cfg(policy, draft_step_seconds=0), _cfg(policy)):
        assert policy_from_config(cfg, cost_model=TABLE).cost_model == TABLE  # type: ignore[attr-defined]
    additive = SpsAdditiveCostTable(
        bias_seconds=0.01, bs_probes=(1,), alpha_seconds=(0.0,), m_probes=(1, 64),
        theta_seconds=(0.0, 0.01),
    )  # fmt: skip
    got = policy_from_config(_cfg(policy, draft_step_seconds=0.005), cost_model=additive)
    assert got.cost_model.bias_seconds == 0.015  # type: ignore[attr-defined]


def test_draft_step_seconds_needs_a_table_it_can_add_to() -> None:
    class Flat:
        def steps_per_sec(self, num_reqs: int, batch_tokens: object) -> object:
            raise AssertionError("not called")

    with pytest.raises(TypeError, match="drop draft_step_seconds or fold the draft time"):
        policy_from_config(_cfg("prefix", draft_step_seconds=0.1), cost_model=Flat())  # type: ignore[arg-type]


def test_the_config_validates_what_every_caller_builds() -> None:
    with pytest.raises(ConfigError, match="static_k must be <= block_size"):
        _cfg("static", static_k=6)
    with pytest.raises(ConfigError, match="choose policy static/mtp1/verify_all/none"):
        SchedulerConfig(block_size=5, policy="lagged", startup_profile=False)
    with pytest.raises(ValueError, match="only the SGLang worker measures one at start-up"):
        policy_from_config(SchedulerConfig(block_size=5, policy="lagged"))


def test_draft_tokens_are_the_block_plus_the_anchor() -> None:
    assert num_draft_tokens(7) == 8 == SchedulerConfig(block_size=7, policy="none").num_draft_tokens
