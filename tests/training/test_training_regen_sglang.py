"""``data.generator: sglang``: SGLang's real ``Engine`` (CPU) regenerates the tiny chat
target's responses into the shards the hidden-state cache reads.

One engine for the module. What holds on CPU (``regen_sglang``'s docstring): responses end
at EOS or after ``max_new_tokens``, and a killed run re-run keeps every indexed shard
byte-for-byte and fills in exactly the missing ones, with the same prompts per shard as an
uninterrupted run. Byte-identical regenerated shards need an engine that honours
``sampling_seed`` (``enable_deterministic_inference``, GPU only); that resumption logic is
tested with a seeded stand-in in ``test_training_regen.py``.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tiny_chat_target import encoded_chats

from dspark_sglang.targets.hf_target import HFTarget
from dspark_sglang.training.config import TrainConfig
from dspark_sglang.training.datagen import (
    MANIFEST_FILE,
    RESPONSES_DIR,
    EncodedPrompt,
    GenerationSettings,
    ResponseRecord,
    load_responses,
    read_index,
    regenerate_responses,
)
from dspark_sglang.training.dataset import HiddenCache
from dspark_sglang.training.regen_sglang import EngineSettings, engine_sampler, open_engine

pytestmark = pytest.mark.sglang

NEW = 16
MESSAGES = str(Path(__file__).parents[1] / "data" / "fixtures" / "chats_messages.jsonl")


@pytest.fixture(scope="module")
def engine(tiny_chat_dir: Path) -> Iterator[Any]:
    with open_engine(EngineSettings(model_path=str(tiny_chat_dir), seed=0, threads=1)) as e:
        yield e


def prompts(target: HFTarget, n: int) -> list[EncodedPrompt]:
    return encoded_chats(target, n)


def check_records(recs: list[ResponseRecord], eos: set[int]) -> None:
    for r in recs:
        assert 1 <= len(r.response_ids) <= NEW
        assert not eos & set(r.response_ids[:-1])
        assert r.finished == (r.response_ids[-1] in eos)
        assert r.finished or len(r.response_ids) == NEW


def test_the_data_stage_regenerates_with_the_engine_into_the_hidden_cache(
    engine: Any,
    tiny_chat_model: HFTarget,
    tiny_eval_cache: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from dspark_sglang.training import regen_sglang
    from dspark_sglang.training.pipeline import run_data_stage

    started: list[EngineSettings] = []

    @contextlib.contextmanager
    def shared_engine(settings: EngineSettings) -> Iterator[Any]:
        started.append(settings)
        yield engine

    monkeypatch.setattr(regen_sglang, "open_engine", shared_engine)
    monkeypatch.setenv("DSPARK_CACHE_DIR", str(tiny_eval_cache))
    cfg = TrainConfig.from_dict(
        {
            "name": "regen",
            "target": {"name": str(tiny_chat_model.path), "layer_ids": [0, 1, 2]},
            "data": {
                "dir": str(tmp_path / "data"),
                "sources": [{"kind": "jsonl", "path": MESSAGES}],
                "max_prompt_tokens": 200,
                "max_new_tokens": NEW,
                "gen_batch_size": 2,
                "generator": "sglang",
                "max_in_flight": 3,
                "seed": 4,
            },
            "drafter": {"block_size": 4},
            "run": {"out_dir": str(tmp_path / "run"), "threads": 1},
        }
    )
    figures = run_data_stage(cfg, tiny_chat_model, limit=None, progress=False)
    assert started == [
        EngineSettings(
            model_path=str(tiny_chat_model.path), device="cpu", dtype="float32", seed=4, threads=1
        )
    ]
    recs = load_responses(tmp_path / "data")
    assert len(recs) >= 3
    check_records(recs, set(tiny_chat_model.eos_token_ids))
    manifest = json.loads((tmp_path / "data" / RESPONSES_DIR / MANIFEST_FILE).read_text())
    assert manifest["generator"] == "sglang" and manifest["max_new_tokens"] == NEW
    cache = HiddenCache(tmp_path / "data")
    assert cache.ids == [r.id for r in recs]
    assert figures["gen_tokens"] == sum(len(r.response_ids) for r in recs) > 0


def test_a_killed_run_resumes_keeping_indexed_shards(
    engine: Any, tiny_chat_model: HFTarget, tmp_path: Path
) -> None:
    eos = list(tiny_chat_model.eos_token_ids)
    settings = GenerationSettings(max_new_tokens=NEW, batch_size=2, seed=3, generator="sglang")
    ps = prompts(tiny_chat_model, 8)
    kw: dict[str, Any] = {"pad_token_id": 0, "eos_token_ids": eos, "progress": False}
    whole = regenerate_responses(
        engine_sampler(engine, settings, eos, 8), ps, tmp_path / "a", settings, **kw
    )
    part = tmp_path / "b" / RESPONSES_DIR
    regenerate_responses(
        engine_sampler(engine, settings, eos, 3), ps, part.parent, settings, max_batches=2, **kw
    )
    kept = {p.name: p.read_bytes() for p in part.glob("shard-*")}
    assert sorted(kept) == ["shard-00000.jsonl", "shard-00001.jsonl"]
    resumed = regenerate_responses(
        engine_sampler(engine, settings, eos, 5), ps, part.parent, settings, **kw
    )
    assert {k: (part / k).read_bytes() for k in kept} == kept
    index_a, index_b = read_index(tmp_path / "a" / RESPONSES_DIR), read_index(part)
    assert {b: e.ids for b, e in index_a.items()} == {b: e.ids for b, e in index_b.items()}
    assert [(r.id, r.prompt_ids) for r in resumed] == [(r.id, r.prompt_ids) for r in whole]
    check_records(whole + resumed, set(eos))
    # Temperature 1: the same prompt under four ids does not come back four times the same.
    same = [EncodedPrompt(id=f"s{i}", domain="chat", prompt_ids=ps[0].prompt_ids) for i in range(4)]
    again = regenerate_responses(
        engine_sampler(engine, settings, eos, 8), same, tmp_path / "c", settings, **kw
    )
    assert len({tuple(r.response_ids) for r in again}) > 1
