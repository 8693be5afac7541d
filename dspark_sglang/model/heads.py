"""The sequential Markov heads and the confidence head (DSPARK.md, "Markov head").

After one parallel backbone pass gives base logits ``z_k`` for every slot ``k``,
a cheap head makes slot ``k`` depend on the token actually placed before it
(``prev_k``; ``prev_0`` is the anchor):

    vanilla:  bias_k = W2(E[prev_k])
    gated:    bias_k = W2(sigmoid(G [h_k ; E[prev_k]]) * E[prev_k])
    rnn:      [g ; c ; o] = J [s_k ; E[prev_k] ; h_k]
              s_{k+1} = sigmoid(g) * s_k + (1 - sigmoid(g)) * tanh(c),   s_0 = 0
              bias_k  = W2(tanh(o))
    logits_k = z_k + bias_k

``E = markov_w1`` (``V x r``), ``W2 = markov_w2`` (``r -> K``, ``K`` the draft
vocabulary: ``V``, or fewer tokens for a reduced drafter, ``model/vocab.py``), ``G = gate_proj``,
``J = joint_proj``: SGLang's ``sglang/srt/models/dspark.py`` parameter names, so a
checkpoint loads there unchanged.

Confidence: ``logit_k = w^T [h_k ; E[prev_k]] + b`` (or ``w^T h_k + b``); the
calibrated survival probability is ``sigmoid(logit_k / T_k)`` after STS.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch
from torch import nn

from dspark_sglang.model.config import DSparkConfig


class MarkovHead(nn.Module, ABC):
    """A first-order correction of the base logits from the previous token."""

    def __init__(self, vocab_size: int, rank: int, draft_vocab_size: int | None = None) -> None:
        super().__init__()
        self.markov_w1 = nn.Embedding(vocab_size, rank)
        self.markov_w2 = nn.Linear(rank, draft_vocab_size or vocab_size, bias=False)

    def prev_embedding(self, tokens: torch.Tensor) -> torch.Tensor:
        """``E[tokens]``: ``[...] -> [..., r]``."""
        return self.markov_w1(tokens.long())

    def init_state(self, hidden: torch.Tensor) -> torch.Tensor | None:
        """Recurrent state before slot 0 (``None`` for memoryless heads)."""
        del hidden
        return None

    @abstractmethod
    def step(
        self, prev_tokens: torch.Tensor, hidden: torch.Tensor, state: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """One slot: ``prev_tokens [N]`` (target ids), ``hidden [N, H]`` ->
        ``(bias [N, K], next state)``."""

    def teacher_forced(self, prev_tokens: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        """Bias for every slot given the true previous tokens ``[..., B]`` -> ``[..., B, K]``.

        Memoryless heads apply ``step`` to all slots at once; stateful heads override.
        """
        bias, _ = self.step(prev_tokens, hidden, None)
        return bias


class VanillaMarkovHead(MarkovHead):
    """``bias = W2(E[prev])``: a low-rank token-transition table."""

    def step(
        self, prev_tokens: torch.Tensor, hidden: torch.Tensor, state: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        del hidden
        return self.markov_w2(self.prev_embedding(prev_tokens)), state


class GatedMarkovHead(MarkovHead):
    """``bias = W2(sigmoid(G [h ; E[prev]]) * E[prev])``: the hidden state gates the table."""

    def __init__(
        self, vocab_size: int, rank: int, hidden_size: int, draft_vocab_size: int | None = None
    ) -> None:
        super().__init__(vocab_size, rank, draft_vocab_size)
        self.gate_proj = nn.Linear(hidden_size + rank, rank)

    def step(
        self, prev_tokens: torch.Tensor, hidden: torch.Tensor, state: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        e = self.prev_embedding(prev_tokens)
        gate = torch.sigmoid(self.gate_proj(torch.cat([hidden, e.to(hidden.dtype)], dim=-1)))
        return self.markov_w2(gate.to(e.dtype) * e), state


class RNNMarkovHead(MarkovHead):
    """A gated recurrence over the block: the bias can depend on all earlier drafts."""

    def __init__(
        self, vocab_size: int, rank: int, hidden_size: int, draft_vocab_size: int | None = None
    ) -> None:
        super().__init__(vocab_size, rank, draft_vocab_size)
        self.rank = rank
        self.joint_proj = nn.Linear(2 * rank + hidden_size, 3 * rank)

    def init_state(self, hidden: torch.Tensor) -> torch.Tensor | None:
        return hidden.new_zeros(*hidden.shape[:-1], self.rank)

    def step(
        self, prev_tokens: torch.Tensor, hidden: torch.Tensor, state: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        if state is None:
            state = self.init_state(hidden)
        assert state is not None
        e = self.prev_embedding(prev_tokens).to(hidden.dtype)
        g, c, o = self.joint_proj(torch.cat([state, e, hidden], dim=-1)).chunk(3, dim=-1)
        g = torch.sigmoid(g)
        new_state = g * state + (1.0 - g) * torch.tanh(c)
        return self.markov_w2(torch.tanh(o)), new_state

    def teacher_forced(self, prev_tokens: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        """Unrolls the recurrence over the B slots (the only sequential part)."""
        state = self.init_state(hidden[..., 0, :])
        biases = []
        for k in range(prev_tokens.shape[-1]):
            bias, state = self.step(prev_tokens[..., k], hidden[..., k, :], state)
            biases.append(bias)
        return torch.stack(biases, dim=-2)


class ConfidenceHead(nn.Module):
    """Raw logit that draft ``k`` survives verification given drafts ``< k`` did."""

    def __init__(self, hidden_size: int, rank: int, with_markov: bool) -> None:
        super().__init__()
        self.with_markov = with_markov
        self.proj = nn.Linear(hidden_size + (rank if with_markov else 0), 1)

    def forward(
        self, hidden: torch.Tensor, prev_embedding: torch.Tensor | None = None
    ) -> torch.Tensor:
        """``hidden [..., H]`` (+ ``E[prev]`` ``[..., r]``) -> raw logit ``[...]``."""
        if self.with_markov:
            if prev_embedding is None:
                raise ValueError("ConfidenceHead(with_markov=True) needs prev_embedding = E[prev]")
            features = torch.cat([hidden, prev_embedding.to(hidden.dtype)], dim=-1)
        else:
            features = hidden
        return self.proj(features).squeeze(-1)


def calibrated_confidence(logits: torch.Tensor, temperatures: torch.Tensor) -> torch.Tensor:
    """STS: ``c_k = sigmoid(logit_k / T_k)`` with ``temperatures`` ``[B]`` over the last axis."""
    return torch.sigmoid(logits.float() / temperatures.to(logits.device).float())


def build_markov_head(config: DSparkConfig) -> MarkovHead | None:
    """The head ``config.markov_head_type`` names (``None`` for a DFlash-style drafter)."""
    v, r, h = config.vocab_size, config.markov_rank, config.hidden_size
    k = config.draft_vocab_size
    match config.markov_head_type:
        case "vanilla":
            return VanillaMarkovHead(v, r, k)
        case "gated":
            return GatedMarkovHead(v, r, h, k)
        case "rnn":
            return RNNMarkovHead(v, r, h, k)
        case "none":
            return None
    raise ValueError(f"unknown markov_head_type {config.markov_head_type!r}")


def build_confidence_head(config: DSparkConfig) -> ConfidenceHead | None:
    if not config.enable_confidence_head:
        return None
    return ConfidenceHead(
        config.hidden_size, config.markov_rank, config.confidence_head_with_markov
    )
