"""The draft decision inside DSPARK_MOE's decode step (``scheduling/draft_decision.py``).

The worker's fault guard around the proposer's ``propose`` (``fallback.GuardedPropose``)
asks :meth:`DraftGate.drafts` before the draft pass. When the step does not draft, the
guard returns the plain-decoding placeholder (every draft the anchor) without running
the drafter and marks the planner (:data:`SKIPPED_ATTR`, and ``FORCE_PLAIN_ATTR`` so
every request verifies its anchor only): the step is a plain decode step. The target's
hidden states of the token it decodes reach the draft's context as after any verify
(SGLang's ``commit_hidden`` runs after every verify, drafted or not), so the next
drafting round sees the same context it would have seen without the pause.

Evidence comes from each drafting round's calibrated confidences, after the fault fold
and context copies (what the verify policy saw), keyed by SGLang's request id. A CPU
worker reads them at once; on a GPU they are copied to pinned host memory without
waiting and read at a later step once their copy has finished, so the step never
synchronises (the decision then uses older evidence, which is still non-anticipating).

Outcome: after a drafting round the worker hands the gate its verify lengths and accept
lengths (:meth:`DraftGate.observe_outcome`); with the confidences the gate saw for that
round it tells the decision how many drafts were predicted and how many were accepted (its
acceptance correction). Read on the host only where they are host tensors (a CPU worker);
a GPU worker's decision keeps the uncorrected confidences, so no step synchronises.

Every TP rank must run the same step: with ``tp_size > 1`` rank 0's decision is
broadcast over the TP group's CPU group.

Metrics: ``dspark_draft_request_steps_total{drafted="true"|"false"}`` counts request-steps.
"""

from __future__ import annotations

import json
import logging
from collections import deque
from collections.abc import Hashable
from pathlib import Path
from typing import Any

import torch

from dspark_sglang.scheduling.draft_decision import DraftDecision, expected_accepted
from dspark_sglang.sglang_integration import metrics

logger = logging.getLogger(__name__)

#: Planner attribute: this step does not draft (the draft decision chose a plain step).
SKIPPED_ATTR = "dspark_moe_skipped_draft"


def request_keys(batch: Any, bs: int) -> list[Hashable]:
    """SGLang's request ids of the first ``bs`` requests of a decode batch (host list)."""
    return [req.rid for req in batch.reqs[:bs]]


class DraftGate:
    """Asks a :class:`DraftDecision` per step and feeds it each drafting round's evidence."""

    def __init__(
        self, decision: DraftDecision, *, records: bool = True, log: Path | None = None
    ) -> None:
        self.decision = decision
        self.records = records
        #: ``DSPARK_DECISION_LOG``: one JSON line per step with what was priced (debug aid).
        self.log = log
        self.drafted_steps = 0
        self.skipped_steps = 0
        self._pending: deque[tuple[list[Hashable], torch.Tensor, Any]] = deque()
        #: The confidences of the drafting round running now (host rows), for its outcome.
        self._round_conf: torch.Tensor | None = None

    def drafts(self, batch: Any, bs: int) -> bool:
        """Whether this decode step of ``bs`` requests runs the draft pass."""
        self._take_finished_copies()
        drafts = self.decision.decide(request_keys(batch, bs))
        drafts = _agree_across_tp(drafts)
        if drafts:
            self.drafted_steps += 1
        else:
            self.skipped_steps += 1
        if self.records:
            metrics.count_draft_request_steps(drafts, bs)
        if self.records and self.log is not None:
            price = self.decision.last
            row = {"requests": bs, "drafts": drafts, **(vars(price) if price else {})}
            with self.log.open("a", encoding="utf-8") as f:
                f.write(json.dumps({"draft_decision": row}) + "\n")
        return drafts

    def observe(self, batch: Any, bs: int, proposal: Any) -> None:
        """Record a drafting round's confidences (none: nothing to learn from)."""
        conf = getattr(proposal, "confidence", None)
        if conf is None:
            return
        keys = request_keys(batch, bs)
        rows = conf.detach()[:bs]
        if rows.device.type == "cpu":
            self.decision.observe(keys, rows)
            self._round_conf = rows
            return
        host = torch.empty(rows.shape, dtype=rows.dtype, pin_memory=True)
        host.copy_(rows, non_blocking=True)
        event = torch.get_device_module(rows.device).Event()
        event.record()
        self._pending.append((keys, host, event))

    def observe_outcome(self, verify_lens: torch.Tensor, accept_lens: torch.Tensor) -> None:
        """The drafting round's outcome (``verify_lens``: tokens verified per request, the
        anchor included; ``accept_lens``: tokens committed, the bonus included), given to
        the decision with the drafts its confidences predicted (host tensors only)."""
        conf, self._round_conf = self._round_conf, None
        if conf is None or verify_lens.device.type != "cpu" or accept_lens.device.type != "cpu":
            return
        n = min(int(conf.shape[0]), int(verify_lens.numel()), int(accept_lens.numel()))
        drafts = (verify_lens.reshape(-1)[:n].long() - 1).clamp(min=0)
        accepted = (accept_lens.reshape(-1)[:n].long() - 1).clamp(min=0)
        self.decision.observe_outcome(expected_accepted(conf[:n], drafts), float(accepted.sum()))

    def _take_finished_copies(self) -> None:
        while self._pending and self._pending[0][2].query():
            keys, host, _ = self._pending.popleft()
            self.decision.observe(keys, host)


def _agree_across_tp(drafts: bool) -> bool:
    """Rank 0's decision on every TP rank (host timings differ between ranks)."""
    from sglang.srt.runtime_context import get_parallel

    group = getattr(get_parallel(), "tp_group", None)
    if group is None or group.world_size <= 1:
        return drafts
    return bool(group.broadcast_object(drafts, src=0))
