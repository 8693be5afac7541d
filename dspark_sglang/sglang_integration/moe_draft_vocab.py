"""A reduced draft vocabulary on SGLang's Markov heads, for ``DSparkMoEDraftModel``.

A drafter with a token map of ``K`` ids (``draft_vocab_size``, or a greedy map under the
argmax draft) keeps a ``K``-row ``markov_w2``; ``DraftVocabBias`` is mixed into whichever
SGLang Markov head the drafter has so its bias is scattered into the target's ``V``
columns (0 outside the map), or left in the ``K`` mapped columns where a caller asks for
them (``reduced_step_bias``). ``draft_vocab_head`` builds such a head from SGLang's.
"""

from __future__ import annotations

from typing import Any

import torch

from dspark_sglang.model.checkpoint import CheckpointError
from dspark_sglang.model.vocab import DRAFT_VOCAB_BUFFER, scatter_to_vocab


class DraftVocabBias:
    """Mixin over SGLang's Markov heads: ``W2`` has ``K`` rows; ``project_bias`` scatters.

    Every SGLang head (vanilla, gated, RNN) computes its bias as ``project_bias(latent)``,
    so this one override covers all three; the fused greedy kernel is skipped (SGLang
    uses it only when ``project_bias`` is its own), and the step loop runs unchanged.
    """

    draft_vocab_ids: torch.Tensor
    vocab_size: int
    markov_w2: torch.nn.Linear

    def _use_draft_vocab(self, draft_vocab_size: int) -> None:
        rank = self.markov_w2.in_features
        self.markov_w2 = torch.nn.Linear(rank, draft_vocab_size, bias=False)
        self.register_buffer(  # type: ignore[attr-defined]
            DRAFT_VOCAB_BUFFER,
            torch.zeros(draft_vocab_size, dtype=torch.int64),
            persistent=False,
        )

    #: Set only inside :meth:`reduced_step_bias`: ``project_bias`` then returns the ``K``
    #: mapped columns instead of scattering them into ``V``.
    _dspark_reduced = False

    def project_bias(self, latent_states: torch.Tensor) -> torch.Tensor:
        reduced = self.markov_w2(latent_states)
        if self._dspark_reduced:
            return reduced
        return scatter_to_vocab(reduced, self.draft_vocab_ids, self.vocab_size, 0.0)

    def reduced_step_bias(
        self,
        prev_tokens: torch.Tensor,
        *,
        hidden_states: torch.Tensor | None,
        state: torch.Tensor | None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """SGLang's ``step_bias`` with the bias in the map's ``K`` columns (``[N, K]``).

        Every SGLang head (vanilla, gated, RNN) ends its step in ``project_bias``, so the
        head's own step runs unchanged and only the final scatter is left out.
        """
        self._dspark_reduced = True
        try:
            return self.step_bias(prev_tokens, hidden_states=hidden_states, state=state)  # type: ignore[attr-defined]
        finally:
            self._dspark_reduced = False

    def configure_tp_shard(self, *, lm_head: Any, prefer_nvlink: bool) -> None:
        del lm_head, prefer_nvlink
        raise CheckpointError(
            "a drafter with a reduced vocabulary (draft_vocab_size, or a greedy map under "
            "SGLANG_DSPARK_USE_GREEDY_DRAFT=1) has a K-row markov_w2 that cannot be sharded "
            "by the target's vocabulary; unset SGLANG_DSPARK_OPT_MARKOV_W2_TP_SHARD"
        )


def draft_vocab_head(head: Any, draft_vocab_size: int, hidden_size: int) -> Any:
    """The same kind of SGLang Markov head with ``DraftVocabBias`` mixed in."""
    base = type(head)
    cls = type(f"DraftVocab{base.__name__}", (DraftVocabBias, base), {})
    kwargs: dict[str, Any] = {"vocab_size": head.vocab_size, "markov_rank": head.markov_rank}
    if hasattr(head, "gate_proj") or hasattr(head, "joint_proj"):
        kwargs["hidden_size"] = hidden_size
    out = cls(**kwargs)
    out._use_draft_vocab(draft_vocab_size)
    return out
