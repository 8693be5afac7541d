"""The live frontier's servers: one ``sglang.launch_server`` per engine, as the chart's
default tier starts it, plus the CPU's needs (see ``benchmarks/live_frontier.py``)."""

from __future__ import annotations

import argparse
import contextlib
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dspark_sglang.bench.live_frontier.engines import (
    ADMISSION_KEY,
    PLAIN,
    default_engine,
    default_tier,
    engine_config_fields,
    tier_config_fields,
)


@dataclass(frozen=True)
class Plan:
    """Everything the servers and the client need, checked before any server starts."""

    specs: dict[str, Any]  # engine -> CpuEngineSpec
    configs: dict[str, dict[str, Any] | None]  # engine -> scheduler config fields
    tier: Mapping[str, Any]
    default_engine: str
    drafter: Path
    dtype: Any


def plan_servers(args: argparse.Namespace, model_path: Path, workdir: Path) -> Plan:
    """The chart's default tier (``--values``) turned into one server spec per engine."""
    import yaml
    from rich.console import Console

    from dspark_sglang.scheduling.config import SchedulerConfig, num_draft_tokens
    from dspark_sglang.sglang_integration.cpu_dtype import choose_cpu_dtype, read_cpuinfo
    from dspark_sglang.sglang_integration.demo import resolve_drafter
    from dspark_sglang.sglang_integration.engine import CpuEngineSpec
    from dspark_sglang.sglang_integration.launch import (
        check_block_size,
        drafter_block_size,
        drafter_sts,
        scheduler_env,
    )
    from dspark_sglang.targets.smollm2 import DEFAULT_DRAFTER_DIR

    console = Console(stderr=True)
    dtype = choose_cpu_dtype(args.dtype, read_cpuinfo() if args.dtype == "auto" else None)
    console.print(dtype.describe(), highlight=False)
    tier = default_tier(yaml.safe_load(args.values.read_text(encoding="utf-8")))
    fields = tier_config_fields(tier)
    greedy_only = bool(fields.get("greedy_only", False))
    if greedy_only and max(args.temperatures) > 0:
        raise ValueError(
            f"the default tier {tier['name']!r} is greedyOnly: it answers sampled requests "
            "with HTTP 400; give --temperatures 0"
        )
    given = None if args.drafter == DEFAULT_DRAFTER_DIR else args.drafter
    drafter, trained = resolve_drafter(
        model_path, given, DEFAULT_DRAFTER_DIR, args.seed, workdir, console
    )
    if not trained:
        raise ValueError(
            "no trained drafter: a speed benchmark of an untrained one measures nothing"
        )
    block = drafter_block_size(drafter)
    sts = drafter_sts(drafter, greedy_only=greedy_only)
    cost_table = str(args.cost_table.resolve()) if args.cost_table else None
    base: dict[str, Any] = {
        "dtype": dtype.dtype,
        "mem_fraction_static": args.mem_fraction_static,
        "max_total_tokens": args.max_total_tokens,
        "random_seed": args.seed,
        "sleep_on_idle": True,
        "enable_metrics": True,
        "max_running_requests": int(tier["scheduler"][ADMISSION_KEY]),
    }
    specs: dict[str, Any] = {}
    configs: dict[str, dict[str, Any] | None] = {}
    for engine in args.engines:
        overrides = dict(base)
        env: dict[str, str] = {}
        if engine != PLAIN:
            cfg_fields = engine_config_fields(engine, fields, str(sts) if sts else None, cost_table)
            path = None
            if cfg_fields is not None:
                try:
                    cfg = SchedulerConfig.from_dict(cfg_fields, source=f"engine {engine}")
                except ValueError as exc:  # e.g. a key this checkout's config does not know
                    raise ValueError(f"{exc}; leave the engine out with --engines") from exc
                check_block_size(cfg, f"the default tier {tier['name']!r}", block)
                path = workdir / f"scheduler-{engine}.yaml"
                cfg.save(path)
                configs[engine] = cfg.to_dict()
            else:
                configs[engine] = None
            overrides |= {
                "speculative_algorithm": "DSPARK_MOE",
                "speculative_draft_model_path": str(drafter),
                "speculative_num_draft_tokens": num_draft_tokens(block),
            }
            if cost_table:
                overrides["speculative_dspark_sps_table_path"] = cost_table
            env = scheduler_env(path, greedy_draft=greedy_only)
        specs[engine] = CpuEngineSpec(
            model_path=str(model_path), overrides=overrides, env=env, omp_threads=args.threads
        )
    return Plan(specs, configs, tier, default_engine(tier["scheduler"]), drafter, dtype)


def memory_mb(pid: int) -> dict[str, float]:
    """RSS and PSS (shared pages split between their users) of a server's process tree, MB:
    the PSS sum is what the servers alive together take from the machine."""
    import psutil

    with contextlib.suppress(psutil.Error):
        root = psutil.Process(pid)
        full = [p.memory_full_info() for p in (root, *root.children(recursive=True))]
        return {
            "rss_mb": sum(f.rss for f in full) / 2**20,
            "pss_mb": sum(getattr(f, "pss", f.rss) for f in full) / 2**20,
        }
    return {"rss_mb": math.nan, "pss_mb": math.nan}


def start_servers(
    stack: contextlib.ExitStack, plan: Plan, engines: Sequence[str], workdir: Path
) -> tuple[dict[str, Any], dict[str, float]]:
    """Start every engine's server, one after the other (each stopped, by PID, when
    ``stack`` closes); ``({engine: RunningServer}, {engine: start-up s})``."""
    from dspark_sglang.sglang_integration.server import cpu_server

    servers: dict[str, Any] = {}
    startup: dict[str, float] = {}
    for engine in engines:
        print(f"starting {engine} (python -m sglang.launch_server) ...", flush=True)
        t0 = time.monotonic()
        try:
            servers[engine] = stack.enter_context(
                cpu_server(plan.specs[engine], workdir / f"server-{engine}.log")
            )
        except (RuntimeError, TimeoutError) as exc:
            raise RuntimeError(
                f"the {engine} server did not start (leave it out with --engines): {exc}"
            ) from exc
        startup[engine] = time.monotonic() - t0
        print(f"  {engine} at {servers[engine].base_url} in {startup[engine]:.0f} s", flush=True)
    return servers, startup


def warm_up(servers: Mapping[str, Any], temperatures: Sequence[float]) -> None:
    """One short untimed request per server and temperature (first-use costs)."""
    from dspark_sglang.sglang_integration.server import post_json

    for srv in servers.values():
        for t in temperatures:
            params = {"temperature": t, "max_new_tokens": 8}
            post_json(srv.base_url + "/generate", {"text": "Hello", "sampling_params": params})
