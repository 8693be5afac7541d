"""``data.sources``: the built-in mix and chat JSONL files as one prompt list, every skip
counted (over-long, eval overlap, template errors, bad rows), and the mask-token option."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from dspark_sglang.data.evalsets import Message, Prompt
from dspark_sglang.targets.hf_target import HFTarget
from dspark_sglang.training.config import BuiltinSource, DataConfig, JsonlSource, TrainConfig
from dspark_sglang.training.pipeline import SOURCES_FILE, resolve_mask_token_id, run_data_stage
from dspark_sglang.training.prompts import build_training_prompts, collect_training_prompts

FIXTURES = Path(__file__).parents[1] / "data" / "fixtures"
MESSAGES = str(FIXTURES / "chats_messages.jsonl")
SHAREGPT = str(FIXTURES / "chats_sharegpt.jsonl")
EVALS = [
    Prompt("gsm8k_test/0", "math", (Message("user", "Tom has 3 apples and buys 4 more."),)),
    Prompt("mtbench/81", "chat", (Message("user", "Write a limerick about tea."),)),
]


def _data(*sources: Any, **kw: Any) -> DataConfig:
    return DataConfig(
        sources=list(sources), max_prompt_tokens=kw.pop("max_prompt_tokens", 4096), **kw
    )


def _encoder(target: HFTarget, kwargs: dict[str, Any] | None = None):
    return lambda msgs: target.encode_chat(msgs, chat_template_kwargs=kwargs)


def test_builtin_default_is_the_old_mix_and_files_interleave(tiny_chat_model: HFTarget) -> None:
    enc = _encoder(tiny_chat_model)
    # The default source is the built-in mix exactly as before: same prompts, same order,
    # so existing data directories keep their manifest's prompt hash.
    only = DataConfig(num_math=2, num_code=1, num_chat=1, max_prompt_tokens=400)
    got, [rep] = collect_training_prompts(only, enc, EVALS)
    old = [p for p in build_training_prompts(2, 1, 1, 0) if len(enc(p.chat())) <= 400]
    assert [p for p, _ in got] == old
    assert rep.source == "builtin" and rep.prompts == len(old)
    assert rep.skipped.get("over_long", 0) == 4 - len(old)

    mixed = _data(
        {"kind": "builtin", "num_math": 1, "num_code": 0, "num_chat": 0},
        {"kind": "jsonl", "path": MESSAGES},
        {"kind": "jsonl", "path": SHAREGPT, "domain": "math"},
    )
    got, reports = collect_training_prompts(mixed, enc, [])
    ids = [p.id for p, _ in got]
    assert ids[:3] == [ids[0], "chats_messages/greet/1", "chats_sharegpt/1/1"]
    assert ids[0].startswith("gsm8k_train/")
    assert ids[3:] == [
        "chats_messages/greet/2",
        "chats_sharegpt/7/1",
        "chats_messages/2/1",
        "chats_sharegpt/7/2",
        "chats_messages/2/2",
        "chats_messages/4/1",
    ]
    assert [(r.rows, r.prompts, r.skipped) for r in reports[1:]] == [(3, 5, {}), (2, 3, {})]
    assert {p.domain for p, _ in got if p.id.startswith("chats_sharegpt")} == {"math"}
    for p, toks in got:
        assert toks == enc(p.chat())


def test_over_long_and_eval_overlap_are_counted_not_dropped_silently(
    tiny_chat_model: HFTarget,
) -> None:
    enc = _encoder(tiny_chat_model)
    everything, _ = collect_training_prompts(_data({"kind": "jsonl", "path": MESSAGES}), enc, [])
    lengths = sorted(len(t) for _, t in everything)
    cap = lengths[2]
    got, [rep] = collect_training_prompts(
        _data({"kind": "jsonl", "path": MESSAGES}, max_prompt_tokens=cap), enc, EVALS
    )
    # "Write a limerick about tea." is an eval prompt (mtbench/81): skipped and counted.
    over = sum(n > cap for n in lengths)
    assert rep.skipped == {"over_long": over, "eval_overlap": 1}
    assert rep.prompts == len(everything) - over - 1 == len(got)
    assert all(len(t) <= cap for _, t in got)
    assert any("reply 2: over_long:" in e and f"max_prompt_tokens={cap}" in e for e in rep.examples)
    assert "chats_messages.jsonl:4 reply 1: eval_overlap: contains mtbench/81" in rep.examples
    summary = rep.summary()
    assert f"over_long {over}" in summary and "eval_overlap 1" in summary


def test_builtin_overlap_with_an_eval_set_is_refused(tiny_chat_model: HFTarget) -> None:
    [leak] = build_training_prompts(1, 0, 0, 0)
    evals = [Prompt("gsm8k_test/9", "math", leak.messages)]
    with pytest.raises(AssertionError, match="eval prompt gsm8k_test/9 appears"):
        collect_training_prompts(
            DataConfig(num_math=1, num_code=0, num_chat=0), _encoder(tiny_chat_model), evals
        )


def test_a_file_with_no_usable_row_is_an_error_naming_the_fix(
    tiny_chat_model: HFTarget, tmp_path: Path
) -> None:
    bad = tmp_path / "bad.jsonl"
    lines = (FIXTURES / "chats_bad.jsonl").read_text().splitlines()
    bad.write_text("\n".join(lines[1:10]) + "\n")  # every bad row, no good one
    with pytest.raises(ValueError, match=r"data.sources\[1\]: .*bad.jsonl gave no usable") as e:
        collect_training_prompts(
            _data({"kind": "builtin", "num_math": 1}, {"kind": "jsonl", "path": str(bad)}),
            _encoder(tiny_chat_model),
            [],
        )
    assert "9 rows" in str(e.value) and "bad.jsonl:1: not_json" in str(e.value)
    assert "Fix: not_json: the line is not valid UTF-8 JSON" in str(e.value)
    # All over-long: the fix names the option to raise.
    with pytest.raises(ValueError, match=r"over_long 5.*Fix: over_long: .*raise it"):
        collect_training_prompts(
            _data({"kind": "jsonl", "path": MESSAGES}, max_prompt_tokens=5),
            _encoder(tiny_chat_model),
            [],
        )
    with pytest.raises(FileNotFoundError, match=r"data.sources\[0\].path: .*gone.jsonl"):
        collect_training_prompts(
            _data({"kind": "jsonl", "path": str(tmp_path / "gone.jsonl")}),
            _encoder(tiny_chat_model),
            [],
        )


def test_limit_and_template_errors(tiny_chat_model: HFTarget) -> None:
    got, [rep] = collect_training_prompts(
        _data({"kind": "jsonl", "path": MESSAGES, "limit": 2}), _encoder(tiny_chat_model), []
    )
    assert [p.id for p, _ in got] == ["chats_messages/greet/1", "chats_messages/greet/2"]
    assert rep.limit_reached and rep.rows == 1 and "(limit reached)" in rep.summary()

    tok = copy.deepcopy(tiny_chat_model.tokenizer)
    tok.chat_template = (
        "{% for m in messages %}{% if m['role'] == 'system' %}"
        "{{ raise_exception('System role not supported') }}{% endif %}"
        "{{ m['content'] }}\n{% endfor %}"
    )
    target = HFTarget.from_model(tiny_chat_model.model, tok)
    got, [rep] = collect_training_prompts(
        _data({"kind": "jsonl", "path": SHAREGPT}), _encoder(target), []
    )
    assert [p.id for p, _ in got] == ["chats_sharegpt/1/1"]
    assert rep.skipped == {"template_error": 2}
    assert "System role not supported" in rep.examples[0]


def _text(target: HFTarget, ids: list[int]) -> str:
    """The exact text of ``ids`` (the character tokenizer's decode puts spaces between)."""
    return "".join(target.tokenizer.convert_ids_to_tokens(ids))


def _thinking_target(tiny_chat_model: HFTarget) -> HFTarget:
    tok = copy.deepcopy(tiny_chat_model.tokenizer)
    tok.chat_template = tok.chat_template + (
        "{% if add_generation_prompt and enable_thinking is defined and not enable_thinking %}"
        "<think></think>{% endif %}"
    )
    return HFTarget.from_model(tiny_chat_model.model, tok)


def test_chat_template_kwargs_reach_the_template(tiny_chat_model: HFTarget) -> None:
    target = _thinking_target(tiny_chat_model)
    msgs = [{"role": "user", "content": "hi"}]
    plain = _text(target, target.encode_chat(msgs))
    off = _text(target, target.encode_chat(msgs, chat_template_kwargs={"enable_thinking": False}))
    assert off == plain + "<think></think>"
    with pytest.raises(ValueError, match="tokenize"):
        target.encode_chat(msgs, chat_template_kwargs={"tokenize": False})


def _train_config(tmp_path: Path, **data: Any) -> TrainConfig:
    return TrainConfig.from_dict(
        {
            "name": "sources",
            "target": {"name": "tiny", "layer_ids": [0, 1, 2]},
            "data": {"dir": str(tmp_path / "data"), "max_new_tokens": 2, **data},
            "drafter": {"block_size": 4},
            "run": {"out_dir": str(tmp_path / "run"), "threads": 1},
        }
    )


def test_data_stage_uses_sources_and_template_kwargs_and_records_skips(
    tiny_chat_model: HFTarget,
    tiny_eval_cache: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("DSPARK_CACHE_DIR", str(tiny_eval_cache))
    target = _thinking_target(tiny_chat_model)
    cfg = _train_config(
        tmp_path,
        sources=[{"kind": "jsonl", "path": MESSAGES}],
        chat_template_kwargs={"enable_thinking": False},
        max_prompt_tokens=60,
        gen_batch_size=8,
    )
    run_data_stage(cfg, target, limit=None, progress=False, gen_batches=1)
    out = capsys.readouterr().out
    assert "chats_messages.jsonl: 3 rows -> " in out and "over_long" in out
    summary = json.loads((tmp_path / "data" / SOURCES_FILE).read_text())
    [src] = summary["sources"]
    assert src["skipped"]["over_long"] >= 1
    assert summary["prompts"] == src["prompts"] == 5 - src["skipped"]["over_long"]
    assert summary["chat_template_kwargs"] == {"enable_thinking": False}
    shard = tmp_path / "data" / "responses" / "shard-00000.jsonl"
    rec = json.loads(shard.read_text().splitlines()[0])
    assert _text(target, rec["prompt_ids"]).endswith("<|im_start|>assistant\n<think></think>")


def test_mask_token_id_override_and_the_detection_error(
    tiny_chat_model: HFTarget, tmp_path: Path
) -> None:
    assert resolve_mask_token_id(_train_config(tmp_path), tiny_chat_model) == (
        tiny_chat_model.tokenizer.mask_token_id
    )
    assert resolve_mask_token_id(_train_config(tmp_path, mask_token_id=3), tiny_chat_model) == 3
    vocab = tiny_chat_model.spec.vocab_size
    with pytest.raises(ValueError, match=f"data.mask_token_id={vocab} is outside"):
        resolve_mask_token_id(_train_config(tmp_path, mask_token_id=vocab), tiny_chat_model)
    tok = copy.deepcopy(tiny_chat_model.tokenizer)
    tok.mask_token = None
    no_mask = HFTarget.from_model(tiny_chat_model.model, tok)
    with pytest.raises(ValueError, match=r"no mask token.*Set data\.mask_token_id"):
        resolve_mask_token_id(_train_config(tmp_path), no_mask)
    assert resolve_mask_token_id(_train_config(tmp_path, mask_token_id=4), no_mask) == 4


def test_sources_are_typed_structs() -> None:
    d = _data({"kind": "builtin"}, {"kind": "jsonl", "path": MESSAGES, "limit": 3})
    assert d.sources == (BuiltinSource(), JsonlSource(path=MESSAGES, limit=3))
    assert d.builtin_source() == BuiltinSource()
    assert d.sources[1].stem == "chats_messages"  # type: ignore[union-attr]
