"""The draft decision in the simulator (``SimConfig.draft_decision``) and in ``plan``'s tiers.

What must hold: the simulator runs the worker's own ``DraftDecision`` on its steps; where a
drafting round never pays (a draft pass far costlier than a step) it leaves nearly every
step plain and serves nearly what plain decoding serves (its probes cost), far more than
drafting every step; where drafting pays (high acceptance, a free draft pass) it drafts
nearly every step and serves what always drafting serves; in between it beats both. A
plain step emits one token per request, verifies no draft and costs a 1-token-per-request
forward. Bad settings are refused by name.
"""

from __future__ import annotations

import numpy as np
import pytest

from dspark_sglang.planning.frontier import PolicySpec
from dspark_sglang.planning.planner import Planner
from dspark_sglang.planning.simulator import SimConfig, simulate
from dspark_sglang.planning.workload import LengthDistribution
from dspark_sglang.scheduling.cost_table import with_fixed_step_cost
from dspark_sglang.scheduling.policies import build_policy

CONCURRENCY = 8
LONG = LengthDistribution((20,), (200,), "long")  # probes are rare against the steps


def _run(table, traces, lengths, decision: str, draft_s: float, policy: str = "lagged"):
    cfg = SimConfig(
        concurrency=CONCURRENCY,
        num_requests=40,
        prefill="none",
        draft_step_seconds=draft_s,
        draft_decision=decision,  # type: ignore[arg-type]
        seed=3,
    )
    priced_with = with_fixed_step_cost(table, draft_s) if draft_s else table
    return simulate(traces, table, build_policy(policy, priced_with), lengths, cfg)


def _plain_steps(table, traces, lengths, multiple: float):
    """(always drafting, priced, plain decoding) with a draft pass of ``multiple`` plain steps."""
    draft_s = multiple / table.lookup(CONCURRENCY)
    return (
        _run(table, traces, lengths, "always", draft_s),
        _run(table, traces, lengths, "priced", draft_s),
        _run(table, traces, lengths, "always", 0.0, policy="none"),
    )


def test_a_draft_pass_that_never_pays_leaves_the_steps_plain(table, high_traces) -> None:
    # Ten plain steps per draft pass: no round of 8 requests x at most 8 tokens pays.
    always, priced, plain = _plain_steps(table, high_traces, LONG, 10.0)
    d = priced.details
    assert d is not None and d.step_drafted is not None
    # Only the first step (no evidence yet) and the backed-off probes draft.
    assert priced.drafted_share < 0.05 and always.drafted_share == 1.0
    assert priced.throughput > 2 * always.throughput
    assert priced.throughput > 0.85 * plain.throughput  # the probes' price
    # A plain step: one token per request, no drafts, and exactly a 1-token forward.
    plain_steps = (~d.step_drafted) & (d.step_decoding > 0)
    assert np.array_equal(d.step_emitted[plain_steps], d.step_decoding[plain_steps])
    assert (d.step_drafts[plain_steps] == 0).all()
    n = d.step_decoding[plain_steps]
    want = np.array([1.0 / table.lookup(int(k)) for k in n])
    assert np.allclose(d.step_time[plain_steps], want, rtol=1e-9)


def test_between_the_two_it_beats_both(table, high_traces) -> None:
    # Three plain steps per draft pass: some rounds pay, some do not.
    always, priced, plain = _plain_steps(table, high_traces, LONG, 3.0)
    assert 0.2 < priced.drafted_share < 0.9
    assert priced.throughput > always.throughput and priced.throughput > plain.throughput


def test_a_draft_that_pays_drafts_nearly_every_step(table, high_traces) -> None:
    always = _run(table, high_traces, LONG, "always", 0.0)
    priced = _run(table, high_traces, LONG, "priced", 0.0)
    assert priced.drafted_share > 0.9
    assert priced.throughput == pytest.approx(always.throughput, rel=0.05)
    assert priced.mean_accept_len > 2.0


def test_priced_needs_a_policy_with_a_cost_table(table, high_traces, short_lengths) -> None:
    with pytest.raises(ValueError, match=r"draft_decision='priced'.*mtp1"):
        _run(table, high_traces, short_lengths, "priced", 0.0, policy="mtp1")


@pytest.mark.parametrize(
    ("field", "value", "match"),
    [("draft_decision", "sometimes", "draft_decision"), ("probe_every", 0, "probe_every")],
)
def test_bad_settings_are_refused_by_name(field: str, value: object, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        SimConfig(concurrency=1, **{field: value})  # type: ignore[arg-type]


def test_plan_writes_the_decision_it_simulated(table, high_traces, short_lengths) -> None:
    planner = Planner(
        high_traces,
        table,
        short_lengths,
        specs=[PolicySpec("lagged"), PolicySpec("mtp1")],
        prefill="none",
        num_requests=lambda c: 30,
        max_concurrency=4,
        draft_decision="priced",
        probe_every=4,
    )
    lagged, mtp1 = PolicySpec("lagged"), PolicySpec("mtp1")
    assert planner.run(lagged, 2).draft_decision == "priced"
    assert planner.run(mtp1, 2).draft_decision == "always"
    tiers = planner.plan([1.0])
    values = tiers[0].scheduler_values()
    if tiers[0].spec.name == "lagged":
        assert values["draftDecision"] == "priced" and values["probeEvery"] == 4
    else:
        assert "draftDecision" not in values and "probeEvery" not in values
