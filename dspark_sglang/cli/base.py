"""What every ``dspark-sglang`` subcommand module provides, and the flags several share.

A subcommand module ``cli/<name>.py`` defines ``COMMAND``: its name, a one-line
help for ``dspark-sglang --help``, the function that adds its flags and the one that
runs it (an exit code: 0 ok, 2 unusable input). Modules import their domain code
inside ``run`` so ``--help`` stays fast and a missing optional dependency breaks only
the subcommand that needs it.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dspark_sglang.model.context_copy import DEFAULT_NGRAM, default_ngram
from dspark_sglang.scheduling.config import POLICIES, check_ngram

__all__ = [
    "Command",
    "CommandListFormatter",
    "RawDefaultsHelpFormatter",
    "UsageError",
    "add_command",
    "add_decoding_arguments",
    "add_planning_arguments",
    "csv_numbers",
    "decoding_options",
    "seconds_arg",
]


@dataclass(frozen=True)
class Command:
    """One subcommand (or one benchmark of the ``bench`` group)."""

    name: str
    #: One line: the command's row in its parent's ``--help``.
    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]
    #: The text atop ``dspark-sglang <name> --help`` (default: ``help``).
    description: str | None = None
    epilog: str | None = None
    formatter_class: type[argparse.HelpFormatter] = argparse.HelpFormatter


def add_command(sub: Any, command: Command, run_key: str = "_run") -> argparse.ArgumentParser:
    """Add ``command`` to the subparsers ``sub``; ``args.<run_key>`` becomes its ``run``."""
    p = sub.add_parser(
        command.name,
        help=command.help,
        description=command.description or command.help,
        epilog=command.epilog,
        formatter_class=command.formatter_class,
    )
    command.add_arguments(p)
    p.set_defaults(**{run_key: command.run})
    return p


class CommandListFormatter(argparse.HelpFormatter):
    """Keeps every subcommand's help on its own row of the list.

    argparse sizes the help column without the rows' extra indent, so a long name
    (``export-drafter``) would push its help onto the next line.
    """

    def add_argument(self, action: argparse.Action) -> None:
        super().add_argument(action)
        subactions = getattr(action, "_get_subactions", list)()
        if action.help is not argparse.SUPPRESS and subactions:
            longest = max(len(self._format_action_invocation(a)) for a in subactions)
            indent = self._current_indent + self._indent_increment
            self._action_max_length = max(self._action_max_length, longest + indent)


class RawDefaultsHelpFormatter(
    argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter
):
    """Keep a hand-wrapped description/epilog and show every default."""


class UsageError(ValueError):
    """Bad command-line input; the message names the flag and the fix."""


class _Joined(str):
    """A value a ``CommaJoin`` flag set on the command line (a repeat extends it; the
    default it replaced is never extended)."""


class CommaJoin(argparse.Action):
    """A comma-separated list flag that may also be repeated: ``--x a --x b,c`` reads as
    ``--x a,b,c``, where argparse's own ``store`` would keep only the last one."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        current = getattr(namespace, self.dest, None)
        text = str(values)
        if isinstance(current, _Joined) and current:
            text = f"{current},{text}" if text else str(current)
        setattr(namespace, self.dest, _Joined(text))


def csv_numbers(text: str, kind: type) -> list:  # type: ignore[type-arg]
    """``"1,2,4"`` -> ``[1, 2, 4]`` (``kind`` converts each); a ValueError names the text."""
    try:
        return [kind(x) for x in text.split(",") if x.strip()]
    except ValueError as exc:
        raise ValueError(f"expected comma-separated numbers, got {text!r}") from exc


def seconds_arg(text: str) -> float:
    """An argparse ``type``: a finite number of seconds >= 0 (argparse names the flag)."""
    try:
        v = float(text)
    except ValueError:
        v = math.nan
    if not math.isfinite(v) or v < 0:
        raise argparse.ArgumentTypeError(
            f"expected a finite number of seconds >= 0, e.g. 0.012, got {text!r}"
        )
    return v


# --------------------------------------------------------------------------- demo, generate


def add_decoding_arguments(
    p: argparse.ArgumentParser,
    *,
    max_new_tokens: int,
    policy_help: str = "scheduling policy (default: verify_all)",
    extra_policies: tuple[str, ...] = (),
) -> None:
    """Drafter, policy and sampling flags of ``demo`` and ``generate``.

    ``extra_policies`` are names ``--policy`` takes beside ``POLICIES`` (the demo's
    ``sglang``, SGLang's own decision); ``policy_help`` says what the default is.
    """
    p.add_argument("--drafter", type=Path, default=None, help="drafter checkpoint folder")
    p.add_argument("--policy", choices=(*extra_policies, *POLICIES), default=None, help=policy_help)
    p.add_argument("--static-k", type=int, default=3, help="drafts verified by --policy static")
    p.add_argument(
        "--cost-table",
        type=Path,
        default=None,
        help="SPS cost table JSON for prefix/lagged (required by the reference generator; "
        "SGLang's engine measures one at start-up when it is not given)",
    )
    p.add_argument("--sts", type=Path, default=None, help="STS calibration JSON")
    p.add_argument(
        "--context-copy",
        type=context_copy_ngram,
        default=None,
        metavar="N",
        help="context copies: where the last N tokens of a request occurred before in its "
        "text, draft the token that followed them then instead of the drafter's (lossless; "
        "pays where replies repeat their prompt or themselves); 0 = off. Default: "
        f"{DEFAULT_NGRAM} at temperature 0, off when sampling (a sampled copy is accepted "
        "with the target's probability of it, which can be less than the drafter's sample "
        "gets). With --engine sglang it is part of every DSPARK_MOE policy's scheduler config",
    )
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    p.add_argument("--top-k", type=int, default=-1)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--max-new-tokens", type=int, default=max_new_tokens)
    p.add_argument("--seed", type=int, default=0, help="sampling and untrained-drafter seed")
    p.add_argument(
        "--threads",
        type=int,
        default=None,
        help="CPU threads: torch threads of the reference (default 2), OpenMP threads per "
        "SGLang scheduler process (default 1: faster on a shared 2-core machine)",
    )


