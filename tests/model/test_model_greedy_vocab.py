"""The greedy map: a second token map of a full drafter, for SGLang's argmax draft."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from dspark_sglang.model import load_drafter, save_drafter
from dspark_sglang.model.checkpoint import CheckpointError
from dspark_sglang.model.config import DSparkConfig, TargetSpec
from dspark_sglang.model.vocab import (
    DRAFT_VOCAB_SIZE_KEY,
    GREEDY_DRAFT_VOCAB_BUFFER,
    GREEDY_DRAFT_VOCAB_SIZE_KEY,
    DraftVocab,
)
from dspark_sglang.training.config import DrafterSection

K = 48


def greedy_map(vocab_size: int = 512) -> DraftVocab:
    counts = torch.zeros(vocab_size)
    counts[200 : 200 + K - 1] = 5.0
    return DraftVocab.from_counts(counts, K, always=[7])  # 7: an EOS id with no count


def test_the_config_keys_are_the_config_fields() -> None:
    names = {f.name for f in dataclasses.fields(DSparkConfig)}
    assert {DRAFT_VOCAB_SIZE_KEY, GREEDY_DRAFT_VOCAB_SIZE_KEY} <= names


def test_config_bounds_combination_and_old_configs(
    make_config: Callable[..., DSparkConfig],
) -> None:
    with pytest.raises(ValueError, match=r"greedy_draft_vocab_size=513 is out of range"):
        make_config(greedy_draft_vocab_size=513)
    with pytest.raises(ValueError, match=r"greedy_draft_vocab_size must be >= 1"):
        make_config(greedy_draft_vocab_size=0)
    with pytest.raises(ValueError, match=r"needs a full-vocabulary drafter.*draft_vocab_size=64"):
        make_config(greedy_draft_vocab_size=K, draft_vocab_size=64)
    full = make_config()
    assert GREEDY_DRAFT_VOCAB_SIZE_KEY not in full.to_dict()  # older checkpoints read the same
    greedy = make_config(greedy_draft_vocab_size=K)
    assert greedy.to_dict()[GREEDY_DRAFT_VOCAB_SIZE_KEY] == K
    assert DSparkConfig.from_hf_dict(greedy.to_hf_dict()) == greedy


def test_training_refuses_the_greedy_map_as_a_model_override() -> None:
    with pytest.raises(ValueError, match="export-drafter --greedy-draft-vocab-size"):
        DrafterSection(model={GREEDY_DRAFT_VOCAB_SIZE_KEY: K})


def test_the_greedy_map_does_not_change_drafting(make_drafter) -> None:
    drafter = make_drafter()
    assert drafter.greedy_vocab is None
    greedy = drafter.with_greedy_vocab(greedy_map())
    assert greedy.config.greedy_draft_vocab_size == K
    assert torch.equal(greedy.greedy_vocab.ids, greedy_map().ids)
    assert greedy.draft_vocab is None
    hidden = torch.randn(3, 64)
    assert torch.equal(greedy.compute_base_logits(hidden), drafter.compute_base_logits(hidden))
    for (name, a), (_, b) in zip(
        drafter.named_parameters(), greedy.named_parameters(), strict=True
    ):
        assert torch.equal(a, b), name
    assert greedy.with_greedy_vocab(None).greedy_vocab is None
    with pytest.raises(ValueError, match="build the map for this target"):
        drafter.with_greedy_vocab(DraftVocab(torch.arange(4), 100))


def test_a_narrowed_drafter_refuses_a_greedy_map_and_narrowing_drops_it(make_drafter) -> None:
    greedy = make_drafter().with_greedy_vocab(greedy_map())
    narrowed = greedy.restricted_to(DraftVocab(torch.arange(64), 512))
    assert narrowed.greedy_vocab is None and narrowed.draft_vocab.size == 64
    with pytest.raises(ValueError, match="needs a full-vocabulary drafter"):
        narrowed.with_greedy_vocab(greedy_map())


def test_checkpoint_round_trips_the_greedy_map(
    make_drafter, tiny_target: TargetSpec, make_target_modules, tmp_path: Path
) -> None:
    drafter = make_drafter().with_greedy_vocab(greedy_map())
    save_drafter(drafter, tmp_path / "d", dtype=torch.bfloat16)
    cfg = json.loads((tmp_path / "d" / "config.json").read_text())
    assert cfg["dspark_config"][GREEDY_DRAFT_VOCAB_SIZE_KEY] == K
    assert GREEDY_DRAFT_VOCAB_BUFFER in load_file(str(tmp_path / "d" / "model.safetensors"))
    emb, head = make_target_modules(0)
    loaded = load_drafter(tmp_path / "d", tiny_target, emb, head)
    assert torch.equal(loaded.greedy_vocab.ids, greedy_map().ids)
    assert 7 in loaded.greedy_vocab.ids.tolist()
    assert loaded.draft_vocab is None


@pytest.mark.parametrize(
    ("ids", "match"),
    [
        (lambda ids: ids.flip(0), "greedy_draft_vocab must be strictly ascending"),
        (lambda ids: ids + 500, "greedy_draft_vocab holds ids outside the target vocabulary"),
        (lambda ids: ids[:-1], r"greedy_draft_vocab.*config.json implies"),
    ],
)
def test_a_corrupt_greedy_map_in_a_checkpoint_is_refused(
    make_drafter, tiny_target, make_target_modules, tmp_path: Path, ids, match: str
) -> None:
    save_drafter(make_drafter().with_greedy_vocab(greedy_map()), tmp_path)
    weights = tmp_path / "model.safetensors"
    state = load_file(str(weights))
    state[GREEDY_DRAFT_VOCAB_BUFFER] = ids(state[GREEDY_DRAFT_VOCAB_BUFFER]).contiguous()
    save_file(state, str(weights), metadata={"format": "pt"})
    emb, head = make_target_modules(0)
    with pytest.raises(CheckpointError, match=match):
        load_drafter(tmp_path, tiny_target, emb, head)


def test_a_greedy_map_without_its_config_key_is_refused(
    make_drafter, tiny_target, make_target_modules, tmp_path: Path
) -> None:
    save_drafter(make_drafter().with_greedy_vocab(greedy_map()), tmp_path)
    cfg_path = tmp_path / "config.json"
    cfg = json.loads(cfg_path.read_text())
    del cfg["dspark_config"][GREEDY_DRAFT_VOCAB_SIZE_KEY]
    cfg_path.write_text(json.dumps(cfg))
    emb, head = make_target_modules(0)
    with pytest.raises(CheckpointError, match=r"unexpected tensors \['greedy_draft_vocab'\]"):
        load_drafter(tmp_path, tiny_target, emb, head)
