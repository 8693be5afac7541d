"""The per-cell record of a live frontier run, so a grid of many hours can stop and resume.

A JSON-lines file. Line 1, ``{"settings": {...}}``: what the figures depend on (the
engines' server flags and scheduler configs, output length, prompts per cell, the prompt
and values files' sha256, threads, dtype, seed, the code's git commit). Then one line per
measured (repeat, cell, engine): ``{"repeat", "prompt_set", "concurrency",
"temperature", "engine", "figures"}``, appended and flushed as soon as the cell's
bench_serving run is read.

Resuming (the same file given again): a record whose settings differ is refused, naming
the first setting that differs (figures of other code or flags are not mixed). A
(repeat, cell) counts as done only when every engine of the run is recorded for it, so
the engines of a cell always took their turns together; a cell cut short is measured
again whole, and its new lines replace the old ones.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from dspark_sglang.bench.live_frontier.rows import Cell

_REPO = Path(__file__).resolve().parents[3]

Key = tuple[int, Cell, str]


def file_sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def source_commit(repo: Path = _REPO) -> str:
    """``git rev-parse HEAD`` of the checkout, ``+dirty`` with uncommitted changes to
    tracked files; ``unknown`` outside a git checkout."""
    try:
        head = subprocess.run(
            ["git", "-C", str(repo), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(repo), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("+dirty" if dirty else "")


def _first_difference(a: Any, b: Any, where: str = "settings") -> str | None:
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        for k in sorted(set(a) | set(b)):
            if k not in a or k not in b:
                return f"{where}.{k}"
            found = _first_difference(a[k], b[k], f"{where}.{k}")
            if found:
                return found
        return None
    return None if a == b else where


class CellRecord:
    """The record at ``path`` (module doc): read at start, appended after every cell."""

    def __init__(self, path: Path, settings: Mapping[str, Any]) -> None:
        self.path = path
        self.settings = json.loads(json.dumps(settings))  # as it reads back from the file
        self.figures: dict[Key, dict[str, Any]] = {}
        if path.is_file() and path.stat().st_size:
            self._read()
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            with path.open("w", encoding="utf-8") as f:
                f.write(json.dumps({"settings": self.settings}) + "\n")

    def _read(self) -> None:
        lines = [ln for ln in self.path.read_text(encoding="utf-8").splitlines() if ln.strip()]
        try:
            head = json.loads(lines[0])["settings"]
            rows = [json.loads(ln) for ln in lines[1:]]
        except (json.JSONDecodeError, KeyError, IndexError, TypeError) as exc:
            raise ValueError(
                f"{self.path} is not a live frontier cell record ({exc}); give another "
                "--cells file or delete this one"
            ) from exc
        differs = _first_difference(head, self.settings)
        if differs:
            raise ValueError(
                f"{self.path} was measured with other settings ({differs} differs): its cells "
                "cannot be mixed with this run's; give another --cells file"
            )
        for r in rows:
            cell = Cell(str(r["prompt_set"]), int(r["concurrency"]), float(r["temperature"]))
            self.figures[(int(r["repeat"]), cell, str(r["engine"]))] = r["figures"]

    def done(self, repeat: int, cell: Cell, engines: Sequence[str]) -> bool:
        """Whether every engine's figures are recorded for ``cell`` in ``repeat``."""
        return all((repeat, cell, e) in self.figures for e in engines)

    def add(self, repeat: int, cell: Cell, engine: str, figures: Mapping[str, Any]) -> None:
        """Record one engine's figures for ``cell`` in ``repeat`` (appended and flushed)."""
        line = {
            "repeat": repeat,
            "prompt_set": cell.prompt_set,
            "concurrency": cell.concurrency,
            "temperature": cell.temperature,
            "engine": engine,
            "figures": dict(figures),
        }
        with self.path.open("a", encoding="utf-8") as f:
            f.write(json.dumps(line) + "\n")
        self.figures[(repeat, cell, engine)] = dict(figures)

    def runs(
        self, cells: Sequence[Cell], engines: Sequence[str], repeats: int
    ) -> dict[tuple[Cell, str], list[dict[str, Any]]]:
        """``{(cell, engine): [figures per repeat]}`` over the complete (repeat, cell)s."""
        out: dict[tuple[Cell, str], list[dict[str, Any]]] = {}
        for rep in range(repeats):
            for cell in cells:
                if not self.done(rep, cell, engines):
                    continue
                for e in engines:
                    out.setdefault((cell, e), []).append(self.figures[(rep, cell, e)])
        return out
