"""``import-drafter --format speculators`` on a tiny random Qwen3 target folder (V=512, H=64,
8 layers; no tokenizer, no download); the checkpoint is written from speculators' layout
(``tests/speculators_layout.py``)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from speculators_layout import from_drafter, save_speculators

from dspark_sglang.cli import main
from dspark_sglang.model import DSparkConfig, DSparkDrafter
from dspark_sglang.model.checkpoint import CheckpointError, load_drafter
from dspark_sglang.model.config import TargetSpec


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from transformers import Qwen3Config, Qwen3ForCausalLM

    cfg = Qwen3Config(
        vocab_size=512, hidden_size=64, intermediate_size=96, num_hidden_layers=8,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=1024,
        rms_norm_eps=1e-6, tie_word_embeddings=False,
    )  # fmt: skip
    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("t") / "tiny-qwen3"
    Qwen3ForCausalLM(cfg).save_pretrained(folder)
    return folder


def _speculators(target: Path, folder: Path, **config: object) -> Path:
    from transformers import AutoConfig

    spec = TargetSpec.from_hf_config(AutoConfig.from_pretrained(target), name=target.name)
    drafter_cfg = DSparkConfig.for_target(
        spec, mask_token_id=1, ffn_type="dense", sliding_window=None, num_hidden_layers=1,
        block_size=4, markov_rank=16, target_layer_ids=(1, 3, 5),
    )  # fmt: skip
    torch.manual_seed(1)
    emb, head = torch.nn.Embedding(512, 64), torch.nn.Linear(64, 512, bias=False)
    cfg, tensors = from_drafter(DSparkDrafter(drafter_cfg, emb, head), **config)
    return save_speculators(folder, cfg, tensors)


def test_import_writes_our_checkpoint(
    tmp_path: Path, target: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src, out = _speculators(target, tmp_path / "spec"), tmp_path / "ours"
    argv = ["import-drafter", "--format", "speculators", "--from", str(src), "--to", str(out)]
    assert main([*argv, "--target", str(target)]) == 0
    stored = load_file(str(src / "model.safetensors"))
    got = load_file(str(out / "model.safetensors"))
    assert set(stored) - set(got) == {"embed_tokens.weight", "lm_head.weight"}
    assert all(torch.equal(got[k], stored[k]) for k in got)
    from transformers import AutoConfig

    spec = TargetSpec.from_hf_config(AutoConfig.from_pretrained(target), name=target.name)
    emb, head = torch.nn.Embedding(512, 64), torch.nn.Linear(64, 512, bias=False)
    assert load_drafter(out, spec, emb, head).config.target_layer_ids == (1, 3, 5)
    with pytest.raises(CheckpointError, match=r"speculators DSpark drafter.*--format speculators"):
        load_drafter(src, spec, emb, head)  # our loader names the importer


def test_the_slot_layout_is_never_guessed(
    tmp_path: Path, target: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    old = _speculators(target, tmp_path / "old", sample_from_anchor=None)
    argv = [
        "import-drafter",
        "--format",
        "speculators",
        "--from",
        str(old),
        "--target",
        str(target),
    ]
    assert main([*argv, "--to", str(tmp_path / "a")]) == 2
    assert "sample_from_anchor: missing" in capsys.readouterr().err
    assert main([*argv, "--to", str(tmp_path / "a"), "--sample-from-anchor", "true"]) == 2
    assert "speculative_tokens=3 != block_size=4" in capsys.readouterr().err  # the file: 1+N
    one_n = _speculators(target, tmp_path / "1n", sample_from_anchor=False)
    argv[argv.index(str(old))] = str(one_n)
    assert main([*argv, "--to", str(tmp_path / "a")]) == 2
    assert "a 1+N checkpoint" in capsys.readouterr().err
    assert not (tmp_path / "a").exists()


def test_other_layouts_are_refused(
    tmp_path: Path, target: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = _speculators(target, tmp_path / "spec")
    imp = ["import-drafter", "--to", str(tmp_path / "a"), "--target", str(target)]
    assert main([*imp, "--format", "deepspec", "--from", str(src)]) == 2
    assert "not a DeepSpec drafter folder" in capsys.readouterr().err
    assert main([*imp, "--format", "speculators", "--from", str(tmp_path)]) == 2
    assert "not a speculators DSpark folder" in capsys.readouterr().err
    flag = ["--sample-from-anchor", "true"]
    assert main([*imp, "--format", "deepspec", "--from", str(src), *flag]) == 2
    assert "--sample-from-anchor is for --format speculators only" in capsys.readouterr().err
