"""Reliability diagrams: a real PNG, headless, without touching matplotlib's global state."""

from __future__ import annotations

from pathlib import Path

import matplotlib
from matplotlib.image import imread

from dspark_sglang.calibration.plots import reliability_diagram


def test_reliability_diagram_leaves_the_global_backend_alone(synthetic, tmp_path: Path) -> None:
    backend = matplotlib.get_backend()
    z, acc, _ = synthetic(2_000, [1.0] * 5, 3)
    path = reliability_diagram(tmp_path / "r.png", z, acc, [1.0] * 5, n_bins=10)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert imread(path).shape[:2] == (640, 1280)  # 5 panels -> 2 rows x 4 columns
    assert matplotlib.get_backend() == backend
