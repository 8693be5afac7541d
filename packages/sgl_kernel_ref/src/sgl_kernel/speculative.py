"""Tree-speculation ops SGLang imports on CPU.

SGLang's EAGLE/NGRAM modules import these names at module level when
``is_cpu()``. Two are implemented, the ones NGRAM (prompt lookup) needs:
``reconstruct_indices_from_tree_mask`` (tree links and positions from the
corpus's draft-tree mask) and ``verify_tree_greedy_cpu`` (greedy walk of a
draft tree against the target's argmax). Their contract is the CUDA kernels'
in SGLang 0.5.23 (``kernels/jit/include/sgl_kernel/speculative/ngram.cuh``
and ``eagle.cuh``), vectorised over the batch. The EAGLE tree builder and the
multi-layer EAGLE input rotation stay stubs that fail loudly if reached.
"""

from __future__ import annotations

from typing import NoReturn

import torch


def _not_implemented(name: str) -> NoReturn:
    raise NotImplementedError(
        f"sgl_kernel reference: {name} (tree speculation: EAGLE topk>1) is not "
        "implemented; run DSPARK, NGRAM or plain decoding on CPU, or install the real sgl-kernel."
    )


def build_tree_kernel_efficient_cpu(*args: object, **kwargs: object) -> NoReturn:
    _not_implemented("build_tree_kernel_efficient_cpu")


def rotate_input_ids_cpu(*args: object, **kwargs: object) -> NoReturn:
    _not_implemented("rotate_input_ids_cpu")


def reconstruct_indices_from_tree_mask(
    tree_mask: torch.Tensor,
    verified_seq_len: torch.Tensor,
    positions: torch.Tensor,
    retrive_index: torch.Tensor,
    retrive_next_token: torch.Tensor,
    retrive_next_sibling: torch.Tensor,
    batch_size: int,
    draft_token_num: int,
) -> None:
    """Positions and tree links of ``batch_size`` draft trees of ``n`` nodes each.

    ``tree_mask`` is flat ``[bs * n * n]`` (bool or 1-byte), row-major
    ``(b, i, j)``; only ``j < i`` is read, as "node ``j`` is an ancestor of
    node ``i``". With ``anc`` that strict lower triangle, per node ``t``:

    * ``positions[b*n + t] = #anc[t, :] + verified_seq_len[b]``
    * ``retrive_index[b, t] = b*n + t``
    * ``parent(t) = max{j : anc[t, j]}``, else -1
    * ``retrive_next_token[b, t] = min{k : anc[k, t]}`` (first child), else -1
    * ``retrive_next_sibling[b, t] = min{k > t : parent(k) == parent(t)}``,
      else -1; always -1 when ``parent(t) == -1``.

    Writes in place, like the kernel; nothing else changes.
    """
    bs, n = int(batch_size), int(draft_token_num)
    if bs == 0:
        return
    node = torch.arange(n, device=tree_mask.device)
    anc = tree_mask[: bs * n * n].reshape(bs, n, n).bool() & (node[None, :] < node[:, None])

    depth = anc.sum(-1)
    positions[: bs * n] = (depth + verified_seq_len[:bs].long()[:, None]).reshape(-1)
    retrive_index[:bs] = torch.arange(bs * n, device=tree_mask.device).reshape(bs, n)

    parent = torch.where(anc, node, -1).amax(-1)  # [bs, n]
    # anc[b, k, t] already implies k > t: first child = smallest such k.
    first_child = torch.where(anc, node[None, :, None], n).amin(1)
    retrive_next_token[:bs] = torch.where(first_child < n, first_child, -1)

    later = node[:, None] > node[None, :]  # [k, t]: k > t
    same_parent = (parent[:, :, None] == parent[:, None, :]) & later
    first_sibling = torch.where(same_parent, node[None, :, None], n).amin(1)
    has_sibling = (parent >= 0) & (first_sibling < n)
    retrive_next_sibling[:bs] = torch.where(has_sibling, first_sibling, -1)


def verify_tree_greedy_cpu(
    predicts: torch.Tensor,
    accept_index: torch.Tensor,
    accept_token_num: torch.Tensor,
    candidates: torch.Tensor,
    retrive_index: torch.Tensor,
    retrive_next_token: torch.Tensor,
    retrive_next_sibling: torch.Tensor,
    target_predict: torch.Tensor,
) -> None:
    """Greedy acceptance down each request's draft tree, in place.

    Shapes: ``candidates``/``retrive_*``/``target_predict`` ``[bs, n]``,
    ``accept_index`` ``[bs, S]``, ``accept_token_num`` ``[bs]``, ``predicts``
    flat over ``retrive_index`` values. Per request, starting at the root
    (``last = retrive_index[b, 0]``, written to ``accept_index[b, 0]``), for up
    to ``S - 1`` levels: walk the children of the current node (first child,
    then next siblings) and accept the first whose candidate token equals
    ``target_predict.flat[last]``; accepting writes that token to
    ``predicts[last]``, appends the child's ``retrive_index`` to
    ``accept_index[b]`` and moves ``last`` to it. The first level with no
    matching child ends the walk. Finally ``accept_token_num[b]`` is the number
    accepted and ``predicts[last] = target_predict.flat[last]`` (the bonus
    token). Other entries of ``predicts``/``accept_index`` are left as they are.
    """
    bs, n = candidates.shape
    if bs == 0:
        return
    steps = accept_index.shape[1]
    rows = torch.arange(bs, device=candidates.device)
    cand = candidates.long()
    ridx = retrive_index.long()
    next_token = retrive_next_token.long()
    next_sibling = retrive_next_sibling.long()
    target = target_predict.reshape(-1).long()

    last = ridx[:, 0].clone()
    accept_index[:, 0] = last.to(accept_index.dtype)
    num = torch.zeros(bs, dtype=torch.long, device=candidates.device)
    cur = torch.zeros(bs, dtype=torch.long, device=candidates.device)
    active = torch.ones(bs, dtype=torch.bool, device=candidates.device)
    for _ in range(1, steps):
        cur = torch.where(active, next_token[rows, cur.clamp(min=0)], cur)
        want = target[last]
        searching = active & (cur != -1)
        found = torch.zeros_like(active)
        # A sibling chain holds fewer than n nodes.
        for _ in range(n):
            if not bool(searching.any()):
                break
            at = cur.clamp(min=0)
            match = searching & (cand[rows, at] == want)
            if bool(match.any()):
                m_rows, m_at = rows[match], at[match]
                predicts[last[match]] = want[match].to(predicts.dtype)
                num[match] += 1
                accept_index[m_rows, num[match]] = ridx[m_rows, m_at].to(accept_index.dtype)
                last[match] = ridx[m_rows, m_at]
                found |= match
            searching &= ~match
            cur = torch.where(searching, next_sibling[rows, at], cur)
            searching &= cur != -1
        active &= found
        if not bool(active.any()):
            break
    accept_token_num[:bs] = num.to(accept_token_num.dtype)
    predicts[last] = target[last].to(predicts.dtype)
