"""Profiling aid: seconds per phase of a DSPARK_MOE decode round, and of a plain decode step.

``DSPARK_PROFILE_ROUNDS=<file.json>`` (unset: off, nothing is wrapped, zero cost) makes
every SGLang scheduler process of the engine time, with ``time.perf_counter``:

* ``round``: one DSPARK_MOE decode round, ``DSparkMoeWorker._forward_decode`` whole;
* its phases, each a bound method wrapped on the worker's own objects (instance
  attributes, as ``fallback.GuardedPropose`` does; SGLang's classes are untouched) or a
  module function wrapped by an AROUND hook of SGLang's ``HookRegistry``: see
  :data:`PHASES` (what each one wraps is its ``wraps``);
* ``plain_step``: one decode step of a plain engine, the scheduler's call of
  ``TpModelWorker.forward_batch_generation`` on a decode batch (AROUND hook); the same
  hook times the target's verify forward inside a round as ``verify_model_forward``
  (nested in ``verify_forward``, so it is not summed).

After every round and every plain step the process rewrites ``<file.json>`` (atomically,
outside the timed regions) with the running totals, :meth:`PhaseTimes.snapshot`; TP rank
``r > 0`` writes ``<file>.rank<r>.json``. A reader subtracts two snapshots
(:func:`delta`) to time one stretch of work, and :func:`summarize` turns that into mean
ms per round per phase, each phase's share of the round, and the remainder no phase
accounts for (reported, never hidden). Those names and the reader's side need no engine
and live in ``round_snapshot.py`` (re-exported here); this module is the in-process part:
the recorder, :func:`install` and :func:`instrument_worker`.

Why the timings are exact on CPU: execution there is synchronous, so a phase's wall time
is its compute. On a GPU these numbers would time kernel launches, not kernels.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from dspark_sglang.sglang_integration.round_snapshot import (
    DERIVED,
    DRAFT_PHASES,
    ENV,
    MEASURED,
    PHASES,
    PLAIN_STEP,
    PROPOSE,
    ROUND,
    SHAPE_PREFIX,
    SNAPSHOT_VERSION,
    TIMERS,
    VERIFY_MODEL_FORWARD,
    Phase,
    delta,
    plain_step_ms,
    profile_path,
    read_snapshot,
    shape_timer,
    summarize,
    verify_shapes,
)

__all__ = [
    "DERIVED",
    "DRAFT_PHASES",
    "ENV",
    "MEASURED",
    "PHASES",
    "PLAIN_STEP",
    "PROPOSE",
    "ROUND",
    "SHAPE_PREFIX",
    "SNAPSHOT_VERSION",
    "TARGET_FORWARD",
    "TIMERS",
    "VERIFY_MODEL_FORWARD",
    "Phase",
    "PhaseTimes",
    "delta",
    "install",
    "instrument_worker",
    "plain_step_ms",
    "profile_path",
    "profiler",
    "read_snapshot",
    "shape_timer",
    "summarize",
    "target_forward_hook",
    "verify_shapes",
]

logger = logging.getLogger(__name__)


class PhaseTimes:
    """Seconds and calls per timer name, written to a file as running totals.

    Invariant: ``snapshot()`` holds, per name, the sum of every recorded interval and
    their count since construction; nothing is ever reset, so two snapshots subtract.
    """

    def __init__(self, path: Path | None = None) -> None:
        self.path = path
        self.seconds: dict[str, float] = {}
        self.calls: dict[str, int] = {}

    def add(self, name: str, seconds: float) -> None:
        if name not in TIMERS and not name.startswith(SHAPE_PREFIX):
            raise KeyError(f"unknown timer {name!r}; known: {list(TIMERS)}")
        if seconds < 0:
            raise ValueError(f"timer {name!r}: negative interval {seconds}")
        self.seconds[name] = self.seconds.get(name, 0.0) + seconds
        self.calls[name] = self.calls.get(name, 0) + 1

    @contextlib.contextmanager
    def timing(self, name: str) -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.add(name, time.perf_counter() - t0)

    def wrap(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        """``fn`` timed as ``name`` (for an instance attribute in place of a bound method)."""

        @functools.wraps(fn)
        def timed(*args: Any, **kwargs: Any) -> Any:
            with self.timing(name):
                return fn(*args, **kwargs)

        timed.dspark_profiled = name  # type: ignore[attr-defined]
        return timed

    def snapshot(self) -> dict[str, Any]:
        return {
            "version": SNAPSHOT_VERSION,
            "pid": os.getpid(),
            "timers": {
                n: {"seconds": self.seconds[n], "calls": self.calls[n]}
                for n in sorted(self.seconds)
            },
        }

    def flush(self) -> None:
        """Write :meth:`snapshot` to ``path`` (a temp file renamed over it: readers never
        see half a file). A failed write is logged, never raised into the engine."""
        if self.path is None:
            return
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_text(json.dumps(self.snapshot()), encoding="utf-8")
            os.replace(tmp, self.path)
        except OSError as exc:
            logger.warning("%s: cannot write %s: %s", ENV, self.path, exc)


# ----------------------------------------------------------------- in the engine process

_PROFILER: PhaseTimes | None = None


def profiler() -> PhaseTimes | None:
    """This process's profiler, created on first use when :data:`ENV` is set; else None."""
    global _PROFILER
    if _PROFILER is None:
        path = profile_path(tp_rank=_tp_rank())
        if path is not None:
            _PROFILER = PhaseTimes(path)
            logger.warning("%s: timing decode phases into %s (profiling aid)", ENV, path)
    return _PROFILER


