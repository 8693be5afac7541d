"""The SGLang GPU check's engine-free parts (``benchmarks/gpu_sglang_check.py`` runs it).

``GpuCheckArgs``: the validated settings of one check. ``BatchRun``: one timed
``generate`` call of a mode (plain or DSpark) at one batch size, from SGLang's output
dicts. ``compare``: plain vs DSpark at one batch size (speed-up, SGLang's accepted
length, identical outputs and the first divergence per prompt). ``format_table``,
``result_json`` and ``write_json``: the printed table and the JSON document.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from dspark_sglang.results import fmt_or_dash

DTYPES = ("bfloat16", "float16", "float32")
RAGGED_MODES = ("static", "cap-accept", "compact")


@dataclass(frozen=True)
class GpuCheckArgs:
    """Validated settings of one GPU check (what ``parse_args`` returns)."""

    model: str = "smollm2"
    drafter: Path | None = None
    batch_sizes: tuple[int, ...] = (1, 16)
    new_tokens: int = 128
    tp: int = 1
    dtype: str = "bfloat16"
    mem_fraction_static: float = 0.6
    ragged_verify_mode: str | None = None
    warmup_tokens: int = 16
    out: Path | None = None  # None: a fresh run folder, chosen when the check runs

    def __post_init__(self) -> None:
        if not self.model:
            raise ValueError("--model is empty; pass 'smollm2' or a HF model folder")
        if not self.batch_sizes or any(b < 1 for b in self.batch_sizes):
            raise ValueError(f"--batch-sizes must be positive integers, got {self.batch_sizes}")
        if len(set(self.batch_sizes)) != len(self.batch_sizes):
            raise ValueError(f"--batch-sizes has duplicates: {self.batch_sizes}")
        if self.new_tokens < 1:
            raise ValueError(f"--new-tokens must be >= 1, got {self.new_tokens}")
        if self.tp < 1:
            raise ValueError(f"--tp must be >= 1 (the target's tp_size), got {self.tp}")
        if self.dtype not in DTYPES:
            raise ValueError(f"--dtype must be one of {DTYPES}, got {self.dtype!r}")
        if not 0.0 < self.mem_fraction_static < 1.0:
            raise ValueError(
                f"--mem-fraction-static must be in (0, 1), got {self.mem_fraction_static}"
            )
        if self.ragged_verify_mode is not None and self.ragged_verify_mode not in RAGGED_MODES:
            raise ValueError(
                f"--ragged-verify-mode must be one of {RAGGED_MODES}, "
                f"got {self.ragged_verify_mode!r}"
            )
        if self.warmup_tokens < 1:
            raise ValueError(f"--warmup-tokens must be >= 1, got {self.warmup_tokens}")

    @property
    def num_prompts(self) -> int:
        """Prompts needed: the largest batch (smaller batches take a prefix)."""
        return max(self.batch_sizes)


@dataclass(frozen=True)
class BatchRun:
    """One timed ``generate`` call: a mode at one batch size."""

    mode: str
    batch_size: int
    wall_s: float
    output_ids: tuple[tuple[int, ...], ...]
    verify_ct: int = 0
    correct_drafts: int = 0

    def __post_init__(self) -> None:
        if self.mode not in ("plain", "dspark"):
            raise ValueError(f"BatchRun.mode must be 'plain' or 'dspark', got {self.mode!r}")
        if len(self.output_ids) != self.batch_size:
            raise ValueError(
                f"BatchRun has {len(self.output_ids)} outputs for batch size {self.batch_size}"
            )
        if not self.wall_s > 0.0:
            raise ValueError(f"BatchRun.wall_s must be > 0, got {self.wall_s}")

    @classmethod
    def from_outputs(
        cls, mode: str, wall_s: float, outputs: Sequence[Mapping[str, Any]]
    ) -> BatchRun:
        """From SGLang's output dicts (``output_ids`` and ``meta_info``)."""
        metas = [o.get("meta_info", {}) for o in outputs]
        return cls(
            mode=mode,
            batch_size=len(outputs),
            wall_s=wall_s,
            output_ids=tuple(tuple(int(t) for t in o["output_ids"]) for o in outputs),
            verify_ct=sum(int(m.get("spec_verify_ct", 0) or 0) for m in metas),
            correct_drafts=sum(int(m.get("spec_num_correct_drafts", 0) or 0) for m in metas),
        )

    @property
    def tokens(self) -> int:
        return sum(len(o) for o in self.output_ids)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.wall_s


