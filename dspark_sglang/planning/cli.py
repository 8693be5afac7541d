"""``dspark-sglang simulate`` and ``dspark-sglang plan``.

``simulate`` predicts throughput and per-user speed of policies at given loads;
``plan`` turns a cost table, acceptance traces and SLA targets into a Helm values file
(one ``slaTiers`` entry per SLA), so sizing a deployment is one command.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from dspark_sglang.cli import Command

__all__ = ["COMMANDS"]


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--profile", required=True, type=Path, help="SGLang SPS cost-table JSON (the profiler's)"
    )
    p.add_argument(
        "--traces",
        required=True,
        nargs="+",
        help="acceptance trace files (.jsonl/.pt, see planning/traces.py; several are joined, "
        "e.g. the per-domain files `bench acceptance --traces-dir` writes), or "
        "'synthetic[:B]' for a built-in synthetic set (high acceptance, block B, default 7)",
    )
    p.add_argument("--sts", type=Path, default=None, help="STS calibration JSON (default: T=1)")
    p.add_argument(
        "--lengths",
        type=Path,
        default=None,
        help="request lengths .jsonl ({prompt_tokens, output_tokens}); default GSM8K chars/4",
    )
    p.add_argument(
        "--prefill",
        choices=("separate", "mixed", "none"),
        default="separate",
        help="prefill model (default separate: prefill-only steps, SGLang's default)",
    )
    p.add_argument("--seed", type=int, default=0)


def _load_inputs(args: argparse.Namespace):  # type: ignore[no-untyped-def]
    from dspark_sglang.calibration.sts import load_sts
    from dspark_sglang.planning.traces import (
        decaying_acceptance,
        load_traces_many,
        synthetic_traces,
    )
    from dspark_sglang.planning.workload import default_lengths, load_lengths
    from dspark_sglang.scheduling.cost_table import load_cost_table

    table = load_cost_table(args.profile)
    if len(args.traces) == 1 and args.traces[0].startswith("synthetic"):
        _, _, b = args.traces[0].partition(":")
        block = int(b) if b else 7
        traces = synthetic_traces(
            200,
            40,
            decaying_acceptance(0.9, 0.98, block),
            auc=0.85,
            request_spread=1.0,
            seed=args.seed,
        )
    else:
        traces = load_traces_many(args.traces)
    sts = load_sts(args.sts) if args.sts else None
    if sts is not None and sts.block_size != traces.block_size:
        raise ValueError(
            f"--sts {args.sts} has {sts.block_size} temperatures but the traces' block size is "
            f"{traces.block_size}; calibrate STS on rollouts of the drafter that recorded them"
        )
    lengths = load_lengths(args.lengths) if args.lengths else default_lengths()
    return table, traces, sts, lengths


def _csv_numbers(text: str, kind: type) -> list:  # type: ignore[type-arg]
    try:
        return [kind(x) for x in text.split(",") if x.strip()]
    except ValueError as exc:
        raise ValueError(f"expected comma-separated numbers, got {text!r}") from exc


# --------------------------------------------------------------------------- simulate


def _add_simulate(p: argparse.ArgumentParser) -> None:
    _common(p)
    p.add_argument(
        "--policy",
        default="lagged",
        help="comma-separated policy specs: prefix, lagged[:lag], static:<k>, mtp1, "
        "verify_all, none (default lagged)",
    )
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--concurrency", help="closed loop: comma-separated concurrencies")
    g.add_argument("--rate", help="open loop: comma-separated arrival rates (requests/s)")
    p.add_argument("--max-running", type=int, default=None, help="admission cap (open loop)")
    p.add_argument("--num-requests", type=int, default=None, help="requests per run")
    p.add_argument("--json", type=Path, default=None, help="write all results as JSON")


def _run_simulate(args: argparse.Namespace) -> int:
    from dspark_sglang.planning.frontier import PolicySpec, default_num_requests
    from dspark_sglang.planning.simulator import SimConfig, simulate

    try:
        table, traces, sts, lengths = _load_inputs(args)
        specs = [PolicySpec.parse(s) for s in args.policy.split(",") if s.strip()]
        loads: list[SimConfig] = []
        if args.concurrency:
            for c in _csv_numbers(args.concurrency, int):
                n = args.num_requests or default_num_requests(c)
                loads.append(
                    SimConfig(
                        concurrency=c,
                        max_running_requests=args.max_running,
                        num_requests=n,
                        prefill=args.prefill,
                        seed=args.seed,
                    )
                )
        else:
            if args.max_running is None:
                raise ValueError("open loop (--rate) needs --max-running (the admission cap)")
            for r in _csv_numbers(args.rate, float):
                loads.append(
                    SimConfig(
                        mode="open",
                        arrival_rate=r,
                        max_running_requests=args.max_running,
                        num_requests=args.num_requests or 300,
                        prefill=args.prefill,
                        seed=args.seed,
                    )
                )
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    results = []
    print(
        f"{'policy':<14}{'load':>9}{'thr tok/s':>11}{'p50':>9}{'p90':>9}{'verify/req':>11}"
        f"{'acc len':>9}"
    )
    for spec in specs:
        for cfg in loads:
            res = simulate(traces, table, spec.build(table), lengths, cfg, sts=sts)
            results.append({"spec": spec.label, **res.to_dict()})
            load = f"C={cfg.concurrency}" if cfg.mode == "closed" else f"λ={cfg.arrival_rate:g}"
            print(
                f"{spec.label:<14}{load:>9}{res.throughput:>11.1f}{res.user_tps_p50:>9.1f}"
                f"{res.user_tps_p90:>9.1f}{res.mean_verify_tokens_per_request:>11.2f}"
                f"{res.mean_accept_len:>9.2f}"
            )
    if args.json:
        from dspark_sglang.planning.frontier import _finite

        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(_finite(results), indent=1), encoding="utf-8")
    return 0


# --------------------------------------------------------------------------- plan


def _add_plan(p: argparse.ArgumentParser) -> None:
    _common(p)
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


def _profile_identity(profile: Path) -> tuple[int, str | None]:
    """``(tp_size, model)`` from the profiler's ``<table>.meta.json`` beside the table.

    Why: a tier must run at the TP its cost table was measured at, and the chart finds
    the profiler's ConfigMap by model and TP. A table without metadata (hand-made)
    plans as TP 1 with no model slug.
    """
    meta_path = profile.with_name(profile.stem + ".meta.json")
    if not meta_path.is_file():
        return 1, None
    try:
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ValueError(
            f"{meta_path}: not valid JSON ({exc}); re-run `dspark-sglang profile`"
        ) from exc
    tp = meta.get("tp_size", 1)
    if not (isinstance(tp, int) and tp >= 1):
        raise ValueError(f"{meta_path}: tp_size must be an int >= 1, got {tp!r}")
    model = meta.get("model")
    return tp, str(model) if model else None


def _run_plan(args: argparse.Namespace) -> int:
    from dspark_sglang.planning.frontier import PolicySpec
    from dspark_sglang.planning.planner import (
        PlanError,
        Planner,
        default_planner_specs,
        plan_table,
        values_document,
        values_yaml,
    )

    try:
        table, traces, sts, lengths = _load_inputs(args)
        slas = _csv_numbers(args.sla, float)
        specs = (
            [PolicySpec.parse(s) for s in args.policies.split(",") if s.strip()]
            if args.policies
            else default_planner_specs()
        )
        planner = Planner(
            traces,
            table,
            lengths,
            specs=specs,
            sts=sts,
            max_concurrency=args.max_concurrency,
            prefill=args.prefill,
            seed=args.seed,
        )
        tiers = planner.plan(slas)
        tp_size, model_slug = _profile_identity(Path(args.profile))
        doc = values_document(
            tiers,
            table,
            hardware_group=args.hardware_group,
            cost_table_configmap=args.cost_table_configmap,
            sts=sts,
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


COMMANDS: dict[str, Command] = {
    "simulate": (
        "predict throughput and per-user speed of scheduling policies with the serving "
        "simulator (cost table + acceptance traces)",
        _add_simulate,
        _run_simulate,
    ),
    "plan": (
        "pick per-SLA admission caps and scheduler settings and write a Helm values file",
        _add_plan,
        _run_plan,
    ),
}
