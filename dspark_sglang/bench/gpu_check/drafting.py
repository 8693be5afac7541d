"""Check 2, ``draft_cuda_graph``: the greedy draft loop as a CUDA graph equals eager drafting.

``greedy_draft`` is ``forward_block`` plus the Markov loop with ``argmax`` and no host
read, the graph-safe form of ``sample_block`` at temperature 0. On CUDA it is captured
on one input set and replayed on another; on CPU it runs eagerly.
"""

from __future__ import annotations

from typing import Any

import torch

from dspark_sglang.bench.gpu_check.common import (
    PAPER_VOCAB,
    Row,
    Sizes,
    shared_modules,
    target_spec,
    verdict,
)


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
        emb, lm_head = shared_modules(spec, device)
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
    return Row("draft_cuda_graph", verdict(ok), detail, {"captured": capture, "heads": per_head})
