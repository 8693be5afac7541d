"""Serving simulator invariants, and that it drives the real scheduling policies."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

from dspark_sglang.planning.simulator import SimConfig, StepTimer, simulate
from dspark_sglang.planning.traces import AcceptanceTraces, synthetic_traces
from dspark_sglang.planning.workload import LengthDistribution
from dspark_sglang.scheduling.cost_table import SpsCostTable
from dspark_sglang.scheduling.policies import build_policy


def test_no_speculation_closed_loop_is_c_times_sps(table, high_traces, short_lengths) -> None:
    for c in (1, 5, 40):
        cfg = SimConfig(concurrency=c, num_requests=4 * c + 10, prefill="none", warmup_fraction=0.0)
        r = simulate(high_traces, table, build_policy("none"), short_lengths, cfg)
        d = r.details
        assert d is not None
        # One token per request per step, and every step runs exactly C requests.
        assert np.array_equal(d.step_emitted, d.step_decoding)
        assert (d.step_decoding == c).all() and (d.step_drafts == 0).all()
        sps = table.lookup(c)
        assert r.throughput == pytest.approx(c * sps, rel=1e-9)
        assert r.user_tps_p50 == pytest.approx(sps, rel=1e-9)


def test_verify_all_with_perfect_acceptance_emits_block_plus_one(table) -> None:
    b = 5
    t = synthetic_traces(10, 4, [0.5] * b, seed=0)
    perfect = AcceptanceTraces(
        t.request_id, t.domain_index, t.domains, t.confidence_logits, torch.full_like(t.accepted, b)
    )
    lengths = LengthDistribution((8,), (6 * (b + 1) + 1,))  # 6 full rounds, then 1 token
    cfg = SimConfig(concurrency=3, num_requests=9, prefill="none", drain=True, warmup_fraction=0)
    r = simulate(perfect, table, build_policy("verify_all"), lengths, cfg)
    d = r.details
    assert d is not None
    assert np.array_equal(d.step_round_tokens, d.step_decoding * (b + 1))
    assert np.array_equal(d.step_drafts, d.step_decoding * b)
    assert r.mean_accept_len == b + 1
    # Per request: 6 rounds of B+1 tokens and a last round capped at the 1 token left.
    assert (d.req_emitted == 6 * (b + 1) + 1).all()


@pytest.mark.parametrize(
    ("mode", "prefill"), [("closed", "separate"), ("closed", "mixed"), ("open", "separate")]
)
def test_conservation_every_admitted_request_finishes_exactly(
    table, high_traces, lengths, mode, prefill
) -> None:
    if mode == "closed":
        cfg = SimConfig(concurrency=7, num_requests=30, prefill=prefill, drain=True)
    else:
        cfg = SimConfig(
            mode="open", arrival_rate=40.0, max_running_requests=6, num_requests=30, drain=True
        )
    r = simulate(high_traces, table, build_policy("lagged", table), lengths, cfg)
    d = r.details
    assert d is not None
    assert not np.isnan(d.req_finish).any()
    assert np.array_equal(d.req_emitted, d.req_output_len)
    assert int(d.step_emitted.sum()) == int(d.req_output_len.sum())
    assert (d.step_decoding <= cfg.cap).all()
    assert (d.req_first_token >= d.req_admit).all() and (d.req_admit >= d.req_spawn).all()
    if prefill == "separate":  # prefill-only steps never decode
        assert ((d.step_prefill_tokens == 0) | (d.step_decoding == 0)).all()


def test_decisions_are_the_real_policys(table, high_traces, lengths) -> None:
    """Replaying the recorded confidences through fresh policy objects gives the same lengths."""
    for name in ("lagged", "prefix"):
        cfg = SimConfig(concurrency=12, num_requests=40, record_decisions=True)
        r = simulate(high_traces, table, build_policy(name, table), lengths, cfg)
        d = r.details
        assert d is not None and len(d.decisions) > 20
        fresh = build_policy(name, table)
        lens_seen = set()
        for conf, lens in d.decisions:
            assert torch.equal(fresh.decide(conf), lens)
            lens_seen.update(lens.tolist())
        assert len(lens_seen) > 1  # the policy really varied the verify length
        assert d.step_drafts.sum() == sum(int(lens.sum()) for _, lens in d.decisions)


def test_static_k_acceptance_matches_chain_rule(table) -> None:
    """Static k: each round emits min(accepted_full, k) + 1 of the round it replays."""
    t = synthetic_traces(1, 400, [0.8] * 6, seed=5)  # one long request: rounds replay in order
    lengths = LengthDistribution((4,), (10_000,))
    cfg = SimConfig(concurrency=1, num_requests=1, prefill="none", drain=True, warmup_fraction=0)
    r = simulate(t, table, build_policy("static", k=3), lengths, cfg)
    d = r.details
    assert d is not None
    n = d.step_decoding.size
    idx = torch.arange(n) % t.num_rounds
    expected = torch.minimum(t.accepted[idx], torch.tensor(3)) + 1
    assert np.array_equal(d.step_round_tokens, expected.numpy())


@pytest.mark.parametrize("prefill", ["separate", "mixed"])
def test_first_token_at_the_first_round_moves_ttft_and_user_speed_only(
    table, high_traces, lengths, prefill
) -> None:
    base = SimConfig(concurrency=4, num_requests=40, prefill=prefill, drain=True)
    late_cfg = SimConfig(
        concurrency=4, num_requests=40, prefill=prefill, drain=True, first_token="first_round"
    )
    policy = build_policy("static", k=2)
    early = simulate(high_traces, table, policy, lengths, base)
    late = simulate(high_traces, table, policy, lengths, late_cfg)
    e, lt = early.details, late.details
    assert e is not None and lt is not None
    # The same engine run: every step, token and finish is identical.
    assert np.array_equal(e.step_time, lt.step_time)
    assert np.array_equal(e.req_finish, lt.req_finish)
    assert late.throughput == early.throughput
    # Each request's first token now reaches the client at the end of the first step in
    # which it decoded, i.e. the first step ending after its prefill did.
    ends = e.step_start + e.step_time
    for r in range(40):
        nxt = ends[(ends > e.req_first_token[r]) & (e.step_decoding > 0)]
        assert lt.req_first_token[r] == pytest.approx(nxt.min())
    assert late.ttft_p50 > early.ttft_p50
    assert late.user_tps_p50 > early.user_tps_p50  # same finish, later start


def test_next_step_admission_joins_one_step_late_while_others_run(
    table, high_traces, lengths
) -> None:
    policy = build_policy("static", k=2)

    def run(c: int, admission: str):
        cfg = SimConfig(
            concurrency=c, num_requests=30, prefill="separate", closed_admission=admission
        )
        return simulate(high_traces, table, policy, lengths, cfg)

    # Alone, nobody else is stepping: the replacement is prefilled at once either way.
    a, b = run(1, "at_finish"), run(1, "next_step")
    assert a.details is not None and b.details is not None
    assert np.array_equal(a.details.req_admit, b.details.req_admit)
    assert a.throughput == b.throughput
    # With others running, a replacement sent at a finish waits out the step the others
    # start right then: it joins when that step ends.
    late = run(3, "next_step")
    d = late.details
    assert d is not None
    ends = d.step_start + d.step_time
    joined = 0
    for r in range(3, 30):
        if np.isnan(d.req_admit[r]):
            continue
        assert d.req_admit[r] > d.req_spawn[r]
        step = np.flatnonzero(d.step_start == d.req_spawn[r])
        assert step.size == 1 and d.req_admit[r] == pytest.approx(ends[step[0]])
        joined += 1
    assert joined >= 20
    assert (d.step_decoding <= 3).all()
    assert late.ttft_p50 > run(3, "at_finish").ttft_p50


def test_step_timer_splits_oversized_batches() -> None:
    t = SpsCostTable(
        sample_batch_tokens=(1, 10), sample_steps_per_sec=(10.0, 5.0), max_batch_tokens=10
    )
    timer = StepTimer(t)
    assert timer(1, 5) == pytest.approx(0.1)
    assert timer(1, 25) == pytest.approx(2 * 0.2 + 0.1)


def test_config_errors_name_the_field() -> None:
    with pytest.raises(ValueError, match="concurrency must be an integer >= 1"):
        SimConfig(concurrency=0)
    with pytest.raises(ValueError, match=r"max_running_requests .* open-loop"):
        SimConfig(mode="open", arrival_rate=1.0)
    for bad in (-0.001, float("nan"), float("inf"), True, "0.01"):
        with pytest.raises(ValueError, match=r"SimConfig\.draft_step_seconds must be a finite"):
            SimConfig(concurrency=1, draft_step_seconds=bad)  # type: ignore[arg-type]


def test_draft_pass_by_hand() -> None:
    """One forward takes 0.125 s (a flat table at 8 steps/s) and the draft pass 0.125 s:
    every decode step takes 0.25 s, so throughput and per-user speed halve, exactly."""
    k, c, rounds = 2, 3, 6
    t = synthetic_traces(10, 4, [0.5] * 5, seed=0)
    perfect = AcceptanceTraces(
        t.request_id, t.domain_index, t.domains, t.confidence_logits, torch.full_like(t.accepted, 5)
    )
    flat = SpsCostTable(sample_batch_tokens=(1,), sample_steps_per_sec=(8.0,), max_batch_tokens=64)
    lengths = LengthDistribution((8,), (rounds * (k + 1),))  # every round emits k + 1

    def run(draft: float):
        cfg = SimConfig(
            concurrency=c,
            num_requests=3 * c,
            prefill="none",
            drain=True,
            warmup_fraction=0,
            draft_step_seconds=draft,
        )
        return simulate(perfect, flat, build_policy("static", k=k), lengths, cfg)

    plain, drafted = run(0.0), run(0.125)
    # Three waves of c requests, `rounds` steps each, c * (k + 1) = 9 tokens per step.
    assert plain.steps == drafted.steps == 3 * rounds
    assert plain.throughput == pytest.approx(9 / 0.125, rel=1e-12)
    assert drafted.throughput == pytest.approx(9 / 0.25, rel=1e-12)
    assert drafted.details is not None
    assert np.array_equal(drafted.details.step_time, np.full(3 * rounds, 0.25))
    # Per user: 17 tokens after the first round's, over the 5 steps that follow it.
    assert drafted.user_tps_p50 == pytest.approx(17 / (5 * 0.25), rel=1e-12)
    assert (plain.draft_step_seconds, drafted.draft_step_seconds) == (0.0, 0.125)


@pytest.mark.parametrize("prefill", ["separate", "mixed"])
def test_draft_pass_is_paid_once_per_decode_step_and_never_by_prefill_only_steps(
    table, high_traces, lengths, prefill
) -> None:
    d = 0.0125
    policy = build_policy("static", k=2)  # its decisions do not read the clock
    base = SimConfig(concurrency=4, num_requests=30, prefill=prefill, drain=True)
    plain = simulate(high_traces, table, policy, lengths, base)
    drafted = simulate(high_traces, table, policy, lengths, replace(base, draft_step_seconds=d))
    p, q = plain.details, drafted.details
    assert p is not None and q is not None
    # The same engine run, step for step; only the clock differs.
    for name in ("step_decoding", "step_drafts", "step_prefill_tokens", "step_emitted"):
        assert np.array_equal(getattr(p, name), getattr(q, name)), name
    decodes = p.step_decoding > 0
    assert (~decodes).any()  # prefill-only steps ran, and paid nothing
    if prefill == "mixed":  # a step carrying prefill tokens and decoders drafts once
        assert (decodes & (p.step_prefill_tokens > 0)).any()
    assert np.allclose(q.step_time - p.step_time, np.where(decodes, d, 0.0), rtol=0, atol=1e-12)
    assert drafted.throughput < plain.throughput
