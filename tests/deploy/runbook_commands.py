"""The shell steps of the runbooks (deploy/runbooks/*.md), parsed into commands.

``tests/deploy/test_runbooks.py`` executes or checks every command this module finds. It
reads two kinds of step from a runbook, in document order:

- fenced blocks: ```` ```bash ````/``sh``/``shell``/``console`` and untagged ones (an
  untagged block is a command block unless the test lists it as printed output);
  ``yaml``/``promql``/``json`` blocks are not commands;
- inline code spans in the prose that are a command (they start with ``kubectl``,
  ``helm`` or ``dspark-sglang``, or are ``VAR=$(...)``): many steps (rollback, scale,
  restart) live only there. A span that only names a command and its flags
  (``helm upgrade``, ``dspark-sglang profile --prune``) is a *mention*; one with a
  ``...`` argument is *elided*.

The parser knows the shell a runbook uses and nothing more: words with '...', "...",
``\\`` escapes, ``$VAR``/``${VAR}``, ``$(...)`` (nested), ``#`` comments, backslash
continuations, ``|``, ``&&``, ``||``, ``;``, ``>``/``>>``/``2>&1``, leading
``VAR=value`` assignments and ``for NAME in ...; do ...; done``. ``<name>`` is a runbook
placeholder (``<tier>``), never a redirect. Anything else (subshells, ``if``, here-docs)
raises, so a new construct fails the test instead of being misread.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

SHELL_LANGS = {"bash", "sh", "shell", "console"}
#: Fenced blocks in these languages are data or queries, never shell steps.
NON_SHELL_LANGS = {"yaml", "yml", "promql", "json", "text"}
COMMAND_WORDS = ("kubectl", "helm", "dspark-sglang")
PLACEHOLDER = re.compile(r"<([A-Za-z][A-Za-z0-9 _-]*)>")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class ShellSyntaxError(ValueError):
    """A construct the runbook parser does not support (so the test cannot misread it)."""


# ----------------------------------------------------------------------------- sources


@dataclass(frozen=True)
class Source:
    """One step of a runbook: a fenced block or an inline code span."""

    runbook: str
    kind: str  # "block" | "inline"
    index: int  # running number of blocks (or of inline spans) in the runbook
    line: int  # 1-based line in the markdown file
    lang: str  # fence language ("" untagged; "inline" for spans)
    text: str
    #: Inline only: "command", "mention" (names a command/flags) or "elided" (has `...`).
    role: str = "command"

    @property
    def label(self) -> str:
        return f"{self.runbook}:{self.line} ({self.kind} {self.index})"


_FENCE = re.compile(r"^(\s*)```\s*([A-Za-z0-9_+-]*)\s*$")
_SPAN = re.compile(r"(?<!`)`([^`]+)`(?!`)")


def fenced_blocks(markdown: str) -> list[tuple[int, str, str]]:
    """``(line, lang, text)`` of every fenced block, dedented by its fence's indent."""
    out = []
    lines = markdown.splitlines()
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, lang, start = len(m.group(1)), m.group(2).lower(), i + 1
        body = []
        i += 1
        while i < len(lines) and not re.match(r"^\s*```\s*$", lines[i]):
            ln = lines[i]
            body.append(ln[indent:] if ln[:indent].strip() == "" else ln.lstrip())
            i += 1
        if i >= len(lines):
            raise ShellSyntaxError(f"unclosed ``` block opened at line {start}")
        out.append((start, lang, "\n".join(body) + "\n"))
        i += 1
    return out


def _blank_fences(markdown: str) -> str:
    """The markdown with fenced blocks blanked (same line count), for finding spans."""
    out, inside = [], False
    for ln in markdown.splitlines():
        if re.match(r"^\s*```", ln):
            inside = not inside
            out.append("")
        else:
            out.append("" if inside else ln)
    return "\n".join(out)


def _inline_role(text: str) -> str | None:
    words = text.split()
    if not words:
        return None
    if re.match(r"^[A-Za-z_][A-Za-z0-9_]*=\$\(", text):
        return "command"
    if words[0] not in COMMAND_WORDS or len(words) == 1:
        return None  # prose, or a bare tool name (`dspark-sglang`, the dashboard uid)
    if any(w == "..." or w.endswith("...") for w in words):
        return "elided"
    rest = words[1:]
    # `helm upgrade`, `helm history`: one verb. `dspark-sglang bench acceptance`,
    # `dspark-sglang profile --prune`: subcommand words and bare flags, no value (the test
    # checks the words are subcommands and the flags exist).
    if words[0] != "dspark-sglang":
        return "mention" if len(rest) == 1 and re.fullmatch(r"[a-z][a-z-]*", rest[0]) else "command"
    if len(rest) <= 3 and all(re.fullmatch(r"[a-z][a-z-]*|--[a-z][a-z0-9-]*", w) for w in rest):
        return "mention"
    return "command"