def first_divergence(a: Sequence[int], b: Sequence[int]) -> int | None:
    """First index where ``a`` and ``b`` differ (length counts), ``None`` if equal."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


@dataclass(frozen=True)
class Comparison:
    """Plain vs DSpark at one batch size."""

    batch_size: int
    plain_tokens_per_s: float
    dspark_tokens_per_s: float
    speedup: float
    accept_length: float | None
    accepted_drafts_per_round: float | None
    identical: int
    divergence: tuple[int | None, ...] = field(default=())

    @property
    def all_identical(self) -> bool:
        return self.identical == self.batch_size


def compare(plain: BatchRun, dspark: BatchRun) -> Comparison:
    """Speed-up, acceptance and output equality of two runs over the same prompts.

    ``accept_length`` is SGLang's definition summed over the batch: emitted
    tokens per verify round (bonus token included), i.e. ``sum completion /
    sum verify_ct``; ``None`` when no verify round ran.
    """
    if (plain.mode, dspark.mode) != ("plain", "dspark"):
        raise ValueError(f"compare(plain, dspark) got modes {plain.mode!r}, {dspark.mode!r}")
    if plain.batch_size != dspark.batch_size:
        raise ValueError(
            f"batch sizes differ: plain {plain.batch_size}, dspark {dspark.batch_size}"
        )
    div = tuple(
        first_divergence(a, b) for a, b in zip(plain.output_ids, dspark.output_ids, strict=True)
    )
    rounds = dspark.verify_ct
    return Comparison(
        batch_size=plain.batch_size,
        plain_tokens_per_s=plain.tokens_per_s,
        dspark_tokens_per_s=dspark.tokens_per_s,
        speedup=dspark.tokens_per_s / plain.tokens_per_s,
        accept_length=dspark.tokens / rounds if rounds else None,
        accepted_drafts_per_round=dspark.correct_drafts / rounds if rounds else None,
        identical=sum(d is None for d in div),
        divergence=div,
    )


def format_table(rows: Sequence[Comparison]) -> str:
    """The human-readable summary printed at the end of a check."""
    header = (
        f"{'batch':>5}  {'plain tok/s':>11}  {'DSpark tok/s':>12}  {'speed-up':>8}  "
        f"{'accept len':>10}  {'drafts/round':>12}  {'identical':>9}"
    )
    lines = [header, "-" * len(header)]
    for r in rows:
        lines.append(
            f"{r.batch_size:>5}  {r.plain_tokens_per_s:>11.1f}  {r.dspark_tokens_per_s:>12.1f}  "
            f"{r.speedup:>7.2f}x  {fmt_or_dash(r.accept_length, '.2f'):>10}  "
            f"{fmt_or_dash(r.accepted_drafts_per_round, '.2f'):>12}  "
            f"{f'{r.identical}/{r.batch_size}':>9}"
        )
    return "\n".join(lines)


def result_json(
    args: GpuCheckArgs,
    rows: Sequence[Comparison],
    *,
    model_path: str,
    drafter: str,
    env: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The JSON document written to ``args.out`` (settings, environment, rows)."""
    settings = asdict(args)
    settings["drafter"] = drafter
    settings["out"] = str(args.out)
    settings["batch_sizes"] = list(args.batch_sizes)
    return {
        "benchmark": "gpu_sglang_check",
        "settings": settings,
        "model_path": model_path,
        "environment": dict(env or {}),
        "all_identical": all(r.all_identical for r in rows),
        "rows": [
            {**asdict(r), "divergence": list(r.divergence), "all_identical": r.all_identical}
            for r in rows
        ],
    }


def write_json(path: Path, doc: Mapping[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=2) + "\n")
