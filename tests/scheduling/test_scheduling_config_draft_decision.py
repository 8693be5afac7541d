"""``SchedulerConfig.draft_decision`` / ``probe_every``: accepted values, and each
malformed value refused with a message naming the field and the fix."""

from __future__ import annotations

import pytest

from dspark_sglang.scheduling.config import DEFAULT_PROBE_EVERY, ConfigError, SchedulerConfig

BASE = {"block_size": 7, "policy": "prefix", "cost_table_path": "/tables/sps.json"}


def test_defaults_and_accepted_values() -> None:
    cfg = SchedulerConfig.from_dict(BASE)
    assert cfg.draft_decision == "always" and cfg.probe_every is None
    priced = SchedulerConfig.from_dict({**BASE, "draft_decision": "priced"})
    assert priced.probe_every_value == DEFAULT_PROBE_EVERY
    lagged = SchedulerConfig.from_dict(
        {**BASE, "policy": "lagged", "draft_decision": "priced", "probe_every": 3}
    )
    assert lagged.probe_every_value == 3
    # Round trip through the file the chart renders.
    assert SchedulerConfig.from_dict(lagged.to_dict()) == lagged


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"draft_decision": "sometimes"}, "draft_decision"),
        ({"draft_decision": "priced", "policy": "mtp1", "cost_table_path": None}, "policies"),
        ({"draft_decision": "priced", "probe_every": 0}, "probe_every must be an integer >= 1"),
        ({"draft_decision": "priced", "probe_every": -2}, "probe_every must be an integer >= 1"),
        ({"draft_decision": "priced", "probe_every": True}, "probe_every"),
        ({"draft_decision": "priced", "probe_every": 2.5}, "probe_every"),
        ({"probe_every": 4}, "probe_every is read only with draft_decision: priced"),
    ],
)
def test_malformed_values_are_refused_by_name(extra: dict, message: str) -> None:
    data = {k: v for k, v in {**BASE, **extra}.items() if v is not None}
    with pytest.raises(ConfigError, match=message):
        SchedulerConfig.from_dict(data)
