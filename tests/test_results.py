"""Result files carry no absolute paths of the machine that wrote them."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from dspark_sglang import results
from dspark_sglang.targets.smollm2 import cache_root

ROOT = Path(__file__).resolve().parents[1]
MACHINE_PATH = re.compile(r'"(/root|/home|/work|/tmp|/var/folders)/')


def test_known_roots_become_portable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DSPARK_CACHE_DIR", str(tmp_path / "cache"))
    cache = cache_root().resolve()
    assert results.portable_path(str(cache / "runs/x")) == "$DSPARK_CACHE_DIR/runs/x"
    assert results.portable_path(str(ROOT / "benchmarks/results/a.json")) == (
        "benchmarks/results/a.json"
    )
    assert results.portable_path("relative/path") == "relative/path"
    for p in (cache / "runs/x", ROOT / "benchmarks/results/a.json", Path("/opt/elsewhere")):
        assert results.local_path(results.portable_path(str(p))) == p
    assert results.portable_path("/opt/elsewhere") == "/opt/elsewhere"
    body = {"a": [str(cache / "m"), 3, {"b": str(ROOT / "x")}], "n": None}
    out = results.dump_json(tmp_path / "sub" / "r.json", body)
    assert json.loads(out.read_text()) == {
        "a": ["$DSPARK_CACHE_DIR/m", 3, {"b": "x"}],
        "n": None,
    }


def test_committed_results_hold_no_machine_paths() -> None:
    files = [*sorted((ROOT / "benchmarks" / "results").rglob("*.json"))]
    files += sorted((ROOT / "dspark_sglang" / "assets").rglob("*.json"))
    assert files
    bad = [str(f.relative_to(ROOT)) for f in files if MACHINE_PATH.search(f.read_text())]
    assert bad == [], f"absolute machine paths in {bad}; write results with results.dump_json"
