"""What the plugin installs into SGLang (called from ``sglang_plugin.load``)."""

from __future__ import annotations

import logging

from dspark_sglang.sglang_integration import cpu_bridges, cpu_linear

logger = logging.getLogger(__name__)

_installed = False


def install() -> None:
    """Install everything once per process."""
    global _installed
    if _installed:
        return
    _installed = True
    cpu_bridges.install()
    cpu_linear.install()
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
