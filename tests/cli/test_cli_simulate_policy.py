"""``dspark-sglang simulate --policy``: each spec is checked as the tier's scheduler config.

The specs become ``SchedulerConfig``s for the traces' block size before any run, so a
spec no deployment could serve (``static:k`` beyond the block) is refused up front with
the config's own message, and nothing is simulated.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from dspark_sglang.cli import main


def test_a_static_k_beyond_the_block_is_refused_before_any_run(
    tmp_path: Path, table, capsys: pytest.CaptureFixture[str]
) -> None:
    profile = tmp_path / "sps.json"
    table.save(profile)
    argv = ["simulate", "--profile", str(profile), "--traces", "synthetic:4",
            "--policy", "mtp1,static:5", "--concurrency", "2", "--num-requests", "4"]  # fmt: skip
    assert main(argv) == 2
    out = capsys.readouterr()
    assert "static_k must be <= block_size (5 > 4)" in out.err
    assert "thr tok/s" not in out.out  # no table header: nothing ran
