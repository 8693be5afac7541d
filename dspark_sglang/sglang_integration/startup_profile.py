"""A small SPS table of the target, measured when the DSPARK_MOE worker starts.

Why: without a cost table SGLang's planner sees a flat table and verifies every
draft, and our ``prefix`` / ``lagged`` policies cannot rank drafts at all. When
a tier names no ``cost_table_path`` (``SchedulerConfig.profiles_at_startup``),
the worker times a few target forwards before serving and schedules with the
resulting cost table. Production tables still come from the fleet
profiler (``dspark_sglang/profiling``, many more probes, refinement around
cliffs, the real decode CUDA graphs); this one only keeps a tier from running
blind.

Algorithm: ``C`` is the engine's verify cap, the tier's ``max_verify_tokens``
or the request pool size times ``block_size + 1``. Probe batch sizes ``b``
(total verify tokens) are the powers of two below ``P = min(C,
MAX_PROBE_TOKENS)`` plus ``P`` (:func:`probe_points`). Each probe runs the fleet
profiler's measurement core (``profiling.measure.measure_staircase``: shuffled
order, warm-up, median of the timed steps) on a :class:`StepBackend`, and the
step times are made non-decreasing in tokens (:func:`non_increasing`). When
``C > P`` one more point at ``C`` is extrapolated, not measured: step time
grows linearly with the slope of the last two probes (:func:`extrapolate`),
so large batches are not priced at the last probe's rate.

Which of SGLang's two table formats: where the target replays ragged verify CUDA
graphs, a forward costs what its captured bucket costs, a staircase:
``cost_table.from_probes`` (``SpsCostTable``, floor lookup) with ``max_batch_tokens
= C``. Without them (a CPU engine, ``--disable-cuda-graph``) a forward costs what its
rows cost, and a floor lookup would price the token that reaches a probe with the
whole step from the probe below (at one request and probes 4 and 8: the seventh draft
pays everything 4 -> 8 tokens costs, the fourth to sixth nothing), so ``prefix`` would
stop before that token for no reason; there the table is ``cost_table.
additive_from_probes`` (``SpsAdditiveCostTable``, step time linear between probes),
over which a CPU worker later prices rounds from the decode rounds it timed
(``round_costs.RoundCosts``). Either passes the same validation as a loaded table and
encodes byte-compatibly with SGLang's.

What one probe step is (:func:`runner_step_factory`): a forward of the target's
own SGLang ``ModelRunner`` over ``ceil(b / (B+1))`` synthetic requests of ``B +
1`` tokens each (ragged, ``profiling.backend.verify_widths``), built the way
SGLang's one-batch benchmark builds an extend batch, followed by clearing the
request and KV pools (as that benchmark does between runs). Limitations,
stated: it is an extend-shaped forward without a cached prefix (verify attends
to a prefix; the GEMMs, which dominate, are the same ``b`` rows), decode CUDA
graphs are not replayed, and the step time includes building the batch on the
host. Clearing the pools is safe only because it runs before any request is
admitted (nothing else holds a slot); checked on the CPU engine, not on a GPU.

Clock: on CPU with one torch thread (SGLang's CPU engine default here) the
calling thread's CPU time (``time.thread_time``), as the fleet profiler's
``thread_cpu`` clock: on a shared machine wall time would measure the
neighbours; otherwise ``time.perf_counter`` (the step synchronises the device).

TP: every rank runs the same probes (the forward has collectives); rank 0's
table is broadcast so every rank schedules with the same table.
"""

from __future__ import annotations

import hashlib
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from dspark_sglang.profiling.backend import BackendInfo, Step, verify_widths
from dspark_sglang.profiling.measure import GridSpec, MeasureConfig, measure_staircase
from dspark_sglang.scheduling.config import SchedulerConfig
from dspark_sglang.scheduling.cost_table import (
    CostTable,
    SpsAdditiveCostTable,
    additive_from_probes,
    from_probes,
    parse_cost_table,
)

logger = logging.getLogger(__name__)

#: Where to write the measured table (SGLang's SPS JSON). Unset: next to the
#: decision log (``<log stem>.startup_cost_table.json``) when one is set, else not written.
TABLE_PATH_ENV = "DSPARK_STARTUP_COST_TABLE"
#: Measurement effort: a start-up profile must take seconds, not minutes. Two
#: shuffled rounds of 5 timed steps per probe: with one round of 3 the first
#: probes (1, 2, 4 tokens), whose ratio decides whether a first draft is worth
#: verifying, moved by 15-25 % between start-ups of one engine on a shared CPU.
STARTUP_MEASURE = MeasureConfig(warmup=1, repeats=5, rounds=2, seed=0)
#: Largest probe actually run; beyond it the table is extrapolated (module doc).
MAX_PROBE_TOKENS = 256

