"""The draft decision keeps sampling lossless: SGLang's CPU engine at temperature 1.

Claim: under DSPARK_MOE with ``draft_decision: priced`` the joint law of a request's
first two generated tokens ``(t1, t2)`` is the target's. ``t1`` comes from the prefill,
``t2`` from the request's first decode step: a plain step where the decision priced
drafting below a plain step, else a drafting step (no evidence yet, or a probe). The
reference is Hugging Face transformers on the same target and prompt (float32 logits,
float64 softmax): every ``(t1, t2)`` pair expected at least 5 times is a bin, every
other pair one more bin. Pearson chi-square of the engine's counts: p > 1e-3. The
prompt is the suite's first (``prompt_ids[0]``, no chat template): after its likeliest
``t1`` the drafter's first-position mode is the target's, which gives the control below
its power.

Engine: SmolLM2-135M with its embedded trained drafter, policy ``prefix``, compact
ragged verify, the drafter's sampled STS, sampled drafts. The cost table and
``draft_step_seconds`` make drafting never pay, so a step drafts only as a probe
(``probe_every: 2``, backing off) or without evidence: most first decode steps are
plain, some draft. Request lengths cycle through ``NEW_TOKENS`` so requests finish at
different steps and the next ones join a running batch whose evidence they borrow;
only the first two tokens count.

Control: a decision that peeks at the draft. A test-only SGLang plugin (entry point
group ``sglang.srt.plugins``, written into a temporary folder that the spawned
scheduler inherits on ``sys.path``) wraps ``GuardedPropose.fold`` so that a row keeps
its drafts only when its first draft is the drafter's mode (argmax of its first-position
draft logits); every other row becomes a plain row, as a non-finite row does. The
rejection test still divides by the unconditional draft probability, so ``t2`` leans
towards the drafter's mode; the same chi-square must reject it: p < 1e-6. The control
drafts at every step (``draft_decision: always``) and each of its requests stops after
two tokens, so every ``t2`` comes from a peeked drafting step: under the priced
decision most first decode steps are plain and dilute the bias, which would then need
many times as many requests to reach 1e-6. A trained drafter is needed because the
bias lives in drafts the target accepts; a random tiny target's drafter proposes none.

Seeds: the engine's ``random_seed`` is fixed (SEED) and every request is sent in one
call; repeated runs on one machine gave the same counts, but the batches SGLang forms
may depend on timing, so the margins (1e-3 against 1e-6) carry the test. A request's
``sampling_seed`` is not used: SGLang reads it only under deterministic inference, and
DSpark's sampled accept never reads it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from scipy.stats import chisquare

from dspark_sglang.scheduling.config import SchedulerConfig
from dspark_sglang.scheduling.cost_table import SpsCostTable
from dspark_sglang.sglang_integration.engine import CpuEngineSpec, cpu_engine
from dspark_sglang.sglang_integration.launch import drafter_sts, scheduler_env

pytestmark = [pytest.mark.sglang, pytest.mark.slow]

DRAFTER = Path(__file__).resolve().parents[2] / "dspark_sglang/assets/drafters/smollm2"
REQUESTS = 1200
NEW_TOKENS = (3, 4, 5, 6)
CONTROL_REQUESTS = 2000
CONCURRENCY = 32
PROBE_EVERY = 2
MIN_EXPECTED = 5.0
SEED = 20261205
SAMPLING = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "min_p": 0.0, "ignore_eos": True}
PEEK_LOG_ENV = "ANTICIPATING_FOLD_LOG"

PLUGIN = """\"\"\"Test-only SGLang plugin: a row drafts only when its first draft is the mode.\"\"\"

import os


