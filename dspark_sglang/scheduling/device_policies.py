"""Scheduling policies as device code: the same decisions, no host synchronisation.

Twins of ``policies.py`` (which stays the host oracle) written only in torch ops that
run wherever the confidences already are: sort, cumsum, cummin, gather, scatter. No
``.item()``, ``.tolist()``, ``.cpu()``, ``.numpy()``, tensor truth tests or Python
loops over requests or candidates, and every shape depends only on ``(N, B)`` and the
settings, never on values, so a step issues a fixed kernel sequence per batch size.

Algorithm (``DevicePrefixScheduler``, DSPARK Algorithm 1 with early stop). Rank the
``N*B`` candidates by survival ``A_{i,k} = prod_{j<=k} c_{i,j}`` with the oracle's
unique int64 key (survival desc, then position, then request) and one sort; then for
all prefixes at once ``tau = N + cumsum(A)``, ``theta[j] = tau[j] * SPS(N + j)``
with ``SPS`` a staircase lookup on a device copy of the cost table; candidate ``t``
is admitted iff ``theta`` increased at every step up to it
(``cummin(~(theta[1:] <= theta[:-1]))``), and verify lengths are a ``scatter_add`` of the
admitted candidates into their requests.

``DeviceLaggedBudgetScheduler``: the budget ``j*`` is the first argmax of ``theta``
over the survival of the step ``lag`` steps ago (a 0-d device tensor kept in the
history), rescaled to the current batch; the current survival only ranks, and the top
``d`` candidates are admitted (``rank < d``): a dynamic top-k under a stale budget.
``DeviceStaticK``, ``DeviceVerifyAll`` and ``DeviceNoSpeculation`` are constant fills.

Invariant (non-anticipating, hence lossless): whether candidate ``t`` is admitted
depends only on candidates ranked before it (prefix: the running ``theta`` up to
``t``, and a prefix scan's output ``j`` reads inputs ``<= j`` only) or on nothing
from this step (lagged: the budget), and a request's later drafts never rank before
its earlier ones, so draft ``k`` is never gated on a quantity computed from draft ``k``.

Exactness: on CPU the decisions equal the host oracle's bit for bit (same float32
survival, same key, float64 running sums accumulated left to right, same table
lookup). A CUDA scan may round ``tau`` differently in the last bit, which can only
flip a decision at an exact ``theta`` tie; the invariant holds either way. Not
checked here, because a range check needs a host read: confidences in ``[0, 1]``
(``policies.survival`` validates them on the host). Float64 is required, so Apple
MPS is refused.
"""

from __future__ import annotations

from collections import deque

import torch

from dspark_sglang.scheduling.cost_table import (
    CostModel,
    SpsAdditiveCostTable,
    SpsCostTable,
    _interp_clamped,
)
from dspark_sglang.scheduling.policies import (
    LaggedBudgetScheduler,
    NoSpeculation,
    PrefixScheduler,
    SchedulingPolicy,
    StaticK,
    VerifyAll,
    _draft_cap,
    _resolve_cap,
)
from dspark_sglang.scheduling.round_costs import RoundCosts

__all__ = [
    "DeviceCostTable",
    "DeviceLaggedBudgetScheduler",
    "DeviceNoSpeculation",
    "DevicePrefixScheduler",
    "DeviceStaticK",
    "DeviceVerifyAll",
    "device_survival",
    "device_twin",
]

_ONE_BITS = 0x3F800000  # float32 bits of 1.0 (as in policies.py)
_INDEX_MASK = 0xFFFFFFFF
_I64 = torch.int64
_F64 = torch.float64


def _as_device(device: torch.device | str) -> torch.device:
    """A concrete device (``cuda`` -> ``cuda:<current>``); MPS is refused (no float64)."""
    dev = torch.empty(0, device=device).device
    if dev.type == "mps":
        raise ValueError(
            "device='mps': the device policies keep float64 running sums (to match the "
            "host oracle) and MPS has no float64; use device='cpu' or a CUDA/XPU device"
        )
    return dev


