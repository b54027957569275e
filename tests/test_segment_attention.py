"""The batched float64 math of the tiled oracles (tests/helpers/segment_attention.py) against
the plainest statement of it: each segment alone through torch's softmax and autograd, written
into the outputs in segment order (a later segment's rows standing where two share rows)."""

import math
import os
import time

import pytest
import torch

from helpers import segment_attention as SA

# Fresh inputs on every run; a failure prints the seed (re-run with ROCM_ATTN_TEST_SEED).
BASE_SEED = int(os.environ.get("ROCM_ATTN_TEST_SEED", str(time.time_ns() % (2**31 - 1))))


def per_segment(q, k, v, segments, scale, max_kv, dout, dlse):
    rows, h_q, d = q.shape
    group = h_q // k.shape[1]
    qf, kf, vf, gf = (t.double() for t in (q, k, v, dout))
    out = torch.zeros(rows, h_q, d, dtype=torch.float64)
    lse = torch.full((h_q, rows), -math.inf, dtype=torch.float64)
    probs = torch.zeros(rows, h_q, max_kv, dtype=torch.float64)
    dq, dk, dv = torch.zeros_like(qf), torch.zeros_like(kf), torch.zeros_like(vf)
    for seg in segments:
        qr, kr = slice(seg.q0, seg.q0 + seg.nq), slice(seg.k0, seg.k0 + seg.nk)
        qs, ks, vs = (t[r].clone().requires_grad_(True)
                      for t, r in ((qf, qr), (kf, kr), (vf, kr)))
        s = torch.einsum("qhd,khd->hqk", qs, ks.repeat_interleave(group, 1)) * scale
        ls = torch.logsumexp(s, dim=-1)
        p = torch.softmax(s, dim=-1)
        o = torch.einsum("hqk,khd->qhd", p, vs.repeat_interleave(group, 1))
        loss = (o * gf[qr]).sum() + (ls * dlse.double()[:, qr]).sum()
        gq, gk, gv = torch.autograd.grad(loss, (qs, ks, vs))
        probs[qr] = 0  # a row's probs are its last segment's, zeros past that one's keys
        out[qr], lse[:, qr] = o.detach(), ls.detach()
        probs[qr, :, :seg.nk] = p.detach().permute(1, 0, 2)
        dq[qr], dk[kr], dv[kr] = gq, gk, gv
    return dict(out=out, lse=lse, probs=probs, dq=dq, dk=dk, dv=dv)


@pytest.mark.parametrize("h_q,h_kv", [(4, 4), (8, 2), (6, 1)])
@pytest.mark.parametrize("overlap", [False, True], ids=["disjoint", "shared-rows"])
def test_batched_matches_per_segment(h_q, h_kv, overlap):
    """Fresh random segments of 1..40 queries over 1..70 keys (some far larger than the rest,
    so batches pad), GQA groups 1 / 4 / 6, dlse, a NaN dO row (NaN on its own segment only),
    a small budget (many batches); `shared-rows` lets segments overlap in q and k/v rows."""
    seed = (BASE_SEED + 7919 * h_q + 31 * h_kv + overlap) % (2**31 - 1)
    ctx = f"seed {seed} (ROCM_ATTN_TEST_SEED={BASE_SEED})"
    gen = torch.Generator().manual_seed(seed)
    n, d, max_kv = 23, 16, 70
    nq = torch.randint(1, 12, (n,), generator=gen).tolist()
    nk = torch.randint(1, 20, (n,), generator=gen).tolist()
    nq[3], nk[5], nq[7], nk[7] = 40, max_kv, 33, 64
    segments, q0, k0 = [], 0, 0
    for i in range(n):
        segments.append(SA.Segment(i, q0, nq[i], k0, nk[i]))
        back_q = int(torch.randint(0, nq[i] + 1, (), generator=gen)) if overlap else 0
        back_k = int(torch.randint(0, nk[i] + 1, (), generator=gen)) if overlap else 0
        q0, k0 = q0 + nq[i] - back_q, k0 + nk[i] - back_k
    # unowned rows at the end: out 0, lse -inf, grads 0
    rows = max(s.q0 + s.nq for s in segments) + 3
    kv_rows = max(s.k0 + s.nk for s in segments) + 2
    q = torch.randn(rows, h_q, d, generator=gen)
    k = torch.randn(kv_rows, h_kv, d, generator=gen)
    v = torch.randn(kv_rows, h_kv, d, generator=gen)
    dout = torch.randn(rows, h_q, d, generator=gen)
    dlse = torch.randn(h_q, rows, generator=gen)
    nan_seg = segments[10]
    dout[nan_seg.q0 + nan_seg.nq - 1, 0, 0] = math.nan
    want = per_segment(q, k, v, segments, 0.3, max_kv, dout, dlse)
    old = dict(SA.BUDGET)
    SA.BUDGET["cpu"] = 4 * h_q * 20 * 30
    try:
        got = SA.attend(q, k, v, segments, 0.3, max_kv=max_kv, dout=dout, dlse=dlse)
    finally:
        SA.BUDGET.update(old)
    if not overlap:  # (a later segment may own the row where segments share rows)
        assert torch.isnan(got["dk"][nan_seg.k0, 0]).all(), f"NaN dO row not in its dk ({ctx})"
        assert torch.isfinite(got["dk"][nan_seg.k0 + nan_seg.nk]).all(), ctx
    for name, w in want.items():
        g = got[name]
        assert g.shape == w.shape and g.dtype == torch.float64, f"{name} ({ctx})"
        assert torch.equal(torch.isnan(g), torch.isnan(w)), f"{name}: NaN elements differ ({ctx})"
        torch.testing.assert_close(g, w, rtol=1e-10, atol=1e-12, equal_nan=True,
                                   msg=f"{name} ({ctx})")
