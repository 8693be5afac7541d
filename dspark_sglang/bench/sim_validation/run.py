"""One sim-validation run against a live server, and its report (JSON and plot).

Why a benchmark and not a test: the figures are timings of a shared machine; the test
suite checks the arithmetic (``load``, ``compare``) and that the client talks to a real
server, this module produces the numbers (``dspark-sglang bench sim-validation``).

``run_validation`` follows the protocol of the package docstring: profile once, then per
level re-probe the decode step at ``c`` requests, run the closed loop, split its steps,
optionally probe again right after it, and simulate the level on its own table.
``server_spec`` is the server it is meant for; ``write_report`` and ``plot_report``
write what ``bench sim-validation --out`` / ``--plot`` name.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from dspark_sglang.bench.sim_validation.client import RequestTimeline, stream_generate
from dspark_sglang.bench.sim_validation.compare import (
    ValidationPoint,
    ValidationSettings,
    simulate_level,
)
from dspark_sglang.bench.sim_validation.load import (
    LoadSteps,
    ServerProfile,
    closed_loop,
    load_steps,
    pick_decode_prompts,
    pick_prefill_prompts,
    profile_server,
    summarise_load,
)
from dspark_sglang.planning.traces import AcceptanceTraces
from dspark_sglang.results import dump_json
from dspark_sglang.scheduling.cost_table import SpsCostTable, from_probes

__all__ = ["plot_report", "run_validation", "server_spec", "write_report"]


def run_validation(
    base_url: str,
    prompts: Sequence[Sequence[int]],
    domains: Sequence[str],
    traces: AcceptanceTraces,
    settings: ValidationSettings,
    progress: Callable[[str], None] = print,
) -> tuple[ServerProfile, SpsCostTable, list[ValidationPoint]]:
    """Profile, load and simulate (see the module docstring)."""
    if len(prompts) != len(domains) or not prompts:
        raise ValueError("give one domain per prompt, and at least one prompt")
    s = settings

    def send(ids: Sequence[int], n: int) -> RequestTimeline:
        return stream_generate(base_url, ids, n, temperature=s.temperature)

    def decode_probe(c: int, repeats: int) -> float:
        """The decode step at ``c`` requests of the load's typical length, now."""
        fresh = profile_server(
            send,
            pick_decode_prompts(prompts, c),
            [c],
            [],
            verify_tokens_per_request=1 + s.static_k,
            decode_tokens=s.profile_decode_tokens or s.max_new_tokens,
            decode_repeats=repeats,
            warmup=False,
        )
        return fresh.decode_seconds[c]

    max_c = max(s.concurrencies)
    progress(
        f"profiling decode steps at 1..{max_c} requests and prefill of {s.prefill_probes} prompts"
    )
    profile = profile_server(
        send,
        pick_decode_prompts(prompts, max_c),
        list(range(1, max_c + 1)),
        pick_prefill_prompts(prompts, s.prefill_probes),
        verify_tokens_per_request=1 + s.static_k,
        decode_tokens=s.profile_decode_tokens or s.max_new_tokens,
        decode_repeats=s.profile_repeats,
    )
    table = from_probes(profile.probes())
    points: list[ValidationPoint] = []
    for c in s.concurrencies:
        level_table = table
        probe_step = profile.decode_seconds.get(c)
        if s.reprofile_each_level:
            # The dev VM's speed drifts by 15-25 % over minutes (benchmarks/README.md): the
            # step at c requests, which the load runs nearly all the time, is timed again
            # seconds before the load instead of once, minutes before it.
            progress(f"re-profiling decode at {c} requests")
            probe_step = decode_probe(c, s.profile_repeats)
            level_table = from_probes(profile.with_decode({c: probe_step}).probes())
        n_req = s.num_requests(c)
        progress(f"closed loop: concurrency {c}, {n_req} requests x {s.max_new_tokens} tokens")
        run = closed_loop(lambda i: send(prompts[i % len(prompts)], s.max_new_tokens), n_req, c)
        # Lockstep probes right after the load, one at a time: whether the machine's speed
        # moved while the load ran (the probe before it priced the whole level).
        after: list[tuple[float, float]] = []
        if s.probes_after:
            progress(f"probing decode at {c} requests {s.probes_after} times after the load")
        for _ in range(s.probes_after):
            at = time.perf_counter() - run.steady_end
            after.append((at, decode_probe(c, 1)))
        measured = summarise_load(run, s.warmup_fraction)
        try:
            steps: LoadSteps | None = load_steps(run)
        except ValueError as exc:  # a diagnostic: never lose the level over it
            progress(f"  c={c}: no step breakdown ({exc})")
            steps = None
        predicted = simulate_level(c, prompts, domains, traces, level_table, s)
        points.append(
            ValidationPoint(predicted, measured, level_table, probe_step, steps, tuple(after))
        )
        err = points[-1].error
        progress(
            f"  c={c}: throughput {measured.throughput:.2f} tok/s measured, "
            f"{predicted.throughput:.2f} predicted ({err['throughput']:+.1%})"
        )
        if steps is not None and probe_step:
            st = points[-1].steps_summary()
            progress(
                f"  c={c}: the load's quiet decode step {st['quiet_step_s']:.3f} s vs the "
                f"probe's {probe_step:.3f} s ({st['quiet_vs_probe']:+.1%}); "
                f"{st['arrivals']} arrivals held the others up {st['arrival_stall_total_s']:.1f} s"
            )
        if after:
            steps_after = ", ".join(f"{step:.3f}" for _, step in after)
            progress(f"  c={c}: decode step after the load {steps_after} s")
    return profile, table, points


