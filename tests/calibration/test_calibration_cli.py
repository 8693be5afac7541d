"""`dspark-sglang calibrate` end to end."""

from __future__ import annotations

from pathlib import Path

import pytest
from matplotlib.image import imread

from dspark_sglang.calibration.rollouts import Rollouts, save_rollouts
from dspark_sglang.calibration.sts import load_sts
from dspark_sglang.cli import main

sts_sglang = pytest.importorskip("sglang.srt.speculative.dspark_components.dspark_sts")


def test_calibrate_writes_sglang_json_table_and_plot(
    synthetic, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    z, acc, _ = synthetic(6_000, [0.5, 2.0, 1.0], 21)
    # Half as our .jsonl, half as an SGLang recorder shard: both are accepted together.
    save_rollouts(tmp_path / "ours.jsonl", Rollouts(z[:3000].float(), acc[:3000]))
    rec = sts_sglang.StsDataRecorder(path_stem=str(tmp_path / "shard"), gamma=3, flush_every=1)
    rec.record(confidence_raw=z[3000:], num_correct_drafts=acc[3000:])
    out, png = tmp_path / "sts.json", tmp_path / "rel.png"
    rc = main(
        [
            "calibrate",
            "--rollouts",
            str(tmp_path / "ours.jsonl"),
            str(tmp_path / "shard.*.pt"),
            "--out",
            str(out),
            "--plot",
            str(png),
            "--dataset",
            "synthetic",
        ]
    )
    assert rc == 0
    printed = capsys.readouterr().out
    assert "ECE before" in printed and "AUC" in printed
    cal = load_sts(out)
    assert cal.block_size == 3 and cal.num_samples == 6000 and cal.dataset == "synthetic"
    assert all(a < b for a, b in zip(cal.ece_after, cal.ece_before, strict=True))
    theirs = sts_sglang.load_sts_calibration_from_path(str(out))
    assert theirs.temperatures == list(cal.temperatures)
    assert imread(png).shape[:2] == (320, 960)  # one 3.2-inch panel per position at 100 dpi


def test_calibrate_reports_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "x.json"
    rc = main(["calibrate", "--rollouts", str(tmp_path / "missing.pt"), "--out", str(out)])
    assert rc == 2
    assert "rollout file not found" in capsys.readouterr().err
    assert not out.exists()
