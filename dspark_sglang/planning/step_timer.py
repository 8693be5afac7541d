"""Seconds per engine forward, read from a cost table (the simulator's clock)."""

from __future__ import annotations

import torch

from dspark_sglang.scheduling.cost_table import CostModel

__all__ = ["StepTimer"]


class StepTimer:
    """Seconds per engine forward from a cost table, splitting batches above its limit.

    ``time(n, b) = k / SPS(n, M) + 1 / SPS(n, b - k*M)`` with ``k = floor(b / M)`` full
    forwards of ``M = max_batch_tokens`` (``M`` absent: one forward), memoised.
    """

    def __init__(self, cost_model: CostModel) -> None:
        self.cost_model = cost_model
        mbt = getattr(cost_model, "max_batch_tokens", None)
        self.max_batch_tokens: int | None = (
            int(mbt) if isinstance(mbt, int) and not isinstance(mbt, bool) else None
        )
        self._cache: dict[tuple[int, int], float] = {}

    def _one(self, num_reqs: int, tokens: int) -> float:
        sps = self.cost_model.steps_per_sec(num_reqs, torch.tensor([tokens]))
        return 1.0 / float(torch.as_tensor(sps).reshape(-1)[0])

    def __call__(self, num_reqs: int, batch_tokens: int) -> float:
        key = (num_reqs, batch_tokens)
        hit = self._cache.get(key)
        if hit is not None:
            return hit
        m = self.max_batch_tokens
        if m is None or batch_tokens <= m:
            t = self._one(num_reqs, max(1, batch_tokens))
        else:
            full, rest = divmod(batch_tokens, m)
            t = full * self._one(num_reqs, m) + (self._one(num_reqs, rest) if rest else 0.0)
        if len(self._cache) > 100_000:
            self._cache.clear()
        self._cache[key] = t
        return t
