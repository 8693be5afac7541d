"""docs/ARCHITECTURE.md's import picture is the code's, and the package graph stays layered."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _graph_module():
    spec = importlib.util.spec_from_file_location(
        "package_graph", ROOT / "scripts/package_graph.py"
    )
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_documented_picture_is_the_code_s() -> None:
    pg = _graph_module()
    documented = pg.doc_block(pg.DOC.read_text(encoding="utf-8"))
    assert documented == pg.picture(pg.import_graph()), (
        "docs/ARCHITECTURE.md's import picture is stale: run `python scripts/package_graph.py "
        "--write` and commit the doc and docs/architecture-packages.png"
    )
    assert pg.PNG.is_file()


def test_no_package_imports_the_cli_and_arrows_point_down() -> None:
    pg = _graph_module()
    graph = pg.import_graph()
    assert not [p for p, deps in graph.items() if "cli" in deps]
    lay = pg.layers(graph)  # raises on a cycle
    assert all(lay[d] < lay[p] for p, deps in graph.items() for d in deps)
    # The graph was read, not assumed: the known lowest and highest packages are where
    # they belong.
    assert lay["cli"] == max(lay.values()) and lay["verify"] == 0 and "model" in graph["targets"]
