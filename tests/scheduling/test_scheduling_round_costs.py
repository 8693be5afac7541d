"""``round_costs``: a round's price from the rounds a CPU worker timed, over a cost table.

Every value is checked against a formula written here with NumPy, not against the
module's own code path: ``fit_level_and_slope`` against a direct solve of the 2x2
normal equations with the prior (and, where that slope is negative, the boundary
optimum ``s = 0``, confirmed by a brute-force grid); ``RoundCosts`` against the base
table with nothing measured, against ``c_n + s_n * rise`` at a measured request count,
against the base shifted by the nearest measured count's gap elsewhere, and ``rest`` by
nearest count; ``RoundTimings`` for its warm-up drop, readiness, window and horizon.
Then the decision it exists for: one request on a CPU-like target whose verify measures
flat in tokens, where the table alone stops before the last draft and the measured
prices verify it, and the device twin decides the same.
"""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
import torch

from dspark_sglang.scheduling.cost_table import (
    SpsAdditiveCostTable,
    additive_from_probes,
    from_probes,
)
from dspark_sglang.scheduling.device_policies import DeviceCostTable, device_twin
from dspark_sglang.scheduling.policies import PrefixScheduler
from dspark_sglang.scheduling.round_costs import (
    MIN_SAMPLES,
    PRIOR_SAMPLES,
    WARMUP,
    RoundCosts,
    RoundTimings,
    fit_level_and_slope,
)

#: Step seconds of a CPU-like target at 1, 2, 4 and 8 verify tokens (start-up probes).
CPU_STEPS = {1: 0.0387, 2: 0.0407, 4: 0.0438, 8: 0.0454}
#: An additive table whose request term is not zero: 0.03 + (n-1)*0.002 + (b-1)*0.001 s.
BASE = SpsAdditiveCostTable(
    bias_seconds=0.03, bs_probes=(1, 4), alpha_seconds=(0.0, 0.006),
    m_probes=(1, 16), theta_seconds=(0.0, 0.015),
)  # fmt: skip


def _cpu_base() -> SpsAdditiveCostTable:
    return additive_from_probes([(b, 1.0 / t) for b, t in CPU_STEPS.items()])


def _cpu_step(b: np.ndarray | float) -> np.ndarray:
    return np.interp(b, list(CPU_STEPS), list(CPU_STEPS.values()))


def _base_step(n: int, b: np.ndarray | float) -> np.ndarray:
    return 0.03 + np.interp(n, [1, 4], [0.0, 0.006]) + np.interp(b, [1, 16], [0.0, 0.015])


def _prior(x: np.ndarray) -> float:
    """``P``: ``PRIOR_SAMPLES`` samples at each end of the rises on a line of slope 1."""
    return PRIOR_SAMPLES * (x.max() - x.min()) ** 2 / 2


def _wls(x, y, w) -> tuple[float, float]:
    """Normal equations of ``sum w (y - c - s x)^2 + P (s - 1)^2``; ``s < 0``: ``(mean y, 0)``."""
    x, y, w = (np.asarray(v, dtype=np.float64) for v in (x, y, w))
    p = _prior(x)
    a = np.array([[w.sum(), w @ x], [w @ x, w @ (x * x) + p]])
    c, s = np.linalg.solve(a, [w @ y, w @ (x * y) + p])
    return (float(c), float(s)) if s >= 0 else (float(w @ y / w.sum()), 0.0)


def _loss(x, y, w, c: np.ndarray, s: np.ndarray) -> np.ndarray:
    """``sum w (y - c - s x)^2 + P (s - 1)^2`` at every ``(c, s)`` of two same-shape arrays."""
    return (w * (y - c[..., None] - s[..., None] * x) ** 2).sum(-1) + _prior(x) * (s - 1) ** 2


def _seconds(fn, n: int, tokens) -> np.ndarray:
    return fn(n, torch.as_tensor(tokens, dtype=torch.int64)).numpy()