def runbook_sources(path: Path) -> list[Source]:
    """Every fenced block and every inline command span of one runbook, in document order."""
    md = path.read_text(encoding="utf-8")
    found: list[Source] = []
    for n, (line, lang, text) in enumerate(fenced_blocks(md)):
        found.append(Source(path.name, "block", n, line, lang, text))
    blanked = _blank_fences(md)
    k = 0
    for m in _SPAN.finditer(blanked):
        text = " ".join(m.group(1).split())  # a span may wrap across lines
        role = _inline_role(text)
        if role is None:
            continue
        line = blanked.count("\n", 0, m.start()) + 1
        found.append(Source(path.name, "inline", k, line, "inline", text, role))
        k += 1
    found.sort(key=lambda s: (s.line, s.kind != "block"))
    return found


# ----------------------------------------------------------------------------- words


@dataclass
class Lit:
    text: str
    quote: str = ""  # "", "'" or '"'


@dataclass
class Var:
    name: str
    quoted: bool = False


@dataclass
class Sub:
    script: list  # list[Node]
    raw: str
    quoted: bool = False


Part = Lit | Var | Sub


@dataclass
class Word:
    parts: list[Part]
    start: int
    end: int

    def literal(self) -> str | None:
        """The word's text if it has no expansion (placeholders are literal here)."""
        if all(isinstance(p, Lit) for p in self.parts):
            return "".join(p.text for p in self.parts)  # type: ignore[union-attr]
        return None


@dataclass
class Simple:
    """One simple command: ``VAR=x cmd arg... > file``."""

    assigns: list[tuple[str, Word]]
    words: list[Word]
    redirects: list[tuple[str, Word | None]]
    start: int
    end: int
    raw: str = ""
    source: Source | None = None
    ordinal: int = -1  # position among all commands of the runbook (set by the test)


@dataclass
class Pipeline:
    cmds: list[Simple]


@dataclass
class AndOr:
    pipelines: list[Pipeline]
    ops: list[str]


@dataclass
class For:
    var: str
    items: list[Word]
    body: list  # list[Node]
    header: Simple  # the `for NAME in ...` words, for ordering and substitutions


Node = AndOr | For


# ----------------------------------------------------------------------------- parser


@dataclass
class _Tok:
    kind: str  # "word" | "op"
    value: object
    start: int
    end: int


