"""Torch-only GPU check: device policies, CUDA graphs, verification and a training step.

For a GPU machine with CUDA torch and no SGLang (``scripts/gpu_check.sh`` runs it; the
SGLang engine check is ``scripts/gpu_sglang_check.sh``). It imports torch, numpy and
only those ``dspark_sglang`` modules that do not import SGLang. Four checks, each one
row of the table and of the JSON (``status`` pass, fail or error):

1. ``device_policies``: prefix, lagged, static-k and verify-all as device code
   (``scheduling/device_policies.py``) against the host policies (``policies.py``) on
   seeded random confidences and cost tables (staircase and additive). Every decide
   call after a warm-up of the same shape runs under
   ``torch.cuda.set_sync_debug_mode("error")``, so a host sync raises. Pass: the same
   verify lengths as the host on every case and step. (A CUDA scan may round a running
   sum in its last bit; with continuous random confidences an exact ``theta`` tie that
   this could flip has probability ~0, so any mismatch fails the check.)
2. ``draft_cuda_graph``: a drafter (``model/drafter.py``, random weights, dense FFN,
   each Markov head: vanilla, gated, rnn) drafts one block greedily: ``forward_block``
   then the Markov loop with ``argmax`` (the graph-safe form of
   ``block_sampler.sample_block`` at temperature 0, whose ``logits_to_probs`` reads
   values on the host). The loop is captured as a CUDA graph on one input set and
   replayed on another; pass: the replayed tokens equal ``sample_block``'s eager tokens
   on that input, and the base logits agree. The training MoE reads its expert counts
   on the host (``bincount().tolist()``), so it cannot be captured; SGLang's draft
   class has a dense MoE for that (``sglang_integration/moe_draft_model.py``, checked by
   the SGLang tests). Sampling is not captured: ``torch.multinomial`` over a CUDA
   generator is not compared with eager here. On CPU there is no capture: the row says
   so and compares the graph-safe loop, run eagerly, with ``sample_block``.
3. ``verify_chain``: ``greedy_verify`` and ``chain_verify`` (``verify/chain.py``) on the
   device against the CPU on the same inputs; greedy: every output equal; sampled: the
   same uniforms (``chain_verify(uniforms=...)``) give the same accept lengths and
   accepted tokens (the final token is drawn from each device's own generator, so
   only its validity is compared: it is never the padding token).
4. ``train_step``: one drafter training step at the paper's scale (512 anchors, a
   151936-token vocabulary, SmolLM2's width, the committed recipe
   ``configs/dspark_smollm2.yaml``'s drafter, random weights): ``trainer.batch_loss``
   under bf16 autocast (on CUDA), ``backward``, gradient clipping and an AdamW step.
   Reports the median step time of 5 timed steps after two warm-ups and
   ``torch.cuda.max_memory_allocated``; pass: finite loss and gradients.

``--device cpu --small`` runs all four at small sizes on the CPU (the CPU test). Exit
status: 0 when every check passed, 1 otherwise, 2 on bad arguments or no CUDA device.
The JSON (``--out``; default ``gpu_check.json`` in a fresh run folder,
``scripts/gpu_check.sh`` names ``benchmarks/results/gpu_check.json``) keeps every row,
the sizes and the environment. Checks 1 and 2 and what every check shares (sizes, the
row, the target geometry) are ``dspark_sglang/bench/gpu_check/``, re-exported here;
checks 3 and 4 and the driver are this script.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import platform
import statistics
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from dspark_sglang.bench.gpu_check.common import (
    FULL,
    PAPER_VOCAB,
    SMALL,
    Row,
    Sizes,
    target_spec,
)
from dspark_sglang.bench.gpu_check.common import shared_modules as _shared_modules
from dspark_sglang.bench.gpu_check.common import verdict as _verdict
from dspark_sglang.bench.gpu_check.drafting import check_draft_graph, greedy_draft
from dspark_sglang.bench.gpu_check.policies import check_device_policies

__all__ = [
    "CHECKS",
    "FULL",
    "PAPER_VOCAB",
    "RECIPE",
    "REPO",
    "SMALL",
    "Row",
    "Sizes",
    "check_device_policies",
    "check_draft_graph",
    "check_train_step",
    "check_verify",
    "environment",
    "format_table",
    "greedy_draft",
    "main",
    "parse_args",
    "run_checks",
    "target_spec",
]

REPO = Path(__file__).resolve().parents[1]
RECIPE = REPO / "configs" / "dspark_smollm2.yaml"


# --------------------------------------------------------------------------- 3. verification


def check_verify(device: torch.device, sizes: Sizes, seed: int) -> Row:
    """``greedy_verify``/``chain_verify`` on ``device`` vs the CPU on the same inputs."""
    from dspark_sglang.verify import PAD_TOKEN, chain_verify, greedy_verify

    n, b, v = sizes.verify_requests, sizes.verify_block, sizes.verify_vocab
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(n, b + 1, v, generator=g) * 3.0
    p_t = torch.softmax(logits, -1)
    p_d = torch.softmax(logits[:, :b] + torch.randn(n, b, v, generator=g), -1)
    drafts = torch.multinomial(p_d.reshape(-1, v), 1, generator=g).reshape(n, b)
    lens = torch.randint(0, b + 1, (n,), generator=g)
    uniforms = torch.rand((n, b), generator=g)
    greedy_drafts = torch.where(torch.rand(n, b, generator=g) < 0.8, p_t[:, :b].argmax(-1), drafts)
    argmax = p_t.argmax(-1)

    def on(dev: torch.device) -> tuple[Any, Any]:
        gr = greedy_verify(greedy_drafts.to(dev), argmax.to(dev), lens.to(dev))
        gen = torch.Generator(device=dev).manual_seed(seed)
        ch = chain_verify(
            drafts.to(dev), p_d.to(dev), p_t.to(dev), lens.to(dev), gen, uniforms=uniforms.to(dev)
        )
        return gr, ch

    cpu_greedy, cpu_chain = on(torch.device("cpu"))
    dev_greedy, dev_chain = on(device)
    greedy_same = all(
        torch.equal(getattr(dev_greedy, f).cpu(), getattr(cpu_greedy, f))
        for f in ("accept_lens", "tokens", "num_emitted")
    )
    acc = cpu_chain.accept_lens
    chain_same = torch.equal(dev_chain.accept_lens.cpu(), acc)
    cols = torch.arange(b + 1).unsqueeze(0)
    accepted = cols < acc.unsqueeze(1)
    prefix_same = torch.equal(
        torch.where(accepted, dev_chain.tokens.cpu(), PAD_TOKEN),
        torch.where(accepted, cpu_chain.tokens, PAD_TOKEN),
    )
    final_ok = bool((dev_chain.tokens.cpu().gather(1, acc.unsqueeze(1)) != PAD_TOKEN).all())
    mixed = 0 < int(acc.sum()) < int(lens.sum())  # accepts and rejects: not a vacuous check
    ok = greedy_same and chain_same and prefix_same and final_ok and mixed
    detail = (
        f"greedy {'equal' if greedy_same else 'DIFFERS'}; sampled (same uniforms): accept lens "
        f"{'equal' if chain_same else 'DIFFER'}, accepted tokens "
        f"{'equal' if prefix_same else 'DIFFER'}; mean accept {float(acc.float().mean()):.2f} "
        f"of mean verify length {float(lens.float().mean()):.2f} (N={n}, B={b}, V={v})"
    )
    if not mixed:
        detail += "; VACUOUS: no accept or no reject"
    return Row(
        "verify_chain",
        _verdict(ok),
        detail,
        {
            "greedy_equal": greedy_same,
            "chain_accept_lens_equal": chain_same,
            "chain_accepted_tokens_equal": prefix_same,
            "mean_accept_len": float(acc.float().mean()),
            "mean_verify_len": float(lens.float().mean()),
        },
    )


# --------------------------------------------------------------------------- 4. training step


def _synthetic_batch(drafter: Any, sizes: Sizes, device: torch.device, seed: int) -> Any:
    """One sequence of ``train_seq_len`` random tokens with ``train_anchors`` anchors."""
    from dspark_sglang.training.dataset import TrainBatch

    g = torch.Generator().manual_seed(seed)
    cfg = drafter.config
    b, v, h, t, a = (
        cfg.block_size,
        cfg.vocab_size,
        cfg.hidden_size,
        sizes.train_seq_len,
        sizes.train_anchors,
    )
    if a > t - b - 2:
        raise ValueError(f"train_anchors={a} needs train_seq_len > {a + b + 2}, got {t}")
    tokens = torch.randint(0, v, (1, t), generator=g)
    pos = (torch.randperm(t - b - 2, generator=g)[:a].sort().values + 1).unsqueeze(0)
    idx = pos.unsqueeze(-1) + torch.arange(b)
    batch = TrainBatch(
        tokens=tokens,
        seq_lens=torch.full((1,), t),
        context_hidden=torch.randn(1, t, cfg.num_context_features * h, generator=g),
        anchors=pos,
        anchor_tokens=tokens.gather(1, pos),
        anchor_mask=torch.ones(1, a, dtype=torch.bool),
        labels=tokens.gather(1, (idx + 1).reshape(1, -1)).reshape(1, a, b),
        prev_tokens=tokens.gather(1, idx.reshape(1, -1)).reshape(1, a, b),
        valid=torch.ones(1, a, b, dtype=torch.bool),
        target_last=torch.randn(1, a, b, h, generator=g),
    )
    return batch.to(device)


def check_train_step(device: torch.device, sizes: Sizes, seed: int) -> Row:
    """A timed ``batch_loss`` + backward + clip + AdamW step of the recipe's drafter."""
    from dspark_sglang.training.config import load_config
    from dspark_sglang.training.trainer import batch_loss, build_drafter

    autocast = "bfloat16" if device.type == "cuda" else "float32"
    cfg = load_config(RECIPE).with_overrides(run={"autocast": autocast, "seed": seed})
    spec = target_spec(sizes, sizes.train_vocab)
    torch.manual_seed(seed)
    emb, lm_head = _shared_modules(spec, device)
    drafter = build_drafter(cfg, spec, None, emb, lm_head, 0).to(device).train()
    batch = _synthetic_batch(drafter, sizes, device, seed)
    params = [p for p in drafter.parameters() if p.requires_grad]
    o = cfg.optim
    opt = torch.optim.AdamW(params, lr=o.lr, betas=(o.beta1, o.beta2), weight_decay=o.weight_decay)

    def step() -> float:
        opt.zero_grad(set_to_none=True)
        loss, _ = batch_loss(drafter, lm_head, batch, cfg)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, o.grad_clip)
        opt.step()
        return float(loss.detach())

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    losses = [step(), step()]  # warm-up (allocator, kernels)
    grads_finite = all(bool(torch.isfinite(p.grad).all()) for p in params if p.grad is not None)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    secs = []
    for _ in range(sizes.train_steps):
        sync()
        t0 = time.perf_counter()
        losses.append(step())
        sync()
        secs.append(time.perf_counter() - t0)
    peak = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None
    finite = all(math.isfinite(x) for x in losses) and grads_finite
    median = statistics.median(secs)
    n_params = sum(p.numel() for p in params)
    detail = (
        f"{median * 1e3:.1f} ms/step median of {len(secs)} [{min(secs) * 1e3:.1f}, "
        f"{max(secs) * 1e3:.1f}], peak "
        + (f"{peak / 2**30:.2f} GiB" if peak is not None else "n/a (cpu)")
        + f"; {sizes.train_anchors} anchors x block {cfg.drafter.block_size}, V={spec.vocab_size}, "
        f"{autocast}, loss {losses[0]:.3f} -> {losses[-1]:.3f}"
        + ("" if finite else "; NON-FINITE loss or gradient")
    )
    return Row(
        "train_step",
        _verdict(finite),
        detail,
        {
            "step_seconds": secs,
            "median_step_seconds": median,
            "max_memory_allocated_bytes": peak,
            "losses": losses,
            "anchors": sizes.train_anchors,
            "vocab_size": spec.vocab_size,
            "drafter_parameters": n_params,
            "autocast": autocast,
            "recipe": str(RECIPE.relative_to(REPO)),
        },
    )


