"""``dspark-sglang demo``: SmolLM2-135M with plain and DSpark speculative decoding side by side.

The first command a new user runs. ``--engine sglang`` (the default) starts SGLang's
engine on CPU for plain decoding and once per verify policy with our drafter behind
``--speculative-algorithm DSPARK_MOE`` (``sglang_integration/demo.py``: ``--policy``,
by default our ``prefix`` scheduler, beside ``--compare``, by default SGLang's own
decision and ``mtp1``); ``--engine reference`` runs the
pure-PyTorch reference generator instead (``reference/demo.py``), which also prints
the position-wise acceptance. Both print tokens, speed, acceptance and, at
temperature 0, whether the outputs are token-identical. Without ``--drafter`` the
trained drafter shipped in the package is used; without one, an untrained seeded
drafter, and the demo says so.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from dspark_sglang.cli.base import (
    Command,
    add_decoding_arguments,
    decoding_options,
    resolve_context_copy,
)
from dspark_sglang.sglang_integration.cpu_dtype import DTYPE_CHOICES
from dspark_sglang.sglang_integration.demo import (
    DEFAULT_COMPARE,
    DEFAULT_POLICY,
    ENGINE_POLICIES,
    PRICED_SUFFIX,
)
from dspark_sglang.sglang_integration.launch import SGLANG_DECISION


def _add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--engine",
        choices=("sglang", "reference"),
        default="sglang",
        help="sglang: SGLang's engine on CPU, plain vs --speculative-algorithm DSPARK_MOE "
        "(default); reference: the pure-PyTorch reference generator",
    )
    add_decoding_arguments(
        p,
        max_new_tokens=48,
        policy_help=(
            f"scheduling policy of the DSPARK_MOE engine whose ratio leads the report. SGLang "
            f"engine default: {DEFAULT_POLICY}, the chart's default tier: our hardware-aware "
            f"scheduler on confidences from earlier rounds, with a cost table the worker "
            f"measures at start-up and the drafter's STS file, running the draft pass only in "
            f"steps where its measured cost pays ('{PRICED_SUFFIX}'; plain 'lagged' drafts "
            f"every step); '{SGLANG_DECISION}': SGLang's own decision "
            "(the whole block). Reference default: verify_all"
        ),
        extra_policies=(SGLANG_DECISION, *(p for p in ENGINE_POLICIES if PRICED_SUFFIX in p)),
    )
    p.add_argument(
        "--compare",
        nargs="*",
        choices=(SGLANG_DECISION, *ENGINE_POLICIES),
        default=None,
        metavar="POLICY",
        help=f"--engine sglang: more DSPARK_MOE engines timed in the same run, in turns with "
        f"the others, one per policy ('{SGLANG_DECISION}': SGLang's own decision; 'mtp1': "
        f"one draft per round). Default: {' '.join(DEFAULT_COMPARE)} (a name equal to "
        "--policy is skipped); the flag with no names: none, for a shorter run",
    )
    p.add_argument("--num-prompts", type=int, default=3, help="GSM8K-style prompts to run")
    p.add_argument(
        "--concurrency",
        type=int,
        default=None,
        help="--engine sglang: requests in flight at once; a prompt is sent as soon as one in "
        "flight finishes, as from N clients (default 1: one request at a time, the latency "
        "that speculative decoding is for; with more requests a verify of every draft costs "
        "more, and plain decoding gains from the batch instead)",
    )
    p.add_argument(
        "--passes",
        type=int,
        default=None,
        help="--engine sglang: timed passes of the prompts per engine, after the warm-up; the "
        "speed figures are their median (default 3: one pass on a shared machine can be off "
        "by a third). Every pass must give the same greedy outputs",
    )
    p.add_argument(
        "--dtype",
        choices=DTYPE_CHOICES,
        default="auto",
        help="dtype of both SGLang engines. auto (default): bfloat16 where the CPU has native "
        "bf16 matrix instructions (flags amx_bf16 or avx512_bf16 in /proc/cpuinfo), which "
        "makes it much faster there, else float32; the demo prints which and why. A "
        "divergence within the dtype's rounding tolerance is reported as a near-tie. "
        "--engine reference always runs float32",
    )


def _run(args: argparse.Namespace) -> int:
    from rich.console import Console

    console = Console()
    args.context_copy = resolve_context_copy(args)
    if args.engine == "sglang":
        from dspark_sglang.sglang_integration.demo import run_sglang_demo
        from dspark_sglang.targets.smollm2 import DEFAULT_DRAFTER_DIR, ensure_smollm2_with_status

        return run_sglang_demo(args, ensure_smollm2_with_status, DEFAULT_DRAFTER_DIR, console)
    return _reference_demo(args, console)


def _reference_demo(args: argparse.Namespace, console: Any) -> int:
    from dspark_sglang.data.demo_prompts import demo_chats
    from dspark_sglang.reference.demo import build_generator, report, run_plain_and_speculative

    try:
        if args.num_prompts < 1:
            raise ValueError(f"--num-prompts must be >= 1, got {args.num_prompts}")
        if args.passes is not None:
            raise ValueError(
                "--passes times SGLang's engines (--engine sglang); the reference demo decodes once"
            )
        if args.concurrency is not None:
            raise ValueError(
                "--concurrency sets the requests in flight in SGLang's engines (--engine "
                "sglang); the reference demo decodes one prompt at a time"
            )
        if args.dtype == "bfloat16":
            raise ValueError(
                "--dtype bfloat16 needs --engine sglang; the reference generator runs float32"
            )
        if args.policy and args.policy.endswith(PRICED_SUFFIX):
            raise ValueError(
                f"--policy {args.policy} decides per step whether SGLang's DSPARK_MOE worker "
                "drafts, which needs --engine sglang; the reference generator drafts every step"
            )
        if args.policy == SGLANG_DECISION or args.compare is not None:
            raise ValueError(
                f"--policy {SGLANG_DECISION} and --compare need --engine sglang (they name "
                "SGLang's own decision and more SGLang engines); the reference generator runs "
                "one policy"
            )
        target, gen = build_generator(**decoding_options(args), console=console)
        chats = demo_chats(args.num_prompts)
    except (ValueError, FileNotFoundError) as exc:
        print(f"demo: error: {exc}", file=sys.stderr)
        return 2
    prompts = [target.encode_chat(c) for c in chats]
    console.print(
        f"target {target.spec.name}, {len(prompts)} prompts x {args.max_new_tokens} new tokens, "
        f"temperature {args.temperature}, block {gen.proposer.block_size}"
    )
    plain, spec = run_plain_and_speculative(
        gen, prompts, args.max_new_tokens, target.eos_token_ids, console
    )
    ok = report(console, plain, spec, gen.sampling.greedy, gen.policy.name)
    console.rule("first answer (speculative)")
    console.print(target.tokenizer.decode(spec.outputs[0], skip_special_tokens=True))
    return 0 if ok else 1


COMMAND = Command(
    name="demo",
    help="Plain vs DSpark decoding of SmolLM2 in SGLang on CPU",
    description=(
        "Run SmolLM2-135M in SGLang's engine on CPU with plain and DSpark speculative "
        "decoding (DSPARK_MOE) side by side (converts the model fetched by scripts/setup.sh "
        "on first use)."
    ),
    add_arguments=_add_arguments,
    run=_run,
)
