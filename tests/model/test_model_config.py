"""DSparkConfig / TargetSpec: validation, defaults and the exact HF-JSON round trip."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from transformers import LlamaConfig, Qwen3Config

from dspark_sglang.model.config import DSparkConfig, TargetSpec, default_target_layer_ids


def test_target_spec_from_llama_smollm2_config() -> None:
    # SmolLM2-135M's published hyperparameters (transformers 5 keeps rope_theta
    # inside rope_parameters; head_dim follows hidden/heads).
    cfg = LlamaConfig(
        vocab_size=49152,
        hidden_size=576,
        num_hidden_layers=30,
        num_attention_heads=9,
        num_key_value_heads=3,
        rms_norm_eps=1e-5,
        max_position_embeddings=8192,
        rope_parameters={"rope_type": "default", "rope_theta": 100000.0},
    )
    spec = TargetSpec.from_hf_config(cfg, "smollm2-135m")
    assert spec == TargetSpec(
        name="smollm2-135m",
        vocab_size=49152,
        hidden_size=576,
        num_layers=30,
        num_attention_heads=9,
        num_key_value_heads=3,
        head_dim=64,
        rope_theta=100000.0,
        rms_norm_eps=1e-5,
        max_position_embeddings=8192,
    )


def test_target_spec_from_qwen3_config_and_dict() -> None:
    cfg = Qwen3Config(
        vocab_size=1000,
        hidden_size=256,
        num_hidden_layers=6,
        num_attention_heads=8,
        num_key_value_heads=4,
        head_dim=48,
        max_position_embeddings=4096,
    )
    spec = TargetSpec.from_hf_config(cfg, "qwen3-mini")
    assert (spec.head_dim, spec.num_key_value_heads, spec.rope_theta) == (48, 4, 10000.0)
    legacy = {
        "vocab_size": 1000,
        "hidden_size": 256,
        "num_hidden_layers": 6,
        "num_attention_heads": 8,
        "rms_norm_eps": 1e-6,
        "max_position_embeddings": 4096,
        "rope_theta": 5e5,
    }
    from_dict = TargetSpec.from_hf_config(legacy, "legacy")
    assert (from_dict.head_dim, from_dict.num_key_value_heads, from_dict.rope_theta) == (
        32,
        8,
        5e5,
    )
    with pytest.raises(ValueError, match="rope_theta"):
        TargetSpec.from_hf_config({k: v for k, v in legacy.items() if k != "rope_theta"}, "x")


def test_default_target_layer_ids_spread_and_never_last() -> None:
    assert default_target_layer_ids(30) == (1, 8, 14, 20, 27)
    assert default_target_layer_ids(36) == (1, 9, 17, 25, 33)
    for layers in range(2, 40):
        ids = default_target_layer_ids(layers)
        assert ids == tuple(sorted(set(ids)))
        assert ids[0] >= 0 and ids[-1] < layers - 1


def test_for_target_defaults(tiny_target: TargetSpec) -> None:
    cfg = DSparkConfig.for_target(tiny_target, mask_token_id=7)
    assert cfg.hidden_size == cfg.target_hidden_size == tiny_target.hidden_size
    assert (cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim) == (4, 2, 16)
    assert cfg.target_layer_ids == default_target_layer_ids(8) == (1, 2, 3, 4, 5)
    assert (cfg.num_hidden_layers, cfg.block_size, cfg.sliding_window) == (3, 7, 128)
    assert (cfg.ffn_type, cfg.markov_head_type, cfg.markov_rank) == ("moe", "vanilla", 256)
    assert cfg.slot_convention == "anchor_next"
    assert cfg.target_name == "tiny-target" and cfg.mask_token_id == 7
    with pytest.raises(ValueError, match="unknown overrides"):
        DSparkConfig.for_target(tiny_target, mask_token_id=7, blocksize=5)


@pytest.mark.parametrize(
    ("override", "field"),
    [
        ({"hidden_size": 32}, "hidden_size"),
        ({"num_key_value_heads": 3}, "num_key_value_heads"),
        ({"head_dim": 15}, "head_dim"),
        ({"block_size": 17}, "block_size"),
        ({"block_size": 0}, "block_size"),
        ({"target_layer_ids": (1, 7)}, "target_layer_ids"),
        ({"target_layer_ids": ()}, "target_layer_ids"),
        ({"target_layer_ids": (2, 2)}, "target_layer_ids"),
        ({"target_layer_ids": (-1,)}, "target_layer_ids"),
        ({"mask_token_id": 512}, "mask_token_id"),
        ({"slot_convention": "eagle"}, "slot_convention"),
        ({"sliding_window": 0}, "sliding_window"),
        ({"ffn_type": "sparse"}, "ffn_type"),
        ({"num_experts_per_tok": 9}, "num_experts_per_tok"),
        ({"markov_head_type": "lstm"}, "markov_head_type"),
        ({"markov_rank": 0}, "markov_rank"),
        ({"markov_head_type": "none"}, "confidence_head_with_markov"),
        ({"qk_norm": 1}, "qk_norm"),
        ({"rms_norm_eps": float("nan")}, "rms_norm_eps"),
        ({"num_hidden_layers": True}, "num_hidden_layers"),
        ({"target_name": ""}, "target_name"),
    ],
)
def test_every_bad_field_is_named(
    make_config: Callable[..., DSparkConfig], override: dict[str, Any], field: str
) -> None:
    with pytest.raises(ValueError, match=f"DSparkConfig.{field}"):
        make_config(**override)


def test_dflash_style_drafter_is_allowed_without_markov_confidence(
    make_config: Callable[..., DSparkConfig],
) -> None:
    cfg = make_config(markov_head_type="none", confidence_head_with_markov=False)
    assert cfg.markov_head_type == "none"


def test_hf_round_trip_is_exact_through_json(make_config: Callable[..., DSparkConfig]) -> None:
    for cfg in (
        make_config(),
        make_config(sliding_window=None, ffn_type="dense", markov_head_type="rnn"),
        make_config(slot_convention="dflash", rope_theta=12345.678, rms_norm_eps=1e-5),
    ):
        hf = json.loads(json.dumps(cfg.to_hf_dict()))
        assert DSparkConfig.from_hf_dict(hf) == cfg
        assert hf["architectures"] == ["DSparkMoEDraftModel"]
        assert hf["model_type"] == "dspark_moe"
        assert hf["num_hidden_layers"] == cfg.num_hidden_layers
        assert hf["sliding_window"] == cfg.sliding_window
        assert hf["dflash_config"] == {
            "block_size": cfg.block_size,
            "target_layer_ids": list(cfg.target_layer_ids),
            "mask_token_id": cfg.mask_token_id,
        }
        assert set(hf["dspark_config"]) == {f for f in cfg.to_dict()}


def test_hf_dict_refuses_unknown_missing_and_inconsistent_keys(
    make_config: Callable[..., DSparkConfig],
) -> None:
    good = make_config().to_hf_dict()

    def variant(mutate: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
        d = json.loads(json.dumps(good))
        mutate(d)
        return d

    cases: list[tuple[Callable[[dict[str, Any]], None], str]] = [
        (lambda d: d.update(extra=1), "unknown top-level keys \\['extra'\\]"),
        (lambda d: d.pop("vocab_size"), "missing top-level keys \\['vocab_size'\\]"),
        (lambda d: d["dspark_config"].update(foo=1), "unknown keys \\['foo'\\]"),
        (lambda d: d["dspark_config"].pop("markov_rank"), "missing keys \\['markov_rank'\\]"),
        (lambda d: d.update(hidden_size=65), "top-level hidden_size=65 disagrees"),
        (lambda d: d["dflash_config"].update(block_size=5), "dflash_config="),
        (lambda d: d.update(model_type="llama"), "model_type"),
        (lambda d: d.update(architectures=["LlamaForCausalLM"]), "architectures"),
        (lambda d: d["dspark_config"].update(block_size=99), "DSparkConfig.block_size"),
    ]
    for mutate, message in cases:
        with pytest.raises(ValueError, match=message):
            DSparkConfig.from_hf_dict(variant(mutate))
