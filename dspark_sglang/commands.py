"""Registry of CLI subcommands (see ``cli.py``)."""

from __future__ import annotations

from dspark_sglang.cli import Command


def registry() -> dict[str, Command]:
    cmds: dict[str, Command] = {}
    from dspark_sglang.profiling import cli as profiling_cli

    cmds.update(profiling_cli.COMMANDS)
    from dspark_sglang.calibration import cli as calibration_cli

    cmds.update(calibration_cli.COMMANDS)
    from dspark_sglang.reference import cli as reference_cli

    cmds.update(reference_cli.COMMANDS)
    from dspark_sglang.planning import cli as planning_cli

    cmds.update(planning_cli.COMMANDS)
    from dspark_sglang.training import cli as training_cli

    cmds.update(training_cli.COMMANDS)
    from dspark_sglang.bench import cli as bench_cli

    cmds.update(bench_cli.COMMANDS)
    return cmds
