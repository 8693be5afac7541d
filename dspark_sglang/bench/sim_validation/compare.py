"""The comparison side of sim validation: what to measure, the prediction, and its error.

Why its own module: the prediction of a level needs no server. Given the level's cost
table (profiled from the server, never from the load), the requests the load sent and
the drafter's recorded acceptance traces, ``simulate_level`` recomputes it exactly. So a
stored run can be re-simulated later (``resimulate_run``) to judge a change of the
simulator's model on the loads already measured, not only on the next run.

Error = ``predicted / measured - 1`` (``prediction_error``), per figure: throughput and
per-user speed p50 / p90, read the same way from the simulated and the live run.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

import numpy as np

from dspark_sglang.bench.sim_validation.load import LiveMeasurement, LoadSteps
from dspark_sglang.planning.simulator import (
    ClosedAdmission,
    FirstToken,
    SimConfig,
    SimResult,
    simulate,
)
from dspark_sglang.planning.traces import AcceptanceTraces, load_traces_many
from dspark_sglang.planning.workload import LengthDistribution
from dspark_sglang.results import local_path
from dspark_sglang.scheduling.config import SchedulerConfig
from dspark_sglang.scheduling.cost_table import SpsCostTable
from dspark_sglang.scheduling.policies import policy_from_config

__all__ = [
    "EVAL_SETS",
    "OLD_TIMING",
    "ResimulatedLevel",
    "ValidationPoint",
    "ValidationSettings",
    "interleave_prompts",
    "prediction_error",
    "resimulate_run",
    "simulate_level",
    "stored_settings",
    "validation_prompts",
]

#: The eval sets whose prompts the load sends, interleaved in this order.
EVAL_SETS: tuple[str, ...] = ("gsm8k", "humaneval", "mtbench")

#: The simulator's timing before ``first_token`` and ``closed_admission`` existed: what a
#: stored run that does not name them was simulated with.
OLD_TIMING: dict[str, str] = {"first_token": "prefill", "closed_admission": "at_finish"}


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
    profile_repeats: int = 3  # decode probes per batch size (median kept; load.profile_server)
    reprofile_each_level: bool = True  # re-probe decode at c requests right before level c
    probes_after: int = 0  # single decode probes at c requests right after level c's load
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
        if self.probes_after < 0:
            raise ValueError(f"probes_after must be >= 0, got {self.probes_after}")
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

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready; ``stored_settings`` reads it back."""
        return {**self.__dict__, "concurrencies": list(self.concurrencies)}


def prediction_error(predicted: SimResult, measured: LiveMeasurement) -> dict[str, float]:
    """Relative error ``predicted / measured - 1`` of throughput and per-user p50/p90."""
    if predicted.concurrency != measured.concurrency:
        raise ValueError(
            f"compare like with like: predicted concurrency {predicted.concurrency} vs "
            f"measured {measured.concurrency}"
        )
    return {
        "throughput": predicted.throughput / measured.throughput - 1.0,
        "user_tps_p50": predicted.user_tps_p50 / measured.user_tps_p50 - 1.0,
        "user_tps_p90": predicted.user_tps_p90 / measured.user_tps_p90 - 1.0,
    }


@dataclass(frozen=True)
class ValidationPoint:
    """One concurrency: what the simulator predicted, what the server did."""

    predicted: SimResult
    measured: LiveMeasurement
    table: SpsCostTable | None = None  # the table this level was simulated on
    probe_step_s: float | None = None  # the table's decode step at c requests
    steps: LoadSteps | None = None  # the load's own steps (load.load_steps)
    # (seconds after the load's steady window ended, decode step at c requests) of each
    # probe right after the load (ValidationSettings.probes_after): did the machine drift?
    probes_after: tuple[tuple[float, float], ...] = ()

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
            **(
                {}
                if not self.probes_after
                else {"probes_after": [{"after_s": t, "step_s": s} for t, s in self.probes_after]}
            ),
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


def interleave_prompts(
    by_set: Mapping[str, Sequence[Sequence[int]]], sets: Sequence[str], num_prompts: int
) -> tuple[list[list[int]], list[str]]:
    """The first ``num_prompts`` of each set, interleaved (set 1's first, set 2's first,
    ...), so that every level sees the same domain mix; and each prompt's set."""
    prompts: list[list[int]] = []
    domains: list[str] = []
    for i in range(num_prompts):
        for name in sets:
            if i < len(by_set[name]):
                prompts.append(list(by_set[name][i]))
                domains.append(name)
    return prompts, domains


