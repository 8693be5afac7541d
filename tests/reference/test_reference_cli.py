"""``dspark-sglang demo`` / ``generate`` end to end on SmolLM2 (slow) and argument errors."""

from __future__ import annotations

import pytest

from dspark_sglang.cli import build_parser, main


def test_subcommands_are_registered() -> None:
    parser = build_parser()
    args = parser.parse_args(["demo", "--num-prompts", "2", "--policy", "mtp1"])
    assert args.num_prompts == 2 and args.policy == "mtp1" and args.temperature == 0.0
    args = parser.parse_args(["generate", "--prompt", "hi", "--temperature", "0.7"])
    assert args.prompt == "hi" and args.temperature == 0.7 and args.max_new_tokens == 128
    with pytest.raises(SystemExit):
        parser.parse_args(["generate"])  # --prompt is required


@pytest.mark.slow
def test_demo_runs_and_reports_identical_output(capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["demo", "--num-prompts", "1", "--max-new-tokens", "4", "--policy", "static"])
    out = capsys.readouterr().out
    assert rc == 0
    assert "UNTRAINED" in out
    assert "identical output at temperature 0: 1/1 prompts" in out
    assert "position-wise conditional acceptance" in out


def test_generate_policy_needing_a_cost_table_fails_clearly(
    capsys: pytest.CaptureFixture[str],
) -> None:
    rc = main(["generate", "--prompt", "hi", "--policy", "prefix", "--max-new-tokens", "2"])
    assert rc == 2
    assert "needs --cost-table" in capsys.readouterr().err
