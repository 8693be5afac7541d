"""Regeneration through SGLang without starting it: config validation, per-prompt seeds,
resumption and the on-disk format, with a seeded stand-in for the engine and stand-in
OpenAI-API servers on 127.0.0.1 (the real engine and server: ``test_training_regen_*``)."""

from __future__ import annotations

import json
import random
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from tiny_training_target import EOS, PAD, tiny_llama, tiny_prompts

from dspark_sglang.training.config import DataConfig, TrainConfig
from dspark_sglang.training.datagen import (
    MANIFEST_FILE,
    RESPONSES_DIR,
    GenerationSettings,
    generate_responses,
    read_index,
    regenerate_responses,
    seed_for_prompt,
)
from dspark_sglang.training.regen_openai import completion_body, server_sampler
from dspark_sglang.training.regen_sglang import engine_sampler, sampling_params

SETTINGS = GenerationSettings(max_new_tokens=12, batch_size=2, seed=5, generator="sglang")
KW = {"pad_token_id": PAD, "eos_token_ids": [EOS], "progress": False}


def _seeded_continuation(params: dict[str, Any]) -> list[int]:
    """What an engine that honours ``sampling_seed`` returns: a function of the seed only."""
    rng = random.Random(params["sampling_seed"])
    out: list[int] = []
    while len(out) < params["max_new_tokens"]:
        out.append(EOS if rng.random() < 0.1 else rng.randrange(3, 96))
        if out[-1] in params["stop_token_ids"]:
            break
    return out


class SeededEngine:
    """Stands in for ``sglang.Engine`` with deterministic inference; records window sizes."""

    def __init__(self) -> None:
        self.windows: list[int] = []

    def generate(
        self, input_ids: list[list[int]], sampling_params: list[dict[str, Any]]
    ) -> list[dict[str, Any]]:
        self.windows.append(len(input_ids))
        return [{"output_ids": _seeded_continuation(p)} for p in sampling_params]


def _shards(root: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted((root / RESPONSES_DIR).glob("shard-*"))}


def test_a_prompts_seed_is_a_pure_function_of_the_seed_and_its_id() -> None:
    assert seed_for_prompt(5, "p001") == seed_for_prompt(5, "p001")
    seeds = {seed_for_prompt(s, f"p{i:03d}") for s in (0, 1) for i in range(50)}
    assert len(seeds) == 100 and all(0 <= s < 2**63 for s in seeds)
    params = sampling_params(SETTINGS, "p001", [EOS, 7])
    assert params == {
        "temperature": 1.0,
        "top_p": 1.0,
        "top_k": -1,
        "min_p": 0.0,
        "max_new_tokens": 12,
        "stop_token_ids": [EOS, 7],
        "ignore_eos": False,
        "sampling_seed": seed_for_prompt(5, "p001"),
    }
    body = completion_body("m", tiny_prompts(1)[0], SETTINGS, [EOS])
    assert body["seed"] == seed_for_prompt(5, "p000") and body["return_token_ids"] is True
    assert (body["temperature"], body["top_p"], body["top_k"], body["min_p"]) == (1.0, 1.0, -1, 0)


def test_engine_regeneration_resumes_to_identical_shards_whatever_the_windows(
    tmp_path: Path,
) -> None:
    """Seeds per prompt, not per batch: an engine that honours them gives the same shards
    whether the run was whole or killed and resumed, with other in-flight windows."""
    prompts = tiny_prompts(9)
    whole = SeededEngine()
    recs = regenerate_responses(
        engine_sampler(whole, SETTINGS, [EOS], max_in_flight=4),
        prompts,
        tmp_path / "a",
        SETTINGS,
        **KW,
    )
    assert whole.windows == [4, 4, 1]  # whole shards, never more than 4 prompts at once

    part = tmp_path / "b"
    regenerate_responses(
        engine_sampler(SeededEngine(), SETTINGS, [EOS], 3),
        prompts,
        part,
        SETTINGS,
        max_batches=2,
        **KW,
    )
    first = _shards(part)
    assert sorted(read_index(part / RESPONSES_DIR)) == [0, 1]
    again = SeededEngine()
    regenerate_responses(engine_sampler(again, SETTINGS, [EOS], 64), prompts, part, SETTINGS, **KW)
    assert again.windows == [5]  # only the three shards the index lacks
    assert _shards(part) == _shards(tmp_path / "a")
    assert {k: _shards(part)[k] for k in first} == first
    assert [r.id for r in recs] == [p.id for p in prompts]
    for r in recs:
        assert 1 <= len(r.response_ids) <= 12 and EOS not in r.response_ids[:-1]
        assert r.finished == (r.response_ids[-1] == EOS)
    manifest = json.loads((part / RESPONSES_DIR / MANIFEST_FILE).read_text())
    assert manifest["generator"] == "sglang"


def test_the_manifest_pins_the_generator(tmp_path: Path) -> None:
    prompts = tiny_prompts(4)
    hf = GenerationSettings(max_new_tokens=12, batch_size=2, seed=5)
    generate_responses(tiny_llama(), prompts, tmp_path, hf, max_batches=1, **KW)
    manifest = json.loads((tmp_path / RESPONSES_DIR / MANIFEST_FILE).read_text())
    assert "generator" not in manifest  # hf directories made before the option still resume
    with pytest.raises(ValueError, match="generator"):
        regenerate_responses(
            engine_sampler(SeededEngine(), SETTINGS, [EOS], 8), prompts, tmp_path, SETTINGS, **KW
        )
    with pytest.raises(ValueError, match=r"data\.generator"):
        GenerationSettings(generator="vllm")


