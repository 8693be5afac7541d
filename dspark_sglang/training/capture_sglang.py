"""``data.hidden_states: sglang``: the hidden cache written from SGLang's own regeneration pass.

The data stage starts SGLang's ``Engine`` (``data.generator: sglang``, tensor-parallel with
``data.sglang_args.tp_size``) as a capture engine (``sglang_integration.hidden_capture``):
every regeneration request also returns, per forwarded token, the target's decoder-layer
outputs at ``target.layer_ids`` and its final-normed state. So the states come out of the
forward passes that sample the responses; no second target pass, and no process ever holds
the whole target outside SGLang's sharding.

Invariants:

* The cache has the layout and manifest of ``datagen_hidden.cache_hidden_states`` plus
  ``"captured_by": "sglang"`` (a directory never mixes HF-forward and captured states) and
  ``"target"`` (the target's name: a rerun or a train stage on another target is refused),
  so ``HiddenCache`` and the trainer read it unchanged.
* Row ``t`` of a sequence holds the states of token ``t`` (prompt then response), as the
  HF forward's. The last token of every sequence is never forwarded while sampling
  (nothing follows it), so its row is zero, written the same way by the fill pass below.
  No training read touches it: anchors are at most ``T - 2`` (``anchors.anchor_candidates``),
  a slot's target state is at ``p + k <= T - 2`` for every valid slot, and the drafter's
  context is the positions before its anchor.
* Memory is bounded by ``data.max_in_flight``: SGLang returns a window's rows together, as
  Python lists (about 32 bytes a value, ``(len(layer_ids) + 1) x hidden size`` values a
  token); each shard's are packed to float32 at once and written as its response shard is.
  Lower ``max_in_flight`` for a large target.
* Resumable with the response shards: a response shard is written and indexed first, its
  hidden shard right after. A response shard indexed without a hidden shard (a kill in
  between, or responses generated before this mode was chosen) is filled by a prefill of
  its prompt + response on the same engine (``fill_missing``).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from dspark_sglang.model.config import TargetSpec
from dspark_sglang.sglang_integration.hidden_capture import FINAL_STATE_ENV
from dspark_sglang.training.datagen import GenerationSettings, ResponseRecord, ShardSampler
from dspark_sglang.training.datagen_hidden import open_hidden_cache, write_hidden_shard
from dspark_sglang.training.datagen_store import RESPONSES_DIR, _shard_records, read_index
from dspark_sglang.training.regen_sglang import engine_sampler

#: What the hidden manifest records for a cache captured here (with the target's name).
CAPTURED_BY = "sglang"

States = tuple[torch.Tensor, torch.Tensor]


def packed_rows(hidden: Sequence[Any] | np.ndarray) -> np.ndarray:
    """A request's ``meta_info["hidden_states"]`` (a list per forward) as one float32
    ``[rows, W]`` array; an array is returned as it is."""
    if isinstance(hidden, np.ndarray):
        return hidden
    parts = [np.atleast_2d(np.asarray(h, dtype=np.float32)) for h in hidden]
    return np.concatenate(parts, 0) if parts else np.zeros((0, 0), np.float32)


def rows_to_states(
    hidden: Sequence[Any] | np.ndarray, num_layers: int, hidden_size: int, num_tokens: int
) -> States:
    """``(aux [T, n*H], last [T, H])`` float32 from a request's ``meta_info["hidden_states"]``.

    ``hidden`` is SGLang's list of forwards (a prefill's rows ``[P, W]``, a decode step's
    row ``[W]``) of width ``W = (n + 1) * H``. Rows past ``T - 1`` (an output cut at EOS)
    are dropped; the last token's row is zero (module invariants). Anything else is
    refused naming the server setting that produces it.
    """
    rows = packed_rows(hidden)
    want = (num_layers + 1) * hidden_size
    if rows.shape[1] == num_layers * hidden_size:
        raise ValueError(
            "the SGLang server returned the aux states without the final-normed state: start "
            f"it with {FINAL_STATE_ENV}=1 in its environment (this package's plugin adds the "
            "state; sglang_integration.hidden_capture)"
        )
    if rows.shape[1] != want:
        raise ValueError(
            f"the SGLang server returned hidden-state rows of width {rows.shape[1]}, expected "
            f"{want} = ({num_layers} layers of target.layer_ids + the final state) x "
            f"hidden size {hidden_size}: start it with --enable-return-aux-hidden-states "
            "--speculative-algorithm DSPARK --return-aux-hidden-state-layer-ids set to "
            "target.layer_ids (hidden_capture.capture_server_args)"
        )
    if rows.shape[0] < num_tokens - 1:
        raise ValueError(
            f"the SGLang server returned {rows.shape[0]} hidden-state rows for a sequence of "
            f"{num_tokens} tokens (expected at least {num_tokens - 1}); is its radix cache "
            "on? Start it with --disable-radix-cache"
        )
    out = torch.zeros(num_tokens, want, dtype=torch.float32)
    out[: num_tokens - 1] = torch.from_numpy(rows[: num_tokens - 1])
    split = num_layers * hidden_size
    return out[:, :split], out[:, split:]


class CaptureWriter:
    """Writes hidden shard ``b`` once its response shard is indexed (``after_shard``)."""

    def __init__(
        self,
        out_dir: Path,
        layer_ids: Sequence[int],
        target: TargetSpec,
        dtype: str | None = None,
    ) -> None:
        self.out_dir = Path(out_dir)
        self.num_layers = len(layer_ids)
        self.hidden_size = int(target.hidden_size)
        pinned = {"captured_by": CAPTURED_BY, "target": target.name}
        self.root, self.fmt = open_hidden_cache(
            self.out_dir, layer_ids, self.hidden_size, dtype, pinned
        )
        self._pending: dict[int, tuple[list[Any], float]] = {}

    def hold(self, batch: int, hidden: list[Any], seconds: float) -> None:
        """Keep batch ``batch``'s rows until its response shard is written, packed into
        float32 arrays at once (SGLang's Python lists take about 32 bytes a value)."""
        self._pending[batch] = ([packed_rows(h) for h in hidden], seconds)

    def after_shard(self, batch: int, records: Sequence[ResponseRecord]) -> None:
        """Write the hidden shard of the response shard just indexed."""
        hidden, seconds = self._pending.pop(batch)
        self.write(batch, records, hidden, seconds)

    def write(
        self, batch: int, records: Sequence[ResponseRecord], hidden: list[Any], seconds: float
    ) -> None:
        states = [
            rows_to_states(
                h, self.num_layers, self.hidden_size, len(r.prompt_ids) + len(r.response_ids)
            )
            for r, h in zip(records, hidden, strict=True)
        ]
        write_hidden_shard(self.root, batch, records, states, self.fmt, seconds)


def capture_sampler(
    engine: Any,
    settings: GenerationSettings,
    eos_token_ids: Sequence[int],
    max_in_flight: int,
    writer: CaptureWriter,
) -> ShardSampler:
    """``regen_sglang.engine_sampler`` that also asks for each request's hidden states and
    hands them to ``writer`` (written once ``regenerate_responses`` has the shard)."""
    return engine_sampler(engine, settings, eos_token_ids, max_in_flight, on_hidden=writer.hold)


def fill_missing(engine: Any, writer: CaptureWriter, max_in_flight: int) -> int:
    """Capture, by prefilling prompt + response, every indexed response shard that has no
    hidden shard; returns how many it wrote (module invariants)."""
    resp_root = writer.out_dir / RESPONSES_DIR
    done = read_index(writer.root)
    missing = [(b, e) for b, e in sorted(read_index(resp_root).items()) if b not in done]
    for b, entry in missing:
        records = _shard_records(resp_root / entry.shard)
        t0 = time.perf_counter()
        hidden: list[Any] = []
        for start in range(0, len(records), max_in_flight):
            chunk = records[start : start + max_in_flight]
            outs = engine.generate(
                input_ids=[r.prompt_ids + r.response_ids for r in chunk],
                sampling_params=[{"temperature": 0.0, "max_new_tokens": 1}] * len(chunk),
                return_hidden_states=True,
            )
            # One output token: no decode step, every entry is a prefill chunk's rows.
            hidden.extend(packed_rows(o["meta_info"]["hidden_states"]) for o in outs)
        writer.write(b, records, hidden, time.perf_counter() - t0)
    return len(missing)
