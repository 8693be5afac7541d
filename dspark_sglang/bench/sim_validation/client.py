"""The streaming HTTP client of sim validation: one ``/generate`` request, timed chunk by chunk.

Why its own module: every live figure (step time, throughput, per-user speed, time to
first token) is read off when each streamed chunk arrived, so the client records that
and nothing else. It ignores EOS, so every request emits exactly the output length the
simulator is given. Standard library only: the load generator's threads each hold one
plain HTTP connection.
"""

from __future__ import annotations

import http.client
import json
import time
import urllib.parse
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["RequestTimeline", "stream_generate"]


@dataclass(frozen=True)
class RequestTimeline:
    """One streamed request: when it was sent and when each chunk arrived.

    ``tokens[i]`` is the cumulative number of output tokens after chunk ``i``
    (SGLang's ``meta_info.completion_tokens``); ``times`` are ``time.perf_counter``
    seconds. ``verify_ct`` is SGLang's count of speculative rounds (None without
    speculation).
    """

    submit: float
    times: tuple[float, ...]
    tokens: tuple[int, ...]
    verify_ct: int | None = None

    def __post_init__(self) -> None:
        if not self.times or len(self.times) != len(self.tokens):
            raise ValueError(
                "RequestTimeline needs one cumulative token count per chunk time, and at "
                f"least one chunk; got {len(self.times)} times, {len(self.tokens)} counts"
            )
        if any(b < a for a, b in zip(self.tokens, self.tokens[1:], strict=False)):
            raise ValueError("RequestTimeline.tokens must be cumulative (non-decreasing)")

    @property
    def first(self) -> float:
        return self.times[0]

    @property
    def finish(self) -> float:
        return self.times[-1]

    @property
    def output_tokens(self) -> int:
        return self.tokens[-1]

    def emitted_between(self, t0: float, t1: float) -> int:
        """Output tokens whose chunk arrived in ``(t0, t1]``."""
        prev = 0
        n = 0
        for t, c in zip(self.times, self.tokens, strict=True):
            if t0 < t <= t1:
                n += c - prev
            prev = c
        return n


def stream_generate(
    base_url: str,
    input_ids: Sequence[int],
    max_new_tokens: int,
    *,
    temperature: float = 1.0,
    seed: int | None = None,
    timeout: float = 600.0,
) -> RequestTimeline:
    """One streaming ``/generate`` call that ignores EOS, timed chunk by chunk."""
    url = urllib.parse.urlsplit(base_url)
    sampling: dict[str, Any] = {
        "max_new_tokens": int(max_new_tokens),
        "ignore_eos": True,
        "temperature": float(temperature),
    }
    if seed is not None:
        sampling["sampling_seed"] = int(seed)
    body = json.dumps(
        {"input_ids": [int(t) for t in input_ids], "sampling_params": sampling, "stream": True}
    )
    conn = http.client.HTTPConnection(url.hostname or "127.0.0.1", url.port, timeout=timeout)
    times: list[float] = []
    tokens: list[int] = []
    verify_ct: int | None = None
    try:
        submit = time.perf_counter()
        conn.request("POST", "/generate", body=body, headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        if resp.status != 200:
            raise RuntimeError(f"/generate answered {resp.status}: {resp.read()[:500]!r}")
        while True:
            line = resp.readline()
            if not line:
                break
            line = line.strip()
            if not line.startswith(b"data:"):
                continue
            payload = line[5:].strip()
            if payload == b"[DONE]":
                break
            now = time.perf_counter()
            meta = json.loads(payload).get("meta_info", {})
            count = int(meta.get("completion_tokens", 0))
            if tokens and count == tokens[-1]:
                continue  # a chunk without new tokens (e.g. the final usage-only one)
            times.append(now)
            tokens.append(count)
            if meta.get("spec_verify_ct") is not None:
                verify_ct = int(meta["spec_verify_ct"])
    finally:
        conn.close()
    return RequestTimeline(
        submit=submit, times=tuple(times), tokens=tuple(tokens), verify_ct=verify_ct
    )
