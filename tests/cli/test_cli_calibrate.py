"""`dspark-sglang calibrate` end to end."""

from __future__ import annotations

import json
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


def test_calibrate_scores_temperatures_on_held_out_rounds(
    synthetic, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Fit and held-out splits drawn independently from the same miscalibrated head.
    z_fit, acc_fit, _ = synthetic(6_000, [0.5, 2.0, 1.0], 31)
    z_eval, acc_eval, _ = synthetic(6_000, [0.5, 2.0, 1.0], 32)
    save_rollouts(tmp_path / "fit.jsonl", Rollouts(z_fit.float(), acc_fit))
    save_rollouts(tmp_path / "eval.jsonl", Rollouts(z_eval.float(), acc_eval))
    out, report, png = tmp_path / "sts.json", tmp_path / "report.json", tmp_path / "rel.png"
    rc = main(
        [
            "calibrate",
            "--rollouts",
            str(tmp_path / "fit.jsonl"),
            "--eval-rollouts",
            str(tmp_path / "eval.jsonl"),
            "--out",
            str(out),
            "--report",
            str(report),
            "--plot",
            str(png),
        ]
    )
    assert rc == 0
    assert "held-out mean ECE" in capsys.readouterr().out
    rep = json.loads(report.read_text())
    held = rep["held_out"]
    assert held["num_samples"] == 6000 and len(held["ece_after"]) == 3
    # Temperatures fitted elsewhere still fix the miscalibrated positions out of sample
    # (6000 rounds: sampling noise in ECE is ~0.01; the miscalibration is ~0.1).
    assert held["mean_ece_after"] < held["mean_ece_before"] - 0.03
    assert held["mean_ece_after"] < 0.03
    assert rep["temperatures"] == list(load_sts(out).temperatures)
    assert imread(png).shape[:2] == (320, 960)


def test_calibrate_refuses_held_out_rounds_of_another_block_size(
    synthetic, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    z3, a3, _ = synthetic(500, [1.0, 1.0, 1.0], 1)
    z2, a2, _ = synthetic(500, [1.0, 1.0], 2)
    save_rollouts(tmp_path / "fit.jsonl", Rollouts(z3.float(), a3))
    save_rollouts(tmp_path / "eval.jsonl", Rollouts(z2.float(), a2))
    out = tmp_path / "sts.json"
    args = ["calibrate", "--rollouts", str(tmp_path / "fit.jsonl"), "--out", str(out)]
    rc = main([*args, "--eval-rollouts", str(tmp_path / "eval.jsonl")])
    assert rc == 2
    assert "--eval-rollouts have block size 2" in capsys.readouterr().err
    assert not out.exists()
