"""Tests of rocm_attn.reference (the package's oracle)."""

import math

import pytest
import torch
import torch.nn.functional as F

from rocm_attn.reference import attention_mask, reference_attention, reference_small_seq

F64 = torch.float64
NEG_INF = float("-inf")


# ---------------------------------------------------------------------------
# independent naive implementation (python loops, tiny sizes only)
# ---------------------------------------------------------------------------


def naive_allowed(i, j, sq, skv, causal, window, chunk):
    """``causal``: a bool (bottom-right causal) or a mask-type name (Transformer Engine's:
    "causal" / "padding_causal" are top-left aligned, window included)."""
    top_left = causal in ("causal", "padding_causal")
    if isinstance(causal, str):
        causal = "causal" in causal
    p = i if top_left else i + (skv - sq)
    left, right = window
    if causal and j > p:
        return False
    if left >= 0 and j < p - left:
        return False
    if right >= 0 and j > p + right:
        return False
    if chunk is not None and math.floor(j / chunk) != math.floor(p / chunk):
        return False
    return True


def naive_mask(sq, skv, causal, window=(-1, -1), chunk=None):
    return torch.tensor(
        [[naive_allowed(i, j, sq, skv, causal, window, chunk) for j in range(skv)] for i in range(sq)],
        dtype=torch.bool,
    ).reshape(sq, skv)


def naive_attention(q, k, v, lens_q, lens_kv, starts_q, starts_kv, causal, window, chunk, scale):
    """Row-by-row, head-by-head float64 attention."""
    total_q, h_q, d = q.shape
    h_kv = k.shape[1]
    g = h_q // h_kv
    out = torch.zeros(total_q, h_q, d, dtype=F64)
    lse = torch.full((h_q, total_q), NEG_INF, dtype=F64)
    q, k, v = q.double(), k.double(), v.double()
    for s in range(len(lens_q)):
        sq, skv = lens_q[s], lens_kv[s]
        for i in range(sq):
            keys = [j for j in range(skv) if naive_allowed(i, j, sq, skv, causal, window, chunk)]
            if not keys:
                continue
            row = starts_q[s] + i
            kidx = torch.tensor([starts_kv[s] + j for j in keys])
            for h in range(h_q):
                kh = h // g
                sc = (k[kidx, kh, :] @ q[row, h, :]) * scale
                lse[h, row] = torch.logsumexp(sc, 0)
                out[row, h] = torch.softmax(sc, 0) @ v[kidx, kh, :]
    return out, lse


def cu(lens):
    c = [0]
    for n in lens:
        c.append(c[-1] + n)
    return torch.tensor(c, dtype=torch.int32)


def rand_thd(gen, total, h, d, dtype=F64):
    return torch.randn(total, h, d, generator=gen, dtype=F64).to(dtype)


# ---------------------------------------------------------------------------
# masks
# ---------------------------------------------------------------------------


def T(rows):
    return torch.tensor(rows, dtype=torch.bool)


