"""The CPU port of SGLang's chain speculative sampling kernel is lossless.

Statistical check (fixed seed): a 2-slot chain over a 6-token vocabulary with
random target/draft tables, 400k independent rows. The first emitted token must
follow the target's first distribution ``p0``; among rows that accepted draft 1
(``x1``), the second token must follow ``p1[x1]``. Pearson chi-square against
the exact distribution, rejected below p = 1e-4 (a lossy sampler with an error
of 1 % in any cell fails at this sample size).
"""

from __future__ import annotations

import pytest
import torch
from scipy.stats import chisquare

from dspark_sglang.sglang_integration.cpu_sampling import (
    chain_sampling_cpu_tolerant,
    chain_speculative_sampling_torch,
)

V = 6
N = 400_000


def _tables(gen: torch.Generator) -> tuple[torch.Tensor, ...]:
    def dist(*shape: int) -> torch.Tensor:
        return torch.softmax(2.0 * torch.randn(*shape, V, generator=gen), dim=-1)

    return dist(), dist(V), dist(), dist(V)  # p0, p1[x1], q0, q1[x1]


def _run(seed: int) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(seed)
    p0, p1, q0, q1 = _tables(gen)
    x1 = torch.multinomial(q0, N, replacement=True, generator=gen)
    x2 = torch.multinomial(q1[x1], 1, generator=gen).squeeze(1)
    slots = 3  # root + 2 drafts
    candidates = torch.stack([torch.zeros_like(x1), x1, x2], dim=1)
    target = torch.stack([p0.expand(N, V), p1[x1], p1[x2]], dim=1)  # row 2: bonus (any dist)
    draft = torch.stack([q0.expand(N, V), q1[x1]], dim=1)
    retrive = torch.arange(N * slots).view(N, slots)
    predicts = torch.full((N * slots,), -1, dtype=torch.int32)
    accept_index = torch.full((N, slots), -1, dtype=torch.int32)
    accept_num = torch.zeros(N, dtype=torch.int32)
    chain_speculative_sampling_torch(
        predicts,
        accept_index,
        accept_num,
        candidates,
        retrive,
        torch.rand(N, slots, generator=gen),
        torch.rand(N, generator=gen),
        target,
        draft,
    )
    return p0, p1, x1, predicts.view(N, slots), accept_index, accept_num


def _chi2_p(observed: torch.Tensor, probs: torch.Tensor) -> float:
    counts = torch.bincount(observed, minlength=V).double()
    expected = probs.double() / probs.double().sum() * counts.sum()
    return float(chisquare(counts.numpy(), expected.numpy()).pvalue)


def test_emitted_tokens_follow_the_target() -> None:
    p0, p1, x1, predicts, accept_index, accept_num = _run(seed=0)
    # The first emitted token sits at the root's slot: the accepted x1 or the correction.
    first = predicts[:, 0].long()
    assert _chi2_p(first, p0) > 1e-4
    accepted1 = accept_num >= 1
    assert bool((first[accepted1] == x1[accepted1]).all())
    # Draft 1 accepted with probability sum_x min(p0, q0): the kernel's acceptance rule.
    gen = torch.Generator().manual_seed(0)
    _, _, q0, _ = _tables(gen)
    rate = float(torch.minimum(p0, q0).sum())
    assert abs(float(accepted1.double().mean()) - rate) < 5 * (rate * (1 - rate) / N) ** 0.5
    # Second token, given draft 1 was accepted, follows p1[x1] for every x1 value.
    second = predicts[:, 1].long()
    for v in range(V):
        rows = accepted1 & (x1 == v)
        if int(rows.sum()) > 2000:
            assert _chi2_p(second[rows], p1[v]) > 1e-4
    # accept_index records the retrieve slots of the accepted path.
    assert bool((accept_index[:, 0] == torch.arange(N) * 3).all())
    assert bool((accept_index[accepted1, 1] == (torch.arange(N) * 3 + 1)[accepted1]).all())


def test_a_lossy_sampler_would_fail_this_check() -> None:
    """Power check: always emitting the draft's token (no rejection) is detected."""
    p0, _, x1, *_ = _run(seed=1)
    assert _chi2_p(x1, p0) < 1e-4


def test_hook_sends_cpu_tensors_to_the_port_and_refuses_block_mode() -> None:
    calls: list[str] = []

    def original(*args: object, **kwargs: object) -> str:
        calls.append("triton")
        return "triton"

    n, slots = 4, 3
    kw = {
        "predicts": torch.full((n * slots,), -1, dtype=torch.int32),
        "accept_index": torch.zeros(n, slots, dtype=torch.int32),
        "accept_token_num": torch.zeros(n, dtype=torch.int32),
        "candidates": torch.zeros(n, slots, dtype=torch.int64),
        "retrive_index": torch.arange(n * slots).view(n, slots),
        "retrive_next_token": None,
        "retrive_next_sibling": None,
        "uniform_samples": torch.rand(n, slots),
        "uniform_samples_for_final_sampling": torch.rand(n),
        "target_probs": torch.full((n, slots, V), 1.0 / V),
        "draft_probs": torch.full((n, slots - 1, V), 1.0 / V),
        "threshold_single": 1.0,
        "threshold_acc": 1.0,
        "deterministic": True,
    }
    assert chain_sampling_cpu_tolerant(original, **kw) is None
    assert calls == [] and int(kw["predicts"].min()) >= -1
    assert bool((kw["accept_token_num"] >= 0).all())
    with pytest.raises(NotImplementedError, match="block verification"):
        chain_sampling_cpu_tolerant(original, **kw, block_verification=True)
