"""The demo's engine runs: start the engines, warm them up, time their passes in turns.

``run_engines`` starts one SGLang engine per spec, each in its own process
(``engine_process``), times ``passes`` passes of each in turns from an empty radix cache
(``flush_radix_cache``) and returns each engine's figures (``demo_report.EngineRun``);
one engine also computes, untimed, the target's best tokens along its outputs
(``target_top_tokens``) for the greedy near-tie check. ``demo.run_sglang_demo`` runs its
engines here; the CPU benchmarks reuse ``flush_radix_cache`` and ``target_top_tokens``.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import Mapping, Sequence
from typing import Any

from dspark_sglang.sglang_integration.demo_report import EngineRun
from dspark_sglang.sglang_integration.greedy_check import (
    TOP_TOKENS,
    TopTokens,
    top_tokens_from_sglang,
)

__all__ = ["flush_radix_cache", "run_engines", "target_top_tokens"]


def target_top_tokens(
    engine: Any, prompts: Sequence[Sequence[int]], outputs: Sequence[Sequence[int]]
) -> tuple[tuple[TopTokens | None, ...], ...]:
    """The target's best tokens at every token of each output, by one prefill in ``engine``.

    Each request is the prompt followed by its output, with ``return_logprob``
    and ``top_logprobs_num=TOP_TOKENS``. SGLang's entry for input position ``p`` is the
    distribution that predicted token ``p``, except that the first entry (at
    ``logprob_start_len``) is always None, so the start is the prompt's last
    token: its None entry is dropped and the rest are the distributions before
    every output token. One forward pass, not a second decode; the radix cache
    still serves the prompt up to the start.
    """
    requests = [list(p) + list(o) for p, o in zip(prompts, outputs, strict=True)]
    results = engine.generate(
        input_ids=requests,
        sampling_params={"temperature": 0.0, "max_new_tokens": 1},
        return_logprob=True,
        logprob_start_len=[len(p) - 1 for p in prompts],
        top_logprobs_num=TOP_TOKENS,
    )
    top = []
    for i, (res, out) in enumerate(zip(results, outputs, strict=True)):
        entries = res["meta_info"]["input_top_logprobs"]
        if len(entries) != len(out) + 1:
            raise RuntimeError(
                f"SGLang returned {len(entries)} input_top_logprobs for the last prompt token "
                f"and {len(out)} output tokens of prompt {i}; the near-tie check cannot align them"
            )
        top.append(top_tokens_from_sglang(entries[1:], f"prompt {i} input_top_logprobs"))
    return tuple(top)


def flush_radix_cache(engine: Any, wait_s: float = 30.0, poll_s: float = 0.05) -> None:
    """Empty ``engine``'s radix cache (SGLang's ``Engine.flush_cache``); raise if it refuses
    for ``wait_s`` seconds.

    SGLang refuses while its scheduler holds a request. A request whose output
    ``generate`` has already returned is retired only on the scheduler loop's next
    iteration, so a flush sent right after a pass can land before that (on a loaded
    machine it does) and is asked again every ``poll_s`` seconds. A refusal that
    outlasts ``wait_s`` means requests are still running between two finished
    passes: a bug worth stopping for.
    """
    deadline = time.monotonic() + wait_s
    while True:
        result = engine.flush_cache()
        if getattr(result, "success", False):
            return
        if time.monotonic() >= deadline:
            raise RuntimeError(
                f"SGLang refused to flush the radix cache between passes for {wait_s:g} s: "
                f"{result!r}"
            )
        time.sleep(poll_s)


def run_engines(
    specs: Mapping[str, Any],
    prompts: Sequence[Sequence[int]],
    warmup: Sequence[int],
    max_new_tokens: int,
    console: Any,
    top_tokens_of: str | None = None,
    passes: int = 1,
    concurrency: int | None = None,
) -> dict[str, EngineRun]:
    """Start the engines, warm each up, time ``passes`` passes of each in turns.

    ``specs`` maps a label to a ``CpuEngineSpec`` (with ``sleep_on_idle``); each engine
    runs in its own process (``engine_process``), passes in ``engine_process.turns``. A pass
    keeps ``concurrency`` requests in flight (all prompts at once when None): a request
    is sent as soon as one in flight finishes (``engine.generate_in_flight``), as a server
    under that many clients would see them; its wall time is the pass's. Per engine the
    figures are the first pass's outputs and the median wall time; a later pass whose
    outputs differ from the first's is counted (``differing_passes``).

    EOS is honoured (``ignore_eos=False``): the demo shows real answers; greedy
    runs of both engines stop at the same token anyway. The engine ``top_tokens_of``
    also computes, untimed, the target's best tokens along its outputs
    (``target_top_tokens``).
    """
    from dspark_sglang.sglang_integration.engine import generate_outputs, timed_in_flight
    from dspark_sglang.sglang_integration.engine_process import engine_processes, turns

    sampling = {"ignore_eos": False}
    width = len(prompts) if concurrency is None else concurrency
    if width < 1:
        raise ValueError(f"concurrency must be >= 1, got {concurrency}")
    if top_tokens_of is not None and top_tokens_of not in specs:
        raise ValueError(f"top_tokens_of={top_tokens_of!r} names no engine of {sorted(specs)}")
    sent = [list(p) for p in prompts]
    walls: dict[str, list[float]] = {label: [] for label in specs}
    outputs: dict[str, list[dict[str, Any]]] = {}
    differing: dict[str, list[list[list[int]]]] = {label: [] for label in specs}
    names = " and ".join(specs)
    with contextlib.ExitStack() as stack:
        with console.status(
            f"starting SGLang's engines on CPU for {names}, one after the other, each in its "
            "own process (each scheduler process loads the model; ~20-60 s each)"
        ):
            engines = stack.enter_context(engine_processes(specs))
            for engine in engines.values():
                engine.call(generate_outputs, [list(warmup)], 2, sampling)
        order = turns(list(specs), passes)
        for i, label in enumerate(order):
            with console.status(
                f"{label}: generating {len(prompts)} prompts, {width} in flight "
                f"(timed pass {len(walls[label]) + 1} of {passes}; {i + 1} of {len(order)} "
                "in all, engines in turns)"
            ):
                # Every pass starts from an empty radix cache: a later pass that found its
                # prompts cached would prefill only their last token, a different kernel
                # path whose rounding (bfloat16 above all) can flip a near-tie.
                engines[label].call(flush_radix_cache)
                wall, out = engines[label].call(
                    timed_in_flight, sent, max_new_tokens, width, sampling
                )
            walls[label].append(wall)
            if label not in outputs:
                outputs[label] = out
            elif [o["output_ids"] for o in out] != [o["output_ids"] for o in outputs[label]]:
                differing[label].append([list(o["output_ids"]) for o in out])
        tops: tuple[tuple[TopTokens | None, ...], ...] = ()
        if top_tokens_of is not None:
            with console.status(
                f"{top_tokens_of}: target's best tokens along the outputs (untimed)"
            ):
                tops = engines[top_tokens_of].call(
                    target_top_tokens, sent, [o["output_ids"] for o in outputs[top_tokens_of]]
                )
        for label in specs:
            each = ", ".join(f"{w:.2f}" for w in walls[label])
            console.print(f"{label}: {each} s", highlight=False)
        console.print("shutting the engines down", highlight=False)
    return {
        label: EngineRun.from_outputs(
            label,
            outputs[label],
            statistics.median(walls[label]),
            tops if label == top_tokens_of else (),
            pass_walls=walls[label] if passes > 1 else (),
            differing_outputs=differing[label],
        )
        for label in specs
    }
