"""float32 vs bfloat16 for the two CPU-heavy training passes (writes a run folder, or --out).

Why: one drafter-comparison run (data + a DSpark/DFlash pair + bench) did not fit in a
working session in float32. These Xeons have AMX-BF16, so ``data.gen_dtype: bfloat16`` and
``run.autocast: bfloat16`` were added; this measures what they buy, side by side in
one process, and what they cost in fidelity:

1. Sampling: HF ``generate`` on one batch of real training prompts, float32 target vs
   its bfloat16 copy, alternating, ``--repeats`` times each (tokens/s, new tokens only).
2. Training: ``batch_loss`` + ``backward`` of the configured drafters on the same cached
   batches, float32 vs autocast alternating per batch (s/step, median), and the
   relative loss difference on identical weights and batch (bf16 rounding only).

Usage: ``python benchmarks/training_precision.py --data-dir DIR [--threads 1] [--out FILE]``
(``DIR``: any data dir produced by ``dspark-sglang train --stage data`` for the
SmolLM2 configs). The JSON records the load average: shared machines are noisy, so
read the ratios, not the absolute figures. Without ``--out`` the JSON goes to a fresh run
folder, ``<cache>/runs/bench/training_precision-<UTC time>/training_precision.json``; the
committed result is ``--out benchmarks/results/training_precision.json``.
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import time
from pathlib import Path
from typing import Any

import torch
from transformers import GenerationConfig

from dspark_sglang.results import default_out, dump_json
from dspark_sglang.training.config import TrainConfig, load_config
from dspark_sglang.training.datagen import left_pad, load_responses
from dspark_sglang.training.dataset import HiddenCache
from dspark_sglang.training.pipeline import load_target
from dspark_sglang.training.trainer import batch_loss, build_drafter, iterate_batches

REPO = Path(__file__).resolve().parents[1]
CONFIGS = (
    "configs/scale/dspark_smollm2_1layer_r96_x5.yaml",
    "configs/scale/dflash_smollm2_1layer_x5.yaml",
)


def bench_sampling(target: Any, data_dir: Path, rows: int, new_tokens: int, repeats: int) -> dict:
    recs = load_responses(data_dir)[:rows]
    tok = target.tokenizer
    pad = tok.pad_token_id if tok.pad_token_id is not None else target.eos_token_ids[0]
    ids, att = left_pad([r.prompt_ids for r in recs], pad)
    # min_new_tokens: every row decodes the same number of steps in both precisions.
    gen = GenerationConfig(
        do_sample=True,
        temperature=1.0,
        top_k=0,
        top_p=1.0,
        max_new_tokens=new_tokens,
        min_new_tokens=new_tokens,
        pad_token_id=pad,
    )
    models = {"float32": target.model, "bfloat16": copy.deepcopy(target.model).bfloat16()}
    secs: dict[str, list[float]] = {k: [] for k in models}
    for i in range(repeats):
        for name, model in models.items():
            torch.manual_seed(i)
            t0 = time.perf_counter()
            model.generate(input_ids=ids, attention_mask=att, generation_config=gen)
            secs[name].append(time.perf_counter() - t0)
    tok_s = {k: len(recs) * new_tokens / statistics.median(v) for k, v in secs.items()}
    return {
        "rows": len(recs),
        "new_tokens": new_tokens,
        "repeats": repeats,
        "tokens_per_s": tok_s,
        "speedup": tok_s["bfloat16"] / tok_s["float32"],
    }


def bench_training(cfg: TrainConfig, target: Any, data_dir: Path, steps: int) -> dict:
    cfg = cfg.with_overrides(data={"dir": str(data_dir)}, run={"autocast": "float32"})
    cfg16 = cfg.with_overrides(run={"autocast": "bfloat16"})
    torch.manual_seed(0)
    drafter = build_drafter(
        cfg,
        target.spec,
        target.model.config,
        target.embed_tokens,
        target.lm_head,
        target.default_mask_token_id(),
    )
    drafter.train()
    it = iterate_batches(HiddenCache(data_dir), cfg, 0, 0)
    batches = [next(it)[2] for _ in range(steps + 1)]
    secs: dict[str, list[float]] = {"float32": [], "bfloat16": []}
    rel: list[float] = []
    for i, tb in enumerate(batches):
        losses = {}
        for name, c in (("float32", cfg), ("bfloat16", cfg16)):
            drafter.zero_grad(set_to_none=True)
            t0 = time.perf_counter()
            loss, _ = batch_loss(drafter, target.lm_head, tb, c)
            loss.backward()
            dt = time.perf_counter() - t0
            if i > 0:  # batch 0 warms up both paths
                secs[name].append(dt)
            losses[name] = float(loss.detach())
        rel.append(abs(losses["bfloat16"] - losses["float32"]) / abs(losses["float32"]))
    s = {k: statistics.median(v) for k, v in secs.items()}
    return {
        "config": cfg.name,
        "steps": steps,
        "s_per_step": s,
        "speedup": s["float32"] / s["bfloat16"],
        "loss_rel_diff_max": max(rel),
        "loss_rel_diff_mean": statistics.fmean(rel),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data-dir", type=Path, required=True)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--steps", type=int, default=6, help="timed training steps per precision")
    ap.add_argument("--rows", type=int, default=16, help="prompts in the sampling batch")
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument(
        "--out",
        type=Path,
        default=None,
        help="result JSON (default: training_precision.json in a fresh run folder, "
        "<cache>/runs/bench/training_precision-<UTC time>/)",
    )
    args = ap.parse_args()
    cfgs = [load_config(REPO / c) for c in CONFIGS]
    target = load_target(cfgs[0].with_overrides(run={"threads": args.threads}))
    torch.set_num_threads(args.threads)
    result: dict[str, Any] = {
        "threads": args.threads,
        "loadavg_start": os.getloadavg(),
        "sampling": bench_sampling(target, args.data_dir, args.rows, args.new_tokens, args.repeats),
        "training": [bench_training(c, target, args.data_dir, args.steps) for c in cfgs],
        "loadavg_end": os.getloadavg(),
    }
    smp = result["sampling"]
    print(f"{'pass':<34} {'float32':>10} {'bfloat16':>10} {'speedup':>8} {'loss rel diff':>14}")
    tps = smp["tokens_per_s"]
    print(
        f"{'sampling (tok/s)':<34} {tps['float32']:>10.1f} {tps['bfloat16']:>10.1f} "
        f"{smp['speedup']:>7.2f}x {'-':>14}"
    )
    for t in result["training"]:
        sps = t["s_per_step"]
        print(
            f"{t['config'] + ' (s/step)':<34} {sps['float32']:>10.2f} {sps['bfloat16']:>10.2f} "
            f"{t['speedup']:>7.2f}x {t['loss_rel_diff_max']:>14.2e}"
        )
    if args.out is None:
        args.out = default_out("training_precision", "training_precision.json")
    dump_json(args.out, result)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
