"""What the reference generator drafts with: the ``Proposer`` protocol and its inputs.

``DraftInputs`` is what a proposer sees for the active requests of one round;
``Proposer`` is the protocol any drafter (the DSpark drafter, the AR adapter in
``ar_proposer.py``, a test oracle) implements; ``DSparkProposer`` is the real path,
``drafter.forward_block`` then ``sample_block``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch

from dspark_sglang.model.block_sampler import DraftProposal, sample_block
from dspark_sglang.model.drafter import DSparkDrafter
from dspark_sglang.sampling import SamplingParams


@dataclass(frozen=True)
class DraftInputs:
    """What a proposer sees for the ``N`` active requests of one round.

    ``context_*`` are right-aligned (padding first, ``context_valid`` False);
    ``request_ids`` index the prompts given to ``generate``. ``context_tokens``
    holds the token id at each context position (0 where invalid) so an
    autoregressive proposer, which embeds the tokens next to the hidden states,
    sees them too; the generator always fills it (``None`` only for inputs built
    by hand for a proposer that does not read tokens).
    """

    context_hidden: torch.Tensor  # [N, C, n*H]
    context_positions: torch.Tensor  # [N, C] int64
    context_valid: torch.Tensor  # [N, C] bool
    anchor_tokens: torch.Tensor  # [N] int64
    anchor_positions: torch.Tensor  # [N] int64
    request_ids: torch.Tensor  # [N] int64
    context_tokens: torch.Tensor | None = None  # [N, C] int64


@runtime_checkable
class Proposer(Protocol):
    """Anything that drafts a block per request (the DSpark drafter, a test oracle)."""

    @property
    def block_size(self) -> int: ...

    @property
    def target_layer_ids(self) -> tuple[int, ...]: ...

    @property
    def sliding_window(self) -> int | None: ...

    def propose(
        self, inputs: DraftInputs, sampling: SamplingParams, generator: torch.Generator
    ) -> DraftProposal: ...


class DSparkProposer:
    """The real path: ``drafter.forward_block`` then ``sample_block``."""

    def __init__(self, drafter: DSparkDrafter) -> None:
        self.drafter = drafter

    @property
    def block_size(self) -> int:
        return self.drafter.config.block_size

    @property
    def target_layer_ids(self) -> tuple[int, ...]:
        return tuple(self.drafter.config.target_layer_ids)

    @property
    def sliding_window(self) -> int | None:
        return self.drafter.config.sliding_window

    @torch.inference_mode()
    def propose(
        self, inputs: DraftInputs, sampling: SamplingParams, generator: torch.Generator
    ) -> DraftProposal:
        block = self.drafter.forward_block(
            inputs.context_hidden,
            inputs.context_positions,
            inputs.context_valid,
            inputs.anchor_tokens,
            inputs.anchor_positions,
        )
        return sample_block(
            self.drafter,
            block,
            inputs.anchor_tokens,
            sampling.temperature,
            sampling.top_k,
            sampling.top_p,
            generator,
        )
