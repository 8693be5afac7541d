"""`dspark-sglang calibrate`: bad options and missing folders give one-line errors or just work."""

from __future__ import annotations

from pathlib import Path

import pytest

from dspark_sglang.calibration.rollouts import Rollouts, save_rollouts
from dspark_sglang.calibration.sts import load_sts
from dspark_sglang.cli import main


def test_calibrate_creates_missing_parent_folders(
    synthetic, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    z, acc, _ = synthetic(400, [1.0, 2.0], 5)
    save_rollouts(tmp_path / "r.jsonl", Rollouts(z.float(), acc))
    out, png = tmp_path / "a" / "missing" / "sts.json", tmp_path / "b" / "missing" / "rel.png"
    argv = ["calibrate", "--rollouts", str(tmp_path / "r.jsonl"), "--out", str(out),
            "--plot", str(png), "--grid-steps", "9"]  # fmt: skip
    assert main(argv) == 0
    assert load_sts(out).block_size == 2 and png.is_file()
    assert "Traceback" not in capsys.readouterr().err


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("--grid-steps", "100000000", "argument --grid-steps: must be an integer in 2..10000"),
        ("--grid-steps", "1e8", "argument --grid-steps: must be an integer in 2..10000"),
        ("--grid-steps", "1", "argument --grid-steps: must be an integer in 2..10000"),
        ("--grid-min", "0", "argument --grid-min: must be a finite temperature > 0"),
        ("--grid-max", "inf", "argument --grid-max: must be a finite temperature > 0"),
    ],
)
def test_calibrate_bounds_the_grid_options(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], option: str, value: str, message: str
) -> None:
    argv = ["calibrate", "--rollouts", str(tmp_path / "r.jsonl"), "--out",
            str(tmp_path / "sts.json"), option, value]  # fmt: skip
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_calibrate_refuses_grid_min_above_grid_max(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["calibrate", "--rollouts", str(tmp_path / "missing.jsonl"), "--out",
            str(tmp_path / "sts.json"), "--grid-min", "5", "--grid-max", "1"]  # fmt: skip
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "calibrate: error: --grid-min (5) must be below --grid-max (1)" in err
