"""``base:`` in training configs: a config that holds only the knobs it changes."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import yaml

from dspark_sglang.training.config import load_config, merge_config

RECIPE = {
    "name": "recipe",
    "target": {"name": "smollm2", "layer_ids": [1, 8, 14, 20, 27]},
    "data": {"dir": "runs/data/d", "num_math": 10, "num_code": 10, "num_chat": 10},
    "drafter": {
        "kind": "dspark",
        "block_size": 7,
        "model": {"num_hidden_layers": 1, "markov_rank": 48, "markov_head_type": "vanilla"},
    },
    "optim": {"lr": 1e-3, "warmup_steps": 30, "max_steps": 540, "markov_lr_scale": 5.0},
    "run": {"out_dir": "runs/train/recipe", "threads": 1, "init_from": "runs/train/older"},
}


def _write(path: Path, body: dict[str, object]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(body, sort_keys=False))
    return path


def test_merge_config_merges_mappings_and_replaces_the_rest() -> None:
    base = {"a": {"x": 1, "y": {"p": 1, "q": 2}}, "l": [1, 2, 3], "s": "keep"}
    changes = {"a": {"y": {"q": 9}, "z": 3}, "l": [7], "n": None}
    got = merge_config(base, changes)
    assert got == {"a": {"x": 1, "y": {"p": 1, "q": 9}, "z": 3}, "l": [7], "s": "keep", "n": None}
    assert base == {"a": {"x": 1, "y": {"p": 1, "q": 2}}, "l": [1, 2, 3], "s": "keep"}


def test_child_equals_its_base_with_the_changed_knobs(tmp_path: Path) -> None:
    recipe = _write(tmp_path / "configs" / "recipe.yaml", RECIPE)
    child = _write(
        tmp_path / "configs" / "abl" / "child.yaml",
        {
            "name": "child",
            "base": "../recipe.yaml",
            "target": {"layer_ids": [2, 9]},  # a list replaces the base's list whole
            "drafter": {"model": {"markov_rank": 96}},
            "run": {"out_dir": "runs/train/child", "init_from": None},
        },
    )
    grandchild = _write(
        tmp_path / "configs" / "abl" / "grandchild.yaml",
        {
            "name": "grandchild",
            "base": "child.yaml",
            "optim": {"max_steps": 1080},
            "run": {"out_dir": "runs/train/grandchild"},
        },
    )
    ref, got, gc = load_config(recipe), load_config(child), load_config(grandchild)
    want = ref.with_overrides(
        target={"layer_ids": (2, 9)},
        drafter={"model": {**ref.drafter.model, "markov_rank": 96}},
        run={"out_dir": str(tmp_path / "runs" / "train" / "child"), "init_from": None},
    )
    assert got == dataclasses.replace(want, name="child")
    assert gc.optim.max_steps == 1080 and gc.drafter.model["markov_rank"] == 96
    assert gc.optim.lr == ref.optim.lr and gc.target.layer_ids == (2, 9)
    # Paths still resolve against the repository root, not the child's own folder.
    assert gc.run.out_dir == str(tmp_path / "runs" / "train" / "grandchild")
    assert gc.data.dir == ref.data.dir == str(tmp_path / "runs" / "data" / "d")


def test_base_errors_name_the_field_and_the_fix(tmp_path: Path) -> None:
    d = tmp_path / "configs"
    _write(d / "recipe.yaml", RECIPE)
    own = {"name": "c", "run": {"out_dir": "runs/train/c"}}
    cases = [
        ({**own, "base": "nope.yaml"}, r"'base: nope\.yaml' not found .* relative to"),
        ({**own, "base": 3}, r"'base' must be the path of another config YAML"),
        ({"name": "c", "base": "recipe.yaml"}, r"must set its own 'name' and 'run\.out_dir'"),
        ({"base": "recipe.yaml", "run": {"out_dir": "x"}}, r"must set its own 'name'"),
        ({**own, "base": "recipe.yaml", "optim": {"max_step": 9}}, r"optim\.max_step"),
    ]
    for i, (body, needle) in enumerate(cases):
        path = _write(d / f"bad{i}.yaml", body)
        with pytest.raises(ValueError, match=needle):
            load_config(path)
    _write(d / "a.yaml", {"name": "a", "base": "b.yaml", "run": {"out_dir": "a"}})
    _write(d / "b.yaml", {"name": "b", "base": "a.yaml", "run": {"out_dir": "b"}})
    with pytest.raises(ValueError, match=r"chain loops \(a\.yaml -> b\.yaml -> a\.yaml\)"):
        load_config(d / "a.yaml")
    (d / "list.yaml").write_text("- 1\n- 2\n")
    _write(d / "on_list.yaml", {**own, "base": "list.yaml"})
    with pytest.raises(ValueError, match=r"list\.yaml .* is not a YAML mapping"):
        load_config(d / "on_list.yaml")


def test_shipped_children_name_an_existing_recipe() -> None:
    """Every shipped ``base`` resolves, and no shipped config inherits its run folder."""
    repo = Path(__file__).resolve().parents[2]
    children = 0
    for path in sorted((repo / "configs").rglob("*.yaml")):
        raw = yaml.safe_load(path.read_text())
        if "base" not in raw:
            continue
        children += 1
        parent = (path.parent / raw["base"]).resolve()
        assert parent.is_file(), path
        assert raw["run"]["out_dir"] != yaml.safe_load(parent.read_text())["run"]["out_dir"]
    assert children >= 15