def test_fit_is_the_prior_weighted_least_squares_with_a_non_negative_slope() -> None:
    rng = np.random.default_rng(0)
    branches = {"free": 0, "clamped": 0}
    for _ in range(200):
        k = int(rng.integers(2, 8))
        x = rng.uniform(0.0, 0.01, k) * (rng.random(k) > 0.2)
        y = 0.04 + rng.uniform(-5.0, 3.0) * x + rng.normal(0.0, 0.002, k)
        w = rng.integers(MIN_SAMPLES, 17, k).astype(float)
        if x.max() == x.min():
            continue
        c, s = fit_level_and_slope(x, y, w)
        want_c, want_s = _wls(x, y, w)
        branches["free" if want_s > 0 else "clamped"] += 1
        assert s >= 0.0
        assert (c, s) == pytest.approx((want_c, want_s), rel=1e-9, abs=1e-12)
        # No (c, s >= 0) on a grid around the fit does better.
        cs, ss = np.meshgrid(c + np.linspace(-0.02, 0.02, 81), np.linspace(0.0, 3.0, 121))
        assert _loss(x, y, w, cs, ss).min() >= _loss(x, y, w, np.array(c), np.array(s)) - 1e-15
    assert min(branches.values()) >= 20, branches

    # All rises 0, or all equal: no slope to fit, the prior's 1, the weighted mean of y - x.
    assert fit_level_and_slope([0.0, 0.0], [0.05, 0.08], [1, 3]) == pytest.approx((0.0725, 1.0))
    assert fit_level_and_slope([0.002] * 2, [0.05, 0.08], [1, 3]) == pytest.approx((0.0705, 1.0))
    # One point: the prior's slope and a level through the point.
    assert fit_level_and_slope([0.004], [0.05], [5]) == pytest.approx((0.046, 1.0), rel=1e-12)
    for x, y, w in (
        ([], [], []), ([1.0], [1.0, 2.0], [1.0]), ([math.nan], [1.0], [1.0]),
        ([1.0], [math.inf], [1.0]), ([1.0], [1.0], [0.0]), ([1.0], [1.0], [-1.0]),
        ([-0.001], [1.0], [1.0]),
    ):  # fmt: skip
        with pytest.raises(ValueError, match="fit_level_and_slope"):
            fit_level_and_slope(x, y, w)


def test_nothing_measured_is_the_base_table() -> None:
    staircase = from_probes([(1, 30.0), (4, 25.0), (16, 12.0)], max_batch_tokens=64)
    tokens = torch.arange(0, 80)
    for base, cap in ((staircase, 64), (BASE, None), (_cpu_base(), None)):
        costs = RoundCosts(base)
        assert costs.max_batch_tokens == cap
        for n in (1, 3, 7):
            want = 1.0 / base.steps_per_sec(n, tokens)
            assert torch.equal(costs.step_seconds(n, tokens), want)
            assert costs.rest_seconds(n) == 0.0
            sps = costs.steps_per_sec(n, tokens)
            torch.testing.assert_close(sps, 1.0 / want, rtol=1e-15, atol=0)


