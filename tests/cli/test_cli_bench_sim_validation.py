"""``dspark-sglang bench sim-validation``: bad input is refused, naming the flag, before any
server starts (the full run is a benchmark: benchmarks/results/sim_validation.json); and
``--resimulate`` re-simulates the committed run without a server, writing nothing."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from dspark_sglang.cli import main

REPO = Path(__file__).resolve().parents[2]
COMMITTED = REPO / "benchmarks/results/sim_validation.json"


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--concurrency", "1,x"], "--concurrency"),
        (["--concurrency", "0,2"], "concurrencies must be >= 1"),
        (["--requests-per-client", "1"], "requests_per_client must be >= 2"),
        (["--min-requests", "0"], "min_requests must be >= 1"),
        (["--static-k", "0"], "static_k must be >= 1"),
        (["--probes-after", "-1"], "probes_after must be >= 0"),
        (["--threads", "0"], "--threads"),
        (["--drafter", "/nonexistent/drafter"], "no config.json"),
        (["--resimulate", str(COMMITTED), "--out", "x.json"], "drop --out"),
        (["--resimulate", str(COMMITTED), "--base-url", "http://x:1"], "drop --base-url"),
        (["--resimulate", "/nonexistent/run.json"], "no such file"),
    ],
)
def test_bad_flags_are_refused_with_the_flag_named(
    flags: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["bench", "sim-validation", *flags]) == 2
    assert message in capsys.readouterr().err


@pytest.mark.slow
def test_resimulate_reproduces_the_committed_run_and_writes_nothing(
    smollm2_path: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Each level's stored prediction is recomputed exactly (else the command fails), and
    today's timing is printed beside it; no server, no file, no run folder."""
    from dspark_sglang.targets.smollm2 import cache_root

    monkeypatch.chdir(tmp_path)
    runs = cache_root() / "runs" / "bench"
    before = sorted(os.listdir(runs)) if runs.is_dir() else []
    assert main(["bench", "sim-validation", "--resimulate", str(COMMITTED)]) == 0
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if "sim_validation.json" in line]
    assert len(rows) == 3  # c = 1, 2, 4
    # As run, the stored errors (benchmarks/README.md); then with today's timing.
    for row, stored in zip(rows, ("+6.3%", "+0.4%", "+7.9%"), strict=True):
        assert f"{stored} ->" in row
    assert list(tmp_path.iterdir()) == []
    assert (sorted(os.listdir(runs)) if runs.is_dir() else []) == before
