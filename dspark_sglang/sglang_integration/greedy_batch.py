"""A drafting step whose requests are all greedy drafts by argmax.

SGLang's DSpark worker fixes at start-up whether its drafter samples the block
(``SGLANG_DSPARK_USE_GREEDY_DRAFT`` off, the setting of every tier that serves sampled
requests) or takes the argmax. In the sampling path a greedy request (temperature 0, or
top-k 1) already gets the argmax draft, since its step temperature is 0, but the step still
pays for sampling: it keeps the block's ``[bs, gamma, vocab]`` step logits, draws Gumbel noise
over the whole vocabulary for every row at every draft step (the noise is drawn for all rows
whenever the logits are kept), runs the non-finite check over those logits, and at one
request misses SGLang's one-row fused GEMV-plus-argmax kernel.

So a drafting step whose batch is all greedy runs SGLang's argmax path instead, on a CPU
worker (which has no captured draft graph bound to one mode); any other step, and every step
of a GPU worker, runs as configured.

Why the output is unchanged: every request of such a step is greedy, so the drafts are the
same argmax tokens (up to the order in which exact ties break), and SGLang verifies an
all-greedy batch by comparing tokens (``AcceptGreedy``), which reads no draft logits. The
choice reads only the batch's sampling parameters, fixed before the step.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch


class ArgmaxForGreedyBatches:
    """Wraps a proposer's ``propose``: an all-greedy batch drafts by argmax (module doc).

    ``argmax_steps`` counts the steps that took the argmax path, ``sampled_steps`` the others.
    """

    def __init__(self, original: Callable[..., Any], proposer: Any) -> None:
        self.original = original
        self.proposer = proposer
        self.configured = bool(proposer._greedy_draft)
        self.argmax_steps = 0
        self.sampled_steps = 0

    def __call__(self, **kw: Any) -> Any:
        if not self.applies(kw.get("sampling_info")):
            self.sampled_steps += 1
            return self.original(**kw)
        self.argmax_steps += 1
        self.proposer._greedy_draft = True
        try:
            return self.original(**kw)
        finally:
            self.proposer._greedy_draft = self.configured

    def applies(self, sampling_info: Any) -> bool:
        """Whether this step drafts by argmax although the worker is configured to sample."""
        return (
            not self.configured
            and sampling_info is not None
            and bool(sampling_info.is_all_greedy)
            and getattr(self.proposer, "_draft_sampler", None) is None
        )


def install(worker: Any) -> ArgmaxForGreedyBatches | None:
    """Wrap ``worker._proposer.propose`` on a CPU worker that samples its drafts; else None.

    Call before the fault guard wraps ``propose``, so the guard sees the argmax block.
    """
    proposer = getattr(worker, "_proposer", None)
    if proposer is None or bool(getattr(proposer, "_greedy_draft", True)):
        return None
    if torch.device(worker.device).type != "cpu":
        return None
    wrapped = ArgmaxForGreedyBatches(proposer.propose, proposer)
    proposer.propose = wrapped
    return wrapped