# --------------------------------------------------------------------------- driver

CHECKS: dict[str, Callable[[torch.device, Sizes, int], Row]] = {
    "device_policies": check_device_policies,
    "draft_cuda_graph": check_draft_graph,
    "verify_chain": check_verify,
    "train_step": check_train_step,
}


def run_checks(device: torch.device, sizes: Sizes, seed: int, only: list[str]) -> list[Row]:
    """Every check in ``only``; an exception is that check's ``error`` row, not the end."""
    rows = []
    for name in only:
        t0 = time.perf_counter()
        try:
            row = CHECKS[name](device, sizes, seed)
        except Exception as exc:  # one broken check must not hide the others
            tb = traceback.format_exc(limit=4)
            row = Row(name, "error", f"{type(exc).__name__}: {exc}", {"traceback": tb})
        row.metrics["wall_seconds"] = time.perf_counter() - t0
        print(f"[gpu_check] {row.check}: {row.status} ({row.metrics['wall_seconds']:.1f} s)")
        rows.append(row)
    return rows


def format_table(rows: list[Row]) -> str:
    lines = [f"{'check':<18} {'status':<6} detail", "-" * 100]
    lines += [f"{r.check:<18} {r.status:<6} {r.detail}" for r in rows]
    return "\n".join(lines)


