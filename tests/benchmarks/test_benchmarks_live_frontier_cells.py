"""The live frontier's per-cell record (``dspark_sglang.bench.live_frontier.cells``) and the
script's grid: a long run resumes where it stopped and never mixes other settings' cells.

Covered: a new record starts with its settings; a reopened one with the same settings
gives back every recorded figure; a (repeat, cell) counts as done only with every engine
recorded, and rows are built from the done ones alone (a cell cut short is measured again
and its new lines win); other settings, or a file that is not a record, are refused by name.
The script's grid runs ``math_code`` at ``--math-code-concurrency`` only.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from bench_scripts import load_benchmark

from dspark_sglang.bench.live_frontier.cells import CellRecord
from dspark_sglang.bench.live_frontier.rows import Cell

ENGINES = ("plain", "prefix")
SETTINGS = {"commit": "abc", "engines": list(ENGINES), "output_len": 64}
A, B = Cell("all", 1, 0.0), Cell("all", 4, 0.0)


def _fig(x: float) -> dict[str, float]:
    return {"output_tok_s": x, "user_tok_s": x / 2}


def test_a_reopened_record_resumes_from_its_complete_cells(tmp_path: Path) -> None:
    path = tmp_path / "lf.cells.jsonl"
    rec = CellRecord(path, SETTINGS)
    assert path.read_text().splitlines() == ['{"settings": {"commit": "abc", "engines": '
                                             '["plain", "prefix"], "output_len": 64}}']  # fmt: skip
    rec.add(0, A, "plain", _fig(10))
    rec.add(0, A, "prefix", _fig(12))
    rec.add(0, B, "plain", _fig(30))  # cut short: prefix never ran in (0, B)
    again = CellRecord(path, SETTINGS)
    assert again.done(0, A, ENGINES) and not again.done(0, B, ENGINES)
    assert again.runs([A, B], ENGINES, repeats=2) == {
        (A, "plain"): [_fig(10)],
        (A, "prefix"): [_fig(12)],
    }
    again.add(0, B, "plain", _fig(31))  # measured again whole: the new line wins
    again.add(0, B, "prefix", _fig(29))
    third = CellRecord(path, SETTINGS)
    assert third.runs([A, B], ENGINES, repeats=1)[(B, "plain")] == [_fig(31)]


def test_other_settings_or_a_foreign_file_are_refused_by_name(tmp_path: Path) -> None:
    path = tmp_path / "lf.cells.jsonl"
    CellRecord(path, SETTINGS).add(0, A, "plain", _fig(10))
    with pytest.raises(ValueError, match=r"settings\.commit differs"):
        CellRecord(path, {**SETTINGS, "commit": "def"})
    with pytest.raises(ValueError, match=r"settings\.threads differs"):
        CellRecord(path, {**SETTINGS, "threads": 1})
    foreign = tmp_path / "other.jsonl"
    foreign.write_text('{"rows": []}\n')
    with pytest.raises(ValueError, match="not a live frontier cell record"):
        CellRecord(foreign, SETTINGS)


def test_math_code_runs_at_its_own_concurrencies_only() -> None:
    script = load_benchmark("live_frontier", "live_frontier_script")
    args = script.parse_args(
        ["--concurrency", "1", "4", "--temperatures", "0", "--math-code-concurrency", "1"]
    )
    assert script.grid(args) == [
        Cell("all", 1, 0.0),
        Cell("all", 4, 0.0),
        Cell("math_code", 1, 0.0),
    ]
    with pytest.raises(SystemExit):
        script.parse_args(["--concurrency", "1", "4", "--math-code-concurrency", "2"])
