"""SGLang's CPU matmul vs the few-row oneDNN path (``cpu_linear``), per row count, side by side.

What is measured: ``x @ W.T`` in float32 at SmolLM2-135M's weight shapes (one decoder
layer's four projections, summed, and the tied LM head, 49152 x 576), for 1, 2, 4, 8, 16
and 24 rows (a plain decode step at batch 1, a verify of 1-3 drafts, of a whole block,
of a few requests' blocks), by

* ``sglang``: what SGLang runs on a CPU without AMX, ``F.linear(x, W)`` (the LM head
  is ``torch.matmul(x, W.T)``, the same call);
* ``few_row``: ``cpu_linear.few_row_linear`` (the weight reordered for oneDNN once,
  outside the timing), which the plugin uses from 2 rows on.

Each (shape, rows) pair alternates A B A B over ``--repeats`` rounds of ``--iters``
calls after one untimed call each; the JSON keeps every round's milliseconds per call,
the median and range, and the ratio sglang / few_row of the medians. Every pair's
outputs are compared first (max abs difference stored). The ratio of a row count's time
to the one-row time is what a speculative round pays on this CPU: read those ratios, the
milliseconds move with the machine's load.

Usage: ``python benchmarks/few_row_linear.py [--threads 1] [--out FILE]``; the committed
result is ``--out benchmarks/results/few_row_linear.json``.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from dspark_sglang.bench import alternate as timing
from dspark_sglang.results import default_out, dump_json, software_versions
from dspark_sglang.sglang_integration import cpu_linear
from dspark_sglang.sglang_integration.cpu_dtype import bf16_flags, read_cpuinfo
from dspark_sglang.targets.smollm2 import SMOLLM2_GEOMETRY

ROWS = (1, 2, 4, 8, 16, 24)


def smollm2_shapes() -> dict[str, list[tuple[int, int]]]:
    """(out, in) of one decoder layer's projections as SGLang fuses them, and the head."""
    g = SMOLLM2_GEOMETRY
    h, hd = g.hidden_size, g.head_dim
    inter = 1536  # SmolLM2-135M's MLP width
    qkv = (g.num_attention_heads + 2 * g.num_key_value_heads) * hd
    return {
        "decoder_layer": [(qkv, h), (h, g.num_attention_heads * hd), (2 * inter, h), (h, inter)],
        "lm_head": [(g.vocab_size, h)],
    }


def alternate(fns: dict[str, Callable[[], Any]], repeats: int, iters: int) -> dict[str, Any]:
    """Milliseconds per call of each path, alternated (``bench.alternate``), and their ratio."""
    out: dict[str, Any] = dict(timing.alternate(fns, repeats, iters, scale=1e3, key="ms"))
    out["sglang_over_few_row"] = out["sglang"]["median"] / out["few_row"]["median"]
    return out


def measure(shapes: list[tuple[int, int]], rows: int, repeats: int, iters: int) -> dict[str, Any]:
    gen = torch.Generator().manual_seed(rows)
    weights = [torch.randn(o, i, generator=gen) / i**0.5 for o, i in shapes]
    xs = [torch.randn(rows, i, generator=gen) for _, i in shapes]

    def sglang() -> list[torch.Tensor]:
        return [F.linear(x, w) for x, w in zip(xs, weights, strict=True)]

    def few_row() -> list[torch.Tensor]:
        return [cpu_linear.few_row_linear(x, w) for x, w in zip(xs, weights, strict=True)]

    diff = max(float((a - b).abs().max()) for a, b in zip(sglang(), few_row(), strict=True))
    result = alternate({"sglang": sglang, "few_row": few_row}, repeats, iters)
    result["max_abs_diff"] = diff
    return result


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    if not cpu_linear.onednn_available():
        raise SystemExit("this torch build has no oneDNN packed linear: nothing to compare")
    torch.set_num_threads(args.threads)
    cpuinfo = read_cpuinfo() or ""
    result: dict[str, Any] = {
        "settings": {k: v for k, v in vars(args).items() if k != "out"},
        "cpu": {
            "model": next(
                (ln.split(":", 1)[1].strip() for ln in cpuinfo.splitlines() if "model name" in ln),
                "unknown",
            ),
            "bf16_flags": list(bf16_flags(cpuinfo)),
        },
        "loadavg_start": os.getloadavg(),
        "shapes": {name: [list(s) for s in shapes] for name, shapes in smollm2_shapes().items()},
        "rows": {},
    }
    print(f"{'weights':<14} {'rows':>4} {'sglang ms':>10} {'few-row ms':>11} {'ratio':>6}")
    for name, shapes in smollm2_shapes().items():
        per_rows: dict[str, Any] = {}
        for rows in ROWS:
            r = measure(shapes, rows, args.repeats, args.iters)
            per_rows[str(rows)] = r
            print(
                f"{name:<14} {rows:>4} {r['sglang']['median']:>10.3f} "
                f"{r['few_row']['median']:>11.3f} {r['sglang_over_few_row']:>5.2f}x"
            )
        one = per_rows["1"]["sglang"]["median"]
        for r in per_rows.values():  # the cost of n rows in one-row (plain decode) units
            r["sglang_in_one_row_units"] = r["sglang"]["median"] / one
            r["few_row_in_one_row_units"] = r["few_row"]["median"] / one
        result["rows"][name] = per_rows
    result["loadavg_end"] = os.getloadavg()
    result["software"] = software_versions()
    out = args.out or default_out("few_row_linear", "few_row_linear.json")
    print(f"wrote {dump_json(out, result)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
