"""Few-row float32 matmuls on CPUs without AMX: oneDNN packed weights for 2..N rows.

SGLang's CPU engine multiplies by a layer's weight with ``F.linear`` (and the LM head
with ``torch.matmul``) unless the CPU has AMX. On an AVX2-only CPU those go to MKL,
whose one-row path (a matrix-vector product, memory bound) is fast, but whose
matrix-matrix path for a handful of rows costs 2-3x the one-row pass before the extra
rows cost anything. A speculative round's verify forward (the anchor plus its drafts,
8 rows at batch 1) and the drafter's block forward live exactly there. oneDNN's matmul
on a weight reordered once into its blocked layout (the layout PyTorch's own CPU
compiler uses) runs those row counts at close to the cost of one row.

Where: SGLang's unquantised linear layers (the target's and the drafter's), its LM head
(``LogitsProcessor``), the DSpark draft's projection through that head, and our own
draft code's matmuls (:func:`linear`).

Rule (``few_row_linear``): on the CPU engine, for a float32 input of ``rows`` in
``[MIN_ROWS, MAX_ROWS]`` against a float32 weight, compute ``x @ W.T + b`` with the
oneDNN-packed copy of ``W``; everything else (one row, a prefill's many rows, other
dtypes, AMX CPUs where SGLang packs weights itself, tensors needing grad) takes
SGLang's own path unchanged. The packed copy is made on first use and kept per weight
(weakly, so it goes with the layer); it is remade if the weight is written in place
(its ``_version`` changes), so weight updates are never served stale.

Numerics: both paths accumulate float32 products in float32; only the summation order
differs, so results agree to float32 rounding (``tests`` pin ``allclose`` at
rtol 1e-5). A row's result may differ at rounding level depending on how many rows
it was computed with; MKL already differs between its one-row and many-row paths.

Costs: one extra float32 copy of every weight multiplied with few rows (the target's
linear layers and LM head, the drafter's), made once.

``DSPARK_CPU_FEW_ROW_LINEAR=0`` turns it off (default on wherever it applies).
"""

from __future__ import annotations

import logging
import os
import weakref
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

logger = logging.getLogger(__name__)

ENV = "DSPARK_CPU_FEW_ROW_LINEAR"
#: Row counts that take the packed path: from two rows (one row stays MKL's fast
#: matrix-vector product) up to a verify batch of a few requests x a block; larger
#: inputs (prefill) are where MKL's matrix-matrix path is already efficient.
MIN_ROWS = 2
MAX_ROWS = 64

LINEAR_APPLY = "sglang.srt.layers.quantization.unquant.UnquantizedLinearMethod.apply"
LM_HEAD = "sglang.srt.layers.logits_processor.LogitsProcessor._compute_lm_head"
DRAFT_LM_HEAD = "sglang.srt.models.dspark.project_through_lm_head"

#: Set by :func:`install` in processes where the hooks are registered; :func:`linear`
#: (our own draft code's matmuls) follows it, so one switch governs every path.
_active = False


class PackedWeights:
    """oneDNN-packed copies of weights, made on first use, dropped with their weight.

    Keyed by the weight's ``id`` with a weak reference to it (a tensor cannot be a
    ``WeakKeyDictionary`` key: its ``==`` is elementwise); the entry's callback removes
    it when the weight is freed, before its ``id`` can be reused.
    """

    def __init__(self) -> None:
        self._packed: dict[int, tuple[weakref.ref[torch.Tensor], int, torch.Tensor]] = {}

    def get(self, weight: torch.Tensor) -> torch.Tensor:
        """The packed copy of ``weight`` (repacked if it was written since)."""
        key, version = id(weight), _version(weight)
        entry = self._packed.get(key)
        if entry is not None and entry[0]() is weight and entry[1] == version:
            return entry[2]
        packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach(), None)
        ref = weakref.ref(weight, lambda _ref, key=key: self._packed.pop(key, None))
        self._packed[key] = (ref, version, packed)
        return packed

    def __len__(self) -> int:
        return len(self._packed)


def _version(weight: torch.Tensor) -> int:
    """The weight's in-place write counter; -1 for an inference-mode tensor, which has none
    (such a tensor, e.g. rows gathered from a head under ``inference_mode``, is replaced
    by a new one, not written, when its source changes)."""
    return -1 if weight.is_inference() else weight._version


_PACKED = PackedWeights()


def onednn_available() -> bool:
    """Whether this torch build has oneDNN with the packed-linear ops."""
    if not torch.backends.mkldnn.is_available():
        return False
    ops = torch.ops.mkldnn
    return hasattr(ops, "_reorder_linear_weight") and hasattr(ops, "_linear_pointwise")


