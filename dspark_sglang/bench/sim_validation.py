"""Simulator vs a live SGLang server: predicted and measured at several concurrencies.

Why a benchmark and not a test: the figures are timings of a shared machine; the
test suite checks the arithmetic (``planning.live``) and that the pieces talk to a
real server, this module produces the numbers (``bench sim-validation``).

Procedure (one server, static-``k`` policy so the verify budget is known):
profile the server's decode and prefill step times into an ``SpsCostTable``, then
for each concurrency ``c`` time the decode step at ``c`` requests again (the table's
entry the load leans on, measured seconds before it), run a closed-loop load of real
eval prompts at temperature 1 and simulate the same load on that level's table,
replaying the drafter's recorded acceptance traces. The load never feeds the table,
so the error is out of sample.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from dspark_sglang.planning.live import (
    LiveMeasurement,
    LoadSteps,
    ServerProfile,
    closed_loop,
    load_steps,
    prediction_error,
    profile_server,
    stream_generate,
    summarise_load,
)
from dspark_sglang.planning.simulator import (
    ClosedAdmission,
    FirstToken,
    SimConfig,
    SimResult,
    simulate,
)
from dspark_sglang.planning.traces import AcceptanceTraces
from dspark_sglang.planning.workload import LengthDistribution
from dspark_sglang.results import dump_json
from dspark_sglang.scheduling.cost_table import SpsCostTable, from_probes
from dspark_sglang.scheduling.policies import build_policy

__all__ = [
    "ValidationPoint",
    "ValidationSettings",
    "interleave_prompts",
    "pick_decode_prompts",
    "pick_prefill_prompts",
    "run_validation",
    "server_spec",
    "simulate_level",
]


@dataclass(frozen=True)
class ValidationSettings:
    """What to measure; see ``dspark-sglang bench sim-validation --help``."""

    static_k: int
    concurrencies: tuple[int, ...]
    requests_per_client: int
    max_new_tokens: int
    warmup_fraction: float = 0.2
    min_requests: int = 12  # per level: at c = 1, 4 requests left the level to chance
    profile_decode_tokens: int | None = None  # None: max_new_tokens, the load's output
    profile_repeats: int = 3  # decode probes per batch size (median kept; planning.live)
    reprofile_each_level: bool = True  # re-probe decode at c requests right before level c
    prefill_probes: int = 5
    sim_requests: int = 400
    temperature: float = 1.0
    seed: int = 0
    # SGLang streams the prefill's token with the first speculative round (README, "TTFT"),
    # and the live TTFT and per-user speed are timed from that chunk.
    first_token: FirstToken = "first_round"
    # A closed-loop client's next request reaches the server after it has launched the
    # next step for the others (README, "TTFT"): it joins one step late.
    closed_admission: ClosedAdmission = "next_step"

    def __post_init__(self) -> None:
        if self.static_k < 1:
            raise ValueError(f"static_k must be >= 1, got {self.static_k}")
        if not self.concurrencies or min(self.concurrencies) < 1:
            raise ValueError(f"concurrencies must be >= 1, got {self.concurrencies}")
        if self.requests_per_client < 2:
            raise ValueError(
                f"requests_per_client must be >= 2 (a warm-up and a measured request), "
                f"got {self.requests_per_client}"
            )
        if self.profile_repeats < 1:
            raise ValueError(f"profile_repeats must be >= 1, got {self.profile_repeats}")
        if self.min_requests < 1:
            raise ValueError(f"min_requests must be >= 1, got {self.min_requests}")
        if self.profile_decode_tokens is not None and self.profile_decode_tokens < 4:
            raise ValueError(
                f"profile_decode_tokens must be >= 4 (or None), got {self.profile_decode_tokens}"
            )
        if self.max_new_tokens < 2:
            raise ValueError(f"max_new_tokens must be >= 2, got {self.max_new_tokens}")
        # The simulator owns these two options: its config checks them, naming the field.
        SimConfig(
            concurrency=1, first_token=self.first_token, closed_admission=self.closed_admission
        )
        if not 0.0 <= self.warmup_fraction < 1.0:
            raise ValueError(f"warmup_fraction must be in [0, 1), got {self.warmup_fraction}")

    def num_requests(self, concurrency: int) -> int:
        """Requests run at one level, warm-up included.

        ``requests_per_client`` per client keeps every client busy past the warm-up;
        the ``min_requests`` floor keeps low levels from resting on a handful of
        requests, whose acceptance alone can move their throughput by a third.
        """
        return max(self.requests_per_client * concurrency, self.min_requests)


@dataclass(frozen=True)
class ValidationPoint:
    """One concurrency: what the simulator predicted, what the server did."""

    predicted: SimResult
    measured: LiveMeasurement
    table: SpsCostTable | None = None  # the table this level was simulated on
    probe_step_s: float | None = None  # the table's decode step at c requests
    steps: LoadSteps | None = None  # the load's own steps (planning.live.load_steps)

    @property
    def error(self) -> dict[str, float]:
        """Relative error of the prediction, per figure (see ``prediction_error``)."""
        return prediction_error(self.predicted, self.measured)

    def to_dict(self) -> dict[str, Any]:
        return {
            "concurrency": self.measured.concurrency,
            "predicted": self.predicted.to_dict(),
            "measured": self.measured.__dict__,
            "error": self.error,
            **({} if self.table is None else {"cost_table": json.loads(self.table.to_json())}),
            **({} if self.steps is None else {"load_steps": self.steps_summary()}),
        }

    def steps_summary(self) -> dict[str, Any]:
        """The load's steps against the probe's step and the simulator's prefill charge."""
        if self.steps is None:
            raise ValueError("this level has no step breakdown (ValidationPoint.steps)")
        steps = self.steps
        d = steps.to_dict()
        sim = self.predicted.details
        if sim is not None:  # what the simulator charged per arrival, to set against stalls
            admitted = int(np.count_nonzero(~np.isnan(sim.req_admit)))
            prefill = float(sim.step_time[sim.step_decoding == 0].sum())
            d["simulated_prefill_per_request_s"] = prefill / max(admitted, 1)
        if self.probe_step_s:
            d["probe_step_s"] = self.probe_step_s
            d["quiet_vs_probe"] = steps.quiet_step_s / self.probe_step_s - 1.0
        return d


