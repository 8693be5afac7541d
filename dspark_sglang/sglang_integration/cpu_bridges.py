"""CPU-only bridges that let SGLang 0.5.23's own code run without a GPU.

Every bridge is registered through SGLang's ``HookRegistry`` (no SGLang file
is edited) and only when SGLang runs its CPU engine, so GPU deployments see
SGLang unchanged. Each one closes one gap recorded in ``docs/sglang_integration.md``
("CPU bridges"); the hook functions are module-level so tests can call them directly.

1. ``has_amx`` platform fact: SGLang rewrites ``attention_backend="intel_amx"``
   to ``torch_native`` unless ``get_platform().has_amx``; that probe looks for the
   AMX weight-packing op, which our reference ``sgl_kernel`` deliberately lacks.
   ``torch_native`` cannot run speculative verify batches, so we state the fact.
2. ``_handle_dspark`` rejects ``device="cpu"`` outright. Its other checks are
   device-independent, so on CPU we run it with the device check satisfied.
3. ``DSparkWorkerV2._forward_decode`` calls ``Tensor.record_stream`` with the
   current device stream; on CPU that raises ("unknown parameter type"). CPU
   has no asynchronous streams, so recording a CPU stream is a no-op.
4. ``IntelAMXAttnBackend._build_extend_metadata`` reads ``spec_info.tree_topk``
   (absent on DSpark's verify input) and assumes a uniform draft count per
   request. DSpark verifies a chain (causal inside the block, no tree mask)
   with per-request ``verify_lens`` from ``spec_info.ragged_verify_layout``.
5. ``intel_amx`` is missing from SGLang's draft attention backend choices, so
   the draft falls back to CUDA-only flashinfer; we add it on CPU.
6. Non-greedy verify calls the Triton ``chain_speculative_sampling_triton`` even
   on SGLang's torch path; Triton has no CPU driver, so a temperature > 0 request
   killed the scheduler. CPU tensors go to our port (``cpu_sampling``).
7. Sampled draft steps' random words: SGLang's CPU reference of its draft sampling
   kernel recomputes the GPU's Philox words in int64 tensor arithmetic for the whole
   vocabulary at every draft step; on CPU they come from torch's generator instead
   (``cpu_draft_noise``; same law, not the GPU's bits).
8. SGLang's dense DSpark draft (``models/dspark.py``, the class DeepSpec checkpoints
   load into) writes its context K/V with a fused Triton kernel when its weights are
   bfloat16; Triton has no CPU driver, so a bfloat16 server died at its first prefill.
   On CPU no fused bundle is built and the draft takes its own unfused write (the same
   projection, norm and RoPE, layer by layer).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import Any

import torch

from dspark_sglang.sglang_integration.cpu_draft_noise import TARGET as DRAFT_NOISE
from dspark_sglang.sglang_integration.cpu_draft_noise import cpu_random_words
from dspark_sglang.sglang_integration.cpu_sampling import TARGET as CHAIN_SAMPLING
from dspark_sglang.sglang_integration.cpu_sampling import chain_sampling_cpu_tolerant

logger = logging.getLogger(__name__)

BRIDGE_SOURCE = "dspark_sglang.cpu_bridges"
HANDLE_DSPARK = "sglang.srt.arg_groups.speculative_hook._handle_dspark"
RECORD_STREAM = "torch.Tensor.record_stream"
FUSED_KV_WRITE = "sglang.srt.models.dspark.DSparkDraftMixin._build_fused_kv_write_bundle"
AMX_EXTEND_METADATA = (
    "sglang.srt.layers.attention.intel_amx_backend.IntelAMXAttnBackend._build_extend_metadata"
)


def running_on_cpu() -> bool:
    """True when SGLang runs its CPU engine (``SGLANG_USE_CPU_ENGINE`` is exactly ``1``)."""
    return os.environ.get("SGLANG_USE_CPU_ENGINE", "0") == "1"


def handle_dspark_on_cpu(original: Callable[..., Any], server_args: Any) -> Any:
    """Run SGLang's DSPARK argument checks with the CUDA-only device gate passed.

    ``server_args`` is sealed during resolution, and ``_handle_dspark`` reads it
    through a live view that gives the latest declaration precedence. For the
    call's duration we append one declaration ``device="cuda"`` (the function
    reads ``device`` only for that gate and an NPU test), then remove exactly
    that entry, so every declaration SGLang makes in between is kept.
    """
    from sglang.srt.arg_groups.model_override_base import resolving_view

    if resolving_view(server_args).device != "cpu":
        return original(server_args)
    stash = getattr(server_args, "_resolved_overrides", None)
    if stash is None:
        from sglang.srt.arg_groups.overrides import declare_resolution

        declare_resolution(server_args, BRIDGE_SOURCE)  # creates the stash, declares nothing
        stash = server_args._resolved_overrides
    marker = (BRIDGE_SOURCE, {"device": "cuda"})
    stash.append(marker)
    try:
        return original(server_args)
    finally:
        for i, entry in enumerate(stash):
            if entry is marker:
                del stash[i]
                break


def record_stream_cpu_tolerant(
    original: Callable[..., Any], tensor: torch.Tensor, stream: Any
) -> Any:
    """``record_stream`` is an allocator hint for async device streams; CPU has none."""
    if isinstance(stream, torch.cpu.Stream) or tensor.device.type == "cpu":
        return None
    return original(tensor, stream)


def amx_extend_metadata_for_chain_verify(
    original: Callable[..., Any], backend: Any, forward_batch: Any
) -> Any:
    """Extend metadata for DSpark/DFlash verify batches (chain, ragged lengths).

    Invariant: request ``b`` extends by ``verify_lens[b]`` query rows starting at
    the prefix sum of earlier lengths, sees ``seq_lens[b] + verify_lens[b]`` keys,
    and needs no tree mask (a chain's visibility is the causal rule).
    """
    spec_info = forward_batch.spec_info
    if not forward_batch.forward_mode.is_target_verify() or hasattr(spec_info, "tree_topk"):
        return original(backend, forward_batch)
    bs = forward_batch.batch_size
    device = backend.device
    layout = getattr(spec_info, "ragged_verify_layout", None)
    if layout is not None:
        verify_lens = layout.verify_lens.to(device=device, dtype=torch.int32)[:bs]
    else:
        verify_lens = torch.full((bs,), spec_info.draft_token_num, dtype=torch.int32, device=device)
    extend_start_loc = (torch.cumsum(verify_lens, 0) - verify_lens).to(torch.int32)
    seq_lens = forward_batch.seq_lens + verify_lens
    return seq_lens, verify_lens, extend_start_loc, None


def no_fused_kv_write_on_cpu(original: Callable[..., Any], model: Any, pool: Any) -> Any:
    """No fused (Triton) context-K/V write bundle for a draft whose weights are on CPU."""
    weight = next(model.parameters(), None)
    if weight is not None and weight.device.type == "cpu":
        return None
    return original(model, pool)


def add_intel_amx_draft_backend() -> None:
    """Let the draft worker use ``intel_amx`` (SGLang's list omits it)."""
    from sglang.srt.arg_groups import choices

    if "intel_amx" not in choices.DRAFT_ATTENTION_BACKEND_CHOICES:
        choices.DRAFT_ATTENTION_BACKEND_CHOICES.append("intel_amx")


def install() -> bool:
    """Register the CPU bridges (CPU engine only). Returns whether they were installed."""
    if not running_on_cpu():
        return False
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType
    from sglang.srt.runtime_context import override_platform

    override_platform(has_amx=True).install()
    add_intel_amx_draft_backend()
    HookRegistry.register(HANDLE_DSPARK, handle_dspark_on_cpu, HookType.AROUND)
    HookRegistry.register(RECORD_STREAM, record_stream_cpu_tolerant, HookType.AROUND)
    HookRegistry.register(
        AMX_EXTEND_METADATA, amx_extend_metadata_for_chain_verify, HookType.AROUND
    )
    HookRegistry.register(CHAIN_SAMPLING, chain_sampling_cpu_tolerant, HookType.AROUND)
    HookRegistry.register(DRAFT_NOISE, cpu_random_words, HookType.AROUND)
    HookRegistry.register(FUSED_KV_WRITE, no_fused_kv_write_on_cpu, HookType.AROUND)
    logger.info("dspark_sglang: CPU bridges registered")
    return True
