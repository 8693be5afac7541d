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
import os
import socket
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from dspark_sglang.model import (
    CheckpointError,
    DSparkConfig,
    DSparkDrafter,
    TargetSpec,
    markov_logits,
    save_drafter,
)

pytestmark = pytest.mark.sglang

VOCAB, HIDDEN, LAYERS = 96, 64, 6
WINDOW, BLOCK = 6, 4
ATOL = 2e-5


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def sglang_runtime() -> None:
    """SGLang's single-process tp=1 setup (its layers need the parallel groups)."""
    os.environ.setdefault("SGLANG_RAGGED_VERIFY_MODE", "cap-accept")
    from sglang.srt.distributed import parallel_state
    from sglang.srt.runtime_context import SpawnRanks, get_parallel, publish, reset_context
    from sglang.srt.server_args import ServerArgs

    if not torch.distributed.is_initialized():
        parallel_state.init_distributed_environment(
            world_size=1,
            rank=0,
            local_rank=0,
            backend="gloo",
            distributed_init_method=f"tcp://127.0.0.1:{_free_port()}",
        )
    if not parallel_state.model_parallel_is_initialized():
        reset_context()
        publish(
            ServerArgs(model_path="dummy", device="cpu"),
            role="test",
            ranks=SpawnRanks(world_rank=0),
        )
        get_parallel().override_permanently(world_group=parallel_state._WORLD)
        parallel_state.initialize_model_parallel(backend="gloo")


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


@pytest.mark.parametrize(
    "overrides", [{}, {"markov_head_type": "rnn"}, {"markov_head_type": "gated"}]
)
def test_sglang_class_matches_drafter(
    sglang_runtime: None, tmp_path: Path, overrides: dict[str, Any]
) -> None:
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool
    from sglang.srt.model_executor.forward_batch_info import (
        CaptureHiddenMode,
        ForwardBatch,
        ForwardMode,
    )
    from sglang.srt.model_executor.forward_context import ForwardContext, forward_context

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
    backend_pools = SimpleNamespace(
        token_to_kv_pool=pool, req_to_token_pool=SimpleNamespace(req_to_token=req_to_token)
    )
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

    torch.testing.assert_close(hidden.view(bs, BLOCK, -1), block.hidden, atol=ATOL, rtol=0)
    torch.testing.assert_close(
        base.view(bs, BLOCK, -1).float(), block.base_logits, atol=ATOL, rtol=0
    )
    torch.testing.assert_close(torch.stack(sg_logits, 1).float(), ref.logits, atol=ATOL, rtol=0)
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
