"""The engines a live frontier compares, their scheduler configs, and the prompt sets."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from dspark_sglang.sglang_integration.demo import PRICED_SUFFIX

PLAIN = "plain"
#: The engine the frontier's matched-throughput speed-ups are measured against.
BASELINE = "mtp1"
PRICED = PRICED_SUFFIX  # one name for a priced engine, as the demo and cpu_speedup use
#: Every engine, in the default turn order (plain first).
ENGINES = (
    PLAIN,
    "mtp1",
    "whole_block",
    "sglang",
    "lagged",
    "prefix",
    "prefix+priced",
    "lagged+priced",
)
#: Prompt set -> the id prefixes it keeps from the prompt file (empty: every item).
PROMPT_SETS: dict[str, tuple[str, ...]] = {"all": (), "math_code": ("gsm8k-", "humaneval-")}
#: The chart's tier key that is a server flag, not a scheduler-config key.
ADMISSION_KEY = "maxRunningRequests"


def engine_policy(engine: str) -> tuple[str | None, bool]:
    """``(policy, priced)`` of a DSPARK_MOE engine: None is SGLang's own decision (no config)."""
    if engine not in ENGINES or engine == PLAIN:
        raise ValueError(f"{engine!r} is not a DSPARK_MOE engine of {ENGINES}")
    from dspark_sglang.sglang_integration.launch import SGLANG_DECISION

    if engine == SGLANG_DECISION:
        return None, False
    priced = engine.endswith(PRICED)
    base = engine.removesuffix(PRICED)
    return ("verify_all" if base == "whole_block" else base), priced


def default_engine(scheduler_values: Mapping[str, Any]) -> str:
    """The engine a chart tier runs: its policy (``verify_all`` is ``whole_block``), with
    ``+priced`` when its ``draftDecision`` is ``priced``."""
    policy = str(scheduler_values["policy"])
    name = "whole_block" if policy == "verify_all" else policy
    return name + PRICED if scheduler_values.get("draftDecision") == "priced" else name


def default_tier(values: Mapping[str, Any]) -> Mapping[str, Any]:
    """The chart's default tier: the first of ``slaTiers``."""
    tiers = values.get("slaTiers")
    if not isinstance(tiers, list) or not tiers:
        raise ValueError("the values file has no slaTiers list")
    return tiers[0]


def _snake(key: str) -> str:
    return re.sub(r"(?<!^)([A-Z])", r"_\1", key).lower()


def tier_config_fields(tier: Mapping[str, Any]) -> dict[str, Any]:
    """The tier's scheduler values as scheduler-config fields (``lagSteps`` -> ``lag_steps``),
    with ``sla_name`` the tier's name; ``maxRunningRequests`` is a server flag, left out."""
    fields = {_snake(k): v for k, v in tier["scheduler"].items() if k != ADMISSION_KEY}
    return {**fields, "sla_name": str(tier["name"])}


def engine_config_fields(
    engine: str,
    tier_fields: Mapping[str, Any],
    sts_path: str | None,
    cost_table: str | None,
) -> dict[str, Any] | None:
    """The scheduler config of a DSPARK_MOE engine (None: SGLang's own decision).

    The tier's fields with the engine's policy; keys the policy does not read are dropped
    (the config refuses them); ``draft_decision: priced`` for ``*+priced`` engines (every
    other engine runs without the key, the config's default ``always``); ``ragged_mode:
    compact`` unless the tier sets one (``verify_all`` runs SGLang's static mode, no
    confidences, so no STS either).
    """
    from dspark_sglang.scheduling.config import NEEDS_COST_TABLE

    policy, priced = engine_policy(engine)
    if policy is None:
        return None
    fields = {**tier_fields, "policy": policy}
    drop = {"draft_decision", "probe_every"}
    if policy not in NEEDS_COST_TABLE:
        drop |= {"draft_step_seconds", "copy_confidence"}
    if policy != "static":
        drop.add("static_k")
    if policy == "verify_all":
        drop.add("ragged_mode")
    if priced:
        drop.discard("draft_decision")
        drop.discard("probe_every")
        fields["draft_decision"] = "priced"
    fields = {k: v for k, v in fields.items() if k not in drop}
    if policy != "verify_all":
        fields.setdefault("ragged_mode", "compact")
        fields["sts_path"] = sts_path
    fields["cost_table_path"] = cost_table
    return fields


def select_prompts(items: Sequence[Mapping[str, Any]], prompt_set: str) -> list[Mapping[str, Any]]:
    """The items of ``prompt_set`` (``PROMPT_SETS``), in file order."""
    if prompt_set not in PROMPT_SETS:
        raise ValueError(f"unknown prompt set {prompt_set!r}; choose one of {list(PROMPT_SETS)}")
    prefixes = PROMPT_SETS[prompt_set]
    return [it for it in items if not prefixes or str(it.get("id", "")).startswith(prefixes)]


def num_prompts(concurrency: int, given: int | None = None) -> int:
    """Prompts per cell: ``given``, else ``max(8, 2 x concurrency)`` (each of the
    ``concurrency`` slots serves at least two requests, so the cell has a steady middle)."""
    return given if given is not None else max(8, 2 * concurrency)
