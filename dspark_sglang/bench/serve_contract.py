"""A served tier under mixed load, client disconnects and malformed requests.

:func:`run_load` keeps ``clients`` threads busy against one server for a bounded
time. Each request draws (from one seeded generator per client) whether it is
greedy or sampled at temperature 1, streamed or not and its ``max_tokens``; one in
ten streamed requests (staggered across clients, so the first ones of clients 0,
10, 20, ... among them) hangs up after the first chunks:

* greedy requests go to ``/v1/completions`` with a token-id prompt and
  ``ignore_eos``, so their text can be compared with a reference continuation;
* sampled requests go to ``/v1/chat/completions``.

Every outcome is recorded (:class:`Outcome`); :func:`summarise` counts what was
sent, completed, cancelled by its client and errored, with latency percentiles.
:func:`malformed_requests` sends requests a server must answer with a 4xx and a
message (bad JSON, negative ``max_tokens``, ``temperature < 0``, ``top_p > 1``,
an over-long prompt, a token id outside the vocabulary).
"""

from __future__ import annotations

import http.client
import json
import random
import threading
import time
import urllib.parse
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

__all__ = [
    "CHAT_PROMPTS",
    "COMPLETION_PROMPTS",
    "LoadSpec",
    "Outcome",
    "malformed_requests",
    "metric_total",
    "run_load",
    "summarise",
]

#: Raw-text prompts of the greedy requests (tokenized by the caller, sent as token ids).
COMPLETION_PROMPTS: tuple[str, ...] = (
    "The capital of France is",
    "def fibonacci(n):",
    "Q: What is 17 times 23? A:",
    "Once upon a time, in a small village at the edge of a dark forest, there lived",
    "List three primary colors:",
    "import numpy as np\nx = np.arange(10)\n",
)
#: User turns of the sampled chat requests.
CHAT_PROMPTS: tuple[str, ...] = (
    "Write a haiku about the sea.",
    "Explain photosynthesis briefly.",
    "Name two planets.",
)


@dataclass(frozen=True)
class LoadSpec:
    """How the load is drawn; every fraction is a probability per request."""

    clients: int = 32
    duration_s: float = 60.0
    greedy_fraction: float = 0.5
    stream_fraction: float = 0.5
    #: Share of streamed requests whose client hangs up after ``disconnect_after``
    #: chunks (every ``1/fraction``-th one of a client, staggered across clients).
    disconnect_fraction: float = 0.1
    disconnect_after: int = 2
    min_tokens: int = 4
    max_tokens: int = 48
    seed: int = 0
    timeout_s: float = 600.0

    def __post_init__(self) -> None:
        if self.clients < 1 or self.duration_s <= 0:
            raise ValueError("LoadSpec needs clients >= 1 and duration_s > 0")
        for name in ("greedy_fraction", "stream_fraction", "disconnect_fraction"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"LoadSpec.{name} must be in [0, 1], got {getattr(self, name)}")
        if not 1 <= self.min_tokens <= self.max_tokens:
            raise ValueError("LoadSpec needs 1 <= min_tokens <= max_tokens")


@dataclass
class Outcome:
    """One request as its client saw it."""

    client: int
    greedy: bool
    stream: bool
    disconnect: bool
    max_tokens: int
    prompt_index: int
    status: int = 0
    text: str = ""
    finished: bool = False  # the server finished it (not cancelled by its client)
    error: str = ""
    latency_s: float = float("nan")


class _Client:
    def __init__(self, base_url: str, headers: Mapping[str, str], timeout: float) -> None:
        u = urllib.parse.urlparse(base_url)
        self.host, self.port = u.hostname or "127.0.0.1", u.port or 80
        self.headers = {"Content-Type": "application/json", **headers}
        self.timeout = timeout

    def request(self, path: str, body: str | bytes) -> tuple[http.client.HTTPConnection, Any]:
        conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
        conn.request("POST", path, body, self.headers)
        return conn, conn.getresponse()


def _body(o: Outcome, prompts: Sequence[Sequence[int]], chat: Sequence[str]) -> tuple[str, dict]:
    if o.greedy:
        body: dict[str, Any] = {
            "model": "default",
            "prompt": list(prompts[o.prompt_index]),
            "temperature": 0.0,
            "ignore_eos": True,
        }
        path = "/v1/completions"
    else:
        body = {
            "model": "default",
            "messages": [{"role": "user", "content": chat[o.prompt_index % len(chat)]}],
            "temperature": 1.0,
        }
        path = "/v1/chat/completions"
    body.update(max_tokens=o.max_tokens, stream=o.stream)
    return path, body


def _piece(choice: Mapping[str, Any]) -> str:
    if "delta" in choice:
        return str(choice["delta"].get("content") or "")
    if "message" in choice:
        return str(choice["message"].get("content") or "")
    return str(choice.get("text") or "")


def _send(client: _Client, o: Outcome, spec: LoadSpec, path: str, body: dict) -> None:
    t0 = time.monotonic()
    conn, resp = client.request(path, json.dumps(body))
    o.status = resp.status
    try:
        if resp.status != 200:
            o.error = resp.read().decode(errors="replace")[:300]
            return
        if not o.stream:
            out = json.loads(resp.read())
            o.text = _piece(out["choices"][0])
            o.finished = True
            return
        chunks = 0
        for raw in resp:
            line = raw.decode().strip()
            if not line.startswith("data:"):
                continue
            data = line.removeprefix("data:").strip()
            if data == "[DONE]":
                o.finished = True
                break
            event = json.loads(data)
            if "error" in event or event.get("object") == "error":
                o.error = data[:300]
                break
            o.text += "".join(_piece(c) for c in event.get("choices", []))
            chunks += 1
            if o.disconnect and chunks >= spec.disconnect_after:
                break  # the client hangs up mid-stream
    finally:
        conn.close()
        o.latency_s = time.monotonic() - t0


