"""Apply a plan to the values a release already runs, instead of replacing them.

Why: Helm merges maps but replaces lists, and ``slaTiers`` is a list. A values file
holding only the planned tiers would, applied with ``helm upgrade -f``, delete every
tier it does not name (their Deployments and Services go), and model paths or
unrelated keys it leaves out fall back to the chart's defaults. So the planner edits a
copy of the live values (``helm get values``): each planned SLA lands on a named tier,
and only the keys the plan decides change.

What a plan may change on its tier: ``minTokensPerSecPerUser``, the scheduler's policy
keys (``policy``, ``blockSize``, ``lagSteps``/``staticK``, ``maxVerifyTokens``,
``maxRunningRequests``; for ``prefix``/``lagged`` also ``draftDecision``, the draft
decision the prediction ran, and ``probeEvery`` when the plan was given one), the cost
table and STS reference, and the replica count when a load is given. Everything else
(``greedyOnly``, resources, model paths, other tiers) stays as it was, except the
scheduler keys the planned policy does not read, which the chart would refuse:
``draftStepSeconds``, ``draftDecision``, ``probeEvery`` and
``copyConfidence`` are dropped when the planned policy is not ``prefix`` or ``lagged``
(the only ones that read them), ``contextCopyNgram`` on ``none`` and ``raggedMode`` on
``verify_all``. ``draftStepSeconds`` is otherwise set to the draft pass the plan assumed
when it modelled one (``--draft-step-seconds``, or the tier's own value, read by
``base_draft_step_seconds``), so the served scheduler decides with the cost the
prediction charged. A profile times the target alone; without either source the draft
pass is not modelled and the tier's key is left as it was.

Refusals, each naming both sides and the fix: a profile measured at another TP degree
than the tier runs, on another hardware group than the tier's table names, or for
another model than the release serves; base values without ``slaTiers``; an SLA that
matches no tier and has no ``--tier`` name.

Invariant: ``diff(base, apply_plan(base, ...))`` touches only ``slaTiers`` entries that
were planned (plus new tiers named explicitly).
"""

from __future__ import annotations

import copy
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from dspark_sglang.planning.planner import DRAFT_STEP_KEY, PlanError, PlannedTier, tier_name
from dspark_sglang.planning.simulator import is_seconds
from dspark_sglang.scheduling.config import NEEDS_COST_TABLE

__all__ = [
    "CostTableSource",
    "ProfileIdentity",
    "TierLoad",
    "apply_plan",
    "base_draft_step_seconds",
    "load_base_values",
    "map_tiers",
    "replicas_for",
    "values_diff",
]

_TIER_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]{0,18}[a-z0-9])?$")
_SLUG_BAD = re.compile(r"[^a-z0-9]+")
#: The scheduler keys a plan decides (``PlannedTier.scheduler_values``), without the
#: operator's own choices (``greedyOnly``) which the plan must keep.
_PLANNED_SCHEDULER_KEYS = ("policy", "blockSize", "lagSteps", "staticK", "maxVerifyTokens",
                           "maxRunningRequests")  # fmt: skip
#: Scheduler keys only the cost-table policies (``prefix``, ``lagged``) read: the draft
#: pass, the per-step draft decision and the confidence they rank context copies at.
_COST_TABLE_POLICY_KEYS = (DRAFT_STEP_KEY, "draftDecision", "probeEvery", "copyConfidence")


@dataclass(frozen=True)
class ProfileIdentity:
    """What a cost table was measured for (its ``.meta.json``)."""

    hardware: str
    model: str
    tp_size: int
    version: str | None = None  # the published ConfigMap's content version, if any


@dataclass(frozen=True)
class TierLoad:
    """Expected load on one tier: concurrent users, or requests per second."""

    users: float | None = None
    requests_per_sec: float | None = None

    def __post_init__(self) -> None:
        if (self.users is None) == (self.requests_per_sec is None):
            raise PlanError("a tier's load is either concurrent users or requests/s, not both")
        v = self.users if self.users is not None else self.requests_per_sec
        if not (isinstance(v, int | float) and math.isfinite(v) and v > 0):
            raise PlanError(f"a tier's load must be a positive number, got {v!r}")


def _chart_slug(text: str) -> str:
    """The chart's ``dspark.modelSlug`` rule (lowercase, non-[a-z0-9] runs -> ``-``)."""
    return _SLUG_BAD.sub("-", text.lower()).strip("-")


