"""The pure-PyTorch sgl_kernel reference ops against straightforward per-request loops."""

from __future__ import annotations

import math

import pytest
import sgl_kernel  # registers torch.ops.sgl_kernel.*
import torch
from cpu_threads import torch_threads

torch.set_num_threads(torch_threads())

H, HKV, D = 6, 2, 8  # GQA group of 3
POOL, MAXCTX = 200, 64


@pytest.fixture(params=["per_request", "padded"])
def attention_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Run an attention test through each of the kernels' two code paths."""
    if request.param == "padded":
        monkeypatch.setattr(sgl_kernel.attention, "PER_REQUEST_MAX_BATCH", 0)
    return str(request.param)


def _naive_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    allowed: torch.Tensor,
    scale: float,
    cap: float = 0.0,
) -> torch.Tensor:
    """q [Q,H,D], k/v [L,HKV,D], allowed [Q,L] -> [Q,H,D], head by head."""
    out = torch.zeros(q.shape[0], H, v.shape[-1])
    group = H // HKV
    for h in range(H):
        s = (q[:, h] @ k[:, h // group].T) * scale
        if cap > 0:
            s = cap * torch.tanh(s / cap)
        s = s.masked_fill(~allowed, float("-inf"))
        out[:, h] = torch.softmax(s, -1) @ v[:, h // group]
    return out


def _pool(seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    kb = torch.randn(POOL, HKV, D, generator=g)
    vb = torch.randn(POOL, HKV, D, generator=g)
    # Each of 4 request slots owns a random permutation of pool rows (scattered pages).
    r2t = torch.stack([torch.randperm(POOL - 1, generator=g)[:MAXCTX] + 1 for _ in range(4)])
    return kb, vb, r2t.to(torch.int32)


@pytest.mark.parametrize("cap", [0.0, 5.0])
def test_decode_attention_matches_loop_and_writes_kv(cap: float, attention_path: str) -> None:
    kb, vb, r2t = _pool(0)
    rpi = torch.tensor([2, 0, 3])
    seq = torch.tensor([5, 17, 1])
    g = torch.Generator().manual_seed(1)
    q = torch.randn(3, H, D, generator=g)
    knew, vnew = torch.randn(3, HKV, D, generator=g), torch.randn(3, HKV, D, generator=g)
    loc = r2t[rpi, seq - 1].long()
    out = torch.empty(3, H, D)
    kb_ref, vb_ref = kb.clone(), vb.clone()
    kb_ref[loc], vb_ref[loc] = knew, vnew
    torch.ops.sgl_kernel.decode_attention_cpu(
        q,
        kb,
        vb,
        1.0,
        1.0,
        out,
        knew,
        vnew,
        loc,
        torch.empty(0),
        r2t,
        rpi,
        seq,
        1 / math.sqrt(D),
        cap,
        False,
        0,
        None,
        None,
    )
    assert torch.equal(kb, kb_ref) and torch.equal(vb, vb_ref)
    for b in range(3):
        rows = r2t[rpi[b], : seq[b]].long()
        ref = _naive_attention(
            q[b : b + 1],
            kb_ref[rows],
            vb_ref[rows],
            torch.ones(1, int(seq[b]), dtype=torch.bool),
            1 / math.sqrt(D),
            cap,
        )
        torch.testing.assert_close(out[b], ref[0], rtol=1e-5, atol=1e-5)


def test_decode_attention_sliding_window(attention_path: str) -> None:
    kb, vb, r2t = _pool(2)
    rpi, seq = torch.tensor([1]), torch.tensor([20])
    q = torch.randn(1, H, D, generator=torch.Generator().manual_seed(3))
    out = torch.empty(1, H, D)
    torch.ops.sgl_kernel.decode_attention_cpu(
        q,
        kb,
        vb,
        1.0,
        1.0,
        out,
        None,
        None,
        torch.tensor([0]),
        torch.empty(0),
        r2t,
        rpi,
        seq,
        0.3,
        0.0,
        False,
        4,
        None,
        None,
    )
    rows = r2t[1, :20].long()
    allowed = torch.arange(20)[None, :] >= 16  # the 4 most recent keys
    ref = _naive_attention(q, kb[rows], vb[rows], allowed, 0.3)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("use_tree", [False, True])
def test_extend_attention_matches_loop(use_tree: bool, attention_path: str) -> None:
    kb, vb, r2t = _pool(4)
    rpi = torch.tensor([3, 1, 0])
    ext = torch.tensor([4, 1, 6])
    prefix = torch.tensor([7, 0, 12])
    seq = prefix + ext
    start = torch.cumsum(ext, 0) - ext
    g = torch.Generator().manual_seed(5)
    T = int(ext.sum())
    q = torch.randn(T, H, D, generator=g)
    ke, ve = torch.randn(T, HKV, D, generator=g), torch.randn(T, HKV, D, generator=g)
    masks = [torch.rand(int(e), int(e), generator=g) > 0.4 for e in ext]
    for m in masks:
        m.fill_diagonal_(True)
    tree = torch.cat([m.reshape(-1) for m in masks]) if use_tree else None
    out = torch.full((T, H, D), float("nan"))
    torch.ops.sgl_kernel.extend_attention_cpu(
        q,
        ke,
        ve,
        out,
        kb,
        vb,
        1.0,
        1.0,
        r2t,
        rpi,
        seq,
        ext.int(),
        start.int(),
        int(ext.max()),
        0.25,
        0.0,
        False,
        0,
        None,
        None,
        tree,
        True,
    )
    for b in range(3):
        p, e, s = int(prefix[b]), int(ext[b]), int(start[b])
        rows = r2t[rpi[b], :p].long()
        k = torch.cat([kb[rows], ke[s : s + e]])
        v = torch.cat([vb[rows], ve[s : s + e]])
        inner = masks[b] if use_tree else torch.ones(e, e).tril().bool()
        allowed = torch.cat([torch.ones(e, p, dtype=torch.bool), inner], 1)
        ref = _naive_attention(q[s : s + e], k, v, allowed, 0.25)
        torch.testing.assert_close(out[s : s + e], ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("from_pool", [False, True])
def test_extend_attention_sliding_window_matches_loop(from_pool: bool, attention_path: str) -> None:
    """Causal extend with a 5-key window; with ``from_pool`` the extend keys are read
    from the pool (``k_extend``/``v_extend`` None, as for KV-shared layers)."""
    kb, vb, r2t = _pool(6)
    rpi = torch.tensor([0, 2])
    ext = torch.tensor([3, 6])
    prefix = torch.tensor([9, 2])
    seq, start = prefix + ext, torch.cumsum(ext, 0) - ext
    g = torch.Generator().manual_seed(7)
    T, window = int(ext.sum()), 5
    q = torch.randn(T, H, D, generator=g)
    ke, ve = torch.randn(T, HKV, D, generator=g), torch.randn(T, HKV, D, generator=g)
    if from_pool:  # the extend keys already sit in the pool at the request's rows
        for b in range(2):
            rows = r2t[rpi[b], prefix[b] : seq[b]].long()
            kb[rows], vb[rows] = ke[start[b] : start[b] + ext[b]], ve[start[b] : start[b] + ext[b]]
    out = torch.full((T, H, D), float("nan"))
    torch.ops.sgl_kernel.extend_attention_cpu(
        q,
        None if from_pool else ke,
        None if from_pool else ve,
        out,
        kb,
        vb,
        1.0,
        1.0,
        r2t,
        rpi,
        seq,
        ext.int(),
        start.int(),
        int(ext.max()),
        0.25,
        0.0,
        False,
        window,
        None,
        None,
        None,
        True,
    )
    for b in range(2):
        p, e, s = int(prefix[b]), int(ext[b]), int(start[b])
        rows = r2t[rpi[b], :p].long()
        k = torch.cat([kb[rows], ke[s : s + e]])
        v = torch.cat([vb[rows], ve[s : s + e]])
        q_pos, k_pos = torch.arange(p, p + e)[:, None], torch.arange(p + e)[None, :]
        allowed = (k_pos <= q_pos) & (q_pos - k_pos < window)
        ref = _naive_attention(q[s : s + e], k, v, allowed, 0.25)
        torch.testing.assert_close(out[s : s + e], ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("window", [0, 5])
def test_extend_of_one_token_per_request_matches_loop(window: int, attention_path: str) -> None:
    """A verify of each request's anchor only (every extend length 1, as in the draft
    decision's plain steps), prefixes of different lengths, one of them empty."""
    kb, vb, r2t = _pool(8)
    rpi = torch.tensor([2, 0, 3, 1])
    prefix = torch.tensor([11, 0, 30, 4])
    ext = torch.ones(4, dtype=torch.int64)
    seq, start = prefix + ext, torch.arange(4)
    g = torch.Generator().manual_seed(9)
    q = torch.randn(4, H, D, generator=g)
    ke, ve = torch.randn(4, HKV, D, generator=g), torch.randn(4, HKV, D, generator=g)
    out = torch.full((4, H, D), float("nan"))
    torch.ops.sgl_kernel.extend_attention_cpu(
        q, ke, ve, out, kb, vb, 1.0, 1.0, r2t, rpi, seq, ext.int(), start.int(), 1,
        0.25, 0.0, False, window, None, None, None, True,
    )  # fmt: skip
    for b in range(4):
        p = int(prefix[b])
        rows = r2t[rpi[b], :p].long()
        k, v = torch.cat([kb[rows], ke[b : b + 1]]), torch.cat([vb[rows], ve[b : b + 1]])
        allowed = torch.ones(1, p + 1, dtype=torch.bool)
        if window:
            allowed = (p - torch.arange(p + 1) < window)[None, :]
        ref = _naive_attention(q[b : b + 1], k, v, allowed, 0.25)
        torch.testing.assert_close(out[b : b + 1], ref, rtol=1e-5, atol=1e-5)


def test_assign_and_read_cache_locs_roundtrip() -> None:
    r2t = torch.zeros(4, 16, dtype=torch.int32)
    rpi = torch.tensor([2, 0])
    start, end = torch.tensor([3, 0]), torch.tensor([6, 2])
    locs = torch.tensor([11, 12, 13, 21, 22])
    sgl_kernel.assign_req_to_token_pool_cpu(rpi, r2t, start, end, locs, 16)
    assert r2t[2, 3:6].tolist() == [11, 12, 13] and r2t[0, 0:2].tolist() == [21, 22]
    assert int((r2t != 0).sum()) == 5
    back = torch.zeros(5, dtype=torch.int64)
    sgl_kernel.assign_extend_cache_locs_cpu(rpi, r2t, start, end, back, 16)
    assert back.tolist() == locs.tolist()


def test_draft_cache_locs_bonus_and_accept_fill() -> None:
    r2t = torch.arange(64, dtype=torch.int32).reshape(4, 16)
    out = torch.zeros(2 * 3, dtype=torch.int64)
    sgl_kernel.assign_draft_cache_locs_contiguous_cpu(
        torch.tensor([1, 3]), r2t, torch.tensor([5, 2]), out, 16, 1, 3
    )
    assert out.tolist() == [21, 22, 23, 50, 51, 52]
    bonus = torch.zeros(2, dtype=torch.int64)
    sgl_kernel.fill_bonus_tokens_cpu(
        torch.tensor([[7, 8, 9], [4, 5, 6]]), torch.tensor([2, 3]), bonus, 3
    )
    assert bonus.tolist() == [8, 6]
    acc = torch.full((4,), -1, dtype=torch.int64)
    sgl_kernel.fill_accept_out_cache_loc_cpu(
        torch.tensor([0, -1, 2, 5]), torch.tensor([100, 101, 102, 103, 104, 105]), acc
    )
    assert acc.tolist() == [100, 102, 105, -1]


def test_copy_all_layer_kv_cache_overlapping_ranges() -> None:
    bufs = [torch.arange(40, dtype=torch.float32).reshape(10, 4), torch.arange(20.0).reshape(10, 2)]
    ptrs = torch.tensor([b.data_ptr() for b in bufs], dtype=torch.uint64)
    strides = torch.tensor([b.stride(0) * b.element_size() for b in bufs])
    expected = [b.clone() for b in bufs]
    src, tgt = torch.tensor([2, 3, 4]), torch.tensor([3, 4, 5])  # overlapping shift
    for e in expected:
        e[tgt] = e[src].clone()
    sgl_kernel.copy_all_layer_kv_cache_cpu(ptrs, strides, tgt, src)
    for b, e in zip(bufs, expected, strict=True):
        assert torch.equal(b, e)


def _reconstruct_loop(mask: torch.Tensor, seq_lens: list[int], n: int) -> tuple[list, ...]:
    """SGLang's CUDA ``reconstructIndicesFromTreeMask``, one (request, node) at a time."""
    m = mask.reshape(-1).tolist()
    pos, ridx, nxt, sib = [], [], [], []
    for b, seq_len in enumerate(seq_lens):
        base = b * n * n
        for t in range(n):
            depth, parent = 0, -1
            for i in range(t - 1, -1, -1):
                if m[base + t * n + i]:
                    depth += 1
                    if parent == -1:
                        parent = i
            pos.append(depth + seq_len)
            ridx.append(b * n + t)
            nxt.append(next((i for i in range(t + 1, n) if m[base + i * n + t]), -1))
            sibling = -1
            if parent != -1:
                for i in range(t + 1, n):
                    row = m[base + i * n : base + i * n + n]
                    if row[parent] and not any(row[parent + 1 : i]):
                        sibling = i
                        break
            sib.append(sibling)
    return pos, ridx, nxt, sib


def _random_tree_mask(g: torch.Generator, n: int) -> torch.Tensor:
    """An NGRAM-style draft tree: node 0 is the root, parent(i) < i, mask = ancestors + self."""
    mask = torch.zeros(n, n, dtype=torch.bool)
    mask[0, 0] = True
    for i in range(1, n):
        parent = int(torch.randint(0, i, (1,), generator=g))
        mask[i] = mask[parent]
        mask[i, i] = True
    return mask


def _run_reconstruct(mask: torch.Tensor, seq_lens: torch.Tensor, bs: int, n: int) -> list:
    # Preallocated larger than bs, as NGRAMWorker does; rows past bs must stay untouched.
    pos = torch.full(((bs + 1) * n,), -7, dtype=torch.int64)
    ridx, nxt, sib = (torch.full((bs + 1, n), -7, dtype=torch.int64) for _ in range(3))
    sgl_kernel.reconstruct_indices_from_tree_mask(mask, seq_lens, pos, ridx, nxt, sib, bs, n)
    for t in (pos[bs * n :], ridx[bs:], nxt[bs:], sib[bs:]):
        assert (t == -7).all()
    return [pos[: bs * n].tolist()] + [t[:bs].reshape(-1).tolist() for t in (ridx, nxt, sib)]


@pytest.mark.parametrize("kind", ["tree", "arbitrary"])
@pytest.mark.parametrize("n", [1, 4, 9])
def test_reconstruct_indices_from_tree_mask_matches_loop(kind: str, n: int) -> None:
    g = torch.Generator().manual_seed(7 * n + len(kind))
    for bs in (1, 3):
        if kind == "tree":
            mask = torch.stack([_random_tree_mask(g, n) for _ in range(bs)]).reshape(-1)
        else:  # any bytes: the kernel's contract reads the raw strict lower triangle
            mask = (torch.rand(bs * n * n, generator=g) > 0.5).to(torch.uint8)
        seq_lens = torch.randint(1, 100, (bs,), generator=g)
        got = _run_reconstruct(mask, seq_lens, bs, n)
        assert got == list(_reconstruct_loop(mask, seq_lens.tolist(), n))


def test_reconstruct_indices_from_ngram_corpus_mask() -> None:
    # A mask SGLang's NgramCorpus returns: chain 0-1-2, node 3 a second child of 1.
    mask = torch.tensor([1, 0, 0, 0, 1, 1, 0, 0, 1, 1, 1, 0, 1, 1, 0, 1], dtype=torch.bool)
    pos, ridx, nxt, sib = _run_reconstruct(mask, torch.tensor([10]), 1, 4)
    assert pos == [10, 11, 12, 12] and ridx == [0, 1, 2, 3]
    assert nxt == [1, 2, -1, -1] and sib == [-1, -1, 3, -1]


def _verify_greedy_loop(cand, ridx, nxt, sib, target, predicts, accept_index, steps):
    """SGLang's CUDA ``VerifyTreeGreedy``, request by request on Python lists."""
    flat_target = [x for row in target for x in row]
    nums = []
    for b in range(len(cand)):
        last = ridx[b][0]
        accept_index[b][0] = last
        num, cur = 0, 0
        for _ in range(1, steps):
            cur = nxt[b][cur]
            while cur != -1:
                if cand[b][cur] == flat_target[last]:
                    predicts[last] = flat_target[last]
                    num += 1
                    accept_index[b][num] = ridx[b][cur]
                    last = ridx[b][cur]
                    break
                cur = sib[b][cur]
            if cur == -1:
                break
        nums.append(num)
        predicts[last] = flat_target[last]
    return predicts, accept_index, nums


@pytest.mark.parametrize("n", [1, 5, 8])
def test_verify_tree_greedy_matches_loop(n: int) -> None:
    g = torch.Generator().manual_seed(11 + n)
    bs, vocab = 6, 3  # a tiny vocabulary, so drafts match often and walks go deep
    accepted = 0
    for steps in (1, 3, n):
        mask = torch.stack([_random_tree_mask(g, n) for _ in range(bs)]).reshape(-1)
        _, ridx, nxt, sib = (torch.tensor(x) for x in _reconstruct_loop(mask, [0] * bs, n))
        ridx, nxt, sib = ridx.reshape(bs, n), nxt.reshape(bs, n), sib.reshape(bs, n)
        cand = torch.randint(0, vocab, (bs, n), generator=g)
        target = torch.randint(0, vocab, (bs, n), generator=g)
        predicts = torch.full((bs * n,), -5, dtype=torch.int32)
        accept_index = torch.full((bs, steps), -1, dtype=torch.int32)
        num = torch.full((bs,), -9, dtype=torch.int32)
        ref = _verify_greedy_loop(
            cand.tolist(), ridx.tolist(), nxt.tolist(), sib.tolist(), target.tolist(),
            predicts.tolist(), accept_index.tolist(), steps,
        )  # fmt: skip
        sgl_kernel.verify_tree_greedy_cpu(
            predicts=predicts,
            accept_index=accept_index,
            accept_token_num=num,
            candidates=cand,
            retrive_index=ridx,
            retrive_next_token=nxt,
            retrive_next_sibling=sib,
            target_predict=target,
        )
        assert (predicts.tolist(), accept_index.tolist(), num.tolist()) == ref
        accepted += sum(ref[2])
    assert n == 1 or accepted > 0  # the walks did go past the root


def test_exposes_only_reference_names() -> None:
    assert sgl_kernel.IS_REFERENCE_IMPLEMENTATION
    # SGLang treats this op as "AMX weight packing available"; we must not claim it.
    assert not hasattr(torch.ops.sgl_kernel, "convert_weight_packed")
    with pytest.raises(NotImplementedError, match="tree speculation"):
        sgl_kernel.build_tree_kernel_efficient_cpu()
