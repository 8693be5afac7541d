"""The chart's default tier under load, faults and bad requests (writes a run folder).

Why: a deployment is only as good as its worst request. This starts the server the
chart renders for its default tier (through the documented CPU overlay of
``tests/deploy/rendered_tier.py``, float32 so greedy text can be compared exactly),
with drafter faults injected every ``--fault-every`` draft steps, and drives it with
``dspark_sglang.bench.serve_contract.run_load``: 32 clients, greedy and temperature-1
requests, streamed and not, random ``max_tokens``, 10 % of streamed requests' clients hanging
up early. It records what was sent, completed, cancelled and errored, p50/p99
latency, how many greedy outputs equal HF's greedy decoding, the injected faults
against ``dspark_fallback_total``, ``/health`` during the load, and the answers to
malformed requests. ``tests/deploy/test_serve_contract.py`` asserts the same
invariants on a shorter run.

Usage: ``python benchmarks/serve_contract.py [--duration 120] [--out FILE]``. Without
``--out`` the JSON goes to a fresh run folder,
``<cache>/runs/bench/serve_contract-<UTC time>/serve_contract.json``; the committed result is
``--out benchmarks/results/serve_contract.json``.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
import urllib.request
from dataclasses import asdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "tests"), str(REPO / "tests" / "deploy")]

from chart_tools import SHIPPED, render  # noqa: E402
from hf_greedy import hf_greedy  # noqa: E402
from rendered_tier import cpu_launch, server_workloads  # noqa: E402

from dspark_sglang.bench.serve_contract import (  # noqa: E402
    CHAT_PROMPTS,
    COMPLETION_PROMPTS,
    LoadSpec,
    malformed_requests,
    metric_total,
    run_load,
    summarise,
)
from dspark_sglang.results import default_out, dump_json  # noqa: E402
from dspark_sglang.sglang_integration.fallback import FAULT_EVERY_ENV  # noqa: E402
from dspark_sglang.sglang_integration.server import server_process  # noqa: E402
from dspark_sglang.targets.smollm2 import ensure_smollm2  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--duration", type=float, default=120.0, help="seconds of load")
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--fault-every", type=int, default=7, help="inject a drafter fault every N")
    ap.add_argument(
        "--out",
        type=Path,
        default=None,
        help="result JSON (default: serve_contract.json in a fresh run folder, "
        "<cache>/runs/bench/serve_contract-<UTC time>/)",
    )
    args = ap.parse_args()

    from transformers import AutoConfig, AutoTokenizer

    target = ensure_smollm2()
    tok = AutoTokenizer.from_pretrained(target)
    cfg = AutoConfig.from_pretrained(target)
    prompts = [tok(p, add_special_tokens=False)["input_ids"] for p in COMPLETION_PROMPTS]
    reference = hf_greedy(target, prompts, args.max_tokens)
    (tier, *_) = server_workloads(render(SHIPPED[0]), SHIPPED[0].name)
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        launch = cpu_launch(tier, Path(tmp) / "pod", target, sys.executable)
        env = {**os.environ, **launch.env, FAULT_EVERY_ENV: str(args.fault_every)}
        argv = [*launch.argv, "--dtype", "float32"]
        log = Path(tmp) / "server.log"
        with server_process(argv, env, launch.base_url, log, ready_path="/health") as srv:
            spec = LoadSpec(
                clients=args.clients, duration_s=args.duration, max_tokens=args.max_tokens
            )
            health: list[int] = []
            stop = threading.Event()

            def probe() -> None:
                while not stop.is_set():
                    try:
                        with urllib.request.urlopen(srv.base_url + "/health", timeout=10) as r:
                            health.append(r.status)
                    except OSError:
                        health.append(0)
                    stop.wait(2.0)

            prober = threading.Thread(target=probe)
            prober.start()
            t0 = time.monotonic()
            outcomes = run_load(srv.base_url, prompts, CHAT_PROMPTS, spec)
            wall = time.monotonic() - t0
            stop.set()
            prober.join()
            time.sleep(1.0)
            rounds = metric_total(srv.base_url, "dspark_rounds_total")
            fallbacks = metric_total(srv.base_url, "dspark_fallback_total")
            bad = malformed_requests(srv.base_url, cfg.max_position_embeddings, cfg.vocab_size)
    greedy = [o for o in outcomes if o.greedy and o.finished and not o.disconnect]
    identical = sum(
        o.text == tok.decode(reference[o.prompt_index][: o.max_tokens], skip_special_tokens=True)
        for o in greedy
    )
    summary = summarise(outcomes)
    result = {
        "benchmark": "serve_contract",
        "server": {"values_file": tier.values_file, "tier": tier.tier, "dtype": "float32"},
        "load": {**asdict(spec), "wall_s": wall},
        **summary,
        "greedy_identical_to_plain": identical,
        "greedy_checked": len(greedy),
        "fault_every": args.fault_every,
        "decode_rounds": rounds,
        "injected_faults": int(rounds // args.fault_every),
        "dspark_fallback_total": fallbacks,
        "health_probes": len(health),
        "health_ok": sum(h == 200 for h in health),
        "malformed": [{"request": b.name, "status": b.status, "message": b.message} for b in bad],
    }
    if args.out is None:
        args.out = default_out("serve_contract", "serve_contract.json")
    dump_json(args.out, result)
    print(f"sent {summary['sent']}  completed {summary['completed']}  cancelled by client "
          f"{summary['cancelled_by_client']}  errored {summary['errored']}")  # fmt: skip
    print(f"latency p50 {summary['latency_p50_s']:.2f} s  p99 {summary['latency_p99_s']:.2f} s")
    print(f"greedy identical to plain decoding: {identical}/{len(greedy)}")
    print(f"faults injected {result['injected_faults']}  dspark_fallback_total {fallbacks:g}")
    print(f"/health {result['health_ok']}/{len(health)} ok during the load")
    for b in bad:
        print(f"  {b.name:34s} -> {b.status}  {b.message[:70]}")
    print(f"wrote {args.out}")
    ok = (
        summary["errored"] == 0
        and identical == len(greedy)
        and fallbacks == result["injected_faults"]
        and all(400 <= b.status < 500 for b in bad)
    )
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
