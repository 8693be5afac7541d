"""How many torch threads a test's own matrix work may use.

``make test`` runs two pytest-xdist workers on a 2-core machine. A test that also
asks for two OpenMP threads then shares each core with the other worker's test, and
OpenMP's spinning barriers make it several times slower (the reference generator on
SmolLM2 took 3.5x as long). Under xdist each worker gets ``cores // workers`` threads
(at least 1); a run without xdist gets up to ``most``.
"""

from __future__ import annotations

import os


def torch_threads(most: int = 2) -> int:
    """Threads for this pytest process: its share of the cores, at most ``most``."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    return max(1, min(most, (os.cpu_count() or 1) // max(workers, 1)))
