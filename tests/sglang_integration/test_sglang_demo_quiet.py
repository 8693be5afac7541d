"""The demo's warning filter (``demo.QUIET_WARNINGS``, set as ``PYTHONWARNINGS`` for its
engine processes) hides the third-party notes it names and nothing else."""

from __future__ import annotations

import os
import subprocess
import sys

from dspark_sglang.sglang_integration.demo import QUIET_WARNINGS

CODE = """
import warnings
warnings.warn("Only CUDA, HIP and XPU support AWQ currently.")
warnings.warn("Triton is not supported on current platform, roll back to CPU.")
warnings.warn("resource_tracker: There appear to be 4 leaked semaphore objects")
warnings.warn("a warning of our own")
warnings.warn("Only CUDA here", RuntimeWarning)
"""


def _stderr(filters: str | None) -> str:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONWARNINGS"}
    if filters is not None:
        env["PYTHONWARNINGS"] = filters
    done = subprocess.run(
        [sys.executable, "-c", CODE],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    return done.stderr


def test_the_named_notes_are_hidden_and_every_other_warning_shows() -> None:
    quiet = _stderr(QUIET_WARNINGS)
    for hidden in ("Only CUDA, HIP", "Triton is not supported", "resource_tracker"):
        assert hidden not in quiet
    assert "a warning of our own" in quiet
    assert "RuntimeWarning: Only CUDA here" in quiet  # another category is not hidden
    loud = _stderr(None)
    assert "Only CUDA, HIP" in loud and "resource_tracker" in loud
