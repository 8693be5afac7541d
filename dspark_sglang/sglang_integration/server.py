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
import random
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

# Ports handed to a server that binds them later. Below the kernel's ephemeral
# range (32768+ by default), where gloo's pair listeners and outgoing connections
# of the server's own children take their ports, and below SGLang's own pick for
# its torch.distributed port (22000-29999), so neither can take ours in between.
PORT_RANGE = (15000, 21999)
EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")


def _ephemeral_low() -> int:
    try:
        return int(EPHEMERAL_RANGE_FILE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port(host: str = "127.0.0.1", attempts: int = 64) -> int:
    """A TCP port free right now on ``host``, for a process that binds it later.

    Taken from :data:`PORT_RANGE`, never from the ephemeral range: a port the OS
    hands out for ``bind(0)`` can be handed out again, before the server binds
    it, to one of the server's own children (a gloo listener of a TP rank), and
    the server then fails to start with "address already in use".
    """
    ephemeral_low = _ephemeral_low()
    low, high = PORT_RANGE[0], min(PORT_RANGE[1], ephemeral_low - 1)
    if high - low + 1 < attempts:
        raise RuntimeError(
            f"the kernel's ephemeral port range starts at {ephemeral_low} "
            f"({EPHEMERAL_RANGE_FILE}); free_port needs {low}-{PORT_RANGE[1]} below it: "
            "raise net.ipv4.ip_local_port_range's lower bound"
        )
    for port in random.sample(range(low, high + 1), attempts):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free TCP port on {host} in {low}-{high} after {attempts} tries")


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
            text = log.read_text(errors="replace")
            hint = (
                f"\nits port was taken before it could bind ({base_url}): pick another port"
                if "address already in use" in text.lower()
                else ""
            )
            raise RuntimeError(
                f"SGLang server exited with {proc.returncode} during start:{hint}\n{text[-4000:]}"
            )
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
