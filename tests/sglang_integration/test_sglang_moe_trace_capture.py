"""Traces from a running DSPARK_MOE server: SGLang's STS recorder, read by the planner.

The SLA-retuning runbook collects production acceptance traces with SGLang's own
recorder (``SGLANG_DSPARK_STS_COLLECT_PATH``) and feeds its shards to ``plan`` and
``calibrate``. This runs it on one DSPARK_MOE engine on CPU (the SmolLM2 target, the
embedded drafter, static k = B in ``cap-accept`` mode, no STS file: the recorder
needs raw confidences) and checks what the planner reads back: one row per request per
decode round, counts within the block, and, since the engine decodes greedily and
verifies whole blocks, the accepted drafts plus one bonus token per round add up to the
tokens the engine generated after its first (prefill) token.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from dspark_sglang.planning.traces import LIVE_DOMAIN, load_traces_many
from dspark_sglang.scheduling.config import SchedulerConfig
from dspark_sglang.sglang_integration.engine import CpuEngineSpec, cpu_engine, generate_outputs
from dspark_sglang.sglang_integration.launch import drafter_block_size, scheduler_env
from dspark_sglang.targets.smollm2 import DEFAULT_DRAFTER_DIR

pytestmark = [pytest.mark.sglang, pytest.mark.slow]

# SGLang flushes a shard every 256 recorded decode steps: three batches of 4 requests at
# 160 tokens give > 256 steps at the acceptance of the embedded drafter.
NEW_TOKENS = 160
BATCHES = 3


def test_sts_recorder_shards_are_planner_traces(
    smollm2_path: Path, prompt_ids: list[list[int]], tmp_path: Path
) -> None:
    block = drafter_block_size(DEFAULT_DRAFTER_DIR)
    cfg = tmp_path / "scheduler.yaml"
    # cap-accept verify (static k = B): the whole block is verified and, unlike SGLang's
    # static ragged mode, the draft computes the confidences the recorder stores.
    SchedulerConfig(block_size=block, policy="static", static_k=block, sla_name="capture").save(cfg)
    stem = tmp_path / "sts" / "shard"
    spec = CpuEngineSpec(
        model_path=str(smollm2_path),
        overrides={
            "speculative_algorithm": "DSPARK_MOE",
            "speculative_draft_model_path": str(DEFAULT_DRAFTER_DIR),
        },
        env={**scheduler_env(cfg), "SGLANG_DSPARK_STS_COLLECT_PATH": str(stem)},
    )
    prompts = prompt_ids[:4]
    generated = 0
    with cpu_engine(spec) as engine:
        for _ in range(BATCHES):
            outs = generate_outputs(engine, prompts, NEW_TOKENS)
            generated += sum(len(o["output_ids"]) - 1 for o in outs)  # after the prefill token
    shards = sorted(stem.parent.glob("shard.*.pt"))
    assert shards, f"no shard written under {stem.parent}"
    traces = load_traces_many(shards)
    assert traces.block_size == block and traces.domains == (LIVE_DOMAIN,)
    rows = int(traces.accepted.shape[0])
    assert rows >= 256  # at least one flush of 256 steps, each with >= 1 request
    assert int(traces.accepted.min()) >= 0 and int(traces.accepted.max()) <= block
    # Only whole flushes are on disk, so the recorded rounds produced at most the tokens
    # generated: accepted drafts + one bonus per round.
    produced = int(traces.accepted.sum()) + rows
    assert produced <= generated
    assert produced >= 0.5 * generated  # most of the run was flushed
