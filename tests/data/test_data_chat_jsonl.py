"""Chat JSONL loader: both row formats, multi-turn expansion, and every bad-row reason."""

from __future__ import annotations

import gzip
import shutil
from pathlib import Path

import pytest

from dspark_sglang.data.chat_jsonl import (
    PROMPT_REASONS,
    ROW_REASONS,
    ChatRow,
    RowError,
    SkipLog,
    parse_row,
    read_chat_rows,
)
from dspark_sglang.data.evalsets import Message

FIXTURES = Path(__file__).parent / "fixtures"


def _prompts(path: Path) -> tuple[dict[str, list[tuple[str, str]]], SkipLog]:
    log = SkipLog()
    out = {}
    for row in read_chat_rows(path, log):
        for p in row.prompts():
            out[p.id] = [(m.role, m.content) for m in p.messages]
    return out, log


def test_openai_messages_expand_to_one_prompt_per_assistant_turn() -> None:
    got, log = _prompts(FIXTURES / "chats_messages.jsonl")
    assert log.counts == {}
    # Row ids: the row's "id" where it has one, else its line (blank line 3 is no row).
    assert list(got) == [
        "chats_messages/greet/1",
        "chats_messages/greet/2",
        "chats_messages/2/1",
        "chats_messages/2/2",
        "chats_messages/4/1",
    ]
    sys, hello = ("system", "You are terse."), ("user", "Say hello.")
    assert got["chats_messages/greet/1"] == [sys, hello]  # the reply itself is not kept
    # Earlier replies stay in later prompts as the file has them.
    assert got["chats_messages/greet/2"] == [
        sys,
        hello,
        ("assistant", "Hello."),
        ("user", "Now in French."),
    ]
    # A row ending with a user turn gives one more prompt: the whole conversation.
    assert got["chats_messages/2/2"][-1] == ("user", "And the next one?")
    assert got["chats_messages/4/1"] == [("user", "Write a limerick about tea.")]
    assert all(turns[-1][0] == "user" for turns in got.values())


def test_sharegpt_conversations_map_human_and_gpt(tmp_path: Path) -> None:
    got, log = _prompts(FIXTURES / "chats_sharegpt.jsonl")
    assert log.counts == {}
    assert got == {
        "chats_sharegpt/1/1": [("user", "What is 2 + 2?")],
        "chats_sharegpt/7/1": [("system", "Answer in one word."), ("user", "Capital of France?")],
        "chats_sharegpt/7/2": [
            ("system", "Answer in one word."),
            ("user", "Capital of France?"),
            ("assistant", "Paris."),
            ("user", "Of Italy?"),
        ],
    }
    # .jsonl.gz reads the same, with the same ids (the stem drops both suffixes).
    gz = tmp_path / "chats_sharegpt.jsonl.gz"
    with gzip.open(gz, "wb") as f:
        f.write((FIXTURES / "chats_sharegpt.jsonl").read_bytes())
    assert _prompts(gz)[0] == got


def test_every_bad_row_reason_is_counted_with_its_line() -> None:
    log = SkipLog(max_examples=20)
    rows = list(read_chat_rows(FIXTURES / "chats_bad.jsonl", log))
    assert [r.key for r in rows] == ["chats_bad/1", "chats_bad/twice"]
    assert log.counts == dict.fromkeys(ROW_REASONS, 1)  # one row per reason, none silent
    assert log.rows == len(ROW_REASONS) and log.prompts == 0
    lines = {e.split(": ")[1]: e.split(": ")[0] for e in log.examples}
    assert lines == {
        "not_json": "chats_bad.jsonl:2",
        "not_object": "chats_bad.jsonl:3",
        "no_conversation": "chats_bad.jsonl:4",
        "bad_turn": "chats_bad.jsonl:5",
        "unknown_role": "chats_bad.jsonl:6",
        "empty_content": "chats_bad.jsonl:7",
        "no_user_turn": "chats_bad.jsonl:8",
        "turn_order": "chats_bad.jsonl:9",
        "bad_id": "chats_bad.jsonl:10",
        "duplicate_id": "chats_bad.jsonl:12",
    }
    assert "'tool'" in next(e for e in log.examples if "unknown_role" in e)


def test_skip_log_keeps_the_first_few_and_counts_all(tmp_path: Path) -> None:
    path = tmp_path / "many.jsonl"
    path.write_text("nope\n" * 9)
    log = SkipLog(max_examples=3)
    assert list(read_chat_rows(path, log)) == []
    assert log.counts == {"not_json": 9}
    assert [e.split(":")[1] for e in log.examples] == ["1", "2", "3"]
    assert log.fix() == f"not_json: {ROW_REASONS['not_json']}"
    with pytest.raises(KeyError):
        log.add("no_such_reason", "x", "y")
    assert set(PROMPT_REASONS).isdisjoint(ROW_REASONS)


def test_row_validation_lives_in_the_row() -> None:
    u, a, s = Message("user", "q"), Message("assistant", "r"), Message("system", "s")
    ChatRow("f:1", "f/1", (s, u, u, a, u))  # two user turns in a row are fine
    for msgs, reason in (
        ((s, a, u), "turn_order"),
        ((u, a, a), "turn_order"),
        ((u, s, a), "turn_order"),
        ((s, a), "no_user_turn"),
        ((), "no_conversation"),
    ):
        with pytest.raises(RowError) as exc:
            ChatRow("f:1", "f/1", msgs)
        assert exc.value.reason == reason
    with pytest.raises(RowError, match=r"no_conversation.*both"):
        parse_row('{"messages": [], "conversations": []}', stem="f", name="f.jsonl", lineno=1)


def test_a_missing_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"nothere\.jsonl"):
        list(read_chat_rows(tmp_path / "nothere.jsonl", SkipLog()))
    shutil.copy(FIXTURES / "chats_messages.jsonl", tmp_path / "c.jsonl")
    assert len(list(read_chat_rows(tmp_path / "c.jsonl", SkipLog()))) == 3
