"""SGLang's HTTP server with our plugin (DSPARK_MOE) on 127.0.0.1.

One server per module (``python -m sglang.launch_server``, random free port,
stopped by PID with all its children). Greedy, EOS-ignoring requests must
return the target's greedy continuation (the HF reference the engine tests
show SGLang reproduces), decoded with the same tokenizer; 16 concurrent
clients (bounded thread pool, stdlib HTTP) must all get theirs; a streaming
chat request whose client disconnects must free its slot (SGLang's own load
report goes back to 0 running requests and the next request is served); and
SGLang's ``/metrics`` (``--enable-metrics``) must serve our ``dspark_*`` metrics.
"""

from __future__ import annotations

import http.client
import json
import re
import time
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from dspark_sglang.sglang_integration.dense_draft import write_dense_dspark_draft
from dspark_sglang.sglang_integration.engine import CpuEngineSpec
from dspark_sglang.sglang_integration.server import RunningServer, cpu_server, post_json

pytestmark = [pytest.mark.sglang, pytest.mark.slow]

CONCURRENT_TOKENS = 24
CLIENTS = 16


@pytest.fixture(scope="module")
def server(smollm2_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    tmp = tmp_path_factory.mktemp("moe_server")
    draft = write_dense_dspark_draft(smollm2_path, tmp / "draft")
    spec = CpuEngineSpec(
        model_path=str(smollm2_path),
        overrides={
            "speculative_algorithm": "DSPARK_MOE",
            "speculative_draft_model_path": str(draft),
            "speculative_draft_load_format": "dummy",
            "enable_metrics": True,
        },
    )
    with cpu_server(spec, tmp / "server.log") as running:
        yield running


@pytest.fixture(scope="module")
def tokenizer(smollm2_path: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(smollm2_path)


def _complete(server: RunningServer, prompt: list[int], n: int) -> str:
    body = {
        "model": "default",
        "prompt": prompt,
        "max_tokens": n,
        "temperature": 0.0,
        "ignore_eos": True,
    }
    out = post_json(server.base_url + "/v1/completions", body)
    return str(out["choices"][0]["text"])


def _get(server: RunningServer, path: str) -> str:
    with urllib.request.urlopen(server.base_url + path, timeout=30) as r:
        return r.read().decode()


def test_completions_equal_greedy_decoding(
    server: RunningServer,
    prompt_ids: list[list[int]],
    hf_reference: list[list[int]],
    tokenizer: Any,
) -> None:
    text = _complete(server, prompt_ids[0], len(hf_reference[0]))
    assert text == tokenizer.decode(hf_reference[0], skip_special_tokens=True)


def test_sixteen_concurrent_clients_all_get_greedy_outputs(
    server: RunningServer,
    prompt_ids: list[list[int]],
    hf_reference: list[list[int]],
    tokenizer: Any,
) -> None:
    jobs = [i % len(prompt_ids) for i in range(CLIENTS)]
    with ThreadPoolExecutor(max_workers=CLIENTS) as pool:
        texts = list(pool.map(lambda i: _complete(server, prompt_ids[i], CONCURRENT_TOKENS), jobs))
    expected = [
        tokenizer.decode(hf_reference[i][:CONCURRENT_TOKENS], skip_special_tokens=True)
        for i in jobs
    ]
    wrong = [k for k, (t, e) in enumerate(zip(texts, expected, strict=True)) if t != e]
    assert wrong == [], f"clients {wrong} got outputs other than greedy decoding"


def _chat_body(stream: bool, max_tokens: int) -> dict[str, Any]:
    return {
        "model": "default",
        "messages": [{"role": "user", "content": "Name three colors."}],
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "stream": stream,
        "ignore_eos": True,
    }


def _open_stream(server: RunningServer, body: dict[str, Any]) -> http.client.HTTPConnection:
    host, port = server.base_url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=600)
    conn.request(
        "POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"}
    )
    return conn