MakeStep = Callable[[int], Step]


def probe_points(cap: int) -> tuple[int, ...]:
    """``1, 2, 4, ...`` below ``cap``, then ``cap``: strictly increasing, ending at ``cap``."""
    if isinstance(cap, bool) or not isinstance(cap, int) or cap < 1:
        raise ValueError(f"the verify cap must be an integer >= 1, got {cap!r}")
    pts = []
    b = 1
    while b < cap:
        pts.append(b)
        b *= 2
    return (*pts, cap)


def verify_cap(cfg: SchedulerConfig, max_requests: int) -> int:
    """Most verify tokens one step can hold: the tier's cap, else requests x (block + anchor)."""
    if max_requests < 1:
        raise ValueError(f"max_requests must be >= 1, got {max_requests}")
    full = max_requests * cfg.num_draft_tokens
    return full if cfg.max_verify_tokens is None else min(full, cfg.max_verify_tokens)


class StepBackend:
    """The fleet profiler's ``Backend`` over any ``make_step(b) -> step`` and clock."""

    def __init__(self, make_step: MakeStep, max_batch_tokens: int, clock: Callable[[], float]):
        self._make_step = make_step
        self._max = max_batch_tokens
        self._clock = clock
        self._info = BackendInfo(
            kind="startup", model="target", dtype="", tp_size=1, device="", settings={}
        )

    @property
    def info(self) -> BackendInfo:
        return self._info

    @property
    def max_batch_tokens(self) -> int:
        return self._max

    def prepare(self, batch_tokens: int) -> Step:
        return self._make_step(batch_tokens)

    def now(self) -> float:
        return self._clock()

    def release(self) -> None:
        pass


def extrapolate(probes: list[tuple[int, float]], cap: int) -> tuple[int, float]:
    """``(cap, steps/s)`` with step time linear in tokens past the last probe.

    Slope: of the last two probes' step times, floored at 0 (a noisy decrease
    must not make a larger batch faster); one probe gives slope 0.
    """
    b1, s1 = probes[-1]
    if cap <= b1:
        raise ValueError(f"extrapolate to {cap}: not beyond the last probe {b1}")
    slope = 0.0
    if len(probes) >= 2:
        b0, s0 = probes[-2]
        slope = max(0.0, (1.0 / s1 - 1.0 / s0) / (b1 - b0))
    return cap, 1.0 / (1.0 / s1 + slope * (cap - b1))


def non_increasing(probes: list[tuple[int, float]]) -> list[tuple[int, float]]:
    """The probes with step time made non-decreasing in tokens (pool adjacent violators).

    A forward over more tokens does the same work plus more, so it is never faster;
    a probe measured faster than a smaller one is noise, and left in the table it
    would make a policy stop before, or jump past, that size for no reason. Adjacent
    probes that violate the order are replaced by the mean of their step times,
    weighted by count (the least-squares non-decreasing fit); ordered probes are
    returned unchanged. ``probes`` must be sorted by tokens.
    """
    blocks: list[list[float]] = []  # [summed step seconds, count]
    for _, sps in probes:
        blocks.append([1.0 / sps, 1.0])
        while len(blocks) > 1 and blocks[-2][0] / blocks[-2][1] > blocks[-1][0] / blocks[-1][1]:
            total, count = blocks.pop()
            blocks[-1][0] += total
            blocks[-1][1] += count
    seconds = [total / count for total, count in blocks for _ in range(int(count))]
    return [(b, 1.0 / t) for (b, _), t in zip(probes, seconds, strict=True)]


def build_table(
    make_step: MakeStep,
    cap: int,
    *,
    clock: Callable[[], float] = time.perf_counter,
    measure: MeasureConfig = STARTUP_MEASURE,
    max_probe: int = MAX_PROBE_TOKENS,
    linear: bool = False,
) -> CostTable:
    """Time ``make_step(b)()`` at :func:`probe_points`; the table up to ``cap``.

    A staircase (``SpsCostTable``, ``max_batch_tokens = cap``), or with ``linear`` an
    additive table linear between the probes (module doc: engines without graphs).
    """
    top = min(probe_points(cap)[-1], max_probe)
    grid = GridSpec(max_tokens=top, points=probe_points(top), refine=False)
    probes = measure_staircase(StepBackend(make_step, top, clock), grid, measure)
    pairs = non_increasing([(p.batch_tokens, p.steps_per_sec) for p in probes])
    if cap > top:
        pairs.append(extrapolate(pairs, cap))
    return additive_from_probes(pairs) if linear else from_probes(pairs, cap)


