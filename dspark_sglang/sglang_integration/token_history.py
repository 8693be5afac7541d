"""Each running request's recent token ids on the device, kept by the worker's forwards.

Context copies (``context_copy``) read every request's text (prompt + emitted tokens,
ending with the anchor the next round drafts from) each decode step. The scheduler's
``origin_input_ids + output_ids`` lists are host data and, with SGLang's overlap
scheduler, a round behind the device. This table is written where the worker already
has the tokens, so it is current when the draft runs, overlap or not, and a decode
step reads it with no host work beyond one small bound:

* prefill (extend): row ``req_pool_idx`` <- the request's text up to the extend's end
  (host lists, once per prefill chunk), then the token the prefill sampled (the first
  anchor, on the device);
* decode round: the tokens the scheduler will append, ``out_tokens[:commit_len]``
  (the accepted drafts, then the bonus that is the next anchor), appended on the device.

Rows are SGLang's request-pool slots, as its own per-request tables (``req_to_token``,
the n-gram embedding table) are; a reused slot is rewritten by its next prefill. Each
row is a ring of the last ``window`` tokens (:data:`WINDOW`, or the pool's context
length if shorter): token ``p`` of a request lives in column ``p % window``, so memory
is ``slots x window`` int32 whatever the context length, and copies look back at most
``window`` tokens. Invariant: for row ``r`` holding a text of ``lengths[r]`` tokens,
its last ``min(lengths[r], window)`` tokens are in the ring.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

__all__ = ["WINDOW", "TokenHistory"]

#: How far back (tokens) context copies look in the SGLang worker; also bounds the
#: table's memory (4 bytes x window per request slot: 16 KiB).
WINDOW = 4096


class TokenHistory:
    """``tokens`` ``[rows, window + 1]`` int32 (the last column is scratch for masked
    writes) and ``lengths`` ``[rows]`` int64 (each row's whole text length), on ``device``."""

    def __init__(self, rows: int, window: int, device: torch.device | str) -> None:
        if rows < 1 or window < 1:
            raise ValueError(f"TokenHistory needs rows >= 1 and window >= 1, got {rows}, {window}")
        self.window = int(window)
        self.tokens = torch.zeros((rows, self.window + 1), dtype=torch.int32, device=device)
        self.lengths = torch.zeros(rows, dtype=torch.int64, device=device)

    @classmethod
    def like_pool(cls, req_to_token: torch.Tensor, window: int = WINDOW) -> TokenHistory:
        """One row per request-pool slot; ``window`` capped at the pool's context length."""
        rows, context_len = req_to_token.shape
        return cls(int(rows), min(int(window), int(context_len)), req_to_token.device)

    def write_texts(self, rows: torch.Tensor, texts: Sequence[Sequence[int]]) -> None:
        """Rows ``rows`` (device, one per text) <- ``texts`` (host), lengths set."""
        if not texts:
            return
        w = self.window
        host = torch.zeros((len(texts), w), dtype=torch.int32)
        for i, t in enumerate(texts):
            tail = torch.as_tensor(list(t)[-w:], dtype=torch.int32)
            cols = (len(t) - tail.numel() + torch.arange(tail.numel())) % w
            host[i, cols] = tail
        device = self.tokens.device
        rows = rows.to(device=device, dtype=torch.int64)
        self.tokens[rows, :w] = host.to(device, non_blocking=True)
        lengths = torch.tensor([len(t) for t in texts], dtype=torch.int64)
        self.lengths[rows] = lengths.to(device, non_blocking=True)

    def write_extend(self, batch: Any) -> None:
        """An extend batch's requests: each row <- its text up to the extend's end."""
        texts = [
            [*r.origin_input_ids, *r.output_ids][: int(p) + int(e)]
            for r, p, e in zip(batch.reqs, batch.prefix_lens, batch.extend_lens, strict=True)
        ]
        self.write_texts(batch.req_pool_indices[: len(texts)], texts)

    def append(self, rows: torch.Tensor, new: torch.Tensor, counts: torch.Tensor) -> None:
        """Row ``rows[i]`` += ``new[i, :counts[i]]`` (all on the device, no host reads)."""
        n = int(rows.shape[0])
        if n == 0:
            return
        rows = rows.to(torch.int64)
        new = new.reshape(n, -1).to(torch.int32)
        counts = counts.reshape(n).to(torch.int64)
        start = self.lengths.index_select(0, rows)
        offsets = torch.arange(new.shape[1], device=new.device)
        cols = (start.unsqueeze(1) + offsets) % self.window
        cols = torch.where(offsets < counts.unsqueeze(1), cols, self.window)  # masked: scratch
        self.tokens[rows.unsqueeze(1).expand_as(cols), cols] = new
        self.lengths.index_put_((rows,), start + counts)

    def view(self, rows: torch.Tensor, bound: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``copy_drafts``' ``(history [n, L], lengths [n])`` for ``rows``: each row's last
        ``min(length, L)`` tokens in order, ``L = min(bound, window)``.

        ``bound`` is a host upper bound of the rows' lengths (a larger one is only
        slower; a row longer than ``L`` reads as its last ``L`` tokens).
        """
        width = max(1, min(int(bound), self.window))
        rows = rows.to(torch.int64)
        lengths = self.lengths.index_select(0, rows)
        first = torch.clamp(lengths - width, min=0)
        cols = (first.unsqueeze(1) + torch.arange(width, device=lengths.device)) % self.window
        history = self.tokens.index_select(0, rows).gather(1, cols)
        return history, torch.clamp(lengths, max=width)
