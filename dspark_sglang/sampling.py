"""Turning logits into the distribution a token is actually drawn from.

Verification is lossless only if the drafter's proposal probabilities ``p_d`` and
the target's ``p_t`` are the *processed* distributions (temperature, top-k, top-p)
that tokens are really sampled from. Drafter and verifier therefore share this
one function; nothing else in the package converts logits to probabilities.

Invariant: ``logits_to_probs`` returns a float32 distribution over the last
axis that sums to 1 and is zero exactly on the tokens top-k/top-p removed;
temperature 0 means greedy and yields a one-hot at the argmax.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SamplingParams:
    """Per-request sampling settings (SGLang's names and defaults)."""

    temperature: float = 1.0
    top_k: int = -1  # -1 or 0: off
    top_p: float = 1.0

    def __post_init__(self) -> None:
        if not (self.temperature >= 0.0):
            raise ValueError(f"temperature must be >= 0 (0 = greedy), got {self.temperature}")
        if not (0.0 < self.top_p <= 1.0):
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < -1:
            raise ValueError(f"top_k must be -1 (off) or >= 0, got {self.top_k}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def _as_column(value: float | torch.Tensor, rows: int, device: torch.device) -> torch.Tensor:
    t = torch.as_tensor(value, dtype=torch.float32, device=device)
    return t.reshape(-1, 1).expand(rows, 1) if t.numel() == 1 else t.reshape(rows, 1)


def logits_to_probs(
    logits: torch.Tensor,
    temperature: float | torch.Tensor = 1.0,
    top_k: int | torch.Tensor = -1,
    top_p: float | torch.Tensor = 1.0,
) -> torch.Tensor:
    """Processed sampling distribution of ``logits`` (``[..., V]``).

    ``temperature``/``top_k``/``top_p`` are scalars or one value per row of the
    flattened leading dims, so a batch may mix greedy and sampled requests.
    """
    shape = logits.shape
    x = logits.reshape(-1, shape[-1]).float()
    rows, vocab = x.shape
    temp = _as_column(temperature, rows, x.device)
    greedy = temp <= 0.0
    x = x / torch.where(greedy, torch.ones_like(temp), temp)

    k = torch.as_tensor(top_k, dtype=torch.int64, device=x.device)
    k = k.reshape(-1, 1).expand(rows, 1) if k.numel() == 1 else k.reshape(rows, 1)
    k = torch.where(k <= 0, torch.full_like(k, vocab), k.clamp(max=vocab))
    p = _as_column(top_p, rows, x.device)

    if bool((k < vocab).any()) or bool((p < 1.0).any()):
        sorted_x, order = torch.sort(x, dim=-1, descending=True)
        ranks = torch.arange(vocab, device=x.device).unsqueeze(0)
        drop = ranks >= k
        sorted_probs = torch.softmax(sorted_x.masked_fill(drop, float("-inf")), dim=-1)
        # Keep the smallest prefix whose mass reaches top_p (always keep the first).
        mass_before = sorted_probs.cumsum(-1) - sorted_probs
        drop |= mass_before >= p
        sorted_x = sorted_x.masked_fill(drop, float("-inf"))
        x = torch.full_like(x, float("-inf")).scatter(-1, order, sorted_x)

    probs = torch.softmax(x, dim=-1)
    if bool(greedy.any()):
        one_hot = torch.zeros_like(probs).scatter_(-1, x.argmax(-1, keepdim=True), 1.0)
        probs = torch.where(greedy, one_hot, probs)
    return probs.reshape(shape)


def sample(probs: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """One draw per row of ``probs`` (``[..., V]``), shape ``[...]``."""
    flat = probs.reshape(-1, probs.shape[-1])
    return torch.multinomial(flat, 1, generator=generator).reshape(probs.shape[:-1])
