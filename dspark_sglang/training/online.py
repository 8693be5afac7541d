"""Online hidden states: the frozen target runs inside each training step.

With ``data.hidden_states: online`` the data stage writes no hidden cache (it only
regenerates responses), and the trainer reads token sequences (``ResponseSequences``).
Each step, after the batch is on ``run.device``, ``OnlineHiddenStates.attach`` runs the
target's forward over the batch's token sequences and fills the batch's
``context_hidden`` and ``target_last``.

Invariants:

* the states are those the hidden cache would hold, before its 16-bit rounding: the same
  function (``datagen.target_hidden_states``: decoder-layer outputs at ``layer_ids``
  concatenated, and the final-normed state), in the target's dtype, never under the
  drafter's autocast;
* the target is frozen: no parameter requires a gradient, it stays in eval mode (a
  target found in training mode is refused) and its forward runs under ``no_grad``, so
  the drafter's backward never reaches it;
* the batch plan does not change: anchors and batch composition come from the sequences'
  lengths alone (``trainer.epoch_plan``), the same for the cache and the responses, and
  the forward draws no random numbers. Under torchrun each process runs the target on
  its own share of the global batch.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from transformers import PreTrainedModel

from dspark_sglang.training.datagen import check_layer_ids, target_hidden_states
from dspark_sglang.training.dataset import TrainBatch, attach_hidden_states


class OnlineHiddenStates:
    """The frozen target on ``device`` and the layers whose outputs feed the drafter.

    Construction moves ``model`` to ``device``, freezes it and puts it in eval mode.
    """

    def __init__(
        self, model: PreTrainedModel, layer_ids: Sequence[int], device: torch.device | str
    ) -> None:
        check_layer_ids(int(model.config.num_hidden_layers), layer_ids)
        self.layer_ids: tuple[int, ...] = tuple(int(x) for x in layer_ids)
        self.device = torch.device(device)
        model.requires_grad_(False)
        self.model = model.to(self.device).eval()

    @property
    def dtype(self) -> torch.dtype:
        """The target's dtype: the dtype of the states it returns."""
        return next(self.model.parameters()).dtype

    def states(
        self, tokens: torch.Tensor, seq_lens: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(aux [S, T, n*H], last [S, T, H])`` of right-padded ``tokens`` (each row real
        up to its ``seq_lens``), in the target's dtype on ``device``."""
        if self.model.training:
            raise RuntimeError(
                "the online target was switched to training mode; it must stay frozen in "
                "eval mode (call .eval() on it)"
            )
        tokens = tokens.to(self.device)
        positions = torch.arange(tokens.shape[1], device=self.device)
        mask = (positions.unsqueeze(0) < seq_lens.to(self.device).unsqueeze(1)).long()
        with torch.autocast(self.device.type, enabled=False):
            return target_hidden_states(self.model, tokens, mask, self.layer_ids)

    def attach(self, batch: TrainBatch, block_size: int) -> TrainBatch:
        """``batch`` (token-only, on ``device``) with the target's states filled in."""
        aux, last = self.states(batch.tokens, batch.seq_lens)
        return attach_hidden_states(batch, aux, last, block_size)