class DeviceCostTable:
    """A cost table's ``SPS(b)`` as tensors on one device (built once, no host reads).

    ``SpsCostTable``: floor lookup, ``rate[clamp(searchsorted(probes, b, right) - 1)]``
    (SGLang's semantics: below the first probe its rate, above the last the last one's).
    ``SpsAdditiveCostTable``: ``1 / (bias + interp(alpha, N) + interp(theta, b))``, the
    same float64 ops as ``cost_table.py``. ``round_costs.RoundCosts`` (rounds timed on a
    CPU worker): its own lookup, on the CPU only (it is measured only there).
    ``max_batch_tokens`` (a staircase's, also through ``RoundCosts``) is what the
    policies cap their totals with.
    """

    def __init__(self, table: CostModel, device: torch.device | str = "cpu") -> None:
        self.device = _as_device(device)
        self.staircase = isinstance(table, SpsCostTable)
        self.measured: RoundCosts | None = None
        f64 = {"dtype": _F64, "device": self.device}
        if isinstance(table, RoundCosts):
            if self.device.type != "cpu":
                raise ValueError(
                    f"RoundCosts are timed on a CPU worker and priced on the host; got "
                    f"device {self.device}: give a worker on another device its cost table "
                    "(and draft_step_seconds) instead"
                )
            self.measured = table
            self.max_batch_tokens = table.max_batch_tokens
        elif isinstance(table, SpsCostTable):
            self.max_batch_tokens: int | None = table.max_batch_tokens
            self._probes = torch.tensor(table.sample_batch_tokens, dtype=_I64, device=self.device)
            self._rates = torch.tensor(table.sample_steps_per_sec, **f64)
        elif isinstance(table, SpsAdditiveCostTable):
            self.max_batch_tokens = None
            self._bias = table.bias_seconds
            self._bs = torch.tensor(table.bs_probes, **f64)
            self._alpha = torch.tensor(table.alpha_seconds, **f64)
            self._m = torch.tensor(table.m_probes, **f64)
            self._theta = torch.tensor(table.theta_seconds, **f64)
        else:
            raise TypeError(
                "cost_model must be an SpsCostTable, SpsAdditiveCostTable or RoundCosts (the "
                "device policies copy its probes to the device); a custom CostModel runs on the "
                f"host, so use policies.PrefixScheduler/LaggedBudgetScheduler; got "
                f"{type(table).__name__}"
            )

    def steps_per_sec(self, num_reqs: int, batch_tokens: torch.Tensor) -> torch.Tensor:
        """``SPS`` (float64) at every entry of ``batch_tokens`` (int64, on ``device``)."""
        if self.measured is not None:
            return self.measured.steps_per_sec(num_reqs, batch_tokens)
        if self.staircase:
            idx = torch.searchsorted(self._probes, batch_tokens, right=True) - 1
            return self._rates[idx.clamp_(0, self._probes.numel() - 1)]
        per_req = _interp_clamped(
            self._bs, self._alpha, torch.full((1,), float(num_reqs), dtype=_F64, device=self.device)
        )
        per_tok = _interp_clamped(self._m, self._theta, batch_tokens.to(_F64))
        return 1.0 / (self._bias + per_req + per_tok)


class _SpsRow:
    """``SPS(N + j)`` for ``j = 0..m`` on the device, memoised by the host ints ``(N, m)``."""

    def __init__(self, table: DeviceCostTable, max_entries: int = 256) -> None:
        self.table = table
        self.max_entries = max_entries
        self._cache: dict[tuple[int, int], torch.Tensor] = {}

    def __call__(self, n: int, m: int) -> torch.Tensor:
        hit = self._cache.get((n, m))
        if hit is None:
            tokens = torch.arange(n, n + m + 1, dtype=_I64, device=self.table.device)
            hit = self.table.steps_per_sec(n, tokens)
            if len(self._cache) >= self.max_entries:
                self._cache.clear()
            self._cache[(n, m)] = hit
        return hit


def _shape(confidence: torch.Tensor) -> tuple[int, int]:
    """``(N, B)`` of a floating ``[N, B]`` confidence tensor (metadata only, no data read)."""
    if confidence.dim() != 2:
        raise ValueError(
            f"confidence must be [N, B] (requests x draft positions), got shape "
            f"{tuple(confidence.shape)}"
        )
    if not confidence.is_floating_point():
        raise TypeError(f"confidence must be a floating tensor, got dtype {confidence.dtype}")
    n, b = confidence.shape
    return n, b


def device_survival(confidence: torch.Tensor) -> torch.Tensor:
    """Survival ``cumprod(c)`` (products in float64, rounded to float32; ``-0`` -> ``+0``)."""
    _shape(confidence)
    return torch.cumprod(confidence.detach().to(_F64), dim=1).abs_().to(torch.float32)


