"""Our SGLang draft class vs ``DSparkDrafter`` on the same checkpoint (no engine).

The SGLang class is built in-process (SGLang's single-rank gloo setup, as its
own layer tests do), loads the folder ``save_drafter`` wrote through its own
``load_weights``, receives the target context through SGLang's real injection
path (``write_target_hidden_kv`` into a real ``MHATokenToKVPool``) and runs
``forward`` over a ``TARGET_VERIFY`` ``ForwardBatch`` exactly as
``DraftBlockProposer`` builds it. The attention backend is not exercised:
windowed layers read the pool themselves (the forward context below only
hands them the pools); the unwindowed path is SGLang's backend, covered by
the engine test.

Checked against ``DSparkDrafter.forward_block`` + ``markov_logits`` on a
ragged batch whose contexts are longer than the window (so the window binds)
and one shorter: final hidden states, base logits, Markov-corrected logits
and raw confidence logits, all within float32 tolerance. Bad checkpoints are
refused with the field named.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from host_sync_guard import HostSyncError, host_syncs_raise
from safetensors.torch import load_file
from sglang_runtime import single_process_runtime

from dspark_sglang.model import (
    CheckpointError,
    DSparkConfig,
    DSparkDrafter,
    TargetSpec,
    markov_logits,
    save_drafter,
)
from dspark_sglang.model.moe import MoEFFN, route
from dspark_sglang.model.vocab import DraftVocab, scatter_to_vocab

pytestmark = pytest.mark.sglang

VOCAB, HIDDEN, LAYERS = 96, 64, 6
WINDOW, BLOCK = 6, 4
ATOL = 2e-5


@pytest.fixture(scope="module")
def sglang_runtime() -> Iterator[None]:
    """SGLang's single-process tp=1 runtime (``sglang_runtime.single_process_runtime``)."""
    with single_process_runtime():
        yield


def _config(**overrides: Any) -> DSparkConfig:
    spec = TargetSpec(
        name="tiny-target",
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        num_layers=LAYERS,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        rope_theta=10000.0,
        rms_norm_eps=1e-6,
        max_position_embeddings=256,
    )
    fields: dict[str, Any] = {
        "num_hidden_layers": 2,
        "block_size": BLOCK,
        "sliding_window": WINDOW,
        "num_experts": 4,
        "num_experts_per_tok": 2,
        "markov_rank": 8,
        "intermediate_size": 96,
    }
    fields.update(overrides)
    return DSparkConfig.for_target(spec, mask_token_id=VOCAB - 1, **fields)


def _drafter(config: DSparkConfig, seed: int = 0) -> DSparkDrafter:
    torch.manual_seed(seed)
    embed = torch.nn.Embedding(VOCAB, HIDDEN)
    head = torch.nn.Linear(HIDDEN, VOCAB, bias=False)
    drafter = DSparkDrafter(config, embed, head).eval()
    # Biases and norm weights away from their init, so a mis-mapped tensor shows.
    with torch.no_grad():
        for p in drafter.parameters():
            p.add_(0.05 * torch.randn_like(p))
    if config.draft_vocab_size is not None:  # a scattered map, not the first K ids
        ids = torch.randperm(VOCAB)[: config.draft_vocab_size].sort().values
        drafter.set_draft_vocab(DraftVocab(ids, VOCAB))
    return drafter


def _sglang_model(folder: Path) -> Any:
    from dspark_sglang.sglang_integration.draft_checkpoint import DSparkMoeHFConfig
    from dspark_sglang.sglang_integration.moe_draft_model import DSparkMoEDraftModel

    raw = json.loads((folder / "config.json").read_text())
    model = DSparkMoEDraftModel(DSparkMoeHFConfig(**raw)).eval()
    model.load_weights(load_file(str(folder / "model.safetensors")).items())
    return model


def _lm_head(source: torch.nn.Linear) -> Any:
    from sglang.srt.layers.vocab_parallel_embedding import ParallelLMHead

    head = ParallelLMHead(VOCAB, HIDDEN)  # pads the vocab; logits are cropped to VOCAB
    with torch.no_grad():
        head.weight.zero_()
        head.weight[:VOCAB].copy_(source.weight)
    return head


@dataclass
class _DraftCase:
    """A loaded SGLang draft class plus one ragged TARGET_VERIFY batch for it."""

    config: DSparkConfig
    drafter: DSparkDrafter
    model: Any
    batch: Any
    pools: Any
    contexts: list[torch.Tensor]
    ctx_lens: list[int]
    anchors: torch.Tensor
    prefix: torch.Tensor
    gen: torch.Generator