def context_copy_ngram(value: str) -> int:
    """``--context-copy``: an integer >= 0 (``scheduling.config.check_ngram``)."""
    n: object
    try:
        n = int(value)
    except ValueError:
        n = value
    try:
        return check_ngram(n, "--context-copy")
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def resolve_context_copy(args: argparse.Namespace) -> int:
    """``--context-copy``, or its default for the run's temperature (on when greedy)."""
    n = getattr(args, "context_copy", None)
    return default_ngram(float(args.temperature) == 0.0) if n is None else int(n)


def decoding_options(args: argparse.Namespace) -> dict[str, Any]:
    """The ``add_decoding_arguments`` flags as ``reference.demo.build_generator`` keywords."""
    keys = (
        "drafter",
        "policy",
        "static_k",
        "cost_table",
        "sts",
        "temperature",
        "top_k",
        "top_p",
    )
    return {k: getattr(args, k) for k in (*keys, "seed", "threads")} | {
        "context_copy": resolve_context_copy(args)
    }


# --------------------------------------------------------------------------- simulate, plan


def add_planning_arguments(p: argparse.ArgumentParser) -> None:
    """The inputs ``simulate`` and ``plan`` read (``planning.inputs.load_inputs``)."""
    p.add_argument(
        "--profile", required=True, type=Path, help="SGLang SPS cost-table JSON (the profiler's)"
    )
    p.add_argument(
        "--traces",
        required=True,
        nargs="+",
        help="acceptance trace files (.jsonl/.pt, see planning/traces.py; several are joined, "
        "e.g. the per-domain files `bench acceptance --traces-dir` writes), or "
        "'synthetic[:B]' for a built-in synthetic set (high acceptance, block B, default 7)",
    )
    p.add_argument("--sts", type=Path, default=None, help="STS calibration JSON (default: T=1)")
    p.add_argument(
        "--lengths",
        type=Path,
        default=None,
        help="request lengths .jsonl ({prompt_tokens, output_tokens}); default GSM8K chars/4",
    )
    p.add_argument(
        "--prefill",
        choices=("separate", "mixed", "none"),
        default="separate",
        help="prefill model (default separate: prefill-only steps, SGLang's default)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--draft-step-seconds",
        type=seconds_arg,
        default=None,
        metavar="S",
        help="seconds of one draft pass: added to every decode step's time (the table times "
        "the target alone; the engine drafts every decode step, whatever the policy then "
        "verifies) and to the table prefix/lagged decide with, as the scheduler config's "
        "draft_step_seconds does; plan also writes it onto the prefix/lagged tiers it "
        "plans. Without it plan takes each tier's scheduler.draftStepSeconds from "
        "--base-values; else the draft is not modelled (0 s), which overstates "
        "speculation where it is a large share of a step (a CPU)",
    )
    p.add_argument(
        "--draft-decision",
        choices=("priced", "always"),
        default="priced",
        help="priced (default, what the chart's default tiers run): prefix and lagged draft "
        "only on steps where a drafting round is priced above a plain decode step, from "
        "earlier rounds' confidences and outcomes, with probes; a plain step costs the "
        "table's 1-token-per-request forward and no draft pass. always: every decode step "
        "drafts (other policies always draft)",
    )
    p.add_argument(
        "--probe-every",
        type=int,
        default=None,
        metavar="K",
        help="with --draft-decision priced: plain steps in a row before a probe drafts "
        "(doubled, up to 8x, while probes find no gain; default 8, the chart's)",
    )


def probe_every(args: argparse.Namespace) -> int | None:
    """``--probe-every`` (only with ``--draft-decision priced``), else None (the default)."""
    if args.probe_every is None:
        return None
    if args.draft_decision != "priced":
        raise ValueError("--probe-every is read only with --draft-decision priced; drop it")
    if args.probe_every < 1:
        got = args.probe_every
        raise ValueError(f"--probe-every must be >= 1 (plain steps in a row), got {got}")
    return int(args.probe_every)


def resolve_outputs(args: argparse.Namespace, benchmark: str) -> None:
    """``--out`` defaults to ``<benchmark>.json`` in a fresh run folder, ``--plot`` beside it."""
    from dspark_sglang.results import default_out

    if args.out is None:
        args.out = default_out(benchmark, f"{benchmark}.json")
    if args.plot is None:
        args.plot = args.out.with_suffix(".png")
