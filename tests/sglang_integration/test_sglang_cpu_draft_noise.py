"""Sampled draft steps on CPU draw their Gumbel noise's words from torch's generator.

The law that matters: SGLang's own CPU draft step (``MarkovSampleStep.torch``) with our
words in place of its Philox must still sample softmax(logits / T) per row. A chi-square
over 20 000 rows at two temperatures (fixed seed, p > 1e-3) holds it; words from half
the range (uniforms in [0, 1/2)) fail it. The rest: shapes, range, the fallback to
SGLang's Philox, and that a key repeats its draws from a fresh generator.
"""

from __future__ import annotations

import functools

import pytest
import torch
from scipy.stats import chisquare

from dspark_sglang.sglang_integration import cpu_draft_noise

markov_sample = pytest.importorskip("sglang.kernels.ops.speculative.dspark.markov_sample")

LOGITS = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0, -2.0, 0.3, 1.5])
ROWS = 20_000


def _counters(rows: int, quads: int) -> tuple[torch.Tensor, ...]:
    return (
        torch.arange(quads, dtype=torch.int64)[None, :],
        torch.arange(rows, dtype=torch.int64)[:, None],
        torch.full((1, 1), 3, dtype=torch.int64),
        torch.zeros((1, 1), dtype=torch.int64),
    )


def _fresh(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cpu_draft_noise, "_generators", {})


def _never(*_: object) -> None:
    raise AssertionError("SGLang's Philox should not run for CPU tensors")


def test_words_have_the_counters_shape_and_32_bit_range(monkeypatch: pytest.MonkeyPatch) -> None:
    _fresh(monkeypatch)
    words = cpu_draft_noise.cpu_random_words(_never, 7, *_counters(5, 3))
    assert len(words) == 4
    for w in words:
        assert w.shape == (5, 3) and w.dtype == torch.int64
    stacked = torch.stack(words)
    assert int(stacked.min()) >= 0 and int(stacked.max()) < 2**32
    # Not one word repeated across rows or words.
    assert torch.unique(stacked).numel() == stacked.numel()


def test_a_key_repeats_its_draws_from_a_fresh_generator(monkeypatch: pytest.MonkeyPatch) -> None:
    _fresh(monkeypatch)
    first = [cpu_draft_noise.cpu_random_words(_never, 11, *_counters(4, 2)) for _ in range(2)]
    _fresh(monkeypatch)
    again = [cpu_draft_noise.cpu_random_words(_never, 11, *_counters(4, 2)) for _ in range(2)]
    other = cpu_draft_noise.cpu_random_words(_never, 12, *_counters(4, 2))
    for a, b in zip(first, again, strict=True):
        assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
    assert not torch.equal(first[0][0], first[1][0]), "successive blocks must differ"
    assert not torch.equal(first[0][0], other[0]), "another key must draw other words"


def test_other_calls_go_to_sglangs_philox() -> None:
    seen: list[tuple[object, ...]] = []

    def original(*args: object) -> str:
        seen.append(args)
        return "philox"

    assert cpu_draft_noise.cpu_random_words(original, 1, 2, 3, 4, 5) == "philox"
    assert seen == [(1, 2, 3, 4, 5)]


def _sample_counts(temperature: float) -> torch.Tensor:
    v = LOGITS.numel()
    tokens = markov_sample.MarkovSampleStep.torch(
        base_logits=LOGITS.expand(ROWS, v).contiguous(),
        bias=torch.zeros(ROWS, v),
        temperatures=torch.full((ROWS,), temperature, dtype=torch.float32),
        key=20261204,
        offset=torch.zeros(1, dtype=torch.int64),
        step=0,
        step_dtype=torch.float32,
    )
    return torch.bincount(tokens, minlength=v)


def _p_value(counts: torch.Tensor, temperature: float) -> float:
    expected = torch.softmax(LOGITS.double() / temperature, 0) * counts.sum()
    return float(chisquare(counts.double().numpy(), expected.numpy()).pvalue)


@pytest.mark.parametrize("temperature", [1.0, 0.5])
def test_sglangs_cpu_draft_step_still_samples_the_softmax(
    temperature: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    _fresh(monkeypatch)
    hooked = functools.partial(cpu_draft_noise.cpu_random_words, _never)
    monkeypatch.setattr(markov_sample, "_philox", hooked)
    counts = _sample_counts(temperature)
    assert counts.sum() == ROWS
    assert _p_value(counts, temperature) > 1e-3


def test_the_chi_square_rejects_words_of_the_wrong_law(monkeypatch: pytest.MonkeyPatch) -> None:
    _fresh(monkeypatch)

    def half_range(*args: torch.Tensor) -> tuple[torch.Tensor, ...]:
        words = cpu_draft_noise.cpu_random_words(_never, *args)
        return tuple(w // 2 for w in words)

    monkeypatch.setattr(markov_sample, "_philox", half_range)
    assert _p_value(_sample_counts(1.0), 1.0) < 1e-6