def _draft_case(tmp_path: Path, overrides: dict[str, Any]) -> _DraftCase:
    """Checkpoint -> SGLang class; context injected through SGLang's own path."""
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool
    from sglang.srt.model_executor.forward_batch_info import (
        CaptureHiddenMode,
        ForwardBatch,
        ForwardMode,
    )

    config = _config(**overrides)
    drafter = _drafter(config)
    folder = save_drafter(drafter, tmp_path / "ckpt")
    model = _sglang_model(folder)
    model.attach_shared_modules(
        embed_tokens=drafter.embed_tokens, lm_head=_lm_head(drafter.lm_head)
    )

    # Two requests: context lengths 11 (> window: the window binds) and 3.
    gen = torch.Generator().manual_seed(1)
    ctx_lens = [11, 3]
    bs, feat = len(ctx_lens), config.num_context_features * HIDDEN
    pool = MHATokenToKVPool(
        size=64,
        page_size=1,
        dtype=torch.float32,
        head_num=config.num_key_value_heads,
        head_dim=config.head_dim,
        layer_num=config.num_hidden_layers,
        device="cpu",
        enable_memory_saver=False,
    )
    req_to_token = torch.zeros(4, 32, dtype=torch.int32)
    contexts = [torch.randn(n, feat, generator=gen) for n in ctx_lens]
    free = iter(range(1, 64))  # slot 0 is SGLang's padding slot
    block_locs = []
    for r, n in enumerate(ctx_lens):
        locs = torch.tensor([next(free) for _ in range(n + BLOCK)], dtype=torch.int32)
        req_to_token[r, : n + BLOCK] = locs
        block_locs.append(locs[n:])
        # SGLang's own context injection: project, k-norm, RoPE, write.
        with torch.inference_mode():
            model.write_target_hidden_kv(
                target_hidden=contexts[r],
                pool=pool,
                positions=torch.arange(n),
                cache_loc=locs[:n].long(),
            )

    anchors = torch.randint(0, VOCAB - 1, (bs,), generator=gen)
    prefix = torch.tensor(ctx_lens)
    ids = anchors[:, None].repeat(1, BLOCK)
    ids[:, 1:] = config.mask_token_id
    positions = (prefix[:, None] + torch.arange(BLOCK)).reshape(-1)
    batch = ForwardBatch(
        forward_mode=ForwardMode.TARGET_VERIFY,
        batch_size=bs,
        input_ids=ids.reshape(-1),
        req_pool_indices=torch.arange(bs),
        seq_lens=prefix,
        out_cache_loc=torch.cat(block_locs).long(),
        seq_lens_sum=int(prefix.sum()),
        seq_lens_cpu=prefix,
        positions=positions,
        input_embeds=drafter.embed_tokens(ids.reshape(-1)),
        capture_hidden_mode=CaptureHiddenMode.NULL,
    )
    pools = SimpleNamespace(
        token_to_kv_pool=pool, req_to_token_pool=SimpleNamespace(req_to_token=req_to_token)
    )
    return _DraftCase(
        config, drafter, model, batch, pools, contexts, ctx_lens, anchors, prefix, gen
    )


