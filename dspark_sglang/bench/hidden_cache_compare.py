"""Two hidden-state caches of the same prompts side by side (``benchmarks/datagen_speed.py
--compare hidden``): the same sequence ids and lengths, and, on the rows both computed from
the same tokens, how far their states are apart per layer."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch


def compare_caches(
    ref_dir: Path, got_dir: Path, layer_ids: Sequence[int], hidden_size: int
) -> dict[str, Any]:
    """``got_dir``'s hidden cache against ``ref_dir``'s (module docstring, ``--compare
    hidden``): ids, token counts, tokens, and per layer the largest absolute difference
    over the reference layer's RMS and the relative L2 difference."""
    from dspark_sglang.training.dataset import HiddenCache

    ref, got = HiddenCache(ref_dir), HiddenCache(got_dir)
    names = [f"layer_{lid}" for lid in layer_ids] + ["last"]
    # Per layer: the largest |difference|, the sum of squared differences, of squared refs.
    stats = torch.zeros(3, len(names), dtype=torch.float64)
    rows = identical = 0
    same_ids = ref.ids == got.ids
    for i in range(len(ref)) if same_ids else ():
        a, b = ref[i], got[i]
        n = min(len(a.tokens), len(b.tokens))
        differ = (a.tokens[:n] != b.tokens[:n]).nonzero()
        first = int(differ[0, 0]) if len(differ) else n
        identical += first == n and len(a.tokens) == len(b.tokens)
        m = min(first, len(a.tokens) - 1, len(b.tokens) - 1)
        if m < 1:
            continue
        rows += m
        x, y = (
            torch.cat([s.aux[:m], s.last[:m]], -1).double().view(m, -1, hidden_size) for s in (a, b)
        )
        stats[0] = torch.maximum(stats[0], (y - x).abs().amax((0, 2)))
        stats[1] += (y - x).pow(2).sum((0, 2))
        stats[2] += x.pow(2).sum((0, 2))
    rms = (stats[2] / max(rows * hidden_size, 1)).sqrt()
    over_rms = torch.where(rms > 0, stats[0] / rms, 0.0).tolist()
    rel_l2 = torch.where(stats[2] > 0, (stats[1] / stats[2]).sqrt(), 0.0).tolist()
    states = {
        name: {"max_abs_over_rms": o, "rel_l2": r}
        for name, o, r in zip(names, over_rms, rel_l2, strict=True)
    }
    return {
        "same_ids": same_ids,
        "same_token_counts": same_ids and ref.seq_lens == got.seq_lens,
        "identical_sequences": identical,
        "sequences": len(ref),
        "rows_compared": rows,
        "states": states,
        "max_abs_over_rms": max(s["max_abs_over_rms"] for s in states.values()),
        "max_rel_l2": max(s["rel_l2"] for s in states.values()),
    }
