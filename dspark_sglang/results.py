"""Result files that travel: JSON without the absolute paths of the machine that wrote it.

Benchmark, calibration and validation results are committed and read on other
machines, so every string that is an absolute path under a known root is
written relative to it: the project cache (``$DSPARK_CACHE_DIR/...``), the
checkout or installed package (a repository-relative path), the temp dir
(``$TMPDIR/...``) or the home directory (``~/...``). Everything else is kept.

A benchmark run writes to a fresh run folder by default (:func:`run_dir`,
:func:`default_out`), so that running one never overwrites the committed results in
``benchmarks/results/``; ``--out`` names the file to write instead.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import tempfile
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from dspark_sglang.targets.smollm2 import cache_root

__all__ = [
    "default_out",
    "dump_json",
    "fmt_or_dash",
    "local_path",
    "portable",
    "portable_path",
    "run_dir",
    "software_versions",
]

_REPO = Path(__file__).resolve().parents[1]


def _roots() -> list[tuple[str, str]]:
    """(absolute prefix, replacement) pairs, the most specific first."""
    pairs = [
        (str(cache_root().resolve()), "$DSPARK_CACHE_DIR"),
        (str(_REPO), ""),
        (str(Path(tempfile.gettempdir()).resolve()), "$TMPDIR"),
        (str(Path.home().resolve()), "~"),
    ]
    return sorted(((p.rstrip("/"), r) for p, r in pairs if p != "/"), key=lambda x: -len(x[0]))


def portable_path(text: str) -> str:
    """``text`` with a leading known root replaced (see the module doc); else unchanged."""
    if not text.startswith("/"):
        return text
    for prefix, repl in _roots():
        if text == prefix or text.startswith(prefix + os.sep):
            rest = text[len(prefix) :].lstrip(os.sep)
            if not repl:
                return rest or "."
            return f"{repl}/{rest}" if rest else repl
    return text


def local_path(text: str) -> Path:
    """A path a result file stores, on this machine (the inverse of :func:`portable_path`).

    ``$DSPARK_CACHE_DIR/...``, ``$TMPDIR/...`` and ``~/...`` resolve against this
    machine's roots; an absolute path is kept; any other is relative to the checkout.
    """
    for repl, root in (
        ("$DSPARK_CACHE_DIR", cache_root()),
        ("$TMPDIR", Path(tempfile.gettempdir())),
        ("~", Path.home()),
    ):
        if text == repl or text.startswith(repl + "/"):
            return root / text[len(repl) :].lstrip("/")
    p = Path(text)
    return p if p.is_absolute() else _REPO / p


def portable(value: Any) -> Any:
    """``value`` (parsed JSON) with every string passed through :func:`portable_path`."""
    if isinstance(value, str):
        return portable_path(value)
    if isinstance(value, Mapping):
        return {k: portable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [portable(v) for v in value]
    return value


def dump_json(
    path: str | Path, body: Any, *, indent: int | None = 2, allow_nan: bool = True
) -> Path:
    """Write ``portable(body)`` as JSON, creating the folder."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(portable(body), indent=indent, allow_nan=allow_nan) + "\n")
    return out


def run_dir(benchmark: str, *, now: datetime | None = None) -> Path:
    """A fresh run folder, ``<cache>/runs/bench/<benchmark>-<UTC YYYYmmdd-HHMMSS>/`` (created).

    ``<cache>`` is :func:`~dspark_sglang.targets.smollm2.cache_root`. The default home of a
    benchmark's output: the committed results are only written when ``--out`` names them.
    """
    if not benchmark or "/" in benchmark or benchmark.startswith("."):
        raise ValueError(f"benchmark name {benchmark!r}: give a plain name such as 'frontier'")
    stamp = (now or datetime.now(UTC)).astimezone(UTC).strftime("%Y%m%d-%H%M%S")
    out = cache_root() / "runs" / "bench" / f"{benchmark}-{stamp}"
    out.mkdir(parents=True, exist_ok=True)
    return out


def default_out(benchmark: str, filename: str, *, now: datetime | None = None) -> Path:
    """``run_dir(benchmark) / filename``: where a benchmark writes when ``--out`` is not given."""
    return run_dir(benchmark, now=now) / filename


def software_versions() -> dict[str, str]:
    """Python, torch, transformers and this package's versions, stamped into results."""
    import importlib.metadata as md

    import torch
    import transformers

    try:
        ours = md.version("dspark-sglang")
    except md.PackageNotFoundError:
        ours = "unknown (not installed)"
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "dspark_sglang": ours,
    }


def spread(values: Sequence[float]) -> dict[str, float]:
    """Median and range of one figure over a benchmark's repeats."""
    if not values:
        raise ValueError("no values to summarise")
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def fmt_or_dash(x: float | None, spec: str) -> str:
    """``x`` formatted with ``spec`` for a printed table, ``-`` where it is None."""
    return "-" if x is None else format(x, spec)
