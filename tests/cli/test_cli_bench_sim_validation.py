"""``dspark-sglang bench sim-validation``: bad input is refused, naming the flag, before any
server starts (the full run is a benchmark: benchmarks/results/sim_validation.json)."""

from __future__ import annotations

import pytest

from dspark_sglang.cli import main


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--concurrency", "1,x"], "--concurrency"),
        (["--concurrency", "0,2"], "concurrencies must be >= 1"),
        (["--requests-per-client", "1"], "requests_per_client must be >= 2"),
        (["--min-requests", "0"], "min_requests must be >= 1"),
        (["--static-k", "0"], "static_k must be >= 1"),
        (["--threads", "0"], "--threads"),
        (["--drafter", "/nonexistent/drafter"], "no config.json"),
    ],
)
def test_bad_flags_are_refused_with_the_flag_named(
    flags: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["bench", "sim-validation", *flags]) == 2
    assert message in capsys.readouterr().err
