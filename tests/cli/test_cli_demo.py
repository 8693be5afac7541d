"""``dspark-sglang demo`` / ``generate``: argument errors, and both demo engines end to end (slow).

The SGLang demo test is the README's first command at small size: SGLang's
engine on CPU, plain decoding and DSPARK_MOE with the embedded drafter under each
default verify policy (our ``prefix``, SGLang's own decision, ``mtp1``), two
prompts x 16 tokens. Its printed figures are parsed and checked against each
other (tokens / wall time = tok/s, each engine's ratio to plain, tokens / verify
rounds = accepted length); greedy outputs must be token-identical up to reported
near-ties, and the target's top-2 margins from the plain engine must line up with
its tokens.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import psutil
import pytest
from rich.console import Console

from dspark_sglang.cli import build_parser, main
from dspark_sglang.sglang_integration.cpu_dtype import choose_cpu_dtype, read_cpuinfo
from dspark_sglang.targets.smollm2 import DEFAULT_DRAFTER_DIR

_TRAINED = (DEFAULT_DRAFTER_DIR / "config.json").is_file()


def _children() -> set[int]:
    """Child processes, minus Python's multiprocessing resource tracker (started on
    first use, it serves this process until exit; not an engine process)."""
    from multiprocessing import resource_tracker

    tracker = getattr(resource_tracker._resource_tracker, "_pid", None)
    return {p.pid for p in psutil.Process().children(recursive=True)} - {tracker}


def _search(pattern: str, text: str) -> re.Match[str]:
    m = re.search(pattern, text)
    assert m is not None, f"{pattern!r} not in output:\n{text}"
    return m


def test_subcommands_are_registered() -> None:
    parser = build_parser()
    args = parser.parse_args(["demo", "--num-prompts", "2", "--policy", "mtp1"])
    assert args.num_prompts == 2 and args.policy == "mtp1" and args.temperature == 0.0
    assert args.engine == "sglang"  # the product is the default
    # Unset: the SGLang demo leads with prefix beside --compare's defaults, the
    # reference demo verifies every draft.
    assert parser.parse_args(["demo"]).policy is None
    assert parser.parse_args(["demo"]).compare is None
    assert parser.parse_args(["demo", "--compare"]).compare == []
    with pytest.raises(SystemExit):
        parser.parse_args(["generate", "--prompt", "hi", "--policy", "sglang"])  # demo only
    assert parser.parse_args(["demo", "--engine", "reference"]).engine == "reference"
    assert parser.parse_args(["demo"]).dtype == "auto"
    assert parser.parse_args(["demo", "--dtype", "bfloat16"]).dtype == "bfloat16"
    args = parser.parse_args(["generate", "--prompt", "hi", "--temperature", "0.7"])
    assert args.prompt == "hi" and args.temperature == 0.7 and args.max_new_tokens == 128
    with pytest.raises(SystemExit):
        parser.parse_args(["generate"])  # --prompt is required
    with pytest.raises(SystemExit):
        parser.parse_args(["demo", "--engine", "vllm"])
    with pytest.raises(SystemExit):
        parser.parse_args(["demo", "--dtype", "float16"])


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--temperature", "0.7"], "greedy only"),
        (["--top-p", "0.9"], "greedy only"),
        (["--num-prompts", "0"], "--num-prompts must be >= 1"),
        (["--max-new-tokens", "0"], "--max-new-tokens must be >= 1"),
        (["--threads", "0"], "--threads must be >= 1"),
        (["--passes", "0"], "--passes must be >= 1"),
        (["--concurrency", "0"], "--concurrency must be >= 1"),
        (["--cost-table", "sps.json"], "--cost-table sps.json: no such file"),
        (
            ["--policy", "sglang", "--compare", "--cost-table", "sps.json"],
            "only feeds our scheduler",
        ),
        (["--policy", "static", "--sts", "/nonexistent/sts.json"], "no such file"),
    ],
)
def test_sglang_demo_rejects_bad_flags_before_starting_anything(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    before = _children()
    rc = main(["demo", "--engine", "sglang", *argv])
    err = capsys.readouterr().err
    assert rc == 2
    assert err.startswith("demo: error: ") and message in err
    assert _children() <= before, "a flag error must not start an engine"


@pytest.mark.slow
def test_sglang_demo_rejects_a_bad_checkpoint_with_a_clear_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = _children()
    assert main(["demo", "--drafter", str(tmp_path / "missing")]) == 2
    assert "config.json is missing" in capsys.readouterr().err
    (tmp_path / "config.json").write_text("{not json")
    assert main(["demo", "--drafter", str(tmp_path)]) == 2
    assert "is not valid JSON" in capsys.readouterr().err
    assert _children() <= before, "a bad checkpoint must be refused before any engine starts"


@pytest.mark.slow
def test_sglang_demo_rejects_a_drafter_for_another_target(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A checkpoint whose config does not fit SmolLM2 fails here, not in SGLang's scheduler."""
    from dspark_sglang.sglang_integration.demo import resolve_drafter
    from dspark_sglang.targets.smollm2 import ensure_smollm2_with_status

    quiet = Console(quiet=True)
    good, trained = resolve_drafter(
        ensure_smollm2_with_status(quiet), None, tmp_path / "none", 0, tmp_path, quiet
    )
    assert not trained and (good / "model.safetensors").is_file()
    cfg = json.loads((good / "config.json").read_text())
    cfg["dspark_config"]["target_num_layers"] = 40
    (good / "config.json").write_text(json.dumps(cfg))
    assert main(["demo", "--drafter", str(good)]) == 2
    err = capsys.readouterr().err
    assert "target_num_layers=40" in err and "use a drafter trained for this target" in err