def test_streaming_chat_equals_non_streaming(server: RunningServer) -> None:
    whole = post_json(server.base_url + "/v1/chat/completions", _chat_body(False, 16))
    conn = _open_stream(server, _chat_body(True, 16))
    resp = conn.getresponse()
    assert resp.status == 200
    pieces: list[str] = []
    done = False
    for raw in resp:
        line = raw.decode().strip()
        if not line.startswith("data:"):
            continue
        data = line.removeprefix("data:").strip()
        if data == "[DONE]":
            done = True
            break
        delta = json.loads(data)["choices"][0]["delta"]
        pieces.append(delta.get("content") or "")
    conn.close()
    assert done, "stream did not end with [DONE]"
    assert len([p for p in pieces if p]) > 1, "expected the answer in several chunks"
    assert "".join(pieces) == whole["choices"][0]["message"]["content"]


def _running_requests(server: RunningServer) -> int:
    text = _get(server, "/v1/loads?format=prometheus")
    values = re.findall(r"^sglang_\w*num_running_reqs\{[^}]*\} (\S+)$", text, re.M)
    assert values, f"no num_running_reqs in /v1/loads:\n{text[:500]}"
    return int(sum(float(v) for v in values))


def test_client_disconnect_frees_the_slot(
    server: RunningServer,
    prompt_ids: list[list[int]],
    hf_reference: list[list[int]],
    tokenizer: Any,
) -> None:
    conn = _open_stream(server, _chat_body(True, 4000))
    resp = conn.getresponse()
    chunks = 0
    for raw in resp:
        chunks += raw.startswith(b"data:")
        if chunks >= 3:
            break
    # SGLang publishes its load every 15 decode iterations (its
    # --load-snapshot-publish-interval) and at once after a prefill; without the
    # overlap scheduler (DSPARK_MOE on CPU) that prefill snapshot is taken before
    # the new request joins the running batch, so the gauge shows it a few rounds late.
    deadline = time.monotonic() + 60
    while _running_requests(server) != 1:
        assert time.monotonic() < deadline, "the long request never showed as decoding"
        time.sleep(0.1)
    conn.close()  # the client disconnects mid-stream
    deadline = time.monotonic() + 120
    while _running_requests(server) != 0:
        assert time.monotonic() < deadline, "aborted request still holds its slot after 120 s"
        time.sleep(0.5)
    text = _complete(server, prompt_ids[1], 8)
    assert text == tokenizer.decode(hf_reference[1][:8], skip_special_tokens=True)


def test_metrics_endpoint_serves_dspark_metrics(
    server: RunningServer, prompt_ids: list[list[int]]
) -> None:
    _complete(server, prompt_ids[2], 8)  # at least a few decode rounds of our worker
    text = _get(server, "/metrics")
    for name in (
        "dspark_accepted_length_bucket",
        "dspark_position_acceptance_ratio",
        "dspark_rounds_total",
    ):
        assert name in text, f"{name} missing from /metrics"
    rounds = re.search(r"^dspark_rounds_total(?:\{[^}]*\})? (\S+)$", text, re.M)
    assert rounds is not None and float(rounds.group(1)) > 0


def test_sampled_requests_stream_through_the_live_load_client(
    server: RunningServer, prompt_ids: list[list[int]]
) -> None:
    """Temperature 1 (SGLang's Triton chain sampler, our CPU port) under a closed loop.

    Before the CPU port the first sampled request killed the scheduler. Every
    request must stream all its tokens, one chunk per engine step at most.
    """
    from dspark_sglang.bench.sim_validation import closed_loop, stream_generate, summarise_load

    n_new = 8
    run = closed_loop(
        lambda i: stream_generate(
            server.base_url, prompt_ids[i % len(prompt_ids)], n_new, temperature=1.0
        ),
        num_requests=4,
        concurrency=2,
    )
    for tl in run.timelines:
        assert tl.output_tokens == n_new
        assert tl.submit < tl.first <= tl.finish
        assert all(b > a for a, b in zip(tl.tokens, tl.tokens[1:], strict=False))
    live = summarise_load(run, warmup_fraction=0.0)
    assert live.throughput > 0 and live.completed >= 1
    # The server is still healthy: a greedy request after the sampled ones.
    assert _complete(server, prompt_ids[0], 4)
