"""Host-sync trap for the per-step code DSPARK_MOE adds to SGLang's decode step.

A decode step must not copy device values to the host in our code: every such
read stalls the device, and none can sit inside a CUDA graph. Without a GPU the
check is: make torch's Python-level read-back entry points (``SYNC_METHODS``)
raise while our per-step code runs (:func:`host_syncs_raise`).

Test-only switch, ``DSPARK_TEST_SYNC_GUARD=<file>``: the engine runs our worker
in SGLang's scheduler subprocess, so a test cannot wrap it from outside. With the
variable set, every :func:`sync_free` block (the planner hook's decision, the
fault guard's fold, the per-step metrics update) runs under
:func:`host_syncs_raise` and appends one JSON line per entry to ``<file>``:
``{"where": ..., "ok": true}`` or, when a read-back happened,
``{"where": ..., "ok": false, "error": ...}`` naming the methods (recorded, not
raised: a raise would take the scheduler process down with no message; the test
reads the report). Unset (production), :func:`sync_free` is a no-op context.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable, Iterator
from typing import Any

import torch

#: Test-only: JSON-lines report file; its presence turns the trap on (module doc).
TEST_GUARD_ENV = "DSPARK_TEST_SYNC_GUARD"

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
def _patched(wrap: Callable[[str, Callable[..., Any]], Callable[..., Any]]) -> Iterator[None]:
    """Within the block, ``torch.Tensor.<name>`` is ``wrap(name, original)`` for every
    name in ``SYNC_METHODS``; the originals are restored on exit."""
    saved = {name: getattr(torch.Tensor, name) for name in SYNC_METHODS}
    try:
        for name, original in saved.items():
            setattr(torch.Tensor, name, wrap(name, original))
        yield
    finally:
        for name, method in saved.items():
            setattr(torch.Tensor, name, method)


def host_syncs_raise(where: str = "code that must not sync") -> contextlib.AbstractContextManager:
    """Within the block, every method in ``SYNC_METHODS`` raises ``HostSyncError``."""

    def trap(name: str, original: Callable[..., Any]) -> Callable[..., Any]:
        def raiser(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            raise HostSyncError(f"Tensor.{name}() called inside {where}")

        return raiser

    return _patched(trap)


def _report(path: str, row: dict[str, Any]) -> None:
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(row) + "\n")


def host_syncs_reported(where: str, found: list[str]) -> contextlib.AbstractContextManager:
    """Within the block, every method in ``SYNC_METHODS`` appends its name to ``found``
    and then runs as usual (the step completes, the caller reports the reads)."""

    def trap(name: str, original: Callable[..., Any]) -> Callable[..., Any]:
        def recorder(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            found.append(f"Tensor.{name}() called inside {where}")
            return original(self, *args, **kwargs)

        return recorder

    return _patched(trap)


@contextlib.contextmanager
def sync_free(where: str) -> Iterator[None]:
    """Our per-step code that must not sync; trapped and reported only in tests.

    In the engine a raise would take SGLang's scheduler process (and the test) down
    without a useful message, so here the reads are recorded, not raised: the step
    completes and the report names every read (``{"ok": false, "error": ...}``).
    """
    path = os.environ.get(TEST_GUARD_ENV)
    if not path:
        yield
        return
    found: list[str] = []
    with host_syncs_reported(where, found):
        yield
    row: dict[str, Any] = {"where": where, "ok": not found}
    if found:
        row["error"] = "; ".join(dict.fromkeys(found))
    _report(path, row)
