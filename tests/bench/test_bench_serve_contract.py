"""The serve-contract load generator's client loop (``bench/serve_contract.py``), no server."""

from __future__ import annotations

import socket

from dspark_sglang.bench.serve_contract import LoadSpec, run_load


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_every_client_sends_a_request_even_when_its_deadline_has_passed() -> None:
    """A run shorter than a thread's start-up still sends one request per client.

    Nothing listens on the port, so every request fails fast and is recorded with its
    error; what is checked is that each client sent one before looking at the deadline.
    """
    spec = LoadSpec(clients=3, duration_s=1e-9, timeout_s=5.0)
    outcomes = run_load(f"http://127.0.0.1:{_closed_port()}", [[1, 2, 3]], ["hi"], spec)
    assert sorted({o.client for o in outcomes}) == [0, 1, 2]
    assert all(o.error for o in outcomes)
