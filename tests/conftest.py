"""Suite-wide settings that must hold before any test module imports SGLang or torch work starts."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

# Tests never have a GPU. SGLang caches its is_cpu() probe on first use, so the
# CPU-engine switch must be in place before whichever test folder imports it first.
os.environ.setdefault("SGLANG_USE_CPU_ENGINE", "1")
# Ray must never phone home from a test run: tests must not touch the network.
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")


@pytest.fixture(scope="session")
def smollm2_path() -> Path:
    """SmolLM2-135M-Instruct as an HF folder (converted into the cache on first use)."""
    from dspark_sglang.targets.smollm2 import ensure_smollm2

    return ensure_smollm2()
