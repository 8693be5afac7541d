"""The hidden-state cache on disk: bfloat16 bit patterns, float16 caches written before
it, and the size report printed before the hidden pass writes anything."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from tiny_training_target import PAD, TINY_LAYER_IDS, tiny_llama

from dspark_sglang.training.datagen import (
    HIDDEN_DIR,
    INDEX_FILE,
    MANIFEST_FILE,
    RESPONSES_DIR,
    SIZE_FILE,
    cache_hidden_states,
    load_responses,
    read_index,
    target_hidden_states,
)
from dspark_sglang.training.dataset import HiddenCache
from dspark_sglang.training.hidden_format import (
    STORED_DTYPES,
    HiddenCacheSize,
    decode,
    encode,
    human_bytes,
)

BF16 = STORED_DTYPES["bfloat16"]
F16 = STORED_DTYPES["float16"]


def _responses(src: Path, dst: Path) -> Path:
    shutil.copytree(src / RESPONSES_DIR, dst / RESPONSES_DIR)
    return dst


def _alone(model: torch.nn.Module, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The target's states of one sequence run alone (what a batch-size-1 pass caches)."""
    aux, last = target_hidden_states(
        model, tokens.unsqueeze(0), torch.ones(1, len(tokens), dtype=torch.long), TINY_LAYER_IDS
    )
    return aux[0], last[0]


def _huge_target() -> torch.nn.Module:
    """The tiny target with states far beyond float16's 65504: token embeddings scaled so
    the residual stream (every context layer) is ~1e5, the final norm's gain 1e5."""
    model = tiny_llama()
    with torch.no_grad():
        model.model.embed_tokens.weight.mul_(5e6)
        model.model.norm.weight.fill_(1e5)
    return model


def test_bfloat16_round_trip_is_exact_and_keeps_values_beyond_float16(tmp_path: Path) -> None:
    x = torch.tensor([1e5, -1e5, 65504.0, 7e4, 3e38, -2.5, 1e-30, 0.0, float("inf")])
    stored = encode(x, BF16)
    assert stored.dtype == np.uint16
    back = decode(stored, BF16)
    assert back.dtype == torch.bfloat16
    assert torch.equal(back.view(torch.int16), x.to(torch.bfloat16).view(torch.int16))
    assert float(back[0]) == pytest.approx(1e5, rel=2**-8) and float(back[1]) < -9.9e4
    assert torch.isinf(x[:5].to(torch.float16)).sum() == 4  # what a float16 cache would keep
    with pytest.raises(ValueError, match="damaged"):
        decode(stored.view(np.float16), BF16)


def test_a_cache_of_huge_states_stores_them_and_a_float16_cache_refuses(
    tiny_data_dir: Path, tmp_path: Path
) -> None:
    model = _huge_target()
    data = _responses(tiny_data_dir, tmp_path / "bf16")
    # Batch size 1: each sequence runs alone, so the states equal `_alone`'s bit for bit.
    cache_hidden_states(model, data, TINY_LAYER_IDS, batch_size=1, pad_token_id=PAD)
    cache = HiddenCache(data)
    assert cache.dtype == "bfloat16" and cache.manifest["dtype"] == "bfloat16"
    shard = data / HIDDEN_DIR / "shard-00000"
    assert sorted(p.name for p in shard.glob("*.npy")) == [
        "aux.bf16.npy",
        "last.bf16.npy",
        "offsets.npy",
        "response_start.npy",
        "tokens.npy",
    ]
    for i in (0, 7, 15):
        seq = cache[i]
        aux, last = _alone(model, seq.tokens)
        assert float(aux.abs().max()) > 1e5 and float(last.abs().max()) > 1e5
        assert torch.isfinite(seq.aux).all() and torch.isfinite(seq.last).all()
        assert torch.equal(seq.aux, aux.to(torch.bfloat16))
        assert torch.equal(seq.last, last.to(torch.bfloat16))

    old = _responses(tiny_data_dir, tmp_path / "f16")
    with pytest.raises(ValueError, match=r"exceeds float16's range.*delete .*rewrite it in bf"):
        cache_hidden_states(model, old, TINY_LAYER_IDS, pad_token_id=PAD, dtype="float16")
    assert read_index(old / HIDDEN_DIR) == {}  # nothing half-written was indexed


