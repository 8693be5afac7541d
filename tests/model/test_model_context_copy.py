"""Context copies: the vectorised ``copy_drafts`` against a direct list implementation."""

from __future__ import annotations

import pytest
import torch

from dspark_sglang.model.context_copy import copy_drafts, one_hot_rows


def _direct(history: list[int], drafts: list[int], n: int) -> tuple[list[int], list[bool]]:
    """The module docstring's rule, one slot at a time, on Python lists."""
    seq, out, copied = list(history), [], []
    for y in drafts:
        key = seq[len(seq) - n :]
        hit = None
        if len(seq) > n:
            for j in range(len(seq) - n - 1, -1, -1):  # latest start first
                if seq[j : j + n] == key:
                    hit = seq[j + n]
                    break
        tok = y if hit is None else hit
        out.append(tok)
        copied.append(hit is not None)
        seq.append(tok)
    return out, copied


@pytest.mark.parametrize("ngram", [1, 2, 3])
def test_matches_the_direct_rule_on_ragged_rows(ngram: int) -> None:
    g = torch.Generator().manual_seed(ngram)
    n_req, width, b = 6, 40, 7
    lengths = torch.tensor([1, 2, 5, 17, 33, 40])
    # A small vocabulary so that n-grams repeat; padding past each row's length is
    # garbage that must never be matched or copied.
    history = torch.randint(0, 4, (n_req, width), generator=g)
    history[torch.arange(width) >= lengths.unsqueeze(1)] = 99
    drafts = torch.randint(2, 8, (n_req, b), generator=g)
    got = copy_drafts(history, lengths, drafts, ngram)
    assert got.tokens.dtype == drafts.dtype and got.tokens.shape == (n_req, b)
    for i in range(n_req):
        want, want_copied = _direct(history[i, : lengths[i]].tolist(), drafts[i].tolist(), ngram)
        assert got.tokens[i].tolist() == want, i
        assert got.copied[i].tolist() == want_copied, i
    assert 0 < int(got.copied.sum()) < got.copied.numel()  # both kinds of slot occur
    assert 99 not in got.tokens.tolist()


def test_copies_continue_a_repeat_through_the_drafts() -> None:
    # "a b c d a b" -> the next tokens of the repeat are c d a b c d a
    history = torch.tensor([[1, 2, 3, 4, 1, 2]])
    got = copy_drafts(history, torch.tensor([6]), torch.full((1, 7), 50), 2)
    assert got.tokens.tolist() == [[3, 4, 1, 2, 3, 4, 1]]
    assert bool(got.copied.all())


def test_no_match_keeps_the_drafts_and_zero_is_off() -> None:
    history = torch.tensor([[1, 2, 3, 4]])
    drafts = torch.tensor([[7, 8, 9]])
    for n in (0, 2):
        got = copy_drafts(history, torch.tensor([4]), drafts, n)
        assert torch.equal(got.tokens, drafts) and not bool(got.copied.any())


def test_one_hot_rows_replace_only_copied_slots() -> None:
    probs = torch.full((1, 3, 4), 0.25)
    copies = copy_drafts(torch.tensor([[1, 2, 1]]), torch.tensor([3]), torch.tensor([[0, 0, 0]]), 1)
    assert copies.copied.tolist() == [[True, True, True]]  # 1->2, 2->1, 1->2
    rows = one_hot_rows(probs, copies)
    assert rows[0, 0].tolist() == [0.0, 0.0, 1.0, 0.0]
    assert rows[0, 1].tolist() == [0.0, 1.0, 0.0, 0.0]
    partial = copy_drafts(torch.tensor([[1, 2]]), torch.tensor([2]), torch.tensor([[3, 3]]), 1)
    assert partial.copied.tolist() == [[False, False]]
    assert torch.equal(one_hot_rows(probs[:, :2], partial), probs[:, :2])