def load():
    from dspark_sglang.sglang_integration import fallback

    honest = fallback.GuardedPropose.fold

    def fold(self, proposal, **kw):
        proposal = honest(self, proposal, **kw)
        block = proposal.draft_block
        if block.corrected_logits is None:
            return proposal
        peek = block.draft_tokens[:, 0] != block.corrected_logits[:, 0].argmax(dim=-1)
        plain = getattr(self.planner, fallback.PLAIN_ROWS_ATTR) | peek
        setattr(self.planner, fallback.PLAIN_ROWS_ATTR, plain)
        bs = int(kw["bs"])
        with open(os.environ[PEEK_LOG_ENV], "a") as f:
            f.write(f"{int(peek[:bs].sum())} {bs}\\n")
        anchor = fallback._pad_rows(kw["draft_input"].bonus_tokens.reshape(-1), plain.shape[0])
        confidence = getattr(self.planner, "carries_confidence", False)
        return fallback.fold_rows(proposal, plain, anchor, with_confidence=confidence)

    fallback.GuardedPropose.fold = fold
""".replace("PEEK_LOG_ENV", repr(PEEK_LOG_ENV))

Law = dict[tuple[int, int], float]


def _next_token_law(target: Any, ids: list[int]) -> torch.Tensor:
    logits, _, _ = target.forward(torch.tensor([ids]), logits_to_keep=1)
    return torch.softmax(logits[0, -1].double(), dim=-1)


def _pair_law(target: Any, prompt: list[int], floor: float) -> Law:
    """``p(t1, t2)`` of every pair at or above ``floor``."""
    p1 = _next_token_law(target, prompt)
    law: Law = {}
    for t1 in torch.nonzero(p1 >= floor).flatten().tolist():
        joint = p1[t1] * _next_token_law(target, [*prompt, t1])
        for t2 in torch.nonzero(joint >= floor).flatten().tolist():
            law[(t1, t2)] = float(joint[t2])
    return law


def _p_value(outputs: list[dict[str, Any]], law: Law) -> float:
    """Chi-square p: a bin per pair expected ``MIN_EXPECTED`` times, one for the rest."""
    n = len(outputs)
    pairs = [pair for pair, p in law.items() if p * n >= MIN_EXPECTED]
    bins = {pair: i for i, pair in enumerate(pairs)}
    probs = np.array([*(law[pair] for pair in pairs), 1.0 - sum(law[pair] for pair in pairs)])
    counts = np.zeros(len(probs))
    for o in outputs:
        counts[bins.get(tuple(o["output_ids"][:2]), len(pairs))] += 1
    return float(chisquare(counts, probs * n).pvalue)


def _write_plugin(folder: Path) -> Path:
    """``anticipating_fold`` as an installed distribution in ``folder``."""
    folder.mkdir()
    (folder / "anticipating_fold.py").write_text(PLUGIN)
    info = folder / "anticipating_fold-0.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: anticipating-fold\nVersion: 0.0\n")
    (info / "entry_points.txt").write_text(
        "[sglang.srt.plugins]\nanticipating_fold = anticipating_fold:load\n"
    )
    return folder


def _config(tmp: Path, name: str, **decision: Any) -> Path:
    table = tmp / "sps.json"
    SpsCostTable(
        sample_batch_tokens=(1, 64), sample_steps_per_sec=(20.0, 10.0), max_batch_tokens=256
    ).save(table)
    sts = drafter_sts(DRAFTER, greedy_only=False)
    assert sts is not None, f"{DRAFTER} ships no sampled STS file"
    path = tmp / f"{name}.yaml"
    SchedulerConfig(
        block_size=7,
        policy="prefix",
        cost_table_path=str(table),
        draft_step_seconds=1.0,
        ragged_mode="compact",
        sts_path=str(sts),
        **decision,
    ).save(path)
    return path


def _serve(
    target: Path, config: Path, prompt: list[int], lengths: tuple[int, ...], **env: str
) -> list[Any]:
    """Sampled replies to ``prompt`` of each length, at most ``CONCURRENCY`` running at once."""
    spec = CpuEngineSpec(
        model_path=str(target),
        overrides={
            "speculative_algorithm": "DSPARK_MOE",
            "speculative_draft_model_path": str(DRAFTER),
            "max_running_requests": CONCURRENCY,
            "random_seed": SEED,
        },
        env={**scheduler_env(config), **env},
    )
    params = [{**SAMPLING, "max_new_tokens": n} for n in lengths]
    with cpu_engine(spec) as engine:
        return list(engine.generate(input_ids=[prompt] * len(lengths), sampling_params=params))


def _steps(log: Path) -> list[bool]:
    """Whether each decode step drafted, from the decision log."""
    rows = [json.loads(line) for line in log.read_text().splitlines()]
    return [r["draft_decision"]["drafts"] for r in rows if "draft_decision" in r]


def _correct_drafts(outputs: list[dict[str, Any]]) -> int:
    return sum(int(o["meta_info"].get("spec_num_correct_drafts") or 0) for o in outputs)


@pytest.fixture(scope="module")
def tmp(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("draft_decision_lossless")


@pytest.fixture(scope="module")
def law(smollm2_path: Path, prompt_ids: list[list[int]]) -> Law:
    from dspark_sglang.targets.hf_target import HFTarget

    floor = MIN_EXPECTED / max(REQUESTS, CONTROL_REQUESTS)
    return _pair_law(HFTarget(smollm2_path), prompt_ids[0], floor)


@pytest.fixture(scope="module")
def honest(smollm2_path: Path, prompt_ids: list[list[int]], tmp: Path) -> dict[str, Any]:
    config = _config(tmp, "priced", draft_decision="priced", probe_every=PROBE_EVERY)
    log = tmp / "priced.jsonl"
    lengths = tuple(NEW_TOKENS[i % len(NEW_TOKENS)] for i in range(REQUESTS))
    outputs = _serve(smollm2_path, config, prompt_ids[0], lengths, DSPARK_DECISION_LOG=str(log))
    return {"outputs": outputs, "steps": _steps(log)}


@pytest.fixture(scope="module")
def anticipating(smollm2_path: Path, prompt_ids: list[list[int]], tmp: Path) -> dict[str, Any]:
    from sglang.srt.plugins import load_plugins

    plugins = _write_plugin(tmp / "plugins")
    peeks = tmp / "peeks.txt"
    peeks.touch()
    # This process loads its own plugins first. SGLang spawns its scheduler, which takes
    # this sys.path (multiprocessing's spawn sets it: PYTHONPATH would not reach it).
    load_plugins()
    with pytest.MonkeyPatch.context() as mp:
        mp.syspath_prepend(str(plugins))
        outputs = _serve(
            smollm2_path,
            _config(tmp, "always"),
            prompt_ids[0],
            (2,) * CONTROL_REQUESTS,
            **{PEEK_LOG_ENV: str(peeks)},
        )
    counts = [tuple(map(int, line.split())) for line in peeks.read_text().splitlines()]
    return {"outputs": outputs, "peeks": counts}


def test_the_engine_runs_plain_and_drafting_steps(honest: dict[str, Any]) -> None:
    steps = honest["steps"]
    drafted = sum(steps)
    assert 0 < drafted < len(steps) - drafted, f"{drafted} drafting of {len(steps)} steps"
    assert _correct_drafts(honest["outputs"]) > 0, "no draft was accepted"
    assert sorted({len(o["output_ids"]) for o in honest["outputs"]}) == list(NEW_TOKENS)


def test_first_two_tokens_follow_the_target(honest: dict[str, Any], law: Law) -> None:
    p = _p_value(honest["outputs"], law)
    assert p > 1e-3, f"chi-square p = {p:.3g}"


def test_a_decision_that_peeks_at_the_draft_is_rejected(
    anticipating: dict[str, Any], law: Law
) -> None:
    peeked = sum(n for n, _ in anticipating["peeks"])
    assert peeked > 0, "the anticipating plugin never ran"
    assert _correct_drafts(anticipating["outputs"]) > 0, "no draft was accepted"
    p = _p_value(anticipating["outputs"], law)
    assert p < 1e-6, f"chi-square p = {p:.3g}"
