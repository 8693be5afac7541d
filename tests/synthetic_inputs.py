"""Synthetic inputs that several test folders share (importable by name: tests/ is on the path).

``staircase``: a GPU-like SPS cost table (planning, the ``simulate``/``plan`` commands);
``synthetic_rounds``: calibration rounds with a known miscalibration per position
(calibration, the ``calibrate`` command).
"""

from __future__ import annotations

import torch

from dspark_sglang.scheduling.cost_table import SpsCostTable


def staircase(
    tile: int = 32, top: float = 100.0, drop: float = 0.93, max_tokens: int = 1024
) -> SpsCostTable:
    """GPU-like staircase: flat inside ``tile``-token tiles, ``drop`` slower per tile."""
    probes = tuple(range(1, max_tokens + 1, tile))
    return SpsCostTable(
        sample_batch_tokens=probes,
        sample_steps_per_sec=tuple(top * drop**i for i in range(len(probes))),
        max_batch_tokens=max_tokens,
    )


def synthetic_rounds(
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
