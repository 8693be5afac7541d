"""The single logits->distribution function drafter and verifier share."""

import pytest
import torch

from dspark_sglang.sampling import SamplingParams, logits_to_probs, sample


def test_temperature_one_is_softmax() -> None:
    logits = torch.randn(3, 11, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(logits_to_probs(logits), torch.softmax(logits, -1))


def test_greedy_is_one_hot_argmax_and_rows_mix() -> None:
    logits = torch.tensor([[0.1, 2.0, -1.0], [0.5, 0.2, 0.3]])
    probs = logits_to_probs(logits, temperature=torch.tensor([0.0, 1.0]))
    assert probs[0].tolist() == [0.0, 1.0, 0.0]
    torch.testing.assert_close(probs[1], torch.softmax(logits[1], -1))


def test_top_k_and_top_p_zero_exactly_the_removed_tokens() -> None:
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    top2 = logits_to_probs(logits, top_k=2)
    torch.testing.assert_close(top2, torch.tensor([[0.625, 0.375, 0.0, 0.0]]))
    # top_p=0.8: 0.5 + 0.3 reaches 0.8, so the smallest such prefix is two tokens.
    topp = logits_to_probs(logits, top_p=0.8)
    torch.testing.assert_close(topp, torch.tensor([[0.625, 0.375, 0.0, 0.0]]))
    # The first token always survives, however small top_p is.
    assert logits_to_probs(logits, top_p=0.01)[0, 0].item() == 1.0


def test_sample_frequencies_match_probs() -> None:
    probs = torch.tensor([0.1, 0.2, 0.7]).expand(200_000, 3)
    draws = sample(probs, torch.Generator().manual_seed(1))
    freq = torch.bincount(draws, minlength=3).float() / draws.numel()
    # 200k draws: standard error <= 0.0011, so 0.005 is > 4 sigma.
    torch.testing.assert_close(freq, torch.tensor([0.1, 0.2, 0.7]), atol=0.005, rtol=0)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [({"temperature": -1.0}, "temperature"), ({"top_p": 0.0}, "top_p"), ({"top_k": -2}, "top_k")],
)
def test_bad_sampling_params_name_the_field(kwargs: dict, field: str) -> None:
    with pytest.raises(ValueError, match=field):
        SamplingParams(**kwargs)
