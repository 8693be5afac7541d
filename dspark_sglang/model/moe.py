"""Draft feed-forward blocks: dense SwiGLU and a top-k routed MoE.

SwiGLU:  ``y = W_down(silu(W_gate x) * W_up x)``.

MoE (per token ``x``, ``E`` experts, top ``k``):

    pi      = softmax(W_router x)                       router probabilities, [E]
    S       = top-k indices of pi;  g_e = pi_e / sum_{j in S} pi_j   (renormalised)
    y       = sum_{e in S} g_e * SwiGLU_e(x)  [+ SwiGLU_shared(x) if shared_expert]
    aux     = E * sum_e f_e * P_e                        Switch load-balancing loss
              f_e = share of the T*k routing slots that went to e,  P_e = mean_t pi_e

Invariants: the k routing weights of a token sum to 1; ``aux`` is 1 under a
perfectly uniform router and grows as routing collapses. Tokens are grouped per
expert with one sort, so the only Python loop is over experts, never tokens.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class SwiGLU(nn.Module):
    """Dense gated FFN (HF/SGLang names ``gate_proj``/``up_proj``/``down_proj``)."""

    def __init__(self, hidden_size: int, intermediate_size: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.up_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DenseFFN(SwiGLU):
    """``ffn_type="dense"``: a SwiGLU with the same ``(y, aux)`` interface as the MoE."""

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:  # type: ignore[override]
        return super().forward(x), x.new_zeros(())


def route(
    router_logits: torch.Tensor, top_k: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Softmax router with renormalised top-k: ``(weights [T,k], experts [T,k], probs [T,E])``."""
    probs = torch.softmax(router_logits.float(), dim=-1)
    top_p, experts = torch.topk(probs, top_k, dim=-1)
    return top_p / top_p.sum(-1, keepdim=True), experts, probs


def load_balancing_loss(probs: torch.Tensor, experts: torch.Tensor) -> torch.Tensor:
    """Switch-Transformer aux loss ``E * sum_e f_e P_e`` (1 when perfectly balanced)."""
    num_experts = probs.shape[-1]
    counts = torch.bincount(experts.reshape(-1), minlength=num_experts).to(probs.dtype)
    f = counts / experts.numel()
    return num_experts * (f * probs.mean(0)).sum()


class ExpertBank(nn.Module):
    """``E`` SwiGLU experts stored as 3D tensors (transformers-5 Qwen3-MoE layout).

    ``gate_up_proj[e] = [W_gate_e ; W_up_e]`` (``[2I, H]``), ``down_proj[e]`` is ``[H, I]``.
    """

    def __init__(self, num_experts: int, hidden_size: int, intermediate_size: int) -> None:
        super().__init__()
        self.intermediate_size = intermediate_size
        self.gate_up_proj = nn.Parameter(
            torch.empty(num_experts, 2 * intermediate_size, hidden_size)
        )
        self.down_proj = nn.Parameter(torch.empty(num_experts, hidden_size, intermediate_size))
        nn.init.normal_(self.gate_up_proj, std=0.02)
        nn.init.normal_(self.down_proj, std=0.02)

    def forward(
        self, x: torch.Tensor, experts: torch.Tensor, weights: torch.Tensor
    ) -> torch.Tensor:
        """``sum_{e in S_t} g_{t,e} SwiGLU_e(x_t)`` for tokens ``x`` ``[T, H]``."""
        top_k = experts.shape[-1]
        flat = experts.reshape(-1)
        order = torch.argsort(flat, stable=True)  # routing slots grouped by expert
        token_of_slot = order // top_k
        slot_weight = weights.reshape(-1)[order].to(x.dtype)
        counts = torch.bincount(flat, minlength=self.gate_up_proj.shape[0]).tolist()
        out = torch.zeros_like(x)
        inter = self.intermediate_size
        start = 0
        for e, n in enumerate(counts):
            if n == 0:
                continue
            idx = token_of_slot[start : start + n]
            xe = x[idx]
            w = self.gate_up_proj[e]
            h = F.silu(F.linear(xe, w[:inter])) * F.linear(xe, w[inter:])
            ye = F.linear(h, self.down_proj[e]) * slot_weight[start : start + n, None]
            out.index_add_(0, idx, ye)
            start += n
        return out


class MoEFFN(nn.Module):
    """``ffn_type="moe"``: router ``gate``, routed ``experts``, optional ``shared_expert``."""

    def __init__(
        self,
        hidden_size: int,
        num_experts: int,
        top_k: int,
        moe_intermediate_size: int,
        shared_expert_intermediate_size: int | None,
    ) -> None:
        super().__init__()
        self.top_k = top_k
        self.gate = nn.Linear(hidden_size, num_experts, bias=False)
        self.experts = ExpertBank(num_experts, hidden_size, moe_intermediate_size)
        self.shared_expert: SwiGLU | None = (
            SwiGLU(hidden_size, shared_expert_intermediate_size)
            if shared_expert_intermediate_size is not None
            else None
        )

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(y, aux_loss)`` for ``x`` ``[..., H]``."""
        shape = x.shape
        tokens = x.reshape(-1, shape[-1])
        weights, experts, probs = route(self.gate(tokens), self.top_k)
        y = self.experts(tokens, experts, weights)
        if self.shared_expert is not None:
            y = y + self.shared_expert(tokens)
        return y.reshape(shape), load_balancing_loss(probs, experts)
