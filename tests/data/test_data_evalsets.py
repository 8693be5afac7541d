"""Eval/train prompt loaders: the real fetched files and clear errors on bad ones."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from dspark_sglang.data import evalsets as ev


def test_real_eval_sets_have_the_published_sizes() -> None:
    """Files from scripts/fetch_assets.sh (setup fetches them before the tests)."""
    gsm = ev.load_gsm8k_test()
    he = ev.load_humaneval()
    mt = ev.load_mtbench()
    assert (len(gsm), len(he), len(mt)) == (1319, 164, 80)
    assert gsm[0].messages[0].content.startswith("Janet\u2019s ducks lay 16 eggs per day.")
    assert gsm[0].messages[0].content.endswith(ev.GSM8K_INSTRUCTION)
    assert "def has_close_elements" in he[0].messages[0].content
    assert mt[0].id == "mtbench/81" and "Hawaii" in mt[0].messages[0].content
    for prompts, domain in ((gsm, "math"), (he, "code"), (mt, "chat")):
        assert len({p.id for p in prompts}) == len(prompts)
        assert {p.domain for p in prompts} == {domain}
        assert all(p.chat()[-1]["role"] == "user" for p in prompts)


def test_real_gsm8k_train_ships_with_the_package() -> None:
    path = ev.gsm8k_train_path()
    assert path.is_relative_to(Path(ev.__file__).resolve().parents[1]), path
    assert (path.parent / "LICENSE").read_text().startswith("MIT License")
    train = ev.load_gsm8k_train()
    assert len(train) == 7473
    assert train[0].messages[0].content.startswith("Natalia sold clips")
    assert ev.load_gsm8k_train(limit=3) == train[:3]


def test_load_eval_set_by_name_and_limit() -> None:
    assert [p.id for p in ev.load_eval_set("humaneval", limit=2)] == [
        "humaneval/0",
        "humaneval/1",
    ]
    with pytest.raises(ValueError, match="unknown eval set 'gsm9k'"):
        ev.load_eval_set("gsm9k")
    with pytest.raises(ValueError, match="limit"):
        ev.load_gsm8k_test(limit=-1)


def test_missing_files_name_the_fix(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for loader in (ev.load_gsm8k_test, ev.load_humaneval, ev.load_mtbench):
        with pytest.raises(FileNotFoundError, match=r"scripts/fetch_assets\.sh"):
            loader(cache_dir=tmp_path)
    monkeypatch.setattr(ev, "GSM8K_TRAIN_PATH", tmp_path / "train.jsonl.gz")
    with pytest.raises(FileNotFoundError, match="reinstall dspark-sglang"):
        ev.load_gsm8k_train()


def _write(path: Path, lines: list[str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")


def test_synthetic_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assets = tmp_path / "assets"
    _write(assets / "gsm8k/test.jsonl", [json.dumps({"question": "1+1?", "answer": "#### 2"}), ""])
    he_path = assets / "humaneval/HumanEval.jsonl.gz"
    he_path.parent.mkdir(parents=True)
    with gzip.open(he_path, "wt") as f:
        f.write(json.dumps({"task_id": "HumanEval/7", "prompt": "def f():\n"}) + "\n")
    _write(
        assets / "mt_bench/question.jsonl",
        [json.dumps({"question_id": 3, "category": "x", "turns": ["first", "second"]})],
    )
    assert [p.id for p in ev.load_gsm8k_test(tmp_path)] == ["gsm8k_test/0"]
    (he,) = ev.load_humaneval(tmp_path)
    assert he.id == "humaneval/7" and he.messages[0].content.endswith("def f():\n")
    (mt,) = ev.load_mtbench(tmp_path)
    assert mt.chat() == [{"role": "user", "content": "first"}]

    train = tmp_path / "train.jsonl.gz"
    with gzip.open(train, "wt") as f:
        f.write(json.dumps({"question": "q", "answer": "a"}) + "\n")
    monkeypatch.setattr(ev, "GSM8K_TRAIN_PATH", train)
    (tr,) = ev.load_gsm8k_train()
    assert tr.id == "gsm8k_train/0" and tr.domain == "math"


@pytest.mark.parametrize(
    ("line", "match"),
    [
        ("{not json", r"test\.jsonl:2: invalid JSON"),
        (json.dumps({"answer": "x"}), r"test\.jsonl:2: field 'question'"),
        (json.dumps([1, 2]), r"test\.jsonl:2: expected a JSON object"),
    ],
)
def test_bad_lines_name_file_line_and_field(tmp_path: Path, line: str, match: str) -> None:
    _write(tmp_path / "assets/gsm8k/test.jsonl", [json.dumps({"question": "ok"}), line])
    with pytest.raises(ValueError, match=match):
        ev.load_gsm8k_test(tmp_path)


def test_bad_mtbench_fields(tmp_path: Path) -> None:
    path = tmp_path / "assets/mt_bench/question.jsonl"
    _write(path, [json.dumps({"question_id": "3", "turns": ["a"]})])
    with pytest.raises(ValueError, match="question_id"):
        ev.load_mtbench(tmp_path)
    _write(path, [json.dumps({"question_id": 3, "turns": []})])
    with pytest.raises(ValueError, match="turns"):
        ev.load_mtbench(tmp_path)


def test_prompt_and_message_validation() -> None:
    with pytest.raises(ValueError, match=r"Message\.role"):
        ev.Message("robot", "hi")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"Message\.content"):
        ev.Message("user", "  ")
    with pytest.raises(ValueError, match="end with a user turn"):
        ev.Prompt("x/0", "math", (ev.Message("assistant", "hi"),))
    with pytest.raises(ValueError, match=r"Prompt\.domain"):
        ev.Prompt("x/0", "poetry", (ev.Message("user", "hi"),))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"Prompt\.id"):
        ev.Prompt("", "math", (ev.Message("user", "hi"),))
    p = ev.Prompt("x/0", "chat", [ev.Message("system", "s"), ev.Message("user", "u")])  # type: ignore[arg-type]
    assert isinstance(p.messages, tuple) and p.chat()[0] == {"role": "system", "content": "s"}