# --------------------------------------------------------------------------- openai


class _Servers:
    """Stand-in SGLang servers: ``/v1/models`` and a seeded ``/v1/completions``."""

    def __init__(self, n: int) -> None:
        self.lock = threading.Lock()
        self.open = 0
        self.peak = 0
        self.served: list[int] = [0] * n
        self.httpds = [ThreadingHTTPServer(("127.0.0.1", 0), self._handler(i)) for i in range(n)]
        self.threads = [threading.Thread(target=h.serve_forever, daemon=True) for h in self.httpds]
        for t in self.threads:
            t.start()

    @property
    def urls(self) -> list[str]:
        return [f"http://127.0.0.1:{h.server_address[1]}" for h in self.httpds]

    def close(self) -> None:
        for h in self.httpds:
            h.shutdown()
            h.server_close()

    def _handler(self, index: int) -> type[BaseHTTPRequestHandler]:
        servers = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _reply(self, body: dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                self._reply({"data": [{"id": f"model-{index}"}]})

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                assert body["model"] == f"model-{index}" and body["return_token_ids"]
                with servers.lock:
                    servers.open += 1
                    servers.peak = max(servers.peak, servers.open)
                    servers.served[index] += 1
                time.sleep(0.01)
                ids = _seeded_continuation(
                    {
                        "sampling_seed": body["seed"],
                        "max_new_tokens": body["max_tokens"],
                        "stop_token_ids": body["stop_token_ids"],
                    }
                )
                with servers.lock:
                    servers.open -= 1
                self._reply({"choices": [{"token_ids": ids, "finish_reason": "stop"}]})

        return Handler


@pytest.fixture
def servers() -> Iterator[_Servers]:
    s = _Servers(2)
    yield s
    s.close()


def test_openai_requests_spread_over_servers_within_the_in_flight_bound(
    tmp_path: Path, servers: _Servers
) -> None:
    prompts = tiny_prompts(12)
    openai = GenerationSettings(max_new_tokens=12, batch_size=2, seed=5, generator="openai")
    regenerate_responses(
        server_sampler(servers.urls, openai, [EOS], 3), prompts, tmp_path / "o", openai, **KW
    )
    assert servers.served == [6, 6]
    assert 1 <= servers.peak <= 3
    # Same seeds, same sampler: byte-identical shards to the engine path.
    regenerate_responses(
        engine_sampler(SeededEngine(), SETTINGS, [EOS], 8), prompts, tmp_path / "e", SETTINGS, **KW
    )
    assert _shards(tmp_path / "o") == _shards(tmp_path / "e")


def test_an_unreachable_server_is_named(tmp_path: Path) -> None:
    from dspark_sglang.sglang_integration.server import free_port

    url = f"http://127.0.0.1:{free_port()}"
    openai = GenerationSettings(max_new_tokens=4, batch_size=2, seed=5, generator="openai")
    with pytest.raises(RuntimeError, match=rf"data\.generator_urls: {url}/v1/models"):
        regenerate_responses(
            server_sampler([url], openai, [EOS], 2), tiny_prompts(2), tmp_path, openai, **KW
        )


# --------------------------------------------------------------------------- config


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"generator": "vllm"}, r"data\.generator must be one of \('hf', 'sglang', 'openai'\)"),
        ({"generator": "openai"}, r"data\.generator 'openai' needs data\.generator_urls"),
        (
            {"generator": "openai", "generator_urls": "http://a:1"},
            r"data\.generator_urls must be a list",
        ),
        (
            {"generator": "openai", "generator_urls": ["a:1"]},
            r"data\.generator_urls has entries that are not http\(s\) base URLs: \['a:1'\]",
        ),
        (
            {"generator": "openai", "generator_urls": ["http://a:1", "http://a:1/"]},
            r"data\.generator_urls lists a server twice",
        ),
        (
            {"generator_urls": ["http://a:1"]},
            r"data\.generator_urls is set but data\.generator is 'hf'",
        ),
        (
            {"generator": "sglang", "max_in_flight": 0},
            r"data\.max_in_flight must be an integer >= 1",
        ),
        ({"generator": "sglang", "sglang_args": [1]}, r"data\.sglang_args must be a mapping"),
        (
            {"generator": "sglang", "sglang_args": {"device": "cuda"}},
            r"data\.sglang_args sets \['device'\].*run\.device",
        ),
        ({"sglang_args": {"tp_size": 2}}, r"data\.sglang_args is set but data\.generator is 'hf'"),
    ],
)
def test_bad_generator_settings_are_refused_naming_the_key(
    data: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        DataConfig(**data)


def test_generator_settings_load_from_yaml_mappings() -> None:
    def cfg(data: dict[str, Any]) -> TrainConfig:
        return TrainConfig.from_dict({"name": "x", "data": data})

    d = cfg({"generator": "openai", "generator_urls": ["http://h:1/", "https://g"]}).data
    assert d.generator_urls == ("http://h:1", "https://g") and d.max_in_flight == 64
    d = cfg({"generator": "sglang", "sglang_args": {"mem_fraction_static": 0.5}}).data
    assert d.sglang_args == {"mem_fraction_static": 0.5}
    with pytest.raises(ValueError, match=r"unknown keys \['data\.generator_url'\]"):
        cfg({"generator_url": ["http://h:1"]})
