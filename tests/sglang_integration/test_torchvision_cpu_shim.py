"""The torchvision op-schema shim (installed only where PyPI's torchvision cannot load)."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

shim = pytest.importorskip("torchvision_cpu_shim", reason="shim not needed on this machine")


def test_nms_reference_keeps_boxes_greedily_by_score() -> None:
    boxes = torch.tensor(
        [
            [0.0, 0.0, 10.0, 10.0],  # best
            [1.0, 1.0, 11.0, 11.0],  # IoU 0.68 with the best -> dropped at 0.5
            [20.0, 20.0, 30.0, 30.0],  # disjoint -> kept
            [0.0, 0.0, 10.0, 5.0],  # IoU 0.5 with the best: not > 0.5 -> kept
        ]
    )
    scores = torch.tensor([0.9, 0.8, 0.3, 0.5])
    kept = shim.nms_reference(boxes, scores, 0.5)
    assert kept.tolist() == [0, 3, 2]
    assert shim.nms_reference(boxes, scores, 0.7).tolist() == [0, 1, 3, 2]


def test_torchvision_imports_in_a_fresh_interpreter() -> None:
    code = (
        "import torch, torchvision.transforms\n"
        "b = torch.tensor([[0., 0., 1., 1.], [0., 0., 1., 1.]])\n"
        "print(torch.ops.torchvision.nms(b, torch.tensor([0.2, 0.9]), 0.5).tolist())\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "[1]"
