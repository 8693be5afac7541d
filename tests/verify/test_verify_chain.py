"""Chain speculative sampling and greedy verification with ragged verify lengths."""

from __future__ import annotations

import pytest
import torch
from scipy.stats import chisquare

from dspark_sglang.verify import PAD_TOKEN, VerifyResult, chain_verify, greedy_verify


def one_hot(tokens: list[list[int]], v: int) -> torch.Tensor:
    """``[N, L]`` token ids -> ``[N, L, V]`` one-hot distributions."""
    return torch.nn.functional.one_hot(torch.tensor(tokens), v).float()


# --------------------------------------------------------------------------- greedy


def test_greedy_ragged_lengths_padding_and_bonus() -> None:
    drafts = torch.tensor([[5, 6, 7], [5, 6, 7], [5, 6, 7], [5, 9, 7], [1, 2, 3]])
    target = torch.tensor(
        [
            [5, 6, 7, 8],  # all match, l=3 -> 3 accepted + bonus 8
            [5, 6, 7, 8],  # all match, l=1 -> 1 accepted + correction = target[1] = 6
            [5, 6, 7, 8],  # l=0 -> no draft checked, emits target[0]
            [5, 6, 7, 8],  # mismatch at 1, l=3 -> 1 accepted + 6
            [0, 2, 3, 4],  # mismatch at 0 -> 0 accepted + 0
        ]
    )
    lens = torch.tensor([3, 1, 0, 3, 2])
    res = greedy_verify(drafts, target, lens)
    assert res.accept_lens.tolist() == [3, 1, 0, 1, 0]
    assert res.num_emitted.tolist() == [4, 2, 1, 2, 1]
    assert res.tokens.tolist() == [
        [5, 6, 7, 8],
        [5, 6, PAD_TOKEN, PAD_TOKEN],
        [5, PAD_TOKEN, PAD_TOKEN, PAD_TOKEN],
        [5, 6, PAD_TOKEN, PAD_TOKEN],
        [0, PAD_TOKEN, PAD_TOKEN, PAD_TOKEN],
    ]


def test_greedy_never_accepts_past_the_verify_length() -> None:
    drafts = torch.tensor([[1, 2, 3, 4]])
    target = torch.tensor([[1, 2, 3, 4, 5]])
    for length in range(5):
        res = greedy_verify(drafts, target, torch.tensor([length]))
        assert res.accept_lens.item() == length
        assert res.tokens[0, : length + 1].tolist() == [1, 2, 3, 4, 5][: length + 1]
        assert (res.tokens[0, length + 1 :] == PAD_TOKEN).all()


def test_verify_lens_out_of_range_is_a_clear_error() -> None:
    drafts = torch.zeros(2, 3, dtype=torch.int64)
    target = torch.zeros(2, 4, dtype=torch.int64)
    with pytest.raises(ValueError, match=r"verify_lens must lie in 0\.\.B=3"):
        greedy_verify(drafts, target, torch.tensor([0, 4]))
    with pytest.raises(ValueError, match=r"verify_lens must lie in 0\.\.B=3"):
        greedy_verify(drafts, target, torch.tensor([-1, 0]))
    with pytest.raises(ValueError, match="target_argmax must be"):
        greedy_verify(drafts, target[:, :3], torch.tensor([0, 0]))
    with pytest.raises(ValueError, match="target_probs must be"):
        chain_verify(drafts, torch.ones(2, 3, 5) / 5, torch.ones(2, 3, 5) / 5, torch.tensor([0, 0]))


def test_verify_result_rejects_inconsistent_shapes() -> None:
    with pytest.raises(ValueError, match="must agree"):
        VerifyResult(
            accept_lens=torch.zeros(2, dtype=torch.int64),
            tokens=torch.zeros(3, 4, dtype=torch.int64),
            num_emitted=torch.ones(2, dtype=torch.int64),
        )


# --------------------------------------------------------------------------- chain, exact cases