@dataclass
class _Parser:
    s: str
    i: int = 0
    toks: list[_Tok] = field(default_factory=list)

    def error(self, msg: str) -> ShellSyntaxError:
        ctx = self.s[max(0, self.i - 30) : self.i + 30].replace("\n", "\\n")
        return ShellSyntaxError(f"{msg} at offset {self.i}: ...{ctx}...")

    # A word is a list of parts; consecutive literal characters merge.
    def tokenize(self, stop: str | None = None) -> list[_Tok]:
        s = self.s
        toks: list[_Tok] = []
        parts: list[Part] = []
        wstart = -1

        def add_lit(ch: str, quote: str = "") -> None:
            if parts and isinstance(parts[-1], Lit) and parts[-1].quote == quote:
                parts[-1].text += ch
            else:
                parts.append(Lit(ch, quote))

        def end_word() -> None:
            nonlocal parts, wstart
            if parts:
                toks.append(_Tok("word", Word(parts, wstart, self.i), wstart, self.i))
            parts, wstart = [], -1

        def begin() -> None:
            nonlocal wstart
            if wstart < 0:
                wstart = self.i

        while self.i < len(s):
            c = s[self.i]
            if stop and c == stop:
                end_word()
                return toks
            if c == "\\" and s.startswith("\\\n", self.i):  # continuation
                self.i += 2
                continue
            if c in " \t":
                end_word()
                self.i += 1
                continue
            if c == "\n":
                end_word()
                toks.append(_Tok("op", "\n", self.i, self.i + 1))
                self.i += 1
                continue
            if c == "#" and not parts:
                while self.i < len(s) and s[self.i] != "\n":
                    self.i += 1
                continue
            if c == "'":
                begin()
                j = s.find("'", self.i + 1)
                if j < 0:
                    raise self.error("unterminated '")
                add_lit(s[self.i + 1 : j], "'")
                if not s[self.i + 1 : j]:
                    parts.append(Lit("", "'"))
                self.i = j + 1
                continue
            if c == '"':
                begin()
                self.i += 1
                self._double(parts, add_lit)
                continue
            if c == "\\":
                begin()
                if self.i + 1 < len(s):
                    add_lit(s[self.i + 1], "\\")
                self.i += 2
                continue
            if c == "$":
                begin()
                self._dollar(parts, add_lit, quoted=False)
                continue
            if c == "<":
                m = PLACEHOLDER.match(s, self.i)
                if m:
                    begin()
                    add_lit(m.group(0))
                    self.i = m.end()
                    continue
                raise self.error("input redirection / unsupported '<'")
            if c in "|&;":
                end_word()
                two = s[self.i : self.i + 2]
                op = two if two in ("&&", "||") else c
                if op == "&":
                    raise self.error("background '&' is not supported")
                toks.append(_Tok("op", op, self.i, self.i + len(op)))
                self.i += len(op)
                continue
            if c == ">":
                fd = ""
                if (
                    parts
                    and len(parts) == 1
                    and isinstance(parts[0], Lit)
                    and parts[0].text
                    in (
                        "1",
                        "2",
                    )
                    and not parts[0].quote
                ):
                    fd = parts[0].text
                    parts.clear()
                    wstart = -1
                end_word()
                if s.startswith(">&", self.i):
                    m = re.match(r">&(\d)", s[self.i :])
                    if not m:
                        raise self.error("unsupported >&")
                    toks.append(_Tok("op", f"{fd}>&{m.group(1)}", self.i, self.i + m.end()))
                    self.i += m.end()
                    continue
                op = ">>" if s.startswith(">>", self.i) else ">"
                toks.append(_Tok("op", fd + op, self.i, self.i + len(op)))
                self.i += len(op)
                continue
            if c in "()" or c == "`":
                raise self.error(f"unsupported {c!r} (subshell / backquote)")
            begin()
            add_lit(c)
            self.i += 1
        if stop:
            raise self.error(f"missing {stop!r}")
        end_word()
        return toks

    def _double(self, parts: list[Part], add_lit) -> None:
        s = self.s
        while self.i < len(s):
            c = s[self.i]
            if c == '"':
                if not parts:
                    parts.append(Lit("", '"'))
                self.i += 1
                return
            if c == "\\" and self.i + 1 < len(s) and s[self.i + 1] in '"\\$`\n':
                if s[self.i + 1] != "\n":
                    add_lit(s[self.i + 1], '"')
                self.i += 2
                continue
            if c == "$":
                self._dollar(parts, add_lit, quoted=True)
                continue
            if c == "`":
                raise self.error("backquote substitution is not supported")
            add_lit(c, '"')
            self.i += 1
        raise self.error('unterminated "')

    def _dollar(self, parts: list[Part], add_lit, quoted: bool) -> None:
        s = self.s
        if s.startswith("$(", self.i):
            if s.startswith("$((", self.i):
                raise self.error("arithmetic $(( )) is not supported")
            start = self.i
            inner = _Parser(s, self.i + 2)
            toks = inner.tokenize(stop=")")
            self.i = inner.i + 1
            parts.append(Sub(_build(toks, s), s[start : self.i], quoted))
            return
        m = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}|\$([A-Za-z_][A-Za-z0-9_]*)").match(
            s, self.i
        )
        if m:
            parts.append(Var(m.group(1) or m.group(2), quoted))
            self.i = m.end()
            return
        add_lit("$", '"' if quoted else "")
        self.i += 1


def _simple(toks: list[_Tok], s: str) -> Simple:
    assigns: list[tuple[str, Word]] = []
    words: list[Word] = []
    redirects: list[tuple[str, Word | None]] = []
    i = 0
    while i < len(toks):
        t = toks[i]
        if t.kind == "op":
            op = str(t.value)
            if ">&" in op:
                redirects.append((op, None))
                i += 1
                continue
            if i + 1 >= len(toks) or toks[i + 1].kind != "word":
                raise ShellSyntaxError(
                    f"redirect {op} without a target: {s[t.start : t.end + 20]!r}"
                )
            redirects.append((op, toks[i + 1].value))  # type: ignore[arg-type]
            i += 2
            continue
        w: Word = t.value  # type: ignore[assignment]
        first = w.parts[0]
        if (
            not words
            and isinstance(first, Lit)
            and not first.quote
            and re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", first.text)
        ):
            name, _, rest = first.text.partition("=")
            value = Word(([Lit(rest)] if rest else []) + w.parts[1:], w.start, w.end)
            assigns.append((name, value))
        else:
            words.append(w)
        i += 1
    start, end = toks[0].start, toks[-1].end
    return Simple(assigns, words, redirects, start, end, s[start:end])


