"""Stair detector: finds cliffs, ignores slopes and noise, rejects malformed curves."""

from __future__ import annotations

import pytest

from dspark_sglang.profiling.stairs import detect_stairs, excess_jumps


def _sps(step_time, sizes):
    return [1.0 / step_time(b) for b in sizes]


def test_smooth_linear_curve_has_no_stairs_even_on_a_coarse_grid() -> None:
    sizes = [1, 2, 4, 8, 16, 32, 64, 128, 256]
    sps = _sps(lambda b: 0.01 + 0.001 * b, sizes)  # step time triples across the range
    assert detect_stairs(sizes, sps, threshold=0.05) == []
    assert max(excess_jumps(sizes, sps)) < 1e-9


def test_cliff_is_found_in_the_interval_that_contains_it() -> None:
    sizes = list(range(1, 65))
    sps = _sps(lambda b: 0.01 + 0.0001 * b + (0.004 if b > 32 else 0.0), sizes)
    stairs = detect_stairs(sizes, sps, threshold=0.05)
    assert [(s.lo_tokens, s.hi_tokens) for s in stairs] == [(32, 33)]
    s = stairs[0]
    assert s.resolved and s.sps_after < s.sps_before
    # excess jump = 0.004 / t(33)
    assert s.drop == pytest.approx(0.004 / (0.01 + 0.0033 + 0.004), rel=1e-9)


def test_unresolved_cliff_on_a_coarse_grid_is_reported_as_unresolved() -> None:
    sizes = [1, 16, 32, 64]
    sps = _sps(lambda b: 0.01 + (0.005 if b > 20 else 0.0), sizes)
    stairs = detect_stairs(sizes, sps, threshold=0.05)
    assert [(s.lo_tokens, s.hi_tokens, s.resolved) for s in stairs] == [(16, 32, False)]


def test_noisy_probes_raise_the_bar() -> None:
    sizes = [1, 2, 3]
    sps = _sps(lambda b: 0.01 + (0.001 if b == 3 else 0.0), sizes)  # ~9 % jump at 2->3
    assert len(detect_stairs(sizes, sps, [0.0, 0.0, 0.0], threshold=0.05)) == 1
    # 3 * hypot(0.03, 0.03) = 12.7 % > 9 %: within the noise
    assert detect_stairs(sizes, sps, [0.03, 0.03, 0.03], threshold=0.05) == []


@pytest.mark.parametrize(
    ("sizes", "sps", "match"),
    [
        ([], [], "empty curve"),
        ([1, 4, 2], [3.0, 2.0, 1.0], "strictly increasing"),
        ([1, 2, 2], [3.0, 2.0, 1.0], "strictly increasing"),
        ([0, 2], [3.0, 2.0], ">= 1"),
        ([1, 2], [3.0], "differ in length"),
        ([1, 2], [3.0, 0.0], "> 0"),
    ],
)
def test_malformed_curves_are_rejected(sizes, sps, match) -> None:
    with pytest.raises(ValueError, match=match):
        detect_stairs(sizes, sps)
