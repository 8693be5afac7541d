"""Frontier sweep: DSpark's frontier lies outside MTP-1's when acceptance is high."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dspark_sglang.planning.frontier import (
    Frontier,
    PolicySpec,
    best_at_sla,
    budget_curve,
    pareto,
    plot_budget,
    plot_frontier,
    speed_at_throughput,
    sweep,
    write_json,
)
from dspark_sglang.planning.simulator import SimResult

CONCURRENCIES = (1, 4, 16, 48)


@pytest.fixture(scope="module")
def frontier(table, high_traces, lengths) -> Frontier:
    specs = [PolicySpec("mtp1"), PolicySpec("lagged"), PolicySpec("none")]
    return sweep(
        high_traces, table, lengths, specs, CONCURRENCIES, num_requests=lambda c: max(24, 3 * c)
    )


def test_lagged_frontier_outside_mtp1(frontier: Frontier) -> None:
    mtp1, lagged = frontier.points["mtp1"], frontier.points["lagged"]
    for b in mtp1:
        s = speed_at_throughput(lagged, b.throughput)
        assert s is not None and s > 1.2 * b.user_tps_p50, (b.concurrency, s, b.user_tps_p50)
    # SLA anchor: at a moderate SLA DSpark serves more throughput than MTP-1.
    sla = 0.8 * max(r.user_tps_p50 for r in mtp1)
    base, ours = best_at_sla(mtp1, sla), best_at_sla(lagged, sla)
    assert base is not None and ours is not None and ours.throughput > base.throughput
    # And MTP-1 itself beats no speculation.
    none = frontier.points["none"]
    assert all(m.throughput > n.throughput for m, n in zip(mtp1, none, strict=True))


def test_budget_shrinks_as_load_saturates(frontier: Frontier) -> None:
    rows = budget_curve(frontier)["lagged"]
    per_req = [r["verify_tokens_per_request"] for r in rows]
    assert per_req[-1] < per_req[1]  # C=48 verifies fewer tokens per request than C=4
    assert all(r["verify_tokens_per_request"] == 2.0 for r in budget_curve(frontier)["mtp1"])


def test_outputs_written(frontier: Frontier, tmp_path: Path) -> None:
    doc = write_json(frontier, tmp_path / "f.json", slas=(50.0, 150.0))
    back = json.loads((tmp_path / "f.json").read_text())
    assert back["sla_table_p50"] == doc["sla_table_p50"]
    assert {r["policy"] for r in back["sla_table_p50"]} == {"mtp1", "lagged", "none"}
    assert len(back["points"]["lagged"]) == len(CONCURRENCIES)
    plot_frontier(frontier, tmp_path / "f.png", slas=(50.0,))
    plot_budget(frontier, tmp_path / "b.png")
    assert (tmp_path / "f.png").stat().st_size > 1000 and (tmp_path / "b.png").stat().st_size > 1000


def _res(thr: float, spd: float) -> SimResult:
    nan = float("nan")
    return SimResult("x", "closed", 1, None, 1, thr, spd, spd, spd, nan, 1, 0, 1, 1, 1, 1, 1.0, 1)


def test_pareto_and_interpolation() -> None:
    pts = [_res(100, 50), _res(200, 40), _res(150, 30), _res(300, 10)]
    assert pareto(pts) == [(100, 50), (200, 40), (300, 10)]  # (150, 30) is dominated
    assert speed_at_throughput(pts, 250) == pytest.approx(25.0)
    assert speed_at_throughput(pts, 50) == 50
    assert speed_at_throughput(pts, 301) is None


def test_policy_spec_parse() -> None:
    assert PolicySpec.parse("static:3") == PolicySpec("static", 3)
    assert PolicySpec.parse("lagged").lag == 2
    with pytest.raises(ValueError, match="static:<k>"):
        PolicySpec.parse("static")
