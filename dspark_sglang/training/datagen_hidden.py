"""The second data pass: the target's hidden states of every response, cached to disk.

``target_hidden_states`` is the one function the cache and the online trainer
(``training/online.py``) both take the target's states from: the decoder-layer
outputs at ``layer_ids`` (HF ``hidden_states[l + 1]``, concatenated) and the last,
final-normed state the LM head reads. ``cache_hidden_states`` writes them per
response shard in bfloat16 (``hidden_format``; caches begun in float16 stay float16),
resumable per shard in the ``datagen_store`` layout, after reporting the bytes it will
write (``hidden_cache_size``, also stored in ``hidden/size.json``).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm
from transformers import PreTrainedModel

from dspark_sglang.training.datagen_store import (
    HIDDEN_DIR,
    MANIFEST_FILE,
    RESPONSES_DIR,
    SIZE_FILE,
    IndexEntry,
    ResponseRecord,
    _append_index,
    _atomic_write_bytes,
    _check_manifest,
    _shard_digest,
    _shard_records,
    read_index,
)
from dspark_sglang.training.hidden_format import (
    DEFAULT_CACHE_DTYPE,
    STORED_DTYPES,
    HiddenCacheSize,
    StoredDtype,
    encode,
    stored_dtype,
)


def check_layer_ids(num_layers: int, layer_ids: Sequence[int]) -> None:
    """Refuse context layers outside ``[0, num_layers - 2]`` (the last layer's output is
    the final hidden state, never a context layer)."""
    bad = [lid for lid in layer_ids if not 0 <= lid < num_layers - 1]
    if bad:
        raise ValueError(
            f"layer ids {bad} out of range [0, {num_layers - 2}] (the last layer's output "
            "is the final hidden state, never a context layer)"
        )


@torch.no_grad()
def target_hidden_states(
    model: PreTrainedModel,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    layer_ids: Sequence[int],
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(aux [S, T, n*H], last [S, T, H])`` in the target's dtype, right-padded input.

    ``aux`` concatenates the outputs of decoder layers ``layer_ids`` (HF
    ``hidden_states[l + 1]``); ``last`` is the final-normed state the LM head
    reads. Right padding leaves the causal states of real tokens untouched. The one
    function both the hidden cache and the online trainer take their states from.
    """
    check_layer_ids(int(model.config.num_hidden_layers), layer_ids)
    out = model.base_model(
        input_ids=input_ids, attention_mask=attention_mask, output_hidden_states=True
    )
    hs = out.hidden_states
    aux = torch.cat([hs[lid + 1] for lid in layer_ids], -1)
    return aux, out.last_hidden_state


def _sequence_tokens(path: Path) -> int:
    """Prompt + response tokens of one response shard (what its hidden shard holds)."""
    return sum(len(r.prompt_ids) + len(r.response_ids) for r in _shard_records(path))


def hidden_cache_size(
    out_dir: str | Path,
    num_layers: int,
    hidden_size: int,
    dtype: str = DEFAULT_CACHE_DTYPE,
) -> HiddenCacheSize:
    """What caching every indexed response shard of ``out_dir`` takes (``tokens``), less
    the shards already cached (``tokens_cached``). Reads only the response shards."""
    out_dir = Path(out_dir)
    done = read_index(out_dir / HIDDEN_DIR)
    todo = cached = 0
    for b, entry in read_index(out_dir / RESPONSES_DIR).items():
        if b in done:
            cached += done[b].tokens
        else:
            todo += _sequence_tokens(out_dir / RESPONSES_DIR / entry.shard)
    return HiddenCacheSize(dtype, num_layers, hidden_size, todo, cached)


