"""How a ``DSPARK_MOE`` server is launched: the settings that derive from the drafter and tier.

One home for the facts every launcher needs (the Helm chart, the demo, the
benchmarks, the tests), so none of them types a number twice or checks it its own way:

* the block size of a drafter folder is :func:`drafter_block_size` (read from its
  ``config.json``); a scheduler config or STS file made for another block is refused
  by :func:`check_block_size` and :func:`check_sts_block_size`;
* ``--speculative-num-draft-tokens`` is the drafter's block size plus the anchor
  (``scheduling.config.num_draft_tokens``, ``SchedulerConfig.num_draft_tokens``);
* ``SGLANG_RAGGED_VERIFY_MODE`` follows the tier's policy and ``ragged_mode``
  (``SchedulerConfig.ragged_verify_mode``, :func:`scheduler_env`): ``compact`` unless
  the config opts into ``cap-accept``, which the worker warns about at start-up
  (:func:`ragged_mode_note`);
* ``SGLANG_DSPARK_USE_GREEDY_DRAFT`` (SGLang's argmax draft) is on exactly for
  tiers that serve greedy requests only (``SchedulerConfig.greedy_draft``,
  :func:`scheduler_env`);
* the drafter folder's STS file for a tier is :func:`drafter_sts` (:data:`STS_FILENAME`,
  or :data:`GREEDY_STS_FILENAME` for a greedy-only tier when the drafter ships one);
* a drafter whose attention heads cannot be split evenly over the tensor-parallel
  ranks is refused on devices that do not pad heads (:func:`check_draft_heads`).

:func:`check_server_args` runs in SGLang's server-argument resolution (our
algorithm's ``handle_server_args``), before SGLang's own DSpark checks, so a
mismatch is refused with the value to change rather than SGLang's generic
``gamma + 1`` message. The Helm chart renders these settings from
``slaTiers[].scheduler`` (``dspark.numDraftTokens``, ``dspark.raggedVerifyMode``,
``dspark.greedyDraft``).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping
from pathlib import Path

from dspark_sglang.calibration.sts import GREEDY_STS_FILENAME, STS_FILENAME
from dspark_sglang.scheduling.config import RAGGED_VERIFY_MODES, SchedulerConfig
from dspark_sglang.scheduling.config import num_draft_tokens as draft_tokens_for

__all__ = [
    "BLOCK_SIZE_FIELDS",
    "CONFIG_ENV",
    "CPU_OVERLAP_ENV",
    "GREEDY_DRAFT_ENV",
    "GREEDY_STS_FILENAME",
    "RAGGED_MODE_ENV",
    "STS_FILENAME",
    "LaunchError",
    "check_block_size",
    "check_config",
    "check_draft_heads",
    "check_ragged_mode",
    "check_server_args",
    "check_sts_block_size",
    "cpu_overlap_kept",
    "drafter_block_size",
    "drafter_heads",
    "drafter_sts",
    "greedy_draft_note",
    "is_dspark_moe_drafter",
    "ragged_mode_note",
    "scheduler_env",
]

#: The scheduler config file the plugin reads (the chart mounts it per tier).
CONFIG_ENV = "DSPARK_SCHEDULER_CONFIG"
#: ``1`` keeps SGLang's overlap scheduler for DSPARK_MOE on CPU (unset or ``0``: off there).
CPU_OVERLAP_ENV = "DSPARK_CPU_OVERLAP_SCHEDULE"
#: SGLang's ragged-verify switch.
RAGGED_MODE_ENV = "SGLANG_RAGGED_VERIFY_MODE"
#: SGLang's argmax-draft switch (DSpark workers; a boolean, default off).
GREEDY_DRAFT_ENV = "SGLANG_DSPARK_USE_GREEDY_DRAFT"
#: Debug/test aid: append every decision (the confidences the policy was given and the
#: verify lengths SGLang received) as JSON lines; written by TP rank 0 only. Writing it
#: reads those tensors back to the host every step (a sync): the only per-step read of
#: ours, and only when this is set; leave it unset in production.
DECISION_LOG_ENV = "DSPARK_DECISION_LOG"
#: The name that asks for SGLang's own verify decision (the whole block, no scheduler
#: config) wherever a policy name is taken for a DSPARK_MOE engine (``demo --policy``,
#: ``demo --compare``, ``benchmarks/cpu_speedup.py --policies``).
SGLANG_DECISION = "sglang"
#: Where the chart's values set the block size (named in errors chart users see).
CHART_BLOCK_SIZE = "slaTiers[].scheduler.blockSize"
#: Where the chart's values set the ragged-verify mode of a tier.
CHART_RAGGED_MODE = "slaTiers[].scheduler.raggedMode"

logger = logging.getLogger(__name__)


class LaunchError(ValueError):
    """Server settings that do not fit the drafter or the tier's scheduler config."""


