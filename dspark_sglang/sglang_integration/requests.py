"""Request checks at SGLang's front door: refuse what would kill the scheduler or break a tier.

SGLang validates each tokenized request in ``TokenizerManager._validate_one_request``
(context length, logprob token ids, ...); a ``ValueError`` raised there becomes an
HTTP 400 with its message, before the request reaches the scheduler. One AFTER hook
on that method (``HookRegistry``, no patched SGLang) adds two checks:

* **Token ids in the vocabulary.** A prompt given as token ids outside
  ``[0, vocab_size)`` indexes past the embedding in the scheduler process, which
  raises there and takes the whole server down (plain decoding and speculative
  alike). Refused here, naming the first offending id and the valid range.
* **Greedy-only tiers.** When the tier's scheduler config sets ``greedy_only``, a
  sampled request (temperature above SGLang's greedy threshold and ``top_k`` not 1)
  is refused, naming the setting, so the tier serves exactly the traffic it was
  configured for. Refusals are counted in ``dspark_requests_refused_total{reason}``.

The scheduler config is read once per process from ``DSPARK_SCHEDULER_CONFIG``
(the same file the worker loads); without it only the vocabulary check runs.

And one message fix: FastAPI appends the endpoint's source file and line to a
request-validation error's text, which SGLang returns to the client as the 400
message (a server path and a traceback line). A REPLACE hook on FastAPI's
``ValidationException._format_endpoint_context`` drops that context; the
validation errors themselves (field, problem, the client's own input) stay.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Mapping, Sequence
from typing import Any

from dspark_sglang.sglang_integration import metrics
from dspark_sglang.sglang_integration.launch import CONFIG_ENV

logger = logging.getLogger(__name__)

VALIDATE_METHOD = "sglang.srt.managers.tokenizer_manager.TokenizerManager._validate_one_request"
ENDPOINT_CONTEXT = "fastapi.exceptions.ValidationException._format_endpoint_context"
#: SGLang's own greedy threshold (``sampling_params._SAMPLING_EPS``) and defaults.
GREEDY_TEMPERATURE = 1e-6
DEFAULT_TEMPERATURE = 1.0


class RequestRefusedError(ValueError):
    """A request this server does not serve; SGLang answers it with HTTP 400."""


def check_token_ids(input_ids: Sequence[int] | None, vocab_size: int) -> None:
    """Refuse token ids outside ``[0, vocab_size)``."""
    if not input_ids:
        return
    lo, hi = min(input_ids), max(input_ids)
    if lo >= 0 and hi < vocab_size:
        return
    bad = lo if lo < 0 else hi
    metrics.count_refused("token_id_out_of_vocab")
    raise RequestRefusedError(
        f"prompt token id {bad} is outside the model's vocabulary: valid ids are "
        f"0..{vocab_size - 1}; send text, or token ids from this model's tokenizer"
    )


def is_greedy(sampling_params: Mapping[str, Any] | None) -> bool:
    """Whether SGLang will decode these parameters greedily (temperature ~0 or top_k 1)."""
    params = sampling_params or {}
    temperature = params.get("temperature")
    temperature = DEFAULT_TEMPERATURE if temperature is None else float(temperature)
    return 0.0 <= temperature < GREEDY_TEMPERATURE or params.get("top_k") == 1


def check_greedy_only(sampling_params: Mapping[str, Any] | None, tier: str) -> None:
    """Refuse a sampled request on a ``greedy_only`` tier."""
    if is_greedy(sampling_params):
        return
    metrics.count_refused("greedy_only")
    raise RequestRefusedError(
        f"tier {tier!r} serves greedy requests only (its scheduler config sets greedy_only); "
        "send temperature 0, or use a tier with greedyOnly: false for sampled requests"
    )


@functools.cache
def _greedy_only_tier() -> str | None:
    """The tier name when this process's scheduler config sets ``greedy_only``, else None."""
    path = os.environ.get(CONFIG_ENV)
    if not path:
        return None
    from dspark_sglang.scheduling.config import SchedulerConfig

    cfg = SchedulerConfig.load(path)
    return cfg.sla_name if cfg.greedy_only else None


def validate_request_hook(result: Any, manager: Any, obj: Any, input_ids: Any = None) -> Any:
    """AFTER hook on ``_validate_one_request``: runs once SGLang's own checks passed."""
    metrics.ensure_created()
    vocab = getattr(getattr(manager, "model_config", None), "vocab_size", None)
    if vocab is not None and input_ids is not None:
        check_token_ids(input_ids, int(vocab))
    tier = _greedy_only_tier()
    params = getattr(obj, "sampling_params", None)
    if tier is not None and isinstance(params, Mapping | type(None)):
        check_greedy_only(params, tier)
    return result


def no_endpoint_context(exc: Any) -> str:
    """REPLACE for FastAPI's endpoint context: no server file, line or function for clients."""
    del exc
    return ""


def install() -> None:
    """Register the hooks (they act in the HTTP server's process, where requests arrive)."""
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    HookRegistry.register(VALIDATE_METHOD, validate_request_hook, HookType.AFTER)
    HookRegistry.register(ENDPOINT_CONTEXT, no_endpoint_context, HookType.REPLACE)