def test_measured_request_count_scales_the_tables_rise_by_the_fitted_slope() -> None:
    tokens = np.arange(1, 41)
    ms, w = [3, 5, 9, 14], [3, 7, 4, 16]
    for ys, clamped in (([0.051, 0.053, 0.060, 0.064], False), ([0.06, 0.05, 0.05, 0.04], True)):
        costs = RoundCosts(BASE, {(2, m): (y, k) for m, y, k in zip(ms, ys, w, strict=True)})
        c, s = _wls(_base_step(2, ms) - _base_step(2, 2), ys, w)
        assert (s == 0.0) == clamped
        want = c + s * np.maximum(_base_step(2, tokens) - _base_step(2, 2), 0.0)  # 1 token: 0
        np.testing.assert_allclose(_seconds(costs.verify_seconds, 2, tokens), want, rtol=1e-12)

    # Flat at 0.045 s from 2 to 8 tokens: y is constant, so the normal equations give
    # s = P / (P + sum w (x - mean x)^2): the prior keeps it above 0, by less the more
    # samples weigh: 0.076 at 8 a shape, 0.040 at WINDOW's 16, 0.0007 at 1000.
    x = _cpu_step(np.arange(2, 9)) - _cpu_step(1)
    for k, bound in ((8, (0.07, 0.08)), (16, (0.0, 0.05)), (1000, (0.0, 0.001))):
        costs = RoundCosts(_cpu_base(), {(1, m): (0.045, k) for m in range(2, 9)})
        v = _seconds(costs.verify_seconds, 1, np.arange(1, 9))
        slope = (v[7] - v[1]) / (x[6] - x[0])
        p = _prior(x)
        assert slope == pytest.approx(p / (p + k * ((x - x.mean()) ** 2).sum()), rel=1e-9)
        assert bound[0] < slope < bound[1]
        assert v[0] == pytest.approx(0.045 - slope * x.mean(), rel=1e-12)
    # Rising exactly as the table does: slope 1 and the level 0.05 at m = n.
    costs = RoundCosts(_cpu_base(), {(1, m): (0.05 + x[m - 2], 5) for m in range(2, 9)})
    tokens = np.arange(1, 30)
    want = 0.05 + _cpu_step(tokens) - _cpu_step(1)
    np.testing.assert_allclose(_seconds(costs.verify_seconds, 1, tokens), want, rtol=1e-12)


def test_unmeasured_count_takes_the_nearest_gap_and_rest_the_nearest_median() -> None:
    shapes = {(1, 2): 0.045, (1, 4): 0.049, (1, 8): 0.050, (3, 4): 0.040, (3, 6): 0.044}
    shapes[(3, 9)] = 0.047
    rest = {1: (0.011, 3), 3: (0.013, 4), 8: (0.020, 5)}
    costs = RoundCosts(BASE, {nm: (y, 4) for nm, y in shapes.items()}, rest)
    levels = {}
    for n in (1, 3):
        ms = [m for nn, m in shapes if nn == n]
        levels[n] = _wls(_base_step(n, ms) - _base_step(n, n), [shapes[n, m] for m in ms], [4] * 3)
    tokens = np.arange(1, 30)
    # n=2 is as near to 1 as to 3: the smaller wins.
    for n, near in ((2, 1), (4, 3), (5, 3), (9, 3), (40, 3)):
        want = _base_step(n, tokens) + levels[near][0] - _base_step(near, near)
        np.testing.assert_allclose(_seconds(costs.verify_seconds, n, tokens), want, rtol=1e-12)
    for n, want in ((1, 0.011), (2, 0.011), (3, 0.013), (4, 0.013), (5, 0.013), (6, 0.020)):
        assert costs.rest_seconds(n) == want
        step = _seconds(costs.verify_seconds, n, tokens) + want
        np.testing.assert_allclose(_seconds(costs.step_seconds, n, tokens), step, rtol=1e-15)
        np.testing.assert_allclose(_seconds(costs.steps_per_sec, n, tokens), 1 / step, rtol=1e-15)
    assert costs.rest_seconds(100) == 0.020


def test_lookups_are_bitwise_the_rise_from_the_table_at_n_tokens() -> None:
    """The table at ``n`` tokens is precomputed once per measured ``n``: every lookup is
    bit for bit what computing it per lookup gives (shape included, 0-d tokens too)."""

    def at(base, n: int, tokens: torch.Tensor) -> torch.Tensor:
        return 1.0 / base.steps_per_sec(n, tokens.to(torch.int64)).to(torch.float64)

    staircase = from_probes([(1, 30.0), (4, 25.0), (16, 12.0)], max_batch_tokens=64)
    shapes = {(1, 2): 0.045, (1, 5): 0.049, (3, 4): 0.040, (3, 9): 0.047}
    token_sets = (torch.arange(0, 80), torch.tensor(6), torch.tensor([9], dtype=torch.int32))
    for base in (staircase, BASE, _cpu_base()):
        costs = RoundCosts(base, {nm: (y, 4) for nm, y in shapes.items()})
        fitted = costs._fitted  # type: ignore[attr-defined]
        for n, tokens in ((n, t) for n in (1, 2, 3, 7) for t in token_sets):
            if n in fitted:
                level, slope = fitted[n]
                rise = at(base, n, tokens) - at(base, n, torch.tensor([n]))
                want = level + slope * rise.clamp(min=0.0)
            else:  # n=2 is as near to 1 as to 3: the smaller wins
                near = 1 if n == 2 else 3
                gap = fitted[near][0] - float(at(base, near, torch.tensor([near]))[0])
                want = at(base, n, tokens) + gap
            got = costs.verify_seconds(n, tokens)
            assert got.shape == want.shape and torch.equal(got, want)