@pytest.mark.parametrize(
    "overrides",
    [
        {},
        {"markov_head_type": "rnn"},
        {"markov_head_type": "gated"},
        {"draft_vocab_size": 40},
        {"draft_vocab_size": 40, "markov_head_type": "rnn"},
    ],
)
def test_sglang_class_matches_drafter(
    sglang_runtime: None, tmp_path: Path, overrides: dict[str, Any]
) -> None:
    from sglang.srt.model_executor.forward_context import ForwardContext, forward_context

    case = _draft_case(tmp_path, overrides)
    config, drafter, model, batch = case.config, case.drafter, case.model, case.batch
    backend_pools, contexts, ctx_lens = case.pools, case.contexts, case.ctx_lens
    anchors, prefix, gen = case.anchors, case.prefix, case.gen
    positions = batch.positions
    bs, feat = len(ctx_lens), config.num_context_features * HIDDEN
    with torch.inference_mode(), forward_context(ForwardContext(attn_backend=backend_pools)):
        out = model.forward(batch.input_ids, positions, batch, input_embeds=batch.input_embeds)
        hidden = out.hidden_states
        base, features = model.compute_base_logits(hidden)
        prev = torch.randint(0, VOCAB, (bs, BLOCK), generator=gen)
        prev[:, 0] = anchors
        head = model.markov_head
        state = head.init_state(hidden.view(bs, BLOCK, -1)[:, 0])
        sg_logits = []
        for k in range(BLOCK):
            bias, state = head.step_bias(
                prev[:, k], hidden_states=hidden.view(bs, BLOCK, -1)[:, k], state=state
            )
            sg_logits.append(base.view(bs, BLOCK, -1)[:, k] + bias)
        _, conf_raw = model.compute_confidence(
            anchor_tokens=anchors,
            draft_tokens=torch.cat([prev[:, 1:], prev[:, :1]], dim=1),
            confidence_features=features,
        )

    # Ours: right-aligned padded contexts, positions 0..n-1.
    c = max(ctx_lens)
    ctx = torch.zeros(bs, c, feat)
    ctx_pos = torch.zeros(bs, c, dtype=torch.long)
    valid = torch.zeros(bs, c, dtype=torch.bool)
    for r, n in enumerate(ctx_lens):
        ctx[r, c - n :] = contexts[r]
        ctx_pos[r, c - n :] = torch.arange(n)
        valid[r, c - n :] = True
    with torch.inference_mode():
        block = drafter.forward_block(ctx, ctx_pos, valid, anchors, prefix)
        ref = markov_logits(drafter, block, prev)

    ours_base, ours_logits = block.base_logits, ref.logits
    if config.draft_vocab_size is not None:
        # SGLang samples over the whole vocabulary: ours scattered, OFF_MAP_LOGIT off the map.
        from dspark_sglang.sglang_integration.moe_draft_model import OFF_MAP_LOGIT

        ids = drafter.draft_vocab.ids
        ours_base = scatter_to_vocab(ours_base, ids, VOCAB, OFF_MAP_LOGIT)
        ours_logits = scatter_to_vocab(ours_logits, ids, VOCAB, OFF_MAP_LOGIT)
    if config.draft_vocab_size is not None:
        # The masked fallback (TP, quantized or muP heads): SGLang's full logits, masked
        # off the map; here reached by making the head look sharded.
        model.lm_head.tp_size = 2
        with torch.inference_mode():
            masked, _ = model.compute_base_logits(hidden)
        model.lm_head.tp_size = 1
        torch.testing.assert_close(masked, base, atol=ATOL, rtol=0)
    torch.testing.assert_close(hidden.view(bs, BLOCK, -1), block.hidden, atol=ATOL, rtol=0)
    torch.testing.assert_close(base.view(bs, BLOCK, -1).float(), ours_base, atol=ATOL, rtol=0)
    torch.testing.assert_close(torch.stack(sg_logits, 1).float(), ours_logits, atol=ATOL, rtol=0)
    assert ref.confidence_logits is not None
    torch.testing.assert_close(conf_raw.float(), ref.confidence_logits, atol=ATOL, rtol=0)

    # The window matters for request 0: without it our own drafter disagrees.
    unwindowed = _drafter(_config(sliding_window=None, **overrides))
    unwindowed.load_state_dict(drafter.state_dict())
    with torch.inference_mode():
        wide = unwindowed.forward_block(ctx, ctx_pos, valid, anchors, prefix)
    assert (wide.hidden[0] - block.hidden[0]).abs().max() > 100 * ATOL
    torch.testing.assert_close(wide.hidden[1], block.hidden[1], atol=ATOL, rtol=0)