def pick_prefill_prompts(prompts: Sequence[Sequence[int]], count: int) -> list[list[int]]:
    """``count`` prompts spread over the length range (shortest .. longest), distinct lengths."""
    by_len: dict[int, list[int]] = {}
    for p in prompts:
        by_len.setdefault(len(p), list(p))
    lengths = sorted(by_len)
    if count >= len(lengths):
        return [by_len[n] for n in lengths]
    idx = sorted({round(i * (len(lengths) - 1) / (count - 1)) for i in range(count)})
    return [by_len[lengths[i]] for i in idx]


def pick_decode_prompts(prompts: Sequence[Sequence[int]], count: int) -> list[list[int]]:
    """The ``count`` prompts nearest the median length: the decode probe's context should be
    the load's typical one (``profile_server``)."""
    if not prompts:
        raise ValueError("pick_decode_prompts needs at least one prompt")
    median = statistics.median(len(p) for p in prompts)
    order = sorted(range(len(prompts)), key=lambda i: (abs(len(prompts[i]) - median), i))
    return [list(prompts[i]) for i in order[:count]]


def interleave_prompts(
    by_set: dict[str, list[list[int]]], sets: Sequence[str], num_prompts: int
) -> tuple[list[list[int]], list[str]]:
    """The first ``num_prompts`` of each set, interleaved (set 1's first, set 2's first,
    ...), so that every level sees the same domain mix; and each prompt's set."""
    prompts: list[list[int]] = []
    domains: list[str] = []
    for i in range(num_prompts):
        for name in sets:
            if i < len(by_set[name]):
                prompts.append(by_set[name][i])
                domains.append(name)
    return prompts, domains


def simulate_level(
    c: int,
    prompts: Sequence[Sequence[int]],
    domains: Sequence[str],
    traces: AcceptanceTraces,
    table: SpsCostTable,
    settings: ValidationSettings,
) -> SimResult:
    """The simulator's prediction of level ``c``: the same requests the load sends
    (``prompts`` in order, cycling), on ``table``, replaying ``traces``."""
    s = settings
    n_req = s.num_requests(c)
    used = [prompts[i % len(prompts)] for i in range(n_req)]
    used_domains = [domains[i % len(prompts)] for i in range(n_req)]
    lengths = LengthDistribution(
        prompt_tokens=tuple(len(p) for p in used),
        output_tokens=(s.max_new_tokens,) * n_req,
        source="the live run's prompts",
    )
    weights = {d: used_domains.count(d) / n_req for d in traces.domains}
    return simulate(
        traces,
        table,
        build_policy("static", k=s.static_k),
        lengths,
        SimConfig(
            mode="closed",
            concurrency=c,
            num_requests=max(s.sim_requests, n_req),
            warmup_fraction=s.warmup_fraction,
            prefill="separate",
            first_token=s.first_token,
            closed_admission=s.closed_admission,
            domain_weights=weights,
            seed=s.seed,
        ),
    )


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

    def send(ids: Sequence[int], n: int) -> Any:
        return stream_generate(base_url, ids, n, temperature=s.temperature)

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
            fresh = profile_server(
                send,
                pick_decode_prompts(prompts, c),
                [c],
                [],
                verify_tokens_per_request=1 + s.static_k,
                decode_tokens=s.profile_decode_tokens or s.max_new_tokens,
                decode_repeats=s.profile_repeats,
                warmup=False,
            )
            level_table = from_probes(profile.with_decode(fresh.decode_seconds).probes())
            probe_step = fresh.decode_seconds[c]
        n_req = s.num_requests(c)
        progress(f"closed loop: concurrency {c}, {n_req} requests x {s.max_new_tokens} tokens")
        run = closed_loop(lambda i: send(prompts[i % len(prompts)], s.max_new_tokens), n_req, c)
        measured = summarise_load(run, s.warmup_fraction)
        try:
            steps: LoadSteps | None = load_steps(run)
        except ValueError as exc:  # a diagnostic: never lose the level over it
            progress(f"  c={c}: no step breakdown ({exc})")
            steps = None
        predicted = simulate_level(c, prompts, domains, traces, level_table, s)
        points.append(ValidationPoint(predicted, measured, level_table, probe_step, steps))
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
