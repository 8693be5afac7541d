"""Scheduling policies: how many draft tokens of each request the target verifies.

Every policy maps the calibrated per-position conditional acceptance
``confidence[i, k] = c_{i,k}`` (``[N, B]``, computed after drafting, so ``c_{i,k}``
may depend on the drafts before ``k``) to verify lengths ``l_i`` in ``0..B``.

Losslessness needs the choice to be *non-anticipating*: whether draft ``k`` of
request ``i`` is verified may depend on drafts ``< k`` but never on draft ``k``
itself. Survival ``A_{i,k} = prod_{j<=k} c_{i,j}`` only involves drafts ``< k``,
and every ranking here breaks ties by position (earlier first), so a request's
later candidates never rank before its earlier ones. A policy is then
non-anticipating as long as admitting the t-th ranked candidate depends only on the
candidates ranked before it (``PrefixScheduler``'s early stop) or on nothing from this
round (``LaggedBudgetScheduler``'s budget). ``AnticipatingGlobalSearch`` breaks that
rule on purpose and exists only to show the resulting bias.

Ranking: survival values are rounded to float32 (the confidence head's precision)
and packed with their position-major index ``k * N + i`` into one int64 key
``(bits(1.0) - bits(A)) << 32 | (k * N + i)``; float bit patterns of non-negative
numbers are monotone, so one ascending sort of unique keys orders candidates by
survival (desc), then position, then request. Running sums stay float64.
The decision core (key, sort, running sums, early stop, counts) runs on zero-copy
NumPy views of the host tensors: NumPy's SIMD sort is ~4x faster than ``torch.sort``
at these sizes and its per-op overhead is a fraction of torch's, which matters for
~30 small vector ops per step. Inputs and outputs are torch tensors.

Cost models are SGLang-compatible SPS tables (``scheduling/cost_table.py``); the
policies only rely on the ``CostModel`` protocol (``steps_per_sec(num_reqs,
batch_tokens)``, re-exported here). ``batch_tokens`` is the total number of tokens in
the verify forward: ``N`` anchors plus the admitted drafts. A cost model that also
has an integer ``max_batch_tokens`` (``SpsCostTable``: the engine's limit) caps that
total, as does a policy's own ``max_verify_tokens`` (the tighter one wins).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import deque
from typing import Any

import numpy as np
import torch

from dspark_sglang.scheduling.config import NEEDS_COST_TABLE, POLICIES, SchedulerConfig
from dspark_sglang.scheduling.cost_table import (
    CostModel,
    SpsAdditiveCostTable,
    SpsCostTable,
    load_cost_table,
    with_fixed_step_cost,
)

__all__ = [
    "IN_MEMORY_COST_TABLE",
    "POLICY_NAMES",
    "AnticipatingGlobalSearch",
    "CostModel",
    "LaggedBudgetScheduler",
    "NoSpeculation",
    "PrefixScheduler",
    "SchedulingPolicy",
    "StaticK",
    "VerifyAll",
    "build_policy",
    "policy_from_config",
    "survival",
]


_ONE_BITS = 0x3F800000
"""float32 bit pattern of 1.0: bits of x in [0, 1] lie in [0, _ONE_BITS], monotone in x."""
_INDEX_MASK = 0xFFFFFFFF


def survival(confidence: torch.Tensor) -> torch.Tensor:
    """Validated survival ``A = cumprod(c)`` (``[N, B]`` float32, products taken in float64)."""
    if confidence.dim() != 2:
        raise ValueError(
            f"confidence must be [N, B] (requests x draft positions), got shape "
            f"{tuple(confidence.shape)}"
        )
    c = confidence.detach()
    if c.device.type != "cpu":
        c = c.cpu()  # the scheduler runs on the host, like SGLang's budget planner
    c = c.double()
    if c.numel():
        lo, hi = (float(x) for x in c.aminmax())  # one reduction; NaN fails both tests
        if not (lo >= 0.0 and hi <= 1.0):
            raise ValueError(
                "confidence values must be probabilities in [0, 1] (calibrated sigmoid "
                f"outputs); got range [{lo}, {hi}] (nan means a NaN entry)"
            )
    # abs() maps -0.0 to +0.0 so every bit pattern is a non-negative integer.
    return torch.cumprod(c, dim=1).abs_().to(torch.float32)


def _ranked(surv: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    """Candidates ordered by survival (desc), then position, then request.

    Returns ``(sorted_survival [N*B] float64, request_index [N*B] int64)`` as NumPy
    arrays: the ranking, the running sums and the early stop work on zero-copy host
    views, because NumPy's per-op overhead is a fraction of torch's at these sizes
    (the whole decision is ~30 small vector ops).
    """
    n, b = surv.shape
    flat = surv.t().contiguous().numpy().reshape(-1)  # position-major: index k * n + i
    key = (_ONE_BITS - flat.view(np.int32).astype(np.int64)) << 32
    key |= np.arange(n * b, dtype=np.int64)
    key.sort()
    index = key & _INDEX_MASK
    return flat[index].astype(np.float64), index % n


class _SpsCache:
    """Memoised ``SPS(N + j)``, ``j = 0..m``: the tables are immutable and a serving
    loop asks for the same ``(N, m)`` every step, so the lookup is paid once."""

    def __init__(self, cost_model: CostModel, max_entries: int = 256) -> None:
        self.cost_model = cost_model
        self.max_entries = max_entries
        self._cache: dict[tuple[int, int], np.ndarray] = {}

    def __call__(self, n: int, m: int) -> np.ndarray:
        hit = self._cache.get((n, m))
        if hit is not None:
            return hit
        tokens = n + torch.arange(m + 1, dtype=torch.int64)
        sps_t = torch.as_tensor(self.cost_model.steps_per_sec(n, tokens), dtype=torch.float64)
        if sps_t.shape != tokens.shape:
            raise ValueError(
                f"cost model returned SPS of shape {tuple(sps_t.shape)} for {tokens.numel()} "
                "batch sizes; steps_per_sec must be elementwise over batch_tokens"
            )
        sps = sps_t.cpu().numpy()
        if len(self._cache) >= self.max_entries:
            self._cache.clear()
        self._cache[(n, m)] = sps
        return sps


def _theta(sps: _SpsCache, n: int, sorted_survival: np.ndarray) -> np.ndarray:
    """Expected tokens per second ``theta[j]`` after admitting the first ``j`` candidates.

    ``tau[j] = N + sum_{t<j} A_t`` (accumulated left to right, like Algorithm 1) and
    ``theta[j] = tau[j] * SPS(N + j)`` for ``j = 0..M``.
    """
    tau = np.concatenate(([float(n)], sorted_survival)).cumsum()  # sequential accumulate
    return tau * sps(n, sorted_survival.size)


def _draft_cap(n: int, b: int, max_verify_tokens: int | None) -> int:
    """Most drafts admissible: all ``N*B``, or what fits under the total-token cap."""
    cap = n * b
    if max_verify_tokens is not None:
        cap = min(cap, max(0, max_verify_tokens - n))
    return cap


def _lengths(request_index: np.ndarray, admitted: int, n: int) -> torch.Tensor:
    """Per-request verify lengths (int64 tensor) from the first ``admitted`` candidates."""
    return torch.from_numpy(np.bincount(request_index[:admitted], minlength=n).astype(np.int64))


def _resolve_cap(max_verify_tokens: int | None, cost_model: CostModel) -> int | None:
    """The tighter of the policy's cap and the cost table's ``max_batch_tokens`` (if any).

    The table's limit is what the engine can run; an explicit cap can only tighten it.
    """
    if max_verify_tokens is not None:
        if isinstance(max_verify_tokens, bool) or not isinstance(max_verify_tokens, int):
            raise TypeError(f"max_verify_tokens must be an int or None, got {max_verify_tokens!r}")
        if max_verify_tokens < 1:
            raise ValueError(
                f"max_verify_tokens must be >= 1 or None (no cap), got {max_verify_tokens}"
            )
    table_cap = getattr(cost_model, "max_batch_tokens", None)
    caps = [max_verify_tokens]
    if isinstance(table_cap, int) and not isinstance(table_cap, bool) and table_cap >= 1:
        caps.append(table_cap)
    valid = [c for c in caps if c is not None]
    return min(valid) if valid else None


def _require_cost_model(cost_model: Any, who: str) -> CostModel:
    if not isinstance(cost_model, CostModel):
        raise TypeError(
            f"{who} needs a cost model with steps_per_sec(num_reqs, batch_tokens) "
            f"(e.g. scheduling.cost_table.SpsCostTable), got {type(cost_model).__name__}"
        )
    return cost_model


class SchedulingPolicy(ABC):
    """Maps per-position confidences ``[N, B]`` to verify lengths ``[N]`` in ``0..B``."""

    @property
    @abstractmethod
    def name(self) -> str:
        """Short identifier used in logs and benchmark tables."""

    @abstractmethod
    def decide(self, confidence: torch.Tensor) -> torch.Tensor:
        """Verify lengths (int64 ``[N]``) for this step's calibrated confidences."""

    def reset(self) -> None:  # noqa: B027 - stateless policies have nothing to reset
        """Forget any history (start of a new serving session)."""


