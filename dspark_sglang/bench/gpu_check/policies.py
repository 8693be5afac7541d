"""Check 1, ``device_policies``: device scheduling policies equal the host ones.

Prefix, lagged, static-k and verify-all as device code against the host policies on
seeded random confidences and cost tables (staircase and additive); on CUDA every
decide call after a warm-up runs under ``torch.cuda.set_sync_debug_mode("error")``.
"""

from __future__ import annotations

import random
from typing import Any

import torch

from dspark_sglang.bench.gpu_check.common import Row, Sizes, verdict


def _random_table(rng: random.Random, max_tokens: int) -> Any:
    """A staircase (monotone or jagged, cap often binding) or an additive table."""
    from dspark_sglang.scheduling.cost_table import SpsAdditiveCostTable, SpsCostTable

    if rng.random() < 0.25:
        bs = tuple(sorted(rng.sample(range(1, 300), rng.randint(1, 3))))
        m = (1, 64, 512, 4096)[: rng.randint(1, 4)]
        return SpsAdditiveCostTable(
            bias_seconds=rng.uniform(0.005, 0.02),
            bs_probes=bs,
            alpha_seconds=tuple(rng.uniform(0.0, 0.004) for _ in bs),
            m_probes=m,
            theta_seconds=tuple(sorted(rng.uniform(0.0, 0.05) for _ in m)),
        )
    probes = sorted(rng.sample(range(1, max_tokens + 1), rng.randint(2, 12)))
    rates = [rng.uniform(20.0, 100.0) for _ in probes]
    if rng.random() < 0.6:
        rates.sort(reverse=True)
    slack = rng.choice([0, rng.randint(0, max_tokens), 10**5])
    return SpsCostTable(
        sample_batch_tokens=tuple(probes),
        sample_steps_per_sec=tuple(rates),
        max_batch_tokens=probes[-1] + slack,
    )


def _host_policies(table: Any) -> dict[str, Any]:
    from dspark_sglang.scheduling.policies import (
        LaggedBudgetScheduler,
        PrefixScheduler,
        StaticK,
        VerifyAll,
    )

    return {
        "prefix": PrefixScheduler(table),
        "lagged": LaggedBudgetScheduler(table, lag=2),
        "static-k": StaticK(3),
        "verify-all": VerifyAll(),
    }


def _sync_guard(device: torch.device) -> Any:
    """``set_sync_debug_mode("error")`` on CUDA for the block; nothing on other devices."""

    class _Guard:
        def __enter__(self) -> None:
            if device.type == "cuda":
                torch.cuda.set_sync_debug_mode("error")

        def __exit__(self, *exc: object) -> None:
            if device.type == "cuda":
                torch.cuda.set_sync_debug_mode("default")

    return _Guard()


def check_device_policies(device: torch.device, sizes: Sizes, seed: int) -> Row:
    """Device policies vs the host ones on random cases; decide under no-sync mode."""
    from dspark_sglang.scheduling.device_policies import device_twin

    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    b = sizes.policy_block
    decisions = mismatches = 0
    first_mismatch: str | None = None
    for case in range(sizes.policy_cases):
        n = rng.choice([1, 2, 3, 8, sizes.policy_max_n // 2, sizes.policy_max_n])
        table = _random_table(rng, sizes.policy_max_n * (b + 1))
        steps = [
            torch.rand((n, b), generator=gen).clamp_(1e-4, 1 - 1e-4)
            for _ in range(sizes.lagged_steps + 1)
        ]
        for name, host in _host_policies(table).items():
            dev = device_twin(host, device)
            moved = [c.to(device) for c in steps]
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            got = [dev.decide(moved[0])]  # warm-up: the cost-table rows of this (N, B)
            with _sync_guard(device):
                got += [dev.decide(c) for c in moved[1:]]
            want = [host.decide(c) for c in steps]
            for t, (g, w) in enumerate(zip(got, want, strict=True)):
                decisions += 1
                if not torch.equal(g.cpu(), w.cpu()):
                    mismatches += 1
                    if first_mismatch is None:
                        first_mismatch = (
                            f"case {case} {name} step {t} N={n}: device {g.cpu().tolist()} "
                            f"host {w.cpu().tolist()}"
                        )
    ok = mismatches == 0
    mode = "sync_debug_mode=error" if device.type == "cuda" else "no sync mode on cpu"
    detail = f"{decisions} decisions, {mismatches} differ from the host ({mode})"
    if first_mismatch:
        detail += f"; first: {first_mismatch}"
    return Row(
        "device_policies",
        verdict(ok),
        detail,
        {"decisions": decisions, "mismatches": mismatches, "cases": sizes.policy_cases},
    )
