"""docs/train-your-own-target.md: its config loads and every command parses with the real parsers.

The steps themselves run in ``test_cli_train_own_target.py`` on tiny targets, from the
page's own shell blocks (``tests/own_target_guide.py``); this test keeps the page from
drifting without running anything: the YAML block is a valid training config (every key
known, every value valid), and each shell line is parsed by ``dspark-sglang``'s own parser
with prefix matching off (a renamed flag fails), for ``torchrun`` by torch's launcher parser
and then ours for the module's arguments, and for ``helm template`` against the chart (its
path, and every ``--set`` key a key of the chart's values), and every ``/data/`` file the
page reads is one the tests provide (``own_target_guide.DATA_FILES``).
"""

from __future__ import annotations

import shlex

import yaml
from cli_parsing import strict
from own_target_guide import (
    CHART,
    DATA_FILES,
    ROOT,
    guide_blocks,
    guide_commands,
    page_data_paths,
)

from dspark_sglang.cli import build_parser
from dspark_sglang.training.config import TrainConfig


def test_the_guides_config_is_a_valid_training_config() -> None:
    ((section, block),) = guide_blocks("yaml")
    assert section == 1
    cfg = TrainConfig.from_dict(yaml.safe_load(block))
    assert cfg.data.generator == "sglang"
    assert cfg.drafter.model["draft_vocab_size"] == 32768


def _check_helm_template(argv: list[str]) -> None:
    assert argv[:2] == ["helm", "template"], argv
    assert (ROOT / argv[3]).resolve() == CHART, argv
    defaults = yaml.safe_load((CHART / "values.yaml").read_text())
    for i, arg in enumerate(argv):
        if arg == "--set":
            key, _, _ = argv[i + 1].partition("=")
            node = defaults
            for part in key.split("."):
                assert isinstance(node, dict) and part in node, f"--set {key}: not a chart value"
                node = node[part]


def test_every_command_on_the_guide_parses() -> None:
    from torch.distributed.run import get_args_parser

    commands = guide_commands()
    ours = strict(build_parser())
    seen = []
    for section, line in commands:
        argv = shlex.split(line)
        if ">" in argv:  # a redirection: the shell's, not the program's
            argv = argv[: argv.index(">")]
        if argv[0] == "dspark-sglang":
            ours.parse_args(argv[1:])
            seen.append((section, " ".join(argv[1:3]) if argv[1] == "bench" else argv[1]))
        elif argv[0] == "helm":
            _check_helm_template(argv)
            seen.append((section, "helm template"))
        else:
            assert argv[0] == "torchrun", line
            launcher = get_args_parser()
            launcher.allow_abbrev = False
            run = launcher.parse_args(argv[1:])
            assert run.module and run.training_script == "dspark_sglang.cli", line
            ours.parse_args(run.training_script_args)
            seen.append((section, "torchrun"))
    assert seen == [
        (2, "train"),
        (3, "torchrun"),
        (4, "export-drafter"),
        (5, "bench acceptance"),
        (5, "bench acceptance"),
        (5, "calibrate"),
        (5, "export-drafter"),
        (6, "profile"),
        (7, "plan"),
        (8, "helm template"),
    ]


def test_the_tests_provide_every_data_file_the_guide_reads() -> None:
    assert page_data_paths() == set(DATA_FILES)
    for source in DATA_FILES.values():
        assert source.is_file() and source.read_text().strip(), source


def test_the_calibration_runs_decode_the_held_out_chats_only() -> None:
    runs = [shlex.split(c) for s, c in guide_commands() if s == 5 and "acceptance" in c]
    assert len(runs) == 2
    for argv in runs:
        assert argv[argv.index("--prompts") + 1] == "heldout=/data/heldout.jsonl"
        assert argv[argv.index("--eval-sets") + 1] == "none"
