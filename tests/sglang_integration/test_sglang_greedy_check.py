"""Greedy identity with near-ties: synthetic outputs and margins, no engine."""

from __future__ import annotations

import pytest

from dspark_sglang.sglang_integration.greedy_check import (
    NEAR_TIE_TOLERANCE,
    TopTwo,
    find_divergences,
    first_difference,
    near_tie_tolerance,
    summarize_margins,
    top_two_from_sglang,
)


def _top(t1: int, t2: int, margin: float) -> TopTwo:
    return TopTwo((t1, t2), (-0.5, -0.5 - margin))


def _margins(plain: list[int], runner_up: int, margin_at: dict[int, float]) -> list[TopTwo]:
    """Top two along a plain output: its own token first, ``runner_up`` second."""
    return [_top(t, runner_up, margin_at.get(j, 5.0)) for j, t in enumerate(plain)]


def test_identical_outputs_have_no_divergence() -> None:
    plain = [[1, 2, 3], [4]]
    tops = [_margins(p, 9, {}) for p in plain]
    assert find_divergences(plain, [[1, 2, 3], [4]], tops, "float32") == []
    assert first_difference([1, 2], [1, 2]) is None
    assert first_difference([1, 2], [1, 3]) == 1
    assert first_difference([1, 2], [1, 2, 7]) == 2


@pytest.mark.parametrize("dtype", sorted(NEAR_TIE_TOLERANCE))
def test_flip_within_tolerance_is_a_near_tie(dtype: str) -> None:
    tol = near_tie_tolerance(dtype)
    plain = [[1, 2, 3, 4], [5, 6]]
    spec = [[1, 2, 3, 4], [5, 8, 8]]  # the second prompt flips 6 -> 8 at token 1
    tops = [_margins(plain[0], 9, {}), _margins(plain[1], 8, {1: tol / 2})]
    (div,) = find_divergences(plain, spec, tops, dtype)
    assert (div.prompt, div.position, div.plain_token, div.spec_token) == (1, 1, 6, 8)
    assert div.top_two is not None and div.top_two.margin == pytest.approx(tol / 2)
    assert div.near_tie
    assert "prompt 1, token 1" in div.describe() and "numerical near-tie" in div.describe()


@pytest.mark.parametrize("dtype", sorted(NEAR_TIE_TOLERANCE))
def test_flip_above_tolerance_is_a_failure(dtype: str) -> None:
    tol = near_tie_tolerance(dtype)
    plain = [[1, 2, 3]]
    spec = [[1, 7, 3]]
    (div,) = find_divergences(plain, spec, [_margins(plain[0], 7, {1: tol * 2})], dtype)
    assert not div.near_tie
    assert "above the tolerance, a speculation bug" in div.describe()


def test_a_token_outside_the_top_two_is_a_failure_even_at_a_tiny_margin() -> None:
    plain = [[1, 2, 3]]
    spec = [[1, 4, 3]]  # the runner-up is 9, not 4
    (div,) = find_divergences(plain, spec, [_margins(plain[0], 9, {1: 0.0})], "float32")
    assert not div.near_tie and "not among them" in div.describe()


def test_an_output_that_ends_early_or_an_unknown_margin_is_a_failure() -> None:
    plain = [[1, 2, 3], [4, 5]]
    spec = [[1, 2], [4, 6]]
    tops = [_margins(plain[0], 9, {2: 0.0}), [_top(4, 9, 5.0), None]]
    early, unknown = find_divergences(plain, spec, tops, "bfloat16")
    assert (early.position, early.plain_token, early.spec_token) == (2, 3, None)
    assert not early.near_tie and "ended early" in early.describe()
    assert unknown.top_two is None and not unknown.near_tie
    assert "unknown" in unknown.describe()


def test_the_tolerance_is_per_dtype_and_unknown_dtypes_are_refused() -> None:
    assert near_tie_tolerance("bfloat16") > near_tie_tolerance("float32") > 0
    plain, spec = [[1, 2]], [[1, 3]]
    between = (near_tie_tolerance("float32") + near_tie_tolerance("bfloat16")) / 2
    tops = [_margins(plain[0], 3, {1: between})]
    assert find_divergences(plain, spec, tops, "bfloat16")[0].near_tie
    assert not find_divergences(plain, spec, tops, "float32")[0].near_tie
    with pytest.raises(ValueError, match="no near-tie tolerance for dtype 'float16'"):
        near_tie_tolerance("float16")
    with pytest.raises(ValueError, match="one entry per prompt"):
        find_divergences(plain, spec, [], "float32")


def test_sglang_top_logprobs_become_top_two() -> None:
    entries = [
        None,  # SGLang has no distribution for a position without a preceding token
        [(-0.1, 11, "a"), (-2.6, 12, "b")],
        [(-0.7, 13, None)],  # one candidate only
    ]
    first, second, third = top_two_from_sglang(entries, "input_top_logprobs")
    assert first is None and third is None
    assert second is not None and second.tokens == (11, 12)
    assert second.margin == pytest.approx(2.5)
    with pytest.raises(ValueError, match=r"input_top_logprobs\[0\]: expected"):
        top_two_from_sglang([[("x", 1, ""), (-1.0, 2, "")]], "input_top_logprobs")
    with pytest.raises(ValueError, match="best first"):
        TopTwo((1, 2), (-3.0, -1.0))


def test_margin_summary_counts_first_choices_and_finds_the_closest_call() -> None:
    outputs = [[1, 2, 3], [4, 5]]
    tops = [
        [_top(1, 9, 2.0), _top(9, 2, 0.25), None],  # token 2 was the runner-up here
        [_top(4, 9, 0.5), _top(5, 9, 3.0)],
    ]
    summary = summarize_margins(outputs, tops)
    assert (summary.positions, summary.ranked_first) == (4, 3)
    assert summary.smallest == (pytest.approx(0.25), 0, 1)
    assert summarize_margins([[1]], [[None]]).smallest is None
