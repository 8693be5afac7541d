"""Starting and stopping SGLang's real ``Engine`` on CPU, leak-free.

Why a helper: the CPU engine needs a fixed set of settings (see
``docs/sglang_integration.md``) that every caller (tests, demo, benchmarks)
would otherwise repeat, and an engine that dies half-way through start-up can
leave scheduler/detokenizer processes behind. :func:`cpu_engine` always calls
``Engine.shutdown()`` and then kills, by PID, any child process that is still
alive, so a test session never leaks processes.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import psutil

logger = logging.getLogger(__name__)

#: Server-argument defaults for SGLang's CPU engine (docs/sglang_integration.md,
#: "Running the engine on CPU").
CPU_ENGINE_DEFAULTS: Mapping[str, Any] = {
    "device": "cpu",
    "attention_backend": "intel_amx",
    "sampling_backend": "pytorch",
    "disable_cuda_graph": True,
    "dtype": "float32",
    "grammar_backend": "none",
    "skip_server_warmup": True,
    # On CPU this is a fraction of machine RAM for weights + KV pool. SGLang refuses
    # to start when free RAM fell by more than it while the weights loaded, and
    # another process allocating at that moment counts too (0.08 failed beside a
    # second engine starting). So a wide margin, and the KV pool capped instead:
    "mem_fraction_static": 0.25,
    # 32k tokens of KV (SmolLM2-135M in float32: 1.5 GB), enough for ~190 requests
    # of 160 tokens in flight; SGLang takes the smaller of this and what fits.
    "max_total_tokens": 32768,
    "log_level": "warning",
}


@dataclass(frozen=True)
class CpuEngineSpec:
    """What to start: a model plus overrides of :data:`CPU_ENGINE_DEFAULTS`."""

    model_path: str
    overrides: Mapping[str, Any] = field(default_factory=dict)
    env: Mapping[str, str] = field(default_factory=dict)
    #: OpenMP threads per scheduler process. 1 by default: on a shared 2-core
    #: machine, spinning OpenMP barriers make 2 threads ~8x slower than 1.
    omp_threads: int = 1

    def __post_init__(self) -> None:
        if not self.model_path:
            raise ValueError("CpuEngineSpec.model_path is empty; pass the HF model folder")
        if self.omp_threads < 1:
            raise ValueError(f"CpuEngineSpec.omp_threads must be >= 1, got {self.omp_threads}")
        bad = {"model_path", "device"} & set(self.overrides)
        if bad:
            raise ValueError(
                f"CpuEngineSpec.overrides may not set {sorted(bad)}: "
                "model_path is its own field and the device is always 'cpu'"
            )

    def server_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for ``sglang.Engine``."""
        return {**CPU_ENGINE_DEFAULTS, **dict(self.overrides), "model_path": self.model_path}


def _kill_leftovers(children: list[psutil.Process]) -> None:
    """Terminate, then kill, the given processes if they are still alive (by PID)."""
    alive = [p for p in children if p.is_running()]
    for p in alive:
        with contextlib.suppress(psutil.Error):
            p.terminate()
    _, still = psutil.wait_procs(alive, timeout=10)
    for p in still:
        logger.warning("killing leftover SGLang process pid=%d", p.pid)
        with contextlib.suppress(psutil.Error):
            p.kill()
    psutil.wait_procs(still, timeout=10)


def _resource_tracker_pids() -> set[int]:
    from multiprocessing import resource_tracker

    pid = getattr(resource_tracker._resource_tracker, "_pid", None)
    return {pid} if isinstance(pid, int) else set()


@contextlib.contextmanager
def managed_engine(kwargs: Mapping[str, Any], env: Mapping[str, str]) -> Iterator[Any]:
    """``sglang.Engine(**kwargs)`` that is always shut down and its processes reaped by PID.

    ``env`` is applied to ``os.environ`` for the engine's lifetime (the scheduler
    processes inherit it) and restored afterwards. Shared by the CPU engine and the
    GPU check, so neither can leak a scheduler process or an environment variable.
    """
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    me = psutil.Process()
    before = {p.pid for p in me.children(recursive=True)}
    engine = None
    try:
        import sglang

        engine = sglang.Engine(**kwargs)
        yield engine
    finally:
        # Python's multiprocessing resource tracker is started on first use and
        # serves this process until exit; killing it makes it complain at exit.
        keep = before | _resource_tracker_pids()
        spawned = [p for p in me.children(recursive=True) if p.pid not in keep]
        try:
            if engine is not None:
                engine.shutdown()
        finally:
            _kill_leftovers(spawned)
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v


