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
the sizes and the environment.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import platform
import random
import statistics
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]
RECIPE = REPO / "configs" / "dspark_smollm2.yaml"
PAPER_VOCAB = 151936


@dataclass(frozen=True)
class Sizes:
    """Problem sizes of one run (``full`` on a GPU, ``small`` for the CPU test)."""

    policy_cases: int
    policy_max_n: int
    policy_block: int
    lagged_steps: int
    graph_requests: int
    graph_context: int
    verify_requests: int
    verify_block: int
    verify_vocab: int
    train_vocab: int
    train_anchors: int
    train_seq_len: int
    train_steps: int
    tiny_target: bool


FULL = Sizes(
    policy_cases=48,
    policy_max_n=256,
    policy_block=7,
    lagged_steps=6,
    graph_requests=16,
    graph_context=256,
    verify_requests=32,
    verify_block=7,
    verify_vocab=PAPER_VOCAB,
    train_vocab=PAPER_VOCAB,
    train_anchors=512,
    train_seq_len=2048,
    train_steps=5,
    tiny_target=False,
)
SMALL = Sizes(
    policy_cases=6,
    policy_max_n=16,
    policy_block=5,
    lagged_steps=4,
    graph_requests=3,
    graph_context=24,
    verify_requests=16,
    verify_block=5,
    verify_vocab=64,
    train_vocab=512,
    train_anchors=8,
    train_seq_len=64,
    train_steps=2,
    tiny_target=True,
)


@dataclass
class Row:
    """One check's outcome: ``status`` is ``pass``, ``fail`` or ``error``."""

    check: str
    status: str
    detail: str
    metrics: dict[str, Any] = field(default_factory=dict)


def _verdict(ok: bool) -> str:
    return "pass" if ok else "fail"


def target_spec(sizes: Sizes, vocab_size: int) -> Any:
    """SmolLM2's geometry with ``vocab_size`` tokens, or a tiny target for ``--small``."""
    from dspark_sglang.model.config import TargetSpec
    from dspark_sglang.targets.smollm2 import SMOLLM2_GEOMETRY

    if not sizes.tiny_target:
        return dataclasses.replace(SMOLLM2_GEOMETRY, vocab_size=vocab_size)
    return TargetSpec(
        name="tiny",
        vocab_size=vocab_size,
        hidden_size=64,
        num_layers=30,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        rope_theta=10000.0,
        rms_norm_eps=1e-5,
        max_position_embeddings=4096,
    )


def _shared_modules(spec: Any, device: torch.device) -> tuple[torch.nn.Embedding, torch.nn.Linear]:
    emb = torch.nn.Embedding(spec.vocab_size, spec.hidden_size, device=device)
    head = torch.nn.Linear(spec.hidden_size, spec.vocab_size, bias=False, device=device)
    torch.nn.init.normal_(emb.weight, std=0.02)
    torch.nn.init.normal_(head.weight, std=0.02)
    return emb, head


# --------------------------------------------------------------------------- 1. policies


def _random_table(rng: random.Random, max_tokens: int) -> Any:
    """A staircase (monotone or jagged, cap often binding) or an additive table."""
    from dspark_sglang.scheduling.cost_table import SpsAdditiveCostTable, SpsCostTable

    if rng.random() < 0.25:
        bs = tuple(sorted(rng.sample(range(1, 300), rng.randint(1, 3))))
        m = (1, 64, 512, 4096)[: rng.randint(1, 4)]
        return SpsAdditiveCostTable(
            bias_seconds=rng.uniform(0.005, 0.02),
            bs_probes=bs,
            alpha_seconds=tuple(rng.uniform(0.0, 0.004) for _ in bs),
            m_probes=m,
            theta_seconds=tuple(sorted(rng.uniform(0.0, 0.05) for _ in m)),
        )
    probes = sorted(rng.sample(range(1, max_tokens + 1), rng.randint(2, 12)))
    rates = [rng.uniform(20.0, 100.0) for _ in probes]
    if rng.random() < 0.6:
        rates.sort(reverse=True)
    slack = rng.choice([0, rng.randint(0, max_tokens), 10**5])
    return SpsCostTable(
        sample_batch_tokens=tuple(probes),
        sample_steps_per_sec=tuple(rates),
        max_batch_tokens=probes[-1] + slack,
    )


