"""``--speculative-algorithm DSPARK_MOE``: our algorithm, registered as an SGLang plugin.

What it adds to SGLang's built-in DSPARK:

* our scheduling policies (``dspark_sglang/scheduling/policies.py``) decide the
  per-request verify lengths when ``DSPARK_SCHEDULER_CONFIG`` names a
  ``SchedulerConfig`` (``scheduler_bridge.py``; SGLang decides otherwise);
* ``dspark_*`` Prometheus metrics (``metrics.py``);
* drafter faults fall back to plain decoding for the affected step
  (``fallback.py``).

* our MoE + sliding-window drafter (``moe_draft_model.DSparkMoEDraftModel``),
  added to SGLang's ``ModelRegistry`` when this worker is built (only in
  processes that run DSPARK_MOE) and selected by the draft checkpoint's
  ``architectures``; its config is checked against the target at start-up.

Why compose SGLang's DSPARK rather than re-implement it: ``DSparkWorkerV2``
already does target prefill with hidden-state capture, draft KV injection,
ragged verify, continuous batching and the overlap scheduler; our changes
are the drafter and the budget decision.

The algorithm object (:class:`DSparkMoeSpecAlgo`) answers every ``is_*`` /
``supports_*`` question as DSPARK does, so SGLang's ``is_dspark()`` branches
treat it as DSpark. It also defines the methods SGLang 0.5.23's
``CustomSpecAlgo`` lacks but the scheduler calls (``carries_draft_hidden_states``,
``need_topk``, ``create_future_map``, ``get_platform_worker_cls``).

The worker class lives in ``dspark_moe_worker`` and is imported by the worker
factory, only in a process that builds a DSPARK_MOE worker: the plugin runs
this module's :func:`register` in every SGLang process (engine, scheduler,
detokenizer), and importing SGLang's ``DSparkWorkerV2`` costs a detokenizer
about 0.6 s of CPU (some 390 modules it never uses) on every start.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
from sglang.srt.speculative.spec_registry import CustomSpecAlgo

if TYPE_CHECKING:
    from dspark_sglang.sglang_integration.dspark_moe_worker import DSparkMoeWorker

logger = logging.getLogger(__name__)

ALGORITHM_NAME = "DSPARK_MOE"

# Methods answered exactly as the built-in DSPARK answers them. Includes the
# ones CustomSpecAlgo 0.5.23 lacks (the scheduler calls the first) and every
# is_*/supports_* predicate SGLang dispatches on.
_DELEGATED_TO_DSPARK: tuple[str, ...] = (
    "carries_draft_hidden_states",
    "need_topk",
    "create_future_map",
    "get_platform_worker_cls",
    "build_disagg_draft_input",
    "resolve_max_speculative_num_draft_tokens",
    "get_num_tokens_per_req_for_target_verify",
    "has_draft_kv",
    *sorted(
        name
        for name in vars(SpeculativeAlgorithm)
        if name.startswith(("is_", "supports_")) and name not in ("is_some", "is_none")
    ),
)


class DSparkMoeSpecAlgo(CustomSpecAlgo):
    """SGLang's view of DSPARK_MOE: DSPARK's behaviour, our worker class."""

    def handle_server_args(self, server_args: Any) -> None:
        """Our launch checks (``launch.check_server_args``), then DSPARK's own, then the
        overlap scheduler off on CPU (``_in_step_on_cpu``)."""
        from sglang.srt.arg_groups.overrides import resolving_view
        from sglang.srt.runtime_context import attn_tp_size_of
        from sglang.srt.utils.common import get_device

        from dspark_sglang.sglang_integration.launch import check_server_args

        cfg = resolving_view(server_args)
        # Unset until SGLang resolves it: the same default it will pick.
        device = (cfg.device or get_device()).split(":")[0]
        check_server_args(
            cfg.speculative_num_draft_tokens,
            cfg.speculative_draft_model_path,
            tp_size=attn_tp_size_of(cfg),
            device=device,
        )
        SpeculativeAlgorithm.DSPARK.handle_server_args(server_args)
        _in_step_on_cpu(server_args, device)
        _admit_as_slots_free(server_args)

    def __getattr__(self, name: str) -> Any:
        # Anything SGLang adds to the enum interface later falls back to DSPARK.
        if name.startswith("__"):
            raise AttributeError(name)
        return getattr(SpeculativeAlgorithm.DSPARK, name)


def _in_step_on_cpu(server_args: Any, device: str) -> None:
    """SGLang's overlap scheduler off for DSPARK_MOE on CPU, as SGLang turns it off for its
    other speculative algorithms there: on CPU the round's host work competes with the
    forward for the same cores, so the overlap slows the round.
    ``DSPARK_CPU_OVERLAP_SCHEDULE=1`` keeps it (``launch.CPU_OVERLAP_ENV``), e.g. to run
    the scheduling a GPU server gets. Declared as SGLang declares its own resolutions.
    """
    from sglang.srt.arg_groups.overrides import declare_resolution, resolving_view

    from dspark_sglang.sglang_integration.launch import CPU_OVERLAP_ENV, cpu_overlap_kept

    if device != "cpu" or resolving_view(server_args).disable_overlap_schedule:
        return
    if cpu_overlap_kept():
        logger.info("DSPARK_MOE: SGLang's overlap scheduler kept on CPU (%s=1)", CPU_OVERLAP_ENV)
        return
    declare_resolution(server_args, "dspark_moe_cpu_in_step", disable_overlap_schedule=True)
    logger.info("DSPARK_MOE: SGLang's overlap scheduler is off on CPU (faster there)")


def _admit_as_slots_free(server_args: Any) -> None:
    """A waiting request is admitted as soon as a running slot frees, as for plain decoding.

    Left unset, SGLang's ``--min-free-slots-delay`` holds new prefills of its DFlash family
    (DSPARK, so DSPARK_MOE too) until 2-4 slots are free, to batch DFlash's costly draft
    prefills. A DSPARK_MOE server at its ``--max-running-requests`` then decodes 2-3
    requests short of its cap most of the time, which costs more throughput than batching
    the prefills saves. An explicit ``--min-free-slots-delay N`` is kept.
    """
    from sglang.srt.arg_groups.overrides import declare_resolution, resolving_view

    cfg = resolving_view(server_args)
    if cfg.min_free_slots_delay is not None or int(cfg.pp_size or 1) > 1:
        return
    # 1 is SGLang's "off" (a threshold <= 1 disables the delayer).
    declare_resolution(server_args, "dspark_moe_admit_as_slots_free", min_free_slots_delay=1)


def _delegate(name: str) -> Callable[..., Any]:
    def method(self: DSparkMoeSpecAlgo, *args: Any, **kwargs: Any) -> Any:
        return getattr(SpeculativeAlgorithm.DSPARK, name)(*args, **kwargs)

    method.__name__ = name
    method.__doc__ = f"As ``SpeculativeAlgorithm.DSPARK.{name}``."
    return method


for _name in _DELEGATED_TO_DSPARK:
    setattr(DSparkMoeSpecAlgo, _name, _delegate(_name))


def _worker_factory(server_args: Any) -> type[DSparkMoeWorker]:
    """Our worker class, imported here so that registering imports no worker code."""
    del server_args
    from dspark_sglang.sglang_integration.dspark_moe_worker import DSparkMoeWorker

    return DSparkMoeWorker


def register() -> bool:
    """Register DSPARK_MOE with SGLang (once per process). Returns whether it registered now."""
    from sglang.srt.speculative.spec_registry import get_spec

    if get_spec(ALGORITHM_NAME) is not None:
        return False
    SpeculativeAlgorithm.register(
        ALGORITHM_NAME, supports_overlap=True, spec_class=DSparkMoeSpecAlgo
    )(_worker_factory)
    logger.info("dspark_sglang: registered speculative algorithm %s", ALGORITHM_NAME)
    return True
