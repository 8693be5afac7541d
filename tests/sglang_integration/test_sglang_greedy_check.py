"""Greedy identity with near-ties: synthetic outputs and margins, no engine."""

from __future__ import annotations

import pytest

from dspark_sglang.sglang_integration.greedy_check import (
    NEAR_TIE_TOLERANCE,
    TopTokens,
    find_divergences,
    first_difference,
    near_tie_tolerance,
    summarize_margins,
    top_tokens_from_sglang,
)


def _top(t1: int, t2: int, margin: float) -> TopTokens:
    return TopTokens((t1, t2), (-0.5, -0.5 - margin))


def _margins(plain: list[int], runner_up: int, margin_at: dict[int, float]) -> list[TopTokens]:
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
    assert div.top_tokens is not None and div.top_tokens.margin == pytest.approx(tol / 2)
    assert div.top_tokens.gap(6) == 0.0 and div.top_tokens.gap(8) == pytest.approx(tol / 2)
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


def test_a_token_outside_the_listed_best_is_a_failure_even_at_a_tiny_margin() -> None:
    plain = [[1, 2, 3]]
    spec = [[1, 4, 3]]  # the runner-up is 9, not 4
    (div,) = find_divergences(plain, spec, [_margins(plain[0], 9, {1: 0.0})], "float32")
    assert not div.near_tie and "not among them" in div.describe()


def test_a_three_way_near_tie_is_a_near_tie_only_while_both_tokens_are_close_to_the_best() -> None:
    """bfloat16 logits come in steps of 0.125: three tokens within a step of each other
    happen, and each engine may then emit one the other ranked third."""
    plain = [[1, 2, 3]]
    three_way = TopTokens((7, 9, 2, 4), (-1.0, -1.125, -1.25, -4.0))  # plain's 2 is third
    for spec_token, near in ((9, True), (7, True), (4, False)):
        (div,) = find_divergences(
            plain, [[1, spec_token, 3]], [[None, three_way, None]], "bfloat16"
        )
        assert div.near_tie is near, spec_token
        assert ("numerical near-tie" in div.describe()) is near
    (div,) = find_divergences(plain, [[1, 9, 3]], [[None, three_way, None]], "float32")
    assert not div.near_tie and "above the tolerance" in div.describe()
    assert three_way.gap(2) == pytest.approx(0.25) and three_way.gap(5) is None


def test_an_output_that_ends_early_or_an_unknown_margin_is_a_failure() -> None:
    plain = [[1, 2, 3], [4, 5]]
    spec = [[1, 2], [4, 6]]
    tops = [_margins(plain[0], 9, {2: 0.0}), [_top(4, 9, 5.0), None]]
    early, unknown = find_divergences(plain, spec, tops, "bfloat16")
    assert (early.position, early.plain_token, early.spec_token) == (2, 3, None)
    assert not early.near_tie and "ended early" in early.describe()
    assert unknown.top_tokens is None and not unknown.near_tie
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


def test_sglang_top_logprobs_become_top_tokens() -> None:
    entries = [
        None,  # SGLang has no distribution for a position without a preceding token
        [(-0.1, 11, "a"), (-2.6, 12, "b"), (-3.0, 14, "c")],
        [(-0.7, 13, None)],  # one candidate only
    ]
    first, second, third = top_tokens_from_sglang(entries, "input_top_logprobs")
    assert first is None and third is None
    assert second is not None and second.tokens == (11, 12, 14)
    assert second.margin == pytest.approx(2.5) and second.gap(14) == pytest.approx(2.9)
    with pytest.raises(ValueError, match=r"input_top_logprobs\[0\]: expected"):
        top_tokens_from_sglang([[("x", 1, ""), (-1.0, 2, "")]], "input_top_logprobs")
    with pytest.raises(ValueError, match="best first"):
        TopTokens((1, 2), (-3.0, -1.0))
    with pytest.raises(ValueError, match="at least two tokens"):
        TopTokens((1,), (-1.0,))


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