def _build(toks: list[_Tok], s: str) -> list:
    """Tokens -> nodes (and-or lists of pipelines, for-loops)."""
    # Split into statements on newline and ';'.
    stmts: list[list[_Tok]] = [[]]
    for t in toks:
        if t.kind == "op" and t.value in ("\n", ";"):
            stmts.append([])
        else:
            stmts[-1].append(t)
    nodes: list = []
    stack: list[For] = []

    def emit(node) -> None:
        (stack[-1].body if stack else nodes).append(node)

    for st in stmts:
        if not st:
            continue
        head = st[0].value.literal() if st[0].kind == "word" else None  # type: ignore[union-attr]
        if head == "for":
            if len(st) < 3 or st[1].kind != "word" or st[2].value.literal() != "in":  # type: ignore[union-attr]
                raise ShellSyntaxError(f"unsupported for-loop: {s[st[0].start : st[-1].end]!r}")
            var = st[1].value.literal()  # type: ignore[union-attr]
            items = [t.value for t in st[3:] if t.kind == "word"]
            header = Simple(
                [], [t.value for t in st if t.kind == "word"], [], st[0].start, st[-1].end
            )  # type: ignore[misc]
            header.raw = s[header.start : header.end]
            stack.append(For(str(var), items, [], header))  # type: ignore[arg-type]
            continue
        if head == "do":
            if not stack:
                raise ShellSyntaxError("'do' outside a for-loop")
            st = st[1:]
            if not st:
                continue
            head = st[0].value.literal() if st[0].kind == "word" else None  # type: ignore[union-attr]
        if head == "done":
            if not stack or len(st) != 1:
                raise ShellSyntaxError("unsupported 'done'")
            loop = stack.pop()
            emit(loop)
            continue
        if head in ("if", "then", "fi", "while", "until", "case", "esac", "function"):
            raise ShellSyntaxError(f"unsupported shell keyword {head!r}")
        # and-or list of pipelines
        pipelines: list[Pipeline] = [Pipeline([])]
        ops: list[str] = []
        cur: list[_Tok] = []
        for t in st:
            if t.kind == "op" and t.value in ("&&", "||", "|"):
                if not cur:
                    raise ShellSyntaxError(f"empty command before {t.value}")
                pipelines[-1].cmds.append(_simple(cur, s))
                cur = []
                if t.value == "|":
                    continue
                ops.append(str(t.value))
                pipelines.append(Pipeline([]))
            else:
                cur.append(t)
        if not cur:
            raise ShellSyntaxError(f"dangling operator in {s[st[0].start : st[-1].end]!r}")
        pipelines[-1].cmds.append(_simple(cur, s))
        emit(AndOr(pipelines, ops))
    if stack:
        raise ShellSyntaxError("for-loop without 'done'")
    return nodes


def parse_script(text: str) -> list:
    """Shell text -> nodes (``AndOr`` / ``For``)."""
    p = _Parser(text)
    return _build(p.tokenize(), text)


def walk_simple(nodes: list) -> Iterator[Simple]:
    """Every simple command, including those inside ``$(...)`` and loop bodies, in source
    order (a substitution's commands come before the command that uses its output)."""
    found: list[Simple] = []

    def words(ws: list[Word]) -> None:
        for w in ws:
            for p in w.parts:
                if isinstance(p, Sub):
                    visit(p.script)

    def visit(ns: list) -> None:
        for n in ns:
            if isinstance(n, For):
                words(n.items)
                visit(n.body)
                continue
            for pl in n.pipelines:
                for c in pl.cmds:
                    words([v for _, v in c.assigns])
                    words(c.words)
                    words([w for _, w in c.redirects if w is not None])
                    found.append(c)

    visit(nodes)
    yield from found


@dataclass
class ParsedSource:
    source: Source
    nodes: list
    commands: list[Simple]


def parse_source(src: Source) -> ParsedSource:
    text = src.text
    if src.lang == "console":
        text = "\n".join(ln[2:] for ln in text.splitlines() if ln.startswith("$ ")) + "\n"
    nodes = parse_script(text)
    cmds = list(walk_simple(nodes))
    for c in cmds:
        c.source = src
    return ParsedSource(src, nodes, cmds)
