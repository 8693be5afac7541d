"""A DSPARK_MOE decode step adds no host synchronisation of ours (SGLang CPU engine).

The engine: DSPARK_MOE with SGLang's dense draft (random weights), ``cap-accept``
ragged verify (per-request verify lengths, the confidence head exists), our ``prefix``
policy (``DSPARK_SCHEDULER_CONFIG`` with a staircase cost table) with 2-gram context
copies, NaN fault injection on every 3rd draft forward (so non-finite rows are flagged
and folded on the device; a CPU worker skips the fold of a step without a flagged row),
our Prometheus metrics in a multiprocess directory, no decision log (the one debug aid
allowed to sync).

``DSPARK_TEST_SYNC_GUARD`` (test-only, ``sync_probe``) makes the worker, inside
SGLang's scheduler process, run each of our per-step blocks (the planner hook's
decision, the fault guard's fold, the context copies and the token history they
read, the per-step metrics update) with torch's
read-back methods patched to raise, and report every entry to a file.

Expected: generation completes with the target's greedy tokens; every block was
entered on real decode steps and none attempted a host read; the metrics,
flushed through SGLang's result copy, count exactly the steps the blocks saw.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from dspark_sglang.scheduling.config import SchedulerConfig
from dspark_sglang.scheduling.cost_table import from_probes
from dspark_sglang.sglang_integration.dense_draft import write_dense_dspark_draft
from dspark_sglang.sglang_integration.engine import CpuEngineSpec, cpu_engine, generate_outputs
from dspark_sglang.sglang_integration.sync_probe import TEST_GUARD_ENV

pytestmark = [pytest.mark.sglang, pytest.mark.slow]

NUM_PROMPTS = 4
NEW_TOKENS = 24
FAULT_EVERY = 3
SITES = (
    "VerifyDecider.verify_lens",
    "GuardedPropose.non_finite",
    "GuardedPropose.fold",
    "DSparkMoeWorker.step_metrics",
    "schedule_verify_lens_hook.plain_rows",
    "GuardedPropose.context_copy",
    "DSparkMoeWorker.token_history",
)


def _read_metrics(prom_dir: Path) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    from prometheus_client import CollectorRegistry, multiprocess

    samples: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for sub in [prom_dir, *(p for p in prom_dir.iterdir() if p.is_dir())]:
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry, path=str(sub))
        for family in registry.collect():
            for s in family.samples:
                key = (s.name, tuple(sorted(s.labels.items())))
                samples[key] = samples.get(key, 0.0) + s.value
    return samples


@pytest.fixture(scope="module")
def guarded_run(
    smollm2_path: Path, prompt_ids: list[list[int]], tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("sync_free")
    draft = write_dense_dspark_draft(smollm2_path, tmp / "draft")
    table = tmp / "cost_table.json"
    # Steps/s falling with the verify batch: the prefix policy's early stop has work.
    from_probes([(1, 100.0), (8, 90.0), (16, 70.0), (32, 40.0)], max_batch_tokens=64).save(table)
    cfg = tmp / "scheduler.yaml"
    SchedulerConfig(
        block_size=4,
        policy="prefix",
        cost_table_path=str(table),
        sla_name="test",
        context_copy_ngram=2,
    ).save(cfg)
    report = tmp / "sync_guard.jsonl"
    prom = tmp / "prom"
    prom.mkdir()
    spec = CpuEngineSpec(
        model_path=str(smollm2_path),
        overrides={
            "speculative_algorithm": "DSPARK_MOE",
            "speculative_draft_model_path": str(draft),
            "speculative_draft_load_format": "dummy",
            # No enable_metrics: a second in-process engine with it collides with
            # test_sglang_moe_scheduler's in SGLang's own registry (sglang:startup_*);
            # PROMETHEUS_MULTIPROC_DIR alone puts our metrics in the directory.
        },
        env={
            "SGLANG_RAGGED_VERIFY_MODE": "cap-accept",
            "DSPARK_SCHEDULER_CONFIG": str(cfg),
            "DSPARK_FAULT_INJECT_EVERY": str(FAULT_EVERY),
            "DSPARK_FAULT_INJECT_MODE": "nan",
            "PROMETHEUS_MULTIPROC_DIR": str(prom),
            TEST_GUARD_ENV: str(report),
        },
    )
    prompts = prompt_ids[:NUM_PROMPTS]
    with cpu_engine(spec) as engine:
        outs = generate_outputs(engine, prompts, NEW_TOKENS)
        samples = _read_metrics(prom)
        in_step = engine.get_server_info()["disable_overlap_schedule"]
    rows = [json.loads(line) for line in report.read_text().splitlines()]
    return {
        "outs": outs,
        "prompts": prompts,
        "rows": rows,
        "metrics": samples,
        "in_step": in_step,
    }


def test_our_step_code_never_reads_back_and_was_entered(guarded_run: dict[str, Any]) -> None:
    rows = guarded_run["rows"]
    violations = [r for r in rows if not r["ok"]]
    assert not violations, f"host reads inside our per-step code: {violations[:3]}"
    entries = Counter(r["where"] for r in rows)
    for site in SITES:
        # Several decode steps per site (the fold: the faulty ones, see below): the test
        # cannot pass vacuously.
        least = 2 if site == "GuardedPropose.fold" else NEW_TOKENS // 4
        assert entries[site] >= least, f"{site} entered {entries[site]} times"


def test_device_metrics_count_the_steps_the_guarded_blocks_saw(
    guarded_run: dict[str, Any],
) -> None:
    entries = Counter(r["where"] for r in guarded_run["rows"])
    m = guarded_run["metrics"]
    assert m[("dspark_rounds_total", ())] == entries["DSparkMoeWorker.step_metrics"]
    assert m[("dspark_verify_budget_tokens_count", ())] == entries["VerifyDecider.verify_lens"]
    # Every FAULT_EVERY-th draft forward returned NaN: those steps, and only those, were
    # folded (a CPU worker skips the fold of a step without a flagged row).
    folded = entries["GuardedPropose.non_finite"] // FAULT_EVERY
    assert folded >= 2
    assert entries["GuardedPropose.fold"] == folded
    assert m[("dspark_fallback_total", (("reason", "non_finite"),))] == folded
    assert m[("dspark_fallback_total", (("reason", "draft_error"),))] == 0


def test_greedy_output_is_the_targets(
    guarded_run: dict[str, Any], smollm2_path: Path, hf_greedy_fn: Any
) -> None:
    reference = hf_greedy_fn(smollm2_path, guarded_run["prompts"], NEW_TOKENS)
    for i, (o, ref) in enumerate(zip(guarded_run["outs"], reference, strict=True)):
        assert list(o["output_ids"]) == ref, f"prompt {i} differs from the target's greedy output"
        assert o["meta_info"].get("spec_verify_ct", 0) > 0, f"prompt {i}: no verify ran"


def test_on_cpu_dspark_moe_runs_without_the_overlap_scheduler(guarded_run: dict[str, Any]) -> None:
    assert guarded_run["in_step"] is True
