"""Files an acceptance run writes: the result JSON and, per drafter, traces and rollouts.

The JSON is the command's metadata followed by ``AcceptanceReport.to_dict()``; the
traces (``planning.traces`` format) and STS rollouts (``calibration.rollouts``
format) carry the raw confidence logits and exact accepted counts of every round.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from dspark_sglang.bench.acceptance_report import AcceptanceReport
from dspark_sglang.results import dump_json


def write_report_json(
    path: str | Path, report: AcceptanceReport, metadata: Mapping[str, Any]
) -> Path:
    """``metadata`` (command settings, versions, checkpoints, date) + ``report.to_dict()``."""
    body = {"benchmark": "acceptance", **dict(metadata), **report.to_dict()}
    return dump_json(path, body, allow_nan=False)


def write_traces(report: AcceptanceReport, traces_dir: str | Path) -> list[Path]:
    """Per drafter with a confidence head and domain: planner traces and STS rollouts.

    ``DIR/<drafter>/<domain>.jsonl`` (``planning.traces`` format) and
    ``DIR/<drafter>/rollouts_<domain>.jsonl`` (``calibration.rollouts`` format,
    ``verified = B``). ``accepted`` is exact: every round verified all ``B`` drafts.
    Request ids are the prompt's index in its eval set (unique per file). Cells
    without any round (every request ended at its first token) are skipped, and so are
    drafters run with context copies (their confidences scored drafts that copies
    replaced, so their rounds would mislead a calibration).
    """
    from dspark_sglang.calibration.rollouts import Rollouts, save_rollouts
    from dspark_sglang.planning.traces import AcceptanceTraces, save_traces

    written: list[Path] = []
    root = Path(traces_dir)
    for name in report.drafters:
        if report.context_copy.get(name, 0):
            continue
        for dom in report.domains:
            cell = report.cells[name][dom]
            if cell.confidence_logits is None or cell.num_rounds == 0:
                continue
            z = torch.cat([t.reshape(-1, cell.block_size) for t in cell.confidence_logits]).float()
            acc = torch.tensor([a for r in cell.accepted for a in r], dtype=torch.int64)
            counts = torch.tensor([len(r) for r in cell.accepted], dtype=torch.int64)
            if z.shape[0] != acc.numel():
                raise ValueError(
                    f"{name}/{dom}: {z.shape[0]} confidence rows for {acc.numel()} rounds"
                )
            rid = torch.repeat_interleave(torch.arange(cell.num_requests), counts)
            folder = root / name
            folder.mkdir(parents=True, exist_ok=True)
            traces = AcceptanceTraces(
                request_id=rid,
                domain_index=torch.zeros_like(rid),
                domains=(dom,),
                confidence_logits=z,
                accepted=acc,
            )
            save_traces(traces, folder / f"{dom}.jsonl")
            rollouts = Rollouts(z, acc, torch.full_like(acc, cell.block_size))
            save_rollouts(folder / f"rollouts_{dom}.jsonl", rollouts)
            written += [folder / f"{dom}.jsonl", folder / f"rollouts_{dom}.jsonl"]
    return written
