"""The reduced draft vocabulary: token map, heads, sampling, losslessness, loss, checkpoints."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from scipy.stats import chisquare
from torch import nn

from dspark_sglang.model import DSparkDrafter, load_drafter, sample_block, save_drafter
from dspark_sglang.model.checkpoint import CheckpointError
from dspark_sglang.model.config import DSparkConfig, TargetSpec
from dspark_sglang.model.drafter import DraftBlock
from dspark_sglang.model.vocab import DRAFT_VOCAB_BUFFER, DraftVocab, reduced_l1, scatter_to_vocab
from dspark_sglang.training.losses import dspark_loss
from dspark_sglang.verify import chain_verify

K = 64


def reduced_drafter(make_drafter: Callable[..., DSparkDrafter], seed: int = 0) -> DSparkDrafter:
    drafter = make_drafter(seed=seed, draft_vocab_size=K)
    counts = torch.arange(512, dtype=torch.float64).flip(0)  # token 0 most frequent
    counts[300:364] = 1e6  # the 64 most frequent tokens: 300..363
    drafter.set_draft_vocab(DraftVocab.from_counts(counts, K))
    return drafter


# --------------------------------------------------------------------------- token map


def test_from_counts_takes_the_most_frequent_breaks_ties_by_id_and_keeps_forced_ids() -> None:
    counts = torch.tensor([5, 9, 9, 1, 0, 7, 9, 2])
    assert DraftVocab.from_counts(counts, 3).ids.tolist() == [1, 2, 6]
    # EOS (4) never occurs but is kept; it takes the least frequent place (6).
    assert DraftVocab.from_counts(counts, 3, always=[4]).ids.tolist() == [1, 2, 4]
    assert DraftVocab.from_counts(counts, 8).ids.tolist() == list(range(8))
    with pytest.raises(ValueError, match="raise draft_vocab_size"):
        DraftVocab.from_counts(counts, 1, always=[3, 4])
    with pytest.raises(ValueError, match=r"draft_vocab_size must be in \[1, 8\]"):
        DraftVocab.from_counts(counts, 9)


@pytest.mark.parametrize(
    ("ids", "match"),
    [
        (torch.tensor([3, 1, 2]), "strictly ascending"),
        (torch.tensor([1, 1, 2]), "strictly ascending"),
        (torch.tensor([0, 1, 8]), "outside the target vocabulary"),
        (torch.tensor([0.0, 1.0, 2.0]), "1-D int64"),
    ],
)
def test_a_bad_token_map_is_refused(ids: torch.Tensor, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        DraftVocab(ids, 8)


def test_config_bounds_and_old_configs_without_the_field(
    make_config: Callable[..., DSparkConfig],
) -> None:
    with pytest.raises(ValueError, match="draft_vocab_size"):
        make_config(draft_vocab_size=513)
    full = make_config()
    d = full.to_dict()
    assert "draft_vocab_size" not in d  # what older code wrote and reads
    assert DSparkConfig.from_dict(d) == full
    reduced = make_config(draft_vocab_size=K)
    assert DSparkConfig.from_hf_dict(reduced.to_hf_dict()) == reduced


# --------------------------------------------------------------------------- drafter


def test_reduced_logits_are_the_full_logits_on_the_map(make_drafter) -> None:
    drafter = reduced_drafter(make_drafter)
    full = make_drafter(seed=0)
    hidden = torch.randn(5, 7, 64)
    ids = drafter.draft_vocab.ids
    got = drafter.compute_base_logits(hidden)
    assert got.shape == (5, 7, K)
    torch.testing.assert_close(got, full.compute_base_logits(hidden)[..., ids])
    assert drafter.markov_head.markov_w2.out_features == K
    assert drafter.markov_head.markov_w1.num_embeddings == 512  # inputs are target ids


def test_sampled_drafts_are_target_ids_in_the_map_with_full_vocab_probs(make_drafter) -> None:
    drafter = reduced_drafter(make_drafter)
    n, ctx = 6, 10
    g = torch.Generator().manual_seed(0)
    block = drafter.forward_block(
        torch.randn(n, ctx, 3 * 64, generator=g),
        torch.arange(ctx).expand(n, ctx),
        torch.ones(n, ctx, dtype=torch.bool),
        torch.randint(0, 512, (n,), generator=g),
        torch.full((n,), ctx),
    )
    assert block.base_logits.shape[-1] == K
    prop = sample_block(drafter, block, torch.randint(0, 512, (n,), generator=g), generator=g)
    ids = set(drafter.draft_vocab.ids.tolist())
    assert set(prop.tokens.flatten().tolist()) <= ids
    assert prop.probs.shape == (n, drafter.block_size, 512)
    torch.testing.assert_close(prop.probs.sum(-1), torch.ones(n, drafter.block_size))
    outside = torch.ones(512, dtype=torch.bool)
    outside[drafter.draft_vocab.ids] = False
    assert prop.probs[..., outside].abs().max().item() == 0.0
    assert (prop.probs.gather(-1, prop.tokens.unsqueeze(-1)) > 0).all()


def _first_slot_probs(drafter: DSparkDrafter, seed: int = 0) -> torch.Tensor:
    """The drafted distribution ``[n, V]`` of slot 1 (it depends on the anchor only)."""
    n, ctx = 6, 10
    g = torch.Generator().manual_seed(seed)
    block = drafter.forward_block(
        torch.randn(n, ctx, 3 * 64, generator=g),
        torch.arange(ctx).expand(n, ctx),
        torch.ones(n, ctx, dtype=torch.bool),
        torch.randint(0, 512, (n,), generator=g),
        torch.full((n,), ctx),
    )
    anchor = torch.randint(0, 512, (n,), generator=g)
    return sample_block(drafter, block, anchor, generator=g).probs[:, 0]


def test_a_restricted_drafter_drafts_the_full_distribution_conditioned_on_the_map(
    make_drafter,
) -> None:
    full = make_drafter(seed=3)
    vocab = DraftVocab(torch.arange(100, 100 + K), 512)
    narrow = full.restricted_to(vocab)
    assert narrow.config.draft_vocab_size == K and full.config.draft_vocab_size is None
    assert narrow.markov_head.markov_w2.out_features == K
    want = _first_slot_probs(full)[:, vocab.ids]
    want = want / want.sum(-1, keepdim=True)
    got = _first_slot_probs(narrow)
    torch.testing.assert_close(got[:, vocab.ids], want)
    assert got.sum(-1).sub(1).abs().max() < 1e-5
    # Narrowing a reduced drafter composes: the same as narrowing the full one directly.
    sub = DraftVocab(vocab.ids[::2].clone(), 512)
    twice, once = narrow.restricted_to(sub).state_dict(), full.restricted_to(sub).state_dict()
    assert twice.keys() == once.keys()
    for name, t in once.items():
        torch.testing.assert_close(twice[name], t, rtol=0, atol=0, msg=name)
    with pytest.raises(ValueError, match="can only be narrowed"):
        narrow.restricted_to(DraftVocab(torch.arange(K), 512))
    with pytest.raises(ValueError, match="build the map for this target"):
        full.restricted_to(DraftVocab(torch.arange(K), 1024))


def test_chain_verification_with_a_reduced_drafter_emits_the_target_distribution(
    make_config: Callable[..., DSparkConfig],
) -> None:
    """Tokens outside the draft vocabulary carry target mass; the output is still p_t.

    A 6-token target, a drafter over 3 of them (Markov head on, so slot 2 depends on the
    token sampled at slot 1). 100k requests, verify lengths uniform in 0..B independent
    of the drafts; chi-square of the first two emitted tokens against p_t0 x p_t1,
    p > 0.001 (seeded), and tokens outside the draft vocabulary are emitted.
    """
    v, b, n, hidden = 6, 3, 100_000, 16
    spec = TargetSpec(
        name="six-token-target",
        vocab_size=v,
        hidden_size=hidden,
        num_layers=4,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=8,
        rope_theta=10000.0,
        rms_norm_eps=1e-6,
        max_position_embeddings=64,
    )
    torch.manual_seed(0)
    cfg = DSparkConfig.for_target(
        spec,
        mask_token_id=5,
        block_size=b,
        target_layer_ids=(1,),
        num_hidden_layers=1,
        num_experts=2,
        num_experts_per_tok=1,
        markov_rank=4,
        sliding_window=None,
        draft_vocab_size=3,
    )
    drafter = DSparkDrafter(cfg, nn.Embedding(v, hidden), nn.Linear(hidden, v, bias=False))
    drafter.reset_parameters(std=0.5)
    drafter.set_draft_vocab(DraftVocab(torch.tensor([0, 2, 5]), v))
    drafter.eval()
    g = torch.Generator().manual_seed(7)
    one = drafter.forward_block(
        torch.randn(1, 4, hidden, generator=g),
        torch.arange(4).view(1, 4),
        torch.ones(1, 4, dtype=torch.bool),
        torch.tensor([1]),
        torch.tensor([4]),
    )
    block = DraftBlock(
        hidden=one.hidden.expand(n, -1, -1),
        base_logits=one.base_logits.expand(n, -1, -1),
        aux_loss=one.aux_loss,
    )
    prop = sample_block(drafter, block, torch.full((n,), 1), generator=g)
    p_t_rows = torch.tensor(
        [
            [0.30, 0.20, 0.10, 0.15, 0.05, 0.20],
            [0.05, 0.30, 0.25, 0.10, 0.20, 0.10],
            [0.20, 0.20, 0.20, 0.20, 0.10, 0.10],
            [0.10, 0.10, 0.10, 0.10, 0.10, 0.50],
        ]
    )
    lens = torch.randint(0, b + 1, (n,), generator=g)
    res = chain_verify(prop.tokens, prop.probs, p_t_rows.expand(n, b + 1, v), lens, g)
    y1 = res.tokens[:, 0]
    y2 = torch.where(
        res.num_emitted >= 2,
        res.tokens[:, 1],
        torch.multinomial(p_t_rows[1], n, replacement=True, generator=g),
    )
    observed = torch.bincount(y1 * v + y2, minlength=v * v).double().numpy()
    exact = torch.outer(p_t_rows[0].double(), p_t_rows[1].double()).reshape(-1)
    assert chisquare(observed, (exact / exact.sum() * n).numpy()).pvalue > 1e-3
    assert res.accept_lens.sum().item() > 0.2 * lens.sum().item()  # drafts were accepted
    assert ((y1 == 1) | (y1 == 3) | (y1 == 4)).any()  # and tokens outside S emitted


# --------------------------------------------------------------------------- loss


def test_reduced_l1_is_the_full_l1_of_the_scattered_draft() -> None:
    g = torch.Generator().manual_seed(1)
    ids = torch.tensor([1, 4, 6, 9])
    p_d = torch.softmax(torch.randn(3, 5, 4, generator=g), -1)
    p_t = torch.softmax(torch.randn(3, 5, 12, generator=g), -1)
    full = (scatter_to_vocab(p_d, ids, 12, 0.0) - p_t).abs().sum(-1)
    torch.testing.assert_close(reduced_l1(p_d, p_t, ids), full)


def test_loss_with_a_token_map_matches_the_scattered_full_loss_except_ce_outside() -> None:
    """L1 and BCE equal the full-vocabulary loss of the scattered draft (draft logits
    -inf outside S); CE is the same at labels in S and 0 at labels outside."""
    g = torch.Generator().manual_seed(2)
    ids = torch.tensor([0, 3, 5, 7, 8])
    v = 10
    draft = torch.randn(4, 3, 5, generator=g, requires_grad=True)
    target = torch.randn(4, 3, v, generator=g)
    conf = torch.randn(4, 3, generator=g)
    labels_in = ids[torch.randint(0, 5, (4, 3), generator=g)]
    valid = torch.ones(4, 3, dtype=torch.bool)
    reduced = dspark_loss(draft, target, labels_in, valid, conf, draft_vocab_ids=ids)
    scattered = scatter_to_vocab(draft, ids, v, float("-inf"))
    full = dspark_loss(scattered, target, labels_in, valid, conf)
    for name in ("ce", "l1", "bce", "total"):
        torch.testing.assert_close(getattr(reduced, name), getattr(full, name))
    labels_out = torch.full((4, 3), 2)  # not in S
    only_out = dspark_loss(draft, target, labels_out, valid, conf, draft_vocab_ids=ids)
    assert only_out.ce.item() == 0.0
    torch.testing.assert_close(only_out.l1, full.l1)
    only_out.total.backward()
    assert draft.grad is not None and torch.isfinite(draft.grad).all()
    with pytest.raises(ValueError, match=r"\(5 columns\)"):
        dspark_loss(torch.randn(4, 3, 6), target, labels_in, valid, conf, draft_vocab_ids=ids)


# --------------------------------------------------------------------------- checkpoints


def test_checkpoint_carries_the_token_map(
    make_drafter, tiny_target: TargetSpec, make_target_modules, tmp_path: Path
) -> None:
    drafter = reduced_drafter(make_drafter)
    save_drafter(drafter, tmp_path / "d", dtype=torch.bfloat16)
    cfg = json.loads((tmp_path / "d" / "config.json").read_text())
    assert cfg["dspark_config"]["draft_vocab_size"] == K
    emb, head = make_target_modules(0)
    loaded = load_drafter(tmp_path / "d", tiny_target, emb, head)
    assert torch.equal(loaded.draft_vocab.ids, drafter.draft_vocab.ids)
    hidden = torch.randn(2, 64)
    torch.testing.assert_close(
        loaded.compute_base_logits(hidden), drafter.compute_base_logits(hidden)
    )


@pytest.mark.parametrize(
    ("ids", "match"),
    [
        (lambda ids: ids.flip(0), "strictly ascending"),
        (lambda ids: ids + 200, "outside the target vocabulary"),
        (lambda ids: ids.to(torch.int32), "expected int64"),
    ],
)
def test_a_corrupt_token_map_in_a_checkpoint_is_refused(
    make_drafter, tiny_target, make_target_modules, tmp_path: Path, ids, match: str
) -> None:
    save_drafter(reduced_drafter(make_drafter), tmp_path)
    weights = tmp_path / "model.safetensors"
    state = load_file(str(weights))
    state[DRAFT_VOCAB_BUFFER] = ids(state[DRAFT_VOCAB_BUFFER]).contiguous()
    save_file(state, str(weights), metadata={"format": "pt"})
    emb, head = make_target_modules(0)
    with pytest.raises(CheckpointError, match=match):
        load_drafter(tmp_path, tiny_target, emb, head)
