"""``dspark-sglang generate``: one prompt through the reference DSpark speculative generator.

Decodes a chat prompt with a chosen drafter, policy and sampling and prints the
reply with tokens/s and accepted tokens per round; ``--compare`` also runs plain
decoding and prints the side-by-side figures of ``demo --engine reference``.
"""

from __future__ import annotations

import argparse
import sys

from dspark_sglang.cli.base import Command, add_decoding_arguments, decoding_options


def _add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--prompt", required=True, help="user message (the chat template is applied)")
    p.add_argument("--system", default=None, help="optional system message")
    add_decoding_arguments(p, max_new_tokens=128)
    p.add_argument("--compare", action="store_true", help="also run plain decoding and compare")


def _run(args: argparse.Namespace) -> int:
    from rich.console import Console

    from dspark_sglang.reference.demo import (
        build_generator,
        progress_bar,
        report,
        run_plain_and_speculative,
    )

    console = Console()
    try:
        target, gen = build_generator(**decoding_options(args), console=console)
    except (ValueError, FileNotFoundError) as exc:
        print(f"generate: error: {exc}", file=sys.stderr)
        return 2
    messages = ([{"role": "system", "content": args.system}] if args.system else []) + [
        {"role": "user", "content": args.prompt}
    ]
    prompt = target.encode_chat(messages)
    if args.compare:
        plain, spec = run_plain_and_speculative(
            gen, [prompt], args.max_new_tokens, target.eos_token_ids, console
        )
        ok = report(console, plain, spec, gen.sampling.greedy, gen.policy.name)
    else:
        with progress_bar() as prog:
            task = prog.add_task("speculative decoding", total=args.max_new_tokens)
            spec = gen.generate(
                [prompt],
                args.max_new_tokens,
                target.eos_token_ids,
                progress=lambda n: prog.update(task, advance=n),
            )
        ok = True
        console.print(
            f"{spec.num_tokens} tokens in {spec.wall_time_s:.2f} s "
            f"({spec.tokens_per_second:.1f} tok/s), {spec.num_rounds} rounds, "
            f"{spec.accept_length_mean:.2f} tokens/round"
        )
    console.rule("output")
    console.print(target.tokenizer.decode(spec.outputs[0], skip_special_tokens=True))
    return 0 if ok else 1


COMMAND = Command(
    name="generate",
    help="Decode one prompt with the reference generator",
    description="Generate a reply to one prompt with the reference DSpark speculative generator.",
    add_arguments=_add_arguments,
    run=_run,
)