def _cache_dtype(root: Path, requested: str | None) -> StoredDtype:
    """The dtype the hidden pass writes: ``requested``, else the dtype a cache already in
    ``root`` was begun in (a directory never mixes dtypes), else bfloat16."""
    if requested is not None:
        if requested not in STORED_DTYPES:
            raise ValueError(
                f"hidden cache dtype must be one of {sorted(STORED_DTYPES)}, got {requested!r}"
            )
        return STORED_DTYPES[requested]
    path = root / MANIFEST_FILE
    if path.exists():
        return stored_dtype(json.loads(path.read_text()).get("dtype"), str(path))
    return STORED_DTYPES[DEFAULT_CACHE_DTYPE]


def _encode_checked(values: torch.Tensor, dtype: StoredDtype, root: Path) -> np.ndarray:
    """``encode``, refusing a finite state that overflows the dtype (float16 only can)."""
    stored = encode(values, dtype)
    overflow = dtype.name == "float16" and not np.isfinite(stored).all()
    if overflow and (torch.isfinite(values).cpu().numpy() & ~np.isfinite(stored)).any():
        raise ValueError(
            f"a hidden state exceeds float16's range (max 65504) but {root} is a float16 "
            f"cache (begun before caches were bfloat16): delete {root} and rerun the "
            "data stage to rewrite it in bfloat16"
        )
    return stored


def open_hidden_cache(
    out_dir: Path,
    layer_ids: Sequence[int],
    hidden_size: int,
    dtype: str | None,
    extra_manifest: dict[str, object] | None = None,
) -> tuple[Path, StoredDtype]:
    """The hidden cache's root and dtype, after printing and storing the size this pass
    writes and checking (or writing) its manifest; shared by every way states are cached.

    ``extra_manifest`` pins how the states were obtained where that is not the HF forward
    (``capture_sglang``), so a directory never mixes the two."""
    root = out_dir / HIDDEN_DIR
    fmt = _cache_dtype(root, dtype)
    size = hidden_cache_size(out_dir, len(layer_ids), hidden_size, fmt.name)
    print(size.line(), flush=True)
    if fmt.name != DEFAULT_CACHE_DTYPE and dtype is None:
        print(
            f"hidden cache: continuing the {fmt.name} cache in {root} (delete it to rewrite "
            f"in {DEFAULT_CACHE_DTYPE})",
            flush=True,
        )
    manifest: dict[str, object] = {
        "layer_ids": [int(x) for x in layer_ids],
        "hidden_size": hidden_size,
        "dtype": fmt.name,
        **(extra_manifest or {}),
    }
    if fmt.torch_dtype == torch.bfloat16:
        manifest["storage"] = "uint16 bit patterns of bfloat16"
    _check_manifest(root, manifest)
    _atomic_write_bytes(root / SIZE_FILE, json.dumps(size.as_dict(), indent=2).encode())
    return root, fmt


def write_hidden_shard(
    root: Path,
    batch: int,
    recs: Sequence[ResponseRecord],
    states: Sequence[tuple[torch.Tensor, torch.Tensor]],
    fmt: StoredDtype,
    seconds: float,
) -> None:
    """Write and index hidden shard ``batch``: ``states[i] = (aux [T_i, n*H], last [T_i, H])``
    of ``recs[i]``'s prompt + response tokens (layout: ``cache_hidden_states``). The shard
    is written to a temp folder and renamed before its index line is appended."""
    seqs = [r.prompt_ids + r.response_ids for r in recs]
    for s, (aux, last) in zip(seqs, states, strict=True):
        if aux.shape[0] != len(s) or last.shape[0] != len(s):
            raise ValueError(
                f"hidden shard {batch}: {aux.shape[0]} / {last.shape[0]} state rows for a "
                f"sequence of {len(s)} tokens"
            )
    name = f"shard-{batch:05d}"
    tmp = root / (name + ".tmp")
    if tmp.exists():
        for f in tmp.iterdir():
            f.unlink()
    tmp.mkdir(parents=True, exist_ok=True)
    lengths = np.array([len(s) for s in seqs], dtype=np.int64)
    np.save(tmp / "tokens.npy", np.array([t for s in seqs for t in s], dtype=np.int32))
    np.save(
        tmp / fmt.file("aux"), np.concatenate([_encode_checked(a, fmt, root) for a, _ in states])
    )
    np.save(
        tmp / fmt.file("last"), np.concatenate([_encode_checked(b, fmt, root) for _, b in states])
    )
    np.save(tmp / "offsets.npy", np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64))
    np.save(tmp / "response_start.npy", np.array([len(r.prompt_ids) for r in recs], np.int64))
    (tmp / "ids.json").write_text(json.dumps([r.id for r in recs]))
    final = root / name
    if final.exists():  # an unindexed leftover from a crash
        for f in final.iterdir():
            f.unlink()
        final.rmdir()
    os.replace(tmp, final)
    _append_index(
        root,
        IndexEntry(
            name,
            batch,
            [r.id for r in recs],
            _shard_digest(final),
            int(lengths.sum()),
            round(seconds, 3),
        ),
    )


