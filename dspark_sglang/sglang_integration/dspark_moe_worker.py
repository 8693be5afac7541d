"""The DSPARK_MOE worker: SGLang's ``DSparkWorkerV2`` with our scheduler and metrics.

Built by ``dspark_moe``'s worker factory, so only a process that runs DSPARK_MOE
imports it (and with it SGLang's ``DSparkWorkerV2``); see ``dspark_moe`` for the
algorithm object registered in every SGLang process and for what DSPARK_MOE adds.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import torch
from sglang.srt.speculative.dspark_components.dspark_worker_v2 import DSparkWorkerV2

logger = logging.getLogger(__name__)

#: A verify policy: calibrated confidences ``[N, B]`` -> drafts to verify ``[N]``.
VerifyPolicy = Callable[[torch.Tensor], torch.Tensor]


class DSparkMoeWorker(DSparkWorkerV2):
    """SGLang's DSpark worker with our scheduler and metrics.

    * Verify lengths: when ``DSPARK_SCHEDULER_CONFIG`` names a config, our
      policy decides them (``scheduler_bridge``: the config is validated here,
      at start-up, and the planner is tagged so the planner hook uses it);
      otherwise SGLang's planner decides, as in DSPARK. In compact ragged verify
      the planner always asks our hook (``verify_tier``: no verify-all shortcut)
      and our lengths are trimmed to the step's CUDA-graph token tier.
    * Cost table: a config without ``cost_table_path`` whose policy needs one gets
      a small SPS staircase measured here, before serving (``startup_profile``).
    * STS: a config's ``sts_path`` (SGLang's STS format, validated by our
      loader) sets the confidence head's per-position temperatures, the same
      place SGLang's ``--speculative-dspark-confidence-sts-path`` writes.
    * Metrics: every decode step adds into ``metrics.StepMetrics`` on the device;
      SGLang's own result copy brings a snapshot to the host (``MetricsFlush``).
    * Start-up: a draft whose attention heads the TP ranks cannot share is
      refused before SGLang builds it (``launch.check_draft_heads``; CPU pads).
    * Faults: the proposer's ``propose`` is wrapped (``fallback.GuardedPropose``)
      so a drafter error turns that step, and non-finite output the affected
      rows (on the device), into plain decoding instead of failing the batch.
    * Greedy batches: on a CPU worker that samples its drafts, a drafting step whose
      requests are all greedy takes SGLang's argmax draft path (``greedy_batch``).
    * Round cost: on a CPU worker whose config leaves ``draft_step_seconds`` unset,
      each decode round and the target's verify in it are timed per shape (requests x
      verify tokens) and the policy prices rounds from those timings
      (``scheduler_bridge.VerifyDecider.observe_round``, ``round_costs``); never on a GPU.
    * Context copies: a config's ``context_copy_ngram`` rewrites each step's proposal
      after the fault guard (``context_copy``), reading each request's text from a
      device table this worker writes at prefill and after each verify
      (``token_history``), so copies work with the overlap scheduler.
    * Plain steps: a step the draft decision leaves plain runs as SGLang's decode step on
      a CPU worker (``plain_decode``: decode forward, SGLang's sampler, the draft-context
      commit of the decoded tokens). Any other step in which every request verifies its
      anchor only (a drafter fault; a plain step where ``plain_decode`` does not apply)
      accepts on two verify rows per request (``plain_accept``).
    * Profiling aid: ``DSPARK_PROFILE_ROUNDS=<file.json>`` times each phase of
      a decode round (``round_profile``); unset, nothing is wrapped.
    """

    verify_policy: VerifyPolicy | None = None
    #: The decider that prices rounds from their timings (``times_rounds``), else None.
    _dspark_round_timer: Any = None
    #: Host clock the round timing reads (a test swaps it for a fake one).
    _dspark_clock: Callable[[], float] = staticmethod(time.perf_counter)
    #: Seconds of the target's verify in the round running now (timed rounds only).
    _dspark_verify_seconds: float = 0.0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        from dspark_sglang.sglang_integration import dense_draft_checks, moe_draft_model

        # Before SGLang loads the draft: our checkpoints name DSparkMoEDraftModel.
        moe_draft_model.register_model_class()
        target_worker = kwargs.get("target_worker", args[3] if len(args) > 3 else None)
        _check_draft_heads(target_worker)
        dense_draft_checks.check_folder_before_load(target_worker)  # a DeepSpec folder
        super().__init__(*args, **kwargs)
        from dspark_sglang.sglang_integration import (
            fallback,
            metrics,
            plain_accept,
            plain_decode,
            round_profile,
        )

        moe_draft_model.check_loaded_draft(self.draft_model, self.target_worker, int(self.gamma))
        from sglang.srt.runtime_context import get_parallel

        # Every TP rank runs this worker on the same batch; one records, or Prometheus
        # sums would show tp_size times the truth.
        self._dspark_records = int(get_parallel().tp_rank) == 0
        self._dspark_metrics: metrics.StepMetrics | None = None
        if self._dspark_records:
            metrics.ensure_created()
            self._dspark_metrics = metrics.StepMetrics(int(self.gamma), self.device)
        if getattr(self, "_proposer", None) is not None:
            from dspark_sglang.sglang_integration import greedy_batch

            # An all-greedy batch drafts by argmax on a CPU worker that samples its drafts.
            self._dspark_argmax = greedy_batch.install(self)
            # An instance attribute on our worker's own proposer: SGLang's class is untouched.
            # Kept on the worker too: a profiling wrapper may later replace ``propose``,
            # and context copies must still reach the guard (``_fault_guard``).
            self._dspark_guard = self._proposer.propose = fallback.GuardedPropose(
                self._proposer.propose,
                self._proposer,
                self._verify_planner,
                int(self.gamma),
                records=self._dspark_records,
                step_metrics=self._dspark_metrics,
                host_flags=torch.device(self.device).type == "cpu",
            )
        from dspark_sglang.sglang_integration import startup_profile

        self._dspark_tp_rank = int(get_parallel().tp_rank)
        # A start-up cost table needs the KV pools and attention backends, which
        # SGLang builds after this constructor: then the policy is installed in
        # init_cuda_graphs, the last start-up hook, before any request is served.
        # STS temperatures are set here either way: before the draft's graphs are captured.
        pending = startup_profile.requested()
        self._dspark_profile_pending = pending is not None
        if pending is None:
            self._install_decider()
        elif pending.sts_path:
            from dspark_sglang.calibration.sts import load_sts
            from dspark_sglang.sglang_integration.launch import check_sts_block_size

            sts = load_sts(pending.sts_path)
            check_sts_block_size(sts.block_size, int(self.gamma), f"sts_path={pending.sts_path}")
            self._apply_sts(pending.sts_path)
        executor = getattr(self, "_verify_executor", None)
        if executor is not None:
            # Anchor-only steps (a plain step, a drafter fault) accept on two rows.
            plain_accept.install(executor, self._verify_planner)
            # A step the draft decision leaves plain runs as a decode step, where eligible.
            self._dspark_plain_decode = plain_decode.PlainDecodeStep(self)
        # Profiling aid (DSPARK_PROFILE_ROUNDS); wraps nothing when it is unset. Last, so
        # that it times the fault guard around ``propose`` too.
        round_profile.instrument_worker(self)

    def init_cuda_graphs(self) -> None:
        """SGLang's graph capture, then our start-up cost table and policy (if pending),
        then the token history context copies read (it needs the request pool)."""
        super().init_cuda_graphs()
        if self._dspark_profile_pending:
            self._dspark_profile_pending = False
            self._install_decider(apply_sts=False)
        _drop_gate_under_deferred_commit(self)  # SGLang builds the commit in its capture
        _attach_token_history(self)

    def _forward_prefill(self, batch: Any, *args: Any, **kwargs: Any) -> Any:
        history = vars(self).get("_dspark_token_history")
        record = (
            history is not None
            and batch.forward_mode.is_extend()
            and bool(batch.reqs)
            and batch.prefix_lens is not None
        )
        if record:
            self._keep_history(lambda: history.write_extend(batch))
        result = super()._forward_prefill(batch, *args, **kwargs)
        if record:
            # The token the prefill sampled: the first anchor (a chunk's pseudo token is
            # overwritten by the next chunk's write).
            n = len(batch.reqs)
            self._keep_history(
                lambda: history.append(
                    batch.req_pool_indices[:n],
                    result.next_token_ids[:n],
                    torch.ones(n, dtype=torch.int64, device=history.tokens.device),
                )
            )
        return result

    def _keep_history(self, write: Callable[[], None]) -> None:
        """Run one token-history write; if it fails, context copies stop and serving goes on
        (copies are an aid: the drafter's drafts are verified as without them)."""
        try:
            write()
        except Exception as exc:
            self._dspark_token_history = None
            guard = _fault_guard(self)
            if guard is not None:
                guard.context_copy = None
            logger.warning(
                "DSPARK_MOE: the token history context copies read failed (%s: %s); serving "
                "the drafter's drafts without copies from now on",
                type(exc).__name__,
                exc,
            )

    def _install_decider(self, *, apply_sts: bool = True) -> None:
        """Tag the planner with our policy (``scheduler_bridge.load_decider``), if configured."""
        from dspark_sglang.sglang_integration import scheduler_bridge, startup_profile

        tp_rank = self._dspark_tp_rank
        decider = scheduler_bridge.load_decider(
            int(self.gamma),
            tp_rank=tp_rank,
            profile=lambda cfg: startup_profile.profile_target(
                cfg, self.target_worker, tp_rank=tp_rank
            ),
            device=self.device,
            step_metrics=self._dspark_metrics,
        )
        if decider is not None:
            self._attach_decider(decider, apply_sts=apply_sts)

    def _attach_decider(self, decider: Any, *, apply_sts: bool = True) -> None:
        """Tag the planner so the hook lets ``decider`` choose the verify lengths."""
        from dspark_sglang.sglang_integration import scheduler_bridge, verify_tier

        setattr(self._verify_planner, scheduler_bridge.DECIDER_ATTR, decider)
        # Compact mode without an SGLang SPS table would skip our hook (verify-all).
        verify_tier.schedule_every_step(
            self._verify_planner, float(getattr(self, "_simulate_acc_len", 0.0))
        )
        verify_tier.full_block_verifies_in_place(self._verify_planner)
        # Through the decider: its policy is rebuilt as rounds are timed.
        self.verify_policy = lambda confidence: decider.policy.decide(confidence)
        # CPU only: time each decode round and its verify; the policy prices rounds from them.
        self._dspark_round_timer = decider if decider.times_rounds else None
        self._dspark_verify_seconds = 0.0
        executor = getattr(self, "_verify_executor", None)
        if self._dspark_round_timer is not None and executor is not None:
            for name in ("run_compact", "run_non_compact"):
                # An instance attribute on our worker's own executor, as round_profile does.
                object.__setattr__(executor, name, self._timed_verify(getattr(executor, name)))
        if apply_sts and decider.config.sts_path:
            self._apply_sts(decider.config.sts_path)
        _install_context_copy(self, decider.config)
        _install_draft_gate(self, decider)

    def _timed_verify(self, run: Callable[..., Any]) -> Callable[..., Any]:
        """``run`` (the target's verify of a round) adding its seconds to this round's."""

        def timed(*args: Any, **kwargs: Any) -> Any:
            t0 = self._dspark_clock()
            try:
                return run(*args, **kwargs)
            finally:
                self._dspark_verify_seconds += self._dspark_clock() - t0

        return timed

    def _apply_sts(self, path: str) -> None:
        """Set the confidence head's STS temperatures (``load_decider`` validated the file)."""
        from dspark_sglang.calibration.sts import load_sts

        head = getattr(self.draft_model, "confidence_head", None)
        if head is None:
            raise ValueError(f"sts_path={path} given but the draft has no confidence head")
        head.sts_temperatures = torch.tensor(
            load_sts(path).temperatures, dtype=torch.float32, device=self.device
        )

    def _forward_decode(self, batch: Any, *args: Any, **kwargs: Any) -> Any:
        from dspark_sglang.sglang_integration import draft_gate, fallback, plain_decode

        self._dspark_verify_seconds = 0.0
        t0 = self._dspark_clock()
        guard = _fault_guard(self)
        try:
            result = plain_decode.try_plain_step(self, guard, batch, args, kwargs)
            if result is None:
                result = super()._forward_decode(batch, *args, **kwargs)
            fell_back = getattr(self._verify_planner, fallback.FORCE_PLAIN_ATTR, False)
            skipped = getattr(self._verify_planner, draft_gate.SKIPPED_ATTR, False)
        finally:
            # A fallback (or a plain step the draft decision chose) forces "anchor only"
            # for exactly the step it happened in.
            setattr(self._verify_planner, fallback.FORCE_PLAIN_ATTR, False)
            setattr(self._verify_planner, fallback.PLAIN_ROWS_ATTR, None)
            setattr(self._verify_planner, draft_gate.SKIPPED_ATTR, False)
            if guard is not None:
                guard.decided_to_draft = False
        seconds = self._dspark_clock() - t0
        if not skipped and not fell_back:
            self._observe_outcome(result)
        timer = self._dspark_round_timer
        if timer is not None and skipped:
            self._observe_plain_step(result, seconds)
        elif timer is not None and not fell_back:
            # CPU only (``times_rounds``): the round is done when the call returns, and
            # reading its verify lengths costs no synchronisation. A fallback round's
            # time is the drafter's fault, not its shape's, so it is not recorded.
            try:
                n, tokens = self._round_shape(result)
                if n and self._dspark_verify_seconds > 0:
                    timer.observe_round(n, tokens, seconds, self._dspark_verify_seconds)
            except Exception as exc:  # pricing is an aid: never fail a served round for it
                self._dspark_round_timer = None
                logger.warning(
                    "DSPARK_MOE: timing decode rounds failed (%s: %s); the policy keeps its "
                    "current prices and no more rounds are timed",
                    type(exc).__name__,
                    exc,
                )
        self._observe_round(result)
        history = vars(self).get("_dspark_token_history")
        accept = getattr(result, "accept_lens", None)
        if history is not None and accept is not None and accept.numel() > 0:
            # What the scheduler appends to each request: the accepted drafts, then the
            # bonus token that anchors the next round.
            from dspark_sglang.sglang_integration import sync_probe

            n = int(accept.shape[0])
            with sync_probe.sync_free("DSparkMoeWorker.token_history"):
                new = result.next_token_ids.reshape(n, -1)
                self._keep_history(lambda: history.append(batch.req_pool_indices[:n], new, accept))
        return result

    def _observe_outcome(self, result: Any) -> None:
        """A drafting round's verify and accept lengths to the draft decision (its gate)."""
        gate = getattr(_fault_guard(self), "draft_gate", None)
        accept = getattr(result, "accept_lens", None)
        verify = getattr(result, "cap_lens", None)
        if gate is not None and accept is not None and verify is not None:
            gate.observe_outcome(verify, accept)

    def _observe_plain_step(self, result: Any, seconds: float) -> None:
        """Price the draft decision's plain steps from their timings (CPU, timed rounds)."""
        gate = getattr(_fault_guard(self), "draft_gate", None)
        accept = getattr(result, "accept_lens", None)
        if gate is None or accept is None or accept.numel() == 0:
            return
        if self._dspark_verify_seconds > 0:
            gate.decision.observe_plain(
                int(accept.numel()), seconds, min(self._dspark_verify_seconds, seconds)
            )

    def _verify_lens(self, cap_lens: torch.Tensor | None) -> torch.Tensor | int:
        """Each request's verify length in a decode round, from its result's ``cap_lens``.

        The one rule for it: ``cap_lens`` when the result has them, else the whole block
        (returned as one int for every request, so a caller that needs only the total
        builds no tensor and reads nothing back).
        """
        return cap_lens if cap_lens is not None else int(self.verify_num_draft_tokens)

    def _round_shape(self, result: Any) -> tuple[int, int]:
        """``(requests, verify tokens in all)`` of a decode round's result (host reads)."""
        accept = getattr(result, "accept_lens", None)
        if accept is None or accept.numel() == 0:
            return 0, 0
        verify = self._verify_lens(getattr(result, "cap_lens", None))
        n = int(accept.numel())
        tokens = n * verify if isinstance(verify, int) else int(verify.sum())
        return n, tokens

    def _observe_round(self, result: Any) -> None:
        """Feed one decode round's outcome to our metrics and the decision log."""
        from dspark_sglang.sglang_integration import metrics, sync_probe

        accept = getattr(result, "accept_lens", None)
        step_metrics = self._dspark_metrics
        if step_metrics is not None and accept is not None and accept.numel() > 0:
            with sync_probe.sync_free("DSparkMoeWorker.step_metrics"):
                verify = self._verify_lens(result.cap_lens)
                if isinstance(verify, int):
                    verify = torch.full_like(accept, verify)
                step_metrics.observe_round(accept, verify)
                metrics.attach_flush(result, step_metrics)
            decider = getattr(self._verify_planner, "dspark_moe_decider", None)
            if decider is not None:
                decider.log_used(result.cap_lens)  # syncs only with DSPARK_DECISION_LOG set


def _check_draft_heads(target_worker: Any) -> None:
    """``launch.check_draft_heads`` on the draft config SGLang is about to load.

    Runs before the draft is built (a head count the TP ranks cannot share fails
    inside SGLang's layers otherwise); the draft runs at the attention-TP width.
    """
    from sglang.srt.runtime_context import get_parallel

    from dspark_sglang.sglang_integration.launch import check_draft_heads

    runner = getattr(target_worker, "model_runner", None)
    aux = getattr(runner, "spec_aux_config", None)
    draft = getattr(aux, "draft_model_config", None)
    if draft is None:
        return
    heads = int(draft.hf_config.num_attention_heads)
    kv_heads = int(getattr(draft.hf_config, "num_key_value_heads", None) or heads)
    check_draft_heads(
        heads,
        kv_heads,
        int(get_parallel().attn_tp_size),
        str(target_worker.device).split(":")[0],
        f"draft config {draft.model_path}",
    )


def _fault_guard(worker: Any) -> Any:
    """The worker's fault guard around ``propose`` (``fallback.GuardedPropose``), or None.

    Read from the worker, not from ``proposer.propose``: the round profiler
    (``round_profile``) wraps ``propose`` in a timer after the guard is made, and a
    policy with a start-up cost table is installed later still (``init_cuda_graphs``).
    Read through ``vars``: SGLang's worker resolves missing attributes itself.
    """
    return vars(worker).get("_dspark_guard")


def _install_context_copy(worker: Any, config: Any) -> None:
    """Context copies after the drafter's block (``context_copy``), if ``config`` asks.

    The worker's fault guard around ``propose`` applies them; a worker without one (no
    proposer) gets none. The copier reads the worker's token history, which
    :func:`_attach_token_history` creates once the request pool exists.
    """
    from dspark_sglang.sglang_integration.context_copy import ProposalCopier

    ngram = int(config.context_copy_ngram)
    guard = _fault_guard(worker)
    if not ngram or guard is None:
        return
    # Under the overlap scheduler a request's host lists may lag one round's tokens.
    margin = int(vars(worker).get("verify_num_draft_tokens") or worker.gamma + 1)
    guard.context_copy = ProposalCopier(ngram, config.copy_confidence_value, margin=margin)
    logger.info(
        "DSPARK_MOE: context copies on (%d-gram, copy confidence %.2f)",
        ngram,
        config.copy_confidence_value,
    )


def _install_draft_gate(worker: Any, decider: Any) -> None:
    """The draft decision before each draft pass (``draft_gate``), if the config asks."""
    from dspark_sglang.sglang_integration.draft_gate import DraftGate

    decision = getattr(decider, "draft_decision", None)
    guard = _fault_guard(worker)
    if decision is None or guard is None or _defers_context_kv(worker):
        return
    guard.draft_gate = DraftGate(
        decision,
        records=vars(worker).get("_dspark_records", True),
        log=getattr(decider, "decision_log", None),
    )
    logger.info(
        "DSPARK_MOE: draft decision on (priced; a plain step where a drafting round pays "
        "less; probe every %d steps)",
        decision.probe_every,
    )


def _defers_context_kv(worker: Any) -> bool:
    """Whether SGLang stores the draft context in the next draft pass
    (``SGLANG_DSPARK_DEFER_CONTEXT_KV``): then a step without a draft pass would leave
    it pending, and the draft decision is off (logged)."""
    commit = getattr(worker, "_deferred_commit", None)
    if not callable(commit) or commit() is None:
        return False
    logger.warning(
        "DSPARK_MOE: draft_decision: priced is off because SGLANG_DSPARK_DEFER_CONTEXT_KV "
        "stores the draft context in the next draft pass; every step drafts"
    )
    return True


def _drop_gate_under_deferred_commit(worker: Any) -> None:
    """After SGLang's graph capture (where it builds a deferred commit): no draft
    decision if the context KV is deferred (:func:`_defers_context_kv`)."""
    guard = _fault_guard(worker)
    if guard is not None and guard.draft_gate is not None and _defers_context_kv(worker):
        guard.draft_gate = None


def _attach_token_history(worker: Any) -> None:
    """Give an installed copier its token history: one row per request-pool slot,
    written by the worker's prefill and decode (``token_history``)."""
    from dspark_sglang.sglang_integration.token_history import TokenHistory

    copier = getattr(_fault_guard(worker), "context_copy", None)
    if copier is None:
        return
    history = vars(worker).get("_dspark_token_history")
    if history is None:
        pool = worker.target_worker.model_runner.req_to_token_pool
        history = worker._dspark_token_history = TokenHistory.like_pool(pool.req_to_token)
    copier.history = history
