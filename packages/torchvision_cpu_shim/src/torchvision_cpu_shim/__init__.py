"""Make PyPI's CUDA-linked torchvision importable under a CPU-only torch.

Why: PyPI's torchvision wheel links its C++ ops against CUDA; with the CPU
torch wheel its ``_C`` extension fails to load, and
``torchvision/_meta_registrations.py`` then crashes at import because it
registers fake kernels for ``torchvision::nms``/``qnms``, which do not exist.
SGLang imports torchvision indirectly (image transforms), so the engine cannot
start. Defining those two op schemas *before* torchvision loads is enough; we
also give ``nms`` a small pure-torch CPU kernel so the op is real, not a stub.

Activation: :func:`activate` is called from a ``.pth`` file at interpreter
start-up. It only installs a meta-path finder (no torch import); the schemas
are registered the first time something imports ``torchvision``.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from collections.abc import Sequence
from types import ModuleType

_registered = False


def nms_reference(dets: object, scores: object, iou_threshold: float) -> object:
    """Greedy non-maximum suppression (torchvision semantics), pure torch.

    Boxes are ``(x1, y1, x2, y2)``; visits boxes by descending score and keeps a
    box unless its IoU with an already kept box exceeds ``iou_threshold``.
    Returns the kept indices in descending score order.
    """
    import torch

    assert isinstance(dets, torch.Tensor) and isinstance(scores, torch.Tensor)
    if dets.numel() == 0:
        return torch.empty(0, dtype=torch.int64, device=dets.device)
    order = torch.argsort(scores, descending=True)
    boxes = dets[order].float()
    x1, y1, x2, y2 = boxes.unbind(-1)
    area = (x2 - x1).clamp(min=0) * (y2 - y1).clamp(min=0)
    ix1 = torch.maximum(x1[:, None], x1[None, :])
    iy1 = torch.maximum(y1[:, None], y1[None, :])
    ix2 = torch.minimum(x2[:, None], x2[None, :])
    iy2 = torch.minimum(y2[:, None], y2[None, :])
    inter = (ix2 - ix1).clamp(min=0) * (iy2 - iy1).clamp(min=0)
    iou = inter / (area[:, None] + area[None, :] - inter).clamp(min=1e-12)
    suppressed = torch.zeros(len(order), dtype=torch.bool)
    keep: list[int] = []
    for i in range(len(order)):  # greedy by definition: each step depends on the last
        if bool(suppressed[i]):
            continue
        keep.append(i)
        suppressed |= iou[i] > iou_threshold
    return order[torch.tensor(keep, dtype=torch.int64)]


def register_schemas() -> None:
    """Define ``torchvision::nms``/``qnms`` if torchvision's own library did not."""
    global _registered
    if _registered:
        return
    _registered = True
    import torch

    if hasattr(torch.ops.torchvision, "nms"):
        return
    lib = torch.library.Library("torchvision", "FRAGMENT")
    lib.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    lib.impl("nms", nms_reference, "CPU")
    lib.define(
        "qnms(Tensor dets, Tensor scores, float iou_threshold, float scale, int zero_point)"
        " -> Tensor"
    )
    # Keep the library object alive for the life of the process.
    sys.modules[__name__].__dict__["_library"] = lib


class _TorchvisionImportHook(importlib.abc.MetaPathFinder):
    """Registers the schemas the moment ``torchvision`` is first imported."""

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None,
        target: ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname == "torchvision":
            sys.meta_path[:] = [f for f in sys.meta_path if f is not self]
            register_schemas()
        return None  # let the normal finders load torchvision itself


def activate() -> None:
    """Install the import hook (cheap; called from the ``.pth`` file)."""
    if "torchvision" in sys.modules:
        return
    if not any(isinstance(f, _TorchvisionImportHook) for f in sys.meta_path):
        sys.meta_path.insert(0, _TorchvisionImportHook())