#: Where a drafter's ``config.json`` may hold its block size, in SGLang's order of reading
#: (``dspark_block_size`` over ``dflash_config`` over the top level, as in
#: ``speculative/dspark_components/dspark_config.py`` and ``dflash_utils.py``); our
#: ``dspark_config`` mirrors ``dflash_config``, DeepSpec writes the top level only.
BLOCK_SIZE_FIELDS: tuple[str, ...] = (
    "dspark_block_size",
    "dspark_config.block_size",
    "dflash_config.block_size",
    "block_size",
)


def drafter_block_size(folder: str | Path) -> int:
    """``block_size`` of a DSpark drafter folder: ours, DeepSpec's or SGLang's layout.

    Every field of :data:`BLOCK_SIZE_FIELDS` the ``config.json`` has must agree (SGLang
    drafts the first; a disagreement would make it draft another block than the one
    the rest of a config says).
    """
    path = Path(folder) / "config.json"
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(config, dict):
            raise TypeError(f"a JSON {type(config).__name__}, not an object")
    except (OSError, ValueError, TypeError) as exc:
        raise LaunchError(
            f"{path}: cannot read the drafter's config ({type(exc).__name__}: {exc}); "
            "point --speculative-draft-model-path at a DSpark drafter folder"
        ) from exc
    found: dict[str, object] = {}
    for name in BLOCK_SIZE_FIELDS:
        outer, _, inner = name.rpartition(".")
        holder = config.get(outer) if outer else config
        if isinstance(holder, dict) and holder.get(inner) is not None:
            found[name] = holder[inner]
    if not found:
        raise LaunchError(
            f"{path}: no block size: none of {', '.join(BLOCK_SIZE_FIELDS)} is set; point "
            "--speculative-draft-model-path at a DSpark drafter folder (ours, DeepSpec's or "
            "SGLang's) or add the block_size it was trained with"
        )
    for name, block in found.items():
        if isinstance(block, bool) or not isinstance(block, int) or block < 1:
            raise LaunchError(f"{path}: {name} must be an integer >= 1, got {block!r}")
    if len(set(found.values())) > 1:
        said = ", ".join(f"{k}={v}" for k, v in found.items())
        raise LaunchError(
            f"{path}: the block sizes disagree ({said}); SGLang would draft "
            f"{next(iter(found.values()))}: make them equal to the block the drafter was "
            "trained with"
        )
    return int(next(iter(found.values())))  # type: ignore[call-overload]


def drafter_sts(folder: str | Path, *, greedy_only: bool) -> Path | None:
    """The drafter folder's STS file for a tier, or None when it ships none.

    A greedy-only tier takes :data:`GREEDY_STS_FILENAME` when the folder has it (fitted on
    greedy rollouts: argmax drafts against the target's argmax); every other tier, and a
    greedy one without it, takes :data:`STS_FILENAME`.
    """
    names = (GREEDY_STS_FILENAME, STS_FILENAME) if greedy_only else (STS_FILENAME,)
    for name in names:
        if (Path(folder) / name).is_file():
            return Path(folder) / name
    return None


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
            "(the Helm chart sets it from the tier's policy and scheduler.raggedMode)"
        )
    if cfg.ragged_mode is not None and mode != cfg.ragged_mode:
        raise LaunchError(
            f"{CONFIG_ENV}={source} asks for ragged_mode={cfg.ragged_mode!r}, but "
            f"{RAGGED_MODE_ENV} is {mode!r}; set {RAGGED_MODE_ENV}={cfg.ragged_mode} "
            "(launch.scheduler_env does) or remove ragged_mode from the config"
        )


def ragged_mode_note(cfg: SchedulerConfig, mode: str, source: str) -> str | None:
    """What to tell an operator whose worker verifies per-request lengths in ``cap-accept``
    mode, or None for any other mode.

    ``cap-accept`` verifies every request's whole block and only caps acceptance at the
    length the policy chose, so the verify costs the same whatever the policy chose;
    ``compact`` (the default) verifies only the chosen drafts. Not refused: both are
    lossless, and ``cap-accept`` is an explicit opt-in (``ragged_mode: cap-accept``).
    """
    if mode != "cap-accept" or cfg.ragged_verify_mode == "static":
        return None
    return (
        f"{CONFIG_ENV}={source}: policy {cfg.policy!r} picks per-request verify lengths, but "
        f"{RAGGED_MODE_ENV}=cap-accept verifies every request's whole block and only caps "
        "acceptance at the chosen length, so a shorter verify saves no verify compute; for "
        "verifies of only the chosen drafts set ragged_mode: compact in the config (Helm "
        f"chart: {CHART_RAGGED_MODE}: compact, the default) and {RAGGED_MODE_ENV}=compact "
        "(launch.scheduler_env and the chart set it from the config)"
    )


