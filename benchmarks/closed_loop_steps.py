"""Why does a live closed loop at c = 4 step slower than the lockstep probe before it?

Sim validation (``dspark-sglang bench sim-validation``) over-predicted c = 4 in all six
runs with its 12-request floor: the load's step rate came out 12-35 % below the probe of
4 requests decoding in lockstep. Two explanations predict different things:

* **Arrivals.** Each new request waits for the running step, is prefilled while the others
  wait, and streams only after its first round. If the simulator (one separate prefill
  step per arrival, priced by the lone-prefill probe) undercharges that, the chunk gaps of
  the running requests that overlap an arrival carry the missing time, and the gaps away
  from arrivals match the probe.
* **The machine.** If the decode step itself is slower in the loop, the gaps away from
  arrivals are slow too, and they move with time as the machine's speed does.

This runs, on one CPU server of the embedded drafter (the sim-validation settings): a few
lockstep probes, a lone-prefill probe of each loop prompt, a closed loop at
``--concurrency``, then ``--probes-after`` lockstep probes back to back. It splits the
loop's chunk gaps (while every slot is busy) into quiet ones and ones that overlap an
arrival (from its submission to its first chunk), and prices each arrival by how much
longer the running requests' overlapping span took than their own quiet step.

Usage: ``python benchmarks/closed_loop_steps.py`` (about 10 minutes on 2 cores; run it
with nothing else running). Writes ``closed_loop_steps.json`` to a fresh run folder,
``<cache>/runs/bench/closed_loop_steps-<UTC time>/``, or to ``--out FILE`` (the committed
result: ``--out benchmarks/results/closed_loop_steps.json``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from dspark_sglang.bench.acceptance import load_eval_prompts
from dspark_sglang.bench.sim_validation import interleave_prompts, server_spec
from dspark_sglang.planning.live import (
    LoadRun,
    LoadSteps,
    RequestTimeline,
    closed_loop,
    load_steps,
    profile_server,
    stream_generate,
)
from dspark_sglang.results import default_out, dump_json
from dspark_sglang.sglang_integration.server import cpu_server
from dspark_sglang.targets.hf_target import HFTarget
from dspark_sglang.targets.smollm2 import DEFAULT_DRAFTER_DIR, ensure_smollm2_with_status

REPO = Path(__file__).resolve().parents[1]


def analyse(run: LoadRun, steps: LoadSteps, bin_s: float) -> dict[str, Any]:
    """``load_steps`` of the loop, with the quiet steps also binned by time."""
    t_lo, t_hi = steps.window
    bins: dict[int, list[float]] = {}
    for a, g in steps.quiet_gaps:
        bins.setdefault(int((a - t_lo) // bin_s), []).append(g)
    return {
        **steps.to_dict(),
        "window_s": t_hi - t_lo,
        "quiet_step_by_time": [
            {"from_s": k * bin_s, "median_s": statistics.median(v), "gaps": len(v)}
            for k, v in sorted(bins.items())
        ],
        "arrival_stall_s": list(steps.arrival_stall_s),
        "ttft_s": [tl.first - tl.submit for tl in run.timelines[run.concurrency :]],
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--requests", type=int, default=20)
    ap.add_argument("--output-tokens", type=int, default=64)
    ap.add_argument("--probes-before", type=int, default=3)
    ap.add_argument("--probes-after", type=int, default=6)
    ap.add_argument("--static-k", type=int, default=2)
    ap.add_argument("--bin-seconds", type=float, default=30.0)
    ap.add_argument(
        "--out",
        type=Path,
        default=None,
        help="result JSON (default: closed_loop_steps.json in a fresh run folder, "
        "<cache>/runs/bench/closed_loop_steps-<UTC time>/)",
    )
    args = ap.parse_args()
    console = Console()
    c, n_out = args.concurrency, args.output_tokens

    model_path = ensure_smollm2_with_status(console)
    target = HFTarget(model_path, num_threads=1)
    by_set = load_eval_prompts(target, ["gsm8k", "humaneval", "mtbench"], 10)
    del target
    prompts, _ = interleave_prompts(by_set, ("gsm8k", "humaneval", "mtbench"), 10)
    loop_prompts = [prompts[i % len(prompts)] for i in range(args.requests)]

    with tempfile.TemporaryDirectory() as tmp:
        spec = server_spec(model_path, DEFAULT_DRAFTER_DIR.resolve(), args.static_k, 1, Path(tmp))
        with cpu_server(spec, Path(tmp) / "server.log") as srv:

            def send(p: Sequence[int], m: int) -> RequestTimeline:
                return stream_generate(srv.base_url, p, m)

            def lockstep() -> tuple[float, float]:
                t = time.perf_counter()
                one = profile_server(
                    send,
                    prompts[:c],
                    [c],
                    [],
                    verify_tokens_per_request=1 + args.static_k,
                    decode_tokens=n_out,
                    decode_repeats=1,
                    warmup=False,
                )
                return t, one.decode_seconds[c]

            send(prompts[0], 16)  # warm-up, not recorded
            before = [lockstep() for _ in range(args.probes_before)]

            def ttft(p: Sequence[int]) -> float:
                tl = send(p, 1)
                return tl.first - tl.submit

            # As profile_server prices a prefill: a lone request's time to first token.
            prefill = [statistics.median(ttft(p) for _ in range(2)) for p in loop_prompts]
            console.print(f"closed loop: {args.requests} requests at c = {c}")
            run = closed_loop(lambda i: send(loop_prompts[i], n_out), args.requests, c)
            after = [lockstep() for _ in range(args.probes_after)]

    steps = load_steps(run)
    res = analyse(run, steps, args.bin_seconds)
    t_lo, t_hi = steps.window
    charged = sum(
        prefill[i] for i, tl in enumerate(run.timelines) if i >= c and t_lo <= tl.submit <= t_hi
    )
    t0 = min(tl.submit for tl in run.timelines)
    out = {
        "benchmark": "closed_loop_steps",
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "load_average": os.getloadavg(),
        "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "probe_before_s": [{"at_s": t - t0, "step_s": s} for t, s in before],
        "probe_after_s": [{"at_s": t - t0, "step_s": s} for t, s in after],
        "lone_prefill_s": prefill,
        "simulator_prefill_charge_s": charged,
        **res,
    }
    if args.out is None:
        args.out = default_out("closed_loop_steps", "closed_loop_steps.json")
    dump_json(args.out, out, indent=1)

    tab = Table(title=f"decode step at c = {c} (s)")
    tab.add_column("when")
    tab.add_column("step, median", justify="right")
    for t, s in before:
        tab.add_row(f"lockstep probe, t = {t - t0:.0f} s", f"{s:.3f}")
    for b in res["quiet_step_by_time"]:
        tab.add_row(f"loop, quiet, t = {b['from_s']:.0f} s + window", f"{b['median_s']:.3f}")
    for t, s in after:
        tab.add_row(f"lockstep probe, t = {t - t0:.0f} s", f"{s:.3f}")
    console.print(tab)
    stalls = res["arrival_stall_s"]
    console.print(
        f"window {res['window_s']:.1f} s; {len(stalls)} arrivals held the running requests up "
        f"{statistics.median(stalls):.2f} s each (median), {sum(stalls):.1f} s in all; the "
        f"simulator charges their lone prefills, {charged:.1f} s"
    )
    console.print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