def environment(device: torch.device) -> dict[str, Any]:
    env: dict[str, Any] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "numpy": np.__version__,
        "cuda": torch.version.cuda,
        "device": str(device),
    }
    if device.type == "cuda":
        env["gpu"] = torch.cuda.get_device_name(device)
    return env


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="gpu_check.py", description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda", help="cuda (default), cuda:N or cpu")
    ap.add_argument("--small", action="store_true", help="small sizes (the CPU test)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--only",
        default=",".join(CHECKS),
        help=f"comma-separated checks to run (default: all of {','.join(CHECKS)})",
    )
    ap.add_argument(
        "--out",
        type=Path,
        default=None,
        help="result JSON (default: gpu_check.json in a fresh run folder, "
        "<cache>/runs/bench/gpu_check-<UTC time>/)",
    )
    args = ap.parse_args(argv)
    args.only = [c for c in args.only.split(",") if c]
    unknown = sorted(set(args.only) - set(CHECKS))
    if unknown or not args.only:
        ap.error(f"--only: unknown checks {unknown}; choose from {','.join(CHECKS)}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("[gpu_check] no CUDA device visible: pass --device cpu --small for the CPU run")
        return 2
    if device.type not in ("cuda", "cpu"):
        print(f"[gpu_check] --device {args.device}: use cuda, cuda:N or cpu", file=sys.stderr)
        return 2
    sizes = SMALL if args.small else FULL
    t0 = time.perf_counter()
    rows = run_checks(device, sizes, args.seed, args.only)
    print(format_table(rows))
    doc = {
        "benchmark": "gpu_check",
        "all_passed": all(r.status == "pass" for r in rows),
        "wall_seconds": time.perf_counter() - t0,
        "settings": {"device": args.device, "small": args.small, "seed": args.seed},
        "sizes": dataclasses.asdict(sizes),
        "environment": environment(device),
        "rows": [dataclasses.asdict(r) for r in rows],
    }
    from dspark_sglang.results import default_out, dump_json

    out = args.out or default_out("gpu_check", "gpu_check.json")
    dump_json(out, doc)
    print(f"[gpu_check] wrote {out}")
    return 0 if doc["all_passed"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
