"""Response regeneration speed: HF ``generate`` vs SGLang's Engine (writes a run folder, or --out).

Why: the data stage regenerates every training response with the target, and that pass
dominates a drafter run's wall time. ``data.generator: sglang`` samples with the engine
users deploy (continuous batching, paged KV cache) instead of HF ``generate`` on padded
batches; this measures what it buys on the same prompts, side by side in one process:

* Target SmolLM2-135M-Instruct; prompts: the first ``--prompts`` GSM8K train questions
  with the chat template applied (as the data stage encodes them); temperature 1, no
  top-k / top-p, up to ``--new-tokens`` tokens, stop at EOS.
* Both sides run the data stage's own code: ``regenerate_responses`` into a fresh folder
  with ``hf_sampler`` (batches of ``--hf-batch``, left-padded) or ``engine_sampler``
  (``--max-in-flight`` requests submitted at once, CPU engine settings of
  ``sglang_integration.engine``), both at ``--dtype`` with ``--threads`` threads.
* Every repeat runs HF with no engine alive (an engine's scheduler process would share
  the cores), then starts a fresh engine (start-up reported apart, not in tokens/s), warms
  it up untimed and runs SGLang; HF is warmed up once, untimed. tokens/s counts the new
  tokens written (up to EOS) over the pass's wall time. Median and range over
  ``--repeats``.

Usage: ``python benchmarks/datagen_speed.py [--prompts 48] [--new-tokens 128]
[--repeats 3] [--out FILE]``. Without ``--out`` the JSON goes to a fresh run folder,
``<cache>/runs/bench/datagen_speed-<UTC time>/datagen_speed.json``; the committed result
is ``--out benchmarks/results/datagen_speed.json``. Timings on shared machines are noisy:
the JSON records the load average; read the ratio.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.metadata as md
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from dspark_sglang.results import default_out, dump_json, software_versions

GENERATORS = ("hf", "sglang")


def encoded_prompts(target: Any, n: int) -> list[Any]:
    """The first ``n`` GSM8K train questions, chat template applied (as the data stage)."""
    from dspark_sglang.data.evalsets import load_gsm8k_train
    from dspark_sglang.training.datagen import EncodedPrompt

    out = []
    for p in load_gsm8k_train(limit=n):
        msgs = [{"role": m.role, "content": m.content} for m in p.messages]
        out.append(EncodedPrompt(id=p.id, domain=p.domain, prompt_ids=target.encode_chat(msgs)))
    return out


def timed_pass(sampler: Any, prompts: list[Any], settings: Any, eos: list[int]) -> dict:
    """One regeneration pass into a fresh folder: new tokens written, wall seconds."""
    from dspark_sglang.training.datagen import regenerate_responses

    with tempfile.TemporaryDirectory(prefix="datagen_speed-") as tmp:
        t0 = time.perf_counter()
        recs = regenerate_responses(
            sampler, prompts, tmp, settings, pad_token_id=eos[0], eos_token_ids=eos, progress=False
        )
        seconds = time.perf_counter() - t0
    tokens = sum(len(r.response_ids) for r in recs)
    return {
        "tokens": tokens,
        "seconds": round(seconds, 3),
        "tokens_per_s": tokens / seconds,
        "finished": sum(r.finished for r in recs),
    }


def summary(runs: list[dict]) -> dict[str, float]:
    tps = [r["tokens_per_s"] for r in runs]
    return {"median": statistics.median(tps), "min": min(tps), "max": max(tps)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=48)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2, help="torch / OpenMP threads, both sides")
    ap.add_argument("--dtype", choices=("float32", "bfloat16"), default="bfloat16")
    ap.add_argument("--hf-batch", type=int, default=16, help="HF generate batch (gen_batch_size)")
    ap.add_argument("--max-in-flight", type=int, default=48, help="SGLang requests at once")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--out",
        type=Path,
        default=None,
        help="result JSON (default: datagen_speed.json in a fresh run folder, "
        "<cache>/runs/bench/datagen_speed-<UTC time>/)",
    )
    args = ap.parse_args()
    for name in ("prompts", "new_tokens", "repeats", "threads", "hf_batch", "max_in_flight"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be >= 1")

    os.environ.setdefault("SGLANG_USE_CPU_ENGINE", "1")  # before anything imports sglang
    from dspark_sglang.targets.hf_target import HFTarget
    from dspark_sglang.targets.smollm2 import ensure_smollm2
    from dspark_sglang.training.datagen import GenerationSettings, hf_sampler
    from dspark_sglang.training.regen_sglang import EngineSettings, engine_sampler, open_engine

    torch.set_num_threads(args.threads)
    path = ensure_smollm2()
    target = HFTarget(path, num_threads=args.threads)
    prompts = encoded_prompts(target, args.prompts)
    eos = list(target.eos_token_ids)
    pad = target.tokenizer.pad_token_id
    pad = eos[0] if pad is None else int(pad)

    def settings(generator: str) -> GenerationSettings:
        return GenerationSettings(
            max_new_tokens=args.new_tokens,
            batch_size=args.hf_batch,
            seed=args.seed,
            dtype=args.dtype,
            generator=generator,
        )

    result: dict[str, Any] = {
        "settings": {
            "target": "smollm2 (SmolLM2-135M-Instruct)",
            "prompts": f"first {args.prompts} GSM8K train questions, chat template applied",
            "num_prompts": len(prompts),
            "prompt_tokens_mean": sum(len(p.prompt_ids) for p in prompts) / len(prompts),
            "max_new_tokens": args.new_tokens,
            "sampling": "temperature 1, no top-k / top-p / min-p, stop at EOS",
            "dtype": args.dtype,
            "threads": args.threads,
            "hf_batch": args.hf_batch,
            "max_in_flight": args.max_in_flight,
            "repeats": args.repeats,
            "seed": args.seed,
            "order": "an untimed HF warm-up (2 prompts x 4 tokens), then each repeat: hf with "
            "no engine alive, then a fresh engine (start-up timed apart, an untimed warm-up) "
            "and sglang",
            "sglang_engine": "CPU engine (intel_amx attention, pytorch sampling)",
        },
        "versions": {**software_versions(), "sglang": md.version("sglang")},
        "loadavg_start": os.getloadavg(),
    }
    runs: dict[str, list[dict]] = {g: [] for g in GENERATORS}
    startups: list[float] = []
    engine_settings = EngineSettings(
        model_path=str(path), dtype=args.dtype, seed=args.seed, threads=args.threads
    )

    def hf() -> Any:
        return hf_sampler(target.model, settings("hf"), pad_token_id=pad, eos=eos)

    def report(rep: int, g: str, run: dict) -> None:
        runs[g].append(run)
        print(
            f"repeat {rep + 1}/{args.repeats} {g:<7} {run['tokens']:>6} tokens "
            f"{run['seconds']:>8.1f} s {run['tokens_per_s']:>8.1f} tok/s",
            flush=True,
        )

    # Untimed: first-call kernel set-up is not regeneration speed.
    timed_pass(hf(), prompts[:2], dataclasses.replace(settings("hf"), max_new_tokens=4), eos)
    for rep in range(args.repeats):
        # No engine is alive while HF runs: its scheduler process would share the cores.
        report(rep, "hf", timed_pass(hf(), prompts, settings("hf"), eos))
        t0 = time.perf_counter()
        with open_engine(engine_settings) as engine:
            startups.append(round(time.perf_counter() - t0, 1))
            warm = dataclasses.replace(settings("sglang"), max_new_tokens=4)
            timed_pass(
                engine_sampler(engine, warm, eos, args.max_in_flight), prompts[:2], warm, eos
            )
            sampler = engine_sampler(engine, settings("sglang"), eos, args.max_in_flight)
            report(rep, "sglang", timed_pass(sampler, prompts, settings("sglang"), eos))
    result["sglang_startup_s"] = startups
    result["loadavg_end"] = os.getloadavg()
    result["runs"] = runs
    result["tokens_per_s"] = {g: summary(runs[g]) for g in GENERATORS}
    med = result["tokens_per_s"]
    result["speedup_median"] = med["sglang"]["median"] / med["hf"]["median"]

    print(f"\n{'generator':<10} {'tok/s median':>13} {'range':>21} {'tokens/run':>11}")
    for g in GENERATORS:
        s = med[g]
        tokens = statistics.median(r["tokens"] for r in runs[g])
        rng = f"{s['min']:.1f} - {s['max']:.1f}"
        print(f"{g:<10} {s['median']:>13.1f} {rng:>21} {tokens:>11.0f}")
    print(
        f"sglang / hf: {result['speedup_median']:.2f}x (engine start-up "
        f"{result['sglang_startup_s']} s, not counted)"
    )
    if args.out is None:
        args.out = default_out("datagen_speed", "datagen_speed.json")
    dump_json(args.out, result)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