def run_load(
    base_url: str,
    prompts: Sequence[Sequence[int]],
    chat_prompts: Sequence[str],
    spec: LoadSpec,
    headers: Mapping[str, str] | None = None,
) -> list[Outcome]:
    """Drive ``spec.clients`` closed-loop clients for ``spec.duration_s``; every outcome.

    Every client sends at least one request, however late its thread starts: on a busy
    machine a short run's deadline can pass before a client first looks at it.
    """
    client = _Client(base_url, headers or {}, spec.timeout_s)
    deadline = time.monotonic() + spec.duration_s
    lock = threading.Lock()
    outcomes: list[Outcome] = []

    every = round(1 / spec.disconnect_fraction) if spec.disconnect_fraction else 0

    def loop(cid: int) -> None:
        rng = random.Random(spec.seed * 100_003 + cid)
        streamed = 0
        first = True
        while first or time.monotonic() < deadline:
            first = False
            stream = rng.random() < spec.stream_fraction
            if spec.stream_fraction > 0 and every > 0 and cid % every == 0 and streamed == 0:
                # These clients open with a streamed request: however slow the server, a
                # run of any length that streams at all has clients that hang up.
                stream = True
            # Deterministically every (1/fraction)-th streamed request, staggered by client
            # (client c's first is one when c is a multiple of 1/fraction), so the share
            # holds overall.
            disconnect = stream and every > 0 and (streamed + cid) % every == 0
            streamed += stream
            o = Outcome(
                client=cid,
                greedy=rng.random() < spec.greedy_fraction,
                stream=stream,
                disconnect=disconnect,
                max_tokens=rng.randint(spec.min_tokens, spec.max_tokens),
                prompt_index=rng.randrange(len(prompts)),
            )
            path, body = _body(o, prompts, chat_prompts)
            try:
                _send(client, o, spec, path, body)
            except (OSError, http.client.HTTPException, ValueError) as exc:
                o.error = f"{type(exc).__name__}: {exc}"
            with lock:
                outcomes.append(o)

    with ThreadPoolExecutor(max_workers=spec.clients) as pool:
        list(pool.map(loop, range(spec.clients)))
    return outcomes


def _pct(xs: Sequence[float], q: float) -> float:
    return float(np.percentile(xs, q)) if xs else float("nan")


def summarise(outcomes: Sequence[Outcome]) -> dict[str, Any]:
    """Counts and latency percentiles (seconds) of a :func:`run_load` run."""
    cancelled = [o for o in outcomes if o.disconnect and not o.error]
    done = [o for o in outcomes if o.finished and not o.disconnect]
    errored = [o for o in outcomes if o.error]
    lat = sorted(o.latency_s for o in done)
    return {
        "sent": len(outcomes),
        "completed": len(done),
        "cancelled_by_client": len(cancelled),
        "errored": len(errored),
        "greedy_completed": sum(o.greedy for o in done),
        "sampled_completed": sum(not o.greedy for o in done),
        "streamed_completed": sum(o.stream for o in done),
        "latency_p50_s": _pct(lat, 50),
        "latency_p99_s": _pct(lat, 99),
        "errors": [asdict(o) for o in errored[:5]],
    }


@dataclass(frozen=True)
class Malformed:
    name: str
    status: int
    message: str = field(repr=False)


def malformed_requests(
    base_url: str, context_len: int, vocab_size: int, headers: Mapping[str, str] | None = None
) -> list[Malformed]:
    """Send each malformed request once; what the server answered."""
    client = _Client(base_url, headers or {}, 120.0)
    chat = {"model": "default", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    cases: dict[str, tuple[str, str]] = {
        "bad JSON": ("/v1/chat/completions", '{"model": "default", "messages": [{"role"'),
        "negative max_tokens": ("/v1/chat/completions", json.dumps({**chat, "max_tokens": -3})),
        "temperature < 0": ("/v1/chat/completions", json.dumps({**chat, "temperature": -1.0})),
        "top_p > 1": ("/v1/chat/completions", json.dumps({**chat, "top_p": 1.5})),
        "over-long prompt": (
            "/v1/completions",
            json.dumps({"model": "default", "prompt": [5] * (context_len + 8), "max_tokens": 4}),
        ),
        "token id outside the vocabulary": (
            "/v1/completions",
            json.dumps({"model": "default", "prompt": [vocab_size + 7, 5], "max_tokens": 4}),
        ),
    }
    out: list[Malformed] = []
    for name, (path, body) in cases.items():
        conn, resp = client.request(path, body)
        try:
            text = resp.read().decode(errors="replace")
        finally:
            conn.close()
        try:
            message = str(json.loads(text).get("message", text))
        except ValueError:
            message = text
        out.append(Malformed(name, resp.status, message))
    return out


def metric_total(base_url: str, name: str) -> float:
    """Sum over label sets of one series on the server's ``/metrics`` (0 when absent)."""
    import re
    import urllib.request

    with urllib.request.urlopen(base_url + "/metrics", timeout=30) as r:
        text = r.read().decode()
    return sum(float(v) for v in re.findall(rf"^{name}(?:\{{[^}}]*\}})? (\S+)$", text, re.M))
