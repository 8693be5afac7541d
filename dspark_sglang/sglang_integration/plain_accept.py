"""The accept of a step in which every request verifies its anchor only, on two rows.

A plain step (the draft decision chose no draft, or a drafter fault fell back) still
runs SGLang's whole verify pipeline: the accept reads ``[bs * (gamma + 1), vocab]``
target logits, takes an argmax of every row (greedy) or a softmax of every row plus a
one-hot draft distribution of ``[bs, gamma, vocab]`` (sampled), although with verify
length 1 only each request's first row can decide anything.

Why two rows give the same outcome: with every verify length 1, SGLang's accept caps
each request's correct length at 0 (``CapCorrectLen``), so its bonus is read from the
first verify row alone. Greedy: the bonus is that row's argmax. Sampled: the chain
rejection sampler either accepts the first placeholder draft (probability ``p(d)``
under its one-hot draft distribution) or draws from the residual ``p`` without ``d``;
either way the emitted token is distributed as ``p``, the target's first-row
distribution, whatever the rows behind it hold. Running SGLang's own accept on the
anchor row and one draft row keeps every sampling mode SGLang supports (temperature,
top-k, top-p, mixed greedy rows) and its TP synchronisation. ``cap_trim_lens`` is 0:
a step that verifies no draft trims none.

Used only where the host knows every verify length is 1 (the planner's
``FORCE_PLAIN_ATTR``), with a per-request layout (``compact`` or ``cap-accept``; the
``static`` mode verifies whole blocks), and never with SGLang's simulated acceptance.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec
import torch

#: Verify rows the narrowed accept reads per request: the anchor and one draft.
ROWS = 2


def applies(executor: Any, planner: Any, *, folded_accept: bool, layout: Any) -> bool:
    """Whether this step's accept may run on :data:`ROWS` rows per request."""
    from dspark_sglang.sglang_integration.fallback import FORCE_PLAIN_ATTR

    return (
        bool(getattr(planner, FORCE_PLAIN_ATTR, False))
        and not folded_accept
        and layout is not None
        and getattr(executor, "_simulated_correct_len", None) is None
        and int(executor.verify_num_draft_tokens) > ROWS
    )


def anchor_only_accept(executor: Any, **kw: Any) -> Any:
    """SGLang's eager accept of an anchor-only step, on the first :data:`ROWS` rows."""
    from sglang.srt.speculative.dspark_components.dspark_verify import (
        SpecTpSyncSite,
        accept_draft_tokens,
        build_accept_outs,
    )

    bs = int(kw["bs"])
    stride = int(executor.verify_num_draft_tokens)
    logits = kw["target_logits"]
    narrow_logits = logits.view(bs, stride, logits.shape[-1])[:, :ROWS]
    block = kw["draft_block"]
    narrow_block = msgspec.structs.replace(
        block,
        draft_tokens=block.draft_tokens[:, : ROWS - 1].contiguous(),
        corrected_logits=(
            None
            if block.corrected_logits is None
            else block.corrected_logits[:, : ROWS - 1].contiguous()
        ),
    )
    sampling_info = kw["sampling_info"]
    correct_len, bonus, _ = accept_draft_tokens(
        candidates=kw["verify_ids_2d"][:, :ROWS].contiguous(),
        target_logits=narrow_logits.reshape(bs * ROWS, -1),
        draft_block=narrow_block,
        sampling_info=sampling_info,
        draft_input=kw["draft_input"],
        gamma=ROWS - 1,
        verify_num_draft_tokens=ROWS,
        cutoff_layout=kw["layout"],
        fused_argmax=getattr(executor, "_fused_argmax", False),
        block_verification=getattr(executor, "_block_verification", False),
        rejection_noise=getattr(executor, "_rejection_noise", None),
    )
    greedy = sampling_info is None or sampling_info.is_all_greedy
    return build_accept_outs(
        correct_len=correct_len,
        bonus=bonus,
        cap_trim_lens=torch.zeros_like(correct_len),
        prefix_lens=kw["prefix_lens"],
        draft_tokens=kw["draft_tokens"],
        gamma=int(executor.gamma),
        verify_num_draft_tokens=stride,
        tp_sync=executor._tp_sync,
        sync_site=(
            SpecTpSyncSite.DSPARK_ACCEPT_GREEDY if greedy else SpecTpSyncSite.DSPARK_ACCEPT_SAMPLE
        ),
    )


def install(executor: Any, planner: Any) -> None:
    """Route the executor's anchor-only accepts through :func:`anchor_only_accept`.

    An instance attribute on our worker's own executor: SGLang's class is untouched.
    """
    full: Callable[..., Any] = executor.accept_and_finalize

    def accept_and_finalize(**kw: Any) -> Any:
        if applies(
            executor, planner, folded_accept=bool(kw.get("folded_accept")), layout=kw.get("layout")
        ):
            return anchor_only_accept(executor, **kw)
        return full(**kw)

    object.__setattr__(executor, "accept_and_finalize", accept_and_finalize)
