"""``dspark-sglang bench <benchmark>``: the benchmark group.

``bench acceptance`` (``cli/bench_acceptance.py``) compares drafters on the
reference generator; ``bench sim-validation`` (``cli/bench_sim_validation.py``)
checks the serving simulator against a live SGLang server on CPU. ``bench`` alone
prints the list and exits 2.
"""

from __future__ import annotations

import argparse
import sys

from dspark_sglang.cli import bench_acceptance, bench_sim_validation
from dspark_sglang.cli.base import Command, CommandListFormatter, add_command

BENCHMARKS: tuple[Command, ...] = (bench_acceptance.COMMAND, bench_sim_validation.COMMAND)


def _add_arguments(p: argparse.ArgumentParser) -> None:
    p.formatter_class = CommandListFormatter
    p.description = (
        "Benchmarks. `bench acceptance`: drafters compared on the reference generator; "
        "`bench sim-validation`: the serving simulator against a live SGLang server on CPU. "
        "Each has its own --help."
    )
    sub = p.add_subparsers(dest="benchmark", metavar="BENCHMARK")
    for benchmark in BENCHMARKS:
        add_command(sub, benchmark, run_key="_bench")
    p.set_defaults(_bench_parser=p)


def _run(args: argparse.Namespace) -> int:
    run = getattr(args, "_bench", None)
    if run is None:
        args._bench_parser.print_help(sys.stderr)
        print("\nbench: error: choose a benchmark, e.g. `bench acceptance`", file=sys.stderr)
        return 2
    return int(run(args))


COMMAND = Command(
    name="bench",
    help="Benchmarks: acceptance, sim-validation",
    description=(
        "Benchmarks: `bench acceptance` (accepted length per round of several drafters on "
        "GSM8K, HumanEval, MT-Bench) and `bench sim-validation` (simulator vs a live CPU "
        "SGLang server)."
    ),
    add_arguments=_add_arguments,
    run=_run,
)
