"""Device policies: the host policies' decisions, without reading anything back.

The NumPy policies (``policies.py``) are the oracle: on thousands of random inputs
(fixed seeds; N up to 64, B up to 8, confidences with ties, zeros and ones; flat,
monotone, jagged and tile-like staircases, additive tables, either with a fixed draft
cost added (``with_fixed_step_cost``), table and policy caps)
the device versions must return exactly the same verify lengths. Losslessness is
tested by ``test_scheduling_lossless.py``, parametrised over both implementations.
The guard test runs every device policy with torch's host read-backs made to raise,
and TorchDynamo traces the prefix and lagged decisions as one graph of static shapes.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import pytest
import torch
from host_sync_guard import HostSyncError, host_syncs_raise

from dspark_sglang.scheduling.cost_table import (
    CostModel,
    SpsAdditiveCostTable,
    SpsCostTable,
    with_fixed_step_cost,
)
from dspark_sglang.scheduling.device_policies import (
    DeviceCostTable,
    DeviceLaggedBudgetScheduler,
    DevicePrefixScheduler,
    DeviceStaticK,
    device_survival,
    device_twin,
)
from dspark_sglang.scheduling.policies import (
    AnticipatingGlobalSearch,
    LaggedBudgetScheduler,
    NoSpeculation,
    PrefixScheduler,
    SchedulingPolicy,
    StaticK,
    VerifyAll,
    survival,
)

MAX_N, MAX_B = 64, 8

# --------------------------------------------------------------------------- random inputs


def random_table(rng: random.Random, n: int, b: int) -> SpsCostTable | SpsAdditiveCostTable:
    """A random table; a third of them with a fixed draft cost added to every step."""
    table = _random_target_table(rng, n, b)
    if rng.random() < 1 / 3:
        # Draft passes from far below to far above the target's step (rates 33..100/s).
        table = with_fixed_step_cost(table, rng.choice([1e-4, 0.003, 0.01, 0.05, 1.0]))
    return table


def _random_target_table(rng: random.Random, n: int, b: int) -> SpsCostTable | SpsAdditiveCostTable:
    """Flat, monotone, jagged or tile-like staircases (caps often binding), or additive."""
    kind = rng.random()
    if kind < 0.15:
        bs = tuple(sorted(rng.sample(range(1, 80), rng.randint(1, 3))))
        m = (1, 32, 128, 512)[: rng.randint(1, 4)]
        return SpsAdditiveCostTable(
            bias_seconds=rng.uniform(0.005, 0.02),
            bs_probes=bs,
            alpha_seconds=tuple(rng.uniform(0.0, 0.004) for _ in bs),
            m_probes=m,
            theta_seconds=tuple(sorted(rng.uniform(0.0, 0.05) for _ in m)),
        )
    if kind < 0.35:  # tile-like: fine steps, so the cut lands at varied survival levels
        step = rng.choice([4, 8, 16])
        probes = list(range(1, 700, step))
        decay = rng.uniform(0.9, 0.995)
        rates = [100.0 * decay**t for t in range(len(probes))]
    else:
        probes = sorted(rng.sample(range(1, 700), rng.randint(1, 10)))
        if kind < 0.5:  # flat: every theta step is a tie or a gain
            rates = [rng.choice([1.0, 33.3, 100.0])] * len(probes)
        else:
            rates = [rng.choice([100.0, 97.5, 90.0, 80.0, 55.5, 40.0, 33.3]) for _ in probes]
            if rng.random() < 0.6:
                rates.sort(reverse=True)  # monotone; otherwise jagged
    slack = rng.choice([0, rng.randint(0, n * (b + 1)), 10**5])
    return SpsCostTable(
        sample_batch_tokens=tuple(probes),
        sample_steps_per_sec=tuple(rates),
        max_batch_tokens=probes[-1] + slack,
    )


def random_conf(rng: random.Random, n: int, b: int) -> torch.Tensor:
    """Discrete values (exact ties, 0s and 1s), continuous ones, or a mix of both."""
    g = torch.Generator().manual_seed(rng.randrange(2**31))
    mode = rng.random()
    if mode < 0.4:
        pool = torch.tensor([0.0, 0.25, 0.5, 0.9, 1.0])
        return pool[torch.randint(0, 5, (n, b), generator=g)]
    conf = torch.rand(n, b, generator=g) ** rng.choice([0.2, 0.5, 1.0])
    if mode < 0.7:
        return conf
    u = torch.rand(n, b, generator=g)
    return torch.where(u < 0.1, 0.0, torch.where(u < 0.25, 1.0, conf))


def random_cap(rng: random.Random, n: int, b: int) -> int | None:
    return rng.choice([None, None, rng.randint(1, n * (b + 1) + 4)])


def decide_both(host: SchedulingPolicy, device: SchedulingPolicy, conf: torch.Tensor) -> None:
    want, got = host.decide(conf), device.decide(conf)
    assert got.dtype == torch.int64 and got.device == conf.device
    assert torch.equal(got, want), f"{host.name}: device {got.tolist()} != host {want.tolist()}"


# --------------------------------------------------------------------------- cost table


@pytest.mark.usefixtures("one_torch_thread")
def test_device_cost_table_equals_host_lookup() -> None:
    rng = random.Random(31)
    for _ in range(300):
        n, b = rng.randint(0, MAX_N), rng.randint(1, MAX_B)
        table = random_table(rng, max(n, 1), b)
        tokens = torch.arange(0, 800)
        want = table.steps_per_sec(n, tokens)
        got = DeviceCostTable(table).steps_per_sec(n, tokens)
        assert got.dtype == torch.float64
        assert torch.equal(got, want), table


# --------------------------------------------------------------------------- same decisions


@pytest.mark.usefixtures("one_torch_thread")
def test_device_prefix_equals_numpy_on_2000_random_cases() -> None:
    rng = random.Random(2026)
    cut = 0  # cases where the early stop (or the cap) cut inside the ranking
    for _ in range(2000):
        n, b = rng.randint(1, MAX_N), rng.randint(1, MAX_B)
        table, cap = random_table(rng, n, b), random_cap(rng, n, b)
        conf = random_conf(rng, n, b)
        host = PrefixScheduler(table, max_verify_tokens=cap)
        decide_both(host, device_twin(host), conf)
        cut += int(0 < int(host.decide(conf).sum()) < n * b)
    assert cut > 500, f"only {cut} cases cut inside the ranking"


@pytest.mark.usefixtures("one_torch_thread")
def test_device_lagged_equals_numpy_over_400_random_step_sequences() -> None:
    rng = random.Random(7)
    steps = 0
    for _ in range(400):
        b, lag = rng.randint(1, MAX_B), rng.randint(1, 3)
        table, cap = random_table(rng, MAX_N, b), random_cap(rng, MAX_N, b)
        host = LaggedBudgetScheduler(table, lag=lag, max_verify_tokens=cap)
        device = device_twin(host)
        assert isinstance(device, DeviceLaggedBudgetScheduler)
        for _step in range(8):  # requests join and leave; now and then the batch is empty
            n = 0 if rng.random() < 0.05 else rng.randint(1, MAX_N)
            decide_both(host, device, random_conf(rng, n, b))
            assert device.last_budget is not None
            assert int(device.last_budget) == host.last_budget
            steps += 1
        stale = survival(random_conf(rng, rng.randint(1, MAX_N), b))
        assert int(device.stale_budget(stale)) == host.stale_budget(stale)
        host.reset()
        device.reset()
        decide_both(host, device, random_conf(rng, 5, b))  # the fallback again
    assert steps == 3200


@pytest.mark.usefixtures("one_torch_thread")
def test_device_static_verify_all_none_equal_numpy() -> None:
    rng = random.Random(3)
    hosts: list[SchedulingPolicy] = [StaticK(0), StaticK(1), StaticK(3), StaticK(9)]
    hosts += [VerifyAll(), NoSpeculation()]
    for _ in range(200):
        n, b = rng.randint(0, MAX_N), rng.randint(1, MAX_B)
        conf = random_conf(rng, n, b)
        for host in hosts:
            device = device_twin(host)
            assert device.name == host.name
            decide_both(host, device, conf)


def test_device_survival_equals_host_survival() -> None:
    rng = random.Random(5)
    for _ in range(200):
        conf = random_conf(rng, rng.randint(1, MAX_N), rng.randint(1, MAX_B))
        assert torch.equal(
            device_survival(conf).view(torch.int32), survival(conf).view(torch.int32)
        )
    minus_zero = torch.tensor([[-0.0, 1.0]])
    assert (device_survival(minus_zero).view(torch.int32) >= 0).all()


# --------------------------------------------------------------------------- no host syncs

_STAIR = SpsCostTable(
    sample_batch_tokens=tuple(range(1, 300, 16)),
    sample_steps_per_sec=tuple(100.0 * 0.97**t for t in range(19)),
    max_batch_tokens=300,
)
_ADDITIVE = SpsAdditiveCostTable(
    bias_seconds=0.01,
    bs_probes=(1, 64),
    alpha_seconds=(0.0, 0.002),
    m_probes=(1, 64, 512),
    theta_seconds=(0.0, 0.002, 0.02),
)
GUARDED: dict[str, Callable[[], SchedulingPolicy]] = {
    "prefix": lambda: device_twin(PrefixScheduler(_STAIR)),
    "prefix_additive_capped": lambda: device_twin(PrefixScheduler(_ADDITIVE, 40)),
    "lagged": lambda: device_twin(LaggedBudgetScheduler(_STAIR, lag=2)),
    "lagged_additive": lambda: device_twin(LaggedBudgetScheduler(_ADDITIVE, lag=1)),
    "static": lambda: device_twin(StaticK(3)),
    "verify_all": lambda: device_twin(VerifyAll()),
    "none": lambda: device_twin(NoSpeculation()),
}


@pytest.mark.parametrize("name", list(GUARDED))
def test_device_policy_never_syncs_with_host(name: str) -> None:
    """Several steps (lagged: past the fallback, batch sizes changing, one empty)."""
    policy = GUARDED[name]()
    g = torch.Generator().manual_seed(1)
    confs = [torch.rand(n, 6, generator=g) for n in (17, 64, 0, 33, 33, 5)]
    with host_syncs_raise(f"device policy {name!r}"):
        lens = [policy.decide(conf) for conf in confs]
    assert [x.shape[0] for x in lens] == [17, 64, 0, 33, 33, 5]


def test_host_sync_guard_catches_the_numpy_policy() -> None:
    """The guard has teeth: the host policy reads the confidences back."""
    conf = torch.rand(4, 3, generator=torch.Generator().manual_seed(0))
    with pytest.raises(HostSyncError), host_syncs_raise("the host policy"):
        PrefixScheduler(_STAIR).decide(conf)


def static_shapes_only(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
    """A TorchDynamo backend that refuses a traced tensor of data-dependent shape.

    With ``dynamic=False`` every symbolic size is an unbacked one (boolean-mask
    indexing, ``nonzero``, ``bincount``), which Dynamo traces without a graph break.
    """
    for node in gm.graph.nodes:
        value = node.meta.get("example_value")
        for t in value if isinstance(value, tuple | list) else [value]:
            if isinstance(t, torch.Tensor) and not all(isinstance(d, int) for d in t.shape):
                raise AssertionError(f"data-dependent shape {tuple(t.shape)}: {node.format_node()}")
    return gm.forward


@pytest.mark.usefixtures("one_torch_thread")
def test_device_policies_trace_as_one_graph_of_static_shapes() -> None:
    """TorchDynamo's ``fullgraph=True`` refuses host reads; the backend, symbolic shapes.

    (A data-dependent shape needs no Python-level read, so the guard above cannot see
    it.) The host policy is refused, as a control.
    """
    g = torch.Generator().manual_seed(2)
    confs = [torch.rand(24, 6, generator=g) ** 0.3 for _ in range(4)]
    for make in (GUARDED["prefix"], GUARDED["lagged"]):
        torch._dynamo.reset()
        eager, policy = make(), make()
        traced = torch.compile(
            policy.decide, fullgraph=True, backend=static_shapes_only, dynamic=False
        )
        for conf in confs:
            assert torch.equal(traced(conf), eager.decide(conf))
    torch._dynamo.reset()
    host = torch.compile(PrefixScheduler(_STAIR).decide, fullgraph=True, backend="eager")
    with pytest.raises(Exception, match=r"(?i)data.dependent"):
        host(confs[0])
    torch._dynamo.reset()


# --------------------------------------------------------------------------- errors


def test_device_policy_errors_name_the_fix() -> None:
    class Custom:
        def steps_per_sec(self, num_reqs: int, batch_tokens: torch.Tensor) -> torch.Tensor:
            return torch.ones(batch_tokens.shape, dtype=torch.float64)

    custom: CostModel = Custom()
    with pytest.raises(TypeError, match="SpsCostTable, SpsAdditiveCostTable or RoundCosts"):
        DevicePrefixScheduler(custom)
    with pytest.raises(TypeError, match="no device version of AnticipatingGlobalSearch"):
        device_twin(AnticipatingGlobalSearch(_STAIR))
    with pytest.raises(ValueError, match="lag must be an int >= 1"):
        DeviceLaggedBudgetScheduler(_STAIR, lag=0)
    with pytest.raises(ValueError, match="k >= 0"):
        DeviceStaticK(-1)
    with pytest.raises(ValueError, match="max_verify_tokens must be >= 1"):
        DevicePrefixScheduler(_STAIR, 0)
    with pytest.raises(ValueError, match=r"must be \[N, B\]"):
        DevicePrefixScheduler(_STAIR).decide(torch.rand(4))
    with pytest.raises(TypeError, match="floating"):
        DevicePrefixScheduler(_STAIR).decide(torch.ones(2, 3, dtype=torch.int64))
    meta = torch.rand(2, 3, device="meta")
    with pytest.raises(ValueError, match="build the policy with device='meta'"):
        DevicePrefixScheduler(_STAIR).decide(meta)
