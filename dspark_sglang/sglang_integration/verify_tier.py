"""Our verify lengths inside the CUDA-graph token tier SGLang sized for the step (compact mode).

What SGLang 0.5.23 does (``dspark_components/dspark_planner.py``,
``DSparkVerifyPlanner.schedule_layout``) under ``SGLANG_RAGGED_VERIFY_MODE=compact``:

* the step's token tier is ``N * max(min_verify_len, 1) + budget`` (capped at
  ``N * (B + 1)``; ``local_verify_tier_num_tokens``), ``budget`` being the lagged
  verify budget of ``compute_verify_token_budget`` (or, with
  ``--speculative-dspark-align-verify-tokens-to-graph-tier``, that tier's padded
  graph size minus the floor). The captured graph is the tier rounded up to the
  token grid; the tier is computed from ``budget``, *not* from the lengths
  ``_schedule_verify_lens`` returns. SGLang's own top-k keeps
  ``sum(verify_len - floor) <= budget``; a policy behind our hook does not, and
  ``RaggedVerifyLayout.padded_to_bucket`` then pads ``graph_num_tokens -
  sum(verify_lens)`` into the tail rows, which is negative.
* with a flat (uninitialised) SPS table, i.e. no
  ``--speculative-dspark-sps-table-path``, the planner marks itself verify-all
  (``_is_verify_all``) and serves a cached uniform layout without calling
  ``_schedule_verify_lens``: a configured DSPARK_MOE policy would never decide.

What we do, without patching SGLang:

* :func:`fit_to_budget` (called by the planner hook where ragged verify graphs are
  replayed, :func:`sizes_graph_tiers`) trims our lengths to
  ``sum(verify_len) <= N * floor + budget``, the tier's lower bound, so they fit
  whatever graph SGLang picks for the step. It drops the drafts with the lowest
  survival ``prod(c_1..c_j)`` first (survival never rises along a block, so the
  dropped ones are always a request's trailing drafts) and keeps every anchor
  (``verify_len >= 1``). The cap uses only this step's confidences and SGLang's
  budget (computed from older confidences), never a verify outcome, so the
  choice stays non-anticipating and verification lossless.
* :func:`schedule_every_step` (called by our worker when a scheduler config is
  loaded) clears the verify-all shortcut, so ``schedule_layout`` takes its
  scheduling path and our hook decides. The flat table's budget is then "every
  lagged draft with survival >= ``survival_eps``", which the tier follows.
* :func:`full_block_verifies_in_place` (same call, where no verify graphs are
  replayed): a step whose layout verifies every request's whole block runs SGLang's
  non-compact verify, the one its static mode runs. The compact path packs the rows,
  then scatters the logits and hidden states back to the ``[N * (B + 1)]`` window the
  accept reads; for a whole block that window is the verify's own, so the packing buys
  nothing and costs ~2 % of a one-request round on CPU. Same tokens, positions and KV
  slots either way, so the accept sees the same logits.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

logger = logging.getLogger(__name__)


def fit_to_budget(
    verify_lens: torch.Tensor,
    confidence: torch.Tensor,
    budget: int | None,
    min_verify_len: int = 1,
) -> torch.Tensor:
    """``verify_lens [N]`` (anchor included) trimmed to ``N * max(min_verify_len, 1) + budget``.

    Unchanged when ``budget`` is ``None`` (SGLang then sizes the tier for the whole
    block) or when the lengths already fit. Otherwise the excess drafts are removed
    lowest survival first (ties: later position, then later request), never a
    request's anchor. Returns int32 on ``verify_lens``'s device.
    """
    if budget is None:
        return verify_lens
    # Device ops only (no host read-back): the kept drafts are the ``keep`` best by
    # rank, where ``keep`` is a device scalar; when nothing exceeds the tier,
    # ``keep`` counts every chosen draft and the lengths come back unchanged.
    n, b = int(verify_lens.shape[0]), int(confidence.shape[1])
    dev = verify_lens.device
    limit = n * max(int(min_verify_len), 1) + budget
    lens = verify_lens.detach().to(torch.int64)
    surv = torch.cumprod(confidence.detach().to(dev, torch.float64).clamp(0.0, 1.0), dim=1)
    pos = torch.arange(b, device=dev).expand(n, b)
    chosen = pos < (lens - 1).clamp(0, b).unsqueeze(1)
    # Position-major flattening, so a stable sort by survival (descending) breaks
    # ties by the earlier position, then the earlier request; unchosen drafts last.
    key = torch.where(chosen, surv, torch.full_like(surv, -1.0)).t().reshape(-1)
    order = torch.argsort(key, descending=True, stable=True)
    rank = torch.empty_like(order)
    rank[order] = torch.arange(order.numel(), device=dev)
    excess = (lens.sum() - limit).clamp(min=0)
    keep = (chosen.sum() - excess).clamp(min=0)
    kept = chosen & (rank.view(b, n).t() < keep)
    return (kept.sum(dim=1) + 1).to(dtype=torch.int32)


def sizes_graph_tiers(planner: Any) -> bool:
    """Whether the planner's model runner replays ragged verify graphs (then a tier binds).

    Without them (a CPU engine, ``--disable-cuda-graph``) SGLang lays the verify out
    as exactly ``sum(verify_lens)`` tokens (``verify_layout_grid``: no graph floor, no
    padding), so there is no tier for our lengths to fit and none are trimmed.
    """
    return replays_verify_graphs(planner.model_runner)


def replays_verify_graphs(model_runner: Any) -> bool:
    """Whether ``model_runner`` replays ragged verify CUDA graphs (SGLang's own test)."""
    from sglang.srt.speculative.dspark_components.dspark_planner import (
        ragged_capture_num_tokens,
    )

    return ragged_capture_num_tokens(model_runner=model_runner) is not None


def schedule_every_step(planner: Any, simulate_acc_len: float = 0.0) -> bool:
    """Make a compact-mode planner call ``_schedule_verify_lens`` every step.

    Clears SGLang's verify-all shortcut (flat SPS table); returns whether it was set.
    Refuses ``SGLANG_SIMULATE_ACC_LEN`` other than 0 or 1.0, as SGLang does for any
    trimming schedule (its own check ran while the planner was still verify-all).
    """
    if not getattr(planner, "_is_verify_all", False) or not planner.is_compact_mode:
        return False
    if simulate_acc_len > 0 and simulate_acc_len != 1.0:
        raise ValueError(
            f"SGLANG_SIMULATE_ACC_LEN={simulate_acc_len} needs every draft verified, but "
            "DSPARK_SCHEDULER_CONFIG makes our policy choose per-request verify lengths; "
            "unset DSPARK_SCHEDULER_CONFIG or use SGLANG_SIMULATE_ACC_LEN=1.0"
        )
    planner._is_verify_all = False
    logger.info(
        "DSPARK_MOE: compact ragged verify without --speculative-dspark-sps-table-path; "
        "SGLang would verify every draft, our scheduler policy decides instead"
    )
    return True


def is_full_block(layout: Any, block_width: int) -> bool:
    """Whether ``layout`` verifies all ``block_width`` tokens (anchor + drafts) of every
    request. Reads the host copy of the lengths when SGLang kept one, else the lengths
    themselves if they are on the host; lengths only on a device answer False (the step
    stays compact) rather than read them back in the middle of a step."""
    lens = getattr(layout, "verify_lens_cpu", None)
    if lens is None:
        if layout.verify_lens.device.type != "cpu":
            return False
        lens = layout.verify_lens.tolist()
    return bool(lens) and min(lens) == block_width


def full_block_verifies_in_place(planner: Any) -> bool:
    """Run a whole-block step through SGLang's non-compact verify (module doc).

    Wraps the planner's ``should_run_compact`` on this instance of a compact-mode planner;
    returns whether it wrapped. Where verify graphs are replayed the wrapper changes
    nothing (a captured compact graph runs the step it was sized for). Whether they are is
    read at each step, as the planner hook reads it: the graph runner does not exist yet
    when a policy without a start-up table is attached, in the worker's constructor.
    """
    if not getattr(planner, "is_compact_mode", False):
        return False
    original = planner.should_run_compact
    width = int(planner.verify_num_draft_tokens)

    def should_run_compact(*, layout: Any) -> bool:
        return bool(original(layout=layout)) and (
            sizes_graph_tiers(planner) or not is_full_block(layout, width)
        )

    # An instance attribute, as the worker's other wrappers: SGLang's class is untouched.
    object.__setattr__(planner, "should_run_compact", should_run_compact)
    return True
