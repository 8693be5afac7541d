"""``bench.alternate``: every function warmed up once, then timed in turn each round."""

from __future__ import annotations

import pytest

from dspark_sglang.bench.alternate import alternate


def test_calls_interleave_and_stats_follow_the_rounds() -> None:
    order: list[str] = []
    out = alternate(
        {"a": lambda: order.append("a"), "b": lambda: order.append("b")},
        repeats=3,
        iters=2,
        scale=1e3,
        key="ms",
    )
    assert order == ["a", "b"] + ["a", "a", "b", "b"] * 3  # warm-up, then A A B B per round
    for stats in out.values():
        assert len(stats["ms"]) == 3
        assert stats["min"] <= stats["median"] <= stats["max"]
        assert stats["median"] == sorted(stats["ms"])[1]


def test_bad_counts_are_refused() -> None:
    with pytest.raises(ValueError, match="repeats and iters"):
        alternate({"a": lambda: None}, repeats=0, iters=1)
