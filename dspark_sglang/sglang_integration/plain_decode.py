"""A step the draft decision leaves plain, run as SGLang's own decode step.

Without this, a plain step still ran the speculative pipeline with every verify
length 1: a placeholder proposal, the verify planner, a ``TARGET_VERIFY`` forward
of one token per request, a scatter of its logits and hidden states to the
``[bs * (gamma + 1)]`` block layout, the accept, and the draft-context commit of
the whole block's rows. Here the step is what plain decoding runs:

1. SGLang's verify window is allocated as for any decode step (its first column is
   the slot of the token this step writes, so the KV layout of the next drafting
   round is the same as after a verify of length 1);
2. the target's forward in ``DECODE`` mode on each request's anchor, writing its KV
   into that first column, with the hidden states the drafter reads captured;
3. SGLang's sampler on those logits (``model_runner.sample``: every sampling mode a
   plain server serves);
4. the draft-context commit of exactly those ``bs`` hidden states at their positions,
   so the next drafting round sees the context it would have seen after a verify;
5. SGLang's result: the sampled token committed (accept length 1), the rest of the
   block's row unused, the next draft input anchored on the sampled token.

Why the output is the target's: the emitted token is drawn by plain decoding's own
sampler from the target's logits at the anchor, and the decision to run this step
was made before it from earlier rounds only (``draft_gate``).

Where it runs (:func:`eligible`): a CPU worker (no CUDA graphs, so a decode forward
is not slower than a captured verify graph) with the draft decision on, one TP rank,
and a batch without the features whose per-step state only the verify path keeps
(grammar, logprobs, sampling masks, logit adjustments, simulated acceptance, engram,
mamba, DP coordination). Any other step takes SGLang's path unchanged.
"""

from __future__ import annotations

from typing import Any

import torch


def try_plain_step(worker: Any, guard: Any, batch: Any, args: tuple, kwargs: dict) -> Any:
    """Ask the draft decision before SGLang's decode step; run a plain one here if it says
    so and :func:`eligible` holds, else return None (SGLang's step runs, its proposal told
    through ``guard.decided_to_draft`` that the decision was already asked)."""
    from dspark_sglang.sglang_integration.draft_gate import SKIPPED_ATTR

    gate = getattr(guard, "draft_gate", None)
    plain = vars(worker).get("_dspark_plain_decode")
    coordination = args[2] if len(args) > 2 else kwargs.get("coordination_plan")
    if gate is None or plain is None or not eligible(worker, batch, coordination):
        return None
    if gate.drafts(batch, len(batch.seq_lens)):
        guard.decided_to_draft = True
        return None
    setattr(worker._verify_planner, SKIPPED_ATTR, True)
    return plain(batch, args[0] if args else kwargs.get("on_publish"))


def eligible(worker: Any, batch: Any, coordination_plan: Any) -> bool:
    """Whether a plain step of ``batch`` may run as a decode step (module doc)."""
    from sglang.srt.runtime_context import get_parallel
    from sglang.srt.speculative.dspark_components.dspark_verify import (
        verify_logits_adjustments_are_noop,
    )

    sampling_info = batch.sampling_info
    runner = worker.target_worker.model_runner
    engram = getattr(getattr(runner, "ngram_embedding_manager", None), "engram_hasher", None)
    return (
        torch.device(worker.device).type == "cpu"
        and coordination_plan is None
        and int(get_parallel().tp_size) == 1
        and not batch.forward_mode.is_idle()
        and not batch.has_grammar
        and not batch.return_logprob
        and batch.seq_lens_cpu is not None
        and sampling_info is not None
        and getattr(sampling_info, "sampling_mask_batch_indices", None) is None
        and verify_logits_adjustments_are_noop(sampling_info)
        and not getattr(worker, "_simulate_acc_greedy", False)
        and not getattr(worker, "_sim_draw_ahead", False)
        and getattr(worker._verify_executor, "_simulated_correct_len", None) is None
        and not getattr(worker, "_need_mamba_verify_commit", False)
        and engram is None
    )


