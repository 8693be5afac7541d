"""Training prompts: the built-in mix (math, code, chat) and the ``data.sources`` collector.

``collect_training_prompts`` turns every ``data.sources`` entry (this built-in mix, or a
chat JSONL file read by ``dspark_sglang.data.chat_jsonl``) into encoded prompts,
counting what it skips (over-long, eval overlap, bad rows) per source in a
``SourceReport``. ``EvalIndex`` is the overlap check every source goes through.

Why the built-in sources: the machines reach only package registries, and the eval
sets (GSM8K test, HumanEval, MT-Bench) must never leak into training. So:

* **math**: GSM8K *train* problems (shipped in ``assets/data/gsm8k``, MIT),
  via the project's data loader;
* **code**: functions extracted with ``ast`` from the Python standard library
  of the running interpreter, wrapped in instruction templates (explain,
  document, complete, re-implement from a docstring, test);
* **chat**: prose paragraphs from stdlib module/class docstrings wrapped in
  reading/writing instruction templates, plus open-ended instruction templates
  filled with hand-written topics.

Every builder is deterministic given ``seed`` (sorted inputs, a private
``random.Random``), ids are stable (``code/<module>.<func>/<template>``), and
``assert_disjoint`` refuses any overlap with eval prompts by id or text (the built-in
mix is refused on overlap, a bug in its builders; a file's overlapping prompts are
skipped and counted, since user data often holds public benchmark questions).
"""

from __future__ import annotations

import ast
import dataclasses
import random
import sysconfig
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from dspark_sglang.data.chat_jsonl import (
    Encode,
    SkipLog,
    encode_or_skip,
    no_usable_prompt,
    read_chat_rows,
    skip_lines,
)
from dspark_sglang.data.evalsets import (
    GSM8K_INSTRUCTION,
    HUMANEVAL_INSTRUCTION,
    Message,
    Prompt,
    load_gsm8k_train,
)
from dspark_sglang.training.config import BuiltinSource, DataConfig, JsonlSource

_SKIP_DIRS = {"test", "tests", "idlelib", "site-packages", "lib2to3", "turtledemo", "__pycache__"}

_NOT_PROSE = (" ", "\t", "-", "*", "=", "+", "|", ">>>", "..", ":")
_PER_FILE = 2  # functions (code) or paragraphs (chat) per source file, for diversity

_CODE_TEMPLATES: dict[str, str] = {
    "explain": "Explain what this Python function does, step by step:\n\n```python\n{src}\n```",
    "docstring": (
        "Write a clear docstring for this Python function and show the documented "
        "function:\n\n```python\n{nodoc}\n```"
    ),
    "complete": "Complete the body of this Python function:\n\n```python\n{stub}\n```",
    "implement": "Write a Python function `{name}{sig}` that does the following: {doc}",
    "tests": "Write pytest unit tests for this Python function:\n\n```python\n{src}\n```",
    "review": "Review this Python code and suggest improvements:\n\n```python\n{src}\n```",
}

_PROSE_TEMPLATES: dict[str, str] = {
    "summarize": "Summarize the following text in two or three sentences:\n\n{text}",
    "simplify": "Rewrite this passage in plain language for a beginner:\n\n{text}",
    "keypoints": "List the key points of this passage as bullet points:\n\n{text}",
    "questions": "Write three questions a student might ask after reading this:\n\n{text}",
    "email": "Write a short, friendly email to a colleague that explains this:\n\n{text}",
}

_INSTRUCTIONS: tuple[str, ...] = (
    "Write a short story about {topic}.",
    "Explain {topic} to a ten-year-old.",
    "Give me five practical tips about {topic}.",
    "Write a haiku about {topic}.",
    "What are the pros and cons of {topic}?",
    "Draft a short blog post introduction about {topic}.",
    "Describe a typical day of someone who works with {topic}.",
    "Write a persuasive paragraph in favour of {topic}.",
)

_TOPICS: tuple[str, ...] = (
    "learning a second language",
    "growing tomatoes on a balcony",
    "public libraries",
    "remote work",
    "the water cycle",
    "saving money for a holiday",
    "volcanoes",
    "training for a first 10k run",
    "honeybees",
    "keeping a journal",
    "solar panels",
    "board games",
    "the history of bicycles",
    "cooking rice",
    "time zones",
    "recycling plastic",
    "lighthouses",
    "making friends in a new city",
    "rainforests",
    "photography at night",
    "the moon's phases",
    "composting",
    "sleeping well",
    "open-source software",
    "migrating birds",
    "baking bread",
    "electric cars",
    "museums",
    "chess openings",
    "studying for exams",
    "tides",
    "houseplants",
)


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def _stdlib_files(root: Path) -> list[Path]:
    return sorted(
        p for p in root.rglob("*.py") if not (_SKIP_DIRS & set(p.relative_to(root).parts))
    )


