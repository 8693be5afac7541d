"""``export-drafter --format deepspec`` and ``import-drafter --format deepspec`` on a tiny
random Qwen3 target folder (V=512, H=64, 8 layers; no tokenizer, no download)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from dspark_sglang.cli import main
from dspark_sglang.model import DSparkConfig, DSparkDrafter, save_drafter
from dspark_sglang.model.config import TargetSpec
from dspark_sglang.model.formats.deepspec import check_checkpoint
from dspark_sglang.model.formats.layout import is_deepspec_folder


def _target(folder: Path, vocab: int = 512) -> Path:
    from transformers import Qwen3Config, Qwen3ForCausalLM

    cfg = Qwen3Config(
        vocab_size=vocab, hidden_size=64, intermediate_size=96, num_hidden_layers=8,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=1024,
        rms_norm_eps=1e-6, tie_word_embeddings=False,
    )  # fmt: skip
    torch.manual_seed(0)
    Qwen3ForCausalLM(cfg).save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _target(tmp_path_factory.mktemp("t") / "tiny-qwen3")


def _ours(target: Path, folder: Path, **overrides: object) -> Path:
    from transformers import AutoConfig

    spec = TargetSpec.from_hf_config(AutoConfig.from_pretrained(target), name=target.name)
    fields = dict(mask_token_id=1, ffn_type="dense", sliding_window=None, num_hidden_layers=1,
                  block_size=4, markov_rank=16, target_layer_ids=(1, 3, 5)) | overrides  # fmt: skip
    config = DSparkConfig.for_target(spec, **fields)  # type: ignore[arg-type]
    emb, head = torch.nn.Embedding(512, 64), torch.nn.Linear(64, 512, bias=False)
    torch.manual_seed(1)
    return save_drafter(DSparkDrafter(config, emb, head), folder)


def test_export_then_import_gives_back_our_tensors(
    tmp_path: Path, target: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ours = _ours(target, tmp_path / "ours")
    ds, back = tmp_path / "ds", tmp_path / "back"
    argv = ["export-drafter", "--format", "deepspec", "--from", str(ours), "--to", str(ds)]
    assert main([*argv, "--target", str(target)]) == 0  # bfloat16 by default
    assert is_deepspec_folder(ds)
    cfg = check_checkpoint(ds, json.loads((target / "config.json").read_text()))
    assert cfg.torch_dtype == "bfloat16" and cfg.block_size == 4
    stored = load_file(str(ds / "model.safetensors"))
    assert {t.dtype for t in stored.values()} == {torch.bfloat16}
    argv = ["import-drafter", "--format", "deepspec", "--from", str(ds), "--to", str(back)]
    assert main([*argv, "--target", str(target)]) == 0
    want = {k: t for k, t in stored.items() if k not in ("embed_tokens.weight", "lm_head.weight")}
    got = load_file(str(back / "model.safetensors"))
    assert set(got) == set(want) and all(torch.equal(got[k], want[k]) for k in want)
    assert main([*argv, "--target", str(target)]) == 2  # --to is no longer empty
    assert "exists and is not an empty folder" in capsys.readouterr().err


def test_what_deepspec_cannot_hold_is_refused_by_name(
    tmp_path: Path, target: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    moe = _ours(target, tmp_path / "moe", ffn_type="moe", sliding_window=8)
    argv = ["export-drafter", "--format", "deepspec", "--to", str(tmp_path / "ds")]
    assert main([*argv, "--from", str(moe), "--target", str(target)]) == 2
    assert "ffn_type='moe' ('dense' needed" in capsys.readouterr().err
    assert not (tmp_path / "ds").exists()
    dense = _ours(target, tmp_path / "dense")
    flags = ["--draft-vocab-size", "8", "--draft-vocab-data", str(tmp_path)]
    assert main([*argv, "--from", str(dense), "--target", str(target), *flags]) == 2
    assert "--draft-vocab-size, --draft-vocab-data: DeepSpec's layout has no token map" in (
        capsys.readouterr().err
    )


def test_import_checks_the_target_and_the_layout(
    tmp_path: Path, target: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ours = _ours(target, tmp_path / "ours")
    ds = tmp_path / "ds"
    argv = ["export-drafter", "--format", "deepspec", "--from", str(ours), "--to", str(ds)]
    assert main([*argv, "--target", str(target)]) == 0
    other = _target(tmp_path / "wide-vocab", vocab=1024)
    imp = ["import-drafter", "--format", "deepspec", "--to", str(tmp_path / "back")]
    assert main([*imp, "--from", str(ds), "--target", str(other)]) == 2
    assert "vocab_size=512 but the target's vocab_size is 1024" in capsys.readouterr().err
    assert main([*imp, "--from", str(ours), "--target", str(target)]) == 2
    assert "not a DeepSpec drafter folder" in capsys.readouterr().err
    assert not (tmp_path / "back").exists()


def test_the_help_teaches_the_formats(capsys: pytest.CaptureFixture[str]) -> None:
    for command in ("import-drafter", "export-drafter"):
        with pytest.raises(SystemExit):
            main([command, "--help"])
        out = capsys.readouterr().out
        assert "--format" in out and "deepspec" in out and "Qwen3DSparkModel" in out