def load_base_values(path: Path) -> dict[str, Any]:
    """Read the live values file (``helm get values REL -o yaml``); refuse what cannot be
    edited safely (not a mapping, duplicate keys, no ``slaTiers`` list)."""
    from dspark_sglang.scheduling.config import _UniqueKeyLoader

    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise PlanError(f"--base-values {path}: cannot read it ({exc})") from exc
    try:
        doc = yaml.load(text, Loader=_UniqueKeyLoader)
    except yaml.YAMLError as exc:
        raise PlanError(f"--base-values {path}: not valid YAML ({exc})") from exc
    if not isinstance(doc, dict):
        raise PlanError(f"--base-values {path}: expected a mapping of chart values")
    tiers = doc.get("slaTiers")
    if not isinstance(tiers, list) or not tiers:
        raise PlanError(
            f"--base-values {path} has no slaTiers list: the release runs the chart's default "
            "tiers; fetch them too with `helm get values $REL -n $NS --all -o yaml`"
        )
    for i, t in enumerate(tiers):
        if not isinstance(t, dict) or not isinstance(t.get("name"), str):
            raise PlanError(f"--base-values {path}: slaTiers[{i}] has no name")
    return doc


def map_tiers(
    slas: Sequence[float],
    base: Mapping[str, Any] | None,
    explicit: Mapping[float, str],
) -> dict[float, str]:
    """Which tier each SLA lands on.

    An explicit ``--tier SLA=NAME`` wins (an existing tier, or a new one); otherwise the
    base tier whose ``minTokensPerSecPerUser`` equals the SLA; without base values the
    generated ``sla-<N>`` name. An SLA with no match is refused, naming the tiers.
    """
    for sla in explicit:
        if sla not in slas:
            raise PlanError(f"--tier {sla:g}=...: {sla:g} is not one of --sla {list(slas)}")
    out: dict[float, str] = {}
    for sla in slas:
        if sla in explicit:
            name = explicit[sla]
        elif base is None:
            name = tier_name(sla)
        else:
            same = [t["name"] for t in base["slaTiers"] if t.get("minTokensPerSecPerUser") == sla]
            if len(same) != 1:
                have = ", ".join(
                    f"{t['name']} ({t.get('minTokensPerSecPerUser')})" for t in base["slaTiers"]
                )
                why = "no tier" if not same else f"{len(same)} tiers ({', '.join(same)})"
                raise PlanError(
                    f"SLA {sla:g} tok/s/user: {why} of the base values has "
                    f"minTokensPerSecPerUser {sla:g} (tiers: {have}); name the tier to retune "
                    f"with --tier {sla:g}=<name> (an existing name keeps its Deployment and "
                    "Service, a new name adds a tier)"
                )
            name = same[0]
        if not _TIER_NAME.match(name):
            raise PlanError(
                f"--tier {sla:g}={name}: a tier name must be a lowercase RFC 1123 label of at "
                "most 20 characters (the chart builds Service names from it)"
            )
        out[sla] = name
    names = list(out.values())
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise PlanError(f"two SLAs land on tier {dup[0]}; give each SLA its own --tier")
    return out


def base_draft_step_seconds(
    base: Mapping[str, Any], names: Mapping[float, str]
) -> dict[float, float]:
    """Each planned SLA's draft pass from its base tier's ``scheduler.draftStepSeconds``.

    SLAs whose tier is new or sets none are left out (their draft pass is not modelled
    unless ``--draft-step-seconds`` gives one). A value that is not a finite number of
    seconds >= 0 is refused, naming the tier.
    """
    tiers = {t["name"]: t for t in base.get("slaTiers") or []}
    out: dict[float, float] = {}
    for sla, name in names.items():
        sched = (tiers.get(name) or {}).get("scheduler") or {}
        if DRAFT_STEP_KEY not in sched:
            continue
        v = sched[DRAFT_STEP_KEY]
        if not is_seconds(v):
            raise PlanError(
                f"--base-values: slaTiers[{name}].scheduler.{DRAFT_STEP_KEY} = {v!r} must be "
                "a finite number of seconds >= 0 (one draft pass); fix it there or override "
                "it with --draft-step-seconds"
            )
        out[sla] = float(v)
    return out


