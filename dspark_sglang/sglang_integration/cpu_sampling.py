"""CPU port of SGLang's chain speculative sampling kernel (temperature > 0 verify).

Why: SGLang 0.5.23's DSpark verify samples through
``chain_speculative_sampling_triton`` even on its "torch" path, and Triton has no
CPU driver, so the first non-greedy request killed the CPU scheduler. This port
fills the same output buffers from the same inputs (including SGLang's uniform
draws), vectorised over the batch, so CPU and GPU follow one algorithm.

Algorithm (classic chain speculative sampling, the kernel's non-block mode): for
slot ``s = 1 .. S-1`` while every earlier draft was accepted, accept candidate
``x_s`` iff ``0 < q(x_s) <= 1`` and ``u_{s-1} * q(x_s) < p(x_s)``, with ``p``/``q``
the target/draft rows ``s - 1``. After ``a`` accepted drafts the last token is drawn
by inverse CDF with ``u_final`` from ``p[a]`` if all ``S - 1`` were accepted, else
from ``max(p[a] - q'[a], 0)`` where ``q'`` zeroes entries that are not
probabilities (the kernel's guard); a zero-mass residual yields token ``V - 1``,
as the kernel does.

Invariant (losslessness): with independent uniforms, the emitted tokens are
distributed exactly as tokens sampled from the target one at a time.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

TARGET = "sglang.kernels.ops.speculative.dspark.dspark_accept.chain_speculative_sampling_triton"


def chain_speculative_sampling_torch(
    predicts: torch.Tensor,
    accept_index: torch.Tensor,
    accept_token_num: torch.Tensor,
    candidates: torch.Tensor,
    retrive_index: torch.Tensor,
    uniform_samples: torch.Tensor,
    uniform_samples_for_final_sampling: torch.Tensor,
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor,
) -> None:
    """Fill ``predicts``, ``accept_index`` and ``accept_token_num`` in place.

    Shapes as the kernel's: ``candidates [N, S]`` (slot 0 is the root),
    ``retrive_index [N, S]``, ``uniform_samples [N, >= S-1]``,
    ``uniform_samples_for_final_sampling [N]``, ``target_probs [N, S, V]``,
    ``draft_probs [N, S-1, V]``; ``predicts`` is indexed by ``retrive_index``.
    """
    n, slots = candidates.shape
    vocab = target_probs.shape[-1]
    rows = torch.arange(n, device=candidates.device)
    last = retrive_index[:, 0].to(torch.long).clone()
    accept_index[:, 0] = retrive_index[:, 0].to(accept_index.dtype)
    num_accept = torch.zeros(n, dtype=torch.long, device=candidates.device)
    alive = torch.ones(n, dtype=torch.bool, device=candidates.device)
    for step in range(1, slots):
        token = candidates[:, step].to(torch.long)
        p = target_probs[rows, step - 1, token].float()
        q = draft_probs[rows, step - 1, token].float()
        coin = uniform_samples[:, step - 1].float()
        ok = alive & (q > 0.0) & (q <= 1.0) & (coin * q < p)
        if not bool(ok.any()):
            break
        predicts[last[ok]] = token[ok].to(predicts.dtype)
        last = torch.where(ok, retrive_index[:, step].to(torch.long), last)
        accept_index[ok, step] = retrive_index[ok, step].to(accept_index.dtype)
        num_accept += ok.long()
        alive = ok
    accept_token_num.copy_(num_accept.to(accept_token_num.dtype))

    p_row = target_probs[rows, num_accept].float()
    all_accepted = num_accept == slots - 1
    if slots > 1:
        q_row = draft_probs[rows, num_accept.clamp(max=slots - 2)].float()
        q_row = torch.where((q_row >= 0.0) & (q_row <= 1.0), q_row, torch.zeros_like(q_row))
        residual = (p_row - q_row).clamp(min=0.0)
        dist = torch.where(all_accepted.unsqueeze(1), p_row, residual)
    else:
        dist = p_row
    cdf = dist.cumsum(-1)
    target_u = uniform_samples_for_final_sampling.float() * dist.sum(-1)
    over = cdf > target_u.unsqueeze(1)
    final = torch.where(over.any(-1), over.int().argmax(-1), torch.full_like(num_accept, vocab - 1))
    predicts[last] = final.to(predicts.dtype)


def chain_sampling_cpu_tolerant(original: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """AROUND hook: CPU tensors take the port, CUDA tensors SGLang's Triton kernel."""
    candidates = kwargs.get("candidates", args[3] if len(args) > 3 else None)
    if not isinstance(candidates, torch.Tensor) or candidates.is_cuda:
        return original(*args, **kwargs)
    if kwargs.get("block_verification", False):
        raise NotImplementedError(
            "SGLang's DSpark block verification has no CPU port in dspark_sglang; "
            "turn block verification off for CPU runs (chain verification is lossless too)"
        )
    names = (
        "predicts", "accept_index", "accept_token_num", "candidates", "retrive_index",
        "retrive_next_token", "retrive_next_sibling", "uniform_samples",
        "uniform_samples_for_final_sampling", "target_probs", "draft_probs",
    )  # fmt: skip
    bound = dict(zip(names, args, strict=False))
    bound.update({k: v for k, v in kwargs.items() if k in names})
    chain_speculative_sampling_torch(
        bound["predicts"],
        bound["accept_index"],
        bound["accept_token_num"],
        bound["candidates"],
        bound["retrive_index"],
        bound["uniform_samples"],
        bound["uniform_samples_for_final_sampling"],
        bound["target_probs"],
        bound["draft_probs"],
    )
    return None