@pytest.mark.slow
@pytest.mark.sglang
def test_sglang_demo_runs_plain_and_dspark_and_reports_figures(
    capsys: pytest.CaptureFixture[str],
) -> None:
    before = _children()
    rc = main(["demo", "--num-prompts", "2", "--max-new-tokens", "16", "--passes", "2"])
    out, err = capsys.readouterr()
    # SGLang's CPU start-up warnings bury the reason in stderr; a failure quotes the rest.
    reason = [line for line in err.splitlines() if "warn" not in line.lower()]
    assert rc == 0, out + "\n".join(reason[-40:])
    assert ("UNTRAINED" in out) != _TRAINED
    labels = ("DSPARK_MOE (lagged+priced)", "DSPARK_MOE (sglang)", "DSPARK_MOE (mtp1)")
    assert "DSPARK_MOE verify policies: lagged+priced, sglang (SGLang's own decision" in out
    assert "1 request(s) in flight" in out  # the default: one request at a time
    # Every demo request is greedy, so DSPARK_MOE drafts by argmax (lossless all the same).
    assert "draft: argmax (SGLANG_DSPARK_USE_GREEDY_DRAFT=1)" in out
    dtype = choose_cpu_dtype("auto", read_cpuinfo()).dtype

    runs = {
        m["label"]: (int(m["tokens"]), float(m["wall"]), float(m["tps"]))
        for m in re.finditer(
            r"^(?P<label>plain|DSPARK_MOE \([\w+]+\)): (?P<tokens>\d+) tokens in (?P<wall>[\d.]+) "
            r"s = (?P<tps>[\d.]+) tok/s \(median of 2 timed passes; passes [\d.]+-[\d.]+ tok/s\)$",
            out,
            re.MULTILINE,
        )
    }
    assert set(runs) == {"plain", *labels}, out
    for tokens, wall, tps in runs.values():
        assert 2 <= tokens <= 32 and wall > 0
        assert tps == pytest.approx(tokens / wall, rel=1e-2, abs=0.01)
    for label in labels:
        # Identical outputs, except that in bfloat16 a prompt may diverge at a numerical
        # near-tie (its logits come in 0.125 steps), which the demo reports and passes.
        pattern = rf"{re.escape(label)}: identical output at temperature 0: (\d)/2 prompts"
        same = int(_search(pattern, out)[1])
        ties = out.count(f"{label}: NEAR-TIE: ")
        assert same == 2 or (dtype == "bfloat16" and ties == 2 - same), out
        if same == 2:
            assert runs["plain"][0] == runs[label][0]  # identical outputs, identical counts

        ratio = float(_search(rf"speed ratio {re.escape(label)} / plain: ([\d.]+)x", out)[1])
        assert ratio == pytest.approx(runs[label][2] / runs["plain"][2], rel=2e-2)

        m = _search(
            rf"{re.escape(label)}: accepted length per round \(SGLang, incl\. bonus\): "
            r"([\d.]+) over (\d+) verify rounds, (\d+) drafts accepted",
            out,
        )
        accept, rounds, accepted = float(m[1]), int(m[2]), int(m[3])
        tokens = runs[label][0]
        assert 0 < rounds <= tokens and accept == pytest.approx(tokens / rounds, abs=1e-3)
        assert accept >= 1.0 and accepted <= tokens
    assert "first answer (DSPARK_MOE (lagged+priced))" in out
    assert _children() <= before, "engine processes left behind"

    # The dtype both engines ran in, and why, as the CPU's flags decide it.
    choice = choose_cpu_dtype("auto", read_cpuinfo())
    assert re.search(rf"^{re.escape(choice.describe())}$", out, re.MULTILINE), out
    # The plain engine's top two line up with its own tokens: a margin for every
    # token, and the emitted token is the target's first choice (up to near-ties).
    m = _search(
        r"target top-2 margins \((\w+), from the plain engine\): (\d+) of (\d+) plain tokens, "
        r"(\d+) of them the target's first choice; smallest margin ([\d.e+-]+)",
        out,
    )
    assert m[1] == choice.dtype and int(m[2]) == int(m[3]) == runs["plain"][0]
    ties = 0 if choice.dtype == "float32" else int(m[2]) // 10
    assert int(m[4]) >= int(m[2]) - ties and float(m[5]) >= 0.0
    assert "MISMATCH" not in out