def drafter_heads(folder: str | Path) -> tuple[int, int]:
    """``(num_attention_heads, num_key_value_heads)`` of a drafter folder's ``config.json``."""
    path = Path(folder) / "config.json"
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
        heads = int(config["num_attention_heads"])
        kv_heads = int(config.get("num_key_value_heads", heads))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise LaunchError(
            f"{path}: cannot read num_attention_heads / num_key_value_heads "
            f"({type(exc).__name__}: {exc}); point --speculative-draft-model-path at a "
            "drafter written by dspark-sglang"
        ) from exc
    return heads, kv_heads


def _kv_heads_split(kv_heads: int, tp: int) -> bool:
    """SGLang's KV-head sharding: divided below ``tp``, replicated evenly from ``tp`` up."""
    return kv_heads % tp == 0 if tp < kv_heads else tp % kv_heads == 0


def _fitting_tp_sizes(heads: int, kv_heads: int) -> list[int]:
    return [tp for tp in range(1, heads + 1) if heads % tp == 0 and _kv_heads_split(kv_heads, tp)]


def check_draft_heads(
    num_attention_heads: int,
    num_key_value_heads: int,
    tp_size: int,
    device: str | None,
    source: str,
) -> None:
    """Refuse a drafter whose attention heads SGLang cannot shard over ``tp_size`` ranks.

    SGLang's ``QKVParallelLinear`` gives each rank ``num_attention_heads / tp`` query
    heads and ``num_key_value_heads / tp`` KV heads (or one KV head replicated
    ``tp / num_key_value_heads`` times when ``tp >= num_key_value_heads``); both must
    divide exactly. Only its CPU backend pads heads to fit
    (``adjust_config_with_unaligned_cpu_tp``), so ``device == "cpu"`` passes; on any
    other device the draft would fail while loading. ``tp_size`` is the attention-TP
    width the drafter runs at.
    """
    if device == "cpu" or tp_size <= 1:
        return
    fits = _fitting_tp_sizes(num_attention_heads, num_key_value_heads)
    if num_attention_heads % tp_size:
        field, value = "num_attention_heads", num_attention_heads
    elif not _kv_heads_split(num_key_value_heads, tp_size):
        field, value = "num_key_value_heads", num_key_value_heads
    else:
        return
    raise LaunchError(
        f"{source}: the drafter's {field}={value} does not split over tensor-parallel "
        f"size {tp_size} (--tp-size): SGLang gives every TP rank the same number of "
        f"attention heads and pads heads only on CPU, so the drafter cannot load on "
        f"{device or 'this device'}. Retrain the drafter with num_attention_heads and "
        f"num_key_value_heads divisible by {tp_size}, or serve at a --tp-size that fits "
        f"this drafter ({fits})"
    )


def check_server_args(
    num_draft_tokens: int | None,
    drafter_path: str | None,
    env: Mapping[str, str] | None = None,
    *,
    tp_size: int = 1,
    device: str | None = None,
) -> None:
    """Refuse ``--speculative-num-draft-tokens``, a scheduler config or a TP size that
    does not fit the drafter.

    ``None`` for ``num_draft_tokens`` lets SGLang derive it from the drafter
    (always right). A DeepSpec-layout folder is checked as ours is, after its config
    and tensor header (``dense_draft_checks.check_folder_at_launch``). A path SGLang
    resolves from a hub, or a draft checkpoint in SGLang's own dense format, is left to
    SGLang's checks and to the worker's (``scheduler_bridge.load_decider`` compares the
    config with the running block size; ``DSparkMoeWorker`` checks the heads against the
    TP size and the draft against the target).
    ``tp_size`` is the attention-TP width and ``device`` the server's device, for
    :func:`check_draft_heads`.
    """
    env = os.environ if env is None else env
    if not drafter_path:
        return
    if not is_dspark_moe_drafter(drafter_path):
        from dspark_sglang.model.formats.layout import is_deepspec_folder
        from dspark_sglang.sglang_integration.dense_draft_checks import check_folder_at_launch

        if not is_deepspec_folder(drafter_path):
            return
        check_folder_at_launch(drafter_path)
    heads, kv_heads = drafter_heads(drafter_path)
    check_draft_heads(heads, kv_heads, tp_size, device, f"{drafter_path}/config.json")
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


