"""Paged decode/extend attention over SGLang's token-indexed KV pool.

These are the two attention kernels SGLang's ``intel_amx`` backend calls. The
real kernels (AMX/AVX-512 C++) split the KV range into chunks; this reference
computes the same result densely over the keys/values named by
``req_to_token[req_pool_index, :seq_len]`` (two ways, below). GQA is handled by
viewing the query heads as ``[kv_heads, group]`` so keys are never repeated in
memory.

Invariant (both kernels): query row ``t`` of request ``b`` attends exactly to
the keys its mask allows (prefix always; the extend part causally or through
the tree mask; the sliding window and the padding removed), with softmax over
``sm_scale * q.k`` (soft-capped by ``logit_cap`` when > 0, with an optional
per-head sink logit in the denominator); rows with no visible key output 0.

Two ways to compute it, chosen per call. A batch of up to
``PER_REQUEST_MAX_BATCH`` requests without soft-cap or sinks runs request by
request: gather that request's keys, build its ``[Q, L]`` mask (none at all
for decode, where a window only shortens the gather) and run two
batched matmuls in float32, a handful of ops per request.
Everything else takes the padded path: one masked softmax over the whole
batch, a fixed number of ops whatever the batch size. Every op costs a few
microseconds of dispatch on a CPU and a decode or verify step calls these
kernels once per layer, so at the batch sizes of interactive decoding the op
count, not the arithmetic, is the kernels' cost. Both paths compute in float32
and agree to float32 rounding.
"""

from __future__ import annotations

import torch

#: Largest batch computed request by request (see the module docstring).
PER_REQUEST_MAX_BATCH = 8


def _per_request(bsz: int, logit_cap: float, sinks: torch.Tensor | None) -> bool:
    return bsz <= PER_REQUEST_MAX_BATCH and logit_cap <= 0 and sinks is None


