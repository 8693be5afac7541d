"""The draft decision in a DSPARK_MOE engine on CPU (``draft_gate``, ``draft_decision``).

Engine ``priced``: the embedded SmolLM2 drafter, policy ``prefix`` with
``draft_decision: priced`` and ``probe_every: 2``, and a cost table plus
``draft_step_seconds: 1.0`` under which a drafting round never pays: every step is a
plain step except those without evidence and the probes. Engine ``every``: the same
drafter under policy ``none``, which drafts every step and verifies no draft, so its
decision log holds the drafter's confidences at every position of a reply.

What must hold:

* greedy output is the target's (Hugging Face greedy) token for token;
* a step that does not draft runs no draft forward: the round profiler counts SGLang's
  own draft forward (``_run_forward``) once per drafting step, fewer than the rounds,
  and ``dspark_draft_request_steps_total`` splits the request-steps the same way; it
  runs as a decode step (``plain_decode``: SGLang's speculative accept runs only in
  drafting steps);
* catch-up: at every position where ``priced`` drafts after plain steps, its confidences
  equal those ``every`` computed at the same position (the skipped steps' target hidden
  states reached the draft's context).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from prom_samples import read_metrics

from dspark_sglang.scheduling.config import SchedulerConfig
from dspark_sglang.scheduling.cost_table import SpsCostTable
from dspark_sglang.sglang_integration import round_profile
from dspark_sglang.sglang_integration.engine import CpuEngineSpec, cpu_engine, generate_outputs
from dspark_sglang.sglang_integration.launch import scheduler_env

pytestmark = [pytest.mark.sglang, pytest.mark.slow]

DRAFTER = Path(__file__).resolve().parents[2] / "dspark_sglang/assets/drafters/smollm2"
NEW_TOKENS = 64  # as the hf_reference fixture (conftest.py)
PROBE_EVERY = 2


def _spec(target: Path, tmp: Path, name: str, cfg: SchedulerConfig, **env: str) -> CpuEngineSpec:
    path = tmp / f"{name}.yaml"
    cfg.save(path)
    return CpuEngineSpec(
        model_path=str(target),
        overrides={
            "speculative_algorithm": "DSPARK_MOE",
            "speculative_draft_model_path": str(DRAFTER),
        },
        env={**scheduler_env(path), "DSPARK_DECISION_LOG": str(tmp / f"{name}.jsonl"), **env},
    )


def _decisions(path: Path) -> list[dict[str, Any]]:
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    return [r for r in rows if "verify_lens" in r]


@pytest.fixture(scope="module")
def runs(
    smollm2_path: Path, prompt_ids: list[list[int]], tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("draft_decision")
    table = tmp / "sps.json"
    SpsCostTable(
        sample_batch_tokens=(1, 64), sample_steps_per_sec=(20.0, 10.0), max_batch_tokens=256
    ).save(table)
    priced = SchedulerConfig(
        block_size=7,
        policy="prefix",
        cost_table_path=str(table),
        draft_step_seconds=1.0,
        ragged_mode="compact",
        draft_decision="priced",
        probe_every=PROBE_EVERY,
    )
    every = SchedulerConfig(block_size=7, policy="none", ragged_mode="compact")
    prom = tmp / "prom"
    prom.mkdir()
    profile = tmp / "rounds.json"
    out: dict[str, Any] = {}
    # PROMETHEUS_MULTIPROC_DIR alone puts our metrics in the directory.
    env = {"PROMETHEUS_MULTIPROC_DIR": str(prom), round_profile.ENV: str(profile)}
    with cpu_engine(_spec(smollm2_path, tmp, "priced", priced, **env)) as engine:
        out["priced_one"] = generate_outputs(engine, prompt_ids[:1], NEW_TOKENS)
        out["one_log"] = _decisions(tmp / "priced.jsonl")
        out["profile"] = round_profile.read_snapshot(profile)
        out["metrics"] = read_metrics(prom)
        out["priced_all"] = generate_outputs(engine, prompt_ids, NEW_TOKENS)
    with cpu_engine(_spec(smollm2_path, tmp, "every", every)) as engine:
        out["every_one"] = generate_outputs(engine, prompt_ids[:1], NEW_TOKENS)
    out["every_log"] = _decisions(tmp / "every.jsonl")
    return out


def test_greedy_output_is_the_targets(runs: dict[str, Any], hf_reference: list[list[int]]) -> None:
    assert [o["output_ids"] for o in runs["priced_all"]] == hf_reference
    assert runs["priced_one"][0]["output_ids"] == hf_reference[0]
    assert runs["every_one"][0]["output_ids"] == hf_reference[0]


def test_a_step_that_does_not_draft_runs_no_draft_forward(runs: dict[str, Any]) -> None:
    timers = runs["profile"]
    rounds = int(timers[round_profile.ROUND]["calls"])
    forwards = int(timers["draft_forward"]["calls"])
    drafted = len(runs["one_log"])  # the policy decides only in drafting steps
    assert forwards == drafted
    # Plain steps between probes: at most one drafting step in PROBE_EVERY + 1 (probes back off).
    assert 0 < forwards < rounds < NEW_TOKENS
    assert forwards <= rounds // (PROBE_EVERY + 1) + 2
    # Every round still commits the target's hidden states to the draft's context.
    assert int(timers["commit_hidden"]["calls"]) == rounds
    # A plain step is SGLang's decode step (``plain_decode``): no speculative accept.
    assert int(timers["accept"]["calls"]) == drafted
    m = runs["metrics"]
    assert m[("dspark_draft_request_steps_total", (("drafted", "true"),))] == drafted
    assert m[("dspark_draft_request_steps_total", (("drafted", "false"),))] == rounds - drafted


def test_drafting_after_plain_steps_sees_the_same_context(runs: dict[str, Any]) -> None:
    every = {r["prefix_lens"][0]: r["confidence"][0] for r in runs["every_log"]}
    assert len(every) >= NEW_TOKENS - 1  # policy none drafted at every position
    resumed = [r for r in runs["one_log"][1:]]  # each after a gap of plain steps
    assert len(resumed) >= 5
    for r in resumed:
        pos = r["prefix_lens"][0]
        assert r["confidence"][0] == pytest.approx(every[pos], abs=1e-4), f"position {pos}"