class PrefixScheduler(SchedulingPolicy):
    """DSPARK Algorithm 1: hardware-aware prefix scheduler with early stop.

    Algorithm: rank all candidates ``(i, k)`` by survival ``A_{i,k}`` (desc, ties by
    position). Start at ``b = N``, ``tau = N``, ``best = N * SPS(N)``; admit candidates
    in order (``b += 1``, ``tau += A``, ``theta = tau * SPS(b)``) while ``theta > best``
    (then ``best = theta``) and stop at the first candidate that does not improve.
    Vectorised as: ``theta`` for every prefix, then the first index where
    ``theta[j] <= theta[j-1]``.

    Invariant: admission of the t-th candidate depends only on candidates ranked
    before it, so the verify lengths are non-anticipating (lossless verification).
    ``max_verify_tokens`` (and the cost table's ``max_batch_tokens``, if any) caps
    the total verify tokens ``b``; anchors are always verified, so with
    ``N >= max_verify_tokens`` no draft is admitted.
    """

    def __init__(self, cost_model: CostModel, max_verify_tokens: int | None = None) -> None:
        self.cost_model = _require_cost_model(cost_model, "PrefixScheduler")
        self.max_verify_tokens = _resolve_cap(max_verify_tokens, self.cost_model)
        self._sps = _SpsCache(self.cost_model)

    @property
    def name(self) -> str:
        return "prefix"

    def decide(self, confidence: torch.Tensor) -> torch.Tensor:
        surv = survival(confidence)
        n, b = surv.shape
        cap = _draft_cap(n, b, self.max_verify_tokens)
        if cap == 0:
            return torch.zeros(n, dtype=torch.int64)
        values, request = _ranked(surv)
        theta = _theta(self._sps, n, values[:cap])
        stops = np.flatnonzero(theta[1:] <= theta[:-1])  # first non-improving candidate
        admitted = int(stops[0]) if stops.size else theta.size - 1
        return _lengths(request, admitted, n)