def test_bad_checkpoints_are_refused(sglang_runtime: None, tmp_path: Path) -> None:
    from dspark_sglang.sglang_integration.draft_checkpoint import DSparkMoeHFConfig
    from dspark_sglang.sglang_integration.moe_draft_model import DSparkMoEDraftModel

    folder = save_drafter(_drafter(_config()), tmp_path / "ok")
    raw = json.loads((folder / "config.json").read_text())
    weights = load_file(str(folder / "model.safetensors"))

    dflash = json.loads(json.dumps(raw))
    dflash["dspark_config"]["slot_convention"] = "dflash"
    with pytest.raises(CheckpointError, match="slot_convention"):
        DSparkMoEDraftModel(DSparkMoeHFConfig(**dflash))

    no_markov = json.loads(json.dumps(raw))
    no_markov["dspark_config"].update(markov_head_type="none", confidence_head_with_markov=False)
    with pytest.raises(CheckpointError, match="markov_head_type"):
        DSparkMoEDraftModel(DSparkMoeHFConfig(**no_markov))

    with pytest.raises(CheckpointError, match="dspark_config"):
        DSparkMoEDraftModel(
            DSparkMoeHFConfig(**{k: v for k, v in raw.items() if k != "dspark_config"})
        )

    model = DSparkMoEDraftModel(DSparkMoeHFConfig(**raw))
    missing = {k: v for k, v in weights.items() if not k.endswith("experts.down_proj")}
    with pytest.raises(CheckpointError, match="missing tensors"):
        model.load_weights(missing.items())
    extra = dict(weights) | {"layers.0.mlp.bogus.weight": torch.zeros(2)}
    with pytest.raises(CheckpointError, match="bogus"):
        model.load_weights(extra.items())
    nan = dict(weights)
    nan["fc.weight"] = torch.full_like(nan["fc.weight"], float("nan"))
    with pytest.raises(CheckpointError, match="non-finite"):
        model.load_weights(nan.items())
    wrong = dict(weights)
    wrong["layers.0.mlp.gate.weight"] = torch.zeros(3, HIDDEN)
    with pytest.raises(CheckpointError, match="shape"):
        model.load_weights(wrong.items())
    with pytest.raises(CheckpointError, match="no draft_vocab_size"):
        model.load_weights((dict(weights) | {"draft_vocab_ids": torch.arange(4)}).items())

    # A reduced drafter: its token map is required and validated.
    folder = save_drafter(_drafter(_config(draft_vocab_size=40)), tmp_path / "reduced")
    reduced = _sglang_model(folder)
    r_weights = load_file(str(folder / "model.safetensors"))
    with pytest.raises(CheckpointError, match=r"missing tensors for \['draft_vocab_ids'\]"):
        reduced.load_weights({k: v for k, v in r_weights.items() if k != "draft_vocab_ids"}.items())
    unsorted = dict(r_weights) | {"draft_vocab_ids": r_weights["draft_vocab_ids"].flip(0)}
    with pytest.raises(CheckpointError, match="strictly ascending"):
        reduced.load_weights(unsorted.items())


def _base_and_bias(
    folder: Path, drafter: DSparkDrafter, hidden: torch.Tensor, prev: torch.Tensor
) -> tuple[Any, torch.Tensor, torch.Tensor]:
    """The SGLang class loaded from ``folder``: base logits and one Markov step's bias."""
    model = _sglang_model(folder)
    model.attach_shared_modules(
        embed_tokens=drafter.embed_tokens, lm_head=_lm_head(drafter.lm_head)
    )
    with torch.inference_mode():
        base, _ = model.compute_base_logits(hidden)
        head = model.markov_head
        state = head.init_state(hidden)
        bias, state = head.step_bias(prev, hidden_states=hidden, state=state)
        bias2, _ = head.step_bias(prev.flip(0), hidden_states=hidden, state=state)
    return model, base.float(), torch.cat([bias, bias2]).float()


def _draft_blocks(
    model: Any,
    base: torch.Tensor,
    anchor: torch.Tensor,
    hidden: torch.Tensor,
    temperatures: torch.Tensor | None = None,
):
    """SGLang's draft loop over ``base`` ``[N, B, V]``: its own step, then ours.

    Argmax drafts without ``temperatures`` (returns the two token blocks); sampled drafts
    at ``temperatures`` ``[N]`` with them (returns ``(tokens, step logits)`` pairs).
    """
    import functools
    import inspect

    from sglang.srt.runtime_context import get_parallel
    from sglang.srt.speculative.dspark_components import dspark_draft
    from sglang.srt.speculative.spec_tp_sync import SpecTpSync

    from dspark_sglang.sglang_integration.map_step import step_in_map

    greedy = temperatures is None

    def block() -> Any:
        tokens, logits = dspark_draft.draft_markov_block(
            markov_head=model.markov_head,
            base_logits=base,
            anchor_tokens=anchor,
            draft_hidden=hidden,
            step_temperatures=torch.zeros(anchor.numel()) if greedy else temperatures,
            noise=dspark_draft.DraftNoise(key=1, offset=torch.zeros(1, dtype=torch.int64)),
            tp_sync=SpecTpSync(get_parallel().tp_group),
            greedy_draft=greedy,
        )
        if greedy:
            assert logits is None
            return tokens
        return tokens, logits

    current = dspark_draft._draft_step  # wrapped by our hook if this process loaded the plugin
    sglang_step = inspect.unwrap(current)
    try:
        with torch.inference_mode():
            dspark_draft._draft_step = sglang_step
            want = block()
            dspark_draft._draft_step = functools.partial(step_in_map, sglang_step)
            got = block()
    finally:
        dspark_draft._draft_step = current
    return want, got


