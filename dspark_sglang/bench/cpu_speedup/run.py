"""Running the CPU speed benchmark: engine settings, encoded prompts, one repeat.

``engine_specs`` validates everything and builds each engine's ``CpuEngineSpec`` before
any engine starts; ``encoded_prompts`` puts an eval set through the target's chat
template; ``run_repeat`` starts every engine, each in its own process, and runs the
cells with the engines taking turns. SGLang is imported inside the functions only, so
the caller can set ``SGLANG_USE_CPU_ENGINE`` first.
"""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from dspark_sglang.bench.cpu_speedup.grid import (
    DSPARK,
    NGRAM,
    PLAIN,
    Cell,
    Engine,
    check_cell_size,
    check_set_size,
    rotated,
)
from dspark_sglang.sglang_integration.launch import SGLANG_DECISION


def stderr_console() -> Any:
    from rich.console import Console

    return Console(stderr=True)


def engine_specs(
    args: argparse.Namespace, all_engines: Sequence[Engine], model_path: Path, dtype: Any, tmp: str
) -> tuple[dict[str, Any], dict[str, Any], Path | None]:
    """``CpuEngineSpec`` per engine label, each policy's scheduler config, the drafter.

    Everything is validated here, before any engine starts (SGLang kills its parent when a
    scheduler dies during start-up): the drafter checkpoint against the target, the STS
    file and cost table of every policy.
    """
    import yaml

    from dspark_sglang.sglang_integration.demo import resolve_drafter, write_scheduler_config
    from dspark_sglang.sglang_integration.engine import CpuEngineSpec
    from dspark_sglang.sglang_integration.launch import scheduler_env
    from dspark_sglang.targets.smollm2 import DEFAULT_DRAFTER_DIR

    console = stderr_console()
    drafter_dir = None
    if any(e.algorithm == DSPARK for e in all_engines):
        given = None if args.drafter == DEFAULT_DRAFTER_DIR else args.drafter
        drafter_dir, trained = resolve_drafter(
            model_path, given, DEFAULT_DRAFTER_DIR, args.seed, Path(tmp), console
        )
        if not trained:
            raise ValueError(
                f"no trained drafter in {DEFAULT_DRAFTER_DIR}: a speed benchmark of an "
                "untrained drafter measures nothing; pass --drafter or restore the embedded one"
            )
    base = {
        "host": "127.0.0.1",
        "log_level": "error",
        "dtype": dtype.dtype,
        "mem_fraction_static": args.mem_fraction_static,
        "max_total_tokens": args.max_total_tokens,
        "random_seed": args.seed,
        # The engines of a repeat are alive together; the ones waiting sleep.
        "sleep_on_idle": True,
    }
    # One engine per policy serves every cell, so it drafts by argmax only when every
    # request of the run is greedy; run temperature 0 on its own to measure that tier.
    all_greedy = all(t == 0 for t in args.temperatures)
    specs: dict[str, Any] = {}
    configs: dict[str, Any] = {}
    for eng in all_engines:
        overrides: dict[str, Any] = dict(base)
        env: dict[str, str] = {}
        if eng.algorithm == DSPARK:
            policy_args = argparse.Namespace(
                policy=None if eng.policy == SGLANG_DECISION else eng.policy,
                sts=args.sts,
                cost_table=args.cost_table,
                static_k=args.static_k,
                context_copy=args.context_copy,
            )
            workdir = Path(tmp) / str(eng.policy)
            workdir.mkdir()
            config = write_scheduler_config(
                policy_args, drafter_dir, workdir, console, dtype.dtype, greedy_only=all_greedy
            )
            # Parsed, so that dump_json makes its paths portable.
            configs[str(eng.policy)] = (
                yaml.safe_load(config.read_text()) if config is not None else None
            )
            overrides["speculative_algorithm"] = DSPARK
            overrides["speculative_draft_model_path"] = str(drafter_dir)
            # SGLang's own decision or the policy's ragged mode and config, and whatever
            # else a DSPARK_MOE server needs: scheduler_env is the one place that knows.
            # An all-greedy grid is a greedy-only tier: argmax drafts (greedy_draft).
            env = scheduler_env(config, greedy_draft=all_greedy)
        elif eng.algorithm == NGRAM:
            overrides["speculative_algorithm"] = NGRAM
        specs[eng.label] = CpuEngineSpec(
            model_path=str(model_path), overrides=overrides, env=env, omp_threads=args.threads
        )
    return specs, configs, drafter_dir


