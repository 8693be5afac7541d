"""`dspark-sglang simulate --sts`: an STS file for another block size is a one-line error."""

from __future__ import annotations

from pathlib import Path

import pytest

from dspark_sglang.calibration.sts import StsCalibration
from dspark_sglang.cli import main


def test_simulate_refuses_sts_of_another_block_size(
    tmp_path: Path, table, capsys: pytest.CaptureFixture[str]
) -> None:
    profile, sts = tmp_path / "sps.json", tmp_path / "sts.json"
    table.save(profile)
    StsCalibration(temperatures=(1.0, 1.5, 2.0)).save(sts)
    argv = ["simulate", "--profile", str(profile), "--traces", "synthetic:4", "--sts", str(sts),
            "--policy", "mtp1", "--concurrency", "2", "--num-requests", "12"]  # fmt: skip
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"--sts {sts} has 3 temperatures but the traces' block size is 4" in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
