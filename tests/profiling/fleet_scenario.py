"""Ray fleet scenarios for test_profiling_fleet.py, run in a loopback-only netns.

Not a test module (pytest does not collect it): the test re-executes it under
``unshare --net`` because Ray probes an external address to pick its node IP.
It starts one local Ray cluster whose custom resources stand for three "nodes",
then runs, in order:

1. ``fleet``: three nodes profile SmolLM2-135M on CPU end to end; node-c's actor
   is ``ray.kill``-ed as soon as it has measured its first probe (mid-run);
2. ``resume``: the same job for node-a and node-b with ``resume=True`` (must reuse
   both stored results without starting actors).

Writes one JSON document with every result to ``argv[2]``.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

import ray

from dspark_sglang.profiling.fleet import FleetConfig, NodeTarget, resource_targets, run_fleet
from dspark_sglang.profiling.job import ProfileJob
from dspark_sglang.profiling.measure import GridSpec, MeasureConfig


def main(out_root: Path, result_path: Path) -> None:
    assert os.environ.get("RAY_USAGE_STATS_ENABLED") == "0"
    job = ProfileJob(
        model="smollm2",
        grid=GridSpec(max_tokens=8, points=(1, 4, 8), refine=True, max_refine_probes=1),
        measure=MeasureConfig(warmup=0, repeats=2, rounds=1),
        threads=1,
        context_len=16,
    )
    ray.init(
        num_cpus=2,
        include_dashboard=False,
        resources={"node-a": 1, "node-b": 1, "node-c": 1},
        log_to_driver=False,
    )
    results: dict[str, Any] = {}
    t0 = time.monotonic()
    try:
        killed: dict[str, Any] = {}

        def on_started(target: NodeTarget, actor: Any) -> None:
            if target.name != "node-c":
                return

            def killer() -> None:
                deadline = time.monotonic() + 400
                while time.monotonic() < deadline:
                    done, planned = ray.get(actor.progress.remote())
                    if done >= 1:
                        killed["progress"] = [done, planned]
                        ray.kill(actor, no_restart=True)
                        return
                    time.sleep(0.05)

            threading.Thread(target=killer, daemon=True).start()

        cfg = FleetConfig(
            job=job, out_dir=out_root / "fleet", actor_num_cpus=0.5, node_timeout_s=500
        )
        targets = resource_targets(["node-a", "node-b", "node-c"])
        results["fleet"] = run_fleet(targets, cfg, on_started=on_started).to_dict()
        results["killed_at_progress"] = killed.get("progress")
        results["fleet_seconds"] = time.monotonic() - t0
        results["fleet_table_text"] = Path(results["fleet"]["groups"][0]["table"]).read_text()

        cfg_resume = FleetConfig(
            job=job, out_dir=out_root / "fleet", actor_num_cpus=0.5, node_timeout_s=300, resume=True
        )
        results["resume"] = run_fleet(resource_targets(["node-a", "node-b"]), cfg_resume).to_dict()
        results["seconds"] = time.monotonic() - t0
    finally:
        ray.shutdown()
    result_path.write_text(json.dumps(results, indent=2), encoding="utf-8")


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