def encoded_prompts(tokenizer: Any, name: str, n: int, per_cell: int) -> list[tuple[int, ...]]:
    """The first ``n`` prompts of eval set ``name`` (``prompts_needed``) through the target's
    chat template; ``ValueError`` naming the flags when the set has fewer."""
    from dspark_sglang.data.evalsets import load_eval_set

    prompts = load_eval_set(name, limit=n)
    check_set_size(name, len(prompts), n, per_cell)
    out = []
    for p in prompts:
        ids = tokenizer.apply_chat_template(
            p.chat(), add_generation_prompt=True, tokenize=True, return_dict=False
        )
        if isinstance(ids, Mapping):  # some tokenizers return a BatchEncoding regardless
            ids = ids["input_ids"]
        out.append(tuple(int(t) for t in ids))
    return out


def sampling(temperature: float) -> dict[str, Any]:
    """SGLang sampling params on top of ``generate_outputs``' (greedy, EOS ignored)."""
    return {"temperature": temperature} if temperature > 0 else {}


def run_repeat(
    all_engines: Sequence[Engine],
    specs: Mapping[str, Any],
    cells: Sequence[Cell],
    prompts: Mapping[Cell, Sequence[Sequence[int]]],
    warmup: Sequence[int],
    max_new_tokens: int,
    repeat: int,
    console: Any,
) -> tuple[dict[str, dict[Cell, Any]], dict[str, float], list[list[str]]]:
    """One repeat: start every engine, then every cell with the engines taking turns.

    Returns ``({label: {cell: EngineRun}}, {label: start-up s}, per cell the engine order)``.
    ``prompts[cell]`` is the cell's own prompts (``cell_prompt_slices``). Right before its
    turn in a cell an engine prefills the cell's prompts once, untimed (one token each),
    so every timed cell finds its prompts in the radix cache alike. After its turn in a
    greedy cell the plain engine also computes, untimed, the target's best tokens along its
    outputs (``demo.target_top_tokens``).
    """
    from dspark_sglang.sglang_integration.demo import target_top_tokens
    from dspark_sglang.sglang_integration.demo_report import EngineRun
    from dspark_sglang.sglang_integration.engine import generate_outputs, timed_in_flight
    from dspark_sglang.sglang_integration.engine_process import engine_processes, turns

    start_order = [e.label for e in rotated(all_engines, repeat)]
    algorithm = {e.label: e.algorithm for e in all_engines}
    width = len(start_order)
    flat = turns(start_order, len(cells))
    orders = [flat[j * width : (j + 1) * width] for j in range(len(cells))]
    out: dict[str, dict[Cell, Any]] = {label: {} for label in start_order}
    with contextlib.ExitStack() as stack:
        with console.status(
            f"repeat {repeat + 1}: starting {', '.join(start_order)}, one after the other, "
            "each in its own process (~20-60 s each)"
        ):
            procs = stack.enter_context(
                engine_processes({label: specs[label] for label in start_order})
            )
            for proc in procs.values():
                for temperature in sorted({c.temperature for c in cells}):
                    proc.call(generate_outputs, [list(warmup)], 8, sampling(temperature))
        for cell, order in zip(cells, orders, strict=True):
            own = prompts[cell]
            check_cell_size(len(own), cell.concurrency)
            sent = [list(p) for p in own]
            for label in order:
                proc = procs[label]
                proc.call(generate_outputs, sent, 1)  # untimed: prefills cached
                wall, outputs = proc.call(
                    timed_in_flight,
                    sent,
                    max_new_tokens,
                    cell.concurrency,
                    sampling(cell.temperature),
                )
                tops: tuple[Any, ...] = ()
                if algorithm[label] == PLAIN and cell.temperature == 0:
                    tops = proc.call(target_top_tokens, sent, [o["output_ids"] for o in outputs])
                out[label][cell] = run = EngineRun.from_outputs(label, outputs, wall, tops)
                console.print(
                    f"{label}: {cell.label}: {run.tokens_per_second:.2f} tok/s", highlight=False
                )
        startups = {label: float(procs[label].startup_s or 0.0) for label in start_order}
    return out, startups, orders
