"""``dspark-sglang bench acceptance`` end to end on a tiny random Llama chat target (fast).

Target, drafters and eval sets are the suite's tiny-chat fixtures (``tests/conftest.py``,
built by ``tiny_chat_target``). Covers: the JSON's settings, checkpoints, versions and
figures follow from its per-round records, the PNG, traces and rollouts readable by
their own loaders, the user's own chat file as an eval set (``--prompts``, alone with
``--eval-sets none`` or beside a built-in set, its traces named after it and read by
``calibrate``), and flag errors that name the flag. The measurement itself is tested in
``tests/bench/test_bench_acceptance.py``.
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


def _paired_gain_se(rows_a: list[list[int]], rows_b: list[list[int]]) -> float:
    """SE in % of 100 (L_a / L_b - 1), written out per request (no library code)."""

    def parts(rows: list[list[int]]) -> tuple[float, list[float]]:
        s = [sum(x + 1 for x in r) for r in rows]
        n = [len(r) for r in rows]
        mean = sum(s) / sum(n)
        return mean, [(si - mean * ni) / sum(n) for si, ni in zip(s, n, strict=True)]

    (la, ua), (lb, ub) = parts(rows_a), parts(rows_b)
    r = len(rows_a)
    var_a = r / (r - 1) * sum(x * x for x in ua)
    var_b = r / (r - 1) * sum(x * x for x in ub)
    cov = r / (r - 1) * sum(x * y for x, y in zip(ua, ub, strict=True))
    var = var_a / lb**2 + la**2 * var_b / lb**4 - 2 * la * cov / lb**3
    return 100 * max(var, 0.0) ** 0.5


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
            se = data["gains_stderr_percent"][a][b]
            for dom in data["domains"]:
                assert se[dom] == pytest.approx(
                    _paired_gain_se(
                        data["results"][a][dom]["accepted_per_round"],
                        data["results"][b][dom]["accepted_per_round"],
                    ),
                    abs=1e-9,
                )

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


def test_cli_context_copy_runs_each_drafter_twice(
    tiny_chat_dir: Path,
    tiny_drafters: dict[str, Path],
    tiny_eval_cache: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("DSPARK_CACHE_DIR", str(tiny_eval_cache))
    out, traces = tmp_path / "acc.json", tmp_path / "tr"
    argv = ["bench", "acceptance", "--target", str(tiny_chat_dir), "--num-prompts", "2"]
    argv += ["--drafter", f"dspark={tiny_drafters['dspark']}", "--context-copy", "1"]
    argv += ["--max-new-tokens", "16", "--temperature", "0", "--out", str(out)]
    assert main([*argv, "--traces-dir", str(traces)]) == 0
    printed = capsys.readouterr().out
    assert "context copies (1-gram) dspark+copy vs dspark" in printed

    data = json.loads(out.read_text())
    assert data["drafters"] == ["dspark", "dspark+copy"]
    assert data["settings"]["context_copy_ngram"] == {"dspark": 0, "dspark+copy": 1}
    assert data["command"]["context_copy"] == 1
    copied = 0
    for dom in data["domains"]:
        base, copy = data["results"]["dspark"][dom], data["results"]["dspark+copy"][dom]
        assert base["copies_reached"] == 0
        assert 0 <= copy["copies_accepted"] <= copy["copies_reached"]
        assert copy["copies_reached"] <= sum(copy["position_reached"])
        # Greedy: the same prompts emit the same tokens, however they were drafted.
        assert base["num_tokens"] == copy["num_tokens"]
        copied += copy["copies_reached"]
    assert copied > 0
    # Copy rows' confidences scored replaced drafts: no traces for them.
    assert sorted(p.name for p in traces.iterdir()) == ["dspark"]


#: Two OpenAI rows (3 prompts), a bad row, a ShareGPT row ending with a user turn.
HELD_OUT_ROWS = [
    '{"messages": [{"role": "user", "content": "Name a colour."}, '
    '{"role": "assistant", "content": "Red."}, {"role": "user", "content": "Another?"}, '
    '{"role": "assistant", "content": "Blue."}]}',
    "not json",
    '{"messages": [{"role": "user", "content": "Count to 3."}, '
    '{"role": "assistant", "content": "1 2 3"}]}',
    '{"conversations": [{"from": "human", "value": "Say hi."}]}',
]


def test_cli_own_prompts_as_an_eval_set(
    tiny_chat_dir: Path,
    tiny_drafters: dict[str, Path],
    tiny_eval_cache: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from dspark_sglang.bench.acceptance import load_prompt_file, load_proposer, measure_acceptance
    from dspark_sglang.model.discovery import resolve_checkpoint
    from dspark_sglang.targets.hf_target import HFTarget

    monkeypatch.setenv("DSPARK_CACHE_DIR", str(tiny_eval_cache))
    chats = tmp_path / "heldout.jsonl"
    chats.write_text("".join(r + "\n" for r in HELD_OUT_ROWS))
    out, traces = tmp_path / "r" / "acc.json", tmp_path / "tr"
    argv = ["bench", "acceptance", "--target", str(tiny_chat_dir)]
    argv += ["--drafter", f"dspark={tiny_drafters['dspark']}", "--max-new-tokens", "12"]
    argv += ["--prompts", f"heldout={chats}", "--eval-sets", "none"]
    argv += ["--skip-prompts", "1", "--num-prompts", "2"]
    assert main([*argv, "--out", str(out), "--traces-dir", str(traces)]) == 0
    printed = capsys.readouterr().out
    assert f"--prompts heldout: {chats}: 3 rows -> 2 prompts after the first 1" in printed
    assert "skipped not_json 1" in printed and "heldout.jsonl:2: not_json" in printed

    data = json.loads(out.read_text())
    assert data["domains"] == ["heldout"]
    cell = data["results"]["dspark"]["heldout"]
    assert cell["num_requests"] == 2
    assert data["command"]["eval_sets"] == []
    recorded = data["command"]["prompts"]["heldout"]
    assert local_path(recorded["path"]) == chats
    assert recorded["sha256"] == hashlib.sha256(chats.read_bytes()).hexdigest()
    assert (recorded["bytes"], recorded["rows"], recorded["prompts"]) == (
        chats.stat().st_size,
        3,
        2,
    )
    assert recorded["skipped"] == {"not_json": 1}
    # The decoded requests are the file's prompts 2 and 3 (row 1's second, row 3's):
    # the cell equals a direct measurement on them with the command's seed.
    target = HFTarget(tiny_chat_dir)
    own = load_prompt_file(target, "heldout", chats, 2, 12, skip=1)
    assert own.prompts[1] == tuple(target.encode_chat([{"role": "user", "content": "Count to 3."}]))
    proposer = load_proposer(resolve_checkpoint("dspark", tiny_drafters["dspark"]), target)
    direct = measure_acceptance(target, {"dspark": proposer}, {"heldout": own.prompts}, 2, 12)
    assert cell["accepted_per_round"] == [
        list(r) for r in direct.cells["dspark"]["heldout"].accepted
    ]

    # Traces and rollouts are named after the set, and calibrate reads the rollouts.
    assert sorted(p.name for p in (traces / "dspark").iterdir()) == [
        "heldout.jsonl",
        "rollouts_heldout.jsonl",
    ]
    flat = [a for r in cell["accepted_per_round"] for a in r]
    tr = load_traces(traces / "dspark" / "heldout.jsonl")
    assert tr.domains == ("heldout",) and tr.accepted.tolist() == flat
    sts = tmp_path / "sts.json"
    rollouts = str(traces / "dspark" / "rollouts_*.jsonl")
    assert main(["calibrate", "--rollouts", rollouts, "--out", str(sts)]) == 0
    assert sts.is_file()

    # Beside a built-in set (which comes first), as a second file.
    both = tmp_path / "both.json"
    argv = ["bench", "acceptance", "--target", str(tiny_chat_dir), "--max-new-tokens", "6"]
    argv += ["--drafter", f"ar={tiny_drafters['ar']}", "--num-prompts", "1"]
    argv += ["--eval-sets", "mtbench", "--prompts", f"mine={chats}", "--out", str(both)]
    assert main(argv) == 0
    data = json.loads(both.read_text())
    assert data["domains"] == ["mtbench", "mine"] and data["command"]["eval_sets"] == ["mtbench"]
    assert data["results"]["ar"]["mine"]["num_requests"] == 1


def _err(capsys: pytest.CaptureFixture[str], argv: list[str]) -> tuple[int, str]:
    try:
        rc = main(["bench", "acceptance", *argv])
    except SystemExit as exc:  # argparse's own errors
        rc = int(exc.code or 0)
    return rc, capsys.readouterr().err


def test_cli_errors_name_the_flag(
    tiny_chat_dir: Path,
    tiny_drafters: dict[str, Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    ar = f"ar={tiny_drafters['ar']}"
    chats = tmp_path / "chats.jsonl"
    chats.write_text('{"messages": [{"role": "user", "content": "Hi."}]}\n')
    bad = tmp_path / "bad.jsonl"
    bad.write_text('not json\n{"messages": [{"role": "assistant", "content": "Hi."}]}\n')
    tiny = ["--target", str(tiny_chat_dir)]
    cases = [
        ([], "--drafter"),
        (["--drafter", str(tiny_drafters["ar"])], "NAME=PATH"),
        (["--drafter", f"x={tmp_path / 'missing'}"], "does not exist"),
        (["--drafter", ar, "--drafter", ar], "given twice"),
        (["--drafter", ar, "--num-prompts", "0"], "--num-prompts must be >= 1"),
        (["--drafter", ar, "--skip-prompts", "-1"], "--skip-prompts must be >= 0"),
        (["--drafter", ar, "--eval-sets", "gsm8k,nope"], "--eval-sets"),
        (["--drafter", ar, "--temperature", "-0.5"], "--temperature must be a finite number"),
        (["--drafter", ar, "--context-copy", "-1"], "--context-copy must be an integer >= 0"),
        (["--drafter", ar, "--temperature", "nan"], "--temperature must be a finite number"),
        (["--drafter", f"x={tiny_drafters['dspark'].parent}"], "unknown drafter kind"),
        (["--drafter", f"x={tiny_drafters['ar']}", "--target", str(tmp_path / "t")], "--target"),
        (["--drafter", ar, "--eval-sets", "none"], "give at least one --prompts"),
        (["--drafter", ar, "--eval-sets", ""], "give at least one --prompts"),
        (["--drafter", ar, "--eval-sets", "none,gsm8k"], "or none to run only"),
        (["--drafter", ar, "--prompts", str(chats)], "expected NAME=FILE"),
        (["--drafter", ar, "--prompts", f"my/set={chats}"], "NAME must be letters"),
        (["--drafter", ar, "--prompts", f"gsm8k={chats}"], "is taken"),
        (["--drafter", ar, "--prompts", f"macro={chats}"], "is taken"),
        (["--drafter", ar, "--prompts", f"rollouts_x={chats}"], "is taken"),
        (["--drafter", ar, "--prompts", f"a={chats}", "--prompts", f"a={chats}"], "given twice"),
        (["--drafter", ar, "--prompts", f"a={tmp_path / 'no.jsonl'}"], "is not a file"),
        (["--drafter", ar, *tiny, "--prompts", f"a={bad}"], "--prompts a: "),
        (["--drafter", ar, *tiny, "--prompts", f"a={bad}"], "gave no usable prompt"),
    ]
    for argv, needle in cases:
        rc, err = _err(capsys, argv)
        assert rc == 2, (argv, err)
        assert needle in err, (argv, err)


def test_bench_without_benchmark_prints_help(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench"]) == 2
    assert "acceptance" in capsys.readouterr().err
