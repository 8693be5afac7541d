"""``data.generator: openai``: a real SGLang server (``python -m sglang.launch_server`` on
CPU, 127.0.0.1, free port, stopped by PID with its children) regenerates the tiny chat
target's responses over ``/v1/completions`` with token-id prompts and
``return_token_ids``, into the same shards the engine path writes. One server per module.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from dspark_sglang.sglang_integration.engine import CpuEngineSpec
from dspark_sglang.sglang_integration.server import RunningServer, cpu_server
from dspark_sglang.targets.hf_target import HFTarget
from dspark_sglang.training.datagen import (
    MANIFEST_FILE,
    RESPONSES_DIR,
    EncodedPrompt,
    GenerationSettings,
    cache_hidden_states,
    read_index,
    regenerate_responses,
)
from dspark_sglang.training.dataset import HiddenCache
from dspark_sglang.training.regen_openai import server_sampler

pytestmark = pytest.mark.sglang

NEW = 16


@pytest.fixture(scope="module")
def server(
    tiny_chat_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningServer]:
    log = tmp_path_factory.mktemp("regen_server") / "server.log"
    with cpu_server(CpuEngineSpec(model_path=str(tiny_chat_dir)), log) as running:
        yield running


def test_servers_regenerate_into_the_shards_the_cache_reads(
    server: RunningServer, tiny_chat_model: HFTarget, tmp_path: Path
) -> None:
    texts = ["hi", "2+2?", "a poem", "sum 1..9", "colours", "why?"]
    prompts = [
        EncodedPrompt(
            id=f"o{i}",
            domain="chat",
            prompt_ids=tiny_chat_model.encode_chat([{"role": "user", "content": t}]),
        )
        for i, t in enumerate(texts)
    ]
    eos = list(tiny_chat_model.eos_token_ids)
    settings = GenerationSettings(max_new_tokens=NEW, batch_size=2, seed=1, generator="openai")
    kw = {"pad_token_id": 0, "eos_token_ids": eos, "progress": False}
    sampler = server_sampler([server.base_url], settings, eos, max_in_flight=4)
    regenerate_responses(sampler, prompts, tmp_path, settings, max_batches=1, **kw)
    first = (tmp_path / RESPONSES_DIR / "shard-00000.jsonl").read_bytes()
    recs = regenerate_responses(sampler, prompts, tmp_path, settings, **kw)
    assert (tmp_path / RESPONSES_DIR / "shard-00000.jsonl").read_bytes() == first
    assert sorted(read_index(tmp_path / RESPONSES_DIR)) == [0, 1, 2]
    assert [(r.id, r.prompt_ids) for r in recs] == [(p.id, p.prompt_ids) for p in prompts]
    for r in recs:
        assert 1 <= len(r.response_ids) <= NEW
        assert not set(eos) & set(r.response_ids[:-1])
        assert r.finished == (r.response_ids[-1] in eos)
        assert r.finished or len(r.response_ids) == NEW
    manifest = json.loads((tmp_path / RESPONSES_DIR / MANIFEST_FILE).read_text())
    assert manifest["generator"] == "openai"
    cache_hidden_states(tiny_chat_model.model, tmp_path, (0, 1, 2), progress=False)
    assert HiddenCache(tmp_path).ids == [p.id for p in prompts]