class PlainDecodeStep:
    """Runs :func:`try_plain_step`'s plain steps for one worker.

    Its two phases are methods so the round profiler (``round_profile``) can time them
    as a round's ``verify_forward`` and ``commit_hidden``.
    """

    def __init__(self, worker: Any) -> None:
        self.worker = worker

    def __call__(self, batch: Any, on_publish: Any) -> Any:
        """One plain decode step of ``batch`` (module doc, steps 1-5)."""
        from sglang.srt.managers.scheduler import GenerationBatchResult
        from sglang.srt.speculative.dspark_components.dspark_draft import make_next_draft_input
        from sglang.srt.speculative.dspark_components.dspark_planner import alloc_verify_window
        from sglang.srt.speculative.dspark_components.dspark_verify import build_accept_outs
        from sglang.srt.speculative.spec_tp_sync import SpecTpSyncSite

        worker = self.worker
        bs = len(batch.seq_lens)
        prefix_lens = batch.seq_lens
        stride = int(worker.verify_num_draft_tokens)
        anchors = batch.spec_info.bonus_tokens.view(-1)[:bs]
        window = alloc_verify_window(
            batch=batch,
            bs=bs,
            device=worker.device,
            verify_num_draft_tokens=stride,
            block_pos_offsets=worker._block_pos_offsets,
            model_runner=worker.model_runner,
            seq_lens_cpu=batch.seq_lens_cpu,
        )
        t0 = worker._dspark_clock()
        logits_output, next_tokens = self.forward(batch, anchors, window)
        worker._dspark_verify_seconds += worker._dspark_clock() - t0
        self.commit(batch, logits_output.hidden_states, window)
        logits_output.hidden_states = None

        zeros = torch.zeros(bs, dtype=torch.int32, device=prefix_lens.device)
        accept = build_accept_outs(
            correct_len=zeros,
            bonus=next_tokens.to(anchors.dtype),
            cap_trim_lens=zeros,
            prefix_lens=prefix_lens,
            draft_tokens=anchors.unsqueeze(1).expand(bs, int(worker.gamma)),
            gamma=int(worker.gamma),
            verify_num_draft_tokens=stride,
            tp_sync=worker._verify_executor._tp_sync,
            sync_site=SpecTpSyncSite.DSPARK_ACCEPT_GREEDY,
        )
        if on_publish is not None:
            on_publish(accept.new_seq_lens)
        return GenerationBatchResult(
            logits_output=logits_output,
            next_token_ids=accept.out_tokens.reshape(-1),
            accept_lens=accept.commit_lens,
            block_accept_lens=worker._block_accept_lens(accept=accept, folded_accept=False, bs=bs),
            cap_lens=torch.ones(bs, dtype=torch.int32, device=prefix_lens.device),
            can_run_cuda_graph=False,
            next_draft_input=make_next_draft_input(
                bonus_tokens=accept.bonus, new_seq_lens=accept.new_seq_lens
            ),
            speculative_num_draft_tokens=stride,
            new_seq_lens=accept.new_seq_lens,
        )

    def forward(self, batch: Any, anchors: torch.Tensor, window: Any) -> tuple[Any, torch.Tensor]:
        """The target's ``DECODE`` forward on the anchors, writing the window's first
        column, then SGLang's sampler: ``(logits output, sampled tokens [bs])``."""
        from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode, ForwardBatch

        target = self.worker.target_worker
        bs = int(anchors.shape[0])
        saved = (batch.input_ids, batch.seq_lens, batch.seq_lens_cpu, batch.seq_lens_sum)
        spec_info = batch.spec_info
        try:
            # A decode forward reads each request's KV up to and including the token it writes.
            batch.input_ids = anchors
            batch.seq_lens = saved[1] + 1
            batch.seq_lens_cpu = saved[2] + 1
            batch.seq_lens_sum = int(saved[3]) + bs
            batch.spec_info = None
            forward_batch = ForwardBatch.init_new(
                batch,
                target.model_runner,
                capture_hidden_mode=CaptureHiddenMode.FULL,
                return_hidden_states_before_norm=False,
                kv_loc_plan=window.kv_loc_plan,
                write_cols=slice(0, 1),
            )
        finally:
            batch.input_ids, batch.seq_lens, batch.seq_lens_cpu, batch.seq_lens_sum = saved
            batch.spec_info = spec_info
        # ``is_verify``: the forward without SGLang's sampling, which runs next on its logits.
        out = target.forward_batch_generation(
            batch=None, forward_batch=forward_batch, is_verify=True
        )
        logits_output = out.logits_output
        if logits_output.hidden_states is None:
            raise RuntimeError("DSPARK_MOE plain step: the target returned no hidden states")
        return logits_output, target.model_runner.sample(logits_output, forward_batch)

    def commit(self, batch: Any, hidden: torch.Tensor, window: Any) -> None:
        """The draft-context commit of the ``bs`` decoded tokens' target hidden states."""
        bs = len(batch.seq_lens)
        injector = self.worker._verify_executor.kv_injector
        injector.inject_target_hidden(
            target_hidden=hidden[:bs],
            cache_loc=injector.ids_for(window.kv_loc_plan, cols=slice(0, 1)).reshape(-1),
            positions=batch.seq_lens.to(torch.int64),
            state_slot=(
                batch.req_pool_indices[:bs] if injector.swa_ring_size is not None else None
            ),
        )