def test_bad_shapes_rests_and_base_are_refused_naming_the_field() -> None:
    ok = (0.05, MIN_SAMPLES)
    bad_verify = {
        (1, 2): (0.05, MIN_SAMPLES - 1), (3, 2): ok, (0, 2): ok, (1, 3): (math.nan, 5),
        (1, 4): (math.inf, 5), (1, 5): (0.0, 5), (1, 6): (-0.01, 5),
    }  # fmt: skip
    for shape, value in bad_verify.items():
        with pytest.raises(ValueError, match=re.escape(f"RoundCosts.verify[{shape}]")):
            RoundCosts(BASE, {(1, 9): ok, shape: value})
    bad_rest = {0: ok, 2: (0.01, MIN_SAMPLES - 1), 3: (-0.01, 5), 4: (math.nan, 5)}
    for n, value in bad_rest.items():
        with pytest.raises(ValueError, match=re.escape(f"RoundCosts.rest[{n}]")):
            RoundCosts(BASE, rest={1: (0.0, 3), n: value})
    for base in (None, RoundCosts(BASE), {"bias_seconds": 0.03}):
        with pytest.raises(TypeError, match=r"RoundCosts\.base must be"):
            RoundCosts(base)  # type: ignore[arg-type]


def test_round_timings_warmup_readiness_refresh_and_window() -> None:
    timings = RoundTimings(window=5, refresh=4)
    verify = [*[1.0, 0.9][:WARMUP], 0.05, 0.07, 0.06]  # the warm-up rounds are slow
    for i, v in enumerate(verify, start=1):
        timings.add(1, 2, v + 0.01 * i, v)
        if i == MIN_SAMPLES:  # the rest of 1 request counts from the first round
            assert timings.ready
            assert dict(timings.snapshot(BASE).verify) == {}
        assert timings.ready == (i == len(verify))  # (1, 2): MIN_SAMPLES after its WARMUP
    snap = timings.snapshot(BASE)
    assert dict(snap.verify) == {(1, 2): (0.06, MIN_SAMPLES)}
    rests = 0.01 * np.arange(1, WARMUP + MIN_SAMPLES + 1)  # none dropped
    assert snap.rest[1] == pytest.approx((float(np.median(rests)), WARMUP + MIN_SAMPLES))
    for _ in range(3):  # refresh=4: three rounds of known keys are not enough
        timings.add(1, 2, 0.08, 0.05)
        assert not timings.ready
    timings.add(1, 3, 0.08, 0.05)  # a new shape's first round: warm-up, but a round
    assert timings.ready
    timings.snapshot(BASE)
    for v in range(1, 11):  # window=5: (3, 3) keeps the latest 5 after its warm-up
        timings.add(3, 3, v + 0.5, float(v))
    snap = timings.snapshot(BASE)
    assert snap.verify[(3, 3)] == (8.0, 5)
    assert snap.rest[3] == (0.5, 5)
    assert snap.verify[(1, 2)] == (0.05, 5)  # 0.07, 0.06, 0.05, 0.05, 0.05
    assert (1, 3) not in snap.verify  # its one round was warm-up


