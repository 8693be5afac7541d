"""Traces from a running DSPARK_MOE server: SGLang's STS recorder, read by the planner.

The SLA-retuning runbook collects production acceptance traces with SGLang's own
recorder (``SGLANG_DSPARK_STS_COLLECT_PATH``) and feeds its shards to ``plan`` and
``calibrate``. This runs it on one DSPARK_MOE engine on CPU (the SmolLM2 target, the
embedded drafter, static k = B in ``cap-accept`` mode, no STS file: the recorder
needs raw confidences) and checks what the planner reads back: one row per request per
decode round, counts within the block, and, since the engine decodes greedily and
verifies whole blocks, the accepted drafts plus one bonus token per round add up to the
tokens the engine generated after its first (prefill) token.

Requests run one at a time. The recorder writes a shard every 256 decode steps whatever
the batch size, and a step at batch 1 costs far less than one at batch 4, so batch 1
reaches a shard in the least time. Each row is then one verify round of one request, in
order, which pins more than a batch can: the rows on disk are exactly the whole flushes
of SGLang's verify rounds (``spec_verify_ct``), and the rows of each request that was
flushed whole add up to SGLang's own count of its correct drafts.
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

#: SGLang's STS recorder writes a shard every this many decode steps.
FLUSH_EVERY = 256
#: Each of the session's 8 prompts alone: at the embedded drafter's acceptance on them
#: (about 1.3 tokens per round) 8 x 52 tokens take about 300 decode steps, one shard.
NEW_TOKENS = 52


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
    outs = []
    with cpu_engine(spec) as engine:
        for prompt in prompt_ids:
            outs += generate_outputs(engine, [prompt], NEW_TOKENS)
    generated = sum(len(o["output_ids"]) - 1 for o in outs)  # after the prefill token
    steps = sum(int(o["meta_info"]["spec_verify_ct"]) for o in outs)
    assert steps >= FLUSH_EVERY, f"{steps} decode steps: too few for one shard"
    shards = sorted(stem.parent.glob("shard.*.pt"))
    assert shards, f"no shard written under {stem.parent}"
    traces = load_traces_many(shards)
    assert traces.block_size == block and traces.domains == (LIVE_DOMAIN,)
    rows = int(traces.accepted.shape[0])
    # One request per step: every whole flush of 256 steps is on disk, the rest is not.
    assert rows == FLUSH_EVERY * (steps // FLUSH_EVERY)
    assert int(traces.accepted.min()) >= 0 and int(traces.accepted.max()) <= block
    # The rows are the requests' rounds in order: each request flushed whole has its
    # correct drafts, as SGLang counted them, in its own rows.
    start, whole = 0, 0
    for o in outs:
        meta = o["meta_info"]
        end = start + int(meta["spec_verify_ct"])
        if end > rows:
            break
        assert int(traces.accepted[start:end].sum()) == int(meta["spec_num_correct_drafts"])
        start, whole = end, whole + 1
    assert whole >= 2, f"only {whole} request(s) flushed whole"
    # Only whole flushes are on disk, so the recorded rounds produced at most the tokens
    # generated: accepted drafts + one bonus per round.
    produced = int(traces.accepted.sum()) + rows
    assert produced <= generated
    assert produced >= 0.5 * generated  # most of the run was flushed
