"""The chart's default tier under load, client disconnects, drafter faults and bad requests.

The server is the default values' first tier, started from its rendered manifest
through the CPU overlay of ``rendered_tier.py``, plus two test inputs:
``--dtype float32`` (so greedy text can be compared exactly with HF's float32
greedy decoding; in bfloat16 a verify forward and a decode step round
differently) and ``DSPARK_FAULT_INJECT_EVERY`` (every N-th draft step raises).

32 clients run for a bounded time (``bench.serve_contract.run_load``): greedy and
temperature-1 requests, streamed and not, random ``max_tokens``, 10 % of
streamed requests' clients hanging up early. Then: every request its client did not
cancel completed; every greedy one is token-identical to plain greedy decoding;
``/health`` answered throughout; ``dspark_fallback_total`` equals the injected
faults; malformed requests get a 4xx with a message and leave the server
healthy. ``benchmarks/serve_contract.py`` runs the same load longer and records
the figures in ``benchmarks/results/serve_contract.json``.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from chart_tools import SHIPPED, render
from hf_greedy import hf_greedy
from rendered_tier import cpu_launch, server_workloads

from dspark_sglang.bench.serve_contract import (
    CHAT_PROMPTS,
    COMPLETION_PROMPTS,
    LoadSpec,
    malformed_requests,
    metric_total,
    run_load,
    summarise,
)
from dspark_sglang.sglang_integration.fallback import FAULT_EVERY_ENV
from dspark_sglang.sglang_integration.launch import DECISION_LOG_ENV
from dspark_sglang.sglang_integration.server import RunningServer, server_process

pytestmark = [pytest.mark.sglang, pytest.mark.slow, pytest.mark.helm]

FAULT_EVERY = 2  # the default tier drafts in few steps (draft decision): keep faults frequent
MAX_TOKENS = 16
SPEC = LoadSpec(clients=32, duration_s=20.0, min_tokens=4, max_tokens=MAX_TOKENS, seed=0)


@pytest.fixture(scope="module")
def tokenizer(smollm2_path: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(smollm2_path)


@pytest.fixture(scope="module")
def prompt_ids(tokenizer: Any) -> list[list[int]]:
    return [tokenizer(p, add_special_tokens=False)["input_ids"] for p in COMPLETION_PROMPTS]


@pytest.fixture(scope="module")
def server(smollm2_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    (tier, *_) = server_workloads(render(SHIPPED[0]), SHIPPED[0].name)
    root = tmp_path_factory.mktemp("serve-contract")
    launch = cpu_launch(tier, root / "pod", smollm2_path, sys.executable)
    # The decision log says which steps ran the drafter (the tier's draft decision may
    # run plain decode steps, which draw no fault).
    log = root / "decisions.jsonl"
    env = {
        **os.environ,
        **launch.env,
        FAULT_EVERY_ENV: str(FAULT_EVERY),
        DECISION_LOG_ENV: str(log),
    }
    argv = [*launch.argv, "--dtype", "float32"]
    with server_process(argv, env, launch.base_url, root / "server.log", ready_path="/health") as s:
        yield s


def _metric(server: RunningServer, name: str) -> float:
    return metric_total(server.base_url, name)


def _health(server: RunningServer) -> int:
    try:
        with urllib.request.urlopen(server.base_url + "/health", timeout=10) as r:
            return r.status
    except OSError:
        return 0


def test_load_with_disconnects_and_faults_loses_nothing(
    server: RunningServer, smollm2_path: Path, prompt_ids: list[list[int]], tokenizer: Any
) -> None:
    reference = hf_greedy(smollm2_path, prompt_ids, MAX_TOKENS)
    health: list[int] = []
    stop = threading.Event()

    def probe() -> None:
        while not stop.is_set():
            health.append(_health(server))
            stop.wait(2.0)

    prober = threading.Thread(target=probe)
    prober.start()
    try:
        outcomes = run_load(server.base_url, prompt_ids, CHAT_PROMPTS, SPEC)
    finally:
        stop.set()
        prober.join()
    summary = summarise(outcomes)
    assert summary["errored"] == 0, summary["errors"]
    uncancelled = [o for o in outcomes if not o.disconnect]
    assert all(o.finished and o.status == 200 for o in uncancelled)
    assert summary["cancelled_by_client"] >= 1 and summary["greedy_completed"] >= 10
    assert summary["sampled_completed"] >= 10 and summary["streamed_completed"] >= 10
    wrong = [
        (o.prompt_index, o.max_tokens, o.stream)
        for o in uncancelled
        if o.greedy
        and o.text
        != tokenizer.decode(reference[o.prompt_index][: o.max_tokens], skip_special_tokens=True)
    ]
    assert wrong == [], f"greedy requests whose text is not plain greedy decoding: {wrong}"
    assert health and set(health) == {200}, f"/health answered {sorted(set(health))}"
    # Every injected fault fell back, and only those: every FAULT_EVERY-th draft step. A
    # draft step is a decode round that ran the drafter (all of them without a draft
    # decision; with one, the rounds its log says drafted).
    time.sleep(1.0)
    rounds = _metric(server, "dspark_rounds_total")
    fallbacks = _metric(server, "dspark_fallback_total")
    decisions = [
        json.loads(line)["draft_decision"]
        for line in (server.log_path.parent / "decisions.jsonl").read_text().splitlines()
        if '"draft_decision"' in line
    ]
    drafted = sum(d["drafts"] for d in decisions) if decisions else rounds
    assert len(decisions) in (0, rounds), (len(decisions), rounds)
    assert fallbacks == drafted // FAULT_EVERY > 0, (fallbacks, drafted, rounds)


def test_malformed_requests_get_4xx_and_the_server_stays_healthy(
    server: RunningServer, smollm2_path: Path, tokenizer: Any
) -> None:
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(smollm2_path)
    answers = malformed_requests(server.base_url, config.max_position_embeddings, config.vocab_size)
    for a in answers:
        assert 400 <= a.status < 500 and a.message.strip(), a
        assert "Traceback" not in a.message and 'File "' not in a.message, a
    assert _health(server) == 200
    rounds_before = _metric(server, "dspark_rounds_total")
    spec = LoadSpec(clients=1, duration_s=0.1, greedy_fraction=1.0, stream_fraction=0.0)
    (after, *_) = run_load(server.base_url, [[1, 2, 3]], CHAT_PROMPTS, spec)
    assert after.finished and after.status == 200
    assert _metric(server, "dspark_rounds_total") > rounds_before