def test_chain_identical_distributions_accept_everything_then_bonus() -> None:
    """p_t == p_d: u * p < p always holds, so every verified draft is kept."""
    gen = torch.Generator().manual_seed(0)
    n, b, v = 64, 4, 7
    probs = torch.softmax(torch.randn(n, b + 1, v, generator=gen), -1)
    drafts = torch.multinomial(probs[:, :b].reshape(-1, v), 1, generator=gen).reshape(n, b)
    lens = torch.randint(0, b + 1, (n,), generator=gen)
    res = chain_verify(drafts, probs[:, :b], probs, lens, gen)
    assert torch.equal(res.accept_lens, lens)
    assert torch.equal(res.num_emitted, lens + 1)
    cols = torch.arange(b + 1)
    kept = cols < lens.unsqueeze(1)
    assert torch.equal(res.tokens[:, :b][kept[:, :b]], drafts[kept[:, :b]])
    assert (res.tokens[cols > lens.unsqueeze(1)] == PAD_TOKEN).all()
    assert (res.tokens.gather(1, lens.unsqueeze(1)) >= 0).all()


def test_chain_length_zero_and_full_use_the_right_target_row() -> None:
    """l=0 draws from target row 0, l=B all-accepted draws the bonus from row B."""
    v = 5
    drafts = torch.tensor([[1, 2], [1, 2]])
    draft_probs = one_hot([[1, 2], [1, 2]], v)
    # Row 0 of the target puts all mass on 3, rows 1/2 on the drafts, row 2 (bonus) on 4.
    target = one_hot([[3, 2, 4], [1, 2, 4]], v)
    res = chain_verify(drafts, draft_probs, target, torch.tensor([0, 2]))
    assert res.accept_lens.tolist() == [0, 2]
    assert res.tokens.tolist() == [[3, PAD_TOKEN, PAD_TOKEN], [1, 2, 4]]


def test_chain_certain_rejection_samples_the_residual() -> None:
    """p_t(x) = 0 rejects x; the correction comes from norm(max(0, p_t - p_d))."""
    gen = torch.Generator().manual_seed(1)
    n = 4000
    drafts = torch.zeros(n, 2, dtype=torch.int64)
    p_d = torch.tensor([0.6, 0.4, 0.0]).expand(n, 2, 3)
    row0 = torch.tensor([0.0, 0.7, 0.3])  # residual = (0, 0.3, 0.3) -> uniform over {1, 2}
    p_t = torch.stack([row0, row0, row0]).expand(n, 3, 3)
    res = chain_verify(drafts, p_d, p_t, torch.full((n,), 2), gen)
    assert (res.accept_lens == 0).all()
    first = res.tokens[:, 0]
    assert set(first.unique().tolist()) == {1, 2}
    counts = torch.bincount(first, minlength=3)[1:].double()
    assert chisquare(counts.numpy(), [n / 2, n / 2]).pvalue > 1e-3


def test_chain_zero_draft_probability_is_handled() -> None:
    """p_d(x) = 0 (token not proposable) is accepted iff p_t(x) > 0, never divides by 0."""
    drafts = torch.tensor([[0], [0]])
    p_d = torch.tensor([[[0.0, 1.0]], [[0.0, 1.0]]])
    p_t = torch.tensor([[[0.5, 0.5], [1.0, 0.0]], [[0.0, 1.0], [1.0, 0.0]]])
    res = chain_verify(drafts, p_d, p_t, torch.tensor([1, 1]), torch.Generator().manual_seed(0))
    assert res.accept_lens.tolist() == [1, 0]
    assert res.tokens.tolist() == [[0, 0], [1, PAD_TOKEN]]


def test_chain_degenerate_residual_falls_back_to_target() -> None:
    """A rejection with no residual mass (only reachable through rounding) draws from p_t."""
    n = 2000
    drafts = torch.ones(n, 1, dtype=torch.int64)
    p_d = torch.tensor([0.5, 0.5]).expand(n, 1, 2)
    # Under-normalised target row (like rounding): p_t <= p_d everywhere, p_t(1) < p_d(1).
    p_t = torch.tensor([[0.5, 0.0], [0.3, 0.7]]).expand(n, 2, 2)
    res = chain_verify(drafts, p_d, p_t, torch.ones(n, dtype=torch.int64), torch.Generator())
    assert (res.accept_lens == 0).all()
    assert (res.tokens[:, 0] == 0).all()  # p_t row 0 only supports token 0


