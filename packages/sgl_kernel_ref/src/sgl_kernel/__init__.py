"""Pure-PyTorch stand-in for the CPU build of ``sgl_kernel`` (dev/CI only).

Why it exists: SGLang's CPU engine calls ``torch.ops.sgl_kernel.*_cpu`` ops
that come from a C++ build of sgl-kernel which is not on PyPI. This package
registers reference implementations of *only* the ops the CPU paths this
project uses reach (attention for plain decoding and speculative verify, the
request-to-token writer, the tree ops of SGLang's NGRAM prompt lookup), and
exposes *only* those Python names, so SGLang's own ``try: from sgl_kernel
import X / except ImportError`` fallbacks for everything else keep
choosing their pure-torch/Triton paths.

It deliberately does not define ``convert_weight_packed``: SGLang reads that
op as "AMX weight packing is available" and would then route linear layers to
packed-weight kernels this package does not provide.
"""

from __future__ import annotations

from sgl_kernel import _registry as _registry  # registers torch.ops.sgl_kernel.*
from sgl_kernel.memory import (
    assign_draft_cache_locs_contiguous_cpu,
    assign_extend_cache_locs_cpu,
    assign_req_to_token_pool_cpu,
    copy_all_layer_kv_cache_cpu,
    fill_accept_out_cache_loc_cpu,
    fill_bonus_tokens_cpu,
)
from sgl_kernel.speculative import (
    build_tree_kernel_efficient_cpu,
    reconstruct_indices_from_tree_mask,
    rotate_input_ids_cpu,
    verify_tree_greedy_cpu,
)

__all__ = [
    "IS_REFERENCE_IMPLEMENTATION",
    "assign_draft_cache_locs_contiguous_cpu",
    "assign_extend_cache_locs_cpu",
    "assign_req_to_token_pool_cpu",
    "build_tree_kernel_efficient_cpu",
    "copy_all_layer_kv_cache_cpu",
    "fill_accept_out_cache_loc_cpu",
    "fill_bonus_tokens_cpu",
    "reconstruct_indices_from_tree_mask",
    "rotate_input_ids_cpu",
    "verify_tree_greedy_cpu",
]

#: Lets callers tell this reference package from a real kernel build.
IS_REFERENCE_IMPLEMENTATION = True
__version__ = "0.1.0+ref"
