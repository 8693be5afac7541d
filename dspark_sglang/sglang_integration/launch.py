"""How a ``DSPARK_MOE`` server is launched: the settings that derive from the drafter and tier.

One home for the facts every launcher needs (the Helm chart, the demo, the
benchmarks, the tests), so none of them types a number twice or checks it its own way:

* the block size of a drafter folder is :func:`drafter_block_size` (read from its
  ``config.json``); a scheduler config or STS file made for another block is refused
  by :func:`check_block_size` and :func:`check_sts_block_size`;
* ``--speculative-num-draft-tokens`` is the drafter's block size plus the anchor
  (``scheduling.config.num_draft_tokens``, ``SchedulerConfig.num_draft_tokens``);
* ``SGLANG_RAGGED_VERIFY_MODE`` follows the tier's policy
  (``SchedulerConfig.ragged_verify_mode``, :func:`scheduler_env`);
* the drafter folder's STS file is :data:`STS_FILENAME`.

:func:`check_server_args` runs in SGLang's server-argument resolution (our
algorithm's ``handle_server_args``), before SGLang's own DSpark checks, so a
mismatch is refused with the value to change rather than SGLang's generic
``gamma + 1`` message. The Helm chart renders both settings from
``slaTiers[].scheduler`` (``dspark.numDraftTokens``, ``dspark.raggedVerifyMode``).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path

from dspark_sglang.scheduling.config import RAGGED_VERIFY_MODES, SchedulerConfig
from dspark_sglang.scheduling.config import num_draft_tokens as draft_tokens_for

__all__ = [
    "CONFIG_ENV",
    "RAGGED_MODE_ENV",
    "STS_FILENAME",
    "LaunchError",
    "check_block_size",
    "check_config",
    "check_ragged_mode",
    "check_server_args",
    "check_sts_block_size",
    "drafter_block_size",
    "is_dspark_moe_drafter",
    "scheduler_env",
]

#: The scheduler config file the plugin reads (the chart mounts it per tier).
CONFIG_ENV = "DSPARK_SCHEDULER_CONFIG"
#: SGLang's ragged-verify switch.
RAGGED_MODE_ENV = "SGLANG_RAGGED_VERIFY_MODE"
#: The STS calibration that travels with a drafter checkpoint.
STS_FILENAME = "sts.json"
#: Where the chart's values set the block size (named in errors chart users see).
CHART_BLOCK_SIZE = "slaTiers[].scheduler.blockSize"


class LaunchError(ValueError):
    """Server settings that do not fit the drafter or the tier's scheduler config."""


