"""What the plugin installs into SGLang (called from ``sglang_plugin.load``)."""

from __future__ import annotations

import logging

from dspark_sglang.sglang_integration import cpu_bridges

logger = logging.getLogger(__name__)

_installed = False


def install() -> None:
    """Install everything once per process."""
    global _installed
    if _installed:
        return
    _installed = True
    cpu_bridges.install()
    from dspark_sglang.sglang_integration import dspark_moe, scheduler_bridge

    dspark_moe.register()
    scheduler_bridge.install()