def test_round_timings_horizon_and_bad_rounds() -> None:
    timings = RoundTimings(horizon=10)
    for _ in range(WARMUP + MIN_SAMPLES):  # rounds 1..5; (1, 2)'s verify kept from 3
        timings.add(1, 2, 0.06, 0.05)
    live = lambda first: sum(r > timings.rounds - 10 for r in range(first, 6)) >= MIN_SAMPLES  # noqa: E731
    while timings.rounds < 20:
        snap = timings.snapshot(BASE)
        assert ((1, 2) in snap.verify) == live(WARMUP + 1) and (1 in snap.rest) == live(1)
        timings.add(2, 4, 0.07, 0.06)
    assert set(snap.verify) == {(2, 4)} and set(snap.rest) == {2}
    # (1, 2) is priced from the table again, shifted by (2, 4)'s gap (one shape: slope 1).
    want = _base_step(1, 2) + 0.06 - _base_step(2, 4)
    assert float(snap.verify_seconds(1, torch.tensor([2]))[0]) == pytest.approx(want, rel=1e-12)
    for args in (
        (3, 2, 0.06, 0.05), (0, 1, 0.06, 0.05), (1, 2, 0.06, 0.0), (1, 2, 0.06, -1.0),
        (1, 2, 0.06, math.nan), (1, 2, math.inf, math.inf), (1, 2, 0.05, 0.06),
    ):  # fmt: skip
        with pytest.raises(ValueError):
            timings.add(*args)
    assert timings.rounds == 20


def _prefix_drafts(survival: np.ndarray, step_seconds: np.ndarray) -> int:
    """Algorithm 1 at one request: ``theta_j = (1 + sum_{t<j} A_t) / step(1 + j)``, early stop."""
    theta = np.concatenate(([1.0], 1.0 + np.cumsum(survival))) / step_seconds
    stops = np.flatnonzero(theta[1:] <= theta[:-1])
    return int(stops[0]) if stops.size else survival.size


def test_flat_measured_verify_pays_for_the_draft_the_table_alone_stops_before() -> None:
    base = _cpu_base()
    conf = [0.9, 0.8 / 0.9, 0.7 / 0.8, 0.5 / 0.7, 0.4 / 0.5, 0.35 / 0.4, 0.1]
    c = torch.tensor([conf])
    verify = {(1, m): (0.045, 8) for m in range(2, 9)}
    measured = RoundCosts(base, verify, {1: (0.01, 8)})
    # The 7th draft (survival 0.035) adds 0.035 / 4.65 = 0.75 % to tau. On the table its
    # 8th token costs 0.0004 / 0.0450 = 0.89 % of the step: stop at 6. Measured flat, the
    # slope fits s = 0.076 (8 samples a shape against the prior's 1 at each end), so it
    # costs 0.076 * 0.0004 = 0.00003 s of a 0.045 s verify: 0.07 % (0.05 % with the
    # 0.01 s rest) < 0.75 %: verify all 7.
    x = _cpu_step(np.arange(1, 9)) - _cpu_step(1)
    lvl, s = _wls(x[1:], [0.045] * 7, [8] * 7)
    assert s == pytest.approx(0.0761, abs=1e-4)
    surv = np.cumprod(conf)
    assert _prefix_drafts(surv, _cpu_step(np.arange(1, 9))) == 6
    assert _prefix_drafts(surv, lvl + s * x + 0.01) == 7
    assert int(PrefixScheduler(base).decide(c)[0]) == 6
    assert int(PrefixScheduler(measured).decide(c)[0]) == 7
    assert int(PrefixScheduler(RoundCosts(base, verify)).decide(c)[0]) == 7

    # The device twin (CPU only) decides bit-identically to the host policy.
    more = {(4, m): (0.06 + 0.001 * m, 5) for m in (4, 6, 9, 12)}
    costs = RoundCosts(base, {**verify, **more}, {1: (0.01, 8), 4: (0.015, 4)})
    host = PrefixScheduler(costs)
    twin = device_twin(host, "cpu")
    gen = torch.Generator().manual_seed(0)
    for n in (1, 2, 4):
        for _ in range(50):
            c = torch.rand((n, 7), generator=gen, dtype=torch.float32)
            assert torch.equal(twin.decide(c), host.decide(c))
    with pytest.raises(ValueError, match="CPU"):
        DeviceCostTable(costs, device="meta")
