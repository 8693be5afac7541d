"""``dspark-sglang bench acceptance`` end to end on a tiny random Llama chat target (fast).

Target, drafters and eval sets are the suite's tiny-chat fixtures (``tests/conftest.py``,
built by ``tiny_chat_target``). Covers: the JSON's settings, checkpoints, versions and
figures follow from its per-round records, the PNG, traces and rollouts readable by
their own loaders, and flag errors that name the flag. The measurement itself is tested
in ``tests/bench/test_bench_acceptance.py``.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import torch
from tiny_chat_target import B

from dspark_sglang.calibration.rollouts import load_rollouts
from dspark_sglang.cli import main
from dspark_sglang.planning.traces import load_traces
from dspark_sglang.results import local_path

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_cli_end_to_end(
    tiny_chat_dir: Path,
    tiny_drafters: dict[str, Path],
    tiny_eval_cache: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("DSPARK_CACHE_DIR", str(tiny_eval_cache))
    out, plot, traces = tmp_path / "r" / "acc.json", tmp_path / "r" / "acc.png", tmp_path / "tr"
    argv = ["bench", "acceptance", "--target", str(tiny_chat_dir), "--num-prompts", "2"]
    for name in ("dspark", "dflash", "ar"):
        argv += ["--drafter", f"{name}={tiny_drafters[name]}"]
    argv += ["--max-new-tokens", "12", "--seed", "5", "--out", str(out), "--plot", str(plot)]
    assert main([*argv, "--traces-dir", str(traces)]) == 0

    data = json.loads(out.read_text())
    assert data["drafters"] == ["dspark", "dflash", "ar"]
    assert data["domains"] == ["gsm8k", "humaneval", "mtbench"]
    assert data["settings"]["temperature"] == 1.0 and data["settings"]["policy"] == "verify_all"
    assert data["command"]["temperature"] == 1.0
    assert {k: v["kind"] for k, v in data["checkpoints"].items()} == {
        "dspark": "dspark",
        "dflash": "dflash",
        "ar": "ar",
    }
    for c in data["checkpoints"].values():
        stored = local_path(c["config_file"]).read_bytes()
        assert c["config_sha256"] == hashlib.sha256(stored).hexdigest()
    assert set(data["versions"]) >= {"torch", "transformers"}
    assert data["versions"]["torch"] == torch.__version__

    for name in data["drafters"]:
        lengths = []
        for dom in data["domains"]:
            cell = data["results"][name][dom]
            rounds = cell["accepted_per_round"]
            flat = [a for r in rounds for a in r]
            assert len(rounds) == cell["num_requests"] == 2
            assert cell["accept_length"] == pytest.approx(sum(a + 1 for a in flat) / len(flat))
            # Every draft verified: reached k iff accepted >= k, accepted k iff accepted > k.
            assert cell["position_reached"] == [sum(a >= k for a in flat) for k in range(B)]
            assert cell["position_accepted"] == [sum(a > k for a in flat) for k in range(B)]
            lengths.append(cell["accept_length"])
        assert data["macro"][name]["accept_length"] == pytest.approx(sum(lengths) / len(lengths))
    for a in data["drafters"]:
        for b in data["drafters"]:
            if a == b:
                continue
            g = data["gains_percent"][a][b]
            for dom in data["domains"]:
                la = data["results"][a][dom]["accept_length"]
                lb = data["results"][b][dom]["accept_length"]
                assert g[dom] == pytest.approx(100 * (la / lb - 1))
            ma, mb = data["macro"][a]["accept_length"], data["macro"][b]["accept_length"]
            assert g["macro"] == pytest.approx(100 * (ma / mb - 1))

    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and plot.stat().st_size > 10_000

    # Traces and rollouts only for the drafter with a confidence head.
    assert sorted(p.name for p in traces.iterdir()) == ["dspark"]
    for dom in data["domains"]:
        rounds = data["results"]["dspark"][dom]["accepted_per_round"]
        flat = [a for r in rounds for a in r]
        tr = load_traces(traces / "dspark" / f"{dom}.jsonl")
        assert tr.domains == (dom,) and tr.block_size == B
        assert tr.accepted.tolist() == flat
        assert tr.request_id.tolist() == [i for i, r in enumerate(rounds) for _ in r]
        ro = load_rollouts([traces / "dspark" / f"rollouts_{dom}.jsonl"])
        assert ro.accepted.tolist() == flat
        assert ro.verified is not None and set(ro.verified.tolist()) == {B}
        assert torch.equal(ro.confidence_logits, tr.confidence_logits)


def _err(capsys: pytest.CaptureFixture[str], argv: list[str]) -> tuple[int, str]:
    try:
        rc = main(["bench", "acceptance", *argv])
    except SystemExit as exc:  # argparse's own errors
        rc = int(exc.code or 0)
    return rc, capsys.readouterr().err


def test_cli_errors_name_the_flag(
    tiny_drafters: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ar = f"ar={tiny_drafters['ar']}"
    cases = [
        ([], "--drafter"),
        (["--drafter", str(tiny_drafters["ar"])], "NAME=PATH"),
        (["--drafter", f"x={tmp_path / 'missing'}"], "does not exist"),
        (["--drafter", ar, "--drafter", ar], "given twice"),
        (["--drafter", ar, "--num-prompts", "0"], "--num-prompts must be >= 1"),
        (["--drafter", ar, "--skip-prompts", "-1"], "--skip-prompts must be >= 0"),
        (["--drafter", ar, "--eval-sets", "gsm8k,nope"], "--eval-sets"),
        (["--drafter", ar, "--temperature", "-0.5"], "--temperature must be a finite number"),
        (["--drafter", ar, "--temperature", "nan"], "--temperature must be a finite number"),
        (["--drafter", f"x={tiny_drafters['dspark'].parent}"], "unknown drafter kind"),
        (["--drafter", f"x={tiny_drafters['ar']}", "--target", str(tmp_path / "t")], "--target"),
    ]
    for argv, needle in cases:
        rc, err = _err(capsys, argv)
        assert rc == 2, (argv, err)
        assert needle in err, (argv, err)


def test_bench_without_benchmark_prints_help(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench"]) == 2
    assert "acceptance" in capsys.readouterr().err
