"""``dspark-sglang``: one command, one module per subcommand (``cli/<name>.py``).

Each module parses its flags and calls the domain package that does the work; the
modules share only ``cli/base.py``. No domain package imports this package.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from dspark_sglang.cli.base import Command, CommandListFormatter, add_command

__all__ = ["build_parser", "commands", "main"]


def commands() -> dict[str, Command]:
    """Every subcommand by name, in the order ``dspark-sglang --help`` lists them."""
    from dspark_sglang.cli import (
        bench,
        calibrate,
        demo,
        export_drafter,
        generate,
        import_drafter,
        plan,
        profile,
        simulate,
        train,
    )

    modules = (
        demo,
        generate,
        train,
        export_drafter,
        import_drafter,
        calibrate,
        profile,
        simulate,
        plan,
        bench,
    )
    return {m.COMMAND.name: m.COMMAND for m in modules}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dspark-sglang",
        description=(
            "DSpark speculative decoding for SGLang. A small drafter proposes a block "
            "of tokens, the target verifies them losslessly, and a hardware-aware "
            "scheduler decides per step how many to verify. Start with `demo`."
        ),
        formatter_class=CommandListFormatter,
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for command in commands().values():
        add_command(sub, command)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "_run", None):
        parser.print_help()
        return 2
    return int(args._run(args) or 0)
