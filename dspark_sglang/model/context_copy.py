"""Context copies: drafts taken from the request's own text where it repeats itself.

Code, arithmetic and chat replies repeat spans of their prompt and of themselves
(names, numbers, boilerplate). Where the last ``n`` tokens occurred earlier, the
token that followed them then is a cheap guess for the next one, often better than
the drafter's (prompt lookup). Applied after the drafter's block is sampled, left to
right, for draft slot ``k = 0..B-1`` of each request:

    seq_k  = history (prompt + emitted tokens, ending with the anchor) + x_0 .. x_{k-1}
    key    = the last n tokens of seq_k
    j      = the latest start j with seq_k[j : j+n] == key and j + n < len(seq_k)
    x_k    = seq_k[j + n]   if such a j exists   (a copied draft)
             y_k            otherwise             (the drafter's draft)

Why it stays lossless: a copy is a deterministic function of tokens already fixed
(the history and the earlier drafts), so its draft distribution is one-hot on it;
a drafter's draft keeps the distribution it was drawn from (the Markov head drew it
given the drafter's own earlier samples, an auxiliary source of randomness the
verification does not depend on). Greedy verification reads tokens only;
rejection sampling gets the one-hot rows (``one_hot_rows``), so either way the
verified output is the target's, token for token or in distribution.

Vectorised over requests with no host reads: ``B`` steps of fixed-shape tensor ops.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

__all__ = [
    "DEFAULT_NGRAM",
    "ContextCopies",
    "copy_drafts",
    "default_ngram",
    "one_hot_rows",
    "pad_histories",
]

#: The n-gram the demo, ``generate`` and the CPU benchmark use on greedy runs.
DEFAULT_NGRAM = 2


def default_ngram(greedy: bool) -> int:
    """The copies a run gets unless told otherwise: :data:`DEFAULT_NGRAM` when every request
    is greedy, else none. A sampled copy is accepted with the target's probability of it,
    which can be less than the drafter's own sample would get, so sampled runs opt in."""
    return DEFAULT_NGRAM if greedy else 0


@dataclass(frozen=True)
class ContextCopies:
    """``tokens`` ``[N, B]``: the drafts after copying; ``copied`` ``[N, B]`` bool: the
    slots whose draft came from the context."""

    tokens: torch.Tensor
    copied: torch.Tensor


def pad_histories(
    texts: Sequence[Sequence[int]], device: torch.device | str = "cpu"
) -> tuple[torch.Tensor, torch.Tensor]:
    """``copy_drafts``' ``history`` ``[N, L]`` (each request's token ids, left-aligned,
    zero-padded) and ``lengths`` ``[N]`` from per-request token lists."""
    longest = max((len(t) for t in texts), default=0)
    history = torch.zeros((len(texts), longest), dtype=torch.int64)
    for i, t in enumerate(texts):
        history[i, : len(t)] = torch.as_tensor(list(t), dtype=torch.int64)
    lengths = torch.tensor([len(t) for t in texts], dtype=torch.int64)
    return history.to(device), lengths.to(device)


def copy_drafts(
    history: torch.Tensor, lengths: torch.Tensor, drafts: torch.Tensor, ngram: int
) -> ContextCopies:
    """Replace drafts by context copies (module docstring).

    ``history`` ``[N, L]`` int64, row ``i`` valid in ``[0, lengths[i])`` and ending with
    request ``i``'s anchor (the rest is ignored); ``drafts`` ``[N, B]``; ``ngram``: how
    many trailing tokens must match (0 returns the drafts unchanged).
    """
    n_req, b = drafts.shape
    if ngram == 0 or b == 0 or n_req == 0:
        return ContextCopies(drafts, torch.zeros_like(drafts, dtype=torch.bool))
    device = drafts.device
    lengths = lengths.to(device=device, dtype=torch.int64)
    width = history.shape[1] + b
    seq = torch.zeros((n_req, width), dtype=torch.int64, device=device)
    seq[:, : history.shape[1]] = history.to(device=device, dtype=torch.int64)
    starts = torch.arange(width - ngram + 1, device=device)  # window start j
    out, copied = [], []
    for k in range(b):
        cur = lengths + k  # len(seq_k)
        # key = seq_k[cur - n : cur]; rows too short for any earlier match never copy.
        key_idx = (cur.unsqueeze(1) - ngram + torch.arange(ngram, device=device)).clamp(min=0)
        key = seq.gather(1, key_idx)
        match = torch.ones((n_req, starts.numel()), dtype=torch.bool, device=device)
        for t in range(ngram):
            match &= seq[:, t : t + starts.numel()] == key[:, t : t + 1]
        match &= (starts.unsqueeze(0) + ngram) < cur.unsqueeze(1)
        best = torch.where(match, starts.unsqueeze(0), -1).amax(dim=1)
        found = best >= 0
        follow = seq.gather(1, (best + ngram).clamp(min=0).unsqueeze(1)).squeeze(1)
        tok = torch.where(found, follow, drafts[:, k].to(torch.int64))
        seq.scatter_(1, cur.unsqueeze(1), tok.unsqueeze(1))
        out.append(tok)
        copied.append(found)
    return ContextCopies(torch.stack(out, 1).to(drafts.dtype), torch.stack(copied, 1))


def one_hot_rows(probs: torch.Tensor, copies: ContextCopies) -> torch.Tensor:
    """Draft distributions ``[N, B, V]`` with each copied slot's row one-hot on its copy."""
    hot = torch.zeros_like(probs).scatter_(-1, copies.tokens.long().unsqueeze(-1), 1.0)
    return torch.where(copies.copied.unsqueeze(-1), hot, probs)