def server_spec(model_path: Path, drafter: Path, k: int, threads: int, workdir: Path) -> Any:
    """The ``CpuEngineSpec`` of the validated server: DSPARK_MOE with ``drafter``, our
    static-``k`` policy (a ``scheduler.yaml`` written into ``workdir``), radix cache off."""
    from dspark_sglang.scheduling.config import SchedulerConfig
    from dspark_sglang.sglang_integration.engine import CpuEngineSpec
    from dspark_sglang.sglang_integration.launch import drafter_block_size, scheduler_env

    cfg = workdir / "scheduler.yaml"
    SchedulerConfig(
        block_size=drafter_block_size(drafter),
        policy="static",
        static_k=k,
        sla_name="sim-validation",
    ).save(cfg)
    return CpuEngineSpec(
        model_path=str(model_path),
        overrides={
            "speculative_algorithm": "DSPARK_MOE",
            "speculative_draft_model_path": str(drafter),
            "disable_radix_cache": True,
            "log_level": "error",
        },
        env=scheduler_env(cfg),
        omp_threads=threads,
    )


def write_report(
    path: Path,
    profile: ServerProfile,
    table: SpsCostTable,
    points: Sequence[ValidationPoint],
    meta: dict[str, Any],
) -> None:
    """JSON with the profile, the table, every point and the worst absolute errors."""
    errors = [p.error for p in points]
    worst = {
        k: max(abs(e[k]) for e in errors) for k in ("throughput", "user_tps_p50", "user_tps_p90")
    }
    dump_json(
        path,
        {
            **meta,
            "server_profile": profile.to_dict(),
            "cost_table": json.loads(table.to_json()),
            "points": [p.to_dict() for p in points],
            "max_abs_error": worst,
        },
    )


def plot_report(path: Path, points: Sequence[ValidationPoint], title: str) -> None:
    """Predicted vs measured throughput and per-user speed against concurrency."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cs = [p.measured.concurrency for p in points]
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    pairs = [
        ("throughput (output tok/s)", "throughput", "throughput"),
        ("per-user speed p50 (tok/s)", "user_tps_p50", "user_tps_p50"),
    ]
    for ax, (label, sim_key, live_key) in zip(axes, pairs, strict=True):
        ax.plot(cs, [getattr(p.measured, live_key) for p in points], "o-", label="measured (live)")
        ax.plot(cs, [getattr(p.predicted, sim_key) for p in points], "s--", label="simulated")
        ax.set_xlabel("concurrency (closed loop)")
        ax.set_ylabel(label)
        ax.set_xticks(cs)
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
