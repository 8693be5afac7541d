"""SGLang CPU engines in child processes, alive together, taking turns.

Why a process per engine: SGLang keeps its server arguments in process-wide globals, so
a second ``sglang.Engine`` in the same process changes the first one (a DSPARK_MOE engine
started beside a plain one makes the plain one's tokenizer look for speculative
counters it never receives, and fail). In its own process each engine is what
``cpu_engine`` starts, and a benchmark can time them in alternation (A B B A ...), so
the machine's drift over minutes hits every engine alike instead of whichever ran last.

An engine that waits for its turn must not take CPU from the one being timed: start
engines with SGLang's ``sleep_on_idle`` (the scheduler then sleeps on its sockets
instead of polling them); :func:`engine_processes` refuses several engines without it.

A call runs a module-level function ``fn(engine, *args)`` in the engine's process (it
is pickled by reference). An error there is raised here, as the same exception when it
pickles, with the child's traceback attached. Every process is stopped and reaped by PID.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import time
import traceback
from collections.abc import Callable, Iterator, Mapping, Sequence
from multiprocessing.connection import Connection
from typing import Any

import psutil

from dspark_sglang.sglang_integration.engine import CpuEngineSpec, cpu_engine

logger = logging.getLogger(__name__)

__all__ = ["EngineProcess", "engine_processes", "turns"]

#: Seconds a stopping engine process gets to shut SGLang down before it is killed.
STOP_TIMEOUT_S = 60.0


def _send_error(conn: Connection, exc: BaseException) -> None:
    tb = "".join(traceback.format_exception(exc))
    try:
        conn.send(("error", exc, tb))
    except Exception:  # an exception that does not pickle travels as text
        conn.send(("error", RuntimeError(f"{type(exc).__name__}: {exc}"), tb))


def _serve(spec: CpuEngineSpec, conn: Connection) -> None:
    """The child: start the engine, answer calls until told to stop (or the pipe closes)."""
    try:
        with cpu_engine(spec) as engine:
            conn.send(("ready", None))
            while True:
                try:
                    msg = conn.recv()
                except EOFError:  # the parent is gone
                    return
                if msg[0] == "stop":
                    break
                _, fn, args = msg
                try:
                    conn.send(("ok", fn(engine, *args)))
                except BaseException as exc:  # reported to the caller; the engine lives on
                    _send_error(conn, exc)
    except BaseException as exc:
        with contextlib.suppress(Exception):
            _send_error(conn, exc)


class EngineProcess:
    """One ``cpu_engine(spec)`` in a child process; :meth:`call` runs functions on it."""

    def __init__(self, label: str, spec: CpuEngineSpec) -> None:
        self.label = label
        self.spec = spec
        ctx = multiprocessing.get_context("spawn")
        self._conn, child = ctx.Pipe()
        # Not a daemon: the child starts SGLang's own processes.
        self._proc = ctx.Process(
            target=_serve, args=(spec, child), name=f"dspark-engine-{label}", daemon=False
        )
        self._child_conn = child
        self._started = False
        #: Seconds from spawning the process until its engine was ready (set by :meth:`start`).
        self.startup_s: float | None = None

    @property
    def pid(self) -> int | None:
        return self._proc.pid

    def _reply(self) -> tuple[str, Any]:
        while not self._conn.poll(1.0):
            if not self._proc.is_alive():
                if self._conn.poll(0):  # it answered on its way out
                    break
                raise RuntimeError(
                    f"the engine process for {self.label} (pid {self._proc.pid}) exited with "
                    f"code {self._proc.exitcode} without answering; its log is above"
                )
        try:
            msg = self._conn.recv()
        except EOFError as exc:
            raise RuntimeError(
                f"the engine process for {self.label} closed its pipe (exit code "
                f"{self._proc.exitcode})"
            ) from exc
        if msg[0] == "error":
            _, exc, tb = msg
            exc.add_note(f"raised in the engine process for {self.label}:\n{tb}")
            raise exc
        return msg

    def start(self) -> None:
        """Spawn the process and block until its engine has started; raise what the
        start-up raised."""
        launched_at = time.perf_counter()
        self._proc.start()
        self._child_conn.close()
        self._started = True
        kind, _ = self._reply()
        if kind != "ready":
            raise RuntimeError(f"the engine process for {self.label} sent {kind!r} at start-up")
        self.startup_s = time.perf_counter() - launched_at

    def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(engine, *args)`` in the engine's process; its result, or its exception."""
        self._conn.send(("call", fn, args))
        kind, result = self._reply()
        if kind != "ok":
            raise RuntimeError(f"the engine process for {self.label} answered {kind!r}")
        return result

    def close(self) -> None:
        """Stop the engine and its process; whatever is left after the timeout is killed."""
        if not self._started:
            return
        self._started = False
        try:
            parent = psutil.Process(self._proc.pid)
            family = [parent, *parent.children(recursive=True)]
        except psutil.Error:
            family = []
        with contextlib.suppress(OSError, ValueError):
            self._conn.send(("stop",))
        self._proc.join(STOP_TIMEOUT_S)
        alive = [p for p in family if p.is_running()]
        for p in alive:
            logger.warning("killing leftover engine process %s pid=%d", self.label, p.pid)
            with contextlib.suppress(psutil.Error):
                p.kill()
        psutil.wait_procs(alive, timeout=10)
        self._proc.join(1.0)
        self._conn.close()


@contextlib.contextmanager
def engine_processes(specs: Mapping[str, CpuEngineSpec]) -> Iterator[dict[str, EngineProcess]]:
    """Start one :class:`EngineProcess` per label, each after the previous one is ready;
    stop them all on exit.

    One after the other because SGLang sizes a CPU engine's KV pool from the free memory it
    measures while loading, which another engine's start-up would skew; each ``startup_s``
    is then the engine's own. With several engines every spec must set ``sleep_on_idle``
    (see the module docstring).
    """
    if len(specs) > 1:
        awake = [k for k, s in specs.items() if not s.server_kwargs().get("sleep_on_idle")]
        if awake:
            raise ValueError(
                f"engines {awake} lack sleep_on_idle=True in their overrides: an idle engine "
                "would poll its sockets and slow the engine being timed beside it"
            )
    procs = {label: EngineProcess(label, spec) for label, spec in specs.items()}
    try:
        for p in procs.values():
            p.start()
        yield procs
    finally:
        for p in procs.values():
            p.close()


def turns(labels: Sequence[str], rounds: int) -> list[str]:
    """Labels in timing order, ``rounds`` times: forward, backward, ... (A B, B A, A B).

    Over a pair of rounds a drift that is linear in time costs each engine the same.
    """
    out: list[str] = []
    for k in range(rounds):
        out += list(labels) if k % 2 == 0 else list(reversed(labels))
    return out
