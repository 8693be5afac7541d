"""`dspark-sglang export-drafter`: a trained run becomes a shippable bfloat16 folder + STS."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file
from test_training_trainer import _tiny_cfg, _trainer
from transformers import AutoModelForCausalLM

from dspark_sglang.calibration.sts import StsCalibration
from dspark_sglang.cli import main
from dspark_sglang.model.checkpoint import load_drafter
from dspark_sglang.model.config import TargetSpec


@pytest.fixture(scope="module")
def tiny_run(tiny_data_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("run") / "dspark"
    torch.set_num_threads(1)
    _trainer(_tiny_cfg("dspark", tiny_data_dir, out, steps=2), tiny_data_dir).train(progress=False)
    return out


@pytest.fixture(scope="module")
def target_dir(tiny_target_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny target under the name the tiny run was trained for ("tiny")."""
    path = tmp_path_factory.mktemp("models") / "tiny"
    shutil.copytree(tiny_target_dir, path)
    return path


def _loaded(target_dir: Path, folder: Path) -> Any:
    """The drafter saved in ``folder``, loaded onto the tiny target."""
    model = AutoModelForCausalLM.from_pretrained(str(target_dir)).eval()
    spec = TargetSpec.from_hf_config(model.config, name=target_dir.name)
    return load_drafter(folder, spec, model.get_input_embeddings(), model.get_output_embeddings())


def _sts(path: Path, block: int) -> Path:
    StsCalibration(temperatures=tuple(1.0 + 0.1 * k for k in range(block))).save(path)
    return path