def validation_prompts(
    model_path: str | Path, num_prompts: int
) -> tuple[list[list[int]], list[str]]:
    """The load's requests: the first ``num_prompts`` of each of ``EVAL_SETS`` through the
    target's chat template, interleaved (``interleave_prompts``); and each prompt's set."""
    from dspark_sglang.bench.acceptance import load_eval_prompts
    from dspark_sglang.targets.hf_target import HFTarget

    target = HFTarget(model_path, num_threads=1)
    by_set = load_eval_prompts(target, list(EVAL_SETS), num_prompts)
    return interleave_prompts(by_set, EVAL_SETS, num_prompts)


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
        policy_from_config(
            SchedulerConfig(block_size=traces.block_size, policy="static", static_k=s.static_k)
        ),
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


# --------------------------------------------------------------------------- stored runs


def stored_settings(run: Mapping[str, Any]) -> ValidationSettings:
    """The settings a stored run used; a run from before an option existed used its old
    value (``OLD_TIMING``), any other option missing from it takes today's default."""
    known = {f.name for f in fields(ValidationSettings)}
    stored = {**OLD_TIMING, **run["settings"]}
    unknown = sorted(set(stored) - known)
    if unknown:
        raise ValueError(
            f"the run's settings name {unknown}, which ValidationSettings does not have: "
            "re-simulate it with the version of dspark-sglang that wrote it"
        )
    stored["concurrencies"] = tuple(stored["concurrencies"])
    return ValidationSettings(**stored)


@dataclass(frozen=True)
class ResimulatedLevel:
    """One level of a stored run, simulated again: as it ran, and with today's timing."""

    concurrency: int
    measured: LiveMeasurement
    as_run: SimResult  # the run's own settings: reproduces the stored prediction
    today: SimResult  # the same, with today's ValidationSettings timing defaults

    def error(self, which: str = "today") -> dict[str, float]:
        """``prediction_error`` of ``as_run`` or ``today``."""
        if which not in ("as_run", "today"):
            raise ValueError(f"which must be 'as_run' or 'today', got {which!r}")
        return prediction_error(getattr(self, which), self.measured)


def resimulate_run(
    run: Mapping[str, Any],
    prompts: Sequence[Sequence[int]],
    domains: Sequence[str],
    *,
    name: str = "the run",
    rel_tol: float = 1e-9,
) -> list[ResimulatedLevel]:
    """Re-simulate every level of a stored run (a ``bench sim-validation`` JSON).

    Each level is simulated on its own stored cost table with the requests the load sent
    (``prompts``, ``domains``: ``validation_prompts`` with the run's ``--num-prompts``)
    and the run's traces: once with the run's settings, which must give back the stored
    throughput (else the inputs are not the run's, and this raises), and once with
    today's ``first_token`` and ``closed_admission`` defaults. Needs no server.
    """
    points = run.get("points") or []
    if not points or not all("cost_table" in p for p in points):
        raise ValueError(
            f"{name}: re-simulation needs each level's own cost table (the points' "
            "cost_table); runs that kept one table for all levels cannot be re-simulated"
        )
    traces = load_traces_many([str(local_path(t)) for t in run["traces"]])
    as_run = stored_settings(run)
    defaults = {f.name: f.default for f in fields(ValidationSettings)}
    today = replace(as_run, **{k: defaults[k] for k in OLD_TIMING})
    out: list[ResimulatedLevel] = []
    for p in points:
        c = int(p["concurrency"])
        table = SpsCostTable.from_json(json.dumps(p["cost_table"]))
        old = simulate_level(c, prompts, domains, traces, table, as_run)
        stored = float(p["predicted"]["throughput"])
        if abs(old.throughput / stored - 1.0) > rel_tol:
            raise ValueError(
                f"{name}: c={c} does not reproduce the stored prediction ({old.throughput:.4f} "
                f"vs {stored:.4f} tok/s): pass the run's --num-prompts, and check that its "
                "traces and the eval prompts are the ones it ran with"
            )
        new = simulate_level(c, prompts, domains, traces, table, today)
        out.append(ResimulatedLevel(c, LiveMeasurement(**p["measured"]), old, new))
    return out
