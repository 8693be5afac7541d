"""What ``simulate`` and ``plan`` read: cost table, acceptance traces, STS, request lengths.

``load_inputs`` reads them and checks they fit together (an STS file must have one
temperature per draft position of the traces' drafter); ``profile_identity`` reads
the TP size and model a cost table was measured at from the profiler's
``<table>.meta.json`` beside it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["PlanningInputs", "load_inputs", "profile_identity"]

SYNTHETIC_BLOCK = 7
"""Block size of ``synthetic`` traces when the spec names none."""


@dataclass(frozen=True)
class PlanningInputs:
    table: Any  # SpsCostTable
    traces: Any  # AcceptanceTraces
    sts: Any  # StsCalibration | None
    lengths: Any  # LengthDistribution


def load_inputs(
    profile: Path,
    traces: Sequence[str],
    sts: Path | None,
    lengths: Path | None,
    seed: int,
) -> PlanningInputs:
    """Read the inputs; ``traces`` are files, or one ``synthetic[:B]`` (a built-in set:
    high acceptance, block B, default 7); ``lengths`` defaults to GSM8K chars / 4."""
    from dspark_sglang.calibration.sts import load_sts
    from dspark_sglang.planning.traces import (
        decaying_acceptance,
        load_traces_many,
        synthetic_traces,
    )
    from dspark_sglang.planning.workload import default_lengths, load_lengths
    from dspark_sglang.scheduling.cost_table import load_cost_table

    table = load_cost_table(profile)
    if len(traces) == 1 and traces[0].startswith("synthetic"):
        _, _, b = traces[0].partition(":")
        block = int(b) if b else SYNTHETIC_BLOCK
        acceptance = synthetic_traces(
            200,
            40,
            decaying_acceptance(0.9, 0.98, block),
            auc=0.85,
            request_spread=1.0,
            seed=seed,
        )
    else:
        acceptance = load_traces_many(list(traces))
    cal = load_sts(sts) if sts else None
    if cal is not None and cal.block_size != acceptance.block_size:
        raise ValueError(
            f"--sts {sts} has {cal.block_size} temperatures but the traces' block size is "
            f"{acceptance.block_size}; calibrate STS on rollouts of the drafter that recorded them"
        )
    dist = load_lengths(lengths) if lengths else default_lengths()
    return PlanningInputs(table, acceptance, cal, dist)


def profile_identity(profile: Path) -> tuple[int, str | None]:
    """``(tp_size, model)`` from the profiler's ``<table>.meta.json`` beside the table.

    Why: a tier must run at the TP its cost table was measured at, and the chart finds
    the profiler's ConfigMap by model and TP. A table without metadata (hand-made)
    plans as TP 1 with no model slug.
    """
    meta_path = profile.with_name(profile.stem + ".meta.json")
    if not meta_path.is_file():
        return 1, None
    try:
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ValueError(
            f"{meta_path}: not valid JSON ({exc}); re-run `dspark-sglang profile`"
        ) from exc
    tp = meta.get("tp_size", 1)
    if not (isinstance(tp, int) and tp >= 1):
        raise ValueError(f"{meta_path}: tp_size must be an int >= 1, got {tp!r}")
    model = meta.get("model")
    return tp, str(model) if model else None