def drafter_block_size(folder: str | Path) -> int:
    """``block_size`` of a DSpark drafter checkpoint folder (its ``config.json``)."""
    path = Path(folder) / "config.json"
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
        block = config["dspark_config"]["block_size"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise LaunchError(
            f"{path}: cannot read dspark_config.block_size ({type(exc).__name__}: {exc}); "
            "point --speculative-draft-model-path at a drafter written by dspark-sglang"
        ) from exc
    if isinstance(block, bool) or not isinstance(block, int) or block < 1:
        raise LaunchError(
            f"{path}: dspark_config.block_size must be an integer >= 1, got {block!r}"
        )
    return block


def is_dspark_moe_drafter(folder: str | Path) -> bool:
    """Whether ``folder`` holds a drafter written by dspark-sglang (``model_type`` ours)."""
    from dspark_sglang.model.config import HF_MODEL_TYPE

    path = Path(folder) / "config.json"
    try:
        return json.loads(path.read_text(encoding="utf-8")).get("model_type") == HF_MODEL_TYPE
    except (OSError, ValueError, TypeError, AttributeError):
        return False


def check_ragged_mode(cfg: SchedulerConfig, mode: str, source: str) -> None:
    """Refuse a ragged-verify mode the config's policy cannot run under."""
    if mode not in RAGGED_VERIFY_MODES:
        raise LaunchError(
            f"{RAGGED_MODE_ENV}={mode!r} is not one of {list(RAGGED_VERIFY_MODES)}; "
            f"policy {cfg.policy!r} runs under {RAGGED_MODE_ENV}={cfg.ragged_verify_mode}"
        )
    if cfg.ragged_verify_mode != "static" and mode == "static":
        raise LaunchError(
            f"{CONFIG_ENV}={source} selects per-request verify lengths (policy "
            f"{cfg.policy!r}), but {RAGGED_MODE_ENV} is 'static' (every request verifies "
            f"the whole block, no confidences); set {RAGGED_MODE_ENV}=cap-accept or compact "
            "(the Helm chart sets it from the tier's policy)"
        )


def check_server_args(
    num_draft_tokens: int | None, drafter_path: str | None, env: Mapping[str, str] | None = None
) -> None:
    """Refuse ``--speculative-num-draft-tokens`` or a scheduler config that is not the drafter's.

    ``None`` for ``num_draft_tokens`` lets SGLang derive it from the drafter
    (always right). A path SGLang resolves from a hub, or a draft checkpoint in
    SGLang's own dense format (another ``model_type``), is left to SGLang's checks and
    to the worker's (``scheduler_bridge.load_decider`` compares the config with the
    running block size).
    """
    env = os.environ if env is None else env
    if not drafter_path or not is_dspark_moe_drafter(drafter_path):
        return
    block = drafter_block_size(drafter_path)
    need = draft_tokens_for(block)
    if num_draft_tokens is not None and int(num_draft_tokens) != need:
        raise LaunchError(
            f"--speculative-num-draft-tokens {num_draft_tokens} does not fit the drafter at "
            f"{drafter_path}: its block_size is {block}, so SGLang needs {need} "
            f"(block + anchor); pass {need} or omit the flag (with the Helm chart: set "
            f"{CHART_BLOCK_SIZE}: {block})"
        )
    config = env.get(CONFIG_ENV)
    if config:
        check_config(SchedulerConfig.load(config), config, block, env)


def check_block_size(cfg: SchedulerConfig, source: str, block_size: int) -> None:
    """Refuse a scheduler config whose ``block_size`` is not the drafter's.

    The one comparison of a config (rendered from the chart's tier values) with the
    drafter it serves; ``block_size`` is :func:`drafter_block_size` of the drafter
    folder, or the block the running worker drafts.
    """
    if cfg.block_size != block_size:
        raise LaunchError(
            f"{source}: block_size={cfg.block_size} but the drafter proposes {block_size} "
            f"tokens per step; set block_size: {block_size} (with the Helm chart: "
            f"{CHART_BLOCK_SIZE}: {block_size}) or mount the drafter this tier was "
            "configured for"
        )


def check_sts_block_size(sts_block_size: int, block_size: int, source: str) -> None:
    """Refuse an STS calibration (``source``) fit for another block than the drafter's."""
    if sts_block_size != block_size:
        raise LaunchError(
            f"{source} was fit for block size {sts_block_size}, the drafter proposes "
            f"{block_size}; refit STS (`dspark-sglang calibrate`) for this drafter "
            f"(block_size {block_size})"
        )


def check_config(
    cfg: SchedulerConfig, source: str, block_size: int, env: Mapping[str, str]
) -> None:
    """Refuse a scheduler config whose block is not the drafter's, or whose mode is wrong."""
    check_block_size(cfg, source, block_size)
    check_ragged_mode(cfg, env.get(RAGGED_MODE_ENV, "static"), source)


def scheduler_env(config_path: str | Path | None) -> dict[str, str]:
    """Environment for a DSPARK_MOE server: SGLang's own decision, or the config's policy."""
    if config_path is None:
        return {RAGGED_MODE_ENV: "static"}
    cfg = SchedulerConfig.load(config_path)
    return {RAGGED_MODE_ENV: cfg.ragged_verify_mode, CONFIG_ENV: str(config_path)}