class AnticipatingGlobalSearch(SchedulingPolicy):
    """BIASED on purpose: Algorithm 1 without the early stop. Do not serve with it.

    Algorithm: rank candidates as ``PrefixScheduler`` does, compute ``theta`` for
    every prefix of the whole ranked list and admit the argmax prefix (first maximum).
    Admitting draft ``k`` then depends on later candidates such as ``A_{i,k+1}``,
    which is a function of draft ``k`` itself, so the decision anticipates the token
    it gates and the output is no longer the target's distribution (DSPARK
    Appendix A: P(A) = 0.85 instead of 0.7). It exists only to prove that the
    lossless tests have the power to detect such a bias; ``build_policy`` does not
    offer it.
    """

    def __init__(self, cost_model: CostModel) -> None:
        self.cost_model = _require_cost_model(cost_model, "AnticipatingGlobalSearch")
        self._sps = _SpsCache(self.cost_model)

    @property
    def name(self) -> str:
        return "anticipating_global"

    def decide(self, confidence: torch.Tensor) -> torch.Tensor:
        surv = survival(confidence)
        n, b = surv.shape
        if n * b == 0:
            return torch.zeros(n, dtype=torch.int64)
        values, request = _ranked(surv)
        theta = _theta(self._sps, n, values)
        return _lengths(request, int(np.argmax(theta)), n)  # first maximum