def greedy_draft_note(cfg: SchedulerConfig, env: Mapping[str, str], source: str) -> str | None:
    """What to tell an operator whose ``SGLANG_DSPARK_USE_GREEDY_DRAFT`` is not the config's
    rule (``SchedulerConfig.greedy_draft``), or None when it is.

    Neither way is refused: verification is lossless under either draft. An argmax
    draft on a tier that serves sampled requests usually accepts fewer drafts; a
    sampling draft on a greedy-only tier pays for sampling it does not need. A value
    SGLang cannot read as a boolean is refused here, naming the variable.
    """
    value = env.get(GREEDY_DRAFT_ENV)
    on = False
    if value is not None:
        from sglang.srt.environ import envs

        try:
            on = envs.SGLANG_DSPARK_USE_GREEDY_DRAFT.parse(value)
        except ValueError as exc:
            raise LaunchError(f"{GREEDY_DRAFT_ENV}={value!r}: {exc}; set 1 or 0") from exc
    if on == cfg.greedy_draft:
        return None
    if on:
        return (
            f"{GREEDY_DRAFT_ENV}={value} drafts by argmax, but {CONFIG_ENV}={source} serves "
            "sampled requests too (greedy_only: false): still lossless, but sampled requests "
            f"usually accept fewer drafts; unset {GREEDY_DRAFT_ENV} unless all traffic is greedy"
        )
    return (
        f"{CONFIG_ENV}={source} serves greedy requests only (greedy_only: true) but "
        f"{GREEDY_DRAFT_ENV} is off, so the drafter samples drafts it does not need; set "
        f"{GREEDY_DRAFT_ENV}=1 (the Helm chart does) for cheaper rounds"
    )


def check_config(
    cfg: SchedulerConfig, source: str, block_size: int, env: Mapping[str, str]
) -> None:
    """Refuse a scheduler config whose block is not the drafter's, or whose mode is wrong;
    log a ``cap-accept`` verify of per-request lengths (:func:`ragged_mode_note`) and a
    draft switch that is not the config's (:func:`greedy_draft_note`)."""
    check_block_size(cfg, source, block_size)
    mode = env.get(RAGGED_MODE_ENV, "static")
    check_ragged_mode(cfg, mode, source)
    for note in (ragged_mode_note(cfg, mode, source), greedy_draft_note(cfg, env, source)):
        if note:
            logger.warning("%s", note)


def cpu_overlap_kept(env: Mapping[str, str] | None = None) -> bool:
    """Whether :data:`CPU_OVERLAP_ENV` keeps SGLang's overlap scheduler for DSPARK_MOE on CPU."""
    value = (os.environ if env is None else env).get(CPU_OVERLAP_ENV, "").strip()
    if value not in ("", "0", "1"):
        raise LaunchError(
            f"{CPU_OVERLAP_ENV}={value!r}: use 1 (keep SGLang's overlap scheduler on CPU) or "
            "0 (off there, the default)"
        )
    return value == "1"


def scheduler_env(config_path: str | Path | None, *, greedy_draft: bool = False) -> dict[str, str]:
    """Environment for a DSPARK_MOE server: SGLang's own decision, or the config's policy.

    ``SGLANG_DSPARK_USE_GREEDY_DRAFT`` is the config's ``greedy_draft`` (its
    ``greedy_only``). Without a config, ``greedy_draft=True`` is for a caller that
    knows every request it sends is greedy; with one, the config decides and
    ``greedy_draft=True`` on a ``greedy_only: false`` config is refused.
    """
    if config_path is None:
        return {RAGGED_MODE_ENV: "static", GREEDY_DRAFT_ENV: "1" if greedy_draft else "0"}
    cfg = SchedulerConfig.load(config_path)
    if greedy_draft and not cfg.greedy_draft:
        raise LaunchError(
            f"greedy_draft=True, but {config_path} has greedy_only: false (sampled requests "
            "allowed); set greedy_only: true in it, which turns the argmax draft on"
        )
    return {
        RAGGED_MODE_ENV: cfg.ragged_verify_mode,
        GREEDY_DRAFT_ENV: "1" if cfg.greedy_draft else "0",
        CONFIG_ENV: str(config_path),
    }
