"""Whether a decode step drafts at all: a drafting round priced against a plain step.

A speculative round pays the draft pass for every running request, whatever the
policy then verifies. Where the drafts a batch can expect to keep are worth less
than that cost (a compute-bound batch, a request the drafter reads badly), a plain
decode step is faster: no draft pass, and the target verifies each anchor only.

The decision, made once per step before anything is drafted, over the ``N`` running
requests:

* Evidence: each request's calibrated confidences ``c_{i,1..B}`` from its drafting
  rounds (:meth:`DraftDecision.observe`), averaged with weight :data:`EVIDENCE_WEIGHT` on
  the latest round (so one poor block does not pause a request that drafts well). A
  request with none yet borrows the mean row of those that have some; with none at all
  the step drafts.
* Probe: a step drafts when the batch's last drafting step is a gap of plain steps old,
  so a paused batch refreshes its evidence and comes back when it improves. The gap
  starts at ``probe_every``; a probe after which the batch is still priced plain doubles
  it, up to :data:`MAX_PROBE_BACKOFF` times ``probe_every`` (a batch the drafter reads
  badly pays ever fewer probes); a step priced to draft sets it back to ``probe_every``.
* Otherwise the step drafts iff Algorithm 1 (the prefix scheduler) on the lagged
  confidences finds a round worth more tokens per second than a plain step::

      max_l  tau(l) * SPS_round(N, N + sum_i l_i)  >  N / plain_seconds(N)

  with ``tau(l) = N + rho * sum_i sum_{k <= l_i} A_{i,k}`` and ``A`` the survival
  ``cumprod(c)``. ``rho`` corrects the confidences by what drafting rounds actually got:
  the drafts accepted over the drafts their confidences predicted for the lengths
  verified (:meth:`DraftDecision.observe_outcome`), summed over the drafting rounds with
  weight :data:`OUTCOME_DECAY` per round of age; 1 before the first outcome.
  ``SPS_round`` is the policy's cost model (the target's table plus the draft pass:
  ``draft_step_seconds`` or the rounds a CPU worker timed); ``plain_seconds`` comes from
  the plain steps this decision timed (:meth:`DraftDecision.observe_plain`), else from
  the target-only table.

Invariant (lossless): the decision reads confidences and outcomes of rounds that are
over, step counts and costs, and is made before the step's drafts exist, so it cannot depend on
them. A step that does not draft is plain decoding: the target emits its own token.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field

import torch

from dspark_sglang.scheduling.cost_table import CostModel, CostTable
from dspark_sglang.scheduling.policies import PrefixScheduler, survival
from dspark_sglang.scheduling.round_costs import RoundCosts, RoundTimings

__all__ = ["EVIDENCE_WEIGHT", "MAX_PROBE_BACKOFF", "OUTCOME_DECAY", "DraftDecision", "StepPrice"]

_F64 = torch.float64
EVIDENCE_WEIGHT = 0.5
"""Weight of a request's latest drafting round in its evidence (the rest: its earlier ones)."""
MAX_PROBE_BACKOFF = 8
"""Largest probe gap, in multiples of ``probe_every`` (module doc, "Probe")."""
OUTCOME_DECAY = 0.9
"""Weight, per drafting round of age, of a round's outcome in ``rho`` (module doc)."""


def expected_accepted(confidence: torch.Tensor, drafts: torch.Tensor) -> float:
    """Drafts the confidences ``[N, B]`` predict accepted when request ``i`` verifies its
    first ``drafts[i]`` drafts: ``sum_i sum_{k <= drafts_i} A_{i,k}`` (the sum in ``tau``)."""
    surv = survival(confidence.to(_F64).clamp(0.0, 1.0))
    kept = torch.arange(surv.shape[1]).unsqueeze(0) < drafts.reshape(-1, 1)
    return float((surv * kept).sum())


@dataclass(frozen=True)
class StepPrice:
    """What one decision compared: tokens per second of each option (``None``: not priced)."""

    draft_tok_s: float | None
    plain_tok_s: float | None
    reason: str
    """``priced``, ``no_evidence`` or ``probe``."""
    rho: float = 1.0
    """The acceptance correction the price used (module doc)."""

    @property
    def drafts(self) -> bool:
        if self.reason != "priced":
            return True
        assert self.draft_tok_s is not None and self.plain_tok_s is not None
        return self.draft_tok_s > self.plain_tok_s


