"""Inputs of the command-line tests: the same synthetic cost table and calibration rounds
as the planning and calibration folders (``synthetic_inputs``)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from synthetic_inputs import staircase, synthetic_rounds

from dspark_sglang.scheduling.cost_table import SpsCostTable


@pytest.fixture(scope="session")
def table() -> SpsCostTable:
    return staircase()


@pytest.fixture
def synthetic() -> Callable[..., tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    return synthetic_rounds
