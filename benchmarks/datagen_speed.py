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

``--compare hidden`` times the hidden-state pass (key ``hidden_pass``), same prompts and
settings but temperature 0: both sides decode greedily, so their caches can be compared:

* ``sglang+hf_forward`` (``data.hidden_states: cache``): a plain engine regenerates
  (``engine_sampler``) and is shut down, then ``cache_hidden_states`` runs the HF target
  at ``--dtype`` (batches of ``--hidden-batch``) into the same folder; seconds are both.
* ``sglang_capture`` (``data.hidden_states: sglang``): a capture engine
  (``capture_server_args``) regenerates with ``capture_sampler`` and a ``CaptureWriter``,
  then ``fill_missing`` (writes nothing); seconds are that pass.
* Layers: what the data stage resolves for SmolLM2 (1, 8, 14, 20, 27, the embedded
  drafter's) and the final-normed state, cached in bfloat16. Each repeat runs both, the
  first alternating, each on a fresh engine (start-up apart, untimed warm-up); the HF
  forward is warmed up once. Reported: new tokens/s and sequence (prompt + response)
  tokens cached/s, median and range; capture / (regeneration + HF forward); per repeat
  the caches' ids, token counts and tokens, and per layer the largest absolute difference
  over the layer's RMS and the relative L2 difference, on the rows computed from the same
  tokens (before a sequence's first differing token: bfloat16 greedy decoding on the two
  engines can part; not the last token's row, which SGLang never forwards).

Usage: ``python benchmarks/datagen_speed.py [--prompts 48] [--new-tokens 128]
[--repeats 3] [--compare generators|hidden] [--out FILE]``. Without ``--out`` the JSON
goes to a fresh run folder, ``<cache>/runs/bench/datagen_speed-<UTC time>/datagen_speed.json``;
the committed result is ``--out benchmarks/results/datagen_speed.json``. Each comparison
rewrites only its own part of an existing ``--out`` (``hidden_pass``, or every other key).
Timings on shared machines are noisy: the JSON records the load average; read the ratio.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.metadata as md
import json
import os
import shlex
import statistics
import sys
import tempfile
import time
from functools import partial
from pathlib import Path
from typing import Any

import torch

from dspark_sglang.bench.hidden_cache_compare import compare_caches
from dspark_sglang.results import default_out, dump_json, software_versions, spread

GENERATORS = ("hf", "sglang")
HIDDEN_PASSES = ("sglang+hf_forward", "sglang_capture")
#: The JSON key of ``--compare hidden``'s result.
HIDDEN_KEY = "hidden_pass"


def _prompt_settings(args: argparse.Namespace, prompts: list[Any]) -> dict[str, Any]:
    """The target and prompt facts both comparisons record."""
    return {
        "target": "smollm2 (SmolLM2-135M-Instruct)",
        "prompts": f"first {args.prompts} GSM8K train questions, chat template applied",
        "num_prompts": len(prompts),
        "prompt_tokens_mean": sum(len(p.prompt_ids) for p in prompts) / len(prompts),
        "max_new_tokens": args.new_tokens,
    }


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


def summary(runs: list[dict], key: str = "tokens_per_s") -> dict[str, float]:
    return spread([r[key] for r in runs])


def write_result(out: Path, result: dict[str, Any], key: str | None) -> None:
    """Write ``result`` to ``out``, keeping what the other comparison wrote there: under
    ``key`` (the rest of an existing file kept), or as the whole file but ``HIDDEN_KEY``."""
    old = json.loads(out.read_text()) if out.is_file() else {}
    if key is None:
        body = {**result, **({HIDDEN_KEY: old[HIDDEN_KEY]} if HIDDEN_KEY in old else {})}
    else:
        body = {**old, key: result}
    dump_json(out, body)


def compare_generators(args: argparse.Namespace, path: Path, prompts: list, target: Any) -> dict:
    """HF ``generate`` vs the SGLang engine (module docstring)."""
    from dspark_sglang.training.datagen import GenerationSettings, hf_sampler
    from dspark_sglang.training.regen_sglang import EngineSettings, engine_sampler, open_engine

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
            **_prompt_settings(args, prompts),
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
    return result


def compare_hidden(args: argparse.Namespace, path: Path, prompts: list, target: Any) -> dict:
    """Regeneration + HF forward vs regeneration with SGLang's capture (module docstring)."""
    from dspark_sglang.model.config_target import default_target_layer_ids
    from dspark_sglang.sglang_integration.hidden_capture import capture_env, capture_server_args
    from dspark_sglang.training.capture_sglang import CaptureWriter, capture_sampler, fill_missing
    from dspark_sglang.training.datagen import (
        GenerationSettings,
        cache_hidden_states,
        regenerate_responses,
        target_hidden_states,
    )
    from dspark_sglang.training.regen_sglang import EngineSettings, engine_sampler, open_engine

    eos = list(target.eos_token_ids)
    pad = target.tokenizer.pad_token_id
    pad = eos[0] if pad is None else int(pad)
    hidden = target.spec.hidden_size
    layer_ids = list(default_target_layer_ids(target.spec.num_layers))
    settings = GenerationSettings(
        max_new_tokens=args.new_tokens,
        batch_size=args.hf_batch,
        temperature=0.0,
        seed=args.seed,
        dtype=args.dtype,
        generator="sglang",
    )
    warm = dataclasses.replace(settings, max_new_tokens=4)
    mif = args.max_in_flight
    plain = EngineSettings(
        model_path=str(path), dtype=args.dtype, seed=args.seed, threads=args.threads
    )
    capture = dataclasses.replace(plain, extra=capture_server_args(layer_ids), env=capture_env())
    result: dict[str, Any] = {
        "settings": {
            **_prompt_settings(args, prompts),
            "sampling": "temperature 0, stop at EOS",
            "dtype": args.dtype,
            "threads": args.threads,
            "shard_size": args.hf_batch,
            "max_in_flight": args.max_in_flight,
            "hidden_batch": args.hidden_batch,
            "layer_ids": layer_ids,
            "cache_dtype": "bfloat16",
            "repeats": args.repeats,
            "seed": args.seed,
            "order": "an untimed HF forward warm-up, then each repeat both passes, "
            "sglang+hf_forward first in the 1st, 3rd, ... repeat; each on a fresh engine "
            "(start-up timed apart, an untimed warm-up of 2 prompts x 4 tokens)",
            "sglang+hf_forward": "plain engine regenerates, is shut down, then "
            f"cache_hidden_states, HF target at {args.dtype}; seconds = both",
            "sglang_capture": "capture engine regenerates with capture_sampler + "
            "CaptureWriter, then fill_missing; seconds = that pass",
            "sglang_engine": "CPU engine (intel_amx attention, pytorch sampling)",
        },
        "versions": {**software_versions(), "sglang": md.version("sglang")},
        "loadavg_start": os.getloadavg(),
    }
    runs: dict[str, list[dict]] = {p: [] for p in HIDDEN_PASSES}
    checks: list[dict] = []

    def regenerate(sampler: Any, todo: list, folder: Path, gen: Any, **kw: Any) -> list:
        return regenerate_responses(
            sampler, todo, folder, gen, pad_token_id=pad, eos_token_ids=eos, progress=False, **kw
        )

    def sample(engine: Any, gen: Any, todo: list, folder: Path, cap: bool) -> tuple:
        if not cap:
            return regenerate(engine_sampler(engine, gen, eos, mif), todo, folder, gen), {}
        writer = CaptureWriter(folder, layer_ids, target.spec)
        sampler = capture_sampler(engine, gen, eos, mif, writer)
        recs = regenerate(sampler, todo, folder, gen, after_shard=writer.after_shard)
        return recs, {"filled": fill_missing(engine, writer, mif)}

    def engine_pass(folder: Path, cap: bool) -> dict[str, Any]:
        """A fresh engine, warmed up untimed, regenerates into ``folder``, timed."""
        t0 = time.perf_counter()
        with open_engine(capture if cap else plain) as engine, tempfile.TemporaryDirectory() as tmp:
            run: dict[str, Any] = {"startup_s": round(time.perf_counter() - t0, 1)}
            sample(engine, warm, prompts[:2], Path(tmp), cap)
            t0 = time.perf_counter()
            recs, extra = sample(engine, settings, prompts, folder, cap)
            run["seconds"] = time.perf_counter() - t0
        run["tokens"] = sum(len(r.response_ids) for r in recs)
        run["seq_tokens"] = sum(len(r.prompt_ids) + len(r.response_ids) for r in recs)
        return {**run, "finished": sum(r.finished for r in recs), **extra}

    def with_hf_forward(folder: Path) -> dict[str, Any]:
        run = engine_pass(folder, cap=False)
        t0 = time.perf_counter()
        hf_kw = {"batch_size": args.hidden_batch, "pad_token_id": pad, "progress": False}
        cache_hidden_states(target.model, folder, layer_ids, **hf_kw)
        hf_s = time.perf_counter() - t0
        run.update(regen_s=run["seconds"], hf_forward_s=hf_s, seconds=run["seconds"] + hf_s)
        run["regen_tokens_per_s"] = run["tokens"] / run["regen_s"]
        return run

    passes = {HIDDEN_PASSES[0]: with_hf_forward, HIDDEN_PASSES[1]: partial(engine_pass, cap=True)}

    def report(rep: int, name: str, run: dict) -> None:
        run["tokens_per_s"] = run["tokens"] / run["seconds"]
        run["seq_tokens_per_s"] = run["seq_tokens"] / run["seconds"]
        runs[name].append(run)
        print(
            f"repeat {rep + 1}/{args.repeats} {name:<18} {run['tokens']:>6} tokens "
            f"{run['seconds']:>8.1f} s {run['tokens_per_s']:>7.1f} tok/s "
            f"{run['seq_tokens_per_s']:>8.1f} seq tok/s (start-up {run['startup_s']} s)",
            flush=True,
        )

    # Untimed: first-call kernel set-up is not the HF forward's speed.
    ids = torch.tensor([prompts[0].prompt_ids])
    target_hidden_states(target.model, ids, torch.ones_like(ids), layer_ids)
    for rep in range(args.repeats):
        order = HIDDEN_PASSES if rep % 2 == 0 else HIDDEN_PASSES[::-1]
        with tempfile.TemporaryDirectory(prefix="datagen_hidden-") as tmp:
            folders = {name: Path(tmp) / name.replace("+", "_") for name in HIDDEN_PASSES}
            for name in order:
                report(rep, name, passes[name](folders[name]))
            checks.append(compare_caches(*folders.values(), layer_ids, hidden))
        c = checks[-1]
        print(
            f"caches: same ids {c['same_ids']}, token counts {c['same_token_counts']}, "
            f"{c['identical_sequences']}/{c['sequences']} identical; states max |diff| / rms "
            f"{c['max_abs_over_rms']:.3g}, rel L2 {c['max_rel_l2']:.3g}"
        )
    result["loadavg_end"] = os.getloadavg()
    result["runs"] = runs
    result["cache_checks"] = checks
    for key in ("tokens_per_s", "seq_tokens_per_s"):
        result[key] = {p: summary(runs[p], key) for p in HIDDEN_PASSES}
    result["regen_tokens_per_s"] = summary(runs[HIDDEN_PASSES[0]], "regen_tokens_per_s")
    result["hf_forward_s"] = summary(runs[HIDDEN_PASSES[0]], "hf_forward_s")
    result["startup_s"] = {p: [r["startup_s"] for r in runs[p]] for p in HIDDEN_PASSES}
    med = result["tokens_per_s"]
    result["ratio_median"] = med["sglang_capture"]["median"] / med["sglang+hf_forward"]["median"]
    result["ratio_per_repeat"] = spread(
        [c["tokens_per_s"] / h["tokens_per_s"] for h, c in zip(*runs.values(), strict=True)]
    )
    result["command"] = "python benchmarks/datagen_speed.py " + shlex.join(sys.argv[1:])

    print(
        f"\n{'pass':<18} {'tok/s median':>13} {'range':>15} {'seq tok/s':>10} {'range':>17} "
        f"{'s/run':>7}"
    )
    for p in HIDDEN_PASSES:
        s, q = med[p], result["seq_tokens_per_s"][p]
        seconds = statistics.median(r["seconds"] for r in runs[p])
        print(
            f"{p:<18} {s['median']:>13.1f} {s['min']:>7.1f} - {s['max']:<5.1f} "
            f"{q['median']:>10.1f} {q['min']:>8.1f} - {q['max']:<6.1f} {seconds:>7.1f}"
        )
    r = result["ratio_per_repeat"]
    print(
        f"capture / (regen + hf forward): {result['ratio_median']:.2f}x (per repeat "
        f"{r['min']:.2f} - {r['max']:.2f}); regeneration alone "
        f"{result['regen_tokens_per_s']['median']:.1f} tok/s, HF forward "
        f"{result['hf_forward_s']['median']:.1f} s; engine start-up {result['startup_s']} s, "
        "not counted"
    )
    return result


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--compare",
        choices=("generators", "hidden"),
        default="generators",
        help="hf vs sglang regeneration, or regeneration + HF forward vs "
        "SGLang's capture (module docstring)",
    )
    ap.add_argument("--prompts", type=int, default=48)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2, help="torch / OpenMP threads, both sides")
    ap.add_argument("--dtype", choices=("float32", "bfloat16"), default="bfloat16")
    ap.add_argument(
        "--hf-batch",
        type=int,
        default=16,
        help="HF generate batch (gen_batch_size); the shard size of both",
    )
    ap.add_argument("--max-in-flight", type=int, default=48, help="SGLang requests at once")
    ap.add_argument(
        "--hidden-batch",
        type=int,
        default=8,
        help="--compare hidden: HF forward batch (data.hidden_batch_size)",
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--out",
        type=Path,
        default=None,
        help="result JSON (default: datagen_speed.json in a fresh run folder, "
        "<cache>/runs/bench/datagen_speed-<UTC time>/)",
    )
    args = ap.parse_args()
    for name in (
        "prompts",
        "new_tokens",
        "repeats",
        "threads",
        "hf_batch",
        "max_in_flight",
        "hidden_batch",
    ):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be >= 1")

    os.environ.setdefault("SGLANG_USE_CPU_ENGINE", "1")  # before anything imports sglang
    from dspark_sglang.targets.hf_target import HFTarget
    from dspark_sglang.targets.smollm2 import ensure_smollm2

    torch.set_num_threads(args.threads)
    path = ensure_smollm2()
    if args.compare == "hidden":
        # The HF forward runs at the engines' precision.
        target = HFTarget(path, dtype=getattr(torch, args.dtype), num_threads=args.threads)
        result = compare_hidden(args, path, encoded_prompts(target, args.prompts), target)
    else:
        target = HFTarget(path, num_threads=args.threads)
        result = compare_generators(args, path, encoded_prompts(target, args.prompts), target)
    if args.out is None:
        args.out = default_out("datagen_speed", "datagen_speed.json")
    write_result(args.out, result, HIDDEN_KEY if args.compare == "hidden" else None)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