def _module_name(root: Path, path: Path) -> str:
    return ".".join(path.relative_to(root).with_suffix("").parts)


def _functions(path: Path) -> Iterable[tuple[ast.FunctionDef, str]]:
    """Public-ish functions of 5-40 lines, with their (indented) source lines."""
    try:
        text = path.read_text(encoding="utf-8")
        tree = ast.parse(text)
    except (SyntaxError, UnicodeDecodeError, ValueError):
        return
    lines = text.splitlines()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and not node.name.startswith("__"):
            end = node.end_lineno or node.lineno
            if 5 <= end - node.lineno + 1 <= 40:
                src = "\n".join(lines[node.lineno - 1 : end])
                if len(src) <= 1800:
                    yield node, src


def _first_sentence(doc: str) -> str:
    para = doc.strip().split("\n\n")[0]
    return " ".join(para.split())


def _code_prompts_for(module: str, node: ast.FunctionDef, src: str) -> dict[str, str]:
    """All template renderings that make sense for one function."""
    import textwrap

    src = textwrap.dedent(src)
    doc = ast.get_docstring(node)
    lines = src.splitlines()
    header_end = node.body[0].lineno - node.lineno  # lines before the first body statement
    out = {
        "explain": _CODE_TEMPLATES["explain"].format(src=src),
        "tests": _CODE_TEMPLATES["tests"].format(src=src),
        "review": _CODE_TEMPLATES["review"].format(src=src),
    }
    if doc and len(node.body) > 1:
        body_start = node.body[1].lineno - node.lineno
        stub = "\n".join(lines[:body_start])
        nodoc = "\n".join(lines[:header_end] + lines[body_start:])
        sig = "(" + ast.unparse(node.args) + ")"
        out["docstring"] = _CODE_TEMPLATES["docstring"].format(nodoc=nodoc)
        out["complete"] = _CODE_TEMPLATES["complete"].format(stub=stub)
        out["implement"] = _CODE_TEMPLATES["implement"].format(
            name=node.name, sig=sig, doc=_first_sentence(doc)
        )
    return out


def build_code_prompts(n: int, seed: int, root: Path | None = None) -> list[Prompt]:
    """``n`` code prompts from stdlib functions (at most one template per function)."""
    if n <= 0:
        return []
    root = root or stdlib_root()
    rng = random.Random(f"code:{seed}")
    files = _stdlib_files(root)
    rng.shuffle(files)
    out: list[Prompt] = []
    seen: set[str] = set()
    for path in files:
        module = _module_name(root, path)
        funcs = list(_functions(path))
        rng.shuffle(funcs)
        for node, src in funcs[:_PER_FILE]:
            key = f"{module}.{node.name}"
            if key in seen:
                continue
            seen.add(key)
            options = _code_prompts_for(module, node, src)
            name = rng.choice(sorted(options))
            out.append(
                Prompt(
                    id=f"code/{key}/{name}",
                    domain="code",
                    messages=(Message("user", options[name]),),
                )
            )
            if len(out) >= n:
                return out
    return out


def _paragraphs(root: Path, want: int, rng: random.Random) -> list[tuple[str, str]]:
    """Up to ``want`` (source id, paragraph) pairs of 200-1200 characters of prose from
    stdlib docstrings, at most ``_PER_FILE`` per file, files in ``rng`` order."""
    paras: list[tuple[str, str]] = []
    files = _stdlib_files(root)
    rng.shuffle(files)
    for path in files:
        if len(paras) >= want:
            break
        found: list[tuple[str, str]] = []
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue
        module = _module_name(root, path)
        nodes: list[tuple[str, ast.AST]] = [(module, tree)]
        nodes += [(f"{module}.{n.name}", n) for n in tree.body if isinstance(n, ast.ClassDef)]
        for name, node in nodes:
            doc = ast.get_docstring(node)  # type: ignore[arg-type]
            if not doc:
                continue
            for j, para in enumerate(doc.split("\n\n")):
                text = " ".join(para.split())
                # Prose only: skip code samples, tables and option lists.
                if not 200 <= len(text) <= 1200 or any(
                    line.startswith(_NOT_PROSE) for line in para.splitlines()
                ):
                    continue
                if text.count(".") < 2:
                    continue
                found.append((f"{name}#{j}", text))
        paras.extend(found[:_PER_FILE])
    return paras