@contextlib.contextmanager
def cpu_engine(spec: CpuEngineSpec) -> Iterator[Any]:
    """Start ``sglang.Engine`` on CPU (``managed_engine`` with the CPU defaults)."""
    env = {
        "SGLANG_USE_CPU_ENGINE": "1",
        "OMP_NUM_THREADS": str(spec.omp_threads),
        **dict(spec.env),
    }
    with managed_engine(spec.server_kwargs(), env) as engine:
        yield engine


def generate_outputs(
    engine: Any,
    prompts: list[list[int]],
    max_new_tokens: int,
    sampling: Mapping[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """SGLang's output dicts (``output_ids``, ``meta_info``...) for token-id prompts.

    Greedy and EOS-ignoring unless ``sampling`` says otherwise, so every request
    produces exactly ``max_new_tokens`` tokens (comparisons need equal lengths).
    """
    params = _sampling_params(max_new_tokens, sampling)
    return list(engine.generate(input_ids=prompts, sampling_params=params))


def _sampling_params(max_new_tokens: int, sampling: Mapping[str, Any] | None) -> dict[str, Any]:
    """Greedy, EOS ignored, ``max_new_tokens``; then ``sampling``'s overrides."""
    return {"temperature": 0.0, "max_new_tokens": max_new_tokens, "ignore_eos": True} | dict(
        sampling or {}
    )


def generate_in_batches(
    engine: Any,
    prompts: Sequence[Sequence[int]],
    max_new_tokens: int,
    width: int,
    sampling: Mapping[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """``generate_outputs`` in consecutive calls of ``width`` prompts, in prompt order.

    Each call is one batch that waits for its slowest request (what a fixed batch size
    measures); for a serving load use :func:`generate_in_flight`.
    """
    if width < 1:
        raise ValueError(f"width must be >= 1, got {width}")
    out: list[dict[str, Any]] = []
    for first in range(0, len(prompts), width):
        calls = [list(p) for p in prompts[first : first + width]]
        out += generate_outputs(engine, calls, max_new_tokens, sampling)
    return out


def generate_in_flight(
    engine: Any,
    prompts: Sequence[Sequence[int]],
    max_new_tokens: int,
    concurrency: int,
    sampling: Mapping[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """``generate_outputs`` for ``prompts`` with ``concurrency`` requests in flight at all times.

    A serving load, not a batch: a request is sent as soon as one of the ``concurrency``
    in flight finishes (SGLang's ``async_generate`` on the engine's own event loop), so
    requests that finish in fewer rounds free their slot for the next prompt instead of
    waiting for the slowest of a batch. Outputs come back in prompt order.
    """
    import asyncio

    if concurrency < 1:
        raise ValueError(f"concurrency must be >= 1, got {concurrency}")
    params = _sampling_params(max_new_tokens, sampling)

    async def run() -> list[dict[str, Any]]:
        slots = asyncio.Semaphore(concurrency)

        async def one(ids: Sequence[int]) -> dict[str, Any]:
            async with slots:
                return await engine.async_generate(input_ids=list(ids), sampling_params=params)

        return list(await asyncio.gather(*(one(p) for p in prompts)))

    return engine.loop.run_until_complete(run())


def timed_in_flight(
    engine: Any,
    prompts: Sequence[Sequence[int]],
    max_new_tokens: int,
    concurrency: int,
    sampling: Mapping[str, Any] | None = None,
) -> tuple[float, list[dict[str, Any]]]:
    """:func:`generate_in_flight` and its wall time: ``(seconds, outputs)``.

    Module-level so that an ``EngineProcess`` can run it in the engine's own process,
    where the timing leaves out the pipe to the caller.
    """
    start = time.perf_counter()
    out = generate_in_flight(engine, prompts, max_new_tokens, concurrency, sampling)
    return time.perf_counter() - start, out


def timed_in_batches(
    engine: Any,
    prompts: Sequence[Sequence[int]],
    max_new_tokens: int,
    width: int,
    sampling: Mapping[str, Any] | None = None,
) -> tuple[float, list[dict[str, Any]]]:
    """:func:`generate_in_batches` and its wall time: ``(seconds, outputs)``.

    Module-level for an ``EngineProcess``, like :func:`timed_in_flight`.
    """
    start = time.perf_counter()
    out = generate_in_batches(engine, prompts, max_new_tokens, width, sampling)
    return time.perf_counter() - start, out


def generate_ids(
    engine: Any,
    prompts: list[list[int]],
    max_new_tokens: int,
    sampling: Mapping[str, Any] | None = None,
) -> list[list[int]]:
    """Continuation token ids for each prompt (see :func:`generate_outputs`)."""
    return [
        list(o["output_ids"]) for o in generate_outputs(engine, prompts, max_new_tokens, sampling)
    ]
