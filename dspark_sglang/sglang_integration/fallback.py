"""Drafter faults: the affected step falls back to plain decoding, nothing is lost.

Why it is safe: verification is lossless for *any* draft tokens. Under greedy
verification the target keeps only drafts equal to its own argmax and always
emits its own next token; under rejection sampling a draft block marked
``greedy_draft`` is checked against a one-hot draft distribution, which is
exact for tokens chosen deterministically. So when the drafter raises or
returns non-finite values, the worker substitutes a placeholder proposal (every
draft = the anchor token, confidences 0) and asks for verify length 1 (the
anchor only, i.e. 0 drafts) for every request of the step. The target then
emits exactly its own token, as plain decoding would. In SGLang's ``static``
ragged mode there is no per-request layout, so the placeholder drafts are
verified (and, being lossless, can only be accepted when they equal the
target's tokens); in ``cap-accept``/``compact`` the cap of 1 verifies none.

Fault injection (tests only): ``DSPARK_FAULT_INJECT_EVERY=N`` makes every N-th
draft forward raise (``DSPARK_FAULT_INJECT_MODE=raise``, default) or return NaN
confidences (``nan``).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import Any

import msgspec
import torch

from dspark_sglang.sglang_integration import metrics

logger = logging.getLogger(__name__)

FAULT_EVERY_ENV = "DSPARK_FAULT_INJECT_EVERY"
FAULT_MODE_ENV = "DSPARK_FAULT_INJECT_MODE"
#: Planner attribute: the next verify-length decision must be "anchor only".
FORCE_PLAIN_ATTR = "dspark_moe_force_plain"


class InjectedDrafterFaultError(RuntimeError):
    """Raised by the test-only fault injection in place of a real drafter error."""


def non_finite_reason(proposal: Any) -> str | None:
    """``"non_finite"`` when the proposal's confidences or draft logits are not finite."""
    for name, t in (
        ("confidence", getattr(proposal, "confidence", None)),
        ("corrected_logits", getattr(proposal.draft_block, "corrected_logits", None)),
    ):
        if t is not None and t.is_floating_point() and not bool(torch.isfinite(t).all()):
            logger.debug("drafter produced non-finite %s", name)
            return "non_finite"
    return None


def plain_decoding_proposal(
    *,
    anchor: torch.Tensor,
    gamma: int,
    block_width: int,
    sampling_info: Any,
    with_confidence: bool,
) -> Any:
    """A placeholder ``DraftProposal``: every draft is the anchor, confidences 0."""
    from sglang.srt.speculative.dspark_components.dspark_draft import (
        DraftBlockResult,
        DraftProposal,
        resolve_draft_params,
    )

    bs = int(anchor.shape[0])
    anchor = anchor.view(bs, 1)
    params = resolve_draft_params(sampling_info=sampling_info, bs=bs, device=anchor.device)
    block = DraftBlockResult(
        draft_tokens=anchor.expand(bs, gamma).contiguous(),
        corrected_logits=None,
        greedy_mask=params.greedy_mask,
        temperatures=params.temperatures,
        greedy_draft=True,
    )
    confidence = torch.zeros(bs, gamma, device=anchor.device) if with_confidence else None
    return DraftProposal(
        draft_block_ids=anchor.expand(bs, block_width).contiguous(),
        draft_block=block,
        confidence=confidence,
        confidence_raw=None if confidence is None else confidence.clone(),
    )


def _poisoned(proposal: Any) -> Any:
    """``proposal`` with NaN confidences (or, without them, NaN draft logits).

    In SGLang's ``static`` ragged mode there are no confidences; without draft
    logits either (a greedy draft block) NaN has nowhere to go, so the injected
    fault is a placeholder proposal with NaN confidences, which the guard treats
    like any non-finite output.
    """
    if proposal.confidence is not None:
        nan = torch.full_like(proposal.confidence, float("nan"))
        return msgspec.structs.replace(proposal, confidence=nan)
    block = proposal.draft_block
    if getattr(block, "corrected_logits", None) is not None:
        nan = torch.full_like(block.corrected_logits, float("nan"))
        return msgspec.structs.replace(
            proposal, draft_block=msgspec.structs.replace(block, corrected_logits=nan)
        )
    bs = int(proposal.draft_block_ids.shape[0])
    nan = torch.full((bs, 1), float("nan"), device=proposal.draft_block_ids.device)
    return msgspec.structs.replace(proposal, confidence=nan)


class GuardedPropose:
    """Wraps a proposer's ``propose``: faults become a plain-decoding step.

    On a fault it counts ``dspark_fallback_total{reason}``, logs one warning
    line, marks the planner (:data:`FORCE_PLAIN_ATTR`) and returns
    :func:`plain_decoding_proposal`.
    """

    def __init__(
        self,
        original: Callable[..., Any],
        proposer: Any,
        planner: Any,
        gamma: int,
        *,
        records: bool = True,
    ) -> None:
        self.original = original
        self.proposer = proposer
        self.planner = planner
        self.gamma = gamma
        #: Whether this rank counts fallbacks in metrics (TP rank 0 only).
        self.records = records
        self.calls = 0
        self.fallbacks = 0
        self.inject_every = int(os.environ.get(FAULT_EVERY_ENV, "0") or 0)
        self.inject_mode = os.environ.get(FAULT_MODE_ENV, "raise")
        if self.inject_mode not in ("raise", "nan"):
            raise ValueError(f"{FAULT_MODE_ENV} must be 'raise' or 'nan', got {self.inject_mode!r}")
        if self.inject_every:
            logger.warning(
                "DSPARK_MOE: test fault injection on (%s every %d draft steps)",
                self.inject_mode,
                self.inject_every,
            )

    def _inject(self) -> bool:
        return self.inject_every > 0 and self.calls % self.inject_every == 0

    def __call__(self, **kw: Any) -> Any:
        self.calls += 1
        try:
            if self._inject() and self.inject_mode == "raise":
                raise InjectedDrafterFaultError(f"injected drafter fault, draft step {self.calls}")
            proposal = self.original(**kw)
            if self._inject():
                proposal = _poisoned(proposal)
            reason = non_finite_reason(proposal)
            if reason is None:
                return proposal
            detail = "non-finite confidences or draft logits"
        except Exception as exc:  # any drafter failure must not lose the step
            reason, detail = "draft_error", f"{type(exc).__name__}: {exc}"
        return self._fallback(reason, detail, **kw)

    def _fallback(self, reason: str, detail: str, **kw: Any) -> Any:
        self.fallbacks += 1
        bs = int(kw["bs"])
        if self.records:
            metrics.count_fallback(reason)
        logger.warning(
            "DSPARK_MOE: drafter fault (%s: %s); %d request(s) fall back to plain "
            "decoding for this step",
            reason,
            detail,
            bs,
        )
        setattr(self.planner, FORCE_PLAIN_ATTR, True)
        anchor = kw["draft_input"].bonus_tokens.view(-1)[:bs]
        width = (
            self.gamma + 1 if getattr(self.proposer, "sample_from_anchor", False) else self.gamma
        )
        return plain_decoding_proposal(
            anchor=anchor,
            gamma=self.gamma,
            block_width=width,
            sampling_info=kw.get("sampling_info"),
            with_confidence=getattr(self.planner, "carries_confidence", False),
        )
