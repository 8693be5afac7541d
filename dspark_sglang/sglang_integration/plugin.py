"""What the plugin installs into SGLang (called from ``sglang_plugin.load``).

``DSPARK_PLUGIN_SCOPE`` in the server's environment chooses how much: ``all`` (unset) is
everything below; ``cpu-bridges`` only the CPU platform shims (``cpu_bridges``,
``cpu_linear``), so SGLang's own algorithms and model classes, its built-in ``DSPARK``
included, run on a CPU engine with nothing of this package on their path (no
``DSPARK_MOE``, no draft-config reader, no hook on the draft step, requests or scheduler).
"""

from __future__ import annotations

import logging
import os

from dspark_sglang.sglang_integration import cpu_bridges, cpu_linear

logger = logging.getLogger(__name__)

_installed = False
SCOPE_ENV = "DSPARK_PLUGIN_SCOPE"
SCOPES = ("all", "cpu-bridges")


def scope() -> str:
    """The scope ``DSPARK_PLUGIN_SCOPE`` asks for (module docstring); anything else is
    refused naming the variable and its values."""
    value = os.environ.get(SCOPE_ENV, "all") or "all"
    if value not in SCOPES:
        raise ValueError(f"{SCOPE_ENV}={value!r}: expected one of {SCOPES} (unset: all)")
    return value


def install() -> None:
    """Install what ``DSPARK_PLUGIN_SCOPE`` asks for, once per process."""
    global _installed
    if _installed:
        return
    chosen = scope()
    _installed = True
    cpu_bridges.install()
    cpu_linear.install()
    if chosen == "cpu-bridges":
        logger.info("dspark-sglang plugin: CPU bridges only (%s=cpu-bridges)", SCOPE_ENV)
        return
    from dspark_sglang.sglang_integration import (
        draft_checkpoint,
        dspark_moe,
        hidden_capture,
        map_step,
        requests,
        round_profile,
        scheduler_bridge,
    )

    # Cheap and needed in every process (server args read the draft's config.json);
    # the model class itself is registered by DSparkMoeWorker, where a draft is built.
    draft_checkpoint.register_hf_config()

    dspark_moe.register()
    map_step.install()
    scheduler_bridge.install()
    requests.install()
    # Drafter training data: only when DSPARK_CAPTURE_FINAL_STATE=1 (a capture server).
    hidden_capture.install()
    # Profiling aid: registers its timing hooks only when DSPARK_PROFILE_ROUNDS is set.
    round_profile.install()