def _ranked(surv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(survival float64, request int64)`` of all candidates, best first (ties: k, i)."""
    n, b = surv.shape
    flat = surv.t().reshape(-1)  # position-major: index k * n + i
    key = (_ONE_BITS - flat.view(torch.int32).to(_I64)) << 32
    key |= torch.arange(n * b, dtype=_I64, device=surv.device)
    index = torch.sort(key).values & _INDEX_MASK
    return flat[index].to(_F64), index % n


def _theta(sps: _SpsRow, n: int, values: torch.Tensor) -> torch.Tensor:
    """``theta[j] = (N + sum_{t<j} A_t) * SPS(N + j)`` for ``j = 0..len(values)``."""
    start = torch.full((1,), float(n), dtype=_F64, device=values.device)
    return torch.cat((start, values)).cumsum(0) * sps(n, values.numel())


def _lengths(request: torch.Tensor, admitted: torch.Tensor, n: int) -> torch.Tensor:
    """Per-request counts of admitted candidates (``admitted``: 0/1 int64, ranked order)."""
    out = torch.zeros(n, dtype=_I64, device=request.device)
    return out.scatter_add_(0, request, admitted)


def _check_device(confidence: torch.Tensor, table: DeviceCostTable, who: str) -> None:
    if confidence.device != table.device:
        raise ValueError(
            f"{who}: confidence is on {confidence.device} but the cost table is on "
            f"{table.device}; build the policy with device={str(confidence.device)!r}"
        )


class DevicePrefixScheduler(SchedulingPolicy):
    """Algorithm 1 with early stop on the device (``PrefixScheduler``'s decisions).

    ``max_verify_tokens`` and the table's ``max_batch_tokens`` cap the total verify
    tokens ``N + drafts`` exactly as in ``PrefixScheduler``.
    """

    def __init__(
        self,
        cost_model: CostModel,
        max_verify_tokens: int | None = None,
        *,
        device: torch.device | str = "cpu",
    ) -> None:
        self.table = DeviceCostTable(cost_model, device)
        self.max_verify_tokens = _resolve_cap(max_verify_tokens, cost_model)
        self._sps = _SpsRow(self.table)

    @property
    def name(self) -> str:
        return "prefix"

    def decide(self, confidence: torch.Tensor) -> torch.Tensor:
        _check_device(confidence, self.table, "DevicePrefixScheduler")
        surv = device_survival(confidence)
        n, b = surv.shape
        cap = _draft_cap(n, b, self.max_verify_tokens)
        if cap == 0:
            return torch.zeros(n, dtype=_I64, device=surv.device)
        values, request = _ranked(surv)
        theta = _theta(self._sps, n, values[:cap])
        improved = (~(theta[1:] <= theta[:-1])).to(_I64)  # NaN counts as improved, as on host
        admitted = improved.cummin(0).values  # 1 up to the first non-improving candidate
        return _lengths(request[:cap], admitted, n)


class DeviceLaggedBudgetScheduler(SchedulingPolicy):
    """``LaggedBudgetScheduler`` on the device: stale budget, current dynamic top-k.

    The budget ``j*`` of each step stays a 0-d device tensor; ``last_budget`` (total
    verify tokens ``N + d`` of the last decision) is one too, read it when logging.
    """

    def __init__(
        self,
        cost_model: CostModel,
        lag: int = 2,
        max_verify_tokens: int | None = None,
        *,
        device: torch.device | str = "cpu",
    ) -> None:
        if isinstance(lag, bool) or not isinstance(lag, int) or lag < 1:
            raise ValueError(
                f"lag must be an int >= 1 (the budget must come from past steps; lag=0 "
                f"would anticipate this step's drafts), got {lag!r}"
            )
        self.table = DeviceCostTable(cost_model, device)
        self.lag = lag
        self.max_verify_tokens = _resolve_cap(max_verify_tokens, cost_model)
        self._sps = _SpsRow(self.table)
        self._history: deque[tuple[int, torch.Tensor]] = deque(maxlen=lag)
        self.last_budget: torch.Tensor | None = None

    @property
    def name(self) -> str:
        return f"lagged(lag={self.lag})"

    def reset(self) -> None:
        self._history.clear()
        self.last_budget = None

    def stale_budget(self, stale_survival: torch.Tensor) -> torch.Tensor:
        """0-d int64 ``j*``: first argmax of ``tau(N'+j) * SPS(N'+j)`` over ``[N', B]``."""
        n_old, b = stale_survival.shape
        values = torch.sort(stale_survival.reshape(-1).to(_F64), descending=True).values
        return self._budget(n_old, b, values)

    def _budget(self, n: int, b: int, descending: torch.Tensor) -> torch.Tensor:
        """``j*`` from survival values already sorted best first (first maximum)."""
        cap = _draft_cap(n, b, self.max_verify_tokens)
        return torch.argmax(_theta(self._sps, n, descending[:cap]))

    def decide(self, confidence: torch.Tensor) -> torch.Tensor:
        _check_device(confidence, self.table, "DeviceLaggedBudgetScheduler")
        surv = device_survival(confidence)
        n, b = surv.shape
        zero = torch.zeros((), dtype=_I64, device=surv.device)
        stale = self._history[0] if len(self._history) == self.lag else None
        cap = _draft_cap(n, b, self.max_verify_tokens)
        if stale is not None and stale[0] > 0:
            n_old, j_star = stale
            drafts = ((2 * n * j_star + n_old) // (2 * n_old)).clamp_(max=cap)  # half up
        else:
            drafts = zero + min(n, cap)  # fallback: one draft per request on average
        self.last_budget = drafts + n
        if n * b == 0:
            self._history.append((n, zero))
            return torch.zeros(n, dtype=_I64, device=surv.device)
        values, request = _ranked(surv)
        # This step's budget, for `lag` steps ahead: the ranking is the descending sort.
        self._history.append((n, self._budget(n, b, values)))
        rank = torch.arange(n * b, dtype=_I64, device=surv.device)
        return _lengths(request, (rank < drafts).to(_I64), n)


class DeviceStaticK(StaticK):
    """``min(k, B)`` drafts for every request (``StaticK``); ``k = 1`` is MTP-1."""

    def __init__(self, k: int) -> None:
        if isinstance(k, bool) or not isinstance(k, int) or k < 0:
            raise ValueError(f"DeviceStaticK needs an int k >= 0 draft tokens, got {k!r}")
        super().__init__(k)

    def decide(self, confidence: torch.Tensor) -> torch.Tensor:
        n, b = _shape(confidence)
        return torch.full((n,), min(self.k, b), dtype=_I64, device=confidence.device)


class DeviceVerifyAll(VerifyAll):
    """Every draft (``B``) of every request (``VerifyAll``)."""

    def decide(self, confidence: torch.Tensor) -> torch.Tensor:
        n, b = _shape(confidence)
        return torch.full((n,), b, dtype=_I64, device=confidence.device)


class DeviceNoSpeculation(NoSpeculation):
    """No draft (``NoSpeculation``)."""

    def decide(self, confidence: torch.Tensor) -> torch.Tensor:
        n, _ = _shape(confidence)
        return torch.zeros(n, dtype=_I64, device=confidence.device)


#: The policies that already run on the device (``device_twin`` returns them as they are).
DEVICE_POLICIES: tuple[type[SchedulingPolicy], ...] = (
    DevicePrefixScheduler,
    DeviceLaggedBudgetScheduler,
    DeviceStaticK,
    DeviceVerifyAll,
    DeviceNoSpeculation,
)


def device_twin(policy: SchedulingPolicy, device: torch.device | str = "cpu") -> SchedulingPolicy:
    """The device version of a host policy, with its settings (e.g. ``policy_from_config``'s).

    ``PrefixScheduler``/``LaggedBudgetScheduler`` need an ``SpsCostTable`` or
    ``SpsAdditiveCostTable`` as their cost model (it is copied to ``device``). A policy
    that is already a device policy is returned as it is.
    """
    if isinstance(policy, DEVICE_POLICIES):
        return policy
    if isinstance(policy, PrefixScheduler):
        return DevicePrefixScheduler(policy.cost_model, policy.max_verify_tokens, device=device)
    if isinstance(policy, LaggedBudgetScheduler):
        return DeviceLaggedBudgetScheduler(
            policy.cost_model, policy.lag, policy.max_verify_tokens, device=device
        )
    if isinstance(policy, StaticK):
        return DeviceStaticK(policy.k)
    if isinstance(policy, VerifyAll):
        return DeviceVerifyAll()
    if isinstance(policy, NoSpeculation):
        return DeviceNoSpeculation()
    raise TypeError(
        f"no device version of {type(policy).__name__}: device_twin takes PrefixScheduler, "
        "LaggedBudgetScheduler, StaticK, VerifyAll or NoSpeculation (build it with "
        "policies.build_policy)"
    )
