"""The two-row accept of an anchor-only step (``plain_accept``) against SGLang's own.

Greedy: on random target logits, with placeholder drafts (every draft the anchor, some
anchors equal to the first row's argmax so SGLang's uncapped accept would take drafts),
the narrowed accept gives SGLang's full accept's tokens, lengths and sequence lengths
exactly. The router sends only anchor-only steps with a per-request layout to it.
Sampled steps are covered through the engine (``test_sglang_draft_decision_lossless``).
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch

from dspark_sglang.sglang_integration import plain_accept
from dspark_sglang.sglang_integration.fallback import FORCE_PLAIN_ATTR, plain_decoding_proposal

pytestmark = pytest.mark.sglang

BS, GAMMA, VOCAB = 6, 7, 97
STRIDE = GAMMA + 1


def _executor() -> Any:
    from sglang.srt.speculative.spec_tp_sync import SpecTpSync

    return SimpleNamespace(
        verify_num_draft_tokens=STRIDE,
        gamma=GAMMA,
        _tp_sync=SpecTpSync(SimpleNamespace(world_size=1, rank_in_group=0)),
        _simulated_correct_len=None,
    )


def _step(seed: int) -> dict[str, Any]:
    from sglang.srt.speculative.ragged_verify import RaggedVerifyLayout

    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(BS * STRIDE, VOCAB, generator=g) * 3
    anchor = torch.randint(0, VOCAB, (BS,), generator=g)
    first = logits.view(BS, STRIDE, VOCAB)[:, 0].argmax(-1)
    anchor[::2] = first[::2]  # these rows' first draft is the target's own token
    proposal = plain_decoding_proposal(
        anchor=anchor, gamma=GAMMA, block_width=GAMMA, sampling_info=None, with_confidence=True
    )
    ones = torch.ones(BS, dtype=torch.int32)
    layout = RaggedVerifyLayout(
        verify_lens=ones,
        graph_num_tokens=BS,
        extend_start_loc=torch.arange(BS, dtype=torch.int32),
        qo_indptr_device=torch.arange(BS + 1, dtype=torch.int32),
    )
    verify_ids = torch.cat([anchor[:, None], proposal.draft_block.draft_tokens], 1)
    return {
        "folded_accept": False,
        "bs": BS,
        "verify_ids_2d": verify_ids,
        "target_logits": logits,
        "draft_block": proposal.draft_block,
        "sampling_info": None,
        "draft_input": SimpleNamespace(bonus_tokens=anchor),
        "layout": layout,
        "prefix_lens": torch.randint(10, 50, (BS,), generator=g),
        "draft_tokens": proposal.draft_block.draft_tokens,
        "simulate_bonus_sampling_info": None,
    }


def _full_accept(executor: Any, kw: dict[str, Any]) -> Any:
    from sglang.srt.speculative.dspark_components.dspark_verify import (
        SpecTpSyncSite,
        accept_draft_tokens,
        build_accept_outs,
    )

    correct_len, bonus, trim = accept_draft_tokens(
        candidates=kw["verify_ids_2d"],
        target_logits=kw["target_logits"],
        draft_block=kw["draft_block"],
        sampling_info=None,
        draft_input=kw["draft_input"],
        gamma=GAMMA,
        verify_num_draft_tokens=STRIDE,
        cutoff_layout=kw["layout"],
    )
    return build_accept_outs(
        correct_len=correct_len,
        bonus=bonus,
        cap_trim_lens=trim,
        prefix_lens=kw["prefix_lens"],
        draft_tokens=kw["draft_tokens"],
        gamma=GAMMA,
        verify_num_draft_tokens=STRIDE,
        tp_sync=executor._tp_sync,
        sync_site=SpecTpSyncSite.DSPARK_ACCEPT_GREEDY,
    )


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_greedy_two_row_accept_equals_sglangs_full_accept(seed: int) -> None:
    executor = _executor()
    kw = _step(seed)
    full = _full_accept(executor, kw)
    ours = plain_accept.anchor_only_accept(executor, **kw)
    assert bool((full.cap_trim_lens[::2] > 0).all()), "the uncapped accept took no draft"
    for name in ("correct_len", "bonus", "commit_lens", "new_seq_lens", "out_tokens"):
        assert torch.equal(getattr(ours, name), getattr(full, name)), name
    assert torch.equal(ours.bonus, kw["target_logits"].view(BS, STRIDE, VOCAB)[:, 0].argmax(-1))
    assert not bool(ours.cap_trim_lens.any())


def test_only_anchor_only_steps_with_a_layout_take_the_two_row_accept() -> None:
    executor, planner = _executor(), SimpleNamespace()
    calls: list[str] = []
    executor.accept_and_finalize = lambda **kw: calls.append("full")
    plain_accept.install(executor, planner)
    kw = _step(0)
    executor.accept_and_finalize(**kw)  # a drafting step
    setattr(planner, FORCE_PLAIN_ATTR, True)
    executor.accept_and_finalize(**{**kw, "layout": None})  # static mode: whole blocks
    executor.accept_and_finalize(**{**kw, "folded_accept": True})  # accepted in a graph
    assert calls == ["full", "full", "full"]
    out = executor.accept_and_finalize(**kw)
    assert calls == ["full", "full", "full"] and out is not None