def _mapped_case(
    tmp_path: Path, markov: str, dtype: torch.dtype, *, greedy_map: bool, seed: int, n: int = 6
) -> tuple[Any, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """A drafter with a 40-token map as SGLang's class (a greedy map, or narrowed to the map)
    and draft inputs: ``(model, map ids, base logits [n, B, V], anchors [n], hidden [n, B, H])``.
    """
    drafter = _drafter(_config(markov_head_type=markov))
    vocab = DraftVocab(torch.randperm(VOCAB)[:40].sort().values, VOCAB)
    shipped = drafter.with_greedy_vocab(vocab) if greedy_map else drafter.restricted_to(vocab)
    model = _sglang_model(save_drafter(shipped, tmp_path / "mapped"))
    model.attach_shared_modules(
        embed_tokens=drafter.embed_tokens, lm_head=_lm_head(drafter.lm_head)
    )
    model.to(dtype)
    gen = torch.Generator().manual_seed(seed)
    hidden = torch.randn(n * BLOCK, HIDDEN, generator=gen).to(dtype)
    anchor = torch.randint(0, VOCAB, (n,), generator=gen)
    with torch.inference_mode():
        base, _ = model.compute_base_logits(hidden)
    return model, vocab.ids, base.view(n, BLOCK, -1).clone(), anchor, hidden.view(n, BLOCK, -1)


@pytest.mark.parametrize("markov", ["vanilla", "gated", "rnn"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_reduced_greedy_step_drafts_what_sglangs_step_drafts(
    sglang_runtime: None,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    markov: str,
    dtype: torch.dtype,
) -> None:
    """The argmax step in the map's columns (``map_step``) against SGLang's own step,
    through SGLang's draft loop: the same drafts, also at exact ties, where the lowest
    target id must win, and on rows with NaNs, where the first NaN must win."""
    from dspark_sglang.sglang_integration.launch import GREEDY_DRAFT_ENV
    from dspark_sglang.sglang_integration.map_step import applies

    monkeypatch.setenv(GREEDY_DRAFT_ENV, "1")
    model, ids, base, anchor, hidden = _mapped_case(
        tmp_path, markov, dtype, greedy_map=True, seed=5
    )
    assert applies(model.markov_head, None) and not applies(model.markov_head, torch.zeros(1))
    # Row 1: exact ties over the whole map at every position (the bias decides, and where
    # it ties too the lowest id wins). Row 2: coarse values, many ties. Row 3: NaNs.
    # Row 4: every mapped base at 256, where bfloat16's step is 2: base + bias ties only
    # after the rounding to the step dtype, which must happen before the argmax.
    base[1][:, ids] = 0.0
    base[2][:, ids] = (base[2][:, ids].float() * 0.5).round().to(dtype)
    base[3, 1, ids[[7, 3]]] = float("nan")
    base[4][:, ids] = 256.0
    want, got = _draft_blocks(model, base, anchor, hidden)
    assert torch.equal(got, want)
    assert int(got[3, 1]) == int(ids[3])  # the first NaN of the row
    # With a zero W2 every mapped token ties at every position of row 1: the lowest id.
    with torch.no_grad():
        model.markov_head.markov_w2.weight.zero_()
    want, got = _draft_blocks(model, base, anchor, hidden)
    assert torch.equal(got, want)
    assert bool((got[1] == ids[0]).all())
    assert set(got.flatten().tolist()) <= set(ids.tolist())


@pytest.mark.parametrize("markov", ["vanilla", "gated", "rnn"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_sampled_step_in_the_map_keeps_sglangs_step_logits(
    sglang_runtime: None, tmp_path: Path, markov: str, dtype: torch.dtype
) -> None:
    """A reduced-vocabulary drafter's sampled draft through SGLang's draft loop, SGLang's own
    step against ours (``map_step``): the step logits verification reads are equal bit for
    bit at every position, rows at temperature 0 draft the same tokens, and every sampled
    draft is a mapped token. (That ours samples ``softmax(logits / T)``:
    ``test_sglang_map_step.py``.)"""
    from dspark_sglang.sglang_integration.map_step import applies_sampled

    model, ids, base, anchor, hidden = _mapped_case(
        tmp_path, markov, dtype, greedy_map=False, seed=7
    )
    n = base.shape[0]
    assert applies_sampled(model.markov_head, base[:, 0], torch.empty_like(base[:, 0]))
    temperatures = torch.tensor([1.0, 0.0, 0.7, 0.0, 1.3, 1.0])
    # Greedy rows only draft the same tokens as SGLang's step when they see the same
    # previous tokens, which a sampled row does not: compare the rows at temperature 0.
    (want, want_logits), (got, got_logits) = _draft_blocks(
        model, base, anchor, hidden, temperatures
    )
    assert got_logits.dtype == want_logits.dtype and got_logits.shape == want_logits.shape
    greedy_rows = temperatures == 0
    assert torch.equal(got[greedy_rows], want[greedy_rows])
    assert torch.equal(got_logits[greedy_rows], want_logits[greedy_rows])
    assert set(got.flatten().tolist()) <= set(ids.tolist())
    # The sampled rows' logits: the same numbers wherever both loops drew the same previous
    # token (the Markov bias depends on it); the first position depends on the anchor only.
    assert torch.equal(got_logits[:, 0], want_logits[:, 0])
    same_prev = torch.cat([torch.ones(n, 1, dtype=torch.bool), got[:, :-1] == want[:, :-1]], 1)
    if markov == "vanilla":  # a stateless head: only the previous token matters
        assert torch.equal(got_logits[same_prev], want_logits[same_prev])


@pytest.mark.parametrize("markov", ["vanilla", "rnn"])
def test_greedy_map_drafts_as_the_narrowed_drafter_only_under_the_argmax_draft(
    sglang_runtime: None,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    markov: str,
) -> None:
    from dspark_sglang.sglang_integration.launch import GREEDY_DRAFT_ENV
    from dspark_sglang.sglang_integration.moe_draft_model import OFF_MAP_LOGIT

    drafter = _drafter(_config(markov_head_type=markov))
    vocab = DraftVocab(torch.randperm(VOCAB)[:40].sort().values, VOCAB)
    greedy = save_drafter(drafter.with_greedy_vocab(vocab), tmp_path / "greedy")
    narrowed = save_drafter(drafter.restricted_to(vocab), tmp_path / "narrowed")
    full = save_drafter(drafter, tmp_path / "full")
    gen = torch.Generator().manual_seed(3)
    hidden = torch.randn(5, HIDDEN, generator=gen)
    prev = torch.randint(0, VOCAB, (5,), generator=gen)
    log = "dspark_sglang.sglang_integration.moe_draft_model"

    monkeypatch.setenv(GREEDY_DRAFT_ENV, "1")
    with caplog.at_level(logging.INFO, logger=log):
        model, base, bias = _base_and_bias(greedy, drafter, hidden, prev)
    assert model.dspark_uses_greedy_map and model.dspark_draft_vocab_size == 40
    assert "greedy draft over the drafter's 40-token greedy map" in caplog.text
    _, want_base, want_bias = _base_and_bias(narrowed, drafter, hidden, prev)
    torch.testing.assert_close(base, want_base, atol=0, rtol=0)
    torch.testing.assert_close(bias, want_bias, atol=0, rtol=0)
    off = torch.ones(VOCAB, dtype=torch.bool)
    off[vocab.ids] = False
    assert bool((base[:, off] == OFF_MAP_LOGIT).all())
    # The masked fallback (TP, quantized or muP heads) masks with the greedy map too.
    model.lm_head.tp_size = 2
    with torch.inference_mode():
        masked, _ = model.compute_base_logits(hidden)
    torch.testing.assert_close(masked.float(), base, atol=ATOL, rtol=0)

    caplog.clear()
    monkeypatch.setenv(GREEDY_DRAFT_ENV, "0")
    with caplog.at_level(logging.INFO, logger=log):
        model, base, bias = _base_and_bias(greedy, drafter, hidden, prev)
    assert not model.dspark_uses_greedy_map and model.dspark_draft_vocab_size is None
    assert "40-token greedy map is ignored because the argmax draft is off" in caplog.text
    _, want_base, want_bias = _base_and_bias(full, drafter, hidden, prev)
    torch.testing.assert_close(base, want_base, atol=0, rtol=0)
    torch.testing.assert_close(bias, want_bias, atol=0, rtol=0)
    assert bool((base[:, off] > OFF_MAP_LOGIT).all())


def test_bad_greedy_maps_are_refused_whatever_the_argmax_draft(
    sglang_runtime: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dspark_sglang.sglang_integration.launch import GREEDY_DRAFT_ENV

    drafter = _drafter(_config())
    vocab = DraftVocab(torch.arange(10, 50), VOCAB)
    folder = save_drafter(drafter.with_greedy_vocab(vocab), tmp_path / "greedy")
    weights = load_file(str(folder / "model.safetensors"))
    plain = {k: v for k, v in weights.items() if k != "greedy_draft_vocab"}
    for env in ("0", "1"):
        monkeypatch.setenv(GREEDY_DRAFT_ENV, env)
        model = _sglang_model(folder)
        with pytest.raises(CheckpointError, match=r"missing tensors for \['greedy_draft_vocab'\]"):
            model.load_weights(plain.items())
        unsorted = plain | {"greedy_draft_vocab": weights["greedy_draft_vocab"].flip(0)}
        with pytest.raises(CheckpointError, match="greedy_draft_vocab must be strictly ascending"):
            model.load_weights(unsorted.items())
        short = plain | {"greedy_draft_vocab": weights["greedy_draft_vocab"][:-1]}
        with pytest.raises(CheckpointError, match="but greedy_draft_vocab_size=40"):
            model.load_weights(short.items())
        full_model = _sglang_model(save_drafter(drafter, tmp_path / f"full{env}"))
        with pytest.raises(CheckpointError, match="no greedy_draft_vocab_size"):
            full_model.load_weights((plain | {"greedy_draft_vocab": vocab.ids}).items())


# --------------------------------------------------------------------------- GPU readiness
#
# CUDA graphs cannot capture a device->host sync (``.item()``, ``.tolist()``,
# ``bool(tensor)``) or a data-dependent shape (``bincount`` sizes, boolean
# indexing), and outside graphs every sync stalls the GPU. Without a GPU two
# checks stand in: TorchDynamo's ``fullgraph=True`` tracing (it refuses both
# kinds) of the MoE and the windowed attention, and the whole draft forward run
# with the Python-level sync entry points made to raise (``host_sync_guard``). Each
# check is shown to fail on the training code's per-expert loop, which does sync.


def _moe_pair(top_k: int, shared: bool, seed: int = 0) -> tuple[MoEFFN, Any]:
    from dspark_sglang.sglang_integration.moe_draft_model import DSparkInferenceMoE

    args = (HIDDEN, 5, top_k, 48, 40 if shared else None)
    torch.manual_seed(seed)
    train = MoEFFN(*args).eval()
    infer = DSparkInferenceMoE(*args).eval()
    infer.load_state_dict(train.state_dict())
    return train, infer


@pytest.mark.parametrize(("top_k", "shared"), [(1, True), (2, True), (2, False), (3, True)])
def test_dense_moe_equals_training_moe(top_k: int, shared: bool) -> None:
    train, infer = _moe_pair(top_k, shared)
    x = torch.randn(3, 13, HIDDEN, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        torch.testing.assert_close(infer(x), train(x)[0], atol=1e-6, rtol=1e-6)
        # float64: the two forms differ only in summation order.
        torch.testing.assert_close(
            infer.double()(x.double()), train.double()(x.double())[0], atol=1e-12, rtol=0
        )


def test_dense_moe_unrouted_expert_contributes_nothing() -> None:
    """An expert outside every top-k, with non-finite weights, must not leak (mask, not *0)."""
    train, infer = _moe_pair(2, True)
    x = torch.rand(40, HIDDEN, generator=torch.Generator().manual_seed(3)) + 0.1  # all > 0
    with torch.no_grad():
        for m in (train, infer):
            m.gate.weight[0] = -10.0  # expert 0: lowest logit for every positive x
            m.experts.gate_up_proj[0] = float("inf")
        expect = train(x)[0]
        got = infer(x)
    assert bool(torch.isfinite(expect).all())
    torch.testing.assert_close(got, expect, atol=1e-6, rtol=1e-6)


def _window_inputs(gen: torch.Generator) -> tuple[tuple[torch.Tensor, ...], dict[str, Any]]:
    bs, q_len, heads, kv_heads, dim, slots = 3, BLOCK, 4, 2, 16, 40
    q = torch.randn(bs * q_len, heads * dim, generator=gen)
    k = torch.randn(bs * q_len, kv_heads * dim, generator=gen)
    v = torch.randn(bs * q_len, kv_heads * dim, generator=gen)
    kwargs: dict[str, Any] = {
        "key_buffer": torch.randn(slots, kv_heads, dim, generator=gen),
        "value_buffer": torch.randn(slots, kv_heads, dim, generator=gen),
        "req_to_token": torch.randint(1, slots, (4, 32), generator=gen, dtype=torch.int32),
        "req_pool_indices": torch.tensor([2, 0, 3]),
        "prefix_lens": torch.tensor([11, 2, 0]),
        "window": WINDOW,
        "num_heads": heads,
        "num_kv_heads": kv_heads,
        "head_dim": dim,
        "scaling": dim**-0.5,
    }
    return (q, k, v), kwargs


def test_moe_and_window_trace_as_one_graph() -> None:
    """``fullgraph=True`` tracing accepts the inference MoE and the windowed attention."""
    from dspark_sglang.sglang_integration.moe_draft_model import windowed_block_attention

    torch._dynamo.reset()
    train, infer = _moe_pair(2, True)
    x = torch.randn(2, 8, HIDDEN, generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        traced = torch.compile(infer, fullgraph=True, backend="eager", dynamic=False)
        torch.testing.assert_close(traced(x), infer(x), atol=0, rtol=0)
        # The same check refuses the training MoE's per-expert loop (bincount().tolist()).
        with pytest.raises(Exception, match=r"(?i)data.dependent|tolist|bincount"):
            torch.compile(train, fullgraph=True, backend="eager", dynamic=False)(x)

    (q, k, v), kwargs = _window_inputs(torch.Generator().manual_seed(5))
    attn = torch.compile(windowed_block_attention, fullgraph=True, backend="eager", dynamic=False)
    torch.testing.assert_close(
        attn(q, k, v, **kwargs), windowed_block_attention(q, k, v, **kwargs), atol=0, rtol=0
    )
    torch._dynamo.reset()


def test_window_attention_gqa_matches_per_head_loop() -> None:
    """The static GQA expand reads kv head ``h // groups`` for query head ``h``."""
    from dspark_sglang.sglang_integration.moe_draft_model import windowed_block_attention

    (q, k, v), kw = _window_inputs(torch.Generator().manual_seed(6))
    out = windowed_block_attention(q, k, v, **kw)
    bs, q_len, heads, kv_heads, dim = 3, BLOCK, kw["num_heads"], kw["num_kv_heads"], kw["head_dim"]
    groups = heads // kv_heads
    for b in range(bs):
        p = int(kw["prefix_lens"][b])
        ctx = list(range(max(0, p - WINDOW), p))
        locs = kw["req_to_token"][kw["req_pool_indices"][b], ctx].long()
        rows = slice(b * q_len, (b + 1) * q_len)
        for h in range(heads):
            g = h // groups
            keys = torch.cat(
                [kw["key_buffer"][locs, g], k[rows].view(q_len, kv_heads, dim)[:, g]], 0
            )
            vals = torch.cat(
                [kw["value_buffer"][locs, g], v[rows].view(q_len, kv_heads, dim)[:, g]], 0
            )
            qh = q[rows].view(q_len, heads, dim)[:, h]
            expect = torch.softmax(qh @ keys.T * kw["scaling"], -1) @ vals
            got = out[rows].view(q_len, heads, dim)[:, h]
            torch.testing.assert_close(got, expect, atol=1e-5, rtol=1e-5)


def test_draft_forward_never_syncs_with_host(sglang_runtime: None, tmp_path: Path) -> None:
    """The whole SGLang draft forward (attention, window, MoE, norms) reads nothing back."""
    from sglang.srt.model_executor.forward_context import ForwardContext, forward_context

    from dspark_sglang.model.moe import ExpertBank

    case = _draft_case(tmp_path, {})
    batch, model = case.batch, case.model

    def run() -> torch.Tensor:
        with (
            torch.inference_mode(),
            forward_context(ForwardContext(attn_backend=case.pools)),
            host_syncs_raise("the draft forward"),
        ):
            out = model.forward(
                batch.input_ids, batch.positions, batch, input_embeds=batch.input_embeds
            )
        return out.hidden_states

    hidden = run()
    assert hidden.shape == (len(case.ctx_lens) * BLOCK, HIDDEN)
    assert bool(torch.isfinite(hidden).all())

    # Negative control: the training MoE's expert loop in one layer is caught.
    layer_mlp = model.layers[0].mlp
    bank = layer_mlp.experts

    def grouped(x: torch.Tensor) -> torch.Tensor:
        tokens = x.reshape(-1, x.shape[-1])
        weights, experts, _ = route(layer_mlp.gate(tokens), layer_mlp.top_k)
        return ExpertBank.forward(bank, tokens, experts, weights).reshape(x.shape)

    layer_mlp.forward = grouped
    with pytest.raises(HostSyncError, match="tolist"):
        run()
