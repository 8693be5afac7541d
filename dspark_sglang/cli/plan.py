"""``dspark-sglang plan``: SLA targets -> chart values, edited onto the values a release runs.

For each ``--sla`` (tokens/s per user) the planner (``planning/planner.py``) picks the
scheduling policy and the largest admission cap whose simulated p50 and p90 per-user
speed still meet it, on the given cost table and acceptance traces. With
``--base-values`` (the live values, ``helm get values``) each SLA is written onto its tier
(``planning/values_edit.py``): names, model paths and every unrelated key stay, so the
output is safe to apply with ``helm upgrade -f``; ``--diff`` prints what changes, and a
load (``--users``/``--rps``) turns into replicas. Every decode step pays the draft pass
the tier's engine runs: ``--draft-step-seconds``, else the tier's own
``scheduler.draftStepSeconds`` in the base values, else it is not modelled; the output
says which, per tier.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from dspark_sglang.cli.base import (
    CommaJoin,
    Command,
    add_planning_arguments,
    csv_numbers,
    probe_every,
)

EPILOG = """\
retune the tiers of a running release (deploy/runbooks/sla-tier-tuning.md):
  helm get values $REL -n $NS -o yaml > live-values.yaml
  kubectl -n $NS get configmap <the tier's cost-table ConfigMap> -o yaml > live-table.yaml
  dspark-sglang plan --profile live-table.yaml --traces traces.jsonl --sts sts.json \\
      --sla 120,80 --base-values live-values.yaml --users interactive=64,standard=200 \\
      --diff --out values-planned.yaml
  helm upgrade $REL $CHART -n $NS -f values-planned.yaml

