"""Import a script of ``benchmarks/`` (not a package) by path, for the tests that drive it."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parents[1]


def load_benchmark(stem: str, module_name: str) -> ModuleType:
    """``benchmarks/<stem>.py`` as module ``module_name``, registered in ``sys.modules``
    (dataclasses resolve their annotations through it)."""
    spec = importlib.util.spec_from_file_location(module_name, REPO / "benchmarks" / f"{stem}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    spec.loader.exec_module(module)
    return module
