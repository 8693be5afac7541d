"""The import structure of ``dspark_sglang``, read from the code: text for the docs, a PNG.

A package is a sub-folder of ``dspark_sglang/`` or a top-level module (``sampling.py``).
``A -> B`` when some module of ``A`` imports from ``B`` (at module top or inside a
function, ``import`` or ``from``, absolute or relative). Layers: a package that imports
nothing of ours is layer 0, any other is one above the highest layer it imports, so every
arrow points down exactly when the graph has no cycle (a cycle is reported and fails).

Usage (from the repository root):
  python scripts/package_graph.py            # print the layer picture
  python scripts/package_graph.py --write    # update docs/ARCHITECTURE.md's picture and
                                             # docs/architecture-packages.png
``tests/test_architecture_doc.py`` fails when the committed picture no longer matches the
code, naming this command.
"""

from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "dspark_sglang"
DOC = ROOT / "docs" / "ARCHITECTURE.md"
PNG = ROOT / "docs" / "architecture-packages.png"
WIDTH = 90
BEGIN = "<!-- package-graph:begin (python scripts/package_graph.py --write) -->"
END = "<!-- package-graph:end -->"


def package_of(path: Path) -> str:
    rel = path.relative_to(PKG)
    return rel.parts[0] if len(rel.parts) > 1 else rel.name


def _imported(node: ast.AST, package_path: list[str]) -> list[str]:
    """First components under ``dspark_sglang`` an import statement reaches."""
    if isinstance(node, ast.Import):
        parts_list = [alias.name.split(".") for alias in node.names]
        return [parts[1] for parts in parts_list if parts[0] == "dspark_sglang" and len(parts) > 1]
    if not isinstance(node, ast.ImportFrom):
        return []
    if node.level:  # relative: level 1 is the module's own package
        base = package_path[: len(package_path) - (node.level - 1)]
        parts = base + (node.module.split(".") if node.module else [])
    else:
        parts = node.module.split(".") if node.module else []
    if not parts or parts[0] != "dspark_sglang":
        return []
    return [parts[1]] if len(parts) > 1 else [a.name for a in node.names]


def import_graph() -> dict[str, set[str]]:
    """``{package: packages it imports}`` over every module of ``dspark_sglang``."""
    graph: dict[str, set[str]] = {}
    for path in sorted(PKG.rglob("*.py")):
        pkg = package_of(path)
        if pkg == "__init__.py":
            continue
        package_path = list(path.relative_to(ROOT).parent.parts)
        deps = graph.setdefault(pkg, set())
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            for name in _imported(node, package_path):
                if (PKG / f"{name}.py").is_file():
                    label = f"{name}.py"
                elif (PKG / name).is_dir():
                    label = name
                else:
                    continue
                if label != pkg:
                    deps.add(label)
    return graph


def layers(graph: dict[str, set[str]]) -> dict[str, int]:
    done: dict[str, int] = {}
    visiting: list[str] = []

    def visit(p: str) -> int:
        if p in done:
            return done[p]
        if p in visiting:
            cycle = " -> ".join([*visiting[visiting.index(p) :], p])
            raise SystemExit(f"import cycle between packages: {cycle}")
        visiting.append(p)
        level = 1 + max((visit(d) for d in graph.get(p, ())), default=-1)
        visiting.pop()
        done[p] = level
        return level

    for p in graph:
        visit(p)
    return done


def picture(graph: dict[str, set[str]]) -> str:
    """The layer picture: one line per package, highest layer first, deps by layer."""
    lay = layers(graph)
    order = sorted(graph, key=lambda p: (-lay[p], p))
    lines = []
    prev = None
    for p in order:
        deps = sorted(graph[p], key=lambda d: (-lay[d], d))
        head = f"layer {lay[p]}" if lay[p] != prev else ""
        prev = lay[p]
        if not deps:
            lines.append(f"{head:<10}{p}  (imports nothing of ours)")
            continue
        lead = f"{head:<10}{p} ──► "
        row, indent = lead, " " * len(lead)
        for i, d in enumerate(deps):
            item = d + ("," if i < len(deps) - 1 else "")
            if len(row) + len(item) > WIDTH and row.strip() != lead.strip():
                lines.append(row.rstrip())
                row = indent
            row += item + " "
        lines.append(row.rstrip())
    return "\n".join(lines)


def draw(graph: dict[str, set[str]], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lay = layers(graph)
    by_layer: dict[int, list[str]] = {}
    for p in sorted(graph):
        by_layer.setdefault(lay[p], []).append(p)
    pos: dict[str, tuple[float, float]] = {}
    for level, members in by_layer.items():
        for i, p in enumerate(members):
            pos[p] = ((i + 0.5) / len(members), float(level))
    fig, ax = plt.subplots(figsize=(13, 1.3 * (max(by_layer) + 1) + 1))
    for p, deps in graph.items():
        for d in deps:
            (x0, y0), (x1, y1) = pos[p], pos[d]
            ax.annotate(
                "",
                xy=(x1, y1 + 0.18),
                xytext=(x0, y0 - 0.18),
                arrowprops={"arrowstyle": "->", "color": "0.55", "lw": 0.8,
                            "connectionstyle": "arc3,rad=0.05"},
            )  # fmt: skip
    for p, (x, y) in pos.items():
        ax.text(
            x, y, p, ha="center", va="center", fontsize=10,
            bbox={"boxstyle": "round,pad=0.35", "fc": "#e8f0fe", "ec": "#3c6db0"},
        )  # fmt: skip
    ax.set_yticks(sorted(by_layer), [f"layer {k}" for k in sorted(by_layer)])
    ax.set_xticks([])
    ax.set_xlim(-0.02, 1.02)
    ax.set_ylim(-0.6, max(by_layer) + 0.6)
    for side in ("top", "right", "bottom"):
        ax.spines[side].set_visible(False)
    ax.set_title("dspark_sglang: package imports (arrows point to what a package imports)")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def doc_block(text: str) -> str:
    try:
        start = text.index(BEGIN) + len(BEGIN)
        end = text.index(END)
    except ValueError as exc:
        raise SystemExit(f"{DOC}: markers {BEGIN!r} / {END!r} not found") from exc
    return text[start:end].strip().removeprefix("```").removesuffix("```").strip()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write", action="store_true", help="update the doc picture and the PNG")
    args = ap.parse_args(argv)
    graph = import_graph()
    text = picture(graph)
    if not args.write:
        print(text)
        return 0
    doc = DOC.read_text(encoding="utf-8")
    start = doc.index(BEGIN) + len(BEGIN)
    end = doc.index(END)
    DOC.write_text(doc[:start] + "\n```\n" + text + "\n```\n" + doc[end:], encoding="utf-8")
    draw(graph, PNG)
    print(f"wrote {DOC.relative_to(ROOT)} and {PNG.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
