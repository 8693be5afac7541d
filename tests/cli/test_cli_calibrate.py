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
    assert "ECE before" in printed and "AUC before" in printed and "AUC after" in printed
    # The runbook's check (recalibrate-sts.md): AUC after equals AUC before per position.
    rows = table_rows(printed)
    assert [r["pos"] for r in rows] == [1, 2, 3]
    assert all(r["auc_before"] == r["auc_after"] and 0.5 < r["auc_before"] < 1 for r in rows)
    cal = load_sts(out)
    assert cal.block_size == 3 and cal.num_samples == 6000 and cal.dataset == "synthetic"
    assert all(a < b for a, b in zip(cal.ece_after, cal.ece_before, strict=True))
    theirs = sts_sglang.load_sts_calibration_from_path(str(out))
    assert theirs.temperatures == list(cal.temperatures)
    assert imread(png).shape[:2] == (320, 960)  # one 3.2-inch panel per position at 100 dpi


def table_rows(printed: str) -> list[dict[str, float]]:
    """Rows of the first per-position table `calibrate` printed."""
    lines = printed.splitlines()
    start = next(i for i, line in enumerate(lines) if line.split()[:2] == ["pos", "T"]) + 1
    rows = []
    for line in lines[start:]:
        cells = line.split()
        if not cells or not cells[0].isdigit():
            break
        pos, t, _eb, _ea, ab, aa, n = cells
        rows.append(
            {
                "pos": int(pos),
                "t": float(t),
                "auc_before": float(ab),
                "auc_after": float(aa),
                "n": int(n),
            }
        )
    return rows


def test_calibrate_auc_after_shows_order_lost_to_saturated_confidences(
    synthetic, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A tiny temperature pushes float32 confidences to exactly 1.0: AUC after drops."""
    z, acc, _ = synthetic(4_000, [0.5, 2.0, 1.0], 41)
    save_rollouts(tmp_path / "r.jsonl", Rollouts(z.float(), acc))
    out, report = tmp_path / "sts.json", tmp_path / "report.json"
    args = ["calibrate", "--rollouts", str(tmp_path / "r.jsonl"), "--out", str(out)]
    rc = main([*args, "--report", str(report), "--grid-min", "1e-4", "--grid-max", "2e-4"])
    assert rc == 0
    rows = table_rows(capsys.readouterr().out)
    assert all(r["t"] < 1e-3 for r in rows)
    assert all(r["auc_after"] < r["auc_before"] - 0.05 for r in rows), rows
    fit = json.loads(report.read_text())["fit"]
    assert len(fit["auc_after"]) == 3
    assert all(a < b for a, b in zip(fit["auc_after"], fit["auc"], strict=True))


def test_calibrate_reads_bench_rollouts_and_names_the_file_a_trace_should_be(
    synthetic, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`bench acceptance --traces-dir` writes <set>.jsonl (planner traces) beside
    rollouts_<set>.jsonl: the runbook feeds the second; the first is refused, naming it."""
    import torch

    from dspark_sglang.planning.traces import AcceptanceTraces, save_traces

    z, acc, _ = synthetic(3_000, [0.5, 2.0, 1.0], 51)
    rid = torch.arange(3_000) // 10
    # What bench.acceptance.write_traces writes for one drafter and eval set.
    save_traces(
        AcceptanceTraces(
            request_id=rid,
            domain_index=torch.zeros_like(rid),
            domains=("gsm8k",),
            confidence_logits=z.float(),
            accepted=acc,
        ),
        tmp_path / "gsm8k.jsonl",
    )
    save_rollouts(
        tmp_path / "rollouts_gsm8k.jsonl", Rollouts(z.float(), acc, torch.full_like(acc, 3))
    )
    out = tmp_path / "sts.json"
    rc = main(["calibrate", "--rollouts", str(tmp_path / "gsm8k.jsonl"), "--out", str(out)])
    assert rc == 2
    err = capsys.readouterr().err
    assert "unknown field `request_id`" in err and "rollouts_<set>.jsonl" in err
    assert not out.exists()
    rc = main(
        ["calibrate", "--rollouts", str(tmp_path / "rollouts_gsm8k.jsonl"), "--out", str(out)]
    )
    assert rc == 0 and load_sts(out).block_size == 3


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
    assert held["auc_after"] == pytest.approx(held["auc"], abs=1e-5)  # float32 ties
    assert rep["fit"]["auc_after"] == pytest.approx(rep["fit"]["auc"], abs=1e-5)
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
