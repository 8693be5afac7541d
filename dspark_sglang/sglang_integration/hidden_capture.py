"""The target's hidden states for drafter training, captured by SGLang while it decodes.

SGLang 0.5.23 can return a request's hidden states at chosen layers without loading a
draft (``--enable-return-aux-hidden-states``, ``server_args`` ``exec_`` fields): with
``--speculative-algorithm DSPARK`` naming the capture convention and
``--return-aux-hidden-state-layer-ids L...``, a request sent with
``return_hidden_states=True`` gets, in ``meta_info["hidden_states"]``, one row per forwarded
token: the outputs of decoder layers ``L`` (HF ``hidden_states[l + 1]``), concatenated.
The prefill returns the prompt's rows, each decode step the row of the token it forwarded,
so a request of ``P`` prompt and ``R`` output tokens gets ``P + R - 1`` rows (its last
sampled token is never forwarded).

The trainer also needs the final-normed state the LM head reads, which capture mode
replaces by the aux states. :func:`install` adds it back through SGLang's ``HookRegistry``
(no patched SGLang) when the environment variable :data:`FINAL_STATE_ENV` is ``1`` in the
server's processes: an AROUND hook on ``LogitsProcessor._get_hidden_states_to_store``
appends the normed state after the aux states of a full capture, so each row is
``[aux (n*H) | last (H)]``. Without the variable nothing is registered and SGLang's own
output is unchanged. :func:`capture_server_args` is the one home of the flags.

Every rank of a tensor-parallel target holds the whole (all-reduced) residual stream, so
the rows do not depend on the TP size. The radix cache is switched off: a prompt whose
prefix is cached would be prefilled from its first uncached token and return fewer rows.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any

import torch

#: Set to ``1`` in a capture server's environment to append the final-normed state.
FINAL_STATE_ENV = "DSPARK_CAPTURE_FINAL_STATE"
#: The hooked method: what a full-capture forward stores as a request's hidden states.
STORE_METHOD = "sglang.srt.layers.logits_processor.LogitsProcessor._get_hidden_states_to_store"


def capture_server_args(layer_ids: Sequence[int]) -> dict[str, Any]:
    """``sglang.Engine`` / ``ServerArgs`` fields of a capture server for ``layer_ids``
    (decoder-layer indices, HF ``hidden_states[l + 1]``); start it with
    ``{FINAL_STATE_ENV: "1"}`` in its environment (:func:`capture_env`)."""
    ids = [int(x) for x in layer_ids]
    if not ids:
        raise ValueError("hidden-state capture needs at least one layer id (target.layer_ids)")
    return {
        "enable_return_aux_hidden_states": True,
        "speculative_algorithm": "DSPARK",
        "return_aux_hidden_state_layer_ids": ids,
        "disable_radix_cache": True,
    }


def capture_env() -> dict[str, str]:
    """The environment a capture server's processes need (see module docstring)."""
    return {FINAL_STATE_ENV: "1"}


def with_final_state(
    original: Callable[..., Any],
    processor: Any,
    hidden_states: torch.Tensor,
    hidden_states_before_norm: torch.Tensor | None,
    aux_hidden_states: Any,
    *rest: Any,
    **kwargs: Any,
) -> Any:
    """AROUND hook: a full capture's rows become ``[aux | final-normed state]``.

    ``rest`` ends with ``logits_metadata`` (SGLang's positional order). Anything but a
    full aux capture of a model that hands the LM head its normed state (no
    ``hidden_states_before_norm``, which SGLang would return instead) passes through.
    """
    stored = original(
        processor, hidden_states, hidden_states_before_norm, aux_hidden_states, *rest, **kwargs
    )
    metadata = kwargs.get("logits_metadata", rest[-1] if rest else None)
    mode = getattr(metadata, "capture_hidden_mode", None)
    if (
        stored is None
        or aux_hidden_states is None
        or hidden_states_before_norm is not None
        or mode is None
        or not mode.is_full()
    ):
        return stored
    return torch.cat([stored, hidden_states.to(stored.dtype)], dim=-1)


def install() -> None:
    """Register :func:`with_final_state` when :data:`FINAL_STATE_ENV` is ``1`` here."""
    if os.environ.get(FINAL_STATE_ENV) != "1":
        return
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    HookRegistry.register(STORE_METHOD, with_final_state, HookType.AROUND)
