"""``dspark-sglang``: one command, one subcommand per job.

Subcommands register themselves in ``COMMANDS`` below; each lives next to the
code it drives so this file stays a table of contents.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

# name -> (help, add_arguments(parser), run(args) -> exit code)
Command = tuple[str, Callable[[argparse.ArgumentParser], None], Callable[[argparse.Namespace], int]]


def _commands() -> dict[str, Command]:
    # Imported lazily so `--help` stays fast and a missing optional dependency
    # only breaks the subcommand that needs it.
    from dspark_sglang import commands

    return commands.registry()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dspark-sglang",
        description=(
            "DSpark speculative decoding for SGLang. A small drafter proposes a block "
            "of tokens, the target verifies them losslessly, and a hardware-aware "
            "scheduler decides per step how many to verify. Start with `demo`."
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (help_text, add_args, run) in _commands().items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        add_args(p)
        p.set_defaults(_run=run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "_run", None):
        parser.print_help()
        return 2
    return int(args._run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
