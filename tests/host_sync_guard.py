"""Make torch's Python-level host read-backs raise, for "no host sync" tests.

CUDA graphs cannot capture a device->host sync (``.item()``, ``.tolist()``,
``bool(tensor)``, ``.cpu()``), and outside graphs every sync stalls the device.
Without a GPU, running code with these entry points of ``torch.Tensor`` patched to
raise stands in: a call of any of them fails the test, naming the method.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

SYNC_METHODS: tuple[str, ...] = (
    "item",
    "tolist",
    "cpu",
    "numpy",
    "__bool__",
    "__int__",
    "__float__",
    "__index__",
)


class HostSyncError(AssertionError):
    """A tensor was read back to the host inside code that must not sync."""


@contextlib.contextmanager
def host_syncs_raise(where: str = "code that must not sync") -> Iterator[None]:
    """Within the block, every method in ``SYNC_METHODS`` raises ``HostSyncError``."""
    saved = {name: getattr(torch.Tensor, name) for name in SYNC_METHODS}

    def trap(name: str) -> Any:
        def raiser(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            raise HostSyncError(f"Tensor.{name}() called inside {where}")

        return raiser

    try:
        for name in SYNC_METHODS:
            setattr(torch.Tensor, name, trap(name))
        yield
    finally:
        for name, method in saved.items():
            setattr(torch.Tensor, name, method)
