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
accounts for (reported, never hidden).

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
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

ENV = "DSPARK_PROFILE_ROUNDS"
SNAPSHOT_VERSION = 1
ROUND = "round"
PLAIN_STEP = "plain_step"
PROPOSE = "propose"
VERIFY_MODEL_FORWARD = "verify_model_forward"


@dataclass(frozen=True)
class Phase:
    """One timed (or derived) part of a round."""

    name: str
    group: str
    label: str
    #: What is wrapped; empty for a derived row.
    wraps: str = ""


#: The round's phases in execution order. Every measured one is disjoint from the others;
#: ``draft_rest`` is ``propose`` minus the four draft phases, ``unattributed`` is the
#: round minus everything else. So the rows add up to the round by construction, and
#: ``unattributed`` says how much of it no wrapper saw.
PHASES: tuple[Phase, ...] = (
    Phase(
        "verify_window",
        "accept + KV bookkeeping",
        "verify window: KV slots and positions",
        "dspark_planner.alloc_verify_window (hook)",
    ),
    Phase(
        "draft_forward",
        "draft",
        "draft backbone forward",
        "proposer._run_forward",
    ),
    Phase(
        "draft_base_logits",
        "draft",
        "draft LM head (base logits)",
        "draft_model.compute_base_logits",
    ),
    Phase(
        "markov_loop",
        "draft",
        "Markov sequential loop",
        "dspark_draft.sample_draft_block (hook)",
    ),
    Phase(
        "confidence",
        "confidence + policy",
        "confidence head",
        "draft_model.compute_confidence",
    ),
    Phase(
        "draft_rest",
        "draft",
        "rest of propose (embedding, fault guard)",
    ),
    Phase(
        "verify_budget",
        "confidence + policy",
        "verify token budget",
        "verify_planner.resolve_verify_token_budget",
    ),
    Phase(
        "verify_layout",
        "confidence + policy",
        "policy decision + layout",
        "verify_planner.schedule_layout",
    ),
    Phase(
        "verify_forward",
        "target verify",
        "target verify forward",
        "verify_executor.run_non_compact / run_compact; a plain step's decode forward",
    ),
    Phase(
        "accept",
        "accept + KV bookkeeping",
        "accept",
        "verify_executor.accept_and_finalize",
    ),
    Phase(
        "commit_hidden",
        "accept + KV bookkeeping",
        "commit: target hidden -> draft KV",
        "verify_executor.commit_hidden; a plain step's commit",
    ),
    Phase(
        "observers",
        "accept + KV bookkeeping",
        "SGLang's step observers",
        "worker._observers.observe_verify_step",
    ),
    Phase(
        "dspark_metrics",
        "accept + KV bookkeeping",
        "DSPARK_MOE metrics",
        "worker._observe_round",
    ),
    Phase("unattributed", "unattributed", "unattributed remainder"),
)
DRAFT_PHASES = ("draft_forward", "draft_base_logits", "markov_loop", "confidence")
DERIVED = ("draft_rest", "unattributed")
MEASURED = tuple(p.name for p in PHASES if p.name not in DERIVED)
#: Everything a snapshot may hold, besides the verify forward per shape (below).
TIMERS = (ROUND, PLAIN_STEP, PROPOSE, VERIFY_MODEL_FORWARD, *MEASURED)
#: The target's verify forward is also timed per shape, as ``verify@<requests>x<tokens>``
#: (:func:`shape_timer`): what a cost table prices, measured on the batches it prices.
SHAPE_PREFIX = "verify@"


def shape_timer(num_reqs: int, tokens: int) -> str:
    """The timer name of a verify forward over ``tokens`` tokens of ``num_reqs`` requests."""
    if num_reqs < 1 or tokens < num_reqs:
        raise ValueError(f"a verify has >= 1 request and a token each, got {num_reqs}, {tokens}")
    return f"{SHAPE_PREFIX}{num_reqs}x{tokens}"


def verify_shapes(timers: Mapping[str, Mapping[str, float]]) -> list[dict[str, Any]]:
    """The per-shape verify timers of a snapshot or :func:`delta`, as rows.

    Each row: ``requests``, ``tokens``, ``calls`` and ``ms`` (mean per call), sorted by
    requests, then tokens.
    """
    rows = []
    for name, t in timers.items():
        if not name.startswith(SHAPE_PREFIX):
            continue
        n, b = (int(x) for x in name[len(SHAPE_PREFIX) :].split("x"))
        calls = int(t["calls"])
        rows.append(
            {"requests": n, "tokens": b, "calls": calls, "ms": 1e3 * float(t["seconds"]) / calls}
        )
    return sorted(rows, key=lambda r: (r["requests"], r["tokens"]))


