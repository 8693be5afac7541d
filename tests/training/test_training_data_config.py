"""The ``data:`` section: sources, chat-template options and the mask token, validated on
load, round-tripping through the run's config.json, every committed config unchanged."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from dspark_sglang.training.config import (
    BuiltinSource,
    DataConfig,
    JsonlSource,
    load_config,
)

REPO = Path(__file__).resolve().parents[2]


def _write(path: Path, body: dict[str, Any]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(body, sort_keys=False))
    return path


@pytest.mark.parametrize("path", sorted((REPO / "configs").rglob("*.yaml")), ids=lambda p: p.name)
def test_every_committed_config_means_the_builtin_mix_it_always_did(path: Path) -> None:
    cfg = load_config(path)
    d = cfg.data
    assert d.sources == (BuiltinSource(),)
    assert d.builtin_source().counts(d) == (d.num_math, d.num_code, d.num_chat)  # type: ignore[union-attr]
    assert d.chat_template_kwargs == {} and d.mask_token_id is None


def test_sources_round_trip_and_paths_resolve_against_the_repo_root(tmp_path: Path) -> None:
    recipe = {
        "name": "recipe",
        "data": {"dir": "runs/data/d", "num_math": 10, "num_code": 10, "num_chat": 10},
        "run": {"out_dir": "runs/train/recipe"},
    }
    _write(tmp_path / "configs" / "recipe.yaml", recipe)
    child = _write(
        tmp_path / "configs" / "mine.yaml",
        {
            "name": "mine",
            "base": "recipe.yaml",
            "data": {
                "sources": [
                    {"kind": "builtin", "num_code": 0},
                    {"kind": "jsonl", "path": "data/chats.jsonl.gz", "limit": 100},
                    {"kind": "jsonl", "path": "/abs/other.jsonl", "domain": "code"},
                ],
                "chat_template_kwargs": {"enable_thinking": False},
                "mask_token_id": 151662,
            },
            "run": {"out_dir": "runs/train/mine"},
        },
    )
    d = load_config(child).data
    assert d.sources == (
        BuiltinSource(num_code=0),
        JsonlSource(path=str(tmp_path / "data" / "chats.jsonl.gz"), limit=100),
        JsonlSource(path="/abs/other.jsonl", domain="code"),
    )
    assert d.builtin_source().counts(d) == (10, 0, 10)  # type: ignore[union-attr]
    assert d.sources[1].stem == "chats"  # type: ignore[union-attr]
    assert d.chat_template_kwargs == {"enable_thinking": False}
    assert d.mask_token_id == 151662
    # As the trainer stores it (config.json) and reads it back.
    stored = json.loads(json.dumps(load_config(child).to_dict()))["data"]
    assert DataConfig(**stored) == d


@pytest.mark.parametrize(
    ("data", "match"),
    [
        ({"sources": []}, r"data.sources must be a non-empty list"),
        ({"sources": {"kind": "builtin"}}, r"data.sources must be a non-empty list"),
        ({"sources": [{"path": "a.jsonl"}]}, r"data.sources\[0\] must be a mapping with kind"),
        ({"sources": [{"kind": "csv", "path": "a.csv"}]}, r"kind one of \['builtin', 'jsonl'\]"),
        (
            {"sources": [{"kind": "jsonl", "path": "a.jsonl", "limt": 3}]},
            r"unknown keys \['data.sources\[0\].limt'\]; allowed for kind 'jsonl'",
        ),
        ({"sources": [{"kind": "jsonl", "path": "a.json"}]}, r"\[0\]: .*\.jsonl or \.jsonl\.gz"),
        ({"sources": [{"kind": "jsonl"}]}, r"path must name a \.jsonl"),
        ({"sources": [{"kind": "jsonl", "path": "a.jsonl", "limit": 0}]}, r"limit must be"),
        ({"sources": [{"kind": "jsonl", "path": "a.jsonl", "domain": "x"}]}, r"domain must be"),
        ({"sources": [{"kind": "builtin"}, {"kind": "builtin"}]}, r"list the built-in mix once"),
        (
            {
                "sources": [
                    {"kind": "jsonl", "path": "x/a.jsonl"},
                    {"kind": "jsonl", "path": "a.jsonl.gz"},
                ]
            },
            r"data.sources\[0\] and data.sources\[1\] have the same file name 'a'",
        ),
        ({"sources": [{"kind": "builtin", "num_math": -1}]}, r"num_math must be an integer >= 0"),
        (
            {"num_math": 0, "num_code": 0, "num_chat": 0},
            r"data.sources\[0\] \(builtin\) has no prompts.*drop the builtin entry",
        ),
        ({"chat_template_kwargs": ["enable_thinking"]}, r"chat_template_kwargs must be a mapping"),
        ({"chat_template_kwargs": {"tokenize": False}}, r"sets \['tokenize'\]: the data stage"),
        ({"mask_token_id": -1}, r"data.mask_token_id must be an integer >= 0"),
        ({"mask_token_id": True}, r"data.mask_token_id must be an integer"),
        ({"temperature": -0.5}, r"data.temperature must be >= 0 \(1: sample.*0: its greedy"),
        ({"temperature": "0"}, r"data.temperature must be >= 0"),
        ({"temperature": True}, r"data.temperature must be >= 0"),
        ({"temperature": float("nan")}, r"data.temperature must be >= 0"),
    ],
)
def test_bad_data_sections_are_refused_naming_the_field(data: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        DataConfig(**data)


def test_only_files_needs_no_builtin_counts() -> None:
    d = DataConfig(
        num_math=0, num_code=0, num_chat=0, sources=[{"kind": "jsonl", "path": "a.jsonl"}]
    )
    assert d.builtin_source() is None
