"""DeepSpec's drafter layout: checked, imported and exported (CPU, no downloads).

DeepSpec checkpoints are built here from the layout itself (names and shapes spelled out
below, as DeepSpec's ``Qwen3DSparkModel`` and ``save_pretrained`` write them, random
tensors from a fixed seed), sized to the tiny target of ``conftest.py`` (V=512, H=64,
8 layers). None is written through ``export_from_ours``.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from deepspec_layout import deepspec_shapes, save_deepspec
from safetensors.torch import load_file
from sglang_runtime import single_process_runtime
from torch import nn

from dspark_sglang.model.checkpoint import CheckpointError, load_drafter, save_drafter
from dspark_sglang.model.config import DSparkConfig, TargetSpec
from dspark_sglang.model.drafter import DSparkDrafter
from dspark_sglang.model.formats import deepspec
from dspark_sglang.model.formats.deepspec import (
    DeepSpecConfig,
    check_checkpoint,
    export_from_ours,
    import_to_ours,
)

Modules = Callable[..., tuple[nn.Embedding, nn.Linear]]
V, H, TARGET_LAYERS = 512, 64, 8
HEADS, KV_HEADS, HEAD_DIM, INTER, RANK = 4, 2, 16, 96, 32
# The target's config.json as a dict (what check_checkpoint compares against).
TARGET_HF: dict[str, Any] = {
    "model_type": "qwen3", "hidden_size": H, "vocab_size": V,
    "num_hidden_layers": TARGET_LAYERS, "num_attention_heads": HEADS,
    "num_key_value_heads": KV_HEADS, "head_dim": HEAD_DIM,
}  # fmt: skip
# Fields our MoE drafter has and a dense DeepSpec drafter does not (unused when dense).
MOE_ONLY = ("num_experts", "num_experts_per_tok", "moe_intermediate_size", "shared_expert",
            "shared_expert_intermediate_size")  # fmt: skip


def deepspec_config(**overrides: Any) -> dict[str, Any]:
    """A DeepSpec ``config.json`` as transformers 5 writes it: the target's keys copied,
    then the draft fields ``build_draft_config`` sets."""
    cfg: dict[str, Any] = {
        "architectures": ["Qwen3DSparkModel"], "model_type": "qwen3",
        "bos_token_id": 0, "eos_token_id": 2, "initializer_range": 0.02,
        "max_window_layers": TARGET_LAYERS, "transformers_version": "5.10.2",
        "hidden_size": H, "num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS,
        "head_dim": HEAD_DIM, "intermediate_size": INTER, "vocab_size": V,
        "max_position_embeddings": 1024, "rms_norm_eps": 1e-6, "hidden_act": "silu",
        "attention_bias": False, "attention_dropout": 0.0, "use_sliding_window": False,
        "sliding_window": None, "rope_parameters": {"rope_type": "default", "rope_theta": 1e4},
        "dtype": "bfloat16", "num_hidden_layers": 2, "num_target_layers": TARGET_LAYERS,
        "block_size": 7, "tie_word_embeddings": False, "layer_types": ["full_attention"] * 2,
        "mask_token_id": 1, "target_layer_ids": [1, 3, 5], "num_anchors": 512,
        "enable_confidence_head": True, "confidence_head_with_markov": True,
        "markov_rank": RANK, "markov_head_type": "vanilla",
    }  # fmt: skip
    cfg.update(overrides)
    return cfg


def write_deepspec(
    folder: Path,
    cfg: dict[str, Any] | None = None,
    edit: Callable[[dict[str, torch.Tensor]], None] | None = None,
    seed: int = 0,
) -> Path:
    """A DeepSpec drafter folder: ``config.json`` + ``model.safetensors`` (bfloat16)."""
    cfg = deepspec_config() if cfg is None else cfg
    g = torch.Generator().manual_seed(seed)
    tensors = {
        name: torch.randn(shape, generator=g).to(torch.bfloat16)
        for name, shape in sorted(deepspec_shapes(cfg).items())
    }
    if edit is not None:
        edit(tensors)
    return save_deepspec(folder, cfg, tensors)


def same_bytes(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> list[str]:
    """Names whose tensors differ in dtype, shape or bytes (or exist on one side only)."""
    return sorted(
        k
        for k in set(a) | set(b)
        if k not in a
        or k not in b
        or a[k].dtype != b[k].dtype
        or a[k].shape != b[k].shape
        or not torch.equal(a[k].contiguous().view(torch.uint8), b[k].contiguous().view(torch.uint8))
    )


# --------------------------------------------------------------------------- valid


@pytest.mark.parametrize(
    "overrides",
    [
        {},
        {"markov_head_type": "gated"},
        {"markov_head_type": "rnn", "confidence_head_with_markov": False},
        # transformers 4 spelling: top-level rope_theta, torch_dtype, no rope_parameters.
        {"rope_parameters": None, "rope_theta": 1e4, "dtype": None, "torch_dtype": "bfloat16"},
        # transformers 5 folds a plain partial_rotary_factor into rope_parameters.
        {
            "rope_parameters": {
                "rope_type": "default",
                "rope_theta": 1e4,
                "partial_rotary_factor": 1.0,
            }
        },
    ],
)
def test_valid_checkpoint_passes(tmp_path: Path, overrides: dict[str, Any]) -> None:
    folder = write_deepspec(tmp_path / "ds", deepspec_config(**overrides))
    cfg = check_checkpoint(folder, TARGET_HF)
    assert cfg.target_layer_ids == (1, 3, 5) and cfg.block_size == 7 and cfg.rope_theta == 1e4
    assert cfg.markov_head_type == overrides.get("markov_head_type", "vanilla")
    assert cfg.torch_dtype == "bfloat16"
    assert deepspec.expected_tensors(cfg) == deepspec_shapes(deepspec_config(**overrides))


def test_check_reads_headers_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = write_deepspec(tmp_path / "ds")

    def no_data(*_: object, **__: object) -> None:
        raise AssertionError("check_checkpoint loaded tensor data")

    monkeypatch.setattr(deepspec, "_load_tensors", no_data)  # the only tensor-data reader
    check_checkpoint(folder, TARGET_HF)


# --------------------------------------------------------------------------- round trips


@pytest.mark.parametrize(
    "overrides",
    [
        {},
        {"markov_head_type": "gated", "block_size": 4, "target_layer_ids": [0, 6]},
        {"markov_head_type": "rnn", "confidence_head_with_markov": False},
    ],
)
def test_deepspec_import_export_is_byte_equal(
    tmp_path: Path, tiny_target: TargetSpec, overrides: dict[str, Any]
) -> None:
    original = write_deepspec(tmp_path / "ds", deepspec_config(**overrides), seed=3)
    ours = import_to_ours(original, tmp_path / "ours", target_name=tiny_target.name)
    src = load_file(str(original / "model.safetensors"))
    # Our format keeps the drafter only; it loads through our own strict loader.
    assert same_bytes(load_file(str(ours / "model.safetensors")), src) == [
        "embed_tokens.weight",
        "lm_head.weight",
    ]
    emb, head = nn.Embedding(V, H), nn.Linear(H, V, bias=False)
    drafter = load_drafter(ours, tiny_target, emb, head)
    assert drafter.config.ffn_type == "dense" and drafter.config.sliding_window is None
    assert drafter.config.target_layer_ids == tuple(
        deepspec_config(**overrides)["target_layer_ids"]
    )
    back = export_from_ours(
        ours,
        tmp_path / "back",
        embed_tokens=src["embed_tokens.weight"],
        lm_head=src["lm_head.weight"],
    )
    assert same_bytes(load_file(str(back / "model.safetensors")), src) == []
    before = DeepSpecConfig.from_hf_dict(json.loads((original / "config.json").read_text()))
    after = DeepSpecConfig.from_hf_dict(json.loads((back / "config.json").read_text()))
    assert after == dataclasses.replace(before, target_name=tiny_target.name)
    assert check_checkpoint(back, TARGET_HF) == after


@pytest.mark.parametrize(
    "overrides",
    [{}, {"markov_head_type": "gated"}, {"markov_head_type": "rnn", "target_layer_ids": (2, 6)}],
)
def test_our_dense_drafter_exports_and_imports_back(
    tmp_path: Path,
    make_drafter: Callable[..., DSparkDrafter],
    make_target_modules: Modules,
    overrides: dict[str, Any],
) -> None:
    drafter = make_drafter(ffn_type="dense", sliding_window=None, **overrides)
    ours = save_drafter(drafter, tmp_path / "ours", dtype=torch.bfloat16)
    emb, head = make_target_modules()
    out = export_from_ours(ours, tmp_path / "ds", embed_tokens=emb.weight, lm_head=head.weight)
    cfg = check_checkpoint(out, TARGET_HF)
    raw = json.loads((out / "config.json").read_text())
    for key in ("num_anchors", "dtype", "layer_types", "sample_from_anchor", "hidden_act",
                "tie_word_embeddings", "attention_bias", "num_target_layers"):  # fmt: skip
        assert key in raw, key  # every convention field is written explicitly
    assert raw["architectures"] == ["Qwen3DSparkModel"] and raw["sample_from_anchor"] is True
    assert cfg.target_layer_ids == drafter.config.target_layer_ids
    exported = load_file(str(out / "model.safetensors"))
    want = deepspec_shapes(raw | {"target_layer_ids": list(cfg.target_layer_ids)})
    assert {k: tuple(t.shape) for k, t in exported.items()} == want
    assert torch.equal(exported["lm_head.weight"], head.weight.detach().to(torch.bfloat16))
    back = import_to_ours(out, tmp_path / "back")  # the exported config names the target
    saved = load_file(str(ours / "model.safetensors"))
    assert same_bytes(load_file(str(back / "model.safetensors")), saved) == []
    got = DSparkConfig.from_hf_dict(json.loads((back / "config.json").read_text()))
    keep = {f.name for f in dataclasses.fields(DSparkConfig)} - set(MOE_ONLY)
    assert {k: getattr(got, k) for k in keep} == {k: getattr(drafter.config, k) for k in keep}


def test_export_of_a_tied_target_writes_two_tensors(
    tmp_path: Path, make_drafter: Callable[..., DSparkDrafter]
) -> None:
    """A target with tied embeddings (SmolLM2, small Qwen3s) passes one tensor as both."""
    drafter = make_drafter(ffn_type="dense", sliding_window=None)
    ours = save_drafter(drafter, tmp_path / "ours")  # float32: no cast that would copy
    tied = drafter.embed_tokens.weight
    out = export_from_ours(ours, tmp_path / "ds", embed_tokens=tied, lm_head=tied)
    stored = load_file(str(out / "model.safetensors"))
    assert torch.equal(stored["embed_tokens.weight"], stored["lm_head.weight"])


# --------------------------------------------------------------------------- refusals


def _drop(name: str) -> Callable[[dict[str, torch.Tensor]], None]:
    return lambda t: t.pop(name)


def _set(name: str, value: torch.Tensor) -> Callable[[dict[str, torch.Tensor]], None]:
    return lambda t: t.__setitem__(name, value)


@pytest.mark.parametrize(
    ("cfg", "edit", "target", "match"),
    [
        (None, _drop("confidence_head.proj.bias"), None, r"confidence_head\.proj\.bias"),
        (None, _drop("markov_head.markov_w2.weight"), None, r"markov_w2"),
        (None, _set("fc.weight", torch.zeros(H, 2 * H, dtype=torch.bfloat16)), None,
         r"'fc\.weight' has shape \(64, 128\).*\(64, 192\)"),
        (None, _set("norm.weight", torch.zeros(H, dtype=torch.int32)), None,
         r"'norm\.weight' has dtype I32"),
        (None, _set("extra.weight", torch.zeros(1, dtype=torch.bfloat16)), None,
         r"unexpected \['extra\.weight'\]"),
        # the last layer (7 of 8) is never captured; refused by the config itself ...
        ({"target_layer_ids": [1, 3, 7]}, None, None, r"target_layer_ids\[2\]=7.*last layer"),
        # ... and against a target shallower than the checkpoint says
        ({"num_target_layers": 12, "target_layer_ids": [1, 3, 7]}, None, TARGET_HF,
         r"target_layer_ids\[2\]=7 but the target has 8 layers"),
        ({}, None, TARGET_HF | {"vocab_size": 1024}, r"vocab_size=512 but the target's vocab"),
        ({}, None, TARGET_HF | {"hidden_size": 128}, r"hidden_size=64 but the target's hidden"),
        ({"num_target_layers": 12}, None, TARGET_HF, r"num_target_layers=12 but the target's"),
        ({"markov_head_type": "lstm"}, None, None, r"markov_head_type must be one of"),
        ({"block_size": 17}, None, None, r"block_size=17 > 16, the largest block"),
    ],
)  # fmt: skip
def test_malformed_checkpoints_are_refused_by_name(
    tmp_path: Path,
    cfg: dict[str, Any] | None,
    edit: Callable[[dict[str, torch.Tensor]], None] | None,
    target: dict[str, Any] | None,
    match: str,
) -> None:
    config = deepspec_config(**(cfg or {}))
    folder = write_deepspec(tmp_path / "ds", config, edit)
    with pytest.raises(CheckpointError, match=match):
        check_checkpoint(folder, target)
    if target is None:  # import runs the same checks, and writes nothing
        with pytest.raises(CheckpointError, match=match):
            import_to_ours(folder, tmp_path / "ours", target_name="tiny-target")
        assert not (tmp_path / "ours").exists()


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        ({"hidden_size": "64"}, r"hidden_size must be an int"),
        ({"vocab_size": 2**40}, r"vocab_size=1099511627776 must lie in .*corrupt"),
        ({"markov_rank": 0}, r"markov_rank=0 .*Markov head"),
        ({"block_size": 0}, r"block_size=0 must lie in \[1,"),
        ({"target_layer_ids": []}, r"target_layer_ids must be a non-empty"),
        ({"target_layer_ids": [5, 3]}, r"target_layer_ids must be strictly increasing"),
        ({"target_layer_ids": [3, 3]}, r"target_layer_ids must be strictly increasing"),
        ({"target_layer_ids": [-1, 3]}, r"target_layer_ids\[0\]=-1 must lie in \[0, 7\].*-1"),
        ({"enable_confidence_head": False}, r"enable_confidence_head=False .*SGLang"),
        ({"confidence_head_with_markov": "yes"}, r"confidence_head_with_markov must be true"),
        ({"architectures": ["Gemma4DSparkModel"]}, r"architectures"),
        ({"sample_from_anchor": False}, r"sample_from_anchor=False .*one slot off"),
        ({"tie_word_embeddings": True}, r"tie_word_embeddings"),
        ({"attention_bias": True}, r"attention_bias"),
        ({"mask_token_id": 512}, r"mask_token_id=512 must lie in \[0, 511\]"),
        ({"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0}},
         r"rope_parameters=.*not plain RoPE"),
        ({"rope_parameters": {"rope_type": "default", "rope_theta": 1e4,
                              "partial_rotary_factor": 0.5}}, r"rope_parameters=.*not plain"),
        ({"rope_theta": 5e5}, r"rope_theta=500000.0 but rope_parameters has 10000.0"),
        ({"layer_types": ["full_attention", "sliding_attention"]}, r"layer_types"),
        ({"is_causal": True}, r"is_causal"),
        ({"dflash_config": {"block_size": 7}}, r"'dflash_config'.*another layout"),
        ({"num_anchors": None}, r"num_anchors must be an int"),
        ({"head_dim": 15}, r"head_dim=15 must be even"),
    ],
)  # fmt: skip
def test_config_fields_are_validated_by_name(overrides: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        DeepSpecConfig.from_hf_dict(deepspec_config(**overrides))


def test_missing_config_fields_are_named() -> None:
    raw = deepspec_config()
    del raw["num_target_layers"], raw["head_dim"]
    with pytest.raises(ValueError, match=r"missing \['head_dim', 'num_target_layers'\]"):
        DeepSpecConfig.from_hf_dict(raw)


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        ({}, r"ffn_type='moe' \('dense' needed"),
        ({"ffn_type": "dense"}, r"sliding_window=8 \(None needed"),
        ({"ffn_type": "dense", "sliding_window": None, "qk_norm": False}, r"qk_norm=False"),
        ({"ffn_type": "dense", "sliding_window": None, "markov_head_type": "none",
          "confidence_head_with_markov": False}, r"markov_head_type must be one of"),
    ],
)  # fmt: skip
def test_export_refuses_what_deepspec_cannot_express(
    tmp_path: Path,
    make_drafter: Callable[..., DSparkDrafter],
    make_target_modules: Modules,
    overrides: dict[str, Any],
    match: str,
) -> None:
    ours = save_drafter(make_drafter(**overrides), tmp_path / "ours")
    emb, head = make_target_modules()
    with pytest.raises(ValueError, match=match):
        export_from_ours(ours, tmp_path / "ds", embed_tokens=emb.weight, lm_head=head.weight)
    assert not (tmp_path / "ds").exists()  # nothing half-written


def test_export_refuses_a_wrong_target_embedding(
    tmp_path: Path, make_drafter: Callable[..., DSparkDrafter]
) -> None:
    ours = save_drafter(make_drafter(ffn_type="dense", sliding_window=None), tmp_path / "ours")
    with pytest.raises(CheckpointError, match=r"embed_tokens\.weight"):
        export_from_ours(
            ours, tmp_path / "ds", embed_tokens=torch.zeros(V, H + 1), lm_head=torch.zeros(V, H)
        )
    assert not (tmp_path / "ds").exists()


def test_import_needs_a_target_name(tmp_path: Path) -> None:
    folder = write_deepspec(tmp_path / "ds")
    with pytest.raises(CheckpointError, match=r"target_name="):
        import_to_ours(folder, tmp_path / "ours")


def test_truncated_weights_are_refused(tmp_path: Path) -> None:
    folder = write_deepspec(tmp_path / "ds")
    path = folder / "model.safetensors"
    path.write_bytes(path.read_bytes()[:-10])
    with pytest.raises(CheckpointError, match=r"not a readable safetensors file"):
        check_checkpoint(folder)


def test_import_refuses_mixed_precisions(tmp_path: Path) -> None:
    mixed = _set("norm.weight", torch.ones(H, dtype=torch.float32))
    folder = write_deepspec(tmp_path / "ds", edit=mixed)
    check_checkpoint(folder, TARGET_HF)  # SGLang casts on load; our format keeps one dtype
    with pytest.raises(CheckpointError, match=r"\['bfloat16', 'float32'\]; cast them"):
        import_to_ours(folder, tmp_path / "ours", target_name="tiny-target")
    assert not (tmp_path / "ours").exists()


# --------------------------------------------------------------------------- SGLang


@pytest.fixture(scope="module")
def sglang_runtime() -> Iterator[None]:
    """SGLang's single-process tp=1 runtime (``sglang_runtime.single_process_runtime``)."""
    with single_process_runtime():
        yield


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("head_type", ["vanilla", "gated", "rnn"])
def test_sglang_dense_class_drafts_as_ours_from_the_export(
    sglang_runtime: None,
    tmp_path: Path,
    make_drafter: Callable[..., DSparkDrafter],
    head_type: str,
) -> None:
    """SGLang's own ``Qwen3DSparkModel``, built from the exported folder (its config read by
    transformers, its weights by its own ``load_weights``), computes our drafter's block:
    context injected through ``write_target_hidden_kv``, the block run by ``forward`` over
    SGLang's torch-native attention backend, then base logits, Markov steps and confidence."""
    from sglang.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend
    from sglang.srt.layers.vocab_parallel_embedding import ParallelLMHead
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool
    from sglang.srt.model_executor.forward_batch_info import (
        CaptureHiddenMode,
        ForwardBatch,
        ForwardMode,
    )
    from sglang.srt.model_executor.forward_context import ForwardContext, forward_context
    from sglang.srt.models.dspark import Qwen3DSparkModel
    from sglang.srt.speculative.dspark_components.dspark_config import (
        get_dspark_sample_from_anchor,
        parse_dspark_draft_config,
    )
    from transformers import AutoConfig

    from dspark_sglang.model import markov_logits

    drafter = make_drafter(
        1, ffn_type="dense", sliding_window=None, markov_head_type=head_type, block_size=4
    )
    cfg, b = drafter.config, drafter.config.block_size
    emb, lm = drafter.embed_tokens.weight, drafter.lm_head.weight
    ours = save_drafter(drafter, tmp_path / "ours")
    folder = export_from_ours(ours, tmp_path / "ds", embed_tokens=emb, lm_head=lm)
    hf = AutoConfig.from_pretrained(folder)
    parsed = parse_dspark_draft_config(draft_hf_config=hf)
    assert (parsed.gamma, parsed.target_layer_ids) == (b, list(cfg.target_layer_ids))
    assert (parsed.mask_token_id, parsed.markov_head_type) == (cfg.mask_token_id, head_type)
    assert get_dspark_sample_from_anchor(hf) is True
    model = Qwen3DSparkModel(hf).eval()
    model.load_weights(load_file(str(folder / "model.safetensors")).items())
    head = ParallelLMHead(V, H)  # pads the vocabulary; SGLang crops the logits to V
    with torch.no_grad():
        head.weight.zero_()
        head.weight[:V].copy_(lm)
    model.attach_shared_modules(embed_tokens=drafter.embed_tokens, lm_head=head)

    gen = torch.Generator().manual_seed(2)
    ctx_lens, feat = [11, 3], cfg.num_context_features * H
    bs = len(ctx_lens)
    pool = MHATokenToKVPool(
        size=64,
        page_size=1,
        dtype=torch.float32,
        head_num=cfg.num_key_value_heads,
        head_dim=cfg.head_dim,
        layer_num=cfg.num_hidden_layers,
        device="cpu",
        enable_memory_saver=False,
    )
    req_to_token = torch.zeros(4, 32, dtype=torch.int32)
    contexts = [torch.randn(n, feat, generator=gen) for n in ctx_lens]
    free, block_locs = iter(range(1, 64)), []  # slot 0 is SGLang's padding slot
    for r, n in enumerate(ctx_lens):
        locs = torch.tensor([next(free) for _ in range(n + b)], dtype=torch.int32)
        req_to_token[r, : n + b] = locs
        block_locs.append(locs[n:])
        with torch.inference_mode():
            model.write_target_hidden_kv(
                target_hidden=contexts[r],
                pool=pool,
                positions=torch.arange(n),
                cache_loc=locs[:n].long(),
            )
    anchors = torch.randint(0, V - 1, (bs,), generator=gen)
    prefix = torch.tensor(ctx_lens)
    ids = anchors[:, None].repeat(1, b)
    ids[:, 1:] = cfg.mask_token_id
    positions = (prefix[:, None] + torch.arange(b)).reshape(-1)
    batch = ForwardBatch(
        forward_mode=ForwardMode.TARGET_VERIFY,
        batch_size=bs,
        input_ids=ids.reshape(-1),
        req_pool_indices=torch.arange(bs),
        seq_lens=prefix + b,
        seq_lens_cpu=prefix + b,
        seq_lens_sum=int((prefix + b).sum()),
        out_cache_loc=torch.cat(block_locs).long(),
        extend_prefix_lens=prefix,
        extend_seq_lens=torch.full((bs,), b),
        positions=positions,
        input_embeds=drafter.embed_tokens(ids.reshape(-1)),
        capture_hidden_mode=CaptureHiddenMode.NULL,
    )
    runner = SimpleNamespace(
        device="cpu",
        token_to_kv_pool=pool,
        req_to_token_pool=SimpleNamespace(req_to_token=req_to_token),
    )
    backend = TorchNativeAttnBackend(runner)
    backend.init_forward_metadata(batch)
    prev = torch.randint(0, V, (bs, b), generator=gen)
    prev[:, 0] = anchors
    with torch.inference_mode(), forward_context(ForwardContext(attn_backend=backend)):
        hidden = model.forward(batch.input_ids, positions, batch, batch.input_embeds).hidden_states
        base, features = model.compute_base_logits(hidden)
        rows = hidden.view(bs, b, -1)
        state, steps = model.markov_head.init_state(rows[:, 0]), []
        for k in range(b):
            bias, state = model.markov_head.step_bias(
                prev[:, k], hidden_states=rows[:, k], state=state
            )
            steps.append(base.view(bs, b, -1)[:, k] + bias)
        _, conf = model.compute_confidence(
            anchor_tokens=anchors,
            confidence_features=features,
            draft_tokens=torch.roll(prev, -1, dims=1),
        )

    c = max(ctx_lens)  # ours: right-aligned padded contexts at positions 0..n-1
    ctx, ctx_pos = torch.zeros(bs, c, feat), torch.zeros(bs, c, dtype=torch.long)
    valid = torch.zeros(bs, c, dtype=torch.bool)
    for r, n in enumerate(ctx_lens):
        ctx[r, c - n :], ctx_pos[r, c - n :], valid[r, c - n :] = contexts[r], torch.arange(n), True
    with torch.inference_mode():
        block = drafter.forward_block(ctx, ctx_pos, valid, anchors, prefix)
        ref = markov_logits(drafter, block, prev)
    assert ref.confidence_logits is not None
    close = {"atol": 2e-5, "rtol": 0.0}
    torch.testing.assert_close(rows, block.hidden, **close)
    torch.testing.assert_close(base.view(bs, b, -1).float(), block.base_logits, **close)
    torch.testing.assert_close(torch.stack(steps, 1).float(), ref.logits, **close)
    torch.testing.assert_close(conf.float(), ref.confidence_logits, **close)