def replicas_for(tier: PlannedTier, load: TierLoad) -> int:
    """Replicas that carry ``load`` with each replica at the tier's admission cap.

    A replica runs at most ``maxRunningRequests`` requests at the simulated per-user
    speed; concurrent users need ``ceil(users / cap)`` replicas. For requests/s, one
    replica completes ``completed / sim_time`` requests per second in the closed-loop
    simulation at the cap (the saturated replica the planner sized), so
    ``ceil(rps / that)``.
    """
    if load.users is not None:
        return max(1, math.ceil(load.users / tier.max_running_requests))
    r = tier.result
    if r.sim_time <= 0 or r.completed <= 0:
        raise PlanError(
            f"tier for SLA {tier.sla:g}: the simulation completed no request; cannot turn "
            "requests/s into replicas (raise --num-requests or give --users)"
        )
    per_replica = r.completed / r.sim_time
    assert load.requests_per_sec is not None
    return max(1, math.ceil(load.requests_per_sec / per_replica - 1e-9))


def _tier_tp(tier: Mapping[str, Any], defaults: Mapping[str, Any]) -> int:
    return int(tier.get("tp", defaults.get("tp", 1)))


def _check_identity(
    name: str, tier: Mapping[str, Any], base: Mapping[str, Any], ident: ProfileIdentity
) -> None:
    tp = _tier_tp(tier, base.get("tierDefaults") or {})
    if tp != ident.tp_size:
        raise PlanError(
            f"tier {name} runs at tp {tp} but the profile was measured at tp {ident.tp_size}; "
            f"profile at tp {tp} (`dspark-sglang profile --tp-size {tp}`) or plan a tier "
            f"with tp {ident.tp_size}"
        )
    group = (tier.get("costTable") or {}).get("hardwareGroup")
    if group is not None and _chart_slug(str(group)) != ident.hardware:
        raise PlanError(
            f"tier {name} reads the cost table of hardware group {group} but the profile was "
            f"measured on {ident.hardware}; plan with a profile of {group} (reprofile.md), "
            "or move the tier with --hardware-group after checking its nodes"
        )
    model = base.get("model") or {}
    slug = model.get("slug") or Path(str(model.get("targetPath") or "")).name
    if slug and _chart_slug(str(slug)) != ident.model:
        raise PlanError(
            f"the release serves model {_chart_slug(str(slug))} (model.slug / model.targetPath) "
            f"but the profile was measured for {ident.model}; plan with that model's profile"
        )


def _planned_scheduler(old: Mapping[str, Any] | None, planned: Mapping[str, Any]) -> dict:
    out = {k: v for k, v in (old or {}).items() if k not in _PLANNED_SCHEDULER_KEYS}
    policy = planned["policy"]
    # The operator's keys are kept only where the planned policy reads them (the chart
    # refuses each on any other policy, as SchedulerConfig does).
    if policy not in NEEDS_COST_TABLE:
        for key in _COST_TABLE_POLICY_KEYS:
            out.pop(key, None)
    if policy == "none":
        out.pop("contextCopyNgram", None)  # nothing is verified, so no copy would be
    if policy == "verify_all":
        out.pop("raggedMode", None)  # verify_all runs SGLang's static mode
    out.update({k: v for k, v in planned.items() if k != "greedyOnly"})
    if out.get("draftDecision") != "priced":
        out.pop("probeEvery", None)  # read only with draftDecision: priced
    out.setdefault("greedyOnly", planned.get("greedyOnly", False))
    return out


@dataclass(frozen=True)
class CostTableSource:
    """The forms a tier may reference the profiled table in.

    ``published``: ``{"hardwareGroup", "version"}``, the profiler's content-versioned
    ConfigMap; ``inline``: the staircase embedded in values (``None`` for additive
    tables); ``configmap``: ``{"configMapName"}`` when the operator names one for every
    planned tier. ``new_tier`` is the form a tier without a table gets.
    """

    published: dict[str, Any] | None
    inline: dict[str, Any] | None
    configmap: dict[str, Any] | None = None
    new_tier: str = "inline"  # or "published"

    def for_tier(self, old: Mapping[str, Any], tier: str, move_hardware: bool) -> dict[str, Any]:
        if self.configmap is not None:
            return dict(self.configmap)
        if "configMapName" in old and not move_hardware:
            return dict(old)  # the operator manages that ConfigMap; the plan cannot repoint it
        if move_hardware:
            form = "published"
        else:
            form = "inline" if "inline" in old else "published" if old else self.new_tier
        if form == "published" and self.published is not None:
            return dict(self.published)
        if self.inline is not None:
            return {"inline": copy.deepcopy(self.inline)}
        raise PlanError(
            f"tier {tier}: the chart embeds only staircase tables inline and this profile is "
            "additive; reference the published table (--hardware-group, or a tier with "
            "costTable.hardwareGroup) or --cost-table-configmap"
        )