def _tp_rank() -> int:
    try:
        from sglang.srt.runtime_context import get_parallel

        return int(get_parallel().tp_rank)
    except Exception:  # outside an initialised engine (the parent process)
        return 0


_HOOKED_FUNCTIONS = {
    "sglang.srt.speculative.dspark_components.dspark_draft.sample_draft_block": "markov_loop",
    "sglang.srt.speculative.dspark_components.dspark_planner.alloc_verify_window": (
        "verify_window"
    ),
}
TARGET_FORWARD = "sglang.srt.managers.tp_worker.TpModelWorker.forward_batch_generation"


def _timed_hook(name: str) -> Callable[..., Any]:
    def hook(original: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        prof = profiler()
        if prof is None:
            return original(*args, **kwargs)
        with prof.timing(name):
            return original(*args, **kwargs)

    hook.__name__ = f"profile_{name}"
    return hook


def target_forward_hook(original: Callable[..., Any], worker: Any, *args: Any, **kw: Any) -> Any:
    """AROUND ``TpModelWorker.forward_batch_generation``: a plain decode step, or the
    target's verify forward inside a round; anything else (prefill) runs untimed."""
    prof = profiler()
    batch = args[0] if args else kw.get("batch")
    if prof is None:
        return original(worker, *args, **kw)
    if batch is not None and batch.forward_mode.is_decode():
        with prof.timing(PLAIN_STEP):
            out = original(worker, *args, **kw)
        prof.flush()
        return out
    if batch is None and kw.get("is_verify", False):
        fb = kw.get("forward_batch")
        t0 = time.perf_counter()
        try:
            return original(worker, *args, **kw)
        finally:
            seconds = time.perf_counter() - t0
            prof.add(VERIFY_MODEL_FORWARD, seconds)
            if fb is not None:  # shape from metadata: no device read
                prof.add(shape_timer(int(fb.batch_size), int(fb.input_ids.numel())), seconds)
    return original(worker, *args, **kw)


def install() -> bool:
    """Register the AROUND hooks when :data:`ENV` is set (plugin load, every process).

    Returns whether it registered. Unset: nothing is registered, SGLang runs unwrapped.
    """
    if profile_path() is None:
        return False
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    for target, name in _HOOKED_FUNCTIONS.items():
        HookRegistry.register(target, _timed_hook(name), HookType.AROUND)
    HookRegistry.register(TARGET_FORWARD, target_forward_hook, HookType.AROUND)
    return True


def instrument_worker(worker: Any) -> PhaseTimes | None:
    """Wrap the round's phases on a ``DSparkMoeWorker``'s own objects (see :data:`PHASES`).

    Returns the profiler, or ``None`` (nothing wrapped) when :data:`ENV` is unset. Call
    after every other wrapper (``GuardedPropose``) so ``propose`` times all of it.
    """
    prof = profiler()
    if prof is None or getattr(worker, "_proposer", None) is None:
        return None  # off, or a pipeline stage without the draft (it runs no round)
    proposer = worker._proposer
    model = proposer.draft_model
    planner = worker._verify_planner
    executor = worker._verify_executor
    targets = (
        (proposer, "propose", PROPOSE),
        (proposer, "_run_forward", "draft_forward"),
        (model, "compute_base_logits", "draft_base_logits"),
        (model, "compute_confidence", "confidence"),
        (planner, "resolve_verify_token_budget", "verify_budget"),
        (planner, "schedule_layout", "verify_layout"),
        (executor, "run_non_compact", "verify_forward"),
        (executor, "run_compact", "verify_forward"),
        (executor, "accept_and_finalize", "accept"),
        (executor, "commit_hidden", "commit_hidden"),
        (worker._observers, "observe_verify_step", "observers"),
        (worker, "_observe_round", "dspark_metrics"),
    )
    plain = vars(worker).get("_dspark_plain_decode")  # a plain step's two phases
    if plain is not None:
        targets += ((plain, "forward", "verify_forward"), (plain, "commit", "commit_hidden"))
    for obj, attr, name in targets:
        # object.__setattr__: an nn.Module's own __setattr__ would do the same for a
        # function, but this states that only this instance changes.
        object.__setattr__(obj, attr, prof.wrap(name, getattr(obj, attr)))
    round_fn = worker._forward_decode

    @functools.wraps(round_fn)
    def timed_round(*args: Any, **kwargs: Any) -> Any:
        with prof.timing(ROUND):
            out = round_fn(*args, **kwargs)
        prof.flush()
        return out

    object.__setattr__(worker, "_forward_decode", timed_round)
    return prof