@pytest.mark.slow
def test_reference_demo_runs_and_reports_identical_output(
    capsys: pytest.CaptureFixture[str],
) -> None:
    rc = main(
        [
            "demo",
            "--engine",
            "reference",
            "--num-prompts",
            "1",
            "--max-new-tokens",
            "4",
            "--policy",
            "static",
        ]
    )
    out = capsys.readouterr().out
    assert rc == 0
    assert ("UNTRAINED" in out) != _TRAINED
    assert "identical output at temperature 0: 1/1 prompts" in out
    assert "position-wise conditional acceptance" in out


def test_generate_policy_needing_a_cost_table_fails_clearly(
    capsys: pytest.CaptureFixture[str],
) -> None:
    rc = main(["generate", "--prompt", "hi", "--policy", "prefix", "--max-new-tokens", "2"])
    assert rc == 2
    assert "needs --cost-table" in capsys.readouterr().err


def test_reference_demo_refuses_concurrency(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--engine", "reference", "--concurrency", "2"]) == 2
    assert "--concurrency sets the requests in flight" in capsys.readouterr().err


def test_reference_demo_refuses_passes(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--engine", "reference", "--passes", "2"]) == 2
    assert "--passes times SGLang's engines" in capsys.readouterr().err


def test_reference_demo_refuses_sglangs_decision_and_compare(
    capsys: pytest.CaptureFixture[str],
) -> None:
    for argv in (["--policy", "sglang"], ["--compare", "mtp1"]):
        assert main(["demo", "--engine", "reference", *argv]) == 2
        assert "need --engine sglang" in capsys.readouterr().err


def test_reference_demo_refuses_bfloat16(capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["demo", "--engine", "reference", "--dtype", "bfloat16"])
    assert rc == 2
    assert "--dtype bfloat16 needs --engine sglang" in capsys.readouterr().err