def test_export_ships_bf16_weights_and_the_sts_file(
    tiny_run: Path, target_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "shipped"
    sts = _sts(tmp_path / "sts.json", 4)
    argv = ["export-drafter", "--from", str(tiny_run), "--to", str(out)]
    rc = main([*argv, "--sts", str(sts), "--target", str(target_dir)])
    assert rc == 0, capsys.readouterr().err
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors", "sts.json"]
    assert json.loads((out / "sts.json").read_text()) == json.loads(sts.read_text())
    # A fit on greedy rollouts ships beside it for greedy-only tiers.
    greedy = _sts(tmp_path / "greedy.json", 4)
    rc = main([*argv, "--sts", str(sts), "--sts-greedy", str(greedy), "--target", str(target_dir)])
    assert rc == 0, capsys.readouterr().err
    assert json.loads((out / "sts_greedy.json").read_text()) == json.loads(greedy.read_text())
    stored = load_file(str(out / "model.safetensors"))
    assert {t.dtype for t in stored.values() if t.is_floating_point()} == {torch.bfloat16}
    # Loads against the target and equals the latest training checkpoint rounded to bf16.
    model = AutoModelForCausalLM.from_pretrained(str(target_dir))
    spec = TargetSpec.from_hf_config(model.config, name=target_dir.name)
    emb, head = model.get_input_embeddings(), model.get_output_embeddings()
    shipped = load_drafter(out, spec, emb, head)
    latest = load_drafter(tiny_run / "checkpoints" / "step-000002" / "drafter", spec, emb, head)
    for name, t in latest.state_dict().items():
        assert torch.equal(shipped.state_dict()[name], t.to(torch.bfloat16).to(t.dtype)), name


def test_export_keeps_other_files_and_drops_a_stale_sts(
    tiny_run: Path, target_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "shipped"
    out.mkdir()
    (out / "README.md").write_text("provenance of the shipped drafter\n")
    _sts(out / "sts.json", 4)  # from an earlier drafter
    _sts(out / "sts_greedy.json", 4)  # so is this one
    rc = main(
        ["export-drafter", "--from", str(tiny_run), "--to", str(out), "--target", str(target_dir)]
    )
    assert rc == 0, capsys.readouterr().err
    assert sorted(p.name for p in out.iterdir()) == [
        "README.md",
        "config.json",
        "model.safetensors",
    ]
    assert (out / "README.md").read_text() == "provenance of the shipped drafter\n"
    assert "kept README.md" in capsys.readouterr().out


def test_export_refuses_mismatched_sts_and_missing_target(
    tiny_run: Path, target_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "shipped"
    base = ["export-drafter", "--from", str(tiny_run), "--to", str(out)]
    rc = main([*base, "--sts", str(_sts(tmp_path / "s7.json", 7)), "--target", str(target_dir)])
    assert rc == 2 and "--sts has 7 temperatures" in capsys.readouterr().err
    greedy7 = str(_sts(tmp_path / "g7.json", 7))
    rc = main([*base, "--sts-greedy", greedy7, "--target", str(target_dir)])
    assert rc == 2 and "--sts-greedy has 7 temperatures" in capsys.readouterr().err
    rc = main([*base, "--target", str(tmp_path / "nope")])
    assert rc == 2 and "--target" in capsys.readouterr().err
    assert not out.exists()


def test_export_narrows_the_drafter_to_a_token_map_of_the_data(
    tiny_run: Path,
    tiny_data_dir: Path,
    target_dir: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from dspark_sglang.training.token_map import build_draft_vocab

    out = tmp_path / "shipped"
    base = ["export-drafter", "--from", str(tiny_run), "--to", str(out), "--target"]
    base += [str(target_dir), "--dtype", "float32", "--draft-vocab-size", "16"]
    rc = main(base)
    assert rc == 2 and "go together" in capsys.readouterr().err
    assert not out.exists()
    rc = main([*base, "--draft-vocab-data", str(tiny_data_dir)])
    printed = capsys.readouterr()
    assert rc == 0, printed.err
    assert "token map: 16 of" in printed.out
    model = AutoModelForCausalLM.from_pretrained(str(target_dir))
    spec = TargetSpec.from_hf_config(model.config, name=target_dir.name)
    emb, head = model.get_input_embeddings(), model.get_output_embeddings()
    shipped = load_drafter(out, spec, emb, head)
    latest = load_drafter(tiny_run / "checkpoints" / "step-000002" / "drafter", spec, emb, head)
    vocab = build_draft_vocab(tiny_data_dir, spec.vocab_size, 16)
    assert shipped.config.draft_vocab_size == 16
    assert torch.equal(shipped.draft_vocab.ids, vocab.ids)
    w2 = "markov_head.markov_w2.weight"
    assert torch.equal(shipped.state_dict()[w2], latest.state_dict()[w2][vocab.ids])


def test_export_by_mass_ranks_tokens_by_the_targets_probability(
    tiny_run: Path,
    tiny_data_dir: Path,
    target_dir: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from dspark_sglang.model.vocab import DraftVocab
    from dspark_sglang.training.datagen import load_responses
    from dspark_sglang.training.token_map import eos_token_ids, response_token_mass

    out = tmp_path / "shipped"
    argv = ["export-drafter", "--from", str(tiny_run), "--to", str(out), "--target"]
    argv += [str(target_dir), "--dtype", "float32", "--draft-vocab-size", "16"]
    argv += ["--draft-vocab-data", str(tiny_data_dir), "--draft-vocab-by", "mass"]
    rc = main(argv)
    printed = capsys.readouterr()
    assert rc == 0, printed.err
    assert "of the target's probability there" in printed.out
    # The expected mass, one prefix at a time: the target's next-token distribution
    # after each prefix that ends just before a reply token.
    model = AutoModelForCausalLM.from_pretrained(str(target_dir)).eval()
    vocab_size = model.config.vocab_size
    mass = torch.zeros(vocab_size, dtype=torch.float64)
    positions = 0
    with torch.no_grad():
        for rec in load_responses(tiny_data_dir):
            seq = [*rec.prompt_ids, *rec.response_ids]
            for t in range(len(rec.prompt_ids), len(seq)):
                logits = model(input_ids=torch.tensor([seq[:t]])).logits[0, -1]
                mass += torch.softmax(logits.double(), dim=-1)
                positions += 1
    assert positions > 16
    # One forward per reply gives the same sums (float32 logits: 1e-4 relative).
    computed = response_token_mass(tiny_data_dir, model, vocab_size)
    assert float(computed.sum()) == pytest.approx(positions, abs=1e-6)
    torch.testing.assert_close(computed, mass, rtol=1e-4, atol=1e-6)
    expected = DraftVocab.from_counts(computed, 16, always=eos_token_ids(tiny_data_dir))
    spec = TargetSpec.from_hf_config(model.config, name=target_dir.name)
    shipped = load_drafter(out, spec, model.get_input_embeddings(), model.get_output_embeddings())
    assert torch.equal(shipped.draft_vocab.ids, expected.ids)
    with pytest.raises(SystemExit):
        main([*argv[:-1], "probability"])
    assert "--draft-vocab-by: invalid choice" in capsys.readouterr().err


def test_export_ships_the_full_drafter_with_a_greedy_map_of_the_data(
    tiny_run: Path,
    tiny_data_dir: Path,
    target_dir: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from dspark_sglang.model.vocab import DraftVocab
    from dspark_sglang.training.token_map import eos_token_ids, response_token_mass

    out = tmp_path / "shipped"
    base = ["export-drafter", "--from", str(tiny_run), "--to", str(out), "--target"]
    base += [str(target_dir), "--dtype", "float32", "--greedy-draft-vocab-size", "16"]
    rc = main(base)
    assert rc == 2 and "--greedy-draft-vocab-size needs --draft-vocab-data" in (
        capsys.readouterr().err
    )
    with_data = [*base, "--draft-vocab-data", str(tiny_data_dir), "--draft-vocab-by", "mass"]
    rc = main([*with_data, "--draft-vocab-size", "16"])
    assert rc == 2 and "exclude each other" in capsys.readouterr().err
    assert not out.exists()
    rc = main(with_data)
    printed = capsys.readouterr()
    assert rc == 0, printed.err
    assert "greedy map: 16 of" in printed.out and "of the target's probability" in printed.out
    assert "token map:" not in printed.out
    model = AutoModelForCausalLM.from_pretrained(str(target_dir)).eval()
    spec = TargetSpec.from_hf_config(model.config, name=target_dir.name)
    emb, head = model.get_input_embeddings(), model.get_output_embeddings()
    shipped = load_drafter(out, spec, emb, head)
    latest = load_drafter(tiny_run / "checkpoints" / "step-000002" / "drafter", spec, emb, head)
    # The full drafter, unchanged, plus the map --draft-vocab-by mass ranks.
    assert shipped.draft_vocab is None and shipped.config.greedy_draft_vocab_size == 16
    for name, t in latest.state_dict().items():
        assert torch.equal(shipped.state_dict()[name], t), name
    mass = response_token_mass(tiny_data_dir, model, spec.vocab_size)
    eos = eos_token_ids(tiny_data_dir)
    assert eos and set(eos) <= set(shipped.greedy_vocab.ids.tolist())
    expected = DraftVocab.from_counts(mass, 16, always=eos)
    assert torch.equal(shipped.greedy_vocab.ids, expected.ids)


def test_export_narrows_a_drafter_to_its_own_greedy_map(
    tiny_run: Path,
    tiny_data_dir: Path,
    target_dir: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``--narrow-to-greedy-map``: sampled drafts over the map a greedy tier drafts over."""
    common = ["--target", str(target_dir), "--dtype", "float32"]
    with_map = tmp_path / "with_map"
    source = ["export-drafter", "--from", str(tiny_run), "--to", str(with_map), *common]
    rc = main(
        [*source, "--greedy-draft-vocab-size", "16", "--draft-vocab-data", str(tiny_data_dir)]
    )
    assert rc == 0, capsys.readouterr().err
    capsys.readouterr()
    narrowed = tmp_path / "narrowed"
    narrow = ["export-drafter", "--to", str(narrowed), *common, "--narrow-to-greedy-map"]
    rc = main([*narrow, "--from", str(tiny_run)])
    assert rc == 2 and "carries no greedy map" in capsys.readouterr().err
    rc = main([*narrow, "--from", str(with_map), "--draft-vocab-size", "8"])
    assert rc == 2 and "drop --draft-vocab-size" in capsys.readouterr().err
    assert not narrowed.exists()
    rc = main([*narrow, "--from", str(with_map)])
    printed = capsys.readouterr()
    assert rc == 0, printed.err
    assert "token map: the drafter's 16-token greedy map" in printed.out
    source, shipped = (_loaded(target_dir, folder) for folder in (with_map, narrowed))
    assert shipped.config.greedy_draft_vocab_size is None and shipped.draft_vocab is not None
    assert torch.equal(shipped.draft_vocab.ids, source.greedy_vocab.ids)
    want = source.restricted_to(source.greedy_vocab).state_dict()
    for name, t in shipped.state_dict().items():
        assert torch.equal(t, want[name]), name
