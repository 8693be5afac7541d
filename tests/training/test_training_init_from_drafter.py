"""``run.init_from`` naming a drafter folder (what ``import-drafter`` and ``export-drafter``
write): its weights start a fresh run (new optimizer, schedule from step 0, epoch 0, a new
log); a folder whose drafter is not the one the config describes, or a path that is neither
a training run/checkpoint nor a drafter folder, is refused with the fix."""

from __future__ import annotations

import dataclasses
import json
import math
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file
from test_training_trainer import _tiny_cfg, _trainer
from tiny_dist import tiny_cfg

from dspark_sglang.cli import main
from dspark_sglang.model import save_drafter
from dspark_sglang.model.vocab import GREEDY_DRAFT_VOCAB_BUFFER
from dspark_sglang.training.config import TrainConfig
from dspark_sglang.training.trainer import Trainer, build_drafter, lr_lambda


@pytest.fixture(scope="module")
def shipped(
    tiny_data_dir: Path, tiny_target_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Path:
    """A 4-step tiny DSpark run shipped with ``export-drafter`` (bfloat16, with a greedy map)
    against the tiny target saved under the name the run was trained for ("tiny")."""
    root = tmp_path_factory.mktemp("shipped")
    torch.set_num_threads(1)
    _trainer(_tiny_cfg("dspark", tiny_data_dir, root / "run", steps=4), tiny_data_dir).train(
        progress=False
    )
    target = root / "models" / "tiny"
    shutil.copytree(tiny_target_dir, target)
    out = root / "drafter"
    argv = ["export-drafter", "--from", str(root / "run"), "--to", str(out)]
    argv += ["--target", str(target), "--greedy-draft-vocab-size", "32"]
    assert main([*argv, "--draft-vocab-data", str(tiny_data_dir)]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors"]
    return out


def _watched(cfg: TrainConfig, data_dir: Path) -> tuple[Trainer, dict[str, Any]]:
    """A tiny trainer that records the drafter's weights when its optimizer is built (step
    0, before any update)."""
    trainer = _trainer(cfg, data_dir)
    seen: dict[str, Any] = {}
    make = trainer._make_optimizer

    def watch(drafter: Any) -> Any:
        seen["weights"] = {k: v.detach().clone() for k, v in drafter.state_dict().items()}
        return make(drafter)

    trainer._make_optimizer = watch  # type: ignore[method-assign]
    return trainer, seen


def test_a_shipped_drafter_starts_a_fresh_run_from_its_weights(
    shipped: Path, tiny_data_dir: Path, tmp_path: Path
) -> None:
    cfg = _tiny_cfg("dspark", tiny_data_dir, tmp_path / "tuned", steps=3).with_overrides(
        run={"init_from": str(shipped)}
    )
    trainer, seen = _watched(cfg, tiny_data_dir)
    res = trainer.train(progress=False)
    # Step 0: exactly the folder's weights (bfloat16 on disk, float32 in training); its
    # greedy map, a shipping setting, is dropped.
    stored = load_file(str(shipped / "model.safetensors"))
    start = seen["weights"]
    assert set(stored) - set(start) == {GREEDY_DRAFT_VOCAB_BUFFER}
    for name, t in start.items():
        assert torch.equal(t, stored[name].to(t.dtype)), name
    # A fresh optimizer, a schedule from step 0, epoch 0 and a log of this run only.
    state = torch.load(res.final_checkpoint / "train_state.pt", weights_only=False)
    assert state["step"] == 3 and state["scheduler"]["last_epoch"] == 3
    assert {float(s["step"]) for s in state["optimizer"]["state"].values()} == {3.0}
    log = [json.loads(x) for x in (tmp_path / "tuned/log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log] == [1, 2, 3] and log[0]["epoch"] == 0
    assert log[0]["lr"] == pytest.approx(cfg.optim.lr * lr_lambda(cfg)(0))
    # It trains: finite losses, and the weights move off the folder's.
    assert all(math.isfinite(r["total"]) for r in log) and math.isfinite(res.last_loss)
    after = load_file(str(res.final_checkpoint / "drafter" / "model.safetensors"))
    assert GREEDY_DRAFT_VOCAB_BUFFER not in after
    assert any(not torch.equal(after[k], start[k]) for k in after)


def test_an_eagle3_drafter_folder_starts_an_eagle3_run(tiny_data_dir: Path, tmp_path: Path) -> None:
    """The EAGLE3-style drafter's own folder (``ar_config.json``) works the same way."""
    _trainer(_tiny_cfg("eagle3", tiny_data_dir, tmp_path / "src", steps=2), tiny_data_dir).train(
        progress=False
    )
    folder = tmp_path / "src/checkpoints/step-000002/drafter"
    cfg = _tiny_cfg("eagle3", tiny_data_dir, tmp_path / "tuned", steps=2).with_overrides(
        run={"init_from": str(folder)}
    )
    trainer, seen = _watched(cfg, tiny_data_dir)
    res = trainer.train(progress=False)
    stored = load_file(str(folder / "ar_drafter.safetensors"))
    for name, t in stored.items():
        assert torch.equal(seen["weights"][name], t), name
    state = torch.load(res.final_checkpoint / "train_state.pt", weights_only=False)
    assert {float(s["step"]) for s in state["optimizer"]["state"].values()} == {2.0}
    assert math.isfinite(res.last_loss)


_MODEL = dict(tiny_cfg("dspark", Path("."), Path("."), 1).drafter.model)


def test_an_imported_deepspec_drafter_starts_a_run(
    tiny_data_dir: Path, tiny_target_dir: Path, tmp_path: Path
) -> None:
    """A public dense drafter: DeepSpec's layout (written here by ``export-drafter --format
    deepspec``) through ``import-drafter``. The MoE fields an import fills with 1s are not
    read by a dense FFN, so the config need not repeat them."""
    model = {**_MODEL, "ffn_type": "dense", "sliding_window": None}
    cfg = tiny_cfg("dspark", tiny_data_dir, tmp_path / "tuned", 2, drafter={"model": model})
    t = _trainer(cfg, tiny_data_dir)
    ours, deepspec, imported = tmp_path / "ours", tmp_path / "deepspec", tmp_path / "imported"
    save_drafter(build_drafter(cfg, t.spec, t.hf_config, t.embed_tokens, t.lm_head, 3), ours)
    target = tmp_path / "models" / "tiny"
    shutil.copytree(tiny_target_dir, target)
    argv = ["--target", str(target), "--format", "deepspec"]
    assert main(["export-drafter", "--from", str(ours), "--to", str(deepspec), *argv]) == 0
    assert main(["import-drafter", "--from", str(deepspec), "--to", str(imported), *argv]) == 0
    raw = _trainer(cfg.with_overrides(run={"init_from": str(deepspec)}), tiny_data_dir)
    with pytest.raises(ValueError, match=r"DeepSpec-layout drafter.*import-drafter"):
        raw.train(progress=False)  # the folder as it is: its conversion is named
    trainer, seen = _watched(cfg.with_overrides(run={"init_from": str(imported)}), tiny_data_dir)
    res = trainer.train(progress=False)
    stored = load_file(str(imported / "model.safetensors"))
    assert stored.keys() == seen["weights"].keys()
    for name, w in seen["weights"].items():
        assert torch.equal(w, stored[name].to(w.dtype)), name
    assert math.isfinite(res.last_loss)


@pytest.mark.parametrize(
    ("kind", "sections", "message"),
    [
        (
            "dspark",
            {"drafter": {"block_size": 5}},
            r"block_size is 4 there, 5 here \(set drafter\.block_size: 4\)",
        ),
        (
            "dspark",
            {"drafter": {"model": {**_MODEL, "num_hidden_layers": 2}}},
            r"num_hidden_layers is 1 there, 2 here \(set drafter\.model\.num_hidden_layers: 1\)",
        ),
        (
            "dspark",
            {"drafter": {"model": {**_MODEL, "ffn_type": "dense"}}},
            r"ffn_type is \"moe\" there, \"dense\" here \(set drafter\.model\.ffn_type: \"moe\"\)",
        ),
        ("dflash", {}, r"markov_head_type is \"vanilla\" there.*set drafter\.kind: dspark"),
        ("eagle3", {}, r"holds a DSpark/DFlash drafter but drafter\.kind is 'eagle3'"),
    ],
)
def test_a_drafter_folder_the_config_does_not_describe_is_refused(
    shipped: Path,
    tiny_data_dir: Path,
    tmp_path: Path,
    kind: str,
    sections: dict[str, Any],
    message: str,
) -> None:
    cfg = tiny_cfg(kind, tiny_data_dir, tmp_path / "out", 3, **sections).with_overrides(
        run={"init_from": str(shipped)}
    )
    with pytest.raises(ValueError, match=rf"run\.init_from={re.escape(str(shipped))}.*{message}"):
        _trainer(cfg, tiny_data_dir).train(progress=False)
    assert not (tmp_path / "out" / "checkpoints").exists()


def test_a_drafter_folder_for_another_target_is_refused(
    shipped: Path, tiny_data_dir: Path, tmp_path: Path
) -> None:
    """The target checks are the drafter loader's own (``model.checkpoint``)."""
    cfg = _tiny_cfg("dspark", tiny_data_dir, tmp_path / "out", steps=3).with_overrides(
        run={"init_from": str(shipped)}
    )
    trainer = _trainer(cfg, tiny_data_dir)
    trainer.spec = dataclasses.replace(trainer.spec, name="other")
    with pytest.raises(ValueError, match=r"run\.init_from=.*target_name='tiny'.*'other'"):
        trainer.train(progress=False)


def test_a_path_that_is_neither_kind_is_refused(tiny_data_dir: Path, tmp_path: Path) -> None:
    """A run folder that never wrote a checkpoint holds config.json but no weights."""
    half = tmp_path / "half"
    half.mkdir()
    (half / "config.json").write_text("{}")
    both = r"neither a training run or checkpoint .*nor a drafter folder \(config\.json \+ "
    for path, extra in ((half, ""), (tmp_path / "nowhere", r" \(it does not exist\)")):
        cfg = _tiny_cfg("dspark", tiny_data_dir, tmp_path / "out", steps=3).with_overrides(
            run={"init_from": str(path)}
        )
        where = re.escape(str(path))
        with pytest.raises(FileNotFoundError, match=rf"run\.init_from={where}{extra} is {both}"):
            _trainer(cfg, tiny_data_dir).train(progress=False)
