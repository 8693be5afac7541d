"""Full vs reduced draft vocabulary: one training step and one draft pass, side by side.

What is measured, at SmolLM2-135M's geometry (V = 49152, H = 576, 30 layers) with the
committed DSpark recipe's drafter (``configs/dspark_smollm2.yaml``: 2 MoE layers, block 7,
Markov rank 48) and random weights (timing does not depend on training):

1. Training step: ``batch_loss`` + ``backward`` on one synthetic batch (``--seqs``
   sequences of ``--seq-len`` tokens, 32 anchors each), the full-vocabulary drafter vs the
   same drafter with a ``--draft-vocab``-token map. The target logits (full vocabulary,
   the exact TV term needs them) are computed in both.
2. Draft pass: ``forward_block`` + ``sample_block`` (temperature 1) for ``--requests``
   requests with ``--ctx`` context rows each: what a decode round spends drafting.

Each pair alternates A B A B over ``--repeats`` rounds of ``--iters`` calls; the JSON keeps
every round's seconds per call, the median and range, and the ratio full / reduced of the
medians. Shared machines are noisy: read the ratios.

Usage: ``python benchmarks/reduced_vocab.py [--threads 2] [--out FILE]``; the committed
result is ``--out benchmarks/results/reduced_vocab.json``.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from dspark_sglang.bench import alternate as timing
from dspark_sglang.model import DSparkConfig, DSparkDrafter, sample_block
from dspark_sglang.model.vocab import DraftVocab
from dspark_sglang.results import default_out, dump_json, software_versions
from dspark_sglang.targets.smollm2 import SMOLLM2_GEOMETRY
from dspark_sglang.training.config import load_config
from dspark_sglang.training.dataset import TrainBatch
from dspark_sglang.training.trainer import batch_loss

REPO = Path(__file__).resolve().parents[1]
RECIPE = "configs/dspark_smollm2.yaml"
SMOLLM2 = SMOLLM2_GEOMETRY


def drafter_pair(k: int) -> tuple[DSparkDrafter, DSparkDrafter]:
    """The recipe's drafter over the whole vocabulary, and the same with a map of ``k``
    random ids (which ids does not matter for timing)."""
    cfg = load_config(REPO / RECIPE)
    torch.manual_seed(0)
    emb = nn.Embedding(SMOLLM2.vocab_size, SMOLLM2.hidden_size)
    head = nn.Linear(SMOLLM2.hidden_size, SMOLLM2.vocab_size, bias=False)
    out = []
    for size in (None, k):
        dcfg = DSparkConfig.for_target(
            SMOLLM2,
            mask_token_id=0,
            block_size=cfg.drafter.block_size,
            target_layer_ids=cfg.target.layer_ids,
            draft_vocab_size=size,
            **dict(cfg.drafter.model),
        )
        drafter = DSparkDrafter(dcfg, emb, head)
        if size is not None:
            ids = torch.randperm(SMOLLM2.vocab_size, generator=torch.Generator().manual_seed(1))
            drafter.set_draft_vocab(DraftVocab(ids[:size].sort().values, SMOLLM2.vocab_size))
        out.append(drafter)
    return out[0], out[1]


def synthetic_batch(drafter: DSparkDrafter, seqs: int, seq_len: int, anchors: int) -> TrainBatch:
    g = torch.Generator().manual_seed(2)
    b, v, h = drafter.block_size, SMOLLM2.vocab_size, SMOLLM2.hidden_size
    feats = drafter.config.num_context_features * h
    tokens = torch.randint(0, v, (seqs, seq_len), generator=g)
    pos = torch.stack([torch.randperm(seq_len - b - 1, generator=g)[:anchors] for _ in range(seqs)])
    pos = pos.sort(-1).values + 1
    idx = pos.unsqueeze(-1) + torch.arange(b)
    labels = tokens.gather(1, (idx + 1).reshape(seqs, -1)).reshape(seqs, anchors, b)
    prev = tokens.gather(1, idx.reshape(seqs, -1)).reshape(seqs, anchors, b)
    return TrainBatch(
        tokens=tokens,
        context_hidden=torch.randn(seqs, seq_len, feats, generator=g),
        seq_lens=torch.full((seqs,), seq_len),
        anchors=pos,
        anchor_tokens=tokens.gather(1, pos),
        anchor_mask=torch.ones(seqs, anchors, dtype=torch.bool),
        labels=labels,
        prev_tokens=prev,
        valid=torch.ones(seqs, anchors, b, dtype=torch.bool),
        target_last=torch.randn(seqs, anchors, b, h, generator=g),
    )


def alternate(fns: dict[str, Callable[[], None]], repeats: int, iters: int) -> dict[str, Any]:
    """Seconds per call of each function, alternated (``bench.alternate``), and full / reduced."""
    out: dict[str, Any] = dict(timing.alternate(fns, repeats, iters))
    out["speedup_full_over_reduced"] = out["full"]["median"] / out["reduced"]["median"]
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--draft-vocab", type=int, default=8192)
    ap.add_argument("--seqs", type=int, default=2)
    ap.add_argument("--seq-len", type=int, default=384)
    ap.add_argument("--anchors", type=int, default=32)
    ap.add_argument("--requests", type=int, default=1)
    ap.add_argument("--ctx", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--iters", type=int, default=3)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    full, reduced = drafter_pair(args.draft_vocab)
    cfg = load_config(REPO / RECIPE)
    batch = synthetic_batch(full, args.seqs, args.seq_len, args.anchors)

    def train_step(drafter: DSparkDrafter) -> Callable[[], None]:
        def run() -> None:
            drafter.zero_grad(set_to_none=True)
            loss, _ = batch_loss(drafter, drafter.lm_head, batch, cfg)
            loss.backward()

        return run

    g = torch.Generator().manual_seed(3)
    n, c, feats = args.requests, args.ctx, full.config.num_context_features * 576
    ctx = torch.randn(n, c, feats, generator=g)
    ctx_pos = torch.arange(c).expand(n, c)
    valid = torch.ones(n, c, dtype=torch.bool)
    anchors = torch.randint(0, SMOLLM2.vocab_size, (n,), generator=g)

    def draft_pass(drafter: DSparkDrafter) -> Callable[[], None]:
        @torch.inference_mode()
        def run() -> None:
            block = drafter.forward_block(ctx, ctx_pos, valid, anchors, torch.full((n,), c))
            sample_block(drafter, block, anchors, 1.0, generator=g)

        return run

    result: dict[str, Any] = {
        "geometry": {"vocab_size": SMOLLM2.vocab_size, "hidden_size": 576, "recipe": RECIPE},
        "draft_vocab_size": args.draft_vocab,
        "settings": {k: v for k, v in vars(args).items() if k != "out"},
        "loadavg_start": os.getloadavg(),
        "train_step": alternate(
            {"full": train_step(full), "reduced": train_step(reduced)}, args.repeats, args.iters
        ),
        "draft_pass": alternate(
            {"full": draft_pass(full), "reduced": draft_pass(reduced)}, args.repeats, args.iters
        ),
        "loadavg_end": os.getloadavg(),
        "software": software_versions(),
    }
    print(
        f"{'pass':<12} {'full s':>10} {'reduced s':>10} {'full/reduced':>13}   (median [min, max])"
    )
    for key in ("train_step", "draft_pass"):
        r = result[key]
        print(
            f"{key:<12} {r['full']['median']:>10.4f} {r['reduced']['median']:>10.4f} "
            f"{r['speedup_full_over_reduced']:>12.2f}x   full [{r['full']['min']:.4f}, "
            f"{r['full']['max']:.4f}] reduced [{r['reduced']['min']:.4f}, "
            f"{r['reduced']['max']:.4f}]"
        )
    out = args.out or default_out("reduced_vocab", "reduced_vocab.json")
    print(f"wrote {dump_json(out, result)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
