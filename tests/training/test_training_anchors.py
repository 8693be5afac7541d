"""Anchor sampling, validity masks, packing, and batch gathering."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from dspark_sglang.training.anchors import (
    AnchorConfig,
    anchor_candidates,
    block_validity,
    pack_batches,
    sample_anchors,
)
from dspark_sglang.training.dataset import CachedSequence, HiddenCache, make_batch


def test_anchors_are_distinct_sorted_and_inside_the_response() -> None:
    g = torch.Generator().manual_seed(0)
    for seq_len, start in [(50, 10), (12, 11), (200, 1), (30, 0)]:
        a = sample_anchors(seq_len, start, 16, g)
        assert torch.equal(a, a.sort().values)
        assert len(set(a.tolist())) == a.numel()
        assert a.numel() == min(16, seq_len - 1 - max(1, start))
        if a.numel():
            assert int(a.min()) >= max(1, start) and int(a.max()) <= seq_len - 2


def test_anchor_sampling_is_deterministic_and_uniform() -> None:
    a1 = sample_anchors(100, 20, 8, torch.Generator().manual_seed(3))
    a2 = sample_anchors(100, 20, 8, torch.Generator().manual_seed(3))
    assert torch.equal(a1, a2)
    # Uniform without replacement: each of the 79 candidates is picked with
    # probability 8/79. Over 2000 draws the count of position 20 is Binomial
    # (2000, 0.1013): mean 202.5, sd 13.5; accept +-5 sd.
    g = torch.Generator().manual_seed(1)
    hits = sum(int((sample_anchors(100, 20, 8, g) == 20).any()) for _ in range(2000))
    assert abs(hits - 2000 * 8 / 79) < 5 * 13.5


def test_short_response_has_no_anchor() -> None:
    assert anchor_candidates(10, 9).numel() == 0  # only one response token: nothing to predict
    assert anchor_candidates(10, 8).tolist() == [8]


def test_validity_stops_at_sequence_end() -> None:
    v = block_validity(torch.tensor([[5, 8]]), torch.tensor([10]), 4)
    assert v.tolist() == [[[True, True, True, True], [True, False, False, False]]]


def test_packing_respects_budgets_and_keeps_every_sequence() -> None:
    cfg = AnchorConfig(
        anchors_per_seq=8, block_size=7, max_anchors_per_batch=20, max_tokens_per_batch=300
    )
    lens = [50, 100, 150, 20, 80, 400, 60]
    counts = [8, 8, 5, 0, 8, 8, 3]
    batches = pack_batches(lens, counts, cfg, order=[6, 5, 4, 3, 2, 1, 0])
    flat = [i for b in batches for i in b]
    assert sorted(flat) == [0, 1, 2, 4, 5, 6]  # index 3 has no anchors
    for b in batches:
        assert sum(counts[i] for i in b) <= 20
        assert len(b) == 1 or len(b) * max(lens[i] for i in b) <= 300
    assert [5] in batches  # longer than the token budget: trains alone


def test_bad_anchor_config_is_refused() -> None:
    with pytest.raises(ValueError, match="max_anchors_per_batch"):
        AnchorConfig(anchors_per_seq=64, max_anchors_per_batch=32)


def _seq(n: int, start: int, h: int = 3, nh: int = 6, offset: int = 0) -> CachedSequence:
    aux = torch.arange(n * nh, dtype=torch.bfloat16).reshape(n, nh)
    last = torch.arange(n * h, dtype=torch.bfloat16).reshape(n, h) + offset
    return CachedSequence(torch.arange(100, 100 + n) + offset, aux, last, start)


def test_make_batch_gathers_labels_prev_tokens_and_target_states() -> None:
    s1, s2 = _seq(12, 4), _seq(9, 2, offset=50)
    batch = make_batch([s1, s2], [torch.tensor([4, 9, 10]), torch.tensor([3])], block_size=3)
    assert batch.anchors.tolist() == [[4, 9, 10], [3, 3, 3]]
    assert batch.anchor_mask.tolist() == [[True, True, True], [True, False, False]]
    assert batch.anchor_tokens.tolist() == [[104, 109, 110], [153, 153, 153]]
    # slot k predicts x_{p+k+1}; teacher-forced prev for slot k is x_{p+k}
    assert batch.labels[0, 0].tolist() == [105, 106, 107]
    assert batch.prev_tokens[0, 0].tolist() == [104, 105, 106]
    assert batch.valid[0].tolist() == [[True] * 3, [True, True, False], [True, False, False]]
    assert batch.valid[1].tolist() == [[True] * 3, [False] * 3, [False] * 3]
    # target distribution of slot k comes from the last hidden state at p+k
    assert torch.equal(batch.target_last[0, 1, 1], s1.last[10].float())
    assert torch.equal(batch.target_last[1, 0, 2], s2.last[5].float())
    assert batch.context_hidden.shape == (2, 12, 6)
    assert float(batch.context_hidden[1, 9:].abs().sum()) == 0.0  # right padding
    assert batch.num_anchors == 4


def test_hidden_cache_reads_back_every_sequence(tiny_data_dir: Path) -> None:
    cache = HiddenCache(tiny_data_dir)
    assert len(cache) == 16
    for i in range(len(cache)):
        s = cache[i]
        assert len(s.tokens) == cache.seq_lens[i] == s.aux.shape[0] == s.last.shape[0]
        assert 4 <= s.response_start < len(s.tokens)
