"""``dspark-sglang simulate``: runs end to end and reports what it simulated."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dspark_sglang.cli import main


def test_simulate_cli_writes_results(tmp_path: Path, table) -> None:
    profile = tmp_path / "sps.json"
    table.save(profile)
    out = tmp_path / "sim.json"
    argv = ["simulate", "--profile", str(profile), "--traces", "synthetic:4",
            "--policy", "mtp1,static:4", "--concurrency", "2,6", "--num-requests", "12",
            "--json", str(out)]  # fmt: skip
    assert main(argv) == 0
    rows = json.loads(out.read_text())
    assert [(r["spec"], r["concurrency"]) for r in rows] == [
        ("mtp1", 2), ("mtp1", 6), ("static:4", 2), ("static:4", 6)
    ]  # fmt: skip
    assert all(r["mean_verify_tokens_per_request"] == 2.0 for r in rows[:2])
    assert all(r["mean_verify_tokens_per_request"] == 5.0 for r in rows[2:])


def test_simulate_cli_rejects_open_loop_without_cap(tmp_path: Path, table) -> None:
    profile = tmp_path / "sps.json"
    table.save(profile)
    argv = ["simulate", "--profile", str(profile), "--traces", "synthetic", "--rate", "5"]
    assert main(argv) == 2


def test_simulate_cli_charges_and_records_the_draft_pass(tmp_path: Path, table, capsys) -> None:
    profile = tmp_path / "sps.json"
    table.save(profile)
    runs = {}
    for draft in ([], ["--draft-step-seconds", "0.004"]):
        out = tmp_path / f"sim{len(draft)}.json"
        argv = ["simulate", "--profile", str(profile), "--traces", "synthetic:4",
                "--policy", "lagged,none", "--concurrency", "3", "--num-requests", "12",
                "--json", str(out), *draft]  # fmt: skip
        assert main(argv) == 0
        runs[bool(draft)] = (capsys.readouterr().out, json.loads(out.read_text()))
    (plain_out, plain), (drafted_out, drafted) = runs[False], runs[True]
    assert "draft pass not modelled (0 s per decode step)" in plain_out
    assert "draft pass 0.004 s per decode step" in drafted_out
    assert [r["draft_step_seconds"] for r in plain] == [0.0, 0.0]
    assert [r["draft_step_seconds"] for r in drafted] == [0.004, 0.004]
    # Policy none verifies nothing, yet its engine still drafts every decode step.
    assert drafted[1]["steps"] == plain[1]["steps"]
    assert drafted[1]["throughput"] < plain[1]["throughput"]


def test_simulate_cli_refuses_a_bad_draft_pass(tmp_path: Path, table, capsys) -> None:
    profile = tmp_path / "sps.json"
    table.save(profile)
    for bad in ("-0.01", "nan", "4ms"):
        argv = ["simulate", "--profile", str(profile), "--traces", "synthetic", "--concurrency",
                "2", "--draft-step-seconds", bad]  # fmt: skip
        with pytest.raises(SystemExit) as info:
            main(argv)
        assert info.value.code == 2
        err = capsys.readouterr().err
        assert "argument --draft-step-seconds: expected a finite number of seconds >= 0" in err
