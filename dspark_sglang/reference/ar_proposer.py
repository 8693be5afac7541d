"""The EAGLE3-style autoregressive drafter as a reference-generator ``Proposer``.

Why an adapter: the acceptance benchmark compares DSpark, a DFlash-style
parallel drafter and an autoregressive (EAGLE3-style) drafter under *one*
speculative loop, so all three must speak the generator's ``Proposer``
protocol. ``ARDrafter.propose`` wants one sequence's full history: the target
features of every position ``< p`` and the tokens ``x_0 .. x_p`` (anchor last),
with row ``t`` at absolute position ``t`` (its rotary positions start at 0).

Algorithm, per active request ``i`` (a loop: contexts are ragged and the AR
drafter's causal mask indexes rows from 0, so left padding would leak pad keys;
correctness first, ``N`` is small in the reference generator):

    rows    = context_valid[i]                       the request's real context
    require context_positions[i, rows] == 0 .. p_i-1 (the full history, no window)
    tokens  = [context_tokens[i, rows], anchor_i]    x_0 .. x_{p_i}
    y_i, q_i = drafter.propose(hidden[i, rows], tokens)   B tokens, step by step

Invariant: ``probs[i, k]`` is the processed distribution ``y_{i,k}`` was drawn
from (what chain verification needs as ``p_d``), and the result equals
``ARDrafter.propose`` called directly on request ``i``'s full context with the
same generator state (requests are drafted in order ``0..N-1``).
"""

from __future__ import annotations

import torch

from dspark_sglang.model.ar_drafter import ARDrafter
from dspark_sglang.model.block_sampler import DraftProposal
from dspark_sglang.reference.generator import DraftInputs
from dspark_sglang.sampling import SamplingParams

__all__ = ["ARProposer"]


class ARProposer:
    """Drafts ``B`` tokens per request with an ``ARDrafter``; no confidence head."""

    def __init__(self, drafter: ARDrafter) -> None:
        if not isinstance(drafter, ARDrafter):
            raise TypeError(f"ARProposer wraps an ARDrafter, got {type(drafter).__name__}")
        self.drafter = drafter

    @property
    def block_size(self) -> int:
        return self.drafter.config.block_size

    @property
    def target_layer_ids(self) -> tuple[int, ...]:
        return tuple(self.drafter.config.target_layer_ids)

    @property
    def sliding_window(self) -> int | None:
        """Always ``None``: the AR drafter attends to the whole history."""
        return None

    @torch.inference_mode()
    def propose(
        self, inputs: DraftInputs, sampling: SamplingParams, generator: torch.Generator
    ) -> DraftProposal:
        if inputs.context_tokens is None:
            raise ValueError(
                "ARProposer needs DraftInputs.context_tokens (the token at each context "
                "position); build the inputs with the ReferenceGenerator, which fills it"
            )
        b = self.block_size
        tokens_out: list[torch.Tensor] = []
        probs_out: list[torch.Tensor] = []
        for i in range(inputs.anchor_tokens.shape[0]):
            rows = inputs.context_valid[i]
            anchor_pos = int(inputs.anchor_positions[i])
            positions = inputs.context_positions[i, rows]
            if not torch.equal(positions, torch.arange(anchor_pos, dtype=positions.dtype)):
                raise ValueError(
                    f"ARProposer: request {int(inputs.request_ids[i])} context covers positions "
                    f"{positions[:1].tolist()}..{positions[-1:].tolist()} but the AR drafter "
                    f"needs the full history 0..{anchor_pos - 1}; run it without a sliding window"
                )
            hidden = inputs.context_hidden[i, rows].unsqueeze(0)
            seq = torch.cat([inputs.context_tokens[i, rows], inputs.anchor_tokens[i : i + 1]])
            toks, probs, _ = self.drafter.propose(
                hidden,
                seq.unsqueeze(0),
                num_tokens=b,
                temperature=sampling.temperature,
                top_k=sampling.top_k,
                top_p=sampling.top_p,
                generator=generator,
            )
            tokens_out.append(toks[0])
            probs_out.append(probs[0].float())
        return DraftProposal(
            tokens=torch.stack(tokens_out),
            probs=torch.stack(probs_out),
            confidence_logits=None,
        )
