"""``--speculative-algorithm DSPARK_MOE``: our algorithm, registered as an SGLang plugin.

Status: a skeleton that behaves exactly like SGLang's built-in DSPARK. It
exists so that later work can plug in, without touching the registration:

* our MoE + sliding-window drafter model class (``dspark_sglang/model/``),
  registered through ``ModelRegistry`` and selected by the draft checkpoint's
  ``architectures``;
* our scheduling policies (``dspark_sglang/scheduling/policies.py``,
  ``decide(confidence [N, B]) -> verify_lens [N]``) behind the worker's
  verify-budget decision (:attr:`DSparkMoeWorker.verify_policy`).

Why compose SGLang's DSPARK rather than re-implement it: ``DSparkWorkerV2``
already does target prefill with hidden-state capture, draft KV injection,
ragged verify, continuous batching and the overlap scheduler; our changes
are the drafter and the budget decision.

The algorithm object (:class:`DSparkMoeSpecAlgo`) answers every ``is_*`` /
``supports_*`` question as DSPARK does, so SGLang's ``is_dspark()`` branches
treat it as DSpark. It also defines the methods SGLang 0.5.23's
``CustomSpecAlgo`` lacks but the scheduler calls (``carries_draft_hidden_states``,
``need_topk``, ``create_future_map``, ``get_platform_worker_cls``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch
from sglang.srt.speculative.dspark_components.dspark_worker_v2 import DSparkWorkerV2
from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
from sglang.srt.speculative.spec_registry import CustomSpecAlgo

logger = logging.getLogger(__name__)

ALGORITHM_NAME = "DSPARK_MOE"

#: A verify policy: calibrated confidences ``[N, B]`` -> verify lengths ``[N]``.
VerifyPolicy = Callable[[torch.Tensor], torch.Tensor]

# Methods answered exactly as the built-in DSPARK answers them. Includes the
# ones CustomSpecAlgo 0.5.23 lacks (the scheduler calls the first) and every
# is_*/supports_* predicate SGLang dispatches on.
_DELEGATED_TO_DSPARK: tuple[str, ...] = (
    "carries_draft_hidden_states",
    "need_topk",
    "create_future_map",
    "get_platform_worker_cls",
    "build_disagg_draft_input",
    "handle_server_args",
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

    def __getattr__(self, name: str) -> Any:
        # Anything SGLang adds to the enum interface later falls back to DSPARK.
        if name.startswith("__"):
            raise AttributeError(name)
        return getattr(SpeculativeAlgorithm.DSPARK, name)


def _delegate(name: str) -> Callable[..., Any]:
    def method(self: DSparkMoeSpecAlgo, *args: Any, **kwargs: Any) -> Any:
        return getattr(SpeculativeAlgorithm.DSPARK, name)(*args, **kwargs)

    method.__name__ = name
    method.__doc__ = f"As ``SpeculativeAlgorithm.DSPARK.{name}``."
    return method


for _name in _DELEGATED_TO_DSPARK:
    setattr(DSparkMoeSpecAlgo, _name, _delegate(_name))


class DSparkMoeWorker(DSparkWorkerV2):
    """SGLang's DSpark worker with our extension points (currently unused).

    ``verify_policy`` will replace the built-in budget decision once our
    scheduling policies land; ``None`` keeps SGLang's planner, so today this
    worker is DSPARK.
    """

    verify_policy: VerifyPolicy | None = None


def _worker_factory(server_args: Any) -> type[DSparkMoeWorker]:
    del server_args
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
