"""vLLM speculators' DSpark layout: checked and imported (CPU, no downloads).

Checkpoints are written by the test from the layout itself (``tests/speculators_layout.py``),
holding the weights of one of our dense drafters on a tiny random HF Qwen3 target (V=512,
H=64, 8 layers): layer ids as speculators counts them (HF ``hidden_states[aux]``), the
verifier's embedding and LM head rows, ``t2d``/``d2t`` for a reduced vocabulary.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from speculators_layout import from_drafter, save_speculators, speculators_config
from torch import nn

from dspark_sglang.model import markov_logits
from dspark_sglang.model.checkpoint import CheckpointError, load_drafter
from dspark_sglang.model.config import DSparkConfig, TargetSpec
from dspark_sglang.model.drafter import DSparkDrafter
from dspark_sglang.model.formats import speculators
from dspark_sglang.model.formats.speculators import (
    SpeculatorsConfig,
    check_checkpoint,
    import_to_ours,
)
from dspark_sglang.model.vocab import DraftVocab
from dspark_sglang.training.datagen import target_hidden_states

V, H, LAYERS, BLOCK, K = 512, 64, 8, 4, 96
IDS = (1, 3, 5)  # ours (DeepSpec's); speculators writes (2, 4, 6)


@pytest.fixture(scope="module")
def target() -> nn.Module:
    from transformers import Qwen3Config, Qwen3ForCausalLM

    cfg = Qwen3Config(
        vocab_size=V, hidden_size=H, intermediate_size=96, num_hidden_layers=LAYERS,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=1024,
        rms_norm_eps=1e-6, tie_word_embeddings=False, initializer_range=0.1,
    )  # fmt: skip
    torch.manual_seed(0)
    return Qwen3ForCausalLM(cfg).eval()


def _spec(target: nn.Module) -> TargetSpec:
    return TargetSpec.from_hf_config(target.config, name="tiny-qwen3")


def our_drafter(
    target: nn.Module,
    make_config: Callable[..., DSparkConfig],
    vocab: int | None,
    markov_std: float = 0.5,
    **kw: Any,
) -> DSparkDrafter:
    """A dense drafter on ``target``'s embedding and LM head, large random weights."""
    fields = dict(ffn_type="dense", sliding_window=None, block_size=BLOCK, target_layer_ids=IDS,
                  draft_vocab_size=vocab) | kw  # fmt: skip
    torch.manual_seed(5)
    emb, head = target.get_input_embeddings(), target.get_output_embeddings()
    drafter = DSparkDrafter(make_config(**fields), emb, head)
    drafter.reset_parameters(std=0.1)
    with torch.no_grad():
        for p in drafter.markov_head.parameters():
            p.normal_(0.0, markov_std)
    if vocab is not None:
        ids = torch.randperm(V, generator=torch.Generator().manual_seed(1))[:vocab].sort().values
        drafter.set_draft_vocab(DraftVocab(ids, V))
    return drafter.eval()


def write_speculators(
    folder: Path, drafter: DSparkDrafter, edit: Callable[[dict], None] | None = None, **kw: Any
) -> Path:
    """``drafter``'s weights as ``DSparkDraftModel.save_pretrained`` would write them."""
    cfg, state = from_drafter(drafter, **kw)
    if edit is not None:
        edit({"config": cfg, "tensors": state})
    return save_speculators(folder, cfg, state)


def _import(folder: Path, out: Path, target: nn.Module, hf: dict | None = None, **kw: Any) -> Path:
    hf = target.config.to_dict() if hf is None else hf
    return import_to_ours(folder, out, target_hf_config=hf, target_name="tiny-qwen3", **kw)


# --------------------------------------------------------------------------- anchor-first


@pytest.mark.parametrize(
    ("vocab", "overrides"),
    [(None, {}), (K, {"markov_head_type": "gated"}),
     (None, {"markov_head_type": "rnn", "confidence_head_with_markov": False})],
)  # fmt: skip
def test_anchor_first_checkpoint_drafts_as_the_same_weights_in_our_format(
    tmp_path: Path,
    target: nn.Module,
    make_config: Callable[..., DSparkConfig],
    vocab: int | None,
    overrides: dict[str, Any],
) -> None:
    """Each side gathers its context as its own project does (speculators: HF
    ``hidden_states[aux]``; ours: ``target_hidden_states`` on the imported ids), then the
    imported drafter's block, Markov logits and confidences equal the original's."""
    ref = our_drafter(target, make_config, vocab, **overrides)
    folder = write_speculators(tmp_path / "spec", ref)
    ours = _import(folder, tmp_path / "ours", target)
    emb, head = target.get_input_embeddings(), target.get_output_embeddings()
    got = load_drafter(ours, _spec(target), emb, head)
    assert got.config.draft_vocab_size == vocab and got.config.target_layer_ids == IDS

    gen = torch.Generator().manual_seed(3)
    n, t, p = 3, 16, 11
    tokens = torch.randint(0, V, (n, t), generator=gen)
    mask = torch.ones(n, t, dtype=torch.long)
    aux = json.loads((folder / "config.json").read_text())["aux_hidden_state_layer_ids"]
    with torch.no_grad():
        hs = target.model(input_ids=tokens, output_hidden_states=True).hidden_states
        upstream = torch.cat([hs[a] for a in aux], -1)  # speculators' reading of its ids
        imported = target_hidden_states(target, tokens, mask, got.config.target_layer_ids)[0]
        pos, valid = torch.arange(t).expand(n, t), torch.ones(n, t, dtype=torch.bool)
        anchors, at = tokens[:, p], torch.full((n,), p)
        prev = tokens[:, p : p + BLOCK]
        want = markov_logits(ref, ref.forward_block(upstream, pos, valid, anchors, at), prev)
        out = markov_logits(got, got.forward_block(imported, pos, valid, anchors, at), prev)
    torch.testing.assert_close(out.logits, want.logits, atol=1e-5, rtol=0)
    torch.testing.assert_close(out.confidence_logits, want.confidence_logits, atol=1e-5, rtol=0)
    if vocab is not None:
        assert torch.equal(got.draft_vocab.ids, ref.draft_vocab.ids)