def build_chat_prompts(n: int, seed: int, root: Path | None = None) -> list[Prompt]:
    """``n`` chat prompts: ~2/3 reading tasks over stdlib prose, ~1/3 open instructions."""
    if n <= 0:
        return []
    root = root or stdlib_root()
    rng = random.Random(f"chat:{seed}")
    n_instr_max = n // 3
    paras = _paragraphs(root, n - n_instr_max, rng)
    instr = [(i, t) for i in range(len(_INSTRUCTIONS)) for t in range(len(_TOPICS))]
    rng.shuffle(instr)
    n_instr = min(len(instr), n_instr_max)
    out: list[Prompt] = []
    for src_id, text in paras[: n - n_instr]:
        name = rng.choice(sorted(_PROSE_TEMPLATES))
        out.append(
            Prompt(
                id=f"chat/{src_id}/{name}",
                domain="chat",
                messages=(Message("user", _PROSE_TEMPLATES[name].format(text=text)),),
            )
        )
    for i, t in instr[: n - len(out)]:
        content = _INSTRUCTIONS[i].format(topic=_TOPICS[t])
        out.append(
            Prompt(
                id=f"chat/instruction/{i}-{t}", domain="chat", messages=(Message("user", content),)
            )
        )
    return out


def build_math_prompts(n: int, seed: int) -> list[Prompt]:
    """``n`` GSM8K *train* problems, a seeded sample in file order."""
    if n <= 0:
        return []
    problems = list(load_gsm8k_train())
    rng = random.Random(f"math:{seed}")
    picked = sorted(rng.sample(range(len(problems)), min(n, len(problems))))
    return [problems[i] for i in picked]


def build_training_prompts(num_math: int, num_code: int, num_chat: int, seed: int) -> list[Prompt]:
    """The training mix, interleaved by domain (so any prefix is a balanced mix)."""
    groups = [
        build_math_prompts(num_math, seed),
        build_code_prompts(num_code, seed),
        build_chat_prompts(num_chat, seed),
    ]
    out: list[Prompt] = []
    longest = max(len(g) for g in groups)
    for i in range(longest):
        out.extend(g[i] for g in groups if i < len(g))
    ids = [p.id for p in out]
    if len(set(ids)) != len(ids):
        raise AssertionError("duplicate training prompt ids")
    return out


def _words(p: Prompt) -> list[str]:
    return " ".join(m.content for m in p.messages).split()


_WINDOW = 6  # words of an eval text that key the containment index
_MIN_CONTAINED = 40  # characters: shorter eval texts only match a whole training prompt


class EvalIndex:
    """The eval prompts, for "does this training prompt contain one?" in O(words).

    A training prompt overlaps an eval prompt when it reuses its id, equals its text, or
    contains (as a run of whole words, whitespace-insensitive) its text of at least
    ``_MIN_CONTAINED`` characters or its *core*: the text without the instruction the eval
    loader adds (``GSM8K_INSTRUCTION``, ``HUMANEVAL_INSTRUCTION``), so a raw GSM8K test
    question or HumanEval stub in a user's data is caught too.
    """

    def __init__(self, evals: Sequence[Prompt]) -> None:
        self.ids = {e.id for e in evals}
        self._exact: dict[str, str] = {}
        self._by_window: dict[tuple[str, ...], list[tuple[tuple[str, ...], str]]] = {}
        self._short: list[tuple[str, str]] = []  # long texts of fewer than _WINDOW words
        for e in evals:
            text = _words(e)
            core = " ".join(m.content for m in e.messages)
            for instruction in (GSM8K_INSTRUCTION, HUMANEVAL_INSTRUCTION):
                core = core.replace(instruction, " ")
            self._exact.setdefault(" ".join(text), e.id)
            for words in {tuple(text), tuple(core.split())}:
                if len(" ".join(words)) < _MIN_CONTAINED:
                    continue
                if len(words) < _WINDOW:
                    self._short.append((" ".join(words), e.id))
                else:
                    self._by_window.setdefault(words[:_WINDOW], []).append((words, e.id))

    def find(self, p: Prompt) -> str | None:
        """The id of an eval prompt ``p`` overlaps, else None."""
        if p.id in self.ids:
            return p.id
        words = _words(p)
        joined = " ".join(words)
        if joined in self._exact:
            return self._exact[joined]
        for i in range(len(words) - _WINDOW + 1):
            for ev, eid in self._by_window.get(tuple(words[i : i + _WINDOW]), ()):
                if tuple(words[i : i + len(ev)]) == ev:
                    return eid
        for text, eid in self._short:
            if text in joined:
                return eid
        return None


def assert_disjoint(train: Sequence[Prompt], evals: Sequence[Prompt] | EvalIndex) -> None:
    """Refuse any shared id, or any eval prompt text contained in a training prompt."""
    index = evals if isinstance(evals, EvalIndex) else EvalIndex(evals)
    shared = sorted({p.id for p in train} & index.ids)
    if shared:
        raise AssertionError(f"training prompts reuse eval ids: {shared[:5]}")
    for p in train:
        hit = index.find(p)
        if hit is not None:
            raise AssertionError(f"eval prompt {hit} appears in the training prompts ({p.id})")


