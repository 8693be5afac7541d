"""A list flag given twice keeps both: ``--tier 10=a --tier 5=b`` is ``--tier 10=a,5=b``.

argparse's own ``store`` keeps only the last occurrence, which silently dropped a tier and
failed the plan on it later; ``cli.base.CommaJoin`` joins the occurrences instead, and a
default is replaced, never extended."""

from __future__ import annotations

import pytest

from dspark_sglang.cli import build_parser


def _args(*argv: str):
    return build_parser().parse_args(list(argv))


def test_repeated_plan_flags_are_joined() -> None:
    args = _args(
        "plan",
        "--profile",
        "p.json",
        "--traces",
        "t.jsonl",
        "--sla",
        "5",
        "--sla",
        "10,20",
        "--tier",
        "10=interactive",
        "--tier",
        "5=standard",
        "--users",
        "interactive=8",
        "--users",
        "standard=4",
    )
    assert (args.sla, args.tier, args.users) == (
        "5,10,20",
        "10=interactive,5=standard",
        "interactive=8,standard=4",
    )


@pytest.mark.parametrize(
    ("argv", "policy"),
    [
        ((), "lagged"),  # the default
        (("--policy", "prefix"), "prefix"),  # replaces the default
        (("--policy", "prefix", "--policy", "mtp1"), "prefix,mtp1"),  # extends a given value
        (("--policy", "lagged", "--policy", "lagged:3"), "lagged,lagged:3"),
    ],
)
def test_a_repeated_flag_extends_what_was_given_never_the_default(
    argv: tuple[str, ...], policy: str
) -> None:
    args = _args(
        "simulate", "--profile", "p.json", "--traces", "t.jsonl", "--concurrency", "1", *argv
    )
    assert args.policy == policy