def test_check_reads_headers_only(
    tmp_path: Path,
    target: nn.Module,
    make_config: Callable[..., DSparkConfig],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    folder = write_speculators(tmp_path / "spec", our_drafter(target, make_config, K))

    def no_data(*_: object, **__: object) -> None:
        raise AssertionError("check_checkpoint loaded tensor data")

    monkeypatch.setattr(speculators, "load_tensors", no_data)  # the only tensor-data reader
    cfg, deep = check_checkpoint(folder, target.config.to_dict())
    assert cfg.aux_hidden_state_layer_ids == (2, 4, 6) and deep.target_layer_ids == IDS


# --------------------------------------------------------------------------- slot layout


def test_a_one_plus_n_checkpoint_is_refused_by_name(
    tmp_path: Path, target: nn.Module, make_config: Callable[..., DSparkConfig]
) -> None:
    ref = our_drafter(target, make_config, None)
    one_n = write_speculators(tmp_path / "1n", ref, sample_from_anchor=False)
    with pytest.raises(CheckpointError, match=r"sample_from_anchor: false: a 1\+N .*one slot off"):
        _import(one_n, tmp_path / "ours", target)
    with pytest.raises(CheckpointError, match=r"False in the file but True was passed"):
        _import(one_n, tmp_path / "ours", target, sample_from_anchor=True)
    old = write_speculators(tmp_path / "old", ref, sample_from_anchor=None)  # predates the field
    with pytest.raises(CheckpointError, match=r"sample_from_anchor: missing.*speculative_tokens=3"):
        _import(old, tmp_path / "ours", target)
    with pytest.raises(CheckpointError, match=r"speculative_tokens=3 != block_size=4"):
        _import(old, tmp_path / "ours", target, sample_from_anchor=True)  # the file says 1+N
    assert not (tmp_path / "ours").exists()

    def no_field(c: dict) -> None:  # an anchor-first file whose field was lost
        del c["config"]["sample_from_anchor"]

    lost = write_speculators(tmp_path / "lost", ref, no_field)
    with pytest.raises(CheckpointError, match=r"sample_from_anchor: missing"):
        _import(lost, tmp_path / "ours", target)
    _import(lost, tmp_path / "ours", target, sample_from_anchor=True)  # said explicitly


def test_reading_a_one_plus_n_drafter_anchor_first_collapses_acceptance(
    tmp_path: Path, target: nn.Module, make_config: Callable[..., DSparkConfig]
) -> None:
    """The bug class the refusal guards: on a synthetic target whose continuation is what
    a 1+N drafter predicts (slot j -> anchor+j, Markov bias from token anchor+j-1), the
    same weights read anchor-first (slot k -> anchor+k+1) accept next to nothing."""
    ref = our_drafter(target, make_config, None, markov_std=0.1)  # the base logits matter
    one_n = write_speculators(tmp_path / "1n", ref, sample_from_anchor=False)
    with pytest.raises(CheckpointError, match=r"1\+N"):
        _import(one_n, tmp_path / "refused", target)
    # What a loader that ignored sample_from_anchor would serve: the same bytes, read
    # anchor-first.
    same = write_speculators(tmp_path / "as-anchor-first", ref, sample_from_anchor=True)
    emb, head = target.get_input_embeddings(), target.get_output_embeddings()
    read = load_drafter(_import(same, tmp_path / "ours", target), _spec(target), emb, head)
    gen = torch.Generator().manual_seed(4)
    n, t, p = 64, 12, 8
    ctx = torch.randn(n, t, len(IDS) * H, generator=gen)
    pos, valid = torch.arange(t).expand(n, t), torch.ones(n, t, dtype=torch.bool)
    anchors = torch.randint(0, V, (n,), generator=gen)
    with torch.no_grad():
        block = read.forward_block(ctx, pos, valid, anchors, torch.full((n,), p))
        truth = anchors.new_zeros(n, BLOCK)  # truth[:, j]: token anchor+j (1+N's slot j)
        truth[:, 0] = anchors
        for j in range(1, BLOCK):  # 1+N: slot j's Markov input is token anchor+j-1
            prev = torch.cat([truth[:, :1], truth[:, :-1]], 1)
            truth[:, j] = markov_logits(read, block, prev).logits[:, j].argmax(-1)
        # anchor-first: slot k (prev = token anchor+k) is compared with token anchor+k+1
        guess = markov_logits(read, block, truth).logits[:, : BLOCK - 1].argmax(-1)
    hits = (guess == truth[:, 1:]).long().cumprod(1).sum(1).float()
    print("accepted per block read anchor-first:", hits.mean().item())
    assert hits.mean() < 0.25 * (BLOCK - 1), hits.mean()  # 1+N reading: BLOCK-1 each


# --------------------------------------------------------------------------- refusals


def _cfg(key: str, value: Any) -> Callable[[dict], None]:
    return lambda c: c["config"].__setitem__(key, value)


def _tensor(name: str, value: torch.Tensor | None) -> Callable[[dict], None]:
    def edit(c: dict) -> None:
        if value is None:
            c["tensors"].pop(name)
        else:
            c["tensors"][name] = value

    return edit


def _shift_d2t(c: dict) -> None:
    c["tensors"]["d2t"] = c["tensors"]["d2t"] + 1  # offsets now name the next token


@pytest.mark.parametrize(
    ("vocab", "edit", "target_edit", "match"),
    [
        (None, _tensor("fc.weight", torch.zeros(H, 2 * H)), None,
         r"'fc\.weight' has shape \(64, 128\).*\(64, 192\)"),
        (None, _tensor("confidence_head.proj.bias", None), None,
         r"missing \['confidence_head\.proj\.bias'\]"),
        (None, _cfg("aux_hidden_state_layer_ids", [2, 4, 8]), None,
         r"aux_hidden_state_layer_ids\[2\]: 8 but the target has 8 layers.*last layer"),
        (None, _cfg("aux_hidden_state_layer_ids", [0, 4, 6]), None,
         r"aux_hidden_state_layer_ids\[0\]: 0 is the embedding output"),
        (None, None, {"vocab_size": 1024},
         r"transformer_layer_config\.vocab_size=512 but the target's vocab_size is 1024"),
        (None, None, {"num_hidden_layers": 6},
         r"aux_hidden_state_layer_ids\[2\]: 6 but the target has 6 layers"),
        (None, _cfg("speculators_model_type", "dflash"), None,
         r"speculators_model_type: 'dflash' is not 'dspark'"),
        (None, _cfg("mask_token_id", None), None, r"mask_token_id: null"),
        (None, _cfg("markov_rank", 0), None, r"markov_rank: 0 \(no Markov head"),
        (None, _cfg("target_hidden_size", 128), None, r"target_hidden_size: 128 differs"),
        (K, _tensor("t2d", None), None, r"missing \['t2d'\]"),
        (K, _shift_d2t, None, r"t2d and d2t name different tokens"),
        (K, _tensor("lm_head.weight", torch.zeros(V, H)), None,
         r"'lm_head\.weight' has shape \(512, 64\).*\(96, 64\)"),
    ],
)  # fmt: skip
def test_malformed_checkpoints_are_refused_by_name(
    tmp_path: Path,
    target: nn.Module,
    make_config: Callable[..., DSparkConfig],
    vocab: int | None,
    edit: Callable[[dict], None] | None,
    target_edit: dict[str, Any] | None,
    match: str,
) -> None:
    folder = write_speculators(tmp_path / "spec", our_drafter(target, make_config, vocab), edit)
    hf = target.config.to_dict() | (target_edit or {})
    with pytest.raises(CheckpointError, match=match):
        _import(folder, tmp_path / "ours", target, hf)
    assert not (tmp_path / "ours").exists()


def test_config_is_read_field_by_field() -> None:
    raw = speculators_config({"model_type": "qwen3", "vocab_size": V, "hidden_size": H},
                             block_size=4, aux_hidden_state_layer_ids=[2, 4],
                             mask_token_id=1, draft_vocab_size=V, markov_rank=8)  # fmt: skip
    cfg = SpeculatorsConfig.from_hf_dict(raw)
    assert cfg.target_layer_ids == (1, 3) and not cfg.reduced and cfg.verifier == "tiny-qwen3"
    for key, value, match in [
        ("aux_hidden_state_layer_ids", [4, 2], r"strictly increasing"),
        ("block_size", 17, r"block_size: 17 must be an int in \[1, 16\]"),
        ("markov_head_type", "lstm", r"markov_head_type: 'lstm'"),
        ("draft_vocab_size", V + 1, r"draft_vocab_size: 513"),
        ("transformer_layer_config", {"model_type": "gemma3"}, r"model_type: 'gemma3'"),
    ]:
        with pytest.raises(ValueError, match=match):
            SpeculatorsConfig.from_hf_dict(raw | {key: value})
