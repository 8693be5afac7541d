"""Registry of CLI subcommands (see ``cli.py``)."""

from __future__ import annotations

from dspark_sglang.cli import Command


def registry() -> dict[str, Command]:
    cmds: dict[str, Command] = {}
    from dspark_sglang.calibration import cli as calibration_cli

    cmds.update(calibration_cli.COMMANDS)
    from dspark_sglang.planning import cli as planning_cli

    cmds.update(planning_cli.COMMANDS)
    return cmds
