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

This module holds the first pass (settings, seeds, the shard writer and the HF
sampler); the shared on-disk layout (directory names, records, index, manifest,
``load_responses``, ``throughput``) is in ``datagen_store``, the second pass in
``datagen_hidden``. Every public name is importable from here too.
"""

from __future__ import annotations

import copy
import hashlib
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import msgspec
import torch
from tqdm.auto import tqdm
from transformers import GenerationConfig, PreTrainedModel

from dspark_sglang.training.config_checks import COMPUTE_DTYPES
from dspark_sglang.training.config_data import GENERATORS, check_data_temperature
from dspark_sglang.training.datagen_hidden import (
    cache_hidden_states,
    check_layer_ids,
    hidden_cache_size,
    target_hidden_states,
)
from dspark_sglang.training.datagen_store import (
    HIDDEN_DIR,
    INDEX_FILE,
    MANIFEST_FILE,
    RESPONSES_DIR,
    SIZE_FILE,
    IndexEntry,
    ResponseRecord,
    _append_index,
    _atomic_write_bytes,
    _check_manifest,
    _sha256,
    load_responses,
    read_index,
    throughput,
)

__all__ = [
    "HIDDEN_DIR",
    "INDEX_FILE",
    "MANIFEST_FILE",
    "RESPONSES_DIR",
    "SIZE_FILE",
    "EncodedPrompt",
    "GenerationSettings",
    "IndexEntry",
    "ResponseRecord",
    "ShardSampler",
    "ShardWork",
    "cache_hidden_states",
    "check_layer_ids",
    "generate_responses",
    "hf_sampler",
    "hidden_cache_size",
    "left_pad",
    "load_responses",
    "read_index",
    "regenerate_responses",
    "seed_for",
    "seed_for_prompt",
    "target_hidden_states",
    "throughput",
]


class EncodedPrompt(msgspec.Struct, frozen=True):
    """A training prompt as the target sees it (chat template applied)."""

    id: str
    domain: str
    prompt_ids: list[int]


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
    after_shard: Callable[[int, list[ResponseRecord]], None] | None = None,
) -> list[ResponseRecord]:
    """Write every not-yet-indexed shard that ``sample`` produces; resumable (module docstring).

    Shared by all generators, so the on-disk format (shards, index, manifest) cannot
    depend on who sampled. ``max_batches`` stops after that many *new* batches (used to
    size runs and to test resumption). ``after_shard(batch, records)`` runs once a shard
    is indexed (``capture_sglang`` writes its hidden shard there). Returns all records so
    far, in prompt order.
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
        if after_shard is not None:
            after_shard(b, records)
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
