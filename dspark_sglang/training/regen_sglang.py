"""Response regeneration through SGLang's in-process ``Engine`` (``data.generator: sglang``).

The engine users deploy samples the training responses; the shards, index and manifest
are written by ``datagen.regenerate_responses`` exactly as for HF ``generate``, so the
hidden-state cache and the trainer cannot tell who sampled.

Invariants:

* Every request samples at ``data.temperature`` (1 unless set; 0 is SGLang's greedy
  decoding) with no top-k / top-p / min-p (the drafter must learn the target's true
  distribution), stops at the target's EOS ids or after
  ``max_new_tokens``, and carries ``sampling_seed = seed_for_prompt(data.seed, prompt id)``:
  a pure function of the prompt, never of its batch, window or arrival order.
* SGLang 0.5.23 honours ``sampling_seed`` only when the engine runs with
  ``enable_deterministic_inference`` (batch-invariant kernels; on a GPU with the fa3,
  flashinfer or triton attention backend). Its CPU engine (``intel_amx`` attention)
  refuses that mode, so on CPU the seed is sent but ignored: a shard regenerated after a
  kill is a fresh sample from the same distribution, not a byte-identical copy. Shards
  already indexed are never regenerated, on any device.
* Shards are yielded in batch order as soon as every prompt of theirs has come back; at
  most ``max_in_flight`` prompts (whole shards, at least one) are submitted at a time, so
  a kill loses at most that window.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from dspark_sglang.training.datagen import (
    GenerationSettings,
    ShardSampler,
    ShardWork,
    seed_for_prompt,
)


def sampling_params(
    settings: GenerationSettings, prompt_id: str, eos_token_ids: Sequence[int]
) -> dict[str, Any]:
    """SGLang's native sampling parameters for one training prompt (module invariants)."""
    return {
        "temperature": float(settings.temperature),
        "top_p": 1.0,
        "top_k": -1,
        "min_p": 0.0,
        "max_new_tokens": settings.max_new_tokens,
        "stop_token_ids": sorted({int(e) for e in eos_token_ids}),
        "ignore_eos": False,
        "sampling_seed": seed_for_prompt(settings.seed, prompt_id),
    }


def windows(todo: Sequence[ShardWork], max_in_flight: int) -> Iterator[list[ShardWork]]:
    """Consecutive shards grouped so a group holds at most ``max_in_flight`` prompts
    (a shard larger than that is a group alone): the unit submitted at once."""
    group: list[ShardWork] = []
    size = 0
    for work in todo:
        n = len(work[1])
        if group and size + n > max_in_flight:
            yield group
            group, size = [], 0
        group.append(work)
        size += n
    if group:
        yield group


def split_seconds(
    shards: Sequence[ShardWork], outputs: Sequence[Sequence[int]], seconds: float
) -> list[float]:
    """A window's wall time shared out over its shards by generated tokens, so the index's
    seconds still sum to the time spent (``datagen.throughput``)."""
    counts = []
    i = 0
    for _, batch in shards:
        counts.append(sum(len(o) for o in outputs[i : i + len(batch)]))
        i += len(batch)
    total = sum(counts)
    return [seconds * (c / total if total else 1 / len(shards)) for c in counts]


def engine_sampler(
    engine: Any,
    settings: GenerationSettings,
    eos_token_ids: Sequence[int],
    max_in_flight: int,
    on_hidden: Callable[[int, list[Any], float], None] | None = None,
) -> ShardSampler:
    """A ``ShardSampler`` over a started ``sglang.Engine`` (token ids in, token ids out).

    With ``on_hidden`` every request also asks for its hidden states (a capture engine,
    ``capture_sglang``), and ``on_hidden(batch, rows per prompt, seconds)`` gets each shard's
    before the shard is yielded."""

    def sample(todo: Sequence[ShardWork]) -> Iterator[tuple[int, list[list[int]], float]]:
        extra = {"return_hidden_states": True} if on_hidden is not None else {}
        for group in windows(todo, max_in_flight):
            prompts = [p for _, batch in group for p in batch]
            t0 = time.perf_counter()
            outs = engine.generate(
                input_ids=[list(p.prompt_ids) for p in prompts],
                sampling_params=[sampling_params(settings, p.id, eos_token_ids) for p in prompts],
                **extra,
            )
            seconds = time.perf_counter() - t0
            ids = [list(o["output_ids"]) for o in outs]
            i = 0
            for (b, batch), secs in zip(group, split_seconds(group, ids, seconds), strict=True):
                if on_hidden is not None:
                    rows = [o["meta_info"]["hidden_states"] for o in outs[i : i + len(batch)]]
                    on_hidden(b, rows, secs)
                yield b, ids[i : i + len(batch)], secs
                i += len(batch)

    return sample


@dataclass(frozen=True)
class EngineSettings:
    """How the in-process engine is started: the target folder on ``device`` (cpu, cuda or
    cuda:N) at ``dtype``, SGLang's RNG seeded with ``seed``, ``threads`` OpenMP threads per
    CPU scheduler, plus ``extra`` ``sglang.Engine`` arguments (``data.sglang_args``) and
    ``env``, set in the engine's processes (a capture engine's, ``capture_sglang``)."""

    model_path: str
    device: str = "cpu"
    dtype: str = "float32"
    seed: int = 0
    threads: int = 1
    extra: Mapping[str, Any] = field(default_factory=dict)
    env: Mapping[str, str] = field(default_factory=dict)

    def engine_kwargs(self) -> dict[str, Any]:
        """``sglang.Engine`` arguments for a GPU (the CPU path uses ``CpuEngineSpec``)."""
        kind, _, index = self.device.partition(":")
        return {
            "model_path": self.model_path,
            "device": kind,
            "base_gpu_id": int(index or 0),
            "dtype": self.dtype,
            "random_seed": self.seed,
            "log_level": "warning",
            **dict(self.extra),
        }


@contextlib.contextmanager
def open_engine(settings: EngineSettings) -> Iterator[Any]:
    """A started ``sglang.Engine`` for regeneration, always shut down and reaped by PID.

    On CPU it is the project's CPU engine (``CpuEngineSpec`` defaults: ``intel_amx``
    attention, ``pytorch`` sampling); on CUDA SGLang's own defaults.
    """
    from dspark_sglang.sglang_integration.engine import (
        CpuEngineSpec,
        cpu_engine,
        managed_engine,
    )

    if settings.device == "cpu":
        spec = CpuEngineSpec(
            model_path=settings.model_path,
            overrides={
                "dtype": settings.dtype,
                "random_seed": settings.seed,
                **dict(settings.extra),
            },
            omp_threads=settings.threads,
            env=dict(settings.env),
        )
        with cpu_engine(spec) as engine:
            yield engine
    else:
        with managed_engine(settings.engine_kwargs(), dict(settings.env)) as engine:
            yield engine
