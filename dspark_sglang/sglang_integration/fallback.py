"""Drafter faults: the affected requests fall back to plain decoding, nothing is lost.

Why it is safe: verification is lossless for *any* draft tokens. Under greedy
verification the target keeps only drafts equal to its own argmax and always
emits its own next token; under rejection sampling a draft block marked
``greedy_draft`` is checked against a one-hot draft distribution, which is
exact for tokens chosen deterministically. So a request whose drafter output is
unusable gets a placeholder proposal (every draft = the anchor token,
confidences 0, a one-hot draft distribution on the anchor) and verify length 1
(the anchor only, i.e. 0 drafts). The target then emits exactly its own token,
as plain decoding would. In SGLang's ``static`` ragged mode there is no
per-request layout, so the placeholder drafts are verified (and, being lossless,
can only be accepted when they equal the target's tokens); in
``cap-accept``/``compact`` the cap of 1 verifies none.

Two kinds of fault, two paths:

* The drafter *raises* (an exception is already a host event): the whole step
  falls back on the host (:func:`plain_decoding_proposal`,
  :data:`FORCE_PLAIN_ATTR`), counted as ``dspark_fallback_total{reason="draft_error"}``.
* The drafter returns *non-finite* confidences or draft logits: no host branch.
  :func:`non_finite_rows` flags the affected requests on the device and
  :func:`fold_rows` replaces exactly those rows with the placeholder via
  ``torch.where`` (:data:`PLAIN_ROWS_ATTR` caps their verify length at 1). The
  healthy rows of the step keep their drafts. ``dspark_fallback_total{reason=
  "non_finite"}`` counts steps with at least one such row, from the device
  accumulator (``metrics.StepMetrics``), when it is flushed.

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

from dspark_sglang.sglang_integration import metrics, sync_probe

logger = logging.getLogger(__name__)

FAULT_EVERY_ENV = "DSPARK_FAULT_INJECT_EVERY"
FAULT_MODE_ENV = "DSPARK_FAULT_INJECT_MODE"
#: Planner attribute: the next verify-length decision must be "anchor only".
FORCE_PLAIN_ATTR = "dspark_moe_force_plain"


class InjectedDrafterFaultError(RuntimeError):
    """Raised by the test-only fault injection in place of a real drafter error."""


#: Planner attribute: ``[N]`` bool device tensor, rows that must verify the anchor only.
PLAIN_ROWS_ATTR = "dspark_moe_plain_rows"


def non_finite_rows(proposal: Any, bs: int) -> torch.Tensor:
    """``[bs]`` bool (on the proposal's device): rows whose confidences or draft
    logits hold a non-finite value. Torch ops only, no host read.

    One reduction per row: a NaN or an infinity makes the row's float32 sum non-finite
    (``inf - inf`` is NaN). So does a sum that overflows float32, which only finite values
    beyond any logit's range can reach; such a row takes the placeholder too, which is
    always safe.
    """
    bad = torch.zeros(bs, dtype=torch.bool, device=proposal.draft_block.draft_tokens.device)
    for t in (
        getattr(proposal, "confidence", None),
        getattr(proposal.draft_block, "corrected_logits", None),
    ):
        if t is not None and t.is_floating_point():
            sums = t.reshape(t.shape[0], -1).sum(dim=1, dtype=torch.float32)
            bad = bad | ~torch.isfinite(sums[:bs]).to(bad.device)
    return bad


def one_hot_logits(logits: torch.Tensor, tokens: torch.Tensor, where: torch.Tensor) -> torch.Tensor:
    """``logits`` ``[N, G, V]`` with the slots in ``where`` made one-hot on ``tokens`` ``[N, G]``.

    A chosen slot's softmax (any temperature > 0) puts all its mass on its token: the
    lowest value everywhere, 0 at the token. Every other slot keeps its values. ``where``
    is ``[N, G]`` (per slot) or ``[N]`` (whole rows). One pass over the logits.
    """
    chosen = where.reshape(*where.shape, *([1] * (logits.dim() - where.dim())))
    index = tokens.to(torch.int64).unsqueeze(-1)
    out = logits.masked_fill(chosen, torch.finfo(logits.dtype).min)
    return out.scatter_(-1, index, torch.where(chosen, 0.0, out.gather(-1, index)))


def fold_rows(
    proposal: Any, bad: torch.Tensor, anchor: torch.Tensor, *, with_confidence: bool
) -> Any:
    """``proposal`` with the ``bad`` rows replaced by the plain-decoding placeholder.

    Per bad row: drafts (and the ``verify_ids`` drafts) = the anchor, confidences 0,
    draft logits one-hot on the anchor (so a sampling verify sees a deterministic
    draft, exact). Other rows are untouched. ``with_confidence=False`` (the planner
    carries none, SGLang's ``static`` mode) drops confidences, as
    :func:`plain_decoding_proposal` does.
    """
    block = proposal.draft_block
    tokens = block.draft_tokens
    row = bad.view(-1, *([1] * (tokens.dim() - 1)))
    anchor_col = anchor.view(-1, 1).to(tokens.dtype)
    new_tokens = torch.where(row, anchor_col, tokens)
    logits = block.corrected_logits
    if logits is not None:
        logits = one_hot_logits(logits, anchor_col.expand(-1, logits.shape[1]), bad)
    new_block = msgspec.structs.replace(block, draft_tokens=new_tokens, corrected_logits=logits)
    changes: dict[str, Any] = {"draft_block": new_block}
    verify_ids = getattr(proposal, "verify_ids", None)
    if verify_ids is not None:
        changes["verify_ids"] = torch.where(
            bad.view(-1, 1), anchor_col.to(verify_ids.dtype), verify_ids
        )
    for name in ("confidence", "confidence_raw"):
        t = getattr(proposal, name, None)
        if not with_confidence:
            changes[name] = None
        elif t is not None:
            changes[name] = torch.where(bad.view(-1, 1), torch.zeros_like(t), t)
    return msgspec.structs.replace(proposal, **changes)


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


def _pad_rows(t: torch.Tensor, rows: int) -> torch.Tensor:
    """``t`` (``[n, ...]``) padded with zeros to ``rows`` rows (shapes only, no read)."""
    if t.shape[0] >= rows:
        return t[:rows]
    return torch.cat((t, t.new_zeros((rows - t.shape[0], *t.shape[1:]))))


class GuardedPropose:
    """Wraps a proposer's ``propose``: faults become plain decoding (module doc).

    A raising drafter: counts ``dspark_fallback_total{reason="draft_error"}``, logs
    one warning line, marks the planner (:data:`FORCE_PLAIN_ATTR`) and returns
    :func:`plain_decoding_proposal` (``fallbacks`` counts these steps). Every
    other step goes through :meth:`fold` on the device, with no host read.
    """

    def __init__(
        self,
        original: Callable[..., Any],
        proposer: Any,
        planner: Any,
        gamma: int,
        *,
        records: bool = True,
        step_metrics: metrics.StepMetrics | None = None,
        host_flags: bool = False,
    ) -> None:
        self.original = original
        self.proposer = proposer
        self.planner = planner
        self.gamma = gamma
        #: Whether this rank counts fallbacks in metrics (TP rank 0 only).
        self.records = records
        #: Device accumulator counting non-finite steps (``None``: not counted).
        self.step_metrics = step_metrics
        #: The drafter's output is in host memory (a CPU worker): :meth:`fold` reads its flags.
        self.host_flags = host_flags
        self.calls = 0
        self.fallbacks = 0
        #: Rewrites each healthy step's proposal after :meth:`fold` (context copies), or None.
        self.context_copy: Callable[..., Any] | None = None
        #: Decides per step whether to draft at all (``draft_gate.DraftGate``), or None.
        self.draft_gate: Any = None
        #: The worker already asked :attr:`draft_gate` this step and it said draft
        #: (``plain_decode.try_plain_step``); consumed by the next call.
        self.decided_to_draft = False
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
        gate = self.draft_gate
        decided, self.decided_to_draft = self.decided_to_draft, False
        if gate is not None and not decided and not gate.drafts(kw["batch"], int(kw["bs"])):
            return self._plain_step(**kw)
        self.calls += 1
        try:
            if self._inject() and self.inject_mode == "raise":
                raise InjectedDrafterFaultError(f"injected drafter fault, draft step {self.calls}")
            proposal = self.original(**kw)
            if self._inject():
                proposal = _poisoned(proposal)
        except Exception as exc:  # any drafter failure must not lose the step
            return self._fallback("draft_error", f"{type(exc).__name__}: {exc}", **kw)
        proposal = self.fold(proposal, **kw)
        if self.context_copy is not None:
            try:
                with sync_probe.sync_free("GuardedPropose.context_copy"):
                    proposal = self.context_copy(proposal, **kw)
            except Exception as exc:  # copies are an aid: keep the drafter's drafts
                self.context_copy = None
                logger.warning(
                    "DSPARK_MOE: context copies failed (%s: %s); serving the drafter's drafts "
                    "without them from now on",
                    type(exc).__name__,
                    exc,
                )
        if gate is not None:
            gate.observe(kw["batch"], int(kw["bs"]), proposal)
        return proposal

    def _plain_step(self, **kw: Any) -> Any:
        """The draft decision chose a plain decode step: the placeholder, no drafter call."""
        from dspark_sglang.sglang_integration.draft_gate import SKIPPED_ATTR

        setattr(self.planner, FORCE_PLAIN_ATTR, True)
        setattr(self.planner, SKIPPED_ATTR, True)
        return self._placeholder(**kw)

    def fold(self, proposal: Any, **kw: Any) -> Any:
        """Non-finite rows -> placeholder rows, their verify length capped at 1 (device).

        The rewrite passes over the whole ``[N, B, V]`` draft logits. On a GPU that is a
        few microseconds and a host read of "any row bad?" would stall the step, so it
        always runs. With ``host_flags`` (a CPU worker) reading that flag stalls nothing and
        the pass costs milliseconds, so a step without a bad row (nearly every one) skips it.
        """
        rows = int(proposal.draft_block.draft_tokens.shape[0])
        with sync_probe.sync_free("GuardedPropose.non_finite"):
            bad = _pad_rows(non_finite_rows(proposal, min(rows, int(kw["bs"]))), rows)
            setattr(self.planner, PLAIN_ROWS_ATTR, bad)
            if self.step_metrics is not None:
                self.step_metrics.count_non_finite(bad.any())
        if self.host_flags and not bool(bad.any()):
            return proposal
        with sync_probe.sync_free("GuardedPropose.fold"):
            anchor = _pad_rows(kw["draft_input"].bonus_tokens.reshape(-1), rows)
            return fold_rows(
                proposal,
                bad,
                anchor,
                with_confidence=getattr(self.planner, "carries_confidence", False),
            )

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
        return self._placeholder(**kw)

    def _placeholder(self, **kw: Any) -> Any:
        """:func:`plain_decoding_proposal` for this step's batch."""
        bs = int(kw["bs"])
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
