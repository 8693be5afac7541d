"""Sequential block sampling and teacher-forced Markov logits."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from dspark_sglang.model.block_sampler import markov_logits, sample_block
from dspark_sglang.model.drafter import DraftBlock, DSparkDrafter
from dspark_sglang.sampling import logits_to_probs

HEADS = ["vanilla", "gated", "rnn"]


def _block(drafter: DSparkDrafter, n: int = 4, seed: int = 0) -> tuple[DraftBlock, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    c = 16
    anchors = torch.randint(0, 512, (n,), generator=g)
    with torch.no_grad():
        block = drafter.forward_block(
            torch.randn(n, c, 3 * 64, generator=g),
            torch.arange(c).expand(n, c),
            torch.ones(n, c, dtype=torch.bool),
            anchors,
            torch.full((n,), c),
        )
    return block, anchors


def _prev(anchors: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    return torch.cat([anchors[:, None], tokens[:, :-1]], dim=1)


@pytest.mark.parametrize("head", HEADS)
def test_greedy_picks_argmax_of_base_plus_bias_of_previous_pick(
    make_drafter: Callable[..., DSparkDrafter], head: str
) -> None:
    drafter = make_drafter(markov_head_type=head)
    block, anchors = _block(drafter)
    out = sample_block(drafter, block, anchors, temperature=0.0)
    # Recompute the chain by hand with the head's step API.
    mh = drafter.markov_head
    assert mh is not None
    state, prev = mh.init_state(block.hidden[:, 0]), anchors
    with torch.no_grad():
        for k in range(drafter.block_size):
            bias, state = mh.step(prev, block.hidden[:, k], state)
            expected = (block.base_logits[:, k] + bias).argmax(-1)
            assert torch.equal(out.tokens[:, k], expected)
            prev = expected
    assert torch.equal(out.probs.argmax(-1), out.tokens)
    assert torch.equal(out.probs.max(-1).values, torch.ones(4, drafter.block_size))
    # The Markov bias is not negligible here: it changes some greedy choices.
    assert not torch.equal(out.tokens, block.base_logits.argmax(-1))


@pytest.mark.parametrize("head", HEADS)
def test_probs_are_the_distributions_sampled_from_with_sampled_prev_chain(
    make_drafter: Callable[..., DSparkDrafter], head: str
) -> None:
    drafter = make_drafter(markov_head_type=head)
    block, anchors = _block(drafter, seed=1)
    g = torch.Generator().manual_seed(5)
    temps = torch.tensor([1.0, 0.7, 0.0, 1.3])
    top_k = torch.tensor([-1, 20, -1, 50])
    out = sample_block(drafter, block, anchors, temps, top_k, 0.95, generator=g)
    torch.testing.assert_close(out.probs.sum(-1), torch.ones(4, drafter.block_size))
    picked = out.probs.gather(-1, out.tokens[..., None]).squeeze(-1)
    assert bool((picked > 0).all())
    assert int((out.probs[1] > 0).sum(-1).max()) <= 20  # top-k 20 respected
    # Teacher forcing on the sampled tokens reproduces every row exactly:
    # slot k was drawn from base_k + bias(prev_k) with prev = the *sampled* chain.
    with torch.no_grad():
        tf = markov_logits(drafter, block, _prev(anchors, out.tokens))
    n, b = out.tokens.shape
    expected = logits_to_probs(
        tf.logits,
        temps.repeat_interleave(b),
        top_k.repeat_interleave(b),
        0.95,
    ).reshape(n, b, -1)
    torch.testing.assert_close(out.probs, expected, rtol=1e-5, atol=1e-6)
    assert out.confidence_logits is not None and tf.confidence_logits is not None
    torch.testing.assert_close(out.confidence_logits, tf.confidence_logits)


def test_sampling_frequencies_match_probs_including_the_chain(
    make_drafter: Callable[..., DSparkDrafter],
) -> None:
    """Statistical check, fixed seed: 6000 identical requests, block 2.

    Slot 0's empirical frequencies match probs[:, 0]; among requests whose slot 0
    drew the most frequent token, slot 1's frequencies match *their* probs[:, 1]
    (which the Markov bias makes depend on the slot-0 draw). Tolerance: 5 binomial
    standard deviations per token (+1 count), for the 5 most likely tokens.
    """
    drafter = make_drafter(block_size=2)
    block, anchors = _block(drafter, n=1, seed=2)
    n = 6000
    many = DraftBlock(
        hidden=block.hidden.expand(n, -1, -1),
        base_logits=block.base_logits.expand(n, -1, -1) * 3.0,  # peakier: fewer rare tokens
        aux_loss=block.aux_loss,
    )
    out = sample_block(drafter, many, anchors.expand(n), generator=torch.Generator().manual_seed(0))

    def check(tokens: torch.Tensor, p: torch.Tensor) -> None:
        counts = torch.bincount(tokens, minlength=p.numel()).double()
        m = tokens.numel()
        for tok in p.topk(5).indices.tolist():
            mean = m * float(p[tok])
            sd = (m * float(p[tok]) * (1 - float(p[tok]))) ** 0.5
            assert abs(float(counts[tok]) - mean) <= 5 * sd + 1, (tok, counts[tok], mean)

    check(out.tokens[:, 0], out.probs[0, 0])
    first = int(torch.bincount(out.tokens[:, 0]).argmax())
    rows = out.tokens[:, 0] == first
    assert int(rows.sum()) > 200
    p1 = out.probs[rows, 1][0]
    torch.testing.assert_close(out.probs[rows, 1], p1.expand(int(rows.sum()), -1))
    check(out.tokens[rows, 1], p1)
    other = out.tokens[:, 0] != first
    assert not torch.allclose(out.probs[other, 1][0], p1, atol=1e-4)


def test_vanilla_and_gated_teacher_forcing_is_one_vectorised_pass(
    make_drafter: Callable[..., DSparkDrafter],
) -> None:
    """markov_logits accepts [S, A, B] leading dims (training) and equals per-row calls."""
    drafter = make_drafter(markov_head_type="gated")
    block, _ = _block(drafter, n=4, seed=3)
    prev = torch.randint(
        0, 512, (4, drafter.block_size), generator=torch.Generator().manual_seed(1)
    )
    with torch.no_grad():
        flat = markov_logits(drafter, block, prev)
        grouped = markov_logits(
            drafter,
            DraftBlock(
                hidden=block.hidden.reshape(2, 2, *block.hidden.shape[1:]),
                base_logits=block.base_logits.reshape(2, 2, *block.base_logits.shape[1:]),
                aux_loss=block.aux_loss,
            ),
            prev.reshape(2, 2, -1),
        )
    torch.testing.assert_close(grouped.logits.reshape(flat.logits.shape), flat.logits)
    assert grouped.confidence_logits is not None and flat.confidence_logits is not None
    torch.testing.assert_close(
        grouped.confidence_logits.reshape(flat.confidence_logits.shape), flat.confidence_logits
    )


def test_dflash_style_drafter_samples_from_base_logits(
    make_drafter: Callable[..., DSparkDrafter],
) -> None:
    drafter = make_drafter(markov_head_type="none", confidence_head_with_markov=False)
    assert drafter.markov_head is None
    block, anchors = _block(drafter, seed=4)
    out = sample_block(drafter, block, anchors, temperature=0.0)
    assert torch.equal(out.tokens, block.base_logits.argmax(-1))
    tf = markov_logits(drafter, block, _prev(anchors, out.tokens))
    assert torch.equal(tf.logits, block.base_logits)
    assert out.confidence_logits is not None and out.confidence_logits.shape == (4, 7)
    no_conf = make_drafter(enable_confidence_head=False)
    block2, anchors2 = _block(no_conf)
    assert sample_block(no_conf, block2, anchors2).confidence_logits is None
