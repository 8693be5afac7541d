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


def test_run_dir_is_a_fresh_timestamped_folder_under_the_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import datetime as dt

    monkeypatch.setenv("DSPARK_CACHE_DIR", str(tmp_path / "cache"))
    when = dt.datetime(2026, 12, 2, 9, 5, 7, tzinfo=dt.UTC)
    d = results.run_dir("frontier", now=when)
    assert d == tmp_path / "cache" / "runs" / "bench" / "frontier-20261202-090507"
    assert d.is_dir()
    out = results.default_out("frontier", "frontier.json", now=when)
    assert out == d / "frontier.json" and not out.exists()
    # a zone-aware time is written in UTC
    east = dt.datetime(2026, 12, 2, 11, 5, 7, tzinfo=dt.timezone(dt.timedelta(hours=2)))
    assert results.run_dir("frontier", now=east) == d
    for bad in ("", "a/b", ".."):
        with pytest.raises(ValueError):
            results.run_dir(bad)


@pytest.mark.parametrize(
    ("module", "benchmark"),
    [
        ("dspark_sglang.cli.bench_acceptance", "acceptance"),
        ("dspark_sglang.cli.bench_sim_validation", "sim_validation"),
    ],
)
def test_bench_commands_default_to_a_run_folder(
    module: str, benchmark: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without --out a run never touches benchmarks/results/; --plot goes beside --out."""
    import argparse
    import importlib

    monkeypatch.setenv("DSPARK_CACHE_DIR", str(tmp_path / "cache"))
    from dspark_sglang.cli.base import resolve_outputs

    mod = importlib.import_module(module)
    assert benchmark == mod.BENCHMARK
    args = argparse.Namespace(out=None, plot=None)
    resolve_outputs(args, mod.BENCHMARK)
    assert args.out.parent.parent == tmp_path / "cache" / "runs" / "bench"
    assert args.out.parent.name.startswith(f"{benchmark}-")
    assert args.out.name == f"{benchmark}.json"
    assert args.plot == args.out.with_suffix(".png")
    args = argparse.Namespace(out=tmp_path / "x.json", plot=None)
    resolve_outputs(args, mod.BENCHMARK)
    assert (args.out, args.plot) == (tmp_path / "x.json", tmp_path / "x.png")
