"""Synthetic calibration rounds with a known miscalibration per position."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

Synth = Callable[..., tuple[torch.Tensor, torch.Tensor, torch.Tensor]]


def _synthetic(
    m: int,
    t_star: list[float],
    seed: int,
    mu: float = 1.5,
    sigma: float = 1.5,
    verified: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Rounds whose true conditional acceptance is ``sigmoid(z_k / T*_k)``.

    The true logit per position is ``N(mu, sigma^2)``; the head reports
    ``z = true_logit * T*`` (so ``sigmoid(z)`` is over- or under-confident);
    drafts pass independently with the true probability and ``accepted`` counts
    the leading passes, capped by ``verified`` when given. Returns float64
    logits ``[M, B]``, accepted ``[M]`` and the uncensored accepted counts.
    """
    g = torch.Generator().manual_seed(seed)
    b = len(t_star)
    true_logit = mu + sigma * torch.randn(m, b, generator=g, dtype=torch.float64)
    z = true_logit * torch.tensor(t_star, dtype=torch.float64)
    passed = torch.rand(m, b, generator=g, dtype=torch.float64) < torch.sigmoid(true_logit)
    full = torch.cumprod(passed.long(), dim=1).sum(1)
    acc = full if verified is None else torch.minimum(full, verified)
    return z, acc, full


@pytest.fixture
def synthetic() -> Synth:
    return _synthetic