def _attend_one(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, visible: torch.Tensor | None, sm_scale: float
) -> torch.Tensor:
    """One request's attention in float32: q ``[Q, H, D]``, k/v ``[L, Hkv, D]``, visible ``[Q, L]``.

    Two batched matmuls over the KV heads, each query head group stacked as rows
    (head ``h`` reads KV head ``h // group``). Returns ``[Q, H, Dv]``; a query row
    with no visible key gives 0.
    """
    nq, heads, dim = q.shape
    kv_heads, length = k.shape[1], k.shape[0]
    group = heads // kv_heads
    qh = q.float().view(nq, kv_heads, group, dim).permute(1, 2, 0, 3).reshape(kv_heads, -1, dim)
    scores = torch.bmm(qh, k.float().permute(1, 2, 0)).mul_(sm_scale)
    if visible is not None:
        scores.view(kv_heads, group, nq, length).masked_fill_(~visible, float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    if visible is not None:
        probs.nan_to_num_(0.0)
    out = torch.bmm(probs, v.float().transpose(0, 1))
    return out.view(kv_heads, group, nq, -1).permute(2, 0, 1, 3).reshape(nq, heads, -1)


def _gqa_attention(
    q: torch.Tensor,
    k: torch.Tensor | tuple[torch.Tensor, ...],
    v: torch.Tensor | tuple[torch.Tensor, ...],
    visible: torch.Tensor,
    sm_scale: float,
    logit_cap: float,
    sinks: torch.Tensor | None,
) -> torch.Tensor:
    """Masked attention for a padded batch.

    q ``[B, Q, H, D]``, k ``[B, L, Hkv, D]``, v ``[B, L, Hkv, Dv]``,
    visible ``[B, Q, L]`` bool. Returns ``[B, Q, H, Dv]`` in float32. ``k`` and ``v`` may be
    tuples of parts along ``L`` (visible covers their concatenation): the scores are
    joined instead of the keys, so no part is copied.
    """
    ks = k if isinstance(k, tuple) else (k,)
    vs = v if isinstance(v, tuple) else (v,)
    bsz, nq, heads, dim = q.shape
    kv_heads = ks[0].shape[2]
    group = heads // kv_heads
    qg = q.float().reshape(bsz, nq, kv_heads, group, dim)
    # scores[b, h_kv, g, q, l]
    parts = [torch.einsum("bqhgd,blhd->bhgql", qg, kp.float()) for kp in ks]
    scores = (parts[0] if len(parts) == 1 else torch.cat(parts, -1)) * sm_scale
    if logit_cap > 0:
        scores = logit_cap * torch.tanh(scores / logit_cap)
    mask = visible[:, None, None, :, :]
    scores = scores.masked_fill(~mask, float("-inf"))
    if sinks is not None:
        sink = sinks.float().reshape(1, kv_heads, group, 1, 1).expand(bsz, -1, -1, nq, 1)
        scores = torch.cat([scores, sink], dim=-1)
    probs = torch.softmax(scores, dim=-1)
    if sinks is not None:
        probs = probs[..., :-1]
    # Rows with nothing visible (padding) give NaN from softmax(-inf...): zero them.
    probs = torch.nan_to_num(probs, nan=0.0)
    out = None
    for pp, vp in zip(probs.split([kp.shape[1] for kp in ks], -1), vs, strict=True):
        part = torch.einsum("bhgql,blhd->bqhgd", pp, vp.float())
        out = part if out is None else out.add_(part)
    assert out is not None
    return out.reshape(bsz, nq, heads, vs[0].shape[-1])


def _window_ok(q_pos: torch.Tensor, k_pos: torch.Tensor, window: int) -> torch.Tensor:
    """``window`` = number of most recent keys a query may see (0 = unlimited)."""
    if window <= 0:
        return torch.ones(torch.broadcast_shapes(q_pos.shape, k_pos.shape), dtype=torch.bool)
    return (q_pos - k_pos) < window


def decode_attention(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    k_scale: float,
    v_scale: float,
    output: torch.Tensor,
    key: torch.Tensor | None,
    value: torch.Tensor | None,
    loc: torch.Tensor,
    attn_logits: torch.Tensor,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    sm_scale: float,
    logit_cap: float,
    is_cross_attention: bool,
    sliding_window_size: int,
    encoder_lens: torch.Tensor | None,
    sinks: torch.Tensor | None,
) -> None:
    """One new query token per request; writes ``key``/``value`` at ``loc`` first.

    The new token is the last of its request's ``seq_len`` tokens, so the write
    must precede the gather (the kernel contract SGLang relies on: the backend
    does not call ``set_kv_buffer`` itself in decode).
    """
    del attn_logits  # scratch space of the split-K kernel; not needed densely
    if is_cross_attention:
        raise NotImplementedError("sgl_kernel reference: cross-attention is not implemented")
    del encoder_lens
    if key is not None and value is not None:
        k_cache[loc.long()] = key.to(k_cache.dtype)
        v_cache[loc.long()] = value.to(v_cache.dtype)
    bsz = query.shape[0]
    if bsz == 0:
        return
    if _per_request(bsz, logit_cap, sinks):
        pool_index = req_pool_indices.tolist()
        for b, n in enumerate(seq_lens.tolist()):
            first = max(0, n - sliding_window_size) if sliding_window_size > 0 else 0
            rows = req_to_token[pool_index[b], first:n].long()
            k = _gather(k_cache, rows, k_scale)
            v = _gather(v_cache, rows, v_scale)
            output[b] = _attend_one(query[b : b + 1], k, v, None, sm_scale)[0].to(output.dtype)
        return
    lens = seq_lens.long()
    max_len = int(lens.max())
    pos = torch.arange(max_len, device=query.device)
    rows = req_to_token[req_pool_indices.long(), :max_len].long()
    valid = pos[None, :] < lens[:, None]
    rows = torch.where(valid, rows, torch.zeros_like(rows))
    k = _gather(k_cache, rows, k_scale)
    v = _gather(v_cache, rows, v_scale)
    q_pos = (lens - 1)[:, None]
    visible = valid & _window_ok(q_pos, pos[None, :], sliding_window_size)
    out = _gqa_attention(query[:, None], k, v, visible[:, None, :], sm_scale, logit_cap, sinks)
    output.copy_(out[:, 0].to(output.dtype))


def extend_attention(
    q_extend: torch.Tensor,
    k_extend: torch.Tensor | None,
    v_extend: torch.Tensor | None,
    o_extend: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    k_scale: float,
    v_scale: float,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    extend_seq_lens: torch.Tensor,
    extend_start_loc: torch.Tensor,
    max_len_extend: int | None,
    sm_scale: float,
    logit_cap: float,
    is_cross_attention: bool,
    sliding_window_size: int,
    encoder_lens: torch.Tensor | None,
    sinks: torch.Tensor | None,
    tree_mask: torch.Tensor | None,
    is_causal: bool,
) -> None:
    """Packed extend queries over ``prefix (from the pool) + extend (given)``.

    Request ``b`` owns rows ``extend_start_loc[b] : +extend_seq_lens[b]`` and has
    ``prefix = seq_len - extend_len`` cached tokens. Prefix keys come from the
    pool via ``req_to_token``; extend keys from ``k_extend``/``v_extend`` (or the
    pool when they are ``None``, e.g. KV-shared layers). ``tree_mask`` is the
    CPU (QLEN_ONLY) layout: request ``b`` contributes an ``[E_b, E_b]`` block,
    blocks concatenated in batch order; it replaces the causal rule inside the
    extend part.
    """
    del max_len_extend
    if is_cross_attention:
        raise NotImplementedError("sgl_kernel reference: cross-attention is not implemented")
    del encoder_lens
    bsz = seq_lens.shape[0]
    if bsz == 0 or q_extend.shape[0] == 0:
        return
    if _per_request(bsz, logit_cap, sinks):
        _extend_per_request(
            q_extend,
            k_extend,
            v_extend,
            o_extend,
            k_buffer,
            v_buffer,
            k_scale,
            v_scale,
            req_to_token,
            req_pool_indices,
            seq_lens,
            extend_seq_lens,
            extend_start_loc,
            sm_scale,
            sliding_window_size,
            tree_mask,
            is_causal,
        )
        return
    device = q_extend.device
    ext = extend_seq_lens.long().to(device)
    start = extend_start_loc.long().to(device)
    prefix = seq_lens.long().to(device) - ext
    pool_index = req_pool_indices.long()
    max_pre, max_ext = int(prefix.max()), int(ext.max())

    # Queries, and the extend part's keys, in a padded [B, E] grid.
    qi = torch.arange(max_ext, device=device)
    q_valid = qi[None, :] < ext[:, None]
    q_rows = torch.where(q_valid, start[:, None] + qi[None, :], torch.zeros_like(qi)[None, :])
    q = q_extend[q_rows]
    # Keys: the prefix from the pool in a padded [B, P] grid, then the extend part [B, E]
    # (given, or from the pool for KV-shared layers), two parts never copied into one.
    pj = torch.arange(max_pre, device=device)
    pre_valid = pj[None, :] < prefix[:, None]
    pre_rows = torch.where(pre_valid, req_to_token[pool_index, :max_pre].long(), 0)
    if k_extend is not None and v_extend is not None:
        ke, ve = k_extend[q_rows].float(), v_extend[q_rows].float()
    else:
        at = torch.where(q_valid, prefix[:, None] + qi[None, :], 0)
        ext_rows = req_to_token[pool_index[:, None], at].long()
        ke, ve = _gather(k_buffer, ext_rows, k_scale), _gather(v_buffer, ext_rows, v_scale)
    k = (_gather(k_buffer, pre_rows, k_scale), ke)
    v = (_gather(v_buffer, pre_rows, v_scale), ve)

    # visible[b, i, j]: query i of request b may see key j (prefix keys, then extend keys).
    pre_vis = pre_valid[:, None, :].expand(-1, max_ext, -1)
    key_valid = q_valid[:, None, :]
    if tree_mask is not None:
        sizes = ext * ext
        offsets = torch.cumsum(sizes, 0) - sizes
        flat = offsets[:, None, None] + qi[None, :, None] * ext[:, None, None] + qi[None, None, :]
        inside = q_valid[:, :, None] & key_valid
        flat = torch.where(inside, flat, torch.zeros_like(flat))
        ext_vis = inside & tree_mask.reshape(-1).bool()[flat]
    elif is_causal:
        ext_vis = key_valid & (qi[None, None, :] <= qi[None, :, None])
    else:
        ext_vis = key_valid.expand(-1, max_ext, -1)
    if is_causal and sliding_window_size > 0:
        q_pos = (prefix[:, None] + qi[None, :])[:, :, None]  # absolute position of each query
        pre_vis = pre_vis & _window_ok(q_pos, pj[None, None, :], sliding_window_size)
        ext_vis = ext_vis & _window_ok(qi[None, :, None], qi[None, None, :], sliding_window_size)
    visible = torch.cat([pre_vis, ext_vis], 2) & q_valid[:, :, None]

    out = _gqa_attention(q, k, v, visible, sm_scale, logit_cap, sinks)
    o_extend[q_rows[q_valid]] = out[q_valid].to(o_extend.dtype)


def _gather(pool: torch.Tensor, rows: torch.Tensor, scale: float) -> torch.Tensor:
    """``pool[rows]`` in float32, scaled; ``index_select`` is several times faster on CPU."""
    picked = pool.index_select(0, rows.reshape(-1)).view(*rows.shape, *pool.shape[1:]).float()
    return picked if scale == 1.0 else picked * scale


def _extend_per_request(
    q_extend: torch.Tensor,
    k_extend: torch.Tensor | None,
    v_extend: torch.Tensor | None,
    o_extend: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    k_scale: float,
    v_scale: float,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    extend_seq_lens: torch.Tensor,
    extend_start_loc: torch.Tensor,
    sm_scale: float,
    sliding_window_size: int,
    tree_mask: torch.Tensor | None,
    is_causal: bool,
) -> None:
    """``extend_attention`` one request at a time (same arguments, same invariant)."""
    tree = tree_mask.reshape(-1).bool() if tree_mask is not None else None
    tree_offset = 0
    pool_index = req_pool_indices.tolist()
    for b, (n, e, s) in enumerate(
        zip(seq_lens.tolist(), extend_seq_lens.tolist(), extend_start_loc.tolist(), strict=True)
    ):
        if e == 0:
            continue
        p = n - e
        if k_extend is not None and v_extend is not None:
            rows = req_to_token[pool_index[b], :p].long()
            k = torch.cat([_gather(k_buffer, rows, k_scale), k_extend[s : s + e].float()])
            v = torch.cat([_gather(v_buffer, rows, v_scale), v_extend[s : s + e].float()])
        else:
            rows = req_to_token[pool_index[b], :n].long()
            k = _gather(k_buffer, rows, k_scale)
            v = _gather(v_buffer, rows, v_scale)
        visible: torch.Tensor | None = None
        key_pos = torch.arange(n)
        query_pos = torch.arange(p, n)[:, None]
        if tree is not None:
            inner = tree[tree_offset : tree_offset + e * e].view(e, e)
            tree_offset += e * e
            visible = torch.cat([torch.ones(e, p, dtype=torch.bool), inner], 1)
        elif is_causal and e > 1:
            visible = key_pos[None, :] <= query_pos
        if is_causal and sliding_window_size > 0:
            in_window = (query_pos - key_pos[None, :]) < sliding_window_size
            visible = in_window if visible is None else visible & in_window
        out = _attend_one(q_extend[s : s + e], k, v, visible, sm_scale)
        o_extend[s : s + e] = out.to(o_extend.dtype)
