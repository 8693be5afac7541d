"""A DSPARK_MOE engine spec on SGLang's dense draft with random (``dummy``) weights."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from dspark_sglang.sglang_integration.engine import CpuEngineSpec


def dummy_draft_spec(
    target: Path, draft: Path, env: Mapping[str, str] | None = None, **overrides: Any
) -> CpuEngineSpec:
    """``--speculative-algorithm DSPARK_MOE`` with the draft at ``draft`` loaded as
    ``dummy`` (random weights), plus ``overrides`` (server arguments) and ``env``."""
    return CpuEngineSpec(
        model_path=str(target),
        overrides={
            "speculative_algorithm": "DSPARK_MOE",
            "speculative_draft_model_path": str(draft),
            "speculative_draft_load_format": "dummy",
            **overrides,
        },
        env=dict(env or {}),
    )