# --------------------------------------------------------------------------- sources


@dataclass(frozen=True)
class SourceReport:
    """What one ``data.sources`` entry gave: rows read (files), prompts kept, skips by
    reason with the first few, and whether its ``limit`` stopped the reading."""

    source: str
    rows: int
    prompts: int
    skipped: dict[str, int]
    examples: tuple[str, ...]
    limit_reached: bool = False

    def summary(self) -> str:
        rows = f"{self.rows} rows -> " if self.source != "builtin" else ""
        line = f"[data] {self.source}: {rows}{self.prompts} prompts"
        if self.limit_reached:
            line += " (limit reached)"
        return line + skip_lines(self.skipped, self.examples, "[data]   ")

    def as_dict(self) -> dict[str, object]:
        return {**dataclasses.asdict(self), "examples": list(self.examples)}


def _report(source: str, rows: int, kept: int, log: SkipLog, limited: bool) -> SourceReport:
    return SourceReport(source, rows, kept, dict(log.counts), tuple(log.examples), limited)


def _builtin_prompts(
    src: BuiltinSource, data: DataConfig, encode: Encode, index: EvalIndex, max_examples: int
) -> tuple[list[tuple[Prompt, list[int]]], SourceReport]:
    prompts = build_training_prompts(*src.counts(data), data.seed)
    assert_disjoint(prompts, index)  # the builders' own data: an overlap is a bug, refuse
    log, out = SkipLog(max_examples), []
    for p in prompts:
        ids = encode(p.chat())
        if len(ids) > data.max_prompt_tokens:
            log.add(
                "over_long",
                p.id,
                f"{len(ids)} tokens > data.max_prompt_tokens={data.max_prompt_tokens}",
            )
            continue
        out.append((p, ids))
    return out, _report("builtin", len(prompts), len(out), log, False)


def _jsonl_prompts(
    src: JsonlSource,
    i: int,
    data: DataConfig,
    encode: Encode,
    index: EvalIndex,
    max_examples: int,
) -> tuple[list[tuple[Prompt, list[int]]], SourceReport]:
    path = Path(src.path)
    if not path.is_file():
        raise FileNotFoundError(
            f"data.sources[{i}].path: {path} not found (relative paths are relative to the "
            "repository root)"
        )
    log, out, rows, limited = SkipLog(max_examples), [], 0, False
    for row in read_chat_rows(path, log):
        rows += 1
        for k, p in enumerate(row.prompts(src.domain), start=1):  # type: ignore[arg-type]
            where = f"{row.where} reply {k}"
            hit = index.find(p)
            if hit is not None:
                log.add("eval_overlap", where, f"contains {hit}")
                continue
            ids = encode_or_skip(p, where, encode, log, data.max_prompt_tokens)
            if ids is None:
                continue
            out.append((p, ids))
            if src.limit is not None and len(out) >= src.limit:
                limited = True
                break
        if limited:
            break
    rows += log.rows
    if not out:
        raise no_usable_prompt(f"data.sources[{i}]", path, rows, log)
    return out, _report(str(path), rows, len(out), log, limited)


def collect_training_prompts(
    data: DataConfig,
    encode: Encode,
    evals: Sequence[Prompt],
    *,
    max_examples: int = 5,
) -> tuple[list[tuple[Prompt, list[int]]], list[SourceReport]]:
    """Every source of ``data`` as ``(prompt, token ids)``, interleaved source by source
    (a prefix is a mix, as within the built-in mix), and one report per source.

    ``encode`` applies the target's chat template. A prompt over ``data.max_prompt_tokens``
    is skipped and counted; a file's prompt that contains an eval prompt is skipped and
    counted (the built-in mix refuses one: it would be a bug in its builders); a file
    with no usable prompt raises naming its reasons and the fix.
    """
    index = EvalIndex(evals)
    per_source: list[list[tuple[Prompt, list[int]]]] = []
    reports: list[SourceReport] = []
    for i, src in enumerate(data.sources):
        if isinstance(src, BuiltinSource):
            got, report = _builtin_prompts(src, data, encode, index, max_examples)
        else:
            got, report = _jsonl_prompts(src, i, data, encode, index, max_examples)
        per_source.append(got)
        reports.append(report)
    out = [g[j] for j in range(max(map(len, per_source))) for g in per_source if j < len(g)]
    ids = [p.id for p, _ in out]
    if len(set(ids)) != len(ids):
        dup = sorted({x for x in ids if ids.count(x) > 1})[:5]
        raise ValueError(f"prompt ids {dup} come from two sources; rename one of the files")
    assert_disjoint([p for p, _ in out], index)
    return out, reports
