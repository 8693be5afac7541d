"""The CLI's parser as documentation is checked against it: no prefix matching."""

from __future__ import annotations

import argparse


def strict(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """``parser`` and its subparsers without prefix matching: argparse would take a page's
    ``--base-values`` for a renamed ``--base-values-file``; docs must spell flags in full."""
    parser.allow_abbrev = False
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                strict(sub)
    return parser
