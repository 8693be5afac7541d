"""Your own chat data as training prompts: JSONL of OpenAI ``messages`` or ShareGPT
``conversations`` rows, one conversation per line (``.jsonl`` or ``.jsonl.gz``).

Why prompts and not conversations: the drafter must learn the *target's* distribution,
so the data stage regenerates every reply with the target. Each assistant turn of a row
becomes one prompt, the conversation before that turn; the turn's own text is discarded
(earlier assistant turns stay in the prompt as the file has them). A row that ends with a
user turn also gives one prompt, the whole conversation (so a file of prompts without
replies works too).

Two row shapes, optionally with an ``"id"`` (a non-empty string or an integer)::

    {"messages": [{"role": "system"|"user"|"assistant", "content": "..."}, ...]}
    {"conversations": [{"from": "system"|"human"|"gpt"|"user"|"assistant", "value": "..."}]}

Bad rows are never dropped silently: each is skipped with one of ``ROW_REASONS`` into a
``SkipLog`` (a count per reason and the first few, with their line numbers), and the
caller skips prompts with ``PROMPT_REASONS`` the same way (``encode_or_skip``; a file
left without any prompt raises ``no_usable_prompt``). Two callers read these files: the
training data stage (``training.prompts``) and ``bench acceptance --prompts``
(``bench.acceptance``). Prompt ids are stable:
``<file stem>/<line>/<k>`` (``<file stem>/<id>/<k>`` for a row with an id), ``k`` the
1-based number of the reply within the row.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dspark_sglang.data.evalsets import Domain, Message, Prompt

#: Why a row is skipped, and how to fix it.
ROW_REASONS: dict[str, str] = {
    "not_json": "the line is not valid UTF-8 JSON; write one JSON object per line",
    "not_object": "the line is JSON but not an object; write one JSON object per line",
    "no_conversation": (
        'the row needs exactly one of "messages" (OpenAI: role/content) or "conversations" '
        "(ShareGPT: from/value), a non-empty list of turns"
    ),
    "bad_turn": (
        'every turn must be an object with string "role" and "content" (messages) or '
        '"from" and "value" (conversations); multi-part content lists are not read'
    ),
    "unknown_role": (
        "roles must be system, user or assistant (ShareGPT: system, human, gpt, user, "
        "assistant); drop or rename other turns (tool, function, ...)"
    ),
    "empty_content": "every turn needs non-empty text",
    "no_user_turn": "the conversation needs at least one user turn",
    "turn_order": (
        "system turns come first, and every assistant turn must follow a user turn "
        "(no assistant turn before the first user turn or right after another assistant turn)"
    ),
    "bad_id": 'a row "id" must be a non-empty string without "/" or an integer',
    "duplicate_id": 'row ids must be unique within a file; drop the "id" to number by line',
}

#: Why a prompt (one reply of a row) is skipped, and how to fix it.
PROMPT_REASONS: dict[str, str] = {
    "over_long": "the prompt is longer than data.max_prompt_tokens: raise it or shorten the rows",
    "over_context": (
        "the prompt and --max-new-tokens together exceed the target's context "
        "(max_position_embeddings): lower --max-new-tokens or shorten the rows"
    ),
    "eval_overlap": (
        "the prompt contains an eval prompt (GSM8K test, HumanEval or MT-Bench), which must "
        "never be trained on; nothing to fix, it is left out"
    ),
    "template_error": (
        "the target's chat template refused the conversation (e.g. roles that must "
        "alternate); fix the row or the template"
    ),
}

_OPENAI_ROLES = {"system": "system", "user": "user", "assistant": "assistant"}
_SHAREGPT_ROLES = {**_OPENAI_ROLES, "human": "user", "gpt": "assistant"}
_FORMATS: dict[str, tuple[str, str, dict[str, str]]] = {
    # row key: (role key, content key, accepted role names -> Message role)
    "messages": ("role", "content", _OPENAI_ROLES),
    "conversations": ("from", "value", _SHAREGPT_ROLES),
}


class RowError(ValueError):
    """A row that cannot be used: ``reason`` is a key of ``ROW_REASONS``."""

    def __init__(self, reason: str, detail: str) -> None:
        if reason not in ROW_REASONS:
            raise KeyError(f"unknown row reason {reason!r}")
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


@dataclass(frozen=True)
class ChatRow:
    """One valid conversation of a file: ``where`` is ``<file name>:<line>``, ``key`` the
    id prefix of its prompts (``<file stem>/<line or row id>``)."""

    where: str
    key: str
    messages: tuple[Message, ...]

    def __post_init__(self) -> None:
        msgs = self.messages
        if not msgs:
            raise RowError("no_conversation", "the conversation has no turns")
        if not any(m.role == "user" for m in msgs):
            raise RowError("no_user_turn", f"roles are {[m.role for m in msgs]}")
        started = False
        for i, m in enumerate(msgs, start=1):
            if m.role == "system":
                if started:
                    raise RowError("turn_order", f"turn {i} is a system turn after the first")
                continue
            if m.role == "assistant":
                prev = msgs[i - 2].role if i > 1 else None
                if prev != "user":
                    raise RowError(
                        "turn_order",
                        f"assistant turn {i} follows {prev or 'nothing'}, not a user turn",
                    )
            started = True

    def prompts(self, domain: Domain = "chat") -> list[Prompt]:
        """One prompt per assistant turn (the turns before it), plus the whole conversation
        when it ends with a user turn; ids ``<key>/<k>``, ``k`` = 1, 2, ... in order."""
        out: list[Prompt] = []
        for i, m in enumerate(self.messages):
            if m.role == "assistant":
                out.append(Prompt(f"{self.key}/{len(out) + 1}", domain, self.messages[:i]))
        if self.messages[-1].role == "user":
            out.append(Prompt(f"{self.key}/{len(out) + 1}", domain, self.messages))
        return out


def _turns(obj: Mapping[str, Any]) -> tuple[Message, ...]:
    keys = [k for k in _FORMATS if k in obj]
    if len(keys) != 1:
        got = "both" if keys else f"neither (keys: {sorted(obj)[:6]})"
        raise RowError("no_conversation", f'"messages" or "conversations": {got}')
    row_key = keys[0]
    role_key, content_key, roles = _FORMATS[row_key]
    turns = obj[row_key]
    if not isinstance(turns, list) or not turns:
        raise RowError(
            "no_conversation", f'"{row_key}" must be a non-empty list, got {turns!r}'[:200]
        )
    out: list[Message] = []
    for i, t in enumerate(turns, start=1):
        if not isinstance(t, Mapping):
            raise RowError("bad_turn", f"{row_key} turn {i} is not an object")
        role, content = t.get(role_key), t.get(content_key)
        if not isinstance(role, str) or not isinstance(content, str):
            raise RowError(
                "bad_turn",
                f'{row_key} turn {i} needs string "{role_key}" and "{content_key}", got '
                f"{type(role).__name__} and {type(content).__name__}",
            )
        if role not in roles:
            raise RowError(
                "unknown_role",
                f"{row_key} turn {i} has {role_key} {role!r} (allowed: {', '.join(roles)})",
            )
        if not content.strip():
            raise RowError("empty_content", f"{row_key} turn {i} ({role}) has no text")
        out.append(Message(roles[role], content))  # type: ignore[arg-type]
    return tuple(out)


def _row_name(obj: Mapping[str, Any], lineno: int) -> str:
    if "id" not in obj:
        return str(lineno)
    rid = obj["id"]
    if isinstance(rid, bool) or not isinstance(rid, str | int) or str(rid).strip() == "":
        raise RowError("bad_id", f"id {rid!r}")
    if "/" in str(rid):
        raise RowError("bad_id", f"id {rid!r} contains '/'")
    return str(rid)


def parse_row(line: bytes | str, *, stem: str, name: str, lineno: int) -> ChatRow:
    """One JSONL line as a ``ChatRow``; raises ``RowError`` naming what is wrong."""
    try:
        obj = json.loads(line)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise RowError("not_json", str(exc)[:120]) from exc
    if not isinstance(obj, dict):
        raise RowError("not_object", f"got a JSON {type(obj).__name__}")
    messages = _turns(obj)
    return ChatRow(f"{name}:{lineno}", f"{stem}/{_row_name(obj, lineno)}", messages)


@dataclass
class SkipLog:
    """Skips of one source: a count per reason and the first ``max_examples`` of them."""

    max_examples: int = 5
    counts: dict[str, int] = field(default_factory=dict)
    examples: list[str] = field(default_factory=list)

    def add(self, reason: str, where: str, detail: str) -> None:
        if reason not in ROW_REASONS and reason not in PROMPT_REASONS:
            raise KeyError(f"unknown skip reason {reason!r}")
        self.counts[reason] = self.counts.get(reason, 0) + 1
        if len(self.examples) < self.max_examples:
            self.examples.append(f"{where}: {reason}: {detail}")

    @property
    def rows(self) -> int:
        return sum(n for r, n in self.counts.items() if r in ROW_REASONS)

    @property
    def prompts(self) -> int:
        return sum(n for r, n in self.counts.items() if r in PROMPT_REASONS)

    def fix(self, n: int = 3) -> str:
        """How to fix the ``n`` most frequent reasons (the first seen first on a tie)."""
        hints = {**ROW_REASONS, **PROMPT_REASONS}
        top = sorted(self.counts, key=lambda r: -self.counts[r])[:n]
        return "; ".join(f"{r}: {hints[r]}" for r in top)


def skip_counts(counts: Mapping[str, int]) -> str:
    """``"reason n, reason n"`` sorted by reason ("" without skips)."""
    return ", ".join(f"{r} {n}" for r, n in sorted(counts.items()))


def skip_lines(counts: Mapping[str, int], examples: Sequence[str], prefix: str) -> str:
    """What a one-line source summary appends: ``"; skipped <counts>"`` and one line per
    example, each starting with ``prefix`` ("" without skips)."""
    if not counts:
        return ""
    return f"; skipped {skip_counts(counts)}" + "".join(f"\n{prefix}{e}" for e in examples)


def no_usable_prompt(source: str, path: Path, rows: int, log: SkipLog) -> ValueError:
    """The error for a file that gave no prompt: ``source`` names the setting or flag
    (``data.sources[1]``, ``--prompts heldout``), then the counts, the first skips and
    how to fix the most frequent reasons."""
    counts = skip_counts(log.counts) or "no rows"
    first = "; ".join(log.examples[:3])
    fix = log.fix() or ROW_REASONS["no_conversation"]
    return ValueError(
        f"{source}: {path} gave no usable prompt ({rows} rows; skipped {counts}"
        f"{'; first: ' + first if first else ''}). Fix: {fix}"
    )


Encode = Callable[[list[dict[str, str]]], list[int]]
"""Chat messages -> token ids through the target's chat template (``HFTarget.encode_chat``)."""