@dataclass
class DraftDecision:
    """Per step: draft, or run a plain decode step (module doc).

    ``round_model`` returns the cost model the policy prices drafting rounds with now
    (it changes as a CPU worker times rounds); ``plain_table`` is the target-only table.
    ``key`` identifies a request across steps (SGLang's request id).
    """

    block_size: int
    probe_every: int
    round_model: Callable[[], CostModel]
    plain_table: CostTable
    max_verify_tokens: int | None = None
    evidence: dict[Hashable, torch.Tensor] = field(default_factory=dict)
    plain_timings: RoundTimings = field(default_factory=RoundTimings)
    plain_costs: RoundCosts | None = None
    steps_since_draft: int = 0
    #: Plain steps in a row before the next probe (``probe_every``, doubled by backoff).
    probe_gap: int = 0
    #: Decayed sums of the drafts accepted and of those the confidences predicted.
    accepted: float = 0.0
    predicted: float = 0.0
    last: StepPrice | None = None
    _pricer: PrefixScheduler | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if isinstance(self.probe_every, bool) or int(self.probe_every) < 1:
            raise ValueError(f"probe_every must be an integer >= 1, got {self.probe_every!r}")
        if int(self.block_size) < 1:
            raise ValueError(f"block_size must be >= 1, got {self.block_size!r}")
        self.probe_gap = int(self.probe_every)

    def price(self, keys: Sequence[Hashable]) -> StepPrice:
        """Price this step for the requests ``keys`` (no state changes)."""
        n = len(keys)
        if n == 0:
            return StepPrice(None, None, "no_evidence")
        if self.steps_since_draft >= self.probe_gap:
            return StepPrice(None, None, "probe")
        known = [self.evidence[k] for k in keys if k in self.evidence]
        if not known:
            return StepPrice(None, None, "no_evidence")
        mean = torch.stack(known).mean(dim=0)
        conf = torch.stack([self.evidence.get(k, mean) for k in keys])
        model = self.round_model()
        if self._pricer is None or self._pricer.cost_model is not model:
            # Rebuilt only when the cost model changes: its SPS lookups are memoised.
            self._pricer = PrefixScheduler(model, self.max_verify_tokens)
        lens = self._pricer.decide(conf)
        rho = self.rho
        tau = n + rho * expected_accepted(conf, lens)
        tokens = torch.tensor([n + int(lens.sum())])
        draft = tau * float(model.steps_per_sec(n, tokens)[0])
        plain = n / self.plain_seconds(n)
        return StepPrice(draft, plain, "priced", rho)

    @property
    def rho(self) -> float:
        """Accepted over predicted drafts of the recent drafting rounds; 1 before any."""
        return self.accepted / self.predicted if self.predicted > 1e-9 else 1.0

    def observe_outcome(self, predicted: float, accepted: float) -> None:
        """A drafting round's outcome: the drafts its confidences predicted would be
        accepted for the lengths verified, and the drafts accepted."""
        for name, v in (("predicted", predicted), ("accepted", accepted)):
            if not math.isfinite(v) or v < 0:
                raise ValueError(f"{name} drafts must be finite and >= 0, got {v!r}")
        self.accepted = OUTCOME_DECAY * self.accepted + float(accepted)
        self.predicted = OUTCOME_DECAY * self.predicted + float(predicted)

    def decide(self, keys: Sequence[Hashable]) -> bool:
        """Whether this step drafts; advances the step count and forgets finished requests."""
        live = set(keys)
        for gone in [k for k in self.evidence if k not in live]:
            del self.evidence[gone]
        probed = self.last is not None and self.last.reason == "probe"
        self.last = self.price(keys)
        drafts = self.last.drafts
        if self.last.reason == "priced":
            if drafts:
                self.probe_gap = int(self.probe_every)
            elif probed:
                self.probe_gap = min(2 * self.probe_gap, MAX_PROBE_BACKOFF * int(self.probe_every))
        self.steps_since_draft = 0 if drafts else self.steps_since_draft + 1
        return drafts

    def observe(self, keys: Sequence[Hashable], confidence: torch.Tensor) -> None:
        """Add a drafting round's calibrated confidences ``[>= len(keys), B]`` to each
        request's evidence (the running average of the module doc).

        Values are read on the host: call with confidences that are already there, or
        accept the read (a CPU worker's are).
        """
        conf = confidence.detach()[: len(keys), : self.block_size].float().cpu().clamp(0.0, 1.0)
        if conf.shape != (len(keys), self.block_size):
            raise ValueError(
                f"confidence must be [{len(keys)}, {self.block_size}] for {len(keys)} requests, "
                f"got {tuple(confidence.shape)}"
            )
        for k, row in zip(keys, conf, strict=True):
            old = self.evidence.get(k)
            self.evidence[k] = row if old is None else torch.lerp(old, row, EVIDENCE_WEIGHT)

    def observe_plain(self, num_reqs: int, step_seconds: float, verify_seconds: float) -> None:
        """Record a plain step this decision chose: ``num_reqs`` anchors in ``step_seconds``."""
        self.plain_timings.add(num_reqs, num_reqs, step_seconds, verify_seconds)
        if self.plain_timings.ready:
            base = self.plain_table
            self.plain_costs = self.plain_timings.snapshot(base)

    def plain_seconds(self, n: int) -> float:
        """Seconds of a plain step of ``n`` requests: timed plain steps, else the table."""
        at = torch.tensor([n])
        if self.plain_costs is not None and self.plain_costs.rest:
            return float(self.plain_costs.step_seconds(n, at)[0])
        model = self.round_model()
        if isinstance(model, RoundCosts):
            return float(model.verify_seconds(n, at)[0])
        return float(1.0 / self.plain_table.steps_per_sec(n, at)[0])
