"""``free_port``: ports for servers that bind later stay out of the ephemeral range."""

from __future__ import annotations

import socket

import pytest

from dspark_sglang.sglang_integration import server
from dspark_sglang.sglang_integration.server import PORT_RANGE, free_port


def test_ports_are_below_the_ephemeral_range_and_bindable() -> None:
    ports = {free_port() for _ in range(20)}
    low = server._ephemeral_low()
    for port in ports:
        assert PORT_RANGE[0] <= port <= PORT_RANGE[1] < low
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", port))
    assert len(ports) > 1  # drawn at random, so parallel launches do not all race for one


def test_a_taken_port_is_never_returned(monkeypatch: pytest.MonkeyPatch) -> None:
    taken = PORT_RANGE[0] + 1  # two candidates: this one, held below, and the one before it
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as held:
        held.bind(("127.0.0.1", taken))
        held.listen(1)
        monkeypatch.setattr(server, "PORT_RANGE", (taken - 1, taken))
        assert {free_port(attempts=2) for _ in range(10)} == {taken - 1}


def test_an_ephemeral_range_that_leaves_no_room_is_named(
    monkeypatch: pytest.MonkeyPatch, tmp_path
) -> None:
    fake = tmp_path / "ip_local_port_range"
    fake.write_text("15030\t60999\n")
    monkeypatch.setattr(server, "EPHEMERAL_RANGE_FILE", fake)
    with pytest.raises(RuntimeError, match="ip_local_port_range"):
        free_port()