class LaggedBudgetScheduler(SchedulingPolicy):
    """Production variant: a budget from stale confidences, filled by current ranking.

    Algorithm, per step with ``N`` requests:

    1. Budget. With the survival values ``A'`` of the step ``lag`` steps ago (``N'``
       requests), ``j* = argmax_j (N' + sum of the top-j A') * SPS(N' + j)`` over the
       whole staircase (global argmax, first maximum on ties, no early stop: the lag
       is the causal barrier, nothing from this round enters the budget). ``j*`` is
       computed when those confidences arrive (as an async engine would) and kept
       for ``lag`` steps. It is mapped to the current batch by keeping the mean
       drafts per request, because requests join and leave between steps:
       ``d = round(j* * N / N')`` (half up). Before ``lag`` steps of history exist,
       or when the stale batch was empty, the fallback is ``d = N`` (one draft per
       request on average). ``d`` is clipped to ``N*B`` and to
       ``max_verify_tokens - N`` (and to the cost table's ``max_batch_tokens - N``).
    2. Ranking. The current survival values rank all candidates (desc, ties by
       position) and the top ``d`` are admitted: a dynamic top-k.

    Invariant: the budget depends only on past steps and a candidate's rank only on
    candidates that are not its own request's later drafts, so the verify lengths
    are non-anticipating. ``lag`` must be >= 1 (``lag = 0`` would be the biased
    global search).
    """

    def __init__(
        self, cost_model: CostModel, lag: int = 2, max_verify_tokens: int | None = None
    ) -> None:
        self.cost_model = _require_cost_model(cost_model, "LaggedBudgetScheduler")
        if isinstance(lag, bool) or not isinstance(lag, int) or lag < 1:
            raise ValueError(
                f"lag must be an int >= 1 (the budget must come from past steps; lag=0 "
                f"would anticipate this step's drafts), got {lag!r}"
            )
        self.lag = lag
        self.max_verify_tokens = _resolve_cap(max_verify_tokens, self.cost_model)
        self._sps = _SpsCache(self.cost_model)
        # (N', j*) of the last `lag` steps, oldest first.
        self._history: deque[tuple[int, int]] = deque(maxlen=lag)
        self.last_budget: int | None = None
        """Total verify tokens ``N + d`` chosen by the last ``decide`` (for metrics)."""

    @property
    def name(self) -> str:
        return f"lagged(lag={self.lag})"

    def reset(self) -> None:
        self._history.clear()
        self.last_budget = None

    def stale_budget(self, stale_survival: torch.Tensor) -> int:
        """Drafts ``j*`` maximising ``tau(N'+j) * SPS(N'+j)`` over survival values ``[N', B]``."""
        n_old, b = stale_survival.shape
        cap = _draft_cap(n_old, b, self.max_verify_tokens)
        flat = stale_survival.reshape(-1).to(torch.float64).numpy()
        values = np.sort(flat)[::-1][:cap]
        return int(np.argmax(_theta(self._sps, n_old, values)))  # first maximum

    def decide(self, confidence: torch.Tensor) -> torch.Tensor:
        surv = survival(confidence)
        n, b = surv.shape
        stale = self._history[0] if len(self._history) == self.lag else None
        self._history.append((n, self.stale_budget(surv) if n else 0))
        if stale is not None and stale[0] > 0:
            n_old, j_star = stale
            drafts = (2 * j_star * n + n_old) // (2 * n_old)
        else:
            drafts = n
        drafts = min(drafts, _draft_cap(n, b, self.max_verify_tokens))
        self.last_budget = n + drafts
        if drafts == 0:
            return torch.zeros(n, dtype=torch.int64)
        _, request = _ranked(surv)
        return _lengths(request, drafts, n)


class StaticK(SchedulingPolicy):
    """Verify the first ``k`` drafts of every request (``min(k, B)``); MTP-1 is ``k = 1``.

    A constant length is trivially non-anticipating; it is the baseline the adaptive
    schedulers are measured against.
    """

    def __init__(self, k: int) -> None:
        if k < 0:
            raise ValueError(f"StaticK needs k >= 0 draft tokens, got {k}")
        self.k = k

    @property
    def name(self) -> str:
        return "mtp1" if self.k == 1 else f"static(k={self.k})"

    def decide(self, confidence: torch.Tensor) -> torch.Tensor:
        n, b = survival(confidence).shape
        return torch.full((n,), min(self.k, b), dtype=torch.int64)


class VerifyAll(SchedulingPolicy):
    """Verify every draft (``B``): DFlash-style speculative decoding without a scheduler."""

    @property
    def name(self) -> str:
        return "verify_all"

    def decide(self, confidence: torch.Tensor) -> torch.Tensor:
        n, b = survival(confidence).shape
        return torch.full((n,), b, dtype=torch.int64)


