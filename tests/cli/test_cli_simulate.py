"""``dspark-sglang simulate``: runs end to end and reports what it simulated."""

from __future__ import annotations

import json
from pathlib import Path

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
