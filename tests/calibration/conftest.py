"""Synthetic calibration rounds with a known miscalibration per position (``synthetic_inputs``)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from synthetic_inputs import synthetic_rounds

Synth = Callable[..., tuple[torch.Tensor, torch.Tensor, torch.Tensor]]


@pytest.fixture
def synthetic() -> Synth:
    return synthetic_rounds
