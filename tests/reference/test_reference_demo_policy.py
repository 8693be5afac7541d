"""The reference demo's ``--policy`` flags become the scheduler config the plugin would load.

``demo --engine reference`` and ``generate`` build their policy with
``policy_from_config`` for the loaded drafter's block size, so they accept and refuse
what the SGLang engine's ``--policy`` route does; the cost-table flag is checked
before any model load. No model is loaded here.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from synthetic_inputs import staircase

from dspark_sglang.reference.demo import build_policy, cost_model_for
from dspark_sglang.scheduling.config import ConfigError
from dspark_sglang.scheduling.policies import LaggedBudgetScheduler, StaticK, VerifyAll


def test_default_and_named_policies() -> None:
    assert isinstance(build_policy(None, None, 3, 7), VerifyAll)
    static = build_policy("static", None, 3, 7)
    assert isinstance(static, StaticK) and static.k == 3
    assert build_policy("mtp1", None, 3, 7).name == "mtp1"


def test_a_cost_table_flag_is_read_once_and_fails_fast(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="needs --cost-table"):
        cost_model_for("lagged", None)
    with pytest.raises(ValueError, match="cannot read cost table"):
        cost_model_for("lagged", tmp_path / "missing.json")
    path = tmp_path / "sps.json"
    staircase().save(path)
    cost = cost_model_for("lagged", path)
    policy = build_policy("lagged", path, 3, 7, cost)
    assert isinstance(policy, LaggedBudgetScheduler) and policy.cost_model is cost


def test_the_config_refuses_a_static_k_beyond_the_block() -> None:
    with pytest.raises(ConfigError, match="static_k must be <= block_size"):
        build_policy("static", None, 9, 7)
    with pytest.raises(ConfigError, match="static_k must be an integer >= 1"):
        build_policy("static", None, 0, 7)
