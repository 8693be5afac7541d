"""Sim validation: the serving simulator's predictions against a live SGLang server.

Why: the planner sizes deployments from simulated throughput and per-user speed; a
simulator that is not checked against a real server could be confidently wrong.

Protocol (one server, static-``k`` policy so the verify budget is known; run by
``dspark-sglang bench sim-validation``):

1. Profile the server once: the decode step time at ``1 .. max(c)`` requests of the
   load's typical length and the prefill time of a few real prompts, into an SGLang
   ``SpsCostTable`` of this server.
2. For each concurrency ``c``: time the decode step at ``c`` requests again, seconds
   before the load (the machine's speed drifts over minutes), and put it in that level's
   table; run a closed loop of ``c`` clients over real eval prompts at temperature 1,
   EOS ignored; split the load's chunk gaps into its own quiet decode steps and what
   each arrival held the others up; optionally time the decode step again right after
   the load (``probes_after``).
3. Simulate the same requests on that level's table, replaying the drafter's recorded
   acceptance traces, and report ``predicted / measured - 1`` per figure. The load
   never feeds the table, so the prediction is out of sample.

A stored run keeps each level's table and its settings, so it can be re-simulated with
today's simulator, without a server (``resimulate_run``; ``bench sim-validation
--resimulate RUN.json``).

Modules, one concern each: ``client`` (the streaming HTTP client), ``load`` (the
closed-loop load generator, its summary and step breakdown, the server's step probes),
``compare`` (settings, the simulated level, the error, re-simulating a stored run),
``run`` (one run against a server, its JSON and plot).
"""

from __future__ import annotations

from dspark_sglang.bench.sim_validation.client import RequestTimeline, stream_generate
from dspark_sglang.bench.sim_validation.compare import (
    EVAL_SETS,
    OLD_TIMING,
    ResimulatedLevel,
    ValidationPoint,
    ValidationSettings,
    interleave_prompts,
    prediction_error,
    resimulate_run,
    simulate_level,
    stored_settings,
    validation_prompts,
)
from dspark_sglang.bench.sim_validation.load import (
    LiveMeasurement,
    LoadRun,
    LoadSteps,
    ServerProfile,
    closed_loop,
    decode_step_time,
    load_steps,
    pick_decode_prompts,
    pick_prefill_prompts,
    profile_server,
    summarise_load,
)
from dspark_sglang.bench.sim_validation.run import (
    plot_report,
    run_validation,
    server_spec,
    write_report,
)

__all__ = [
    "EVAL_SETS",
    "OLD_TIMING",
    "LiveMeasurement",
    "LoadRun",
    "LoadSteps",
    "RequestTimeline",
    "ResimulatedLevel",
    "ServerProfile",
    "ValidationPoint",
    "ValidationSettings",
    "closed_loop",
    "decode_step_time",
    "interleave_prompts",
    "load_steps",
    "pick_decode_prompts",
    "pick_prefill_prompts",
    "plot_report",
    "prediction_error",
    "profile_server",
    "resimulate_run",
    "run_validation",
    "server_spec",
    "simulate_level",
    "stored_settings",
    "stream_generate",
    "summarise_load",
    "validation_prompts",
    "write_report",
]