def encode_or_skip(
    prompt: Prompt,
    where: str,
    encode: Encode,
    log: SkipLog,
    max_tokens: int,
    *,
    too_long: str = "over_long",
    limit: str = "data.max_prompt_tokens",
) -> list[int] | None:
    """``prompt``'s token ids, or ``None`` with the skip in ``log``: ``template_error`` when
    the chat template refuses the conversation, ``too_long`` (a ``PROMPT_REASONS`` key)
    when it has more than ``max_tokens`` tokens (``limit`` names the bound in the detail)."""
    from jinja2 import TemplateError

    try:
        ids = encode(prompt.chat())
    except (TemplateError, ValueError) as exc:
        log.add("template_error", where, str(exc)[:160])
        return None
    if len(ids) > max_tokens:
        log.add(too_long, where, f"{len(ids)} tokens > {limit}={max_tokens}")
        return None
    return ids


def stem_of(path: Path) -> str:
    """``chats`` for ``chats.jsonl`` and ``chats.jsonl.gz``."""
    name = path.name
    for suffix in (".jsonl.gz", ".jsonl", ".gz"):
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return path.stem


def read_chat_rows(path: str | Path, log: SkipLog) -> Iterator[ChatRow]:
    """The valid rows of a chat JSONL file in file order; bad rows go to ``log``.

    Blank lines are not rows. A missing file raises ``FileNotFoundError``.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"chat data file {path} not found")
    stem, seen = stem_of(path), set()
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rb") as f:
        for lineno, line in enumerate(f, start=1):
            if lineno == 1:
                line = line.removeprefix(b"\xef\xbb\xbf")  # a UTF-8 byte-order mark
            if not line.strip():
                continue
            try:
                row = parse_row(line, stem=stem, name=path.name, lineno=lineno)
                if row.key in seen:
                    raise RowError("duplicate_id", f"{row.key!r} was used by an earlier row")
            except RowError as exc:
                log.add(exc.reason, f"{path.name}:{lineno}", exc.detail)
                continue
            seen.add(row.key)
            yield row
