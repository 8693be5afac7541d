"""The pinned helm binary and the chart's rendered objects (chart and deploy tests).

``tests/`` is on ``sys.path`` (pyproject's pytest ``pythonpath``), so any test
module can ``from chart_tools import ...``.
"""

from __future__ import annotations

import functools
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
CHART = ROOT / "helm" / "dspark-sglang"
#: Every values file the chart ships: the defaults and each example.
SHIPPED: list[Path] = [CHART / "values.yaml", *sorted((CHART / "examples").glob("*.yaml"))]
RELEASE = "dspark"
NAMESPACE = "llm"

Manifest = dict[str, Any]


def _pinned_tool(name: str, env_var: str) -> str:
    env = os.environ.get(env_var)
    cache = Path(
        os.environ.get("DSPARK_CACHE_DIR")
        or Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "dspark-sglang"
    )
    path = Path(env) if env else cache / "bin" / name
    if not (path.is_file() and os.access(path, os.X_OK)):
        pytest.fail(
            f"{name} not found at {path}: run `bash scripts/setup.sh` "
            f"(or `bash scripts/install_helm.sh`), or point ${env_var} at a {name} binary"
        )
    return str(path)


def helm_bin() -> str:
    """The pinned helm binary; missing means the dev setup was skipped, which is an error."""
    return _pinned_tool("helm", "DSPARK_HELM")


def kubectl_bin() -> str:
    """The pinned kubectl binary (installed beside helm by ``scripts/install_helm.sh``)."""
    return _pinned_tool("kubectl", "DSPARK_KUBECTL")


def run_helm(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [helm_bin(), *args], capture_output=True, text=True, timeout=120, check=False
    )


@functools.cache
def render_text(values_file: Path) -> str:
    """``helm template`` of the chart with ``values_file`` (release dspark, namespace llm)."""
    proc = run_helm(
        "template", RELEASE, str(CHART), "--namespace", NAMESPACE, "-f", str(values_file)
    )
    assert proc.returncode == 0, f"helm template -f {values_file.name} failed:\n{proc.stderr}"
    return proc.stdout


def render(values_file: Path) -> list[Manifest]:
    return [d for d in yaml.safe_load_all(render_text(values_file)) if d]
