"""The CPU speed benchmark's grid: its engines, its cells and each cell's own prompts."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

SETS = ("gsm8k", "humaneval", "mtbench")
DSPARK = "DSPARK_MOE"
NGRAM = "NGRAM"
PLAIN = "plain"


@dataclass(frozen=True)
class Engine:
    """One engine of the run: ``plain``, ``DSPARK_MOE`` with a policy, or ``NGRAM``."""

    algorithm: str
    policy: str | None = None

    def __post_init__(self) -> None:
        if self.algorithm not in (PLAIN, DSPARK, NGRAM):
            raise ValueError(f"Engine.algorithm must be plain, {DSPARK} or {NGRAM}")
        if (self.algorithm == DSPARK) != (self.policy is not None):
            raise ValueError("Engine.policy is given for DSPARK_MOE engines only")

    @property
    def label(self) -> str:
        return f"{self.algorithm}/{self.policy}" if self.policy else self.algorithm


@dataclass(frozen=True)
class Cell:
    """One point of the grid."""

    prompt_set: str
    concurrency: int
    temperature: float

    @property
    def label(self) -> str:
        return f"{self.prompt_set} c={self.concurrency} T={self.temperature:g}"


def grid(
    sets: Sequence[str], concurrency: Sequence[int], temperatures: Sequence[float]
) -> list[Cell]:
    """Every cell, set-major (the order each engine runs them in)."""
    return [Cell(s, c, float(t)) for s in sets for c in concurrency for t in temperatures]


def engines(policies: Sequence[str], ngram: bool) -> list[Engine]:
    """Plain first, then DSPARK_MOE per policy, then NGRAM (the first repeat's start order)."""
    out = [Engine(PLAIN)] + [Engine(DSPARK, p) for p in policies]
    return [*out, Engine(NGRAM)] if ngram else out


def rotated(items: Sequence[Any], repeat: int) -> list[Any]:
    """``items`` started ``repeat`` places on (repeat 0: as given): no engine always first."""
    if not items:
        return []
    k = repeat % len(items)
    return [*items[k:], *items[:k]]


def check_cell_size(num_prompts: int, concurrency: int) -> None:
    """A cell must hold at least ``concurrency`` prompts, or it never has that many in flight."""
    if concurrency < 1:
        raise ValueError(f"concurrency must be >= 1, got {concurrency}")
    if num_prompts < concurrency:
        raise ValueError(
            f"{num_prompts} prompts cannot keep {concurrency} requests in flight: "
            "--prompts-per-cell must be at least the highest --concurrency"
        )


def cell_prompt_slices(cells: Sequence[Cell], per_cell: int) -> dict[Cell, range]:
    """Which prompts of its set each cell sends: cell ``j`` of a set, counting that set's
    cells in the order given, takes prompts ``j*per_cell .. j*per_cell+per_cell-1``.

    No two cells share a prompt, so nothing a speculative engine learnt from one cell's
    outputs (NGRAM's n-gram corpus) is replayed in another; every engine uses the same map.
    """
    if per_cell < 1:
        raise ValueError(f"--prompts-per-cell must be >= 1, got {per_cell}")
    if len(set(cells)) != len(cells):
        raise ValueError("cells lists a cell twice")
    seen: dict[str, int] = {}
    out = {}
    for cell in cells:
        j = seen.get(cell.prompt_set, 0)
        seen[cell.prompt_set] = j + 1
        out[cell] = range(j * per_cell, (j + 1) * per_cell)
    return out


def prompts_needed(cells: Sequence[Cell], per_cell: int) -> dict[str, int]:
    """Prompts each set must have: ``per_cell`` x that set's cells."""
    slices = cell_prompt_slices(cells, per_cell)
    need: dict[str, int] = {}
    for cell, idx in slices.items():
        need[cell.prompt_set] = max(need.get(cell.prompt_set, 0), idx.stop)
    return need


def check_set_size(name: str, available: int, needed: int, per_cell: int) -> None:
    """Raise ``ValueError`` naming the flags when eval set ``name`` is too small for the grid."""
    if available < needed:
        raise ValueError(
            f"eval set {name!r} has {available} prompts; the grid needs {needed}: "
            f"--prompts-per-cell {per_cell} distinct prompts for each of its "
            f"{needed // per_cell} cells (--concurrency levels x --temperatures). Lower "
            "--prompts-per-cell or give fewer --concurrency / --temperatures values"
        )


def cell_prompts(
    cells: Sequence[Cell], per_set: Mapping[str, Sequence[Any]], per_cell: int
) -> dict[Cell, list[Any]]:
    """Each cell's own prompts, taken from its set's list by ``cell_prompt_slices``; built
    once per run, so every engine sends the same prompts in the same cell. ``ValueError``
    naming the flags when a set's list is too short for the grid."""
    slices = cell_prompt_slices(cells, per_cell)
    for name, needed in prompts_needed(cells, per_cell).items():
        check_set_size(name, len(per_set.get(name, ())), needed, per_cell)
    return {c: [per_set[c.prompt_set][i] for i in idx] for c, idx in slices.items()}