def test_mask_hand_written_cases():
    # causal_bottom_right, sq < skv: bottom-right aligned
    assert torch.equal(attention_mask(2, 4, "causal_bottom_right"),
                       T([[1, 1, 1, 0], [1, 1, 1, 1]]))
    # causal_bottom_right, sq > skv: first rows see nothing
    assert torch.equal(attention_mask(4, 2, "causal_bottom_right"),
                       T([[0, 0], [0, 0], [1, 0], [1, 1]]))
    # causal (Transformer Engine's): top-left aligned
    assert torch.equal(attention_mask(2, 4, "causal"), T([[1, 0, 0, 0], [1, 1, 0, 0]]))
    assert torch.equal(attention_mask(4, 2, "causal"), T([[1, 0], [1, 1], [1, 1], [1, 1]]))
    # the window follows the alignment: top-left for causal, (1, 0)
    assert torch.equal(attention_mask(3, 4, "causal", window_size=(1, 0)),
                       T([[1, 0, 0, 0], [1, 1, 0, 0], [0, 1, 1, 0]]))
    assert torch.equal(attention_mask(2, 4, "padding_causal_bottom_right"),
                       attention_mask(2, 4, "causal_bottom_right"))
    # no mask / padding
    assert attention_mask(3, 5, "no_mask").all()
    assert attention_mask(3, 5, "padding").all()
    assert torch.equal(attention_mask(2, 4, "padding_causal"), attention_mask(2, 4, "causal"))
    # window (1, 0): self and one to the left
    assert torch.equal(
        attention_mask(4, 4, "no_mask", window_size=(1, 0)),
        T([[1, 0, 0, 0], [1, 1, 0, 0], [0, 1, 1, 0], [0, 0, 1, 1]]),
    )
    # causal_bottom_right == window (left, 0), bottom-right
    assert torch.equal(
        attention_mask(3, 6, "causal_bottom_right", window_size=(2, -1)),
        attention_mask(3, 6, "no_mask", window_size=(2, 0)),
    )
    # window (0, 1), sq < skv
    assert torch.equal(
        attention_mask(2, 4, "no_mask", window_size=(0, 1)),
        T([[0, 0, 1, 1], [0, 0, 0, 1]]),
    )
    # chunked, chunk 2, causal, equal lengths
    assert torch.equal(
        attention_mask(5, 5, "causal", chunk_size=2),
        T([[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [0, 0, 1, 0, 0], [0, 0, 1, 1, 0], [0, 0, 0, 0, 1]]),
    )
    # chunked, no causal: block diagonal
    assert torch.equal(
        attention_mask(4, 4, "no_mask", chunk_size=2),
        T([[1, 1, 0, 0], [1, 1, 0, 0], [0, 0, 1, 1], [0, 0, 1, 1]]),
    )
    # chunked with sq < skv: queries at positions 3 and 4 (chunks aligned to kv start)
    assert torch.equal(attention_mask(2, 5, "causal_bottom_right", chunk_size=2),
                       T([[0, 0, 1, 1, 0], [0, 0, 0, 0, 1]]))
    # chunked with sq > skv: negative positions see nothing
    assert torch.equal(attention_mask(3, 2, "no_mask", chunk_size=2), T([[0, 0], [1, 1], [1, 1]]))
    # window + chunk: window (1, 0) cut at chunk boundaries (chunk 3)
    assert torch.equal(
        attention_mask(5, 5, "causal", window_size=(1, 0), chunk_size=3),
        T([[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [0, 1, 1, 0, 0], [0, 0, 0, 1, 0], [0, 0, 0, 1, 1]]),
    )
    # empty
    assert attention_mask(0, 3).shape == (0, 3)
    assert attention_mask(3, 0).shape == (3, 0)


@pytest.mark.parametrize("sq,skv", [(1, 1), (3, 7), (7, 3), (6, 6), (1, 9), (9, 1)])
@pytest.mark.parametrize("mask", ["no_mask", "causal", "causal_bottom_right"])
@pytest.mark.parametrize("window", [(-1, -1), (0, 0), (2, 0), (1, 3), (-1, 2), (3, -1)])
@pytest.mark.parametrize("chunk", [None, 1, 2, 3])
def test_mask_matches_naive(sq, skv, mask, window, chunk):
    got = attention_mask(sq, skv, mask, window, chunk)
    assert torch.equal(got, naive_mask(sq, skv, mask, window, chunk))


# ---------------------------------------------------------------------------
# forward vs naive
# ---------------------------------------------------------------------------

CASES = [
    # (mask, window, chunk)
    ("no_mask", (-1, -1), None),
    ("causal", (-1, -1), None),
    ("padding_causal", (-1, -1), None),
    ("no_mask", (1, 0), None),
    ("no_mask", (2, 1), None),
    ("causal", (2, -1), None),
    ("causal", (-1, -1), 2),
    ("no_mask", (-1, -1), 3),
    ("causal", (1, 0), 3),
    ("padding", (0, 2), 2),
]


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("mask,window,chunk", CASES)
@pytest.mark.parametrize("h_q,h_kv", [(2, 2), (4, 2), (3, 1)])
def test_forward_matches_naive(seed, mask, window, chunk, h_q, h_kv):
    gen = torch.Generator().manual_seed(seed)
    lens_q = [3, 0, 5, 1, 4]
    lens_kv = [5, 2, 5, 0, 2]
    d = 4
    q = rand_thd(gen, sum(lens_q), h_q, d)
    k = rand_thd(gen, sum(lens_kv), h_kv, d)
    v = rand_thd(gen, sum(lens_kv), h_kv, d)
    scale = 0.7 if seed else None
    out, lse = reference_attention(
        q, k, v, cu(lens_q), cu(lens_kv), mask, window, chunk, softmax_scale=scale
    )
    causal = mask
    cq, ck = cu(lens_q).tolist(), cu(lens_kv).tolist()
    ref_o, ref_l = naive_attention(
        q, k, v, lens_q, lens_kv, cq[:-1], ck[:-1], causal, window, chunk, scale or 1 / math.sqrt(d)
    )
    assert out.dtype == F64 and lse.dtype == F64
    assert out.shape == q.shape and lse.shape == (h_q, q.shape[0])
    torch.testing.assert_close(out, ref_o, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(lse, ref_l, rtol=1e-10, atol=1e-12)
    assert not torch.isnan(out).any() and not torch.isnan(lse).any()


@pytest.mark.parametrize("mask,window,chunk", [("causal", (3, 0), 4), ("no_mask", (2, 3), 3),
                                               ("no_mask", (0, -1), None), ("causal", (-1, -1), 5)])
def test_padded_windows_chunks_match_naive(mask, window, chunk):
    """Padding between sequences with windows and chunks, cross lengths, vs the naive loops
    reading the padded starts; padding rows stay zero / -inf (and hold NaN: never read)."""
    gen = torch.Generator().manual_seed(5)
    lens_q, lens_kv = [6, 0, 9, 2], [8, 3, 9, 5]
    pad = [1, 3, 0, 2]
    cq_p, ck_p = cu([n + e for n, e in zip(lens_q, pad)]), cu([n + e for n, e in zip(lens_kv, pad)])
    q = rand_thd(gen, int(cq_p[-1]), 4, 4)
    k = rand_thd(gen, int(ck_p[-1]), 2, 4)
    v = rand_thd(gen, int(ck_p[-1]), 2, 4)
    valid_q = torch.zeros(q.shape[0], dtype=torch.bool)
    valid_kv = torch.zeros(k.shape[0], dtype=torch.bool)
    for i, (nq, nk) in enumerate(zip(lens_q, lens_kv)):
        valid_q[int(cq_p[i]): int(cq_p[i]) + nq] = True
        valid_kv[int(ck_p[i]): int(ck_p[i]) + nk] = True
    nan = float("nan")  # poison: padding must never be read
    q[~valid_q], k[~valid_kv], v[~valid_kv] = nan, nan, nan
    out, lse = reference_attention(q, k, v, cu(lens_q), cu(lens_kv), mask, window, chunk,
                                   cu_seqlens_q_padded=cq_p, cu_seqlens_kv_padded=ck_p)
    ref_o, ref_l = naive_attention(q, k, v, lens_q, lens_kv, cq_p.tolist()[:-1],
                                   ck_p.tolist()[:-1], mask, window, chunk, 0.5)
    torch.testing.assert_close(out, ref_o, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(lse, ref_l, rtol=1e-10, atol=1e-12)
    assert bool((out[~valid_q] == 0).all()) and bool((lse[:, ~valid_q] == NEG_INF).all())


# ---------------------------------------------------------------------------
# forward and backward vs SDPA (float64)
# ---------------------------------------------------------------------------


def sdpa_thd(q, k, v, lens, causal, scale=None):
    """Per-sequence SDPA with equal q/kv lengths (top-left == bottom-right)."""
    g = q.shape[1] // k.shape[1]
    outs, lses = [], []
    s = 0
    for n in lens:
        qs = q[s : s + n].transpose(0, 1).unsqueeze(0)
        ks = k[s : s + n].repeat_interleave(g, dim=1).transpose(0, 1).unsqueeze(0)
        vs = v[s : s + n].repeat_interleave(g, dim=1).transpose(0, 1).unsqueeze(0)
        outs.append(F.scaled_dot_product_attention(qs, ks, vs, is_causal=causal, scale=scale)[0].transpose(0, 1))
        _, l = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            qs.detach(), ks.detach(), vs.detach(), 0.0, causal, scale=scale
        )
        lses.append(l[0])
        s += n
    return torch.cat(outs), torch.cat(lses, dim=1)


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("h_q,h_kv", [(4, 4), (4, 1)])
def test_forward_backward_vs_sdpa(seed, causal, h_q, h_kv):
    gen = torch.Generator().manual_seed(100 + seed)
    lens = [7, 1, 12, 4]
    d = 16
    total = sum(lens)
    q = rand_thd(gen, total, h_q, d).requires_grad_()
    k = rand_thd(gen, total, h_kv, d).requires_grad_()
    v = rand_thd(gen, total, h_kv, d).requires_grad_()
    c = cu(lens)
    out, lse = reference_attention(q, k, v, c, c, "causal" if causal else "no_mask")
    ref_out, ref_lse = sdpa_thd(q, k, v, lens, causal)
    torch.testing.assert_close(out, ref_out, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(lse, ref_lse, rtol=1e-10, atol=1e-12)

    do = torch.randn(out.shape, generator=gen, dtype=F64)
    grads = torch.autograd.grad(out, (q, k, v), do)
    ref_grads = torch.autograd.grad(ref_out, (q, k, v), do)
    for g_, r_ in zip(grads, ref_grads):
        assert torch.isfinite(g_).all()
        torch.testing.assert_close(g_, r_, rtol=1e-9, atol=1e-11)


def test_lse_gradient_matches_autograd_logsumexp():
    gen = torch.Generator().manual_seed(5)
    q = rand_thd(gen, 6, 2, 8).requires_grad_()
    k = rand_thd(gen, 6, 2, 8).requires_grad_()
    v = rand_thd(gen, 6, 2, 8)
    c = cu([6])
    _, lse = reference_attention(q, k, v, c, c, "no_mask")
    sc = torch.einsum("ihd,jhd->hij", q, k) / math.sqrt(8)
    ref = torch.logsumexp(sc, -1)
    torch.testing.assert_close(lse, ref)
    w = torch.randn(lse.shape, generator=gen, dtype=F64)
    g1 = torch.autograd.grad((lse * w).sum(), (q, k))
    g2 = torch.autograd.grad((ref * w).sum(), (q, k))
    for a, b in zip(g1, g2):
        torch.testing.assert_close(a, b)


# ---------------------------------------------------------------------------
# padding, GQA, masked rows, dtypes, strides
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("mask,window,chunk", [("causal", (-1, -1), None), ("no_mask", (2, 1), 2)])
def test_padded_layout_matches_unpadded(seed, mask, window, chunk):
    gen = torch.Generator().manual_seed(seed)
    lens_q = [3, 0, 4, 2]
    lens_kv = [4, 3, 4, 0]
    pad_q = [4, 2, 4, 4]
    pad_kv = [6, 4, 4, 2]
    h_q, h_kv, d = 4, 2, 8
    q = rand_thd(gen, sum(lens_q), h_q, d)
    k = rand_thd(gen, sum(lens_kv), h_kv, d)
    v = rand_thd(gen, sum(lens_kv), h_kv, d)
    out, lse = reference_attention(q, k, v, cu(lens_q), cu(lens_kv), mask, window, chunk)

    def scatter(x, lens, pads, fill):
        y = torch.full((sum(pads),) + x.shape[1:], fill, dtype=x.dtype)
        rows = []
        for i, (n, p) in enumerate(zip(lens, pads)):
            rows += list(range(sum(pads[:i]), sum(pads[:i]) + n))
        y[torch.tensor(rows, dtype=torch.long)] = x
        return y, torch.tensor(rows, dtype=torch.long)

    # NaN in the padding: it must never be read
    qp, rq = scatter(q, lens_q, pad_q, float("nan"))
    kp, _ = scatter(k, lens_kv, pad_kv, float("nan"))
    vp, _ = scatter(v, lens_kv, pad_kv, float("nan"))
    qp.requires_grad_()
    kp.requires_grad_()
    vp.requires_grad_()
    out_p, lse_p = reference_attention(
        qp, kp, vp, cu(lens_q), cu(lens_kv), mask, window, chunk,
        cu_seqlens_q_padded=cu(pad_q), cu_seqlens_kv_padded=cu(pad_kv),
    )
    torch.testing.assert_close(out_p[rq], out, rtol=0, atol=0)
    torch.testing.assert_close(lse_p[:, rq], lse, rtol=0, atol=0)
    pad_rows = torch.ones(sum(pad_q), dtype=torch.bool)
    pad_rows[rq] = False
    assert (out_p[pad_rows] == 0).all()
    assert (lse_p[:, pad_rows] == NEG_INF).all()
    # gradients: finite at valid rows, zero at padding rows
    gq, gk, gv = torch.autograd.grad(out_p, (qp, kp, vp), torch.ones_like(out_p))
    _, rkv = scatter(k, lens_kv, pad_kv, 0.0)
    assert torch.isfinite(gq[rq]).all() and torch.isfinite(gk[rkv]).all() and torch.isfinite(gv[rkv]).all()
    assert (gq[pad_rows] == 0).all()
    kv_pad = torch.ones(sum(pad_kv), dtype=torch.bool)
    kv_pad[rkv] = False
    assert (gk[kv_pad] == 0).all() and (gv[kv_pad] == 0).all()


def test_rows_beyond_cu_seqlens_are_zero():
    gen = torch.Generator().manual_seed(3)
    q = rand_thd(gen, 7, 2, 4)
    k = rand_thd(gen, 6, 2, 4)
    out, lse = reference_attention(q, k, k, cu([2, 3]), cu([3, 2]), "no_mask")
    assert (out[5:] == 0).all() and (lse[:, 5:] == NEG_INF).all()


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("h_q,h_kv", [(4, 2), (6, 1), (8, 4)])
def test_gqa_equals_repeated_kv(seed, h_q, h_kv):
    gen = torch.Generator().manual_seed(seed)
    lens_q, lens_kv = [3, 5, 2], [4, 5, 6]
    q = rand_thd(gen, sum(lens_q), h_q, 8)
    k = rand_thd(gen, sum(lens_kv), h_kv, 8)
    v = rand_thd(gen, sum(lens_kv), h_kv, 8)
    g = h_q // h_kv
    a = reference_attention(q, k, v, cu(lens_q), cu(lens_kv), "causal", (3, 0))
    b = reference_attention(
        q, k.repeat_interleave(g, 1), v.repeat_interleave(g, 1), cu(lens_q), cu(lens_kv), "causal", (3, 0)
    )
    torch.testing.assert_close(a[0], b[0], rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(a[1], b[1], rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize(
    "lens_q,lens_kv,mask,window,chunk",
    [
        ([4], [2], "causal", (-1, -1), None),  # sq > skv: first rows see nothing
        ([3], [5], "no_mask", (0, 0), None) ,  # fine, every row sees one key
        ([3], [3], "no_mask", (-1, -1), 2),
        ([5], [2], "padding_causal", (0, 0), 2),
        ([2, 3], [0, 3], "no_mask", (-1, -1), None),  # empty kv sequence
    ],
)
def test_fully_masked_rows(lens_q, lens_kv, mask, window, chunk):
    gen = torch.Generator().manual_seed(0)
    h, d = 2, 4
    q = rand_thd(gen, sum(lens_q), h, d).requires_grad_()
    k = rand_thd(gen, sum(lens_kv), h, d).requires_grad_()
    v = rand_thd(gen, sum(lens_kv), h, d).requires_grad_()
    out, lse = reference_attention(q, k, v, cu(lens_q), cu(lens_kv), mask, window, chunk)
    assert not torch.isnan(out).any() and not torch.isnan(lse).any()
    # which rows have no key at all
    empty = []
    for sq, skv in zip(lens_q, lens_kv):
        m = naive_mask(sq, skv, mask, window, chunk)
        empty += (~m.any(dim=1)).tolist() if skv else [True] * sq
    empty = torch.tensor(empty)
    assert (out[empty] == 0).all()
    assert (lse[:, empty] == NEG_INF).all()
    assert torch.isfinite(lse[:, ~empty]).all()
    for t in (out, lse):
        w = torch.randn(t.shape, generator=gen, dtype=F64)
        loss = (torch.where(torch.isfinite(t), t, torch.zeros_like(t)) * w).sum()
        grads = torch.autograd.grad(loss, (q, k, v), allow_unused=True, retain_graph=True)
        for g_ in grads:
            assert g_ is None or torch.isfinite(g_).all()


def test_all_empty_and_zero_batch():
    q = torch.randn(3, 2, 4, dtype=F64)
    k = torch.randn(0, 2, 4, dtype=F64)
    out, lse = reference_attention(q, k, k, cu([3]), cu([0]))
    assert (out == 0).all() and (lse == NEG_INF).all()
    out, lse = reference_attention(q[:0], k, k, cu([]), cu([]))
    assert out.shape == (0, 2, 4) and lse.shape == (2, 0)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_dtypes(dtype):
    gen = torch.Generator().manual_seed(0)
    lens = [5, 3]
    q = rand_thd(gen, 8, 2, 16, dtype)
    k = rand_thd(gen, 8, 2, 16, dtype)
    v = rand_thd(gen, 8, 2, 16, dtype)
    o64, l64 = reference_attention(q, k, v, cu(lens), cu(lens))
    assert o64.dtype == dtype and l64.dtype == F64
    o32, l32 = reference_attention(q, k, v, cu(lens), cu(lens), compute_dtype=torch.float32)
    assert o32.dtype == dtype and l32.dtype == torch.float32
    torch.testing.assert_close(o32.float(), o64.float(), rtol=1e-2, atol=1e-2)
    torch.testing.assert_close(l32, l64.float(), rtol=1e-5, atol=1e-5)


def test_strided_inputs_from_fused_qkv():
    gen = torch.Generator().manual_seed(0)
    lens = [4, 6]
    qkv = torch.randn(10, 3, 2, 8, generator=gen, dtype=F64)  # [t, 3, h, d]
    q, k, v = qkv.unbind(1)
    assert not q.is_contiguous()
    a = reference_attention(q, k, v, cu(lens), cu(lens), "causal")
    b = reference_attention(q.contiguous(), k.contiguous(), v.contiguous(), cu(lens), cu(lens), "causal")
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


# ---------------------------------------------------------------------------
# validation
# ---------------------------------------------------------------------------


def _args():
    q = torch.randn(6, 4, 8)
    k = torch.randn(6, 2, 8)
    c = cu([2, 4])
    return dict(q=q, k=k, v=k.clone(), cu_seqlens_q=c, cu_seqlens_kv=c.clone())


@pytest.mark.parametrize(
    "change,match",
    [
        (dict(q=torch.randn(6, 32)), "q must have rank 3"),
        (dict(k=torch.randn(1, 6, 2, 8)), "k must have rank 3"),
        (dict(k=torch.randn(6, 3, 8), v=torch.randn(6, 3, 8)), "multiple of h_kv"),
        (dict(k=torch.randn(6, 2, 4), v=torch.randn(6, 2, 4)), "head dims"),
        (dict(v=torch.randn(6, 2, 4)), "k and v must have the same shape"),
        (dict(cu_seqlens_q=torch.tensor([0, 2, 6])), "cu_seqlens_q must have dtype torch.int32"),
        (dict(cu_seqlens_kv=torch.tensor([[0, 2, 6]], dtype=torch.int32)), "cu_seqlens_kv must be 1-D"),
        (dict(cu_seqlens_kv=cu([6])), "same batch size"),
        (dict(cu_seqlens_q=cu([2, 5])), "cu_seqlens_q spans"),
        (dict(cu_seqlens_q=torch.tensor([0, 3, 2], dtype=torch.int32)), "non-decreasing"),
        (dict(window_size=(-2, 0)), "window_size"),
        (dict(window_size=(1, 2, 3)), "window_size"),
        (dict(window_size=(1.0, 0)), "window_size"),
        (dict(chunk_size=0), "chunk_size"),
        (dict(chunk_size=-3), "chunk_size"),
        (dict(attn_mask_type="top_left_causal"), "attn_mask_type"),
        (dict(cu_seqlens_q_padded=torch.tensor([0, 3, 7])), "cu_seqlens_q_padded must have dtype"),
        (dict(cu_seqlens_kv_padded=cu([3])), "cu_seqlens_kv_padded must have b\\+1"),
        (dict(cu_seqlens_q_padded=cu([1, 5])), "cu_seqlens_q_padded: sequence 0"),
        (dict(cu_seqlens_kv_padded=cu([3, 5])), "cu_seqlens_kv_padded ends at 8"),
    ],
)
def test_validation_errors(change, match):
    args = _args()
    args.update(change)
    with pytest.raises(ValueError, match=match):
        reference_attention(**args)


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(attn_mask_type="bogus"), "attn_mask_type"),
        (dict(window_size=(0, -5)), "window_size"),
        (dict(chunk_size=0), "chunk_size"),
    ],
)
def test_attention_mask_validation(kwargs, match):
    with pytest.raises(ValueError, match=match):
        attention_mask(3, 3, **kwargs)


def test_small_seq_validation():
    q = torch.randn(3, 4, 8)
    k = torch.randn(3, 5, 2, 8)
    n = torch.tensor([1, 2, 3])
    with pytest.raises(ValueError, match="q must have rank 3"):
        reference_small_seq(q[None], k, k, n)
    with pytest.raises(ValueError, match="k must have rank 4"):
        reference_small_seq(q, k[0], k, n)
    with pytest.raises(ValueError, match="multiple of h_kv"):
        reference_small_seq(q, k[:, :, :1].expand(3, 5, 3, 8), k[:, :, :1].expand(3, 5, 3, 8), n)
    with pytest.raises(ValueError, match="head dims"):
        reference_small_seq(q, k[..., :4], k[..., :4], n)
    with pytest.raises(ValueError, match="seqlens_kv"):
        reference_small_seq(q, k, k, n[:2])
    with pytest.raises(ValueError, match="integer dtype"):
        reference_small_seq(q, k, k, n.float())


# ---------------------------------------------------------------------------
# small-seq reference
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("h_q,h_kv", [(4, 4), (4, 2), (2, 1)])
@pytest.mark.parametrize("dtype", [F64, torch.bfloat16])
def test_small_seq_matches_reference_attention(seed, h_q, h_kv, dtype):
    gen = torch.Generator().manual_seed(seed)
    s_max, d = 16, 8
    lens = [0, 16, 1, 5, 16, 0, 3, 11]
    b = len(lens)
    q = torch.randn(b, h_q, d, generator=gen, dtype=F64).to(dtype)
    k = torch.randn(b, s_max, h_kv, d, generator=gen, dtype=F64).to(dtype)
    v = torch.randn(b, s_max, h_kv, d, generator=gen, dtype=F64).to(dtype)
    # junk beyond each length must be ignored
    for i, n in enumerate(lens):
        k[i, n:] = 1e4
        v[i, n:] = float("nan")
    seqlens = torch.tensor(lens, dtype=torch.int32)
    scale = 0.3 if seed == 2 else None
    out, lse, probs = reference_small_seq(q, k, v, seqlens, softmax_scale=scale)
    assert out.dtype == dtype and out.shape == (b, h_q, d)
    assert lse.dtype == torch.float32 and lse.shape == (h_q, b)
    assert probs.dtype == torch.float32 and probs.shape == (b, h_q, s_max)

    # THD form: packed valid keys, one query per segment
    kp = torch.cat([k[i, :n] for i, n in enumerate(lens)])
    vp = torch.cat([v[i, :n] for i, n in enumerate(lens)])
    ref_o, ref_l = reference_attention(
        q, kp, vp, cu([1] * b), cu(lens), "no_mask", softmax_scale=scale
    )
    tol = 1e-12 if dtype == F64 else 1e-2
    torch.testing.assert_close(out, ref_o, rtol=tol, atol=tol)
    torch.testing.assert_close(lse, ref_l.float())
    empty = torch.tensor(lens) == 0
    assert (out[empty] == 0).all() and (lse[:, empty] == NEG_INF).all()
    assert not torch.isnan(out).any()
    # probs: softmax over the valid keys, zero beyond
    beyond = torch.arange(s_max)[None, :] >= torch.tensor(lens)[:, None]
    assert (probs.permute(0, 2, 1)[beyond] == 0).all()
    sums = probs.sum(-1)
    torch.testing.assert_close(sums[~empty], torch.ones_like(sums[~empty]))
    sc = torch.einsum("bhd,bshd->bhs", q.double(), k.double().repeat_interleave(h_q // h_kv, 2))
    sc = sc * (scale or 1 / math.sqrt(d))
    p_ref = torch.exp(sc - ref_l.t().unsqueeze(-1)).masked_fill(beyond[:, None, :], 0)
    torch.testing.assert_close(probs, p_ref.float())


def test_small_seq_gradients_match_reference_attention():
    gen = torch.Generator().manual_seed(7)
    lens = [2, 0, 16, 7]
    b, s_max, h_q, h_kv, d = 4, 16, 4, 2, 8
    q = torch.randn(b, h_q, d, generator=gen, dtype=F64, requires_grad=True)
    k = torch.randn(b, s_max, h_kv, d, generator=gen, dtype=F64, requires_grad=True)
    v = torch.randn(b, s_max, h_kv, d, generator=gen, dtype=F64, requires_grad=True)
    out, _, _ = reference_small_seq(q, k, v, torch.tensor(lens))
    do = torch.randn(out.shape, generator=gen, dtype=F64)
    gq, gk, gv = torch.autograd.grad(out, (q, k, v), do)
    idx = torch.cat([torch.arange(n) + i * s_max for i, n in enumerate(lens)])
    kp = k.reshape(b * s_max, h_kv, d)[idx]
    vp = v.reshape(b * s_max, h_kv, d)[idx]
    ref_o, _ = reference_attention(q, kp, vp, cu([1] * b), cu(lens), "no_mask")
    rq, rk, rv = torch.autograd.grad(ref_o, (q, k, v), do)
    for a, r in ((gq, rq), (gk, rk), (gv, rv)):
        assert torch.isfinite(a).all()
        torch.testing.assert_close(a, r, rtol=1e-10, atol=1e-12)


def test_small_seq_large_batch_vectorised_and_invalid_lengths():
    gen = torch.Generator().manual_seed(0)
    b, s_max, h, d = 50_000, 4, 1, 2
    q = torch.randn(b, h, d, generator=gen)
    k = torch.randn(b, s_max, h, d, generator=gen)
    lens = torch.randint(0, s_max + 1, (b,), generator=gen)
    lens[:3] = torch.tensor([-1, s_max + 1, 0])
    out, lse, probs = reference_small_seq(q, k, k, lens)
    # out-of-contract lengths -> NaN, never a silent answer
    assert torch.isnan(out[:2]).all() and torch.isnan(lse[:, :2]).all() and torch.isnan(probs[:2]).all()
    assert (out[2] == 0).all() and (lse[:, 2] == NEG_INF).all() and (probs[2] == 0).all()
    assert not torch.isnan(out[2:]).any() and not torch.isnan(lse[:, 2:]).any()