def runner_step_factory(model_runner: Any, width: int, seed: int = 0) -> MakeStep:
    """Probe steps over SGLang's ``ModelRunner`` (see the module doc for the shape)."""
    from sglang.benchmark import one_batch

    vocab = int(model_runner.model_config.vocab_size)
    rng = np.random.default_rng(seed)

    def make_step(batch_tokens: int) -> Step:
        widths = verify_widths(batch_tokens, width)
        ids = [rng.integers(0, vocab, w).tolist() for w in widths]

        def step() -> None:
            reqs = one_batch.prepare_synthetic_inputs_for_latency_test(len(ids), 0, ids)
            try:
                one_batch.extend(reqs, model_runner)
                one_batch.synchronize(model_runner.device)
            finally:
                model_runner.req_to_token_pool.clear()
                model_runner.token_to_kv_pool_allocator.clear()

        return step

    return make_step


def requested(env: dict[str, str] | None = None) -> SchedulerConfig | None:
    """The ``DSPARK_SCHEDULER_CONFIG`` config if it profiles at start-up, else ``None``."""
    from dspark_sglang.sglang_integration.launch import CONFIG_ENV

    env = dict(os.environ) if env is None else env
    path = env.get(CONFIG_ENV)
    if not path:
        return None
    cfg = SchedulerConfig.load(path)
    return cfg if cfg.profiles_at_startup else None


def clock_for(device: str) -> Callable[[], float]:
    """``time.thread_time`` on CPU with one torch thread, else ``time.perf_counter``."""
    if device.startswith("cpu") and torch.get_num_threads() == 1:
        return time.thread_time
    return time.perf_counter


def table_path(env: dict[str, str]) -> Path | None:
    """Where the table is written: :data:`TABLE_PATH_ENV`, else beside the decision log."""
    from dspark_sglang.sglang_integration.launch import DECISION_LOG_ENV

    if env.get(TABLE_PATH_ENV):
        return Path(env[TABLE_PATH_ENV])
    log = env.get(DECISION_LOG_ENV)
    if log:
        p = Path(log)
        return p.with_name(f"{p.stem}.startup_cost_table.json")
    return None


def summary(table: CostTable, seconds: float) -> str:
    """One log line: probes, rates and the table's digest."""
    if isinstance(table, SpsAdditiveCostTable):
        pairs = ", ".join(
            f"{b}:{1.0 / (table.bias_seconds + t):.3g}"
            for b, t in zip(table.m_probes, table.theta_seconds, strict=True)
        )
        shape = "linear between probes"
    else:
        pairs = ", ".join(
            f"{b}:{s:.3g}"
            for b, s in zip(table.sample_batch_tokens, table.sample_steps_per_sec, strict=True)
        )
        shape = f"staircase, max_batch_tokens={table.max_batch_tokens}"
    return (
        f"startup SPS table in {seconds:.1f}s, {shape}, tokens:steps/s {pairs} "
        f"(sha256 {digest(table)})"
    )


def digest(table: CostTable) -> str:
    """First 12 hex digits of the SHA-256 of the table's JSON (as a file's would be)."""
    return hashlib.sha256(table.to_json().encode("utf-8")).hexdigest()[:12]


def profile_target(
    cfg: SchedulerConfig,
    target_worker: Any,
    *,
    tp_rank: int = 0,
    env: dict[str, str] | None = None,
) -> CostTable:
    """Measure, share across TP ranks, log and write the start-up table for ``cfg``."""
    from dspark_sglang.sglang_integration.verify_tier import replays_verify_graphs

    env = dict(os.environ) if env is None else env
    runner = target_worker.model_runner
    cap = verify_cap(cfg, int(runner.req_to_token_pool.size))
    t0 = time.perf_counter()
    with torch.no_grad():
        make_step = runner_step_factory(runner, cfg.num_draft_tokens)
        table = build_table(
            make_step,
            cap,
            clock=clock_for(str(runner.device)),
            linear=not replays_verify_graphs(runner),
        )
    seconds = time.perf_counter() - t0
    table = _share_rank0(table)
    if tp_rank == 0:
        logger.info("DSPARK_MOE: %s", summary(table, seconds))
        out = table_path(env)
        if out is not None:
            table.save(out)
            logger.info("DSPARK_MOE: startup SPS table written to %s", out)
    return table


def _share_rank0(table: CostTable) -> CostTable:
    from sglang.srt.distributed.parallel_state import get_tp_group

    group = get_tp_group()
    if group.world_size <= 1:
        return table
    shared = group.broadcast_object(table.to_json(), src=0)
    return parse_cost_table(shared, source="rank 0's start-up cost table")
