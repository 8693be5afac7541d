"""Print dspark-sglang's runtime requirements for ``pip install -r`` in the image build.

Usage: ``python runtime_requirements.py PYPROJECT [EXTRAS]`` (EXTRAS comma-separated,
e.g. ``gpu,fleet``). Prints ``[project].dependencies`` plus the requirements of each
chosen extra, one per line, as written there. deploy/docker/Dockerfile installs the
package with ``--no-deps`` and then these under constraints that pin everything the
SGLang base image already has, so the base's sglang/torch/flashinfer are never
replaced. The ``sglang`` extra is refused: the base image *is* that SGLang.

Standard library only: it runs on the base image's Python before the package exists.
"""

from __future__ import annotations

import sys
import tomllib
from pathlib import Path

BASE_PROVIDED_EXTRAS = frozenset({"sglang"})


def runtime_requirements(pyproject: Path, extras: list[str]) -> list[str]:
    project = tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"]
    optional = project.get("optional-dependencies", {})
    reqs = list(project.get("dependencies", []))
    for extra in extras:
        if extra in BASE_PROVIDED_EXTRAS:
            raise SystemExit(f"extra {extra!r} is provided by the SGLang base image; drop it")
        if extra not in optional:
            raise SystemExit(f"unknown extra {extra!r}; pyproject has {sorted(optional)}")
        reqs.extend(optional[extra])
    return list(dict.fromkeys(reqs))


def main(argv: list[str]) -> int:
    if len(argv) not in (1, 2):
        print("usage: runtime_requirements.py PYPROJECT [EXTRAS]", file=sys.stderr)
        return 2
    extras = [e.strip() for e in (argv[1] if len(argv) == 2 else "").split(",") if e.strip()]
    print("\n".join(runtime_requirements(Path(argv[0]), extras)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
