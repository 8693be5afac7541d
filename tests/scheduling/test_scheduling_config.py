"""SchedulerConfig: YAML/JSON round trips and validation messages."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from dspark_sglang.scheduling.config import (
    DEFAULT_COPY_CONFIDENCE,
    POLICIES,
    ConfigError,
    SchedulerConfig,
    check_ngram,
)

FULL = {
    "block_size": 7,
    "policy": "lagged",
    "sla_name": "interactive-80tps",
    "lag_steps": 3,
    "max_verify_tokens": 512,
    "cost_table_path": "/etc/dspark/sps.json",
    "sts_path": "/etc/dspark/sts.json",
    "greedy_only": True,
    "draft_step_seconds": 0.0125,
}


def test_defaults() -> None:
    c = SchedulerConfig(block_size=5, cost_table_path="t.json")
    assert (c.policy, c.sla_name, c.lag_steps, c.greedy_only) == ("lagged", "default", 2, False)
    assert c.static_k is None and c.max_verify_tokens is None and c.sts_path is None


@pytest.mark.parametrize("suffix", [".yaml", ".json"])
def test_round_trip_through_file(tmp_path: Path, suffix: str) -> None:
    c = SchedulerConfig.from_dict(FULL)
    path = tmp_path / f"sched{suffix}"
    c.save(path)
    assert SchedulerConfig.load(path) == c
    assert SchedulerConfig.from_dict(yaml.safe_load(c.to_yaml())) == c


def test_yaml_written_by_hand(tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    path.write_text("block_size: 4\npolicy: static\nstatic_k: 2\n")
    c = SchedulerConfig.load(path)
    assert c.static_k == 2 and c.max_verify_len == 2
    # Unset optional fields are left out of the rendered YAML.
    assert "cost_table_path" not in c.to_yaml() and "static_k: 2" in c.to_yaml()


def test_max_verify_len_per_policy() -> None:
    kw = {"block_size": 6, "cost_table_path": "t.json"}
    assert SchedulerConfig(policy="prefix", **kw).max_verify_len == 6
    assert SchedulerConfig(policy="verify_all", block_size=6).max_verify_len == 6
    assert SchedulerConfig(policy="mtp1", block_size=6).max_verify_len == 1
    assert SchedulerConfig(policy="none", block_size=6).max_verify_len == 0
    assert SchedulerConfig(policy="static", block_size=6, static_k=3).max_verify_len == 3


def _cfg(**over: object) -> dict[str, object]:
    base: dict[str, object] = {"block_size": 5, "policy": "verify_all"}
    base.update(over)
    return base


@pytest.mark.parametrize(
    ("data", "msg"),
    [
        (_cfg(polcy="static"), "unknown key(s) ['polcy']; allowed keys: ['block_size',"),
        (_cfg(policy="greedy"), f"policy must be one of {list(POLICIES)}, got 'greedy'"),
        (_cfg(block_size=0), "block_size must be an integer in 1..16, got 0"),
        (_cfg(block_size=17), "block_size must be an integer in 1..16, got 17"),
        (_cfg(block_size="5"), "Expected `int`, got `str` - at `$.block_size`"),
        (_cfg(block_size=True), "Expected `int`, got `bool` - at `$.block_size`"),
        ({"policy": "none"}, "missing required field `block_size`"),
        (_cfg(policy="static"), "policy 'static' needs static_k"),
        (_cfg(policy="static", static_k=6), "static_k must be <= block_size (6 > 5)"),
        (_cfg(policy="static", static_k=0), "static_k must be an integer >= 1, got 0"),
        (_cfg(static_k=2), "static_k is only used by policy 'static'"),
        (_cfg(lag_steps=0), "lag_steps must be an integer >= 1, got 0"),
        (_cfg(max_verify_tokens=0), "max_verify_tokens must be an integer >= 1"),
        (_cfg(max_running_requests=8), "unknown key(s) ['max_running_requests']"),
        (_cfg(policy="prefix", startup_profile=False), "policy 'prefix' needs cost_table_path"),
        (_cfg(policy="lagged", startup_profile=False), "policy 'lagged' needs cost_table_path"),
        (_cfg(startup_profile="yes"), "Expected `bool | null`, got `str`"),
        (
            _cfg(startup_profile=True, cost_table_path="t.json"),
            "startup_profile: true measures a cost table at engine start, but "
            "cost_table_path='t.json' names one: remove one of the two",
        ),
        (_cfg(cost_table_path=""), "cost_table_path must be a non-empty path string"),
        (_cfg(sts_path=3), "Expected `str | null`, got `int` - at `$.sts_path`"),
        (_cfg(min_tokens_per_sec_per_user=80), "unknown key(s) ['min_tokens_per_sec_per_user']"),
        (_cfg(sla_name="Gold_SLA"), "sla_name must be an RFC 1123 label"),
        (_cfg(sla_name="x" * 64), "sla_name must be an RFC 1123 label"),
        (_cfg(greedy_only="yes"), "Expected `bool`, got `str` - at `$.greedy_only`"),
        (
            _cfg(draft_step_seconds=0.01),
            "draft_step_seconds is only used by policies ['prefix', 'lagged'], which rank "
            "drafts against a cost table (policy is 'verify_all'); remove draft_step_seconds",
        ),
        (
            _cfg(policy="prefix", cost_table_path="t.json", draft_step_seconds=-0.01),
            "draft_step_seconds must be finite and >= 0 (seconds per speculative step",
        ),
        (
            _cfg(policy="lagged", cost_table_path="t.json", draft_step_seconds=float("inf")),
            "draft_step_seconds must be finite and >= 0",
        ),
        (
            _cfg(policy="lagged", cost_table_path="t.json", draft_step_seconds="12ms"),
            "Expected `float | null`, got `str` - at `$.draft_step_seconds`",
        ),
        ([1, 2], "top level must be a mapping"),
    ],
)
def test_invalid_configs_name_the_field(data: object, msg: str) -> None:
    with pytest.raises(ConfigError) as info:
        SchedulerConfig.from_dict(data)  # type: ignore[arg-type]
    assert msg in str(info.value)


@pytest.mark.parametrize("policy", POLICIES)
def test_sglang_settings_derive_from_the_policy(policy: str) -> None:
    kw: dict[str, object] = {"block_size": 7, "policy": policy, "cost_table_path": "t.json"}
    if policy == "static":
        kw["static_k"] = 3
    c = SchedulerConfig.from_dict(kw)
    assert c.num_draft_tokens == 8
    # Every policy that picks per-request lengths verifies only them unless told otherwise.
    assert c.ragged_mode is None
    assert c.ragged_verify_mode == ("static" if policy == "verify_all" else "compact")


@pytest.mark.parametrize("mode", ["cap-accept", "compact"])
def test_ragged_mode_picks_the_verify_layout_of_per_request_policies(mode: str) -> None:
    c = SchedulerConfig.from_dict({"block_size": 7, "policy": "mtp1", "ragged_mode": mode})
    assert c.ragged_verify_mode == mode
    assert SchedulerConfig.from_dict(c.to_dict()) == c


@pytest.mark.parametrize(
    ("data", "msg"),
    [
        ({"policy": "verify_all", "ragged_mode": "compact"}, "verify_all verifies the whole block"),
        ({"policy": "mtp1", "ragged_mode": "static"}, "ragged_mode must be 'cap-accept'"),
        ({"policy": "mtp1", "ragged_mode": "ragged"}, "ragged_mode"),
    ],
)
def test_bad_ragged_modes_are_refused(data: dict[str, object], msg: str) -> None:
    with pytest.raises(ConfigError, match=msg):
        SchedulerConfig.from_dict({"block_size": 7, **data})


@pytest.mark.parametrize("greedy_only", [False, True])
@pytest.mark.parametrize("policy", POLICIES)
def test_argmax_draft_exactly_on_greedy_only_tiers(policy: str, greedy_only: bool) -> None:
    kw: dict[str, object] = {"block_size": 7, "policy": policy, "cost_table_path": "t.json"}
    if policy == "static":
        kw["static_k"] = 3
    c = SchedulerConfig.from_dict({**kw, "greedy_only": greedy_only})
    assert c.greedy_draft is greedy_only
    # Derived, not a key of its own: a config file cannot set it apart from greedy_only.
    assert "greedy_draft" not in c.to_dict()
    with pytest.raises(ConfigError, match="unknown key"):
        SchedulerConfig.from_dict({**kw, "greedy_draft": True})


def test_draft_step_seconds_in_yaml(tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    path.write_text("block_size: 4\npolicy: prefix\ncost_table_path: t.json\n")
    assert SchedulerConfig.load(path).draft_step_seconds is None  # measured by the worker
    path.write_text(path.read_text() + "draft_step_seconds: 0\n")
    c = SchedulerConfig.load(path)
    assert c.draft_step_seconds == 0.0 and isinstance(c.draft_step_seconds, float)
    path.write_text(path.read_text().replace(": 0\n", ": .nan\n"))
    with pytest.raises(ConfigError, match="draft_step_seconds must be finite and >= 0"):
        SchedulerConfig.load(path)


def test_direct_construction_is_validated_too() -> None:
    with pytest.raises(ConfigError, match=r"static_k must be <= block_size \(4 > 2\)"):
        SchedulerConfig(block_size=2, policy="static", static_k=4)
    with pytest.raises(ConfigError, match="policy must be one of"):
        SchedulerConfig(block_size=2, policy="fast")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="greedy_only must be true or false"):
        SchedulerConfig(block_size=2, policy="none", greedy_only=1)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="draft_step_seconds must be a number of seconds"):
        SchedulerConfig(block_size=2, policy="prefix", draft_step_seconds=True)
    assert (
        SchedulerConfig(block_size=2, policy="prefix", draft_step_seconds=1).draft_step_seconds
        == 1.0
    )


def test_load_errors_name_the_file(tmp_path: Path) -> None:
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    with pytest.raises(ConfigError, match="file is empty"):
        SchedulerConfig.load(empty)
    bad = tmp_path / "bad.yaml"
    bad.write_text("block_size: [1\n")
    with pytest.raises(ConfigError, match=r"bad\.yaml: cannot parse"):
        SchedulerConfig.load(bad)
    typo = tmp_path / "typo.yaml"
    typo.write_text("block_size: 4\npolicy: none\nlag_step: 2\n")
    with pytest.raises(ConfigError, match=r"typo\.yaml: unknown key\(s\) \['lag_step'\]"):
        SchedulerConfig.load(typo)
    with pytest.raises(ConfigError, match="cannot read"):
        SchedulerConfig.load(tmp_path / "missing.yaml")


@pytest.mark.parametrize(
    ("kw", "profiles"),
    [
        ({"policy": "prefix"}, True),
        ({"policy": "lagged"}, True),
        ({"policy": "lagged", "cost_table_path": "t.json"}, False),
        ({"policy": "lagged", "cost_table_path": "t.json", "startup_profile": False}, False),
        ({"policy": "mtp1"}, False),
        ({"policy": "mtp1", "startup_profile": True}, True),
        ({"policy": "mtp1", "startup_profile": False}, False),
    ],
)
def test_startup_profile_runs_without_a_table(kw: dict[str, object], profiles: bool) -> None:
    assert SchedulerConfig(block_size=4, **kw).profiles_at_startup is profiles  # type: ignore[arg-type]


def test_startup_profile_flag_is_checked_on_direct_construction() -> None:
    with pytest.raises(ConfigError, match="startup_profile must be true, false or omitted, got 1"):
        SchedulerConfig(block_size=4, policy="mtp1", startup_profile=1)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="choose policy static/mtp1/verify_all/none"):
        SchedulerConfig(block_size=4, policy="prefix", startup_profile=False)


def test_context_copy_settings() -> None:
    c = SchedulerConfig(block_size=4, policy="verify_all", context_copy_ngram=2)
    assert c.context_copy_ngram == 2 and c.copy_confidence is None
    assert c.copy_confidence_value == DEFAULT_COPY_CONFIDENCE
    p = SchedulerConfig.from_dict(
        {"block_size": 4, "policy": "prefix", "context_copy_ngram": 3, "copy_confidence": 0.6}
    )
    assert p.copy_confidence_value == 0.6
    assert SchedulerConfig.from_dict(yaml.safe_load(p.to_yaml())) == p
    assert SchedulerConfig(block_size=4, policy="mtp1").context_copy_ngram == 0


@pytest.mark.parametrize(
    ("kw", "msg"),
    [
        ({"context_copy_ngram": -1}, "context_copy_ngram must be an integer >= 0"),
        ({"context_copy_ngram": True}, "context_copy_ngram must be an integer >= 0"),
        ({"context_copy_ngram": 2, "policy": "none"}, "no draft is verified"),
        ({"copy_confidence": 0.5}, "context_copy_ngram is 0 (no copies)"),
        (
            {"context_copy_ngram": 2, "policy": "static", "static_k": 2, "copy_confidence": 0.5},
            "copy_confidence is only read by policies ['prefix', 'lagged']",
        ),
        ({"context_copy_ngram": 2, "copy_confidence": 1.0}, "strictly between 0 and 1"),
        ({"context_copy_ngram": 2, "copy_confidence": True}, "strictly between 0 and 1"),
    ],
)
def test_bad_context_copy_settings_name_the_field(kw: dict[str, object], msg: str) -> None:
    base: dict[str, object] = {"block_size": 4, "policy": "prefix"}
    with pytest.raises(ConfigError, match=re.escape(msg)):
        SchedulerConfig(**{**base, **kw})  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", [-1, 1.5, "2", True, None])
def test_check_ngram_names_the_field(bad: object) -> None:
    with pytest.raises(ValueError, match="context_copy_ngram must be an integer >= 0"):
        check_ngram(bad, "context_copy_ngram")
