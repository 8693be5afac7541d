"""``dspark-sglang plan``: SLA targets -> a Helm values file, one ``slaTiers`` entry per SLA.

For each ``--sla`` (tokens/s per user) the planner (``planning/planner.py``) picks
the scheduling policy and the largest admission cap whose simulated p50 and p90
per-user speed still meet it, on the given cost table and acceptance traces, and
writes the values file the chart accepts, so sizing a deployment is one command.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from dspark_sglang.cli.base import Command, add_planning_arguments, csv_numbers


def _add_arguments(p: argparse.ArgumentParser) -> None:
    add_planning_arguments(p)
    p.add_argument("--sla", required=True, help="comma-separated tok/s/user targets, e.g. 80,120")
    p.add_argument(
        "--out",
        type=Path,
        default=Path("values-planned.yaml"),
        help="Helm values file to write (default values-planned.yaml)",
    )
    p.add_argument(
        "--policies", default=None, help="candidate policy specs (default lagged,prefix,mtp1,none)"
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
        help="reference the profiler's ConfigMap dspark-cost-table-<group>-<model>-tp<N> "
        "instead of embedding the table (model and TP come from the profile's .meta.json)",
    )
    p.add_argument(
        "--cost-table-configmap",
        default=None,
        help="reference an existing cost-table ConfigMap instead of embedding it",
    )
    p.add_argument(
        "--sts-configmap",
        default="dspark-sts",
        help="STS ConfigMap to reference when --sts is not given (default dspark-sts)",
    )


def _run(args: argparse.Namespace) -> int:
    from dspark_sglang.planning.frontier import PolicySpec
    from dspark_sglang.planning.inputs import load_inputs, profile_identity
    from dspark_sglang.planning.planner import (
        PlanError,
        Planner,
        default_planner_specs,
        plan_table,
        values_document,
        values_yaml,
    )

    try:
        inputs = load_inputs(args.profile, args.traces, args.sts, args.lengths, args.seed)
        slas = csv_numbers(args.sla, float)
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
        )
        tiers = planner.plan(slas)
        tp_size, model_slug = profile_identity(Path(args.profile))
        doc = values_document(
            tiers,
            inputs.table,
            hardware_group=args.hardware_group,
            cost_table_configmap=args.cost_table_configmap,
            sts=inputs.sts,
            sts_configmap=args.sts_configmap,
            tp_size=tp_size,
            model_slug=model_slug,
        )
    except (PlanError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(plan_table(tiers))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        values_yaml(doc, tiers, source=f"{args.profile}, {' '.join(args.traces)}"), encoding="utf-8"
    )
    print(f"wrote {args.out}  (helm install ... -f {args.out})")
    return 0


COMMAND = Command(
    name="plan",
    help="Pick per-SLA caps and write a Helm values file",
    description=(
        "Pick per-SLA admission caps and scheduler settings and write a Helm values file."
    ),
    add_arguments=_add_arguments,
    run=_run,
)
