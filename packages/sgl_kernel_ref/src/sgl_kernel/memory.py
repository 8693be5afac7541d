"""KV-pool bookkeeping ops SGLang's CPU allocator and spec workers call.

All of them move *indices* (or raw KV rows) between SGLang's tables; the
GPU versions are Triton kernels in ``sglang/kernels/ops``. Each function
states its invariant; all are vectorised over the batch.
"""

from __future__ import annotations

import ctypes

import numpy as np
import torch


def _segments(start: torch.Tensor, end: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Flatten ragged ``[start_i, end_i)`` ranges: (owner row, column, total)."""
    start = start.long()
    lengths = (end.long() - start).clamp(min=0)
    total = int(lengths.sum())
    owner = torch.repeat_interleave(torch.arange(lengths.shape[0]), lengths)
    first = torch.cumsum(lengths, 0) - lengths
    col = start[owner] + (torch.arange(total) - first[owner])
    return owner, col, total


def assign_req_to_token_pool_cpu(
    req_pool_indices: torch.Tensor,
    req_to_token: torch.Tensor,
    start_offset: torch.Tensor,
    end_offset: torch.Tensor,
    out_cache_loc: torch.Tensor,
    pool_len: int,
) -> None:
    """``req_to_token[rpi[i], start[i]:end[i]] = next end[i]-start[i] of out_cache_loc``.

    Requests consume ``out_cache_loc`` back to back in batch order; no other
    cell changes.
    """
    del pool_len  # row stride; implied by req_to_token's shape here
    owner, col, total = _segments(start_offset, end_offset)
    if total == 0:
        return
    row = req_pool_indices.long()[owner]
    req_to_token[row, col] = out_cache_loc[:total].to(req_to_token.dtype)


def assign_extend_cache_locs_cpu(
    req_pool_indices: torch.Tensor,
    req_to_token: torch.Tensor,
    start_offset: torch.Tensor,
    end_offset: torch.Tensor,
    out_cache_loc: torch.Tensor,
    pool_len: int,
) -> None:
    """The inverse read: ``out_cache_loc`` (packed) ``= req_to_token[rpi[i], start[i]:end[i]]``."""
    del pool_len
    owner, col, total = _segments(start_offset, end_offset)
    if total == 0:
        return
    row = req_pool_indices.long()[owner]
    out_cache_loc[:total] = req_to_token[row, col].to(out_cache_loc.dtype)


def assign_draft_cache_locs_contiguous_cpu(
    req_pool_indices: torch.Tensor,
    req_to_token: torch.Tensor,
    seq_lens: torch.Tensor,
    out_cache_loc: torch.Tensor,
    pool_len: int,
    topk: int,
    num_steps: int,
) -> None:
    """Request ``i`` copies its ``topk * num_steps`` slots from ``seq_lens[i]`` on.

    ``out_cache_loc`` is ``[bs * topk * num_steps]``, request-major.
    """
    del pool_len
    width = topk * num_steps
    bs = seq_lens.shape[0]
    if bs == 0 or width == 0:
        return
    cols = seq_lens.long()[:, None] + torch.arange(width)[None, :]
    rows = req_pool_indices.long()[:, None].expand(bs, width)
    out_cache_loc[: bs * width] = req_to_token[rows, cols].reshape(-1).to(out_cache_loc.dtype)


def fill_bonus_tokens_cpu(
    accept_tokens: torch.Tensor,
    accept_lens: torch.Tensor,
    bonus_tokens: torch.Tensor,
    accept_stride: int,
) -> None:
    """``bonus_tokens[i] = accept_tokens[i, accept_lens[i] - 1]`` (the last emitted token)."""
    bs = accept_lens.shape[0]
    idx = torch.arange(bs) * accept_stride + accept_lens.long() - 1
    bonus_tokens[:bs] = accept_tokens.reshape(-1)[idx].to(bonus_tokens.dtype)


def fill_accept_out_cache_loc_cpu(
    accept_index: torch.Tensor,
    out_cache_loc: torch.Tensor,
    accept_out_cache_loc: torch.Tensor,
) -> None:
    """Compaction: the k-th non-negative ``accept_index`` entry ``s`` sends
    ``out_cache_loc[s]`` to ``accept_out_cache_loc[k]``."""
    flat = accept_index.reshape(-1).long()
    src = flat[flat >= 0]
    accept_out_cache_loc[: src.numel()] = out_cache_loc[src].to(accept_out_cache_loc.dtype)


def copy_all_layer_kv_cache_cpu(
    data_ptrs: torch.Tensor,
    strides: torch.Tensor,
    tgt_loc: torch.Tensor,
    src_loc: torch.Tensor,
) -> None:
    """For every KV buffer (given by base address and row bytes): ``rows[tgt] = rows[src]``.

    SGLang passes raw buffer addresses (one per layer and K/V), so each buffer is
    viewed as ``uint8 [rows, row_bytes]`` up to the highest row touched. Sources
    are read before any target is written (safe when the ranges overlap), as the
    GPU kernel guarantees.
    """
    if tgt_loc.numel() == 0:
        return
    tgt = tgt_loc.long()
    src = src_loc.long()
    n_rows = int(torch.maximum(tgt.max(), src.max())) + 1
    for ptr, stride in zip(data_ptrs.tolist(), strides.tolist(), strict=True):
        nbytes = n_rows * int(stride)
        raw = (ctypes.c_uint8 * nbytes).from_address(int(ptr))
        rows = torch.from_numpy(np.ctypeslib.as_array(raw)).view(n_rows, int(stride))
        rows[tgt] = rows[src].clone()