def cache_hidden_states(
    model: PreTrainedModel,
    out_dir: str | Path,
    layer_ids: Sequence[int],
    *,
    batch_size: int = 4,
    pad_token_id: int = 0,
    progress: bool = True,
    dtype: str | None = None,
) -> Path:
    """Run the target over every indexed response shard, writing bfloat16 hidden shards.

    Each hidden shard ``hidden/shard-NNNNN/`` holds ``tokens.npy`` (int32,
    ``[N]`` all sequences concatenated), ``aux.bf16.npy`` (``[N, n*H]``),
    ``last.bf16.npy`` (``[N, H]``), both the uint16 bit patterns of bfloat16
    (``hidden_format``), ``offsets.npy`` (int64 ``[n+1]``), ``response_start.npy``
    (int64 ``[n]``) and ``ids.json``. Resumable per shard. ``dtype`` (None: bfloat16, or
    the dtype an existing cache in ``out_dir`` was begun in) may be ``float16``: the
    arrays are then ``aux.npy`` / ``last.npy`` in numpy float16, as caches were before,
    and a state beyond float16's range is refused rather than stored as infinity.

    Before any shard is written the size of what this call writes is printed and stored
    in ``hidden/size.json``; the states' bytes written equal its ``bytes`` exactly.
    """
    out_dir = Path(out_dir)
    resp_root = out_dir / RESPONSES_DIR
    root, fmt = open_hidden_cache(out_dir, layer_ids, int(model.config.hidden_size), dtype)
    done = read_index(root)
    responses = read_index(resp_root)
    model.eval()
    device = next(model.parameters()).device
    todo = [(b, e) for b, e in sorted(responses.items()) if b not in done]
    bar = tqdm(
        total=len(responses),
        initial=len(responses) - len(todo),
        desc="hidden",
        unit="shard",
        disable=not progress,
    )
    for b, entry in todo:
        recs = _shard_records(resp_root / entry.shard)
        seqs = [r.prompt_ids + r.response_ids for r in recs]
        states: list[tuple[torch.Tensor, torch.Tensor]] = []
        t0 = time.perf_counter()
        for start in range(0, len(seqs), batch_size):
            chunk = seqs[start : start + batch_size]
            width = max(len(s) for s in chunk)
            ids = torch.full((len(chunk), width), int(pad_token_id), dtype=torch.long)
            mask = torch.zeros((len(chunk), width), dtype=torch.long)
            for j, s in enumerate(chunk):
                ids[j, : len(s)] = torch.tensor(s)
                mask[j, : len(s)] = 1
            aux, last = target_hidden_states(model, ids.to(device), mask.to(device), layer_ids)
            states.extend((aux[j, : len(s)], last[j, : len(s)]) for j, s in enumerate(chunk))
        write_hidden_shard(root, b, recs, states, fmt, time.perf_counter() - t0)
        bar.update(1)
    bar.close()
    return root
