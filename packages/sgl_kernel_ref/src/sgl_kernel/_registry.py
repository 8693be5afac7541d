"""Registers the reference ops under the ``sgl_kernel`` torch.library namespace.

Schemas follow SGLang 0.5.23's call sites (positional arguments in the order
``intel_amx_backend.py`` passes them). Mutated arguments are marked ``(a!)`` so
torch's functionalisation and graph capture see the writes.
"""

from __future__ import annotations

import torch

from sgl_kernel.attention import decode_attention, extend_attention

_LIB = torch.library.Library("sgl_kernel", "FRAGMENT")

_LIB.define(
    "decode_attention_cpu(Tensor query, Tensor(a!) k_cache, Tensor(b!) v_cache, float k_scale,"
    " float v_scale, Tensor(c!) output, Tensor? key, Tensor? value, Tensor loc,"
    " Tensor attn_logits, Tensor req_to_token, Tensor req_pool_indices, Tensor seq_lens,"
    " float sm_scale, float logit_cap, bool is_cross_attention, int sliding_window_size,"
    " Tensor? encoder_lens, Tensor? sinks) -> ()"
)
_LIB.impl("decode_attention_cpu", decode_attention, "CPU")

_LIB.define(
    "extend_attention_cpu(Tensor q_extend, Tensor? k_extend, Tensor? v_extend,"
    " Tensor(a!) o_extend, Tensor k_buffer, Tensor v_buffer, float k_scale, float v_scale,"
    " Tensor req_to_token, Tensor req_pool_indices, Tensor seq_lens, Tensor extend_seq_lens,"
    " Tensor extend_start_loc, int? max_len_extend, float sm_scale, float logit_cap,"
    " bool is_cross_attention, int sliding_window_size, Tensor? encoder_lens, Tensor? sinks,"
    " Tensor? tree_mask, bool is_causal) -> ()"
)
_LIB.impl("extend_attention_cpu", extend_attention, "CPU")
