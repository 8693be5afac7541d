"""``GenerationResult``: outputs and acceptance statistics of a reference-generator run."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class GenerationResult:
    """Outputs and acceptance statistics of one ``generate``/``plain_generate`` call.

    ``rounds[i]`` lists ``(verify_len, accepted)`` per speculative round of request
    ``i`` (empty for plain decoding). ``position_reached[k]`` counts rounds where
    draft ``k`` was verified with all earlier drafts accepted, ``position_accepted[k]``
    those where it was also accepted (conditional acceptance = accepted / reached).
    ``confidence_logits[i]`` is float32 ``[len(rounds[i]), B]``: the drafter's raw
    confidence logits (before STS) of every round of request ``i``, in round order,
    so rollouts for calibration and traces for the planner can be written from a
    run; ``None`` when the drafter has no confidence head (and for plain decoding).
    ``copies_reached`` / ``copies_accepted`` count the context-copied drafts among
    ``position_reached`` / ``position_accepted`` (0 without context copies).
    """

    outputs: list[list[int]]
    rounds: list[list[tuple[int, int]]]
    position_reached: torch.Tensor  # [B] int64
    position_accepted: torch.Tensor  # [B] int64
    wall_time_s: float
    target_forwards: int
    draft_forwards: int
    confidence_logits: list[torch.Tensor] | None = None
    copies_reached: int = 0
    copies_accepted: int = 0

    @property
    def num_tokens(self) -> int:
        return sum(len(o) for o in self.outputs)

    @property
    def num_rounds(self) -> int:
        return sum(len(r) for r in self.rounds)

    @property
    def accept_length_mean(self) -> float:
        """Mean tokens emitted per round, accepted drafts + the correction/bonus token."""
        n = self.num_rounds
        return sum(a + 1 for r in self.rounds for _, a in r) / n if n else float("nan")

    @property
    def verify_length_mean(self) -> float:
        n = self.num_rounds
        return sum(v for r in self.rounds for v, _ in r) / n if n else float("nan")

    @property
    def position_acceptance(self) -> torch.Tensor:
        """Conditional acceptance per draft position (NaN where never reached)."""
        reached = self.position_reached.double()
        return torch.where(
            reached > 0, self.position_accepted.double() / reached.clamp(min=1), torch.nan
        )

    @property
    def tokens_per_second(self) -> float:
        return self.num_tokens / self.wall_time_s if self.wall_time_s > 0 else float("nan")