def enabled(env: dict[str, str] | None = None) -> bool:
    """``DSPARK_CPU_FEW_ROW_LINEAR`` is not ``0`` (default on)."""
    env = os.environ if env is None else env
    value = env.get(ENV, "1").strip()
    if value not in ("0", "1"):
        raise ValueError(f"{ENV}={value!r}: use 1 (few-row oneDNN linear, default) or 0 (off)")
    return value == "1"


def applies(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> bool:
    """Whether ``x @ weight.T (+ bias)`` takes the packed path (see the module rule)."""
    if x.device.type != "cpu" or weight.device.type != "cpu":
        return False
    if x.dtype != torch.float32 or weight.dtype != torch.float32 or weight.dim() != 2:
        return False
    if bias is not None and bias.dtype != torch.float32:
        return False
    if x.requires_grad or weight.requires_grad or x.shape[-1] != weight.shape[1]:
        return False
    rows = x.numel() // max(x.shape[-1], 1)
    return MIN_ROWS <= rows <= MAX_ROWS


def few_row_linear(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """``x @ weight.T + bias`` through the packed weight; the caller checked :func:`applies`."""
    lead = x.shape[:-1]
    flat = x.reshape(-1, x.shape[-1]).contiguous()
    out = torch.ops.mkldnn._linear_pointwise(flat, _PACKED.get(weight), bias, "none", [], "")
    return out.reshape(*lead, weight.shape[0])


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear`` for our own draft code, through the packed path where the hooks are on."""
    if _active and applies(x, weight, bias):
        return few_row_linear(x, weight, bias)
    return F.linear(x, weight, bias)


def linear_apply(
    original: Callable[..., Any],
    method: Any,
    layer: torch.nn.Module,
    x: torch.Tensor,
    bias: torch.Tensor | None = None,
) -> Any:
    """AROUND hook on ``UnquantizedLinearMethod.apply``."""
    weight = getattr(layer, "weight", None)
    if (
        isinstance(weight, torch.Tensor)
        and not getattr(layer, "use_intel_amx_backend", False)
        and applies(x, weight, bias)
    ):
        return few_row_linear(x, weight, bias)
    return original(method, layer, x, bias)


def _plain_head(lm_head: Any) -> bool:
    """An LM head whose logits SGLang computes as ``h @ W.T``: a weight tensor, no
    quantisation method other than the unquantised one, no AMX packing, no LoRA wrapper."""
    quant = type(getattr(lm_head, "quant_method", None)).__name__
    return (
        isinstance(getattr(lm_head, "weight", None), torch.Tensor)
        and quant in ("NoneType", "UnquantizedEmbeddingMethod")
        and not getattr(lm_head, "use_intel_amx_backend", False)
        and not hasattr(lm_head, "set_lora")
    )


def compute_lm_head(
    original: Callable[..., Any],
    processor: Any,
    hidden_states: torch.Tensor,
    lm_head: Any,
    embedding_bias: torch.Tensor | None = None,
    **kwargs: Any,
) -> Any:
    """AROUND hook on ``LogitsProcessor._compute_lm_head`` (plain float32 heads only).

    Only the branch SGLang would serve with ``torch.matmul(h, W.T)`` is taken over
    (:func:`_plain_head`, and no float32-upcast or RL on-policy option on the
    processor); its ``embedding_bias`` is not used there either.
    """
    if (
        _plain_head(lm_head)
        and not getattr(processor, "use_fp32_lm_head", False)
        and getattr(processor, "rl_on_policy_target", None) is None
        and applies(hidden_states, lm_head.weight)
    ):
        return few_row_linear(hidden_states, lm_head.weight)
    return original(processor, hidden_states, lm_head, embedding_bias, **kwargs)


def project_through_lm_head(
    original: Callable[..., Any], hidden: torch.Tensor, lm_head: Any
) -> Any:
    """AROUND hook on SGLang's DSpark draft head projection (plain float32 heads only)."""
    if _plain_head(lm_head) and applies(hidden, lm_head.weight):
        return few_row_linear(hidden, lm_head.weight)
    return original(hidden, lm_head)


def install() -> bool:
    """Register the three hooks when they can apply (CPU engine, oneDNN, no AMX, not disabled)."""
    from dspark_sglang.sglang_integration.cpu_bridges import running_on_cpu

    if not running_on_cpu() or not enabled():
        return False
    from sglang.srt.utils.common import cpu_has_amx_support

    if cpu_has_amx_support():
        return False  # SGLang packs weights for its own AMX kernels
    if not onednn_available():
        logger.info("few-row oneDNN linear: this torch has no oneDNN packed linear; off")
        return False
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    HookRegistry.register(LINEAR_APPLY, linear_apply, HookType.AROUND)
    HookRegistry.register(LM_HEAD, compute_lm_head, HookType.AROUND)
    HookRegistry.register(DRAFT_LM_HEAD, project_through_lm_head, HookType.AROUND)
    global _active
    _active = True
    return True