def profile_path(env: Mapping[str, str] | None = None, *, tp_rank: int = 0) -> Path | None:
    """Where this process writes its snapshot, or ``None`` when profiling is off.

    Raises ``ValueError`` naming :data:`ENV` when the value cannot be a JSON file path.
    """
    env = os.environ if env is None else env
    raw = env.get(ENV, "").strip()
    if not raw:
        return None
    path = Path(raw)
    if path.suffix != ".json":
        raise ValueError(
            f"{ENV}={raw!r}: give the path of a .json file the scheduler process "
            "writes its phase timings to (unset it to turn profiling off)"
        )
    if path.exists() and path.is_dir():
        raise ValueError(f"{ENV}={raw!r} is a directory; give a .json file path")
    if tp_rank < 0:
        raise ValueError(f"tp_rank must be >= 0, got {tp_rank}")
    return path if tp_rank == 0 else path.with_suffix(f".rank{tp_rank}.json")


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


def read_snapshot(path: Path) -> dict[str, dict[str, float]]:
    """The timers of a snapshot file (``{}`` when no step has been timed yet)."""
    if not path.is_file():
        return {}
    data = json.loads(path.read_text(encoding="utf-8"))
    if data.get("version") != SNAPSHOT_VERSION:
        raise ValueError(
            f"{path}: snapshot version {data.get('version')!r}, expected {SNAPSHOT_VERSION}"
        )
    return data["timers"]


def delta(
    before: Mapping[str, Mapping[str, float]], after: Mapping[str, Mapping[str, float]]
) -> dict[str, dict[str, float]]:
    """``after - before`` per timer (timers that did not move are left out)."""
    out: dict[str, dict[str, float]] = {}
    for name, a in after.items():
        b = before.get(name, {"seconds": 0.0, "calls": 0})
        calls = int(a["calls"]) - int(b["calls"])
        seconds = float(a["seconds"]) - float(b["seconds"])
        if calls < 0 or seconds < -1e-9:
            raise ValueError(f"timer {name!r} went backwards: {dict(b)} -> {dict(a)}")
        if calls:
            out[name] = {"seconds": seconds, "calls": calls}
    return out


def summarize(spec: Mapping[str, Mapping[str, float]]) -> dict[str, Any]:
    """Per phase of a round: mean ms per round and share of the round time.

    ``spec`` is a :func:`delta` of a DSPARK_MOE engine. Every phase row is its total
    seconds over the number of rounds (a phase that ran in no round counts 0), so the
    rows, ``draft_rest`` and ``unattributed`` included, add up to the mean round.
    """
    rounds = int(spec.get(ROUND, {}).get("calls", 0))
    if rounds == 0:
        raise ValueError("no DSPARK_MOE decode round was timed; is the engine DSPARK_MOE?")
    sec = {name: float(spec.get(name, {}).get("seconds", 0.0)) for name in TIMERS}
    sec["draft_rest"] = sec[PROPOSE] - sum(sec[n] for n in DRAFT_PHASES)
    outside_propose = [n for n in MEASURED if n not in DRAFT_PHASES]
    sec["unattributed"] = sec[ROUND] - sec[PROPOSE] - sum(sec[n] for n in outside_propose)
    round_s = sec[ROUND]
    phases = [
        {
            "phase": p.name,
            "group": p.group,
            "label": p.label,
            "wraps": p.wraps,
            "ms_per_round": 1e3 * sec[p.name] / rounds,
            "share": sec[p.name] / round_s,
        }
        for p in PHASES
    ]
    return {
        "rounds": rounds,
        "round_ms": 1e3 * round_s / rounds,
        "phases": phases,
        "verify_model_forward_ms_per_round": 1e3 * sec[VERIFY_MODEL_FORWARD] / rounds,
    }


def plain_step_ms(plain: Mapping[str, Mapping[str, float]]) -> tuple[float, int]:
    """``(mean ms per decode step, steps)`` of a plain engine's :func:`delta`."""
    t = plain.get(PLAIN_STEP)
    if not t or not t["calls"]:
        raise ValueError("no plain decode step was timed; is the engine plain (no speculation)?")
    return 1e3 * float(t["seconds"]) / int(t["calls"]), int(t["calls"])


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
