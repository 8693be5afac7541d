"""Context copies in the DSPARK_MOE worker: the proposal rewrite, then one CPU engine.

Without an engine: ``ProposalCopier`` on SGLang's own ``DraftProposal`` structs, reading
the requests' text from a ``TokenHistory``.

With an engine: DSPARK_MOE with SGLang's dense draft (random weights, so its own
drafts are essentially never accepted) and ``context_copy_ngram: 2`` under
``verify_all``, with SGLang's overlap scheduler (DSPARK_MOE's default on a GPU; kept
on CPU here by ``DSPARK_CPU_OVERLAP_SCHEDULE=1``).
Greedy output must be the target's token for token, and the accepted length must
exceed 1 token per round: only copies can be accepted, so that is the copies working.
Each request needs exactly the rounds that copies from its whole current text give
(computed here from its output): the worker's token history is current under the
overlap, where the scheduler's own lists lag a round. Sampled requests
(temperature 1) run the rejection-sampling path against the copies' one-hot draft
logits and must complete.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import msgspec
import pytest
import torch
from moe_engine_spec import dummy_draft_spec

from dspark_sglang.model.context_copy import copy_drafts
from dspark_sglang.scheduling.config import SchedulerConfig
from dspark_sglang.sglang_integration import fallback
from dspark_sglang.sglang_integration.context_copy import ProposalCopier
from dspark_sglang.sglang_integration.dense_draft import write_dense_dspark_draft
from dspark_sglang.sglang_integration.engine import cpu_engine, generate_outputs
from dspark_sglang.sglang_integration.launch import CPU_OVERLAP_ENV, scheduler_env
from dspark_sglang.sglang_integration.token_history import TokenHistory

dspark_draft = pytest.importorskip("sglang.srt.speculative.dspark_components.dspark_draft")

NEW_TOKENS = 64  # as the hf_reference fixture (conftest.py)


def _req(prompt: list[int], output: list[int]) -> SimpleNamespace:
    return SimpleNamespace(origin_input_ids=prompt, output_ids=array("q", output))


def _copier(ngram: int, confidence: float, reqs: list[SimpleNamespace]) -> Any:
    """A copier whose history holds ``reqs``' text in pool slots 3, 1, ... (not 0, 1, ...:
    rows are found through ``req_pool_indices``), and the batch it is called with."""
    slots = torch.tensor([3, 1, 4][: len(reqs)])
    history = TokenHistory(rows=5, window=32, device="cpu")
    history.write_texts(slots, [[*r.origin_input_ids, *r.output_ids] for r in reqs])
    return ProposalCopier(ngram, confidence, history), SimpleNamespace(
        reqs=reqs, req_pool_indices=slots
    )


def _proposal(drafts: list[list[int]], *, vocab: int = 12, rows: int | None = None) -> Any:
    """SGLang's proposal for ``drafts`` (padded to ``rows``), with draft logits, verify ids
    and confidences, as a folded (graph) proposal carries them."""
    d = torch.tensor(drafts, dtype=torch.int64)
    rows = rows or d.shape[0]
    d = torch.cat([d, torch.full((rows - d.shape[0], d.shape[1]), 11)])
    n, g = d.shape
    anchor = torch.arange(n, dtype=torch.int64).view(n, 1)
    block = dspark_draft.DraftBlockResult(
        draft_tokens=d,
        corrected_logits=torch.randn(n, g, vocab, generator=torch.Generator().manual_seed(0)),
        greedy_mask=torch.zeros(n, dtype=torch.bool),
        temperatures=torch.ones(n, 1),
        greedy_draft=False,
    )
    return dspark_draft.DraftProposal(
        draft_block_ids=torch.cat([anchor, d], 1),
        draft_block=block,
        confidence=torch.full((n, g), 0.9),
        confidence_raw=torch.full((n, g), 2.0),
        folded=True,
        verify_ids=torch.cat([anchor, d], 1),
    )


def test_copier_rewrites_tokens_logits_verify_ids_and_confidences() -> None:
    # Request 0: "1 2 3 4 | 1 2" -> copies continue the repeat: 3 4 1.
    # Request 1: no repeated 2-gram -> the drafter's drafts stay.
    reqs = [_req([1, 2, 3, 4], [1, 2]), _req([5, 6], [7])]
    p = _proposal([[9, 9, 9], [8, 8, 8]], rows=3)  # one padding row (a graph's)
    copier, batch = _copier(2, 0.7, reqs)
    out = copier(p, batch=batch, bs=2)
    assert out.draft_block.draft_tokens.tolist() == [[3, 4, 1], [8, 8, 8], [11, 11, 11]]
    assert out.verify_ids.tolist() == [[0, 3, 4, 1], [1, 8, 8, 8], [2, 11, 11, 11]]
    assert out.folded is False  # the graph's own accept would read the old tokens
    probs = torch.softmax(out.draft_block.corrected_logits.float(), -1)
    assert probs[0].argmax(-1).tolist() == [3, 4, 1]
    assert torch.allclose(probs[0].max(-1).values, torch.ones(3))  # one-hot on the copies
    assert torch.equal(out.draft_block.corrected_logits[1:], p.draft_block.corrected_logits[1:])
    assert out.confidence[0].tolist() == pytest.approx([0.7] * 3)
    assert torch.equal(out.confidence[1:], p.confidence[1:])
    assert out.confidence_raw[0].tolist() == pytest.approx([math.log(0.7 / 0.3)] * 3)
    assert out.confidence_raw[1:].tolist() == [[2.0] * 3] * 2
    # The input proposal is untouched (SGLang may still hold its buffers).
    assert p.draft_block.draft_tokens[0].tolist() == [9, 9, 9] and p.folded


def test_copier_keeps_greedy_blocks_greedy_and_works_through_the_fault_guard() -> None:
    reqs = [_req([4, 5, 4], [])]
    p = fallback.plain_decoding_proposal(
        anchor=torch.tensor([4]), gamma=2, block_width=3, sampling_info=None, with_confidence=True
    )
    calls: list[int] = []

    def propose(**_: Any) -> Any:
        calls.append(1)
        return msgspec.structs.replace(
            p,
            draft_block=msgspec.structs.replace(p.draft_block, draft_tokens=torch.tensor([[0, 0]])),
        )

    planner = SimpleNamespace()
    guard = fallback.GuardedPropose(propose, SimpleNamespace(), planner, 2)
    guard.context_copy, batch = _copier(1, 0.5, reqs)
    kw = {
        "batch": batch,
        "bs": 1,
        "draft_input": SimpleNamespace(bonus_tokens=torch.tensor([4])),
    }
    out = guard(**kw)
    # "4 5 4": 4 -> 5 (copied), then 5 -> 4 (copied)
    assert out.draft_block.draft_tokens.tolist() == [[5, 4]]
    assert out.draft_block.greedy_draft and out.draft_block.corrected_logits is None
    # A copier that raises leaves the drafter's drafts and turns itself off.
    guard.context_copy = lambda *a, **k: 1 / 0
    out = guard(**kw)
    assert out.draft_block.draft_tokens.tolist() == [[0, 0]] and guard.context_copy is None
    assert len(calls) == 2 and guard.fallbacks == 0


def test_a_copier_without_its_history_raises() -> None:
    batch = SimpleNamespace(reqs=[_req([1], [])], req_pool_indices=torch.tensor([0]))
    with pytest.raises(RuntimeError, match="no token history"):
        ProposalCopier(2, 0.5)(_proposal([[1, 2]]), batch=batch, bs=1)


def test_a_failed_history_write_turns_copies_off_and_serving_goes_on() -> None:
    from dspark_sglang.sglang_integration.dspark_moe_worker import DSparkMoeWorker

    worker = DSparkMoeWorker.__new__(DSparkMoeWorker)
    guard = SimpleNamespace(context_copy=object())
    worker._proposer = SimpleNamespace(propose=guard)
    worker._dspark_guard = guard
    worker._dspark_token_history = history = TokenHistory(rows=2, window=8, device="cpu")
    worker._keep_history(lambda: history.write_texts(torch.tensor([1]), [[4, 5]]))
    assert vars(worker)["_dspark_token_history"] is history and guard.context_copy is not None
    worker._keep_history(lambda: history.write_texts(torch.tensor([9]), [[4, 5]]))  # no slot 9
    assert vars(worker)["_dspark_token_history"] is None and guard.context_copy is None


def test_copies_reach_the_fault_guard_when_a_profiler_wrapped_propose(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A tier with a start-up cost table gets its policy, and so its copier, after the
    round profiler (``DSPARK_PROFILE_ROUNDS``) has wrapped ``propose`` in a timer: the
    copier must still reach the fault guard, and then read the worker's token history."""
    from dspark_sglang.sglang_integration import dspark_moe_worker as dmw
    from dspark_sglang.sglang_integration import round_profile

    guard = fallback.GuardedPropose(lambda **_: None, SimpleNamespace(), SimpleNamespace(), 2)
    pool = SimpleNamespace(req_to_token=torch.zeros(2, 16, dtype=torch.int32))
    worker = SimpleNamespace(
        _proposer=SimpleNamespace(propose=guard),
        _dspark_guard=guard,
        gamma=2,
        target_worker=SimpleNamespace(model_runner=SimpleNamespace(req_to_token_pool=pool)),
    )
    # What instrument_worker does to ``propose``: a timer in its place.
    prof = round_profile.PhaseTimes()
    object.__setattr__(worker._proposer, "propose", prof.wrap(round_profile.PROPOSE, guard))
    cfg = SchedulerConfig(block_size=2, policy="prefix", sla_name="copy", context_copy_ngram=2)
    dmw._install_context_copy(worker, cfg)
    assert isinstance(guard.context_copy, ProposalCopier) and guard.context_copy.ngram == 2
    dmw._attach_token_history(worker)
    assert guard.context_copy.history is vars(worker)["_dspark_token_history"]