def test_chain_is_reproducible_with_a_seeded_generator() -> None:
    gen_a, gen_b = torch.Generator().manual_seed(7), torch.Generator().manual_seed(7)
    n, b, v = 32, 3, 6
    g = torch.Generator().manual_seed(3)
    p_d = torch.softmax(torch.randn(n, b, v, generator=g), -1)
    p_t = torch.softmax(torch.randn(n, b + 1, v, generator=g), -1)
    drafts = torch.multinomial(p_d.reshape(-1, v), 1, generator=g).reshape(n, b)
    lens = torch.randint(0, b + 1, (n,), generator=g)
    a = chain_verify(drafts, p_d, p_t, lens, gen_a)
    c = chain_verify(drafts, p_d, p_t, lens, gen_b)
    assert torch.equal(a.tokens, c.tokens)
    assert (a.accept_lens <= lens).all()


def test_chain_given_uniforms_equal_the_generator_draws() -> None:
    """``uniforms=u`` is the run whose generator drew ``u``: same accepts, same final token."""
    n, b, v = 64, 4, 5
    g = torch.Generator().manual_seed(11)
    logits = torch.randn(n, b + 1, v, generator=g)
    p_t = torch.softmax(logits, -1)
    p_d = torch.softmax(logits[:, :b] + 0.7 * torch.randn(n, b, v, generator=g), -1)
    drafts = torch.multinomial(p_d.reshape(-1, v), 1, generator=g).reshape(n, b)
    lens = torch.randint(0, b + 1, (n,), generator=g)
    drawn = chain_verify(drafts, p_d, p_t, lens, torch.Generator().manual_seed(5))
    gen = torch.Generator().manual_seed(5)
    u = torch.rand((n, b), generator=gen)
    given = chain_verify(drafts, p_d, p_t, lens, gen, uniforms=u)
    assert torch.equal(given.accept_lens, drawn.accept_lens)
    assert torch.equal(given.tokens, drawn.tokens)
    assert 0 < int(drawn.accept_lens.sum()) < int(lens.sum())  # accepts and rejects both
    # Uniforms decide acceptance: all-zero accepts every draft with p_t > 0.
    zeros = chain_verify(drafts, p_d, p_t, lens, uniforms=torch.zeros(n, b))
    assert torch.equal(zeros.accept_lens, lens)
    with pytest.raises(ValueError, match=r"uniforms must be a floating \[N, B\]"):
        chain_verify(drafts, p_d, p_t, lens, uniforms=torch.zeros(n, b + 1))
    with pytest.raises(ValueError, match=r"uniforms must lie in \[0, 1\)"):
        chain_verify(drafts, p_d, p_t, lens, uniforms=torch.ones(n, b))


# --------------------------------------------------------------------------- chain, statistics


def test_chain_output_matches_target_for_every_fixed_length() -> None:
    """Context-free toy target: whatever l, the first two emitted tokens ~ p_t0 x p_t1.

    200k requests with l drawn uniformly from 0..B (independent of the drafts);
    chi-square of the 2-token joint against the exact product, p > 0.001 (seeded).
    """
    gen = torch.Generator().manual_seed(2024)
    n, b, v = 200_000, 3, 4
    p_t_rows = torch.tensor(
        [[0.4, 0.3, 0.2, 0.1], [0.1, 0.2, 0.3, 0.4], [0.25, 0.25, 0.25, 0.25], [0.7, 0.1, 0.1, 0.1]]
    )
    p_d_rows = torch.tensor([[0.1, 0.1, 0.4, 0.4], [0.4, 0.4, 0.2, 0.0], [0.6, 0.2, 0.1, 0.1]])
    p_d = p_d_rows.expand(n, b, v)
    p_t = p_t_rows.expand(n, b + 1, v)
    drafts = torch.multinomial(p_d_rows, n, replacement=True, generator=gen).t()
    lens = torch.randint(0, b + 1, (n,), generator=gen)
    res = chain_verify(drafts, p_d, p_t, lens, gen)
    y1 = res.tokens[:, 0]
    y2 = torch.where(
        res.num_emitted >= 2,
        res.tokens[:, 1],
        torch.multinomial(p_t_rows[1], n, replacement=True, generator=gen),
    )
    observed = torch.bincount(y1 * v + y2, minlength=v * v).double().numpy()
    exact = torch.outer(p_t_rows[0].double(), p_t_rows[1].double()).reshape(-1)
    expected = (exact / exact.sum() * n).numpy()
    assert chisquare(observed, expected).pvalue > 1e-3
    # Speculation actually happened: a third of the verified drafts were accepted or more.
    assert res.accept_lens.sum().item() > 0.3 * lens.sum().item()
