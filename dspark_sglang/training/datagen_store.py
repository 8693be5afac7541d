"""The on-disk layout both data passes share: append-only shards, an index, a manifest.

A pass writes each shard to a temp file (or folder) and renames it before appending
its ``IndexEntry`` line to ``index.jsonl``, so a crash leaves either a complete,
indexed shard or nothing the index knows about; ``read_index`` keeps only entries
whose shard still matches its digest. ``manifest.json`` pins the settings a directory
was produced with (``_check_manifest`` refuses a resume with different ones). Also
here: reading the response records back and the throughput a pass's index records.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import msgspec

RESPONSES_DIR = "responses"
HIDDEN_DIR = "hidden"
INDEX_FILE = "index.jsonl"
MANIFEST_FILE = "manifest.json"
#: The hidden pass's size report (``HiddenCacheSize.as_dict``), in ``hidden/``.
SIZE_FILE = "size.json"


class ResponseRecord(msgspec.Struct, frozen=True):
    """One regenerated sample. ``finished``: the response ends with an EOS token."""

    id: str
    domain: str
    prompt_ids: list[int]
    response_ids: list[int]
    finished: bool


class IndexEntry(msgspec.Struct, frozen=True):
    """One line of a pass's ``index.jsonl``: a complete shard and what it holds."""

    shard: str
    batch: int
    ids: list[str]
    sha256: str
    tokens: int
    seconds: float


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _atomic_write_bytes(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def _check_manifest(directory: Path, manifest: dict[str, object]) -> None:
    path = directory / MANIFEST_FILE
    if path.exists():
        old = json.loads(path.read_text())
        diff = sorted(k for k in set(old) | set(manifest) if old.get(k) != manifest.get(k))
        if diff:
            raise ValueError(
                f"{directory} was produced with different settings ({diff}); use a new "
                f"output directory or delete {directory} to start over"
            )
    else:
        directory.mkdir(parents=True, exist_ok=True)
        _atomic_write_bytes(path, json.dumps(manifest, indent=2, sort_keys=True).encode())


def read_index(directory: Path) -> dict[int, IndexEntry]:
    """Completed shards of a pass by batch number (entries whose file is intact)."""
    path = directory / INDEX_FILE
    done: dict[int, IndexEntry] = {}
    if not path.exists():
        return done
    decoder = msgspec.json.Decoder(IndexEntry)
    for line in path.read_bytes().splitlines():
        if not line.strip():
            continue
        try:
            entry = decoder.decode(line)
        except msgspec.DecodeError:
            continue  # a torn final line from a crash mid-append
        shard = directory / entry.shard
        if shard.exists() and _shard_digest(shard) == entry.sha256:
            done[entry.batch] = entry
    return done


def _shard_digest(shard: Path) -> str:
    if shard.is_dir():
        h = hashlib.sha256()
        for f in sorted(shard.iterdir()):
            h.update(f.name.encode())
            h.update(_sha256(f).encode())
        return h.hexdigest()
    return _sha256(shard)


def _append_index(directory: Path, entry: IndexEntry) -> None:
    path = directory / INDEX_FILE
    torn = path.exists() and path.stat().st_size > 0 and not path.read_bytes().endswith(b"\n")
    with open(path, "ab") as fh:
        # A crash mid-append leaves a torn last line; start a fresh line after it.
        fh.write((b"\n" if torn else b"") + msgspec.json.encode(entry) + b"\n")
        fh.flush()
        os.fsync(fh.fileno())


def load_responses(out_dir: str | Path) -> list[ResponseRecord]:
    """All indexed response records, in batch (= prompt) order."""
    root = Path(out_dir) / RESPONSES_DIR
    decoder = msgspec.json.Decoder(ResponseRecord)
    records: list[ResponseRecord] = []
    for _, entry in sorted(read_index(root).items()):
        for line in (root / entry.shard).read_bytes().splitlines():
            records.append(decoder.decode(line))
    return records


def _shard_records(path: Path) -> list[ResponseRecord]:
    decoder = msgspec.json.Decoder(ResponseRecord)
    return [decoder.decode(x) for x in path.read_bytes().splitlines()]


def throughput(directory: str | Path) -> dict[str, float]:
    """Tokens, seconds and tokens/s summed over a pass's index (for sizing runs)."""
    entries = read_index(Path(directory)).values()
    tokens = sum(e.tokens for e in entries)
    seconds = sum(e.seconds for e in entries)
    return {
        "tokens": float(tokens),
        "seconds": seconds,
        "tokens_per_s": tokens / seconds if seconds > 0 else 0.0,
    }