# --------------------------------------------------------------------------- engine


@pytest.fixture(scope="module")
def copy_engine(smollm2_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """With SGLang's overlap scheduler, as DSPARK_MOE runs on a GPU (kept on CPU by
    ``DSPARK_CPU_OVERLAP_SCHEDULE=1``)."""
    tmp = tmp_path_factory.mktemp("context_copy")
    draft = write_dense_dspark_draft(smollm2_path, tmp / "draft")
    cfg = tmp / "scheduler.yaml"
    SchedulerConfig(block_size=4, policy="verify_all", sla_name="copy", context_copy_ngram=2).save(
        cfg
    )
    env = {**scheduler_env(cfg), CPU_OVERLAP_ENV: "1"}
    with cpu_engine(dummy_draft_spec(smollm2_path, draft, env)) as engine:
        yield engine


@pytest.mark.sglang
@pytest.mark.slow
def test_greedy_output_is_the_targets_and_copies_are_accepted(
    copy_engine: Any, prompt_ids: list[list[int]], hf_reference: list[list[int]]
) -> None:
    outs = generate_outputs(copy_engine, prompt_ids, NEW_TOKENS)
    rounds = tokens = 0
    for i, (o, ref) in enumerate(zip(outs, hf_reference, strict=True)):
        assert list(o["output_ids"]) == ref, f"prompt {i} differs from the target's greedy output"
        meta = o["meta_info"]
        rounds += meta["spec_verify_ct"]
        tokens += meta["spec_accept_length"] * meta["spec_verify_ct"]
    # A random drafter alone accepts ~nothing (1.0 token per round); copies add the rest.
    assert tokens / rounds > 1.1, tokens / rounds


@pytest.mark.sglang
@pytest.mark.slow
def test_sampled_requests_complete_against_one_hot_copies(
    copy_engine: Any, prompt_ids: list[list[int]]
) -> None:
    outs = generate_outputs(
        copy_engine, prompt_ids, NEW_TOKENS, sampling={"temperature": 1.0, "ignore_eos": True}
    )
    for o in outs:
        assert len(o["output_ids"]) == NEW_TOKENS
        assert o["meta_info"]["spec_verify_ct"] > 0


def _rounds_with_copies(prompt: list[int], output: list[int], drafts: int, ngram: int) -> int:
    """Verify rounds a request needs when exactly its context copies are accepted: each
    round copies from the whole text so far (prompt + output up to the anchor), and a
    slot without a copy (the random drafter's) ends the round's accepted run."""
    rounds = 0
    pos = 1  # the prefill emitted output[0], the first round's anchor
    while pos < len(output):
        text = torch.tensor([[*prompt, *output[:pos]]])
        copies = copy_drafts(
            text, torch.tensor([text.shape[1]]), torch.full((1, drafts), -1), ngram
        )
        accepted = 0
        while (
            accepted < drafts
            and pos + accepted < len(output)
            and bool(copies.copied[0, accepted])
            and int(copies.tokens[0, accepted]) == output[pos + accepted]
        ):
            accepted += 1
        pos += accepted + 1
        rounds += 1
    return rounds


@pytest.mark.sglang
@pytest.mark.slow
def test_under_the_overlap_scheduler_every_round_copies_from_the_current_text(
    copy_engine: Any, prompt_ids: list[list[int]]
) -> None:
    """Copies of a stale text (a round behind, as the scheduler's lists are under the
    overlap) would accept fewer tokens, so a request would need more rounds than the
    whole current text gives; the random drafter's own rare hits may only need fewer."""
    assert copy_engine.get_server_info()["disable_overlap_schedule"] is False
    outs = generate_outputs(copy_engine, prompt_ids, NEW_TOKENS)
    observed = [int(o["meta_info"]["spec_verify_ct"]) for o in outs]
    expected = [
        _rounds_with_copies(p, list(o["output_ids"]), 4, 2)
        for p, o in zip(prompt_ids, outs, strict=True)
    ]
    assert all(a <= b for a, b in zip(observed, expected, strict=True)), (observed, expected)
    assert sum(observed) >= 0.95 * sum(expected), (observed, expected)
