"""Training data from the target itself: regenerated responses, then cached hidden states.

Two resumable passes, both organised as *append-only shards + an index*:

1. ``regenerate_responses``: prompts (already token ids, encoded with the
   target's chat template) are cut into shards of ``batch_size`` in a fixed
   order and sampled by the target at ``data.temperature`` (default 1, no
   top-k/top-p: the drafter must learn the target's true distribution; 0 takes
   the target's greedy continuation, for drafters of greedy-only tiers). Who samples is a
   ``ShardSampler`` (``data.generator``): HF ``generate`` here (``hf_sampler``,
   left-padded batches; ``generate_responses``), SGLang's Engine
   (``regen_sglang``) or SGLang servers (``regen_openai``); the shard writer is
   the same, so the format cannot depend on it. HF batch ``i`` is seeded with
   ``seed_for(seed, i)``, so its output depends only on its prompts and its
   index: re-running after a kill skips indexed batches and regenerates the rest
   to byte-identical shards (SGLang: per-prompt seeds, see ``regen_sglang`` for
   when they are honoured). A shard is written to a temp file and renamed
   before its index line is appended, so a crash leaves either a complete,
   indexed shard or nothing the index knows about.
2. ``cache_hidden_states``: every response shard gets a hidden shard holding,
   per token, the target's decoder-layer outputs at ``layer_ids``
   (HF ``hidden_states[l + 1]``, concatenated) and the last hidden state
   (after the final norm, i.e. what the LM head consumes) in bfloat16
   (``hidden_format``; caches begun in float16 stay float16). Logits
   are never stored: the trainer recomputes target logits from the last hidden
   state with the frozen LM head at the sampled positions only (V = 49152 would
   make a logits cache ~85x larger). Before it writes anything the pass reports
   the bytes it will write (``HiddenCacheSize``, also in ``hidden/size.json``).
   With ``data.hidden_states: online`` the pass is skipped: the trainer computes
   the same states inside each step (``training/online.py``).

A ``manifest.json`` pins the settings a directory was produced with; resuming
with different settings is refused with the mismatching keys named.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import msgspec
import numpy as np
import torch
from tqdm.auto import tqdm
from transformers import GenerationConfig, PreTrainedModel

from dspark_sglang.training.config import COMPUTE_DTYPES, GENERATORS, check_data_temperature
from dspark_sglang.training.hidden_format import (
    DEFAULT_CACHE_DTYPE,
    STORED_DTYPES,
    HiddenCacheSize,
    StoredDtype,
    encode,
    stored_dtype,
)

RESPONSES_DIR = "responses"
HIDDEN_DIR = "hidden"
INDEX_FILE = "index.jsonl"
MANIFEST_FILE = "manifest.json"
#: The hidden pass's size report (``HiddenCacheSize.as_dict``), in ``hidden/``.
SIZE_FILE = "size.json"


class EncodedPrompt(msgspec.Struct, frozen=True):
    """A training prompt as the target sees it (chat template applied)."""

    id: str
    domain: str
    prompt_ids: list[int]


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


@dataclass(frozen=True)
class GenerationSettings:
    """How responses are sampled; stored in the manifest and checked on resume."""

    max_new_tokens: int = 256
    batch_size: int = 8
    temperature: float = 1.0
    seed: int = 0
    dtype: str = "float32"  # the sampling model's precision (a bfloat16 copy when set)
    generator: str = "hf"  # who samples: HF generate, SGLang's Engine, or SGLang servers

    def __post_init__(self) -> None:
        if not (isinstance(self.max_new_tokens, int) and self.max_new_tokens >= 1):
            raise ValueError(
                f"data.max_new_tokens must be an int >= 1, got {self.max_new_tokens!r}"
            )
        if not (isinstance(self.batch_size, int) and self.batch_size >= 1):
            raise ValueError(f"data.gen_batch_size must be an int >= 1, got {self.batch_size!r}")
        check_data_temperature(self.temperature)
        if self.dtype not in COMPUTE_DTYPES:
            raise ValueError(f"data.gen_dtype must be one of {COMPUTE_DTYPES}, got {self.dtype!r}")
        if self.generator not in GENERATORS:
            raise ValueError(f"data.generator must be one of {GENERATORS}, got {self.generator!r}")

    def manifest(self) -> dict[str, object]:
        """The settings as pinned in a manifest. ``dtype`` and ``generator`` are left out
        at their defaults (float32, hf) so directories produced before they existed still
        resume."""
        out: dict[str, object] = asdict(self)
        if self.dtype == "float32":
            del out["dtype"]
        if self.generator == "hf":
            del out["generator"]
        return out


def seed_for(seed: int, batch: int) -> int:
    """Per-batch seed; a pure function so any batch can be regenerated alone."""
    digest = hashlib.sha256(f"{seed}:{batch}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & 0x7FFF_FFFF_FFFF_FFFF


def seed_for_prompt(seed: int, prompt_id: str) -> int:
    """Per-request seed of the SGLang generators: a pure function of ``(seed, prompt id)``,
    so a prompt's sample does not depend on which batch or server it went to."""
    digest = hashlib.sha256(f"{seed}:prompt:{prompt_id}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & 0x7FFF_FFFF_FFFF_FFFF


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


def _batches(n: int, size: int) -> Iterator[tuple[int, range]]:
    for b, start in enumerate(range(0, n, size)):
        yield b, range(start, min(n, start + size))


def _truncate_at_eos(ids: list[int], eos: set[int]) -> tuple[list[int], bool]:
    """Cut after the first EOS. HF pads only *after* a row's EOS, so a row without
    EOS has exactly ``max_new_tokens`` real tokens (a sampled pad id stays)."""
    for j, t in enumerate(ids):
        if t in eos:
            return ids[: j + 1], True
    return ids, False


def left_pad(rows: Sequence[Sequence[int]], pad_token_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(input_ids, attention_mask)`` ``[N, max_len]``, prompts flush right.

    Decoder-only ``generate`` appends after the last column, so every prompt must end
    there; right padding would put pad tokens between a prompt and its response.
    """
    width = max(len(r) for r in rows)
    input_ids = torch.full((len(rows), width), int(pad_token_id), dtype=torch.long)
    attn = torch.zeros((len(rows), width), dtype=torch.long)
    for j, r in enumerate(rows):
        input_ids[j, width - len(r) :] = torch.tensor(list(r), dtype=torch.long)
        attn[j, width - len(r) :] = 1
    return input_ids, attn


#: ``(batch number, its prompts)``: one shard's worth of work.
ShardWork = tuple[int, Sequence[EncodedPrompt]]
#: A generator's sampling function: given the shards still to do (in order), yields
#: ``(batch number, one continuation per prompt, seconds spent)`` per shard, in order.
#: A continuation may run past an EOS (HF pads after it); it is cut after the first one.
ShardSampler = Callable[[Sequence[ShardWork]], Iterator[tuple[int, list[list[int]], float]]]


def regenerate_responses(
    sample: ShardSampler,
    prompts: Sequence[EncodedPrompt],
    out_dir: str | Path,
    settings: GenerationSettings,
    *,
    pad_token_id: int,
    eos_token_ids: Sequence[int],
    max_batches: int | None = None,
    progress: bool = True,
) -> list[ResponseRecord]:
    """Write every not-yet-indexed shard that ``sample`` produces; resumable (module docstring).

    Shared by all generators, so the on-disk format (shards, index, manifest) cannot
    depend on who sampled. ``max_batches`` stops after that many *new* batches (used to
    size runs and to test resumption). Returns all records so far, in prompt order.
    """
    root = Path(out_dir) / RESPONSES_DIR
    ids = [p.id for p in prompts]
    if len(set(ids)) != len(ids):
        raise ValueError("prompt ids must be unique (resumption keys shards by prompt id)")
    manifest = {
        **settings.manifest(),
        "prompts_sha256": hashlib.sha256(msgspec.json.encode(list(prompts))).hexdigest(),
        "num_prompts": len(prompts),
        "eos_token_ids": sorted(int(e) for e in eos_token_ids),
        "pad_token_id": int(pad_token_id),
    }
    _check_manifest(root, manifest)
    done = read_index(root)
    eos = {int(e) for e in eos_token_ids}
    batches = list(_batches(len(prompts), settings.batch_size))
    todo = [(b, [prompts[i] for i in r]) for b, r in batches if b not in done]
    bar = tqdm(
        total=len(batches),
        initial=len(batches) - len(todo),
        desc=f"generate ({settings.generator})",
        unit="batch",
        disable=not progress,
    )
    if max_batches is not None:
        todo = todo[:max_batches]
    work = dict(todo)
    for b, continuations, seconds in sample(todo):
        batch = work.pop(b)
        if len(continuations) != len(batch):
            raise RuntimeError(
                f"the {settings.generator} generator returned {len(continuations)} responses "
                f"for the {len(batch)} prompts of batch {b}"
            )
        records = []
        for p, cont in zip(batch, continuations, strict=True):
            resp, finished = _truncate_at_eos([int(t) for t in cont], eos)
            records.append(ResponseRecord(p.id, p.domain, list(p.prompt_ids), resp, finished))
        name = f"shard-{b:05d}.jsonl"
        data = b"".join(msgspec.json.encode(r) + b"\n" for r in records)
        _atomic_write_bytes(root / name, data)
        tokens = sum(len(r.response_ids) for r in records)
        _append_index(
            root,
            IndexEntry(
                name, b, [p.id for p in batch], _sha256(root / name), tokens, round(seconds, 3)
            ),
        )
        bar.update(1)
        bar.set_postfix(tok_s=f"{tokens / max(seconds, 1e-9):.0f}")
    bar.close()
    if work:
        raise RuntimeError(
            f"the {settings.generator} generator stopped before batches {sorted(work)}"
        )
    return load_responses(out_dir)


def hf_sampler(
    model: PreTrainedModel, settings: GenerationSettings, *, pad_token_id: int, eos: Sequence[int]
) -> ShardSampler:
    """HF ``generate`` on left-padded batches; batch ``b`` is seeded with ``seed_for(seed, b)``."""
    greedy = settings.temperature == 0
    sampling = {} if greedy else {"temperature": float(settings.temperature)}
    gen_cfg = GenerationConfig(
        do_sample=not greedy,
        **sampling,
        top_k=0,
        top_p=1.0,
        max_new_tokens=settings.max_new_tokens,
        pad_token_id=int(pad_token_id),
        eos_token_id=sorted({int(e) for e in eos}),
    )
    model.eval()
    device = next(model.parameters()).device
    if settings.dtype != "float32":
        # A copy, never an in-place cast: the caller's float32 target goes on to cache
        # hidden states, and a bfloat16 round trip would have rounded its weights.
        model = copy.deepcopy(model).to(getattr(torch, settings.dtype))

    @torch.no_grad()
    def sample(todo: Sequence[ShardWork]) -> Iterator[tuple[int, list[list[int]], float]]:
        for b, batch in todo:
            input_ids, attn = left_pad([p.prompt_ids for p in batch], pad_token_id)
            width = input_ids.shape[1]
            torch.manual_seed(seed_for(settings.seed, b))
            t0 = time.perf_counter()
            out = model.generate(
                input_ids=input_ids.to(device),
                attention_mask=attn.to(device),
                generation_config=gen_cfg,
            )
            seconds = time.perf_counter() - t0
            yield b, [out[j, width:].tolist() for j in range(len(batch))], seconds

    return sample


def generate_responses(
    model: PreTrainedModel,
    prompts: Sequence[EncodedPrompt],
    out_dir: str | Path,
    settings: GenerationSettings,
    *,
    pad_token_id: int,
    eos_token_ids: Sequence[int],
    max_batches: int | None = None,
    progress: bool = True,
) -> list[ResponseRecord]:
    """Sample one response per prompt with HF ``generate``; resumable (module docstring)."""
    if settings.generator != "hf":
        raise ValueError(
            f"generate_responses samples with HF generate, but data.generator is "
            f"{settings.generator!r}; use regenerate_responses with that generator's sampler"
        )
    return regenerate_responses(
        hf_sampler(model, settings, pad_token_id=pad_token_id, eos=eos_token_ids),
        prompts,
        out_dir,
        settings,
        pad_token_id=pad_token_id,
        eos_token_ids=eos_token_ids,
        max_batches=max_batches,
        progress=progress,
    )


def load_responses(out_dir: str | Path) -> list[ResponseRecord]:
    """All indexed response records, in batch (= prompt) order."""
    root = Path(out_dir) / RESPONSES_DIR
    decoder = msgspec.json.Decoder(ResponseRecord)
    records: list[ResponseRecord] = []
    for _, entry in sorted(read_index(root).items()):
        for line in (root / entry.shard).read_bytes().splitlines():
            records.append(decoder.decode(line))
    return records


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


# --------------------------------------------------------------------------- hidden states


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


def _shard_records(path: Path) -> list[ResponseRecord]:
    decoder = msgspec.json.Decoder(ResponseRecord)
    return [decoder.decode(x) for x in path.read_bytes().splitlines()]


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
    root = out_dir / HIDDEN_DIR
    fmt = _cache_dtype(root, dtype)
    hidden_size = int(model.config.hidden_size)
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
    }
    if fmt.torch_dtype == torch.bfloat16:
        manifest["storage"] = "uint16 bit patterns of bfloat16"
    _check_manifest(root, manifest)
    _atomic_write_bytes(root / SIZE_FILE, json.dumps(size.as_dict(), indent=2).encode())
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
        aux_parts: list[np.ndarray] = []
        last_parts: list[np.ndarray] = []
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
            for j, s in enumerate(chunk):
                aux_parts.append(_encode_checked(aux[j, : len(s)], fmt, root))
                last_parts.append(_encode_checked(last[j, : len(s)], fmt, root))
        seconds = time.perf_counter() - t0
        name = f"shard-{b:05d}"
        tmp = root / (name + ".tmp")
        if tmp.exists():
            for f in tmp.iterdir():
                f.unlink()
        tmp.mkdir(parents=True, exist_ok=True)
        lengths = np.array([len(s) for s in seqs], dtype=np.int64)
        np.save(tmp / "tokens.npy", np.array([t for s in seqs for t in s], dtype=np.int32))
        np.save(tmp / fmt.file("aux"), np.concatenate(aux_parts, 0))
        np.save(tmp / fmt.file("last"), np.concatenate(last_parts, 0))
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
                b,
                [r.id for r in recs],
                _shard_digest(final),
                int(lengths.sum()),
                round(seconds, 3),
            ),
        )
        bar.update(1)
    bar.close()
    return root