def _host_policies(table: Any) -> dict[str, Any]:
    from dspark_sglang.scheduling.policies import (
        LaggedBudgetScheduler,
        PrefixScheduler,
        StaticK,
        VerifyAll,
    )

    return {
        "prefix": PrefixScheduler(table),
        "lagged": LaggedBudgetScheduler(table, lag=2),
        "static-k": StaticK(3),
        "verify-all": VerifyAll(),
    }


def _sync_guard(device: torch.device) -> Any:
    """``set_sync_debug_mode("error")`` on CUDA for the block; nothing on other devices."""

    class _Guard:
        def __enter__(self) -> None:
            if device.type == "cuda":
                torch.cuda.set_sync_debug_mode("error")

        def __exit__(self, *exc: object) -> None:
            if device.type == "cuda":
                torch.cuda.set_sync_debug_mode("default")

    return _Guard()


def check_device_policies(device: torch.device, sizes: Sizes, seed: int) -> Row:
    """Device policies vs the host ones on random cases; decide under no-sync mode."""
    from dspark_sglang.scheduling.device_policies import device_twin

    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    b = sizes.policy_block
    decisions = mismatches = 0
    first_mismatch: str | None = None
    for case in range(sizes.policy_cases):
        n = rng.choice([1, 2, 3, 8, sizes.policy_max_n // 2, sizes.policy_max_n])
        table = _random_table(rng, sizes.policy_max_n * (b + 1))
        steps = [
            torch.rand((n, b), generator=gen).clamp_(1e-4, 1 - 1e-4)
            for _ in range(sizes.lagged_steps + 1)
        ]
        for name, host in _host_policies(table).items():
            dev = device_twin(host, device)
            moved = [c.to(device) for c in steps]
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            got = [dev.decide(moved[0])]  # warm-up: the cost-table rows of this (N, B)
            with _sync_guard(device):
                got += [dev.decide(c) for c in moved[1:]]
            want = [host.decide(c) for c in steps]
            for t, (g, w) in enumerate(zip(got, want, strict=True)):
                decisions += 1
                if not torch.equal(g.cpu(), w.cpu()):
                    mismatches += 1
                    if first_mismatch is None:
                        first_mismatch = (
                            f"case {case} {name} step {t} N={n}: device {g.cpu().tolist()} "
                            f"host {w.cpu().tolist()}"
                        )
    ok = mismatches == 0
    mode = "sync_debug_mode=error" if device.type == "cuda" else "no sync mode on cpu"
    detail = f"{decisions} decisions, {mismatches} differ from the host ({mode})"
    if first_mismatch:
        detail += f"; first: {first_mismatch}"
    return Row(
        "device_policies",
        _verdict(ok),
        detail,
        {"decisions": decisions, "mismatches": mismatches, "cases": sizes.policy_cases},
    )


# --------------------------------------------------------------------------- 2. CUDA graph


def greedy_draft(
    drafter: Any,
    ctx: torch.Tensor,
    ctx_pos: torch.Tensor,
    valid: torch.Tensor,
    anchors: torch.Tensor,
    anchor_pos: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``forward_block`` + the greedy Markov loop, with no host read: ``(tokens, base)``."""
    block = drafter.forward_block(ctx, ctx_pos, valid, anchors, anchor_pos)
    head = drafter.markov_head
    hidden, base = block.hidden, block.base_logits
    state = head.init_state(hidden[:, 0]) if head is not None else None
    prev = anchors.long()
    tokens = []
    for k in range(base.shape[1]):
        logits = base[:, k]
        if head is not None:
            bias, state = head.step(prev, hidden[:, k], state)
            logits = logits + bias.float()
        prev = drafter.to_target_vocab(logits.argmax(-1))
        tokens.append(prev)
    return torch.stack(tokens, dim=1), base


def _draft_inputs(drafter: Any, n: int, c: int, gen: torch.Generator) -> list[torch.Tensor]:
    cfg = drafter.config
    feats = cfg.num_context_features * cfg.target_hidden_size
    return [
        torch.randn(n, c, feats, generator=gen),
        torch.arange(c).expand(n, c).clone(),
        torch.ones(n, c, dtype=torch.bool),
        torch.randint(0, cfg.vocab_size, (n,), generator=gen),
        torch.full((n,), c, dtype=torch.int64),
    ]


def check_draft_graph(device: torch.device, sizes: Sizes, seed: int) -> Row:
    """Captured greedy draft (CUDA) vs ``sample_block`` eager, for each Markov head."""
    from dspark_sglang.model import DSparkConfig, DSparkDrafter, sample_block

    spec = target_spec(sizes, PAPER_VOCAB if not sizes.tiny_target else 512)
    capture = device.type == "cuda"
    per_head: dict[str, Any] = {}
    for head_type in ("vanilla", "gated", "rnn"):
        torch.manual_seed(seed)
        emb, lm_head = _shared_modules(spec, device)
        cfg = DSparkConfig.for_target(
            spec,
            mask_token_id=0,
            num_hidden_layers=2,
            ffn_type="dense",
            markov_head_type=head_type,
            markov_rank=48,
        )
        drafter = DSparkDrafter(cfg, emb, lm_head).to(device).eval()
        gen = torch.Generator().manual_seed(seed + 1)
        first = [
            t.to(device)
            for t in _draft_inputs(drafter, sizes.graph_requests, sizes.graph_context, gen)
        ]
        second = [
            t.to(device)
            for t in _draft_inputs(drafter, sizes.graph_requests, sizes.graph_context, gen)
        ]
        with torch.no_grad():
            if capture:
                static = [t.clone() for t in first]
                side = torch.cuda.Stream(device)
                side.wait_stream(torch.cuda.current_stream(device))
                with torch.cuda.stream(side):
                    for _ in range(2):
                        greedy_draft(drafter, *static)
                torch.cuda.current_stream(device).wait_stream(side)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    out_tokens, out_base = greedy_draft(drafter, *static)
                for dst, src in zip(static, second, strict=True):
                    dst.copy_(src)
                graph.replay()
                torch.cuda.synchronize(device)
                tokens, base = out_tokens.clone(), out_base.clone()
            else:
                tokens, base = greedy_draft(drafter, *second)
            block = drafter.forward_block(*second)
            eager = sample_block(drafter, block, second[3], temperature=0.0)
        same = bool(torch.equal(tokens.cpu(), eager.tokens.cpu()))
        diff = float((base.float() - block.base_logits.float()).abs().max())
        per_head[head_type] = {"tokens_equal": same, "base_logits_max_abs_diff": diff}
    ok = all(h["tokens_equal"] and h["base_logits_max_abs_diff"] <= 1e-4 for h in per_head.values())
    how = (
        "captured on one input set, replayed on another"
        if capture
        else "capture skipped on cpu: the graph-safe loop runs eagerly"
    )
    detail = (
        f"{how}; tokens vs sample_block(T=0) eager: "
        + ", ".join(
            f"{k} {'equal' if v['tokens_equal'] else 'DIFFER'}" for k, v in per_head.items()
        )
        + f" (N={sizes.graph_requests}, context {sizes.graph_context}, V={spec.vocab_size})"
    )
    return Row("draft_cuda_graph", _verdict(ok), detail, {"captured": capture, "heads": per_head})


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