def apply_plan(
    base: Mapping[str, Any],
    tiers: Sequence[PlannedTier],
    names: Mapping[float, str],
    ident: ProfileIdentity,
    *,
    cost_table: CostTableSource,
    sts: Mapping[str, Any] | None,
    loads: Mapping[str, TierLoad] | None = None,
    move_hardware: bool = False,
) -> dict[str, Any]:
    """A copy of ``base`` with each planned tier written onto its named tier.

    A tier keeps the form its cost table is referenced in (``CostTableSource.for_tier``);
    ``sts`` replaces the tier's STS block when given. ``loads`` (by tier name) set
    ``replicas``, or ``autoscaling.minReplicas`` where the tier autoscales.
    ``move_hardware`` (``--hardware-group`` given) repoints tiers at the profile's
    hardware group instead of refusing a different one.
    """
    out = copy.deepcopy(dict(base))
    out.setdefault("slaTiers", [])
    existing = {t["name"]: t for t in out["slaTiers"]}
    loads = dict(loads or {})
    unknown = sorted(set(loads) - set(names.values()))
    if unknown:
        raise PlanError(
            f"a load was given for tier {unknown[0]}, which is not planned "
            f"(planned: {', '.join(names.values())})"
        )
    for t in tiers:
        name = names[t.sla]
        tier = existing.get(name)
        if tier is None:
            tier = {"name": name, "tp": ident.tp_size, "gpusPerPod": ident.tp_size}
            out["slaTiers"].append(tier)
            existing[name] = tier
        old_ct = dict(tier.get("costTable") or {})
        checked = {**tier, "costTable": {}} if move_hardware else tier
        _check_identity(name, checked, out, ident)
        tier["minTokensPerSecPerUser"] = t.sla
        tier["scheduler"] = _planned_scheduler(tier.get("scheduler"), t.scheduler_values())
        tier["costTable"] = cost_table.for_tier(old_ct, name, move_hardware)
        if sts is not None:
            tier["sts"] = copy.deepcopy(dict(sts))
        elif "sts" not in tier:
            tier["sts"] = {"configMapName": "dspark-sts"}
        if name in loads:
            _set_replicas(tier, out, replicas_for(t, loads[name]))
    return out


def _set_replicas(tier: dict[str, Any], values: Mapping[str, Any], n: int) -> None:
    auto = dict(tier.get("autoscaling") or {})
    defaults = (values.get("tierDefaults") or {}).get("autoscaling") or {}
    if auto.get("enabled", defaults.get("enabled", False)):
        auto["minReplicas"] = n
        auto["maxReplicas"] = max(int(auto.get("maxReplicas", defaults.get("maxReplicas", n))), n)
        tier["autoscaling"] = auto
    else:
        tier["replicas"] = n


def _flatten(doc: Any, prefix: str = "") -> dict[str, Any]:
    """Key paths of ``doc``; list entries with a ``name`` are addressed by it."""
    out: dict[str, Any] = {}
    if isinstance(doc, dict):
        if not doc and prefix:
            out[prefix] = {}
        for k, v in doc.items():
            out.update(_flatten(v, f"{prefix}.{k}" if prefix else str(k)))
    elif isinstance(doc, list) and doc and all(isinstance(x, dict) and "name" in x for x in doc):
        for x in doc:
            out.update(_flatten(x, f"{prefix}[{x['name']}]"))
    else:
        out[prefix] = doc
    return out


def values_diff(before: Mapping[str, Any], after: Mapping[str, Any]) -> list[str]:
    """``path: old -> new`` lines, one per changed leaf (``(unset)`` where absent)."""
    a, b = _flatten(dict(before)), _flatten(dict(after))
    lines = []
    for key in sorted(set(a) | set(b)):
        old, new = a.get(key, "(unset)"), b.get(key, "(unset)")
        if old != new:
            lines.append(f"{key}: {_short(old)} -> {_short(new)}")
    return lines


def _short(v: Any) -> str:
    text = v if isinstance(v, str) else yaml.safe_dump(v, default_flow_style=True).strip()
    text = text.removesuffix("\n...").strip()
    return text if len(text) <= 80 else text[:77] + "..."
