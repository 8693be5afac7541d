"""Suite-wide settings that must hold before any test module imports SGLang or torch work starts."""

from __future__ import annotations

import os

# Tests never have a GPU. SGLang caches its is_cpu() probe on first use, so the
# CPU-engine switch must be in place before whichever test folder imports it first.
os.environ.setdefault("SGLANG_USE_CPU_ENGINE", "1")
# Ray must never phone home from a test run (PLATFORM.md).
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
