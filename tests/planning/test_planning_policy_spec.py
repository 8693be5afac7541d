"""``PolicySpec``: a simulated policy is the scheduler config a tier would deploy.

A spec becomes a ``SchedulerConfig`` for the traces' block size and then a policy
through ``policy_from_config``, so the simulator, the planner and ``simulate`` run
what the worker would run and refuse what the config refuses.
"""

from __future__ import annotations

import pytest

from dspark_sglang.planning.frontier import PolicySpec, default_policy_specs, sweep
from dspark_sglang.scheduling.config import POLICIES, ConfigError
from dspark_sglang.scheduling.cost_table import with_fixed_step_cost
from dspark_sglang.scheduling.policies import (
    IN_MEMORY_COST_TABLE,
    LaggedBudgetScheduler,
    PrefixScheduler,
    StaticK,
    policy_from_config,
)


def test_every_policy_name_parses() -> None:
    for name in POLICIES:
        text = {"static": "static:2"}.get(name, name)
        assert PolicySpec.parse(text).name == name
    with pytest.raises(ValueError) as err:
        PolicySpec.parse("greedy")
    assert all(name in str(err.value) for name in POLICIES)


def test_spec_config_carries_the_option_and_the_cap() -> None:
    cfg = PolicySpec("lagged", 3).config(7, max_verify_tokens=64)
    assert (cfg.policy, cfg.block_size, cfg.lag_steps) == ("lagged", 7, 3)
    assert cfg.max_verify_tokens == 64 and cfg.cost_table_path == IN_MEMORY_COST_TABLE
    cfg = PolicySpec("static", 2).config(7)
    assert (cfg.static_k, cfg.cost_table_path) == (2, None)
    assert PolicySpec("mtp1").config(7).max_verify_len == 1


def test_build_is_policy_from_config(table) -> None:
    for spec in [*default_policy_specs(4), PolicySpec("lagged", 5), PolicySpec("verify_all")]:
        ours = spec.build(table, 40, block_size=4)
        theirs = policy_from_config(spec.config(4, 40), cost_model=table)
        assert type(ours) is type(theirs) and ours.name == theirs.name
    lagged = PolicySpec("lagged", 5).build(table, 40, block_size=4)
    assert isinstance(lagged, LaggedBudgetScheduler) and lagged.lag == 5
    assert lagged.max_verify_tokens == 40 and lagged.cost_model is table
    prefix = PolicySpec("prefix").build(table, block_size=4)
    assert (
        isinstance(prefix, PrefixScheduler) and prefix.max_verify_tokens == table.max_batch_tokens
    )
    static = PolicySpec("static", 3).build(table, block_size=4)
    assert isinstance(static, StaticK) and static.k == 3


def test_sweep_refuses_a_spec_the_traces_block_cannot_run(table, high_traces, lengths) -> None:
    """static:k beyond the drafter's block is a config error, as it is for a tier."""
    b = high_traces.block_size
    with pytest.raises(ConfigError, match="static_k must be <= block_size"):
        sweep(
            high_traces,
            table,
            lengths,
            [PolicySpec("static", b + 1)],
            [1],
            num_requests=lambda c: 4,
        )


def test_the_draft_pass_reaches_only_the_policies_that_read_a_table(table) -> None:
    """``prefix``/``lagged`` decide with the table plus the draft pass (as a tier with
    ``draftStepSeconds`` does); the others take no table, so the config carries none."""
    for name in ("lagged", "prefix"):
        spec = PolicySpec(name)
        assert spec.config(4, draft_step_seconds=0.004).draft_step_seconds == 0.004
        policy = spec.build(table, block_size=4, draft_step_seconds=0.004)
        assert policy.cost_model == with_fixed_step_cost(table, 0.004)
        assert policy.cost_model != table  # its own table; the clock reads the caller's
        assert spec.build(table, block_size=4).cost_model is table
    for spec in (PolicySpec("mtp1"), PolicySpec("static", 2), PolicySpec("none")):
        assert spec.config(4, draft_step_seconds=0.004).draft_step_seconds is None


def test_the_draft_decision_is_priced_only_for_the_policies_that_read_a_table() -> None:
    """The planner and ``simulate`` take a spec's draft decision from one rule: the
    requested one for ``prefix``/``lagged``, ``always`` for the others (no table)."""
    for spec in (PolicySpec("prefix"), PolicySpec("lagged"), PolicySpec("lagged", 3)):
        assert spec.draft_decision("priced") == "priced"
        assert spec.draft_decision("always") == "always"
    for spec in (PolicySpec("mtp1"), PolicySpec("static", 2), PolicySpec("none")):
        assert spec.draft_decision("priced") == "always"
        assert spec.draft_decision("always") == "always"
