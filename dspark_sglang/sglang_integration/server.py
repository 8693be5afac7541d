"""Starting and stopping SGLang's HTTP server (``sglang.launch_server``) on CPU, by PID.

Why a helper: the server is how users run the product, and tests/demos need it
on 127.0.0.1 with a free port, the same CPU settings as :mod:`engine`
(``CpuEngineSpec`` is reused so both paths cannot drift), a readiness wait,
and a shutdown that reaps every process it spawned (scheduler, detokenizer)
by PID even when the server hangs.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from dspark_sglang.sglang_integration.engine import CpuEngineSpec, _kill_leftovers


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free right now on ``host`` (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def server_cli_args(spec: CpuEngineSpec, host: str, port: int) -> list[str]:
    """``launch_server`` flags for ``spec``.

    ``True`` becomes a bare flag; ``False`` and ``None`` are omitted (defaults).
    """
    args = ["--host", host, "--port", str(port)]
    for key, value in spec.server_kwargs().items():
        if value is None or value is False:
            continue
        flag = "--" + key.replace("_", "-")
        args += [flag] if value is True else [flag, str(value)]
    return args


@dataclass(frozen=True)
class RunningServer:
    """A started server: where to reach it and the PID that owns it."""

    base_url: str
    pid: int
    log_path: Path


def _wait_ready(
    base_url: str, proc: subprocess.Popen[bytes], timeout: float, log: Path, path: str
) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = log.read_text(errors="replace")[-4000:]
            raise RuntimeError(f"SGLang server exited with {proc.returncode} during start:\n{tail}")
        try:
            with urllib.request.urlopen(base_url + path, timeout=5) as r:
                if r.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(1.0)
    raise TimeoutError(f"SGLang server at {base_url} not ready after {timeout:.0f} s (log: {log})")


@contextlib.contextmanager
def server_process(
    cmd: list[str],
    env: dict[str, str],
    base_url: str,
    log_path: Path,
    ready_timeout: float = 600.0,
    ready_path: str = "/v1/models",
) -> Iterator[RunningServer]:
    """Start a server command, wait until ``ready_path`` answers 200, stop it by PID.

    Every process the server spawned (scheduler, detokenizer, TP ranks) is
    terminated, then killed, by PID when the block exits, even when it hangs.
    """
    with log_path.open("wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    root = psutil.Process(proc.pid)
    children: list[psutil.Process] = []
    try:
        _wait_ready(base_url, proc, ready_timeout, log_path, ready_path)
        yield RunningServer(base_url=base_url, pid=proc.pid, log_path=log_path)
    finally:
        with contextlib.suppress(psutil.Error):
            children = root.children(recursive=True)
        _kill_leftovers([root, *children])
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=10)


@contextlib.contextmanager
def cpu_server(
    spec: CpuEngineSpec,
    log_path: Path,
    host: str = "127.0.0.1",
    port: int | None = None,
    ready_timeout: float = 600.0,
) -> Iterator[RunningServer]:
    """Run ``python -m sglang.launch_server`` for ``spec``; stop it and its children by PID."""
    port = free_port(host) if port is None else port
    env = {
        **os.environ,
        "SGLANG_USE_CPU_ENGINE": "1",
        "OMP_NUM_THREADS": str(spec.omp_threads),
        **dict(spec.env),
    }
    cmd = [sys.executable, "-m", "sglang.launch_server", *server_cli_args(spec, host, port)]
    with server_process(cmd, env, f"http://{host}:{port}", log_path, ready_timeout) as running:
        yield running


def post_json(url: str, body: dict[str, Any], timeout: float = 600.0) -> dict[str, Any]:
    """POST a JSON body, return the JSON answer (stdlib only)."""
    import json

    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return dict(json.loads(r.read()))