class NoSpeculation(SchedulingPolicy):
    """Verify no draft: every round emits exactly the target's own next token."""

    @property
    def name(self) -> str:
        return "none"

    def decide(self, confidence: torch.Tensor) -> torch.Tensor:
        n, _ = survival(confidence).shape
        return torch.zeros(n, dtype=torch.int64)


POLICY_NAMES: tuple[str, ...] = POLICIES
"""Names ``build_policy`` accepts (the biased ``AnticipatingGlobalSearch`` is not one)."""


def build_policy(name: str, cost_model: CostModel | None = None, **kw: Any) -> SchedulingPolicy:
    """Construct a policy by name; ``kw`` go to its constructor.

    ``prefix``: ``max_verify_tokens``; ``lagged``: ``lag``, ``max_verify_tokens``;
    ``static``: ``k`` (required). ``prefix`` and ``lagged`` need ``cost_model``.
    """
    if name == "prefix":
        return PrefixScheduler(_require_cost_model(cost_model, "policy 'prefix'"), **kw)
    if name == "lagged":
        return LaggedBudgetScheduler(_require_cost_model(cost_model, "policy 'lagged'"), **kw)
    if name == "static":
        if "k" not in kw:
            raise ValueError("policy 'static' needs k=<draft tokens per request>")
        return StaticK(**kw)
    if name in ("mtp1", "verify_all", "none"):
        if kw:
            raise ValueError(f"policy {name!r} takes no options, got {sorted(kw)}")
        return {"mtp1": lambda: StaticK(1), "verify_all": VerifyAll, "none": NoSpeculation}[name]()
    raise ValueError(f"unknown scheduling policy {name!r}; choose one of {list(POLICY_NAMES)}")


IN_MEMORY_COST_TABLE = "<in-memory cost model>"
"""``cost_table_path`` of a config whose table is already loaded and handed to
``policy_from_config`` as ``cost_model`` (the simulator and the planner hold it in memory)."""


def policy_from_config(
    cfg: SchedulerConfig, *, cost_model: CostModel | None = None
) -> SchedulingPolicy:
    """The policy a scheduler config selects.

    The one translation from ``SchedulerConfig`` to a policy: the SGLang plugin, the
    chart's contract tests, the reference demo, the simulator and the planner all use
    it, so every one of them runs the settings the config validated. The cost table
    is loaded from ``cfg.cost_table_path``, or is ``cost_model`` when the caller
    already holds it (then ``cost_table_path`` only says where it came from, e.g.
    ``IN_MEMORY_COST_TABLE``). A ``draft_step_seconds`` number is added to the table's
    step time (``cost_table.with_fixed_step_cost``); unset, the table is used as it is
    (the SGLang worker may add a measured value later, ``scheduler_bridge``).
    """
    if cost_model is not None:
        cost: CostModel | None = cost_model
    elif cfg.cost_table_path == IN_MEMORY_COST_TABLE:
        raise ValueError(
            f"cost_table_path is {IN_MEMORY_COST_TABLE!r}: pass the loaded table as "
            "policy_from_config(cfg, cost_model=...)"
        )
    else:
        cost = load_cost_table(cfg.cost_table_path) if cfg.cost_table_path else None
    if cost is None and cfg.policy in NEEDS_COST_TABLE:
        raise ValueError(
            f"policy {cfg.policy!r} has no cost table: the config names no cost_table_path, "
            "and only the SGLang worker measures one at start-up (startup_profile); "
            "pass policy_from_config(cfg, cost_model=...) or set cost_table_path"
        )
    kw: dict[str, Any] = {}
    if cfg.policy == "static":
        kw["k"] = cfg.static_k
    elif cfg.policy in NEEDS_COST_TABLE:
        if cfg.draft_step_seconds is not None:
            if not isinstance(cost, SpsCostTable | SpsAdditiveCostTable):
                raise TypeError(
                    f"draft_step_seconds={cfg.draft_step_seconds} needs an SpsCostTable or "
                    f"SpsAdditiveCostTable to add it to, got {type(cost).__name__}; drop "
                    "draft_step_seconds or fold the draft time into your cost model"
                )
            cost = with_fixed_step_cost(cost, cfg.draft_step_seconds)
        kw["max_verify_tokens"] = cfg.max_verify_tokens
        if cfg.policy == "lagged":
            kw["lag"] = cfg.lag_steps
    return build_policy(cfg.policy, cost, **kw)
