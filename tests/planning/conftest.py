"""Shared inputs for the planning tests: synthetic traces and request lengths.

The staircase cost table (``table``) is a suite fixture (``tests/conftest.py``): the
``simulate`` and ``plan`` command tests use the same one.
"""

from __future__ import annotations

import pytest
import torch

from dspark_sglang.planning.traces import (
    AcceptanceTraces,
    decaying_acceptance,
    synthetic_traces,
)
from dspark_sglang.planning.workload import LengthDistribution, default_lengths

torch.set_num_threads(1)


@pytest.fixture(scope="session")
def high_traces() -> AcceptanceTraces:
    """High, slowly decaying acceptance (B = 7), heterogeneous requests, AUC 0.85."""
    return synthetic_traces(
        120, 30, decaying_acceptance(0.9, 0.98, 7), auc=0.85, request_spread=1.0, seed=1
    )


@pytest.fixture(scope="session")
def lengths() -> LengthDistribution:
    return default_lengths()


@pytest.fixture(scope="session")
def short_lengths() -> LengthDistribution:
    """Short requests so closed-loop runs take few steps."""
    return LengthDistribution((20, 40, 60, 30), (12, 25, 40, 18), "test")