def test_float16_caches_written_before_load_and_resume_in_float16(
    tiny_data_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A float16 cache (numpy float16 ``aux.npy`` / ``last.npy``, manifest dtype float16,
    the layout every earlier version wrote) still trains, and resuming it stays float16."""
    model = tiny_llama()
    data = _responses(tiny_data_dir, tmp_path / "d")
    cache_hidden_states(
        model, data, TINY_LAYER_IDS, batch_size=1, pad_token_id=PAD, dtype="float16"
    )
    root = data / HIDDEN_DIR
    manifest = json.loads((root / MANIFEST_FILE).read_text())
    assert manifest == {"layer_ids": list(TINY_LAYER_IDS), "hidden_size": 32, "dtype": "float16"}
    assert np.load(root / "shard-00000" / "aux.npy").dtype == np.float16
    cache = HiddenCache(data)
    assert cache.dtype == "float16" and len(cache) == 16
    seq = cache[3]
    aux, last = _alone(model, seq.tokens)
    assert seq.aux.dtype == torch.float16
    assert torch.equal(seq.aux, aux.to(torch.float16))
    assert torch.equal(seq.last, last.to(torch.float16))

    first = {e.shard: e.sha256 for e in read_index(root).values()}
    lines = (root / INDEX_FILE).read_text().splitlines()
    (root / INDEX_FILE).write_text("\n".join(lines[:-1]) + "\n")
    capsys.readouterr()
    cache_hidden_states(model, data, TINY_LAYER_IDS, batch_size=1, pad_token_id=PAD)  # no dtype
    assert "continuing the float16 cache" in capsys.readouterr().out
    assert {e.shard: e.sha256 for e in read_index(root).values()} == first
    assert json.loads((root / MANIFEST_FILE).read_text()) == manifest
    # Asking for bfloat16 in a float16 directory would mix the two: refused, named.
    with pytest.raises(ValueError, match="dtype"):
        cache_hidden_states(model, data, TINY_LAYER_IDS, pad_token_id=PAD, dtype="bfloat16")

    # A manifest this version cannot read, and a shard that disagrees with its manifest.
    for bad in ({**manifest, "dtype": "float8"}, {"layer_ids": [1, 2, 3], "hidden_size": 32}):
        (root / MANIFEST_FILE).write_text(json.dumps(bad))
        with pytest.raises(ValueError, match=r"Delete that hidden/ folder and rerun"):
            HiddenCache(data)
    (root / MANIFEST_FILE).write_text(json.dumps({**manifest, "dtype": "bfloat16"}))
    with pytest.raises(ValueError, match=r"lacks \['aux.bf16.npy', 'last.bf16.npy'\]"):
        HiddenCache(data)


def _payload_bytes(path: Path) -> int:
    """Bytes of an ``.npy`` file after its header (the array's data)."""
    array = np.load(path, mmap_mode="r")
    assert path.stat().st_size == array.offset + array.nbytes
    return int(array.nbytes)


def test_size_report_is_printed_first_and_equals_the_bytes_written(
    tiny_data_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The reported figure is the hidden states' bytes, exactly: the data of every
    ``aux``/``last`` array written. The rest of the folder (token ids at 4 B/token,
    offsets and response starts at 16 B/sequence, ids.json, a <= 128 B header per .npy)
    is stated as overhead and bounded here."""
    data = _responses(tiny_data_dir, tmp_path / "d")
    model = tiny_llama()
    records = load_responses(data)
    tokens = sum(len(r.prompt_ids) + len(r.response_ids) for r in records)
    capsys.readouterr()
    cache_hidden_states(model, data, TINY_LAYER_IDS, batch_size=4, pad_token_id=PAD)
    out = capsys.readouterr().out.splitlines()
    per_token = (len(TINY_LAYER_IDS) * 32 + 32) * 2
    assert out[0] == (
        f"hidden cache: {per_token} B/token x {tokens:,} tokens = "
        f"{human_bytes(per_token * tokens)} (bfloat16)"
    )
    root = data / HIDDEN_DIR
    size = json.loads((root / SIZE_FILE).read_text())
    assert size["bytes_per_token"] == per_token and size["tokens"] == tokens
    shards = [root / e.shard for e in read_index(root).values()]
    written = sum(_payload_bytes(s / f) for s in shards for f in ("aux.bf16.npy", "last.bf16.npy"))
    assert written == size["bytes"] == per_token * tokens
    on_disk = sum(f.stat().st_size for s in shards for f in s.iterdir())
    ids = sum((s / "ids.json").stat().st_size for s in shards)
    overhead = 4 * tokens + 16 * (len(records) + len(shards)) + ids + 5 * 128 * len(shards)
    assert size["bytes"] < on_disk <= size["bytes"] + overhead

    # Resuming: the report covers only what is left, and still equals what gets written.
    last = max(read_index(root).values(), key=lambda e: e.batch)
    lines = (root / INDEX_FILE).read_text().splitlines()
    (root / INDEX_FILE).write_text("\n".join(lines[:-1]) + "\n")
    cache_hidden_states(model, data, TINY_LAYER_IDS, batch_size=4, pad_token_id=PAD)
    size = json.loads((root / SIZE_FILE).read_text())
    redone = sum(_payload_bytes(root / last.shard / f) for f in ("aux.bf16.npy", "last.bf16.npy"))
    assert (size["tokens"], size["tokens_cached"]) == (last.tokens, tokens - last.tokens)
    assert size["bytes"] == redone
    assert f"{tokens - last.tokens:,} tokens already cached" in capsys.readouterr().out


def test_size_line_for_an_8b_target() -> None:
    # Llama-3-8B: H = 4096, five context layers -> 6 x 4096 x 2 B = 48 KiB a token.
    size = HiddenCacheSize("bfloat16", 5, 4096, 1_000_000)
    assert size.bytes_per_token == 49_152
    assert size.line() == "hidden cache: 48.0 KiB/token x 1,000,000 tokens = 45.8 GiB (bfloat16)"
    assert human_bytes(87_040 * 12_595) == "1.02 GiB" and human_bytes(1000) == "1000 B"
    assert re.fullmatch(r"\d+\.\d\d MiB", human_bytes(3 * 2**20 + 5))
