"""Our policy deciding SGLang's verify lengths, drafter-fault fallback and our metrics,
with one DSPARK_MOE engine on CPU.

The engine: DSPARK_MOE with SGLang's dense draft (random weights), ragged
verify in ``compact`` mode, as the config's ``ragged_mode`` asks (per-request verify
lengths, only the chosen drafts verified: what our CPU tiers run; the chart's
``cap-accept`` tiers run in ``tests/deploy/test_chart_to_server.py``),
``DSPARK_SCHEDULER_CONFIG`` selecting ``static`` with ``k=2``, a
test-only fault injection making every 3rd draft forward raise, and
``enable_metrics`` so our metrics land in SGLang's Prometheus multiprocess
directory. The worker's decision log records what our policy decided and
what SGLang's verify then used (``cap_lens`` of its batch result).

Expected: normal steps verify ``k + 1 = 3`` tokens per request (anchor + 2
drafts) exactly as decided; fault steps verify 1 (the anchor: plain
decoding); every request still completes with the target's greedy tokens;
``dspark_fallback_total{reason="draft_error"}`` equals the number of fault
steps and ``dspark_rounds_total`` the number of decode steps.

The config also sets ``startup_profile: true`` (no cost table) with
``max_verify_tokens`` 8: the worker measures a small SPS staircase of the target
through SGLang's model runner before serving, writes it beside the decision log
and names its digest in ``dspark_scheduler_info`` (``static`` does not use it,
so the decisions above are unaffected).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from prom_samples import read_metrics

from dspark_sglang.scheduling.config import SchedulerConfig
from dspark_sglang.sglang_integration.dense_draft import write_dense_dspark_draft
from dspark_sglang.sglang_integration.engine import CpuEngineSpec, cpu_engine, generate_outputs
from dspark_sglang.sglang_integration.launch import scheduler_env

pytestmark = [pytest.mark.sglang, pytest.mark.slow]

NEW_TOKENS = 64  # as the hf_reference fixture (conftest.py)
STATIC_K = 2
FAULT_EVERY = 3
STARTUP_CAP = 8


@pytest.fixture(scope="module")
def moe_run(
    smollm2_path: Path, prompt_ids: list[list[int]], tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("moe_sched")
    draft = write_dense_dspark_draft(smollm2_path, tmp / "draft")
    cfg = tmp / "scheduler.yaml"
    SchedulerConfig(
        block_size=4,
        policy="static",
        static_k=STATIC_K,
        sla_name="test",
        startup_profile=True,
        max_verify_tokens=STARTUP_CAP,
        ragged_mode="compact",
    ).save(cfg)
    log = tmp / "decisions.jsonl"
    prom = tmp / "prom"
    prom.mkdir()
    spec = CpuEngineSpec(
        model_path=str(smollm2_path),
        overrides={
            "speculative_algorithm": "DSPARK_MOE",
            "speculative_draft_model_path": str(draft),
            "speculative_draft_load_format": "dummy",
            "enable_metrics": True,
        },
        env={
            **scheduler_env(cfg),
            "DSPARK_DECISION_LOG": str(log),
            "DSPARK_FAULT_INJECT_EVERY": str(FAULT_EVERY),
            "PROMETHEUS_MULTIPROC_DIR": str(prom),
        },
    )
    with cpu_engine(spec) as engine:
        outs = generate_outputs(engine, prompt_ids, NEW_TOKENS)
        samples = read_metrics(prom)
    records = [json.loads(line) for line in log.read_text().splitlines()]
    table = tmp / "decisions.startup_cost_table.json"
    return {"outs": outs, "records": records, "metrics": samples, "table": table, "env": spec.env}


def _steps(run: dict[str, Any]) -> tuple[list[list[int]], list[list[int]], list[list[int]]]:
    decided = [r["verify_lens"] for r in run["records"] if "verify_lens" in r]
    used = [r["used_verify_lens"] for r in run["records"] if "used_verify_lens" in r]
    plain = [u for u in used if set(u) == {1}]
    return decided, used, plain


def test_policy_lengths_are_the_lengths_sglang_verified(moe_run: dict[str, Any]) -> None:
    assert moe_run["env"]["SGLANG_RAGGED_VERIFY_MODE"] == "compact"
    decided, used, plain = _steps(moe_run)
    assert all(r["policy"] == f"static(k={STATIC_K})" for r in moe_run["records"] if "policy" in r)
    assert {x for lens in decided for x in lens} == {STATIC_K + 1}
    normal = [u for u in used if u not in plain]
    # Every non-fault step verified exactly what our policy decided, in order.
    assert normal == decided
    assert len(decided) >= (NEW_TOKENS - 1) // 2


def test_drafter_faults_fall_back_to_plain_decoding(moe_run: dict[str, Any]) -> None:
    _, used, plain = _steps(moe_run)
    # Every 3rd draft forward raised: about a third of the decode steps.
    assert len(plain) >= len(used) // FAULT_EVERY - 1 and len(plain) >= 5
    m = moe_run["metrics"]
    assert m[("dspark_fallback_total", (("reason", "draft_error"),))] == len(plain)
    assert m[("dspark_rounds_total", ())] == len(used)
    assert m[("dspark_verify_budget_tokens_count", ())] == len(used) - len(plain)
    assert m[("dspark_scheduler_decision_seconds_count", ())] == len(used) - len(plain)
    assert m[("dspark_accepted_length_count", ())] == sum(len(u) for u in used)
    assert ("dspark_position_acceptance_ratio", (("position", "1"),)) in m


def test_greedy_output_is_the_targets(
    moe_run: dict[str, Any], hf_reference: list[list[int]]
) -> None:
    for i, (o, ref) in enumerate(zip(moe_run["outs"], hf_reference, strict=True)):
        assert list(o["output_ids"]) == ref, f"prompt {i} differs from the target's greedy output"
        assert o["meta_info"].get("spec_verify_ct", 0) > 0, f"prompt {i}: no verify ran"


def test_startup_profile_measured_the_target_and_published_it(moe_run: dict[str, Any]) -> None:
    from dspark_sglang.scheduling.cost_table import SpsAdditiveCostTable, load_cost_table
    from dspark_sglang.sglang_integration.startup_profile import digest, probe_points

    table = load_cost_table(moe_run["table"])  # our validation: finite, > 0, sorted
    # A CPU engine replays no verify graphs: step time linear between the probes.
    assert isinstance(table, SpsAdditiveCostTable), type(table).__name__
    assert table.m_probes == probe_points(STARTUP_CAP)
    info = [
        dict(labels)
        for (name, labels), v in moe_run["metrics"].items()
        if name == "dspark_scheduler_info" and v == 1
    ]
    assert [i["cost_table_sha256"] for i in info] == [f"startup-{digest(table)}"]
