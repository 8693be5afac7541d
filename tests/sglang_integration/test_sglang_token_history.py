"""The worker's device-side token history: prefill writes, round appends, bounded views."""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest
import torch

from dspark_sglang.sglang_integration.token_history import WINDOW, TokenHistory


def _row(h: TokenHistory, r: int) -> list[int]:
    """What a copy reads of row ``r``: its last ``window`` tokens, in order."""
    history, lengths = h.view(torch.tensor([r]), bound=10**6)
    return history[0, : int(lengths[0])].tolist()


def test_prefill_then_rounds_keep_each_slot_equal_to_its_requests_text() -> None:
    """Random prompts, prefix hits, slot reuse and rounds against plain lists, through a
    ring shorter than the texts."""
    rng = random.Random(0)
    h = TokenHistory(rows=6, window=16, device="cpu")
    texts: dict[int, list[int]] = {}
    for _ in range(40):
        free = [r for r in range(6) if r not in texts]
        if free and rng.random() < 0.4:  # a new request (or a reused slot) is prefilled
            slot = rng.choice(free)
            prompt = [rng.randrange(50) for _ in range(rng.randrange(1, 12))]
            prefix = rng.randrange(len(prompt))  # a radix-cache hit
            req = SimpleNamespace(origin_input_ids=prompt, output_ids=[])
            batch = SimpleNamespace(
                reqs=[req],
                prefix_lens=[prefix],
                extend_lens=[len(prompt) - prefix],
                req_pool_indices=torch.tensor([slot]),
            )
            h.write_extend(batch)
            bonus = rng.randrange(50)
            h.append(torch.tensor([slot]), torch.tensor([bonus]), torch.ones(1, dtype=torch.int64))
            texts[slot] = [*prompt, bonus]
        elif texts:  # a decode round over every running request
            slots = sorted(texts)
            out = torch.randint(0, 50, (len(slots), 5))
            counts = torch.randint(1, 6, (len(slots),))
            h.append(torch.tensor(slots), out, counts)
            for i, s in enumerate(slots):
                texts[s] += out[i, : int(counts[i])].tolist()
            if rng.random() < 0.2:
                del texts[rng.choice(slots)]  # finished: its slot may be reused
        for s, text in texts.items():
            assert _row(h, s) == text[-16:] and int(h.lengths[s]) == len(text)


def test_a_prompt_longer_than_the_window_keeps_its_last_tokens_and_other_rows_are_untouched() -> (
    None
):
    h = TokenHistory(rows=2, window=4, device="cpu")
    h.write_texts(torch.tensor([1]), [[1, 2, 3, 4, 5, 6]])
    assert _row(h, 1) == [3, 4, 5, 6]
    h.append(torch.tensor([1]), torch.tensor([[7, 8, 9]]), torch.tensor([2]))
    assert _row(h, 1) == [5, 6, 7, 8] and int(h.lengths[1]) == 8
    assert h.tokens[0].tolist() == [0] * 5


def test_view_is_bounded_by_the_host_length_bound() -> None:
    h = TokenHistory(rows=3, window=32, device="cpu")
    h.write_texts(torch.tensor([2, 0]), [[5, 6, 7], [1, 2, 3, 4, 5, 6]])
    history, lengths = h.view(torch.tensor([0, 2]), bound=8)
    assert history.shape == (2, 8) and lengths.tolist() == [6, 3]
    assert history[0, :6].tolist() == [1, 2, 3, 4, 5, 6] and history[1, :3].tolist() == [5, 6, 7]
    short, n = h.view(torch.tensor([0]), bound=4)  # the last 4: the key a copy needs
    assert n.tolist() == [4] and short[0].tolist() == [3, 4, 5, 6]


def test_a_history_needs_rows_and_width() -> None:
    with pytest.raises(ValueError, match="rows >= 1 and window >= 1"):
        TokenHistory(rows=0, window=8, device="cpu")


def test_the_window_is_capped_at_the_pools_context_length() -> None:
    assert TokenHistory.like_pool(torch.zeros((3, 100), dtype=torch.int32)).window == 100
    assert TokenHistory.like_pool(torch.zeros((3, 10**5), dtype=torch.int32)).window == WINDOW