Each SLA lands on the base tier whose minTokensPerSecPerUser equals it; --tier SLA=NAME
chooses another (a new name adds a tier). The profile must carry its metadata (a
.meta.json beside the table, or the ConfigMap's sps.meta.json): plan refuses a tier whose
tp, hardware group or model differs from the profile's, naming both.

The draft pass (seconds per decode step) comes from --draft-step-seconds, else from each
tier's scheduler.draftStepSeconds in --base-values; without either it is not modelled
(0 s), which overstates speculation where drafting is a large share of a step (a CPU).
Planned prefix/lagged tiers get the value the plan assumed as draftStepSeconds.
"""


def _pairs(text: str | None, flag: str, value_type: type) -> dict[str, float]:
    """``a=1,b=2`` -> ``{"a": 1.0, "b": 2.0}``, refusing malformed or repeated keys."""
    out: dict[str, float] = {}
    for item in (text or "").split(","):
        if not item.strip():
            continue
        key, sep, value = item.partition("=")
        key = key.strip()
        try:
            v = value_type(value)
        except ValueError:
            v = None
        if not sep or not key or v is None:
            raise ValueError(f"{flag} {item!r}: expected NAME=NUMBER, e.g. {flag} interactive=64")
        if key in out:
            raise ValueError(f"{flag}: {key} is given twice")
        out[key] = v
    return out


def _tier_names(text: str | None) -> dict[float, str]:
    """``--tier 120=interactive,80=standard`` -> ``{120.0: "interactive", 80.0: "standard"}``."""
    out: dict[float, str] = {}
    for key, name in _pairs(text, "--tier", str).items():
        try:
            sla = float(key)
        except ValueError:
            sla = None
        if sla is None or not name:
            raise ValueError(f"--tier {key}={name}: expected SLA=NAME, e.g. --tier 120=interactive")
        out[sla] = str(name)
    return out


def _add_arguments(p: argparse.ArgumentParser) -> None:
    add_planning_arguments(p)
    p.add_argument(
        "--sla",
        action=CommaJoin,
        required=True,
        help="comma-separated tok/s/user targets, e.g. 80,120",
    )
    p.add_argument(
        "--out",
        type=Path,
        default=Path("values-planned.yaml"),
        help="Helm values file to write (default values-planned.yaml)",
    )
    p.add_argument(
        "--base-values",
        type=Path,
        default=None,
        help="the release's values (`helm get values $REL -o yaml`): the plan edits a copy, "
        "keeping tier names, model paths and every key it does not decide",
    )
    p.add_argument(
        "--tier",
        action=CommaJoin,
        default=None,
        help="SLA=NAME,...: the tier each SLA retunes (default: the base tier whose "
        "minTokensPerSecPerUser equals the SLA; without --base-values, sla-<N>)",
    )
    p.add_argument(
        "--users",
        action=CommaJoin,
        default=None,
        help="NAME=N,...: concurrent users expected on a tier; sets its replicas "
        "(ceil(users / admission cap)), or autoscaling.minReplicas where it autoscales",
    )
    p.add_argument(
        "--rps",
        action=CommaJoin,
        default=None,
        help="NAME=R,...: requests/s expected on a tier; replicas from the simulated "
        "request rate of one replica at its cap",
    )
    p.add_argument(
        "--diff",
        action="store_true",
        help="print every value the plan changes (path: old -> new) against --base-values",
    )
    p.add_argument(
        "--policies",
        action=CommaJoin,
        default=None,
        help="candidate policy specs (default lagged,prefix,mtp1,none)",
    )
    p.add_argument(
        "--max-concurrency",
        type=int,
        default=256,
        help="largest admission cap considered (default 256)",
    )
    p.add_argument(
        "--hardware-group",
        default=None,
        help="point the planned tiers at the profiler's ConfigMap of this hardware group "
        "(must be the profile's own, from its metadata) instead of keeping their table",
    )
    p.add_argument(
        "--cost-table-configmap",
        default=None,
        help="reference an existing cost-table ConfigMap instead of the profile's",
    )
    p.add_argument(
        "--sts-configmap",
        default="dspark-sts",
        help="STS ConfigMap a new tier references when --sts is not given (default dspark-sts)",
    )


def _run(args: argparse.Namespace) -> int:
    from dspark_sglang.planning.frontier import PolicySpec
    from dspark_sglang.planning.inputs import load_inputs, profile_identity
    from dspark_sglang.planning.planner import (
        DRAFT_STEP_KEY,
        PlanError,
        Planner,
        default_planner_specs,
        draft_text,
        plan_table,
        values_yaml,
    )
    from dspark_sglang.planning.values_edit import (
        CostTableSource,
        TierLoad,
        apply_plan,
        base_draft_step_seconds,
        load_base_values,
        map_tiers,
        values_diff,
    )
    from dspark_sglang.profiling.hardware import slugify
    from dspark_sglang.scheduling.cost_table import SpsCostTable

    try:
        slas = csv_numbers(args.sla, float)
        explicit = _tier_names(args.tier)
        users = _pairs(args.users, "--users", float)
        rps = _pairs(args.rps, "--rps", float)
        both = sorted(set(users) & set(rps))
        if both:
            raise PlanError(f"tier {both[0]}: give --users or --rps, not both")
        loads = {k: TierLoad(users=v) for k, v in users.items()}
        loads.update({k: TierLoad(requests_per_sec=v) for k, v in rps.items()})
        if args.hardware_group and args.cost_table_configmap:
            raise PlanError("give either --hardware-group or --cost-table-configmap, not both")
        inputs = load_inputs(args.profile, args.traces, args.sts, args.lengths, args.seed)
        ident = profile_identity(inputs.profile)
        if args.hardware_group and slugify(args.hardware_group) != ident.hardware:
            raise PlanError(
                f"--hardware-group {args.hardware_group}: the profile was measured on "
                f"{ident.hardware} (its metadata's hardware_slug); a table only holds for the "
                "hardware it was measured on, so profile that group or pass its own name"
            )
        base = load_base_values(args.base_values) if args.base_values else None
        if args.diff and base is None:
            raise PlanError("--diff compares against --base-values; give the live values")
        names = map_tiers(slas, base, explicit)
        if args.draft_step_seconds is not None:  # one value for every tier
            tier_drafts: dict[float, float] = {}
            draft_from = dict.fromkeys(slas, "--draft-step-seconds")
        else:
            tier_drafts = base_draft_step_seconds(base, names) if base is not None else {}
            draft_from = {
                sla: f"--base-values slaTiers[{names[sla]}].scheduler.{DRAFT_STEP_KEY}"
                for sla in tier_drafts
            }
        specs = (
            [PolicySpec.parse(s) for s in args.policies.split(",") if s.strip()]
            if args.policies
            else default_planner_specs()
        )
        planner = Planner(
            inputs.traces,
            inputs.table,
            inputs.lengths,
            specs=specs,
            sts=inputs.sts,
            max_concurrency=args.max_concurrency,
            prefill=args.prefill,
            seed=args.seed,
            draft_step_seconds=args.draft_step_seconds,
            draft_decision=args.draft_decision,
            probe_every=probe_every(args),
        )
        tiers = planner.plan(slas, tier_drafts)
        table = inputs.table
        inline = (
            {
                "sample_batch_tokens": list(table.sample_batch_tokens),
                "sample_steps_per_sec": list(table.sample_steps_per_sec),
                "max_batch_tokens": table.max_batch_tokens,
            }
            if isinstance(table, SpsCostTable)
            else None
        )
        source = CostTableSource(
            published={"hardwareGroup": ident.hardware, "version": ident.version},
            inline=inline,
            configmap=(
                {"configMapName": args.cost_table_configmap} if args.cost_table_configmap else None
            ),
            new_tier="published" if args.hardware_group else "inline",
        )
        sts = {"inline": {"temperatures": list(inputs.sts.temperatures)}} if inputs.sts else None
        start = base if base is not None else {"model": {"slug": ident.model}, "slaTiers": []}
        if base is None and sts is None:
            sts = {"configMapName": args.sts_configmap}
        doc = apply_plan(
            start,
            tiers,
            names,
            ident,
            cost_table=source,
            sts=sts,
            loads=loads,
            move_hardware=bool(args.hardware_group),
        )
    except (PlanError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(plan_table(tiers, names))
    for t in tiers:
        src = draft_from.get(t.sla)
        how = (
            f" (from {src})"
            if src
            else f"; give --draft-step-seconds or the tier's scheduler.{DRAFT_STEP_KEY}"
        )
        print(f"{names[t.sla]}: {draft_text(t.draft_step_seconds)}{how}")
    if args.diff:
        changes = values_diff(base or {}, doc)
        print(f"\nchanges to {args.base_values} ({len(changes)}):")
        for line in changes or ["(none)"]:
            print(f"  {line}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        values_yaml(doc, tiers, source=f"{args.profile}, {' '.join(args.traces)}", names=names),
        encoding="utf-8",
    )
    print(f"wrote {args.out}  (helm upgrade --install $REL $CHART -f {args.out})")
    return 0


COMMAND = Command(
    name="plan",
    help="Pick per-SLA caps and write them onto a Helm values file",
    description=(
        "Pick per-SLA admission caps and scheduler settings on a measured cost table and "
        "write them onto the release's Helm values (or a new values file)."
    ),
    epilog=EPILOG,
    formatter_class=argparse.RawDescriptionHelpFormatter,
    add_arguments=_add_arguments,
    run=_run,
)
