"""Context copies in the DSPARK_MOE worker: the drafter's block, then copies, then verify.

The rule is ``model/context_copy.py``'s: a draft slot whose trailing ``n`` tokens
(request text + anchor + earlier drafts) occurred before gets the token that followed
them then. Here it rewrites SGLang's ``DraftProposal`` after the drafter (and the fault
guard) ran and before the planner reads the confidences:

* drafts and the ``[anchor | drafts]`` verify ids: the copies;
* draft logits (sampled blocks): one-hot on each copy (``fallback.one_hot_logits``),
  so rejection sampling sees the distribution the copy was drawn from and the output
  stays the target's; greedy verify compares tokens only;
* confidences: ``copy_confidence`` at copied slots (its logit in the raw ones), since
  the drafter's head scored the token the copy replaced;
* ``folded`` off: a folded proposal's in-graph accept reads the draft graph's own token
  buffers, which still hold the drafter's tokens, so the eager accept must run.

The request text is the worker's own ``token_history.TokenHistory`` (written at each
prefill and after each verify, on the device), so it is current when the draft runs
with SGLang's overlap scheduler too; the only host work per step is a length bound
from the scheduler's request lists (which may lag a round, hence the margin).
"""

from __future__ import annotations

import math
from typing import Any

import msgspec
import torch

from dspark_sglang.model.context_copy import copy_drafts
from dspark_sglang.sglang_integration.fallback import one_hot_logits
from dspark_sglang.sglang_integration.token_history import TokenHistory

__all__ = ["ProposalCopier"]


class ProposalCopier:
    """Rewrites a step's ``DraftProposal`` with context copies (module docstring).

    ``history`` is the worker's token table (set once the request pool exists; a
    copier without one raises, and the fault guard then turns copies off);
    ``margin``: tokens a request's text may run ahead of the scheduler's lists (one
    round's verify width under the overlap scheduler). ``steps`` counts (host, cheap)
    the steps it rewrote, for logs and tests.
    """

    def __init__(
        self,
        ngram: int,
        copy_confidence: float,
        history: TokenHistory | None = None,
        margin: int = 0,
    ) -> None:
        if ngram < 1:
            raise ValueError(f"ProposalCopier needs ngram >= 1, got {ngram}")
        self.ngram = ngram
        self.copy_confidence = float(copy_confidence)
        c = min(max(self.copy_confidence, 1e-6), 1.0 - 1e-6)
        self.copy_logit = math.log(c / (1.0 - c))
        self.history = history
        self.margin = int(margin)
        self.steps = 0

    def __call__(self, proposal: Any, *, batch: Any, bs: int, **_: Any) -> Any:
        if self.history is None:
            raise RuntimeError("context copies have no token history (the worker sets it)")
        block = proposal.draft_block
        tokens = block.draft_tokens
        bs = min(int(bs), int(tokens.shape[0]), len(batch.reqs))
        if bs == 0:
            return proposal
        self.steps += 1
        bound = self.margin + max(
            len(r.origin_input_ids) + len(r.output_ids) for r in batch.reqs[:bs]
        )
        history, lengths = self.history.view(batch.req_pool_indices[:bs], bound)
        copies = copy_drafts(history, lengths, tokens[:bs], self.ngram)
        # Rows past ``bs`` (padding for a captured graph) keep the drafter's tokens.
        copied = torch.zeros(tokens.shape, dtype=torch.bool, device=tokens.device)
        copied[:bs] = copies.copied
        new_tokens = tokens.clone()
        new_tokens[:bs] = copies.tokens.to(tokens.dtype)
        logits = block.corrected_logits
        if logits is not None:
            rows = logits.shape[0]
            logits = one_hot_logits(logits, new_tokens[:rows], copied[:rows])
        changes: dict[str, Any] = {
            "draft_block": msgspec.structs.replace(
                block, draft_tokens=new_tokens, corrected_logits=logits
            ),
            "folded": False,
        }
        verify_ids = getattr(proposal, "verify_ids", None)
        if verify_ids is not None:
            changes["verify_ids"] = torch.cat(
                [verify_ids[:, :1], new_tokens[: verify_ids.shape[0]].to(verify_ids.dtype)], 1
            )
        fills = (("confidence", self.copy_confidence), ("confidence_raw", self.copy_logit))
        for name, fill in fills:
            t = getattr(proposal, name, None)
            if t is not None:
                mask = copied[: t.shape[0], : t.shape[1]]
                changes[name] = torch.where(mask, torch.full_like(t, fill), t)
        return msgspec.structs.replace(proposal, **changes)
