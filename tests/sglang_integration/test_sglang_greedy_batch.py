"""An all-greedy drafting step drafts by argmax on a CPU worker that samples (``greedy_batch``).

The engine-level guarantee (greedy output equals plain decoding's under a tier that samples
its drafts) is held by the DSPARK_MOE engine tests, whose greedy requests now take this
path; here the choice itself: when it applies, that the proposer's mode is restored after
the step (also when the drafter raises), and where it is not installed.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from dspark_sglang.sglang_integration import greedy_batch


class Proposer:
    """SGLang's proposer surface this wrapper reads: ``_greedy_draft``, ``_draft_sampler``,
    ``propose``; ``propose`` records the mode it ran in."""

    def __init__(self, greedy_draft: bool = False, draft_sampler: Any = None) -> None:
        self._greedy_draft = greedy_draft
        self._draft_sampler = draft_sampler
        self.modes: list[bool] = []
        self.fail = False

    def propose(self, **kw: Any) -> str:
        self.modes.append(self._greedy_draft)
        if self.fail:
            raise RuntimeError("drafter fault")
        return "proposal"


def _info(all_greedy: bool) -> SimpleNamespace:
    return SimpleNamespace(is_all_greedy=all_greedy)


def _installed(proposer: Proposer, device: str = "cpu") -> Any:
    worker = SimpleNamespace(_proposer=proposer, device=device)
    return greedy_batch.install(worker)


def test_an_all_greedy_step_drafts_by_argmax_and_a_mixed_one_samples() -> None:
    proposer = Proposer()
    wrapped = _installed(proposer)
    assert wrapped is proposer.propose
    assert proposer.propose(sampling_info=_info(True)) == "proposal"
    proposer.propose(sampling_info=_info(False))
    proposer.propose(sampling_info=None)
    assert proposer.modes == [True, False, False]
    assert (wrapped.argmax_steps, wrapped.sampled_steps) == (1, 2)
    assert proposer._greedy_draft is False


def test_the_configured_mode_is_restored_when_the_drafter_raises() -> None:
    proposer = Proposer()
    _installed(proposer)
    proposer.fail = True
    with pytest.raises(RuntimeError, match="drafter fault"):
        proposer.propose(sampling_info=_info(True))
    assert proposer.modes == [True] and proposer._greedy_draft is False


def test_a_captured_draft_sampler_keeps_its_mode() -> None:
    proposer = Proposer()
    wrapped = _installed(proposer)
    proposer._draft_sampler = object()  # built at graph capture, bound to one mode
    proposer.propose(sampling_info=_info(True))
    assert proposer.modes == [False] and wrapped.argmax_steps == 0


@pytest.mark.parametrize(("greedy_draft", "device"), [(True, "cpu"), (False, "cuda")])
def test_not_installed_on_argmax_tiers_or_gpu_workers(greedy_draft: bool, device: str) -> None:
    proposer = Proposer(greedy_draft=greedy_draft)
    original = proposer.propose
    assert _installed(proposer, device) is None
    assert proposer.propose == original


def test_no_proposer_installs_nothing() -> None:
    assert greedy_batch.install(SimpleNamespace(device="cpu")) is None
