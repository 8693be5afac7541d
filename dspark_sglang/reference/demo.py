"""The reference generator by hand: ``demo --engine reference`` and ``generate``.

Both commands load SmolLM2-135M, take a drafter (the given checkpoint, else the
trained one shipped in the package, else an untrained seeded one with a loud
warning) and decode with the pure-PyTorch ``ReferenceGenerator``. The demo runs
plain decoding and speculative decoding side by side and prints tokens, speed,
acceptance (position-wise too) and, at temperature 0, whether the outputs are
token-identical: the lossless property in one glance. The SGLang-engine demo
(the default) is ``sglang_integration/demo.py``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dspark_sglang.targets.smollm2 import DEFAULT_DRAFTER_DIR

__all__ = [
    "build_drafter",
    "build_generator",
    "build_policy",
    "cost_model_for",
    "progress_bar",
    "report",
    "run_plain_and_speculative",
    "sts_temperatures",
]


def _load_target(console: Any, threads: int | None) -> Any:
    """Fetch-checked and converted SmolLM2, loaded as an ``HFTarget``."""
    from dspark_sglang.targets.hf_target import HFTarget
    from dspark_sglang.targets.smollm2 import ensure_smollm2_with_status

    path = ensure_smollm2_with_status(console)
    with console.status(f"loading target from {path}"):
        return HFTarget(path, num_threads=threads if threads is not None else 2)


def build_drafter(
    target: Any, drafter_path: Path | None, seed: int, console: Any
) -> tuple[Any, bool]:
    """``(drafter, trained)``: the given/shipped checkpoint, else a seeded untrained one."""
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


def cost_model_for(name: str | None, cost_table: Path | None) -> Any:
    """The ``--cost-table`` a policy will rank with, read now (before any model load).

    ``prefix``/``lagged`` need one; the file is parsed here so a bad flag fails fast.
    """
    from dspark_sglang.scheduling import load_cost_table
    from dspark_sglang.scheduling.config import NEEDS_COST_TABLE

    if name in NEEDS_COST_TABLE and cost_table is None:
        raise ValueError(
            f"policy {name!r} needs --cost-table (an SGLang SPS JSON, e.g. from "
            "`dspark-sglang profile`)"
        )
    return load_cost_table(cost_table) if cost_table is not None else None


def build_policy(
    name: str | None,
    cost_table: Path | None,
    static_k: int,
    block_size: int,
    cost_model: Any = None,
) -> Any:
    """The named policy (default ``verify_all``) for a drafter of ``block_size``.

    The flags become a ``SchedulerConfig`` and ``policy_from_config`` builds the
    policy, so the reference runs what the SGLang plugin would run for the same
    flags and refuses what it would refuse. ``cost_model`` is the already read
    ``cost_table`` (``cost_model_for``), else the file is read here.
    """
    from dspark_sglang.scheduling.config import SchedulerConfig
    from dspark_sglang.scheduling.policies import policy_from_config

    name = name or "verify_all"
    if cost_model is None:
        cost_model = cost_model_for(name, cost_table)
    cfg = SchedulerConfig(
        block_size=block_size,
        policy=name,  # type: ignore[arg-type]  # checked in __post_init__
        static_k=static_k if name == "static" else None,
        cost_table_path=str(cost_table) if cost_table is not None else None,
    )
    return policy_from_config(cfg, cost_model=cost_model)


def sts_temperatures(sts: Path | None, drafter: Path | None) -> Any:
    """``sts``, else the drafter's own ``sts.json`` (shipped beside the weights), else T = 1."""
    from dspark_sglang.calibration.sts import STS_FILENAME, load_sts

    path = sts
    if path is None:
        shipped = Path(drafter if drafter is not None else DEFAULT_DRAFTER_DIR) / STS_FILENAME
        path = shipped if shipped.is_file() else None
    return None if path is None else load_sts(path).temperatures


def build_generator(
    *,
    drafter: Path | None,
    policy: str | None,
    static_k: int,
    cost_table: Path | None,
    sts: Path | None,
    temperature: float,
    top_k: int,
    top_p: float,
    seed: int,
    threads: int | None,
    console: Any,
    context_copy: int = 0,
) -> tuple[Any, Any]:
    """``(target, ReferenceGenerator)`` for SmolLM2.

    Flag errors that need no model (a missing or unreadable cost table) fail before
    the slow load; the scheduler config is then built for the loaded drafter's block.
    """
    from dspark_sglang.reference.generator import ReferenceGenerator
    from dspark_sglang.sampling import SamplingParams

    sampling = SamplingParams(temperature, top_k, top_p)
    cost = cost_model_for(policy, cost_table)  # before the model load: fail fast
    target = _load_target(console, threads)
    proposer, _trained = build_drafter(target, drafter, seed, console)
    scheduler = build_policy(policy, cost_table, static_k, proposer.block_size, cost)
    gen = ReferenceGenerator(
        target,
        proposer,
        scheduler,
        sts_temperatures=sts_temperatures(sts, drafter),
        sampling=sampling,
        seed=seed,
        context_copy_ngram=context_copy,
    )
    return target, gen


def _fmt(x: float, digits: int = 2) -> str:
    return "-" if x != x else f"{x:.{digits}f}"


def progress_bar() -> Any:
    """A rich progress bar: description, bar, done/total, elapsed time."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn()
    )


def run_plain_and_speculative(
    gen: Any, prompts: list[list[int]], max_new: int, stops: tuple[int, ...], console: Any
) -> tuple[Any, Any]:
    """Plain then speculative decoding of ``prompts``, each with a token progress bar."""
    from dspark_sglang.reference.generator import plain_generate

    total = len(prompts) * max_new
    with progress_bar() as prog:
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


def report(console: Any, plain: Any, spec: Any, greedy: bool, policy_name: str) -> bool:
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
