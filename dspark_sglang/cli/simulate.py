"""``dspark-sglang simulate``: throughput and per-user speed of policies at given loads.

Runs the step-level serving simulator (``planning/simulator.py``, the real
scheduling policies) on a cost table and acceptance traces, closed loop at
``--concurrency`` levels or open loop at ``--rate`` arrival rates, and prints one
row per policy and load (``--json`` writes them all). ``--draft-step-seconds`` charges
the draft pass to every decode step that drafts; ``--draft-decision priced`` (the default,
what the chart's default tiers run) lets ``prefix`` and ``lagged`` leave steps plain where a
drafting round does not pay. The output says what draft cost it assumed and the share of
request-steps that drafted.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

from dspark_sglang.cli.base import (
    CommaJoin,
    Command,
    add_planning_arguments,
    csv_numbers,
    probe_every,
)


def _add_arguments(p: argparse.ArgumentParser) -> None:
    add_planning_arguments(p)
    p.add_argument(
        "--policy",
        action=CommaJoin,
        default="lagged",
        help="comma-separated policy specs: prefix, lagged[:lag], static:<k>, mtp1, "
        "verify_all, none (default lagged)",
    )
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument(
        "--concurrency", action=CommaJoin, help="closed loop: comma-separated concurrencies"
    )
    g.add_argument(
        "--rate", action=CommaJoin, help="open loop: comma-separated arrival rates (requests/s)"
    )
    p.add_argument("--max-running", type=int, default=None, help="admission cap (open loop)")
    p.add_argument("--num-requests", type=int, default=None, help="requests per run")
    p.add_argument("--json", type=Path, default=None, help="write all results as JSON")


def _run(args: argparse.Namespace) -> int:
    from dspark_sglang.planning.frontier import PolicySpec, default_num_requests
    from dspark_sglang.planning.inputs import load_inputs
    from dspark_sglang.planning.planner import draft_text
    from dspark_sglang.planning.simulator import SimConfig, simulate

    try:
        inputs = load_inputs(args.profile, args.traces, args.sts, args.lengths, args.seed)
        specs = [PolicySpec.parse(s) for s in args.policy.split(",") if s.strip()]
        draft = args.draft_step_seconds
        decision = {"draft_decision": args.draft_decision}
        probe = probe_every(args)
        if probe is not None:
            decision["probe_every"] = probe
        for spec in specs:  # the config's checks (e.g. static k <= block) before any run
            spec.config(inputs.traces.block_size, draft_step_seconds=draft)
        loads: list[SimConfig] = []
        if args.concurrency:
            for c in csv_numbers(args.concurrency, int):
                n = args.num_requests or default_num_requests(c)
                loads.append(
                    SimConfig(
                        concurrency=c,
                        max_running_requests=args.max_running,
                        num_requests=n,
                        prefill=args.prefill,
                        seed=args.seed,
                        draft_step_seconds=draft or 0.0,
                        **decision,
                    )
                )
        else:
            if args.max_running is None:
                raise ValueError("open loop (--rate) needs --max-running (the admission cap)")
            for r in csv_numbers(args.rate, float):
                loads.append(
                    SimConfig(
                        mode="open",
                        arrival_rate=r,
                        max_running_requests=args.max_running,
                        num_requests=args.num_requests or 300,
                        prefill=args.prefill,
                        seed=args.seed,
                        draft_step_seconds=draft or 0.0,
                        **decision,
                    )
                )
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    table, traces, sts, lengths = inputs.table, inputs.traces, inputs.sts, inputs.lengths
    results = []
    print(draft_text(draft or None) + ("" if draft else "; give --draft-step-seconds to charge it"))
    print(
        f"{'policy':<14}{'load':>9}{'thr tok/s':>11}{'p50':>9}{'p90':>9}{'verify/req':>11}"
        f"{'acc len':>9}{'drafted':>9}"
    )
    for spec in specs:
        for load_cfg in loads:
            cfg = replace(load_cfg, draft_decision=spec.draft_decision(load_cfg.draft_decision))
            policy = spec.build(table, block_size=traces.block_size, draft_step_seconds=draft)
            res = simulate(traces, table, policy, lengths, cfg, sts=sts)
            results.append({"spec": spec.label, **res.to_dict()})
            load = f"C={cfg.concurrency}" if cfg.mode == "closed" else f"λ={cfg.arrival_rate:g}"
            print(
                f"{spec.label:<14}{load:>9}{res.throughput:>11.1f}{res.user_tps_p50:>9.1f}"
                f"{res.user_tps_p90:>9.1f}{res.mean_verify_tokens_per_request:>11.2f}"
                f"{res.mean_accept_len:>9.2f}{res.drafted_share:>9.0%}"
            )
    if args.json:
        from dspark_sglang.planning.frontier import _finite

        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(_finite(results), indent=1), encoding="utf-8")
    return 0


COMMAND = Command(
    name="simulate",
    help="Predict throughput and per-user speed of policies",
    description=(
        "Predict throughput and per-user speed of scheduling policies with the serving "
        "simulator (cost table + acceptance traces)."
    ),
    add_arguments=_add_arguments,
    run=_run,
)
