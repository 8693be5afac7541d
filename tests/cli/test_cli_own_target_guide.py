"""docs/train-your-own-target.md: its config loads and every command parses with the real parsers.

The steps themselves run in ``test_cli_train_own_target.py`` on tiny targets; this test
keeps the page from drifting: the YAML block is a valid training config (every key known,
every value valid), and each shell line is parsed by ``dspark-sglang``'s own parser with
prefix matching off (a renamed flag fails) or, for ``torchrun``, by torch's launcher
parser and then ours for the module's arguments.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import yaml
from cli_parsing import strict

from dspark_sglang.cli import build_parser
from dspark_sglang.training.config import TrainConfig

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "train-your-own-target.md"
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)


def _blocks(lang: str) -> list[str]:
    return [body for tag, body in FENCE.findall(GUIDE.read_text()) if tag == lang]


def test_the_guides_config_is_a_valid_training_config() -> None:
    (block,) = _blocks("yaml")
    cfg = TrainConfig.from_dict(yaml.safe_load(block))
    assert cfg.data.generator == "sglang"
    assert cfg.drafter.model["draft_vocab_size"] == 32768


def test_every_command_on_the_guide_parses() -> None:
    from torch.distributed.run import get_args_parser

    commands = [line for block in _blocks("bash") for line in block.splitlines() if line.strip()]
    assert len(commands) == 3
    ours = strict(build_parser())
    seen = set()
    for line in commands:
        argv = shlex.split(line)
        if argv[0] == "dspark-sglang":
            ours.parse_args(argv[1:])
        else:
            assert argv[0] == "torchrun", line
            launcher = get_args_parser()
            launcher.allow_abbrev = False
            run = launcher.parse_args(argv[1:])
            assert run.module and run.training_script == "dspark_sglang.cli", line
            ours.parse_args(run.training_script_args)
        seen.add(argv[1] if argv[0] == "dspark-sglang" else "torchrun")
    assert seen == {"train", "torchrun", "export-drafter"}
