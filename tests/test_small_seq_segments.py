"""fused_attn_small_seq beyond one query over 16 keys, on the torch path (no GPU needed).

Many queries per segment (1, 2, 17, 512; empty segments; GQA), long histories (17..1000 keys),
int64 offsets, BSHD with s_q > 1, the per-segment contract of the tiled kernels (bad segments
NaN and counted, padding rows 0 / -inf, other segments' rows never reach a segment's results or
gradients), the CPU inference path (SDPA on cache-sized chunks) and the training path, both
against a float64 oracle written out segment by segment here; torch.compile; argument errors;
the glue of the tiled ops (fakes, autograd) on emulated ops; the varlen route for long
histories.
"""

from __future__ import annotations

import math
import os
import sys
from typing import List

import pytest
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from rocm_attn import check_errors, fused_attn_small_seq  # noqa: E402
from rocm_attn import SmallSeqContractError  # noqa: E402
from rocm_attn import small_seq as small_seq_mod  # noqa: E402
from rocm_attn.errors import read_errors  # noqa: E402
import test_small_seq  # noqa: E402
from test_small_seq import TOL_FP32, Rng, assert_rel, out_tol, seeds  # noqa: E402

_one_thread = test_small_seq._one_thread
_error_counter = test_small_seq._error_counter
allow_contract_errors = test_small_seq.allow_contract_errors

THD = "thd_thd_thd"
BSHD = "bshd_bshd_bshd"
NAN = float("nan")


# --------------------------------------------------------------------------------------------
# float64 oracle, one segment at a time
# --------------------------------------------------------------------------------------------


def oracle(q, k, v, segs, total_q, scale=None):
    """out [total_q, h_q, d] (float64, 0 at rows of no segment) and lse [h_q, total_q] (-inf
    there) of the valid segments ``segs`` = [(q0, nq, k0, nkv)], differentiable wrt q, k, v."""
    h_q, d = q.shape[-2], q.shape[-1]
    group = h_q // k.shape[-2]
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    out = q.new_zeros((total_q, h_q, d))
    lse = q.new_full((total_q, h_q), float("-inf"))
    rows_out, vals_out, rows_lse, vals_lse = [], [], [], []
    for q0, nq, k0, nkv in segs:
        if nq == 0:
            continue
        qi = q[q0:q0 + nq]
        if nkv == 0:
            rows_out.append(torch.arange(q0, q0 + nq))
            vals_out.append(q.new_zeros((nq, h_q, d)))
            continue
        ki = k[k0:k0 + nkv].repeat_interleave(group, dim=1)
        vi = v[k0:k0 + nkv].repeat_interleave(group, dim=1)
        s = torch.einsum("qhd,khd->hqk", qi, ki) * scale
        li = torch.logsumexp(s, -1)  # [h, nq]
        o = torch.einsum("hqk,khd->qhd", torch.softmax(s, -1), vi)
        rows_out.append(torch.arange(q0, q0 + nq))
        vals_out.append(o)
        rows_lse.append(torch.arange(q0, q0 + nq))
        vals_lse.append(li)
    if rows_out:
        out = out.index_put((torch.cat(rows_out),), torch.cat(vals_out))
    if rows_lse:
        lse = lse.index_put((torch.cat(rows_lse),), torch.cat(vals_lse, 1).t())
    return out, lse.t()


def lens_to_cu(lens: List[int], start: int = 0, dtype=torch.int32) -> torch.Tensor:
    cu = [start]
    for n in lens:
        cu.append(cu[-1] + n)
    return torch.tensor(cu, dtype=dtype)


class Call:
    """A THD call: query counts nq, key counts nkv, rows of padding before/after."""

    def __init__(self, rng, nq, nkv, h_q, h_kv, d, dtype, *, max_q=None, max_kv=None,
                 q_lead=0, q_tail=0, q_dtype=torch.int32, kv_dtype=torch.int32):
        self.rng = rng
        self.nq, self.nkv = list(nq), list(nkv)
        self.max_q = max(max(nq), 1) if max_q is None else max_q
        self.max_kv = max(max(nkv), 1) if max_kv is None else max_kv
        self.total_q = q_lead + sum(nq) + q_tail
        self.total_kv = sum(nkv)
        self.q = rng.randn(self.total_q, h_q, d, dtype=dtype)
        self.k = rng.randn(self.total_kv, h_kv, d, dtype=dtype)
        self.v = rng.randn(self.total_kv, h_kv, d, dtype=dtype)
        self.cu_q = lens_to_cu(nq, q_lead, q_dtype)
        self.cu_kv = lens_to_cu(nkv, 0, kv_dtype)
        self.dout = rng.randn(self.total_q, h_q, d, dtype=dtype)
        self.segs = [(int(self.cu_q[i]), nq[i], int(self.cu_kv[i]), nkv[i])
                     for i in range(len(nq))]

    def run(self, grads: bool, **kw):
        leaves = [t.detach().clone().requires_grad_(grads) for t in (self.q, self.k, self.v)]
        kw.setdefault("return_lse", True)
        with torch.set_grad_enabled(grads):
            out, lse = fused_attn_small_seq(*leaves, self.cu_q, self.cu_kv, self.max_q,
                                            self.max_kv, **kw)
        g = torch.autograd.grad(out, leaves, self.dout) if grads else None
        return out, lse, g

    def reference(self, segs=None):
        leaves = [t.detach().double().requires_grad_() for t in (self.q, self.k, self.v)]
        out, lse = oracle(*leaves, self.segs if segs is None else segs, self.total_q)
        g = torch.autograd.grad(out, leaves, self.dout.double(), allow_unused=True,
                                materialize_grads=True)
        return out, lse, g

    def __str__(self):
        return (f"nq={self.nq[:8]}.. nkv={self.nkv[:8]}.. q{tuple(self.q.shape)} "
                f"k{tuple(self.k.shape)} {self.q.dtype} max_q={self.max_q} "
                f"max_kv={self.max_kv} {self.rng}")


def assert_lse_equal_pattern(lse, ref, ctx):
    assert lse.dtype == torch.float32 and lse.shape == ref.shape, ctx
    assert not torch.isnan(lse).any(), f"lse has NaN ({ctx})"
    assert torch.equal(torch.isneginf(lse), torch.isneginf(ref)), f"-inf pattern ({ctx})"
    fin = torch.isfinite(ref)
    if fin.any():
        assert_rel("lse", lse[fin], ref[fin], TOL_FP32, ctx)


def check(call: Call, grads: bool, **kw):
    out, lse, g = call.run(grads, **kw)
    rout, rlse, rg = call.reference()
    ctx = f"{call} grads={grads} {kw}"
    assert out.shape == call.q.shape and out.dtype == call.q.dtype, ctx
    assert_rel("out", out, rout, out_tol(call.q.dtype), ctx)
    assert_lse_equal_pattern(lse, rlse, ctx)
    if grads:
        for name, x, r in zip(("dq", "dk", "dv"), g, rg):
            assert_rel(name, x, r, out_tol(call.q.dtype), ctx)
    return out, lse, g


GQA = [pytest.param(4, 4, id="mha"), pytest.param(4, 2, id="gqa2"),
       pytest.param(8, 1, id="mqa")]


# --------------------------------------------------------------------------------------------
# many queries per segment, long histories, int64 offsets
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", seeds(1))
@pytest.mark.parametrize("grads", [False, True], ids=["infer", "train"])
@pytest.mark.parametrize("h_q,h_kv", GQA)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_many_queries_per_segment(dtype, h_q, h_kv, grads, seed):
    """Segments of 1, 2, 17 and 512 queries, and segments without queries or without keys."""
    rng = Rng(seed, f"mq{dtype}{h_q}{h_kv}{grads}")
    nq = [1, 2, 17, 512, 0, 3, 5]
    nkv = [5, 16, 0, 9, 4, 1, 12]
    check(Call(rng, nq, nkv, h_q, h_kv, 64, dtype), grads)


@pytest.mark.parametrize("seed", seeds(1))
@pytest.mark.parametrize("grads", [False, True], ids=["infer", "train"])
@pytest.mark.parametrize("max_kv", [17, 64, 256, 1000])
def test_long_histories(max_kv, grads, seed):
    """Histories past 16 keys, one query (int32 offsets: the tiled contract) and several."""
    rng = Rng(seed, f"long{max_kv}{grads}")
    r = torch.randint(0, max_kv + 1, (6,), generator=rng.gen).tolist()
    nkv = [max_kv, 0] + r[:4]
    check(Call(rng, [1] * 6, nkv, 4, 2, 32, torch.float32), grads)
    check(Call(rng, [3, 1, 0, 7, 2, 4], nkv, 4, 2, 32, torch.float32), grads)


@pytest.mark.parametrize("seed", seeds(1))
@pytest.mark.parametrize("grads", [False, True], ids=["infer", "train"])
@pytest.mark.parametrize("q_dtype,kv_dtype", [(torch.int64, torch.int64),
                                              (torch.int32, torch.int64),
                                              (torch.int64, torch.int32)],
                         ids=["both64", "kv64", "q64"])
def test_int64_offsets(q_dtype, kv_dtype, grads, seed):
    """int64 offsets (each independently), also with one query over <= 16 keys: rows of lse
    by query row, which for cu_seqlens_q = arange equals today's layout."""
    rng = Rng(seed, f"i64{q_dtype}{kv_dtype}{grads}")
    nkv = torch.randint(0, 17, (9,), generator=rng.gen).tolist()
    one = Call(rng, [1] * 9, nkv, 4, 2, 64, torch.float32, q_dtype=q_dtype, kv_dtype=kv_dtype,
               max_kv=16)
    out, lse, g = check(one, grads)
    # the same call with int32 offsets (today's op) agrees
    one32 = Call(rng, [1] * 9, nkv, 4, 2, 64, torch.float32, max_kv=16)
    one32.q, one32.k, one32.v, one32.dout = one.q, one.k, one.v, one.dout
    out32, lse32, g32 = one32.run(grads)
    torch.testing.assert_close(out, out32, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(lse, lse32, rtol=1e-5, atol=1e-6)
    check(Call(rng, [2, 0, 5, 1], [3, 40, 0, 7], 4, 2, 64, torch.float32, q_dtype=q_dtype,
               kv_dtype=kv_dtype), grads)


@pytest.mark.parametrize("seed", seeds(1))
@pytest.mark.parametrize("grads", [False, True], ids=["infer", "train"])
@pytest.mark.parametrize("offsets", [torch.int32, torch.int64], ids=["i32", "i64"])
def test_bshd_many_queries(offsets, grads, seed):
    """BSHD q [b, s_q, h, d]: every one of the s_q rows attends to the batch's keys; lse rows
    are batch * s_q + j; NaN in padding keys (j >= seqlens_kv) changes nothing."""
    rng = Rng(seed, f"bshd{offsets}{grads}")
    b, s_q, s_kv, h_q, h_kv, d = 5, 7, 40, 4, 2, 64
    lens = [40, 0, 13, 1, 25]
    q = rng.randn(b, s_q, h_q, d)
    k, v = rng.randn(b, s_kv, h_kv, d), rng.randn(b, s_kv, h_kv, d)
    dout = rng.randn(b, s_q, h_q, d)
    pad = torch.arange(s_kv).unsqueeze(0) >= torch.tensor(lens).unsqueeze(1)
    kp, vp = k.clone(), v.clone()
    kp[pad], vp[pad] = NAN, float("inf")
    leaves = [t.clone().requires_grad_(grads) for t in (q, kp, vp)]
    with torch.set_grad_enabled(grads):
        out, lse = fused_attn_small_seq(*leaves, max_seqlen_q=s_q, max_seqlen_kv=64,
                                        qkv_layout=BSHD, return_lse=True,
                                        seqlens_kv=torch.tensor(lens, dtype=offsets))
    # the oracle on the THD form of the same segments
    segs = [(i * s_q, s_q, i * s_kv, lens[i]) for i in range(b)]
    ref_leaves = [t.double().requires_grad_() for t in (q, k, v)]
    rq, rk, rv = (t.reshape((-1,) + tuple(t.shape[2:])) for t in ref_leaves)
    rout, rlse = oracle(rq, rk, rv, segs, b * s_q)
    ctx = str(rng)
    assert out.shape == q.shape and lse.shape == (h_q, b * s_q), ctx
    assert_rel("out", out.reshape(-1, h_q, d), rout, TOL_FP32, ctx)
    assert_lse_equal_pattern(lse, rlse, ctx)
    if grads:
        g = torch.autograd.grad(out, leaves, dout)
        rg = torch.autograd.grad(rout, ref_leaves, dout.double().reshape(-1, h_q, d))
        for name, x, r in zip(("dq", "dk", "dv"), g, rg):
            assert_rel(name, x, r, TOL_FP32, ctx)
        assert (g[1][pad] == 0).all() and (g[2][pad] == 0).all(), ctx


# --------------------------------------------------------------------------------------------
# the tiled contract: padding rows, bad segments, NaN isolation
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("grads", [False, True], ids=["infer", "train"])
def test_padding_rows(grads):
    """q rows before cu_seqlens_q[0] and from cu_seqlens_q[b] on: out 0, lse -inf, dq 0."""
    rng = Rng(0, f"padrows{grads}")
    call = Call(rng, [3, 0, 4, 2], [5, 2, 0, 7], 4, 2, 64, torch.float32, q_lead=3, q_tail=5)
    out, lse, g = check(call, grads)
    for rows in (slice(0, 3), slice(call.total_q - 5, None)):
        assert (out[rows] == 0).all() and torch.isneginf(lse[:, rows]).all()
        if grads:
            assert (g[0][rows] == 0).all()


def _garbage_call(rng, dtype=torch.float32):
    """Valid segments around bad ones: too many queries, keys past the end, decreasing
    offsets, a huge int64 offset."""
    nq, nkv = [2, 3, 1, 4, 2, 3, 2], [3, 5, 2, 6, 1, 4, 2]
    call = Call(rng, nq, nkv, 4, 2, 32, dtype, max_q=3, max_kv=6, q_dtype=torch.int64,
                kv_dtype=torch.int64, q_tail=2)
    cu_q, cu_kv = call.cu_q.clone(), call.cu_kv.clone()
    # segment 3 has 4 queries > max_q = 3 (its first 3 rows are NaN); cu_kv[2] past the end
    # breaks segments 1 and 2; cu_kv[5] = cu_kv[4] - 1 breaks segment 4 (decreasing) and gives
    # segment 5 six keys, one of them segment 3's last (valid: max_kv = 6)
    cu_kv[2] = call.total_kv + 7
    cu_kv[5] = cu_kv[4] - 1
    call.cu_q, call.cu_kv = cu_q, cu_kv
    call.nkv[5] = int(cu_kv[6] - cu_kv[5])
    return call, [1, 2, 3, 4]


@pytest.mark.parametrize("grads", [False, True], ids=["infer", "train"])
def test_bad_segments_nan_counted_others_unaffected(grads, allow_contract_errors):
    rng = Rng(0, f"garbage_tiled{grads}")
    call, bad = _garbage_call(rng)
    out, lse, g = call.run(grads)
    ctx = str(call)
    assert read_errors() == (len(bad), bad[0]), ctx
    q0 = call.cu_q.tolist()
    valid = [i for i in range(len(call.nq)) if i not in bad]
    segs = [(q0[i], call.nq[i], int(call.cu_kv[i]), call.nkv[i]) for i in valid]
    rout, rlse, rg = call.reference(segs)
    for i in bad:  # NaN at rows max(q0,0) .. min(q1, q0 + max_q, total_q) - 1
        rows = slice(q0[i], min(q0[i + 1], q0[i] + call.max_q, call.total_q))
        assert torch.isnan(out[rows]).all() and torch.isnan(lse[:, rows]).all(), (i, ctx)
    row_of_bad = torch.zeros(call.total_q, dtype=torch.bool)
    for i in bad:
        row_of_bad[q0[i]:q0[i + 1]] = True
    good = ~row_of_bad
    assert_rel("out (valid segments)", out[good], rout[good], TOL_FP32, ctx)
    assert_lse_equal_pattern(lse[:, good], rlse[:, good], ctx)
    # the uncovered row of segment 3 (its 4th query, beyond max_q) is NaN too
    assert torch.isnan(out[q0[3] + 3]).all(), ctx
    if grads:
        for name, x, r in zip(("dq", "dk", "dv"), g, rg):
            assert torch.isfinite(x).all(), (name, ctx)
        # the oracle of the valid segments alone: bad segments' rows and keys get nothing
        for name, x, r in zip(("dq", "dk", "dv"), g, rg):
            assert_rel(name, x, r, TOL_FP32, ctx)
    with pytest.raises(SmallSeqContractError, match=r"first bad segment: 1\b"):
        call.run(False, validate="sync")


def test_huge_int64_offsets_flagged(allow_contract_errors):
    """int64 offsets near the ends of the int64 range never overflow into a valid segment."""
    rng = Rng(0, "huge64")
    call = Call(rng, [2, 2, 2], [3, 3, 3], 2, 2, 32, torch.float32, q_dtype=torch.int64,
                kv_dtype=torch.int64)
    big = 2**63 - 1
    call.cu_kv = torch.tensor([0, big, -big - 1, 9], dtype=torch.int64)
    call.cu_q = torch.tensor([0, 2, big - 1, 6], dtype=torch.int64)
    out, lse, _ = call.run(False)
    assert torch.isnan(out).all() and torch.isnan(lse).all()
    assert read_errors() == (3, 0)


@pytest.mark.parametrize("grads", [False, True], ids=["infer", "train"])
def test_other_segments_rows_never_reach_a_segment(grads):
    """NaN/inf in the queries and keys of segment 1 leave segments 0 and 2 (out, lse and
    every gradient) exactly as with clean rows: the padded gathers read other segments'
    rows, which torch.where (training) or clamped gather rows (inference) keep out."""
    rng = Rng(0, f"leak{grads}")
    call = Call(rng, [2, 3, 2], [2, 5, 3], 4, 2, 32, torch.float32, max_q=6, max_kv=9)
    clean = call.run(grads)
    call.q[2:5], call.k[2:7], call.v[2:7] = NAN, float("inf"), NAN
    dirty = call.run(grads)
    for rows, krows in ((slice(0, 2), slice(0, 2)), (slice(5, 7), slice(7, 10))):
        torch.testing.assert_close(dirty[0][rows], clean[0][rows], rtol=0, atol=0)
        torch.testing.assert_close(dirty[1][:, rows], clean[1][:, rows], rtol=0, atol=0)
        if grads:
            torch.testing.assert_close(dirty[2][0][rows], clean[2][0][rows], rtol=0, atol=0)
            for x, y in zip(dirty[2][1:], clean[2][1:]):
                torch.testing.assert_close(x[krows], y[krows], rtol=0, atol=0)


def test_inference_chunks_match_one_pass(monkeypatch):
    """The CPU inference path's chunking (and its views for full chunks) gives the results of
    one pass over all segments (the general path)."""
    import rocm_attn.small_seq_torch as st

    rng = Rng(0, "chunks")
    nq = [4] * 20 + [1, 4, 0, 3] + [4] * 9
    nkv = torch.randint(0, 20, (len(nq),), generator=rng.gen).tolist()
    call = Call(rng, nq, nkv, 4, 2, 32, torch.float32, max_kv=20, q_lead=2, q_tail=1)
    monkeypatch.setattr(st, "CPU_CHUNK_BYTES", 1)
    monkeypatch.setattr(st, "CPU_CHUNK_MIN_SEGMENTS", 3)
    chunked = call.run(False)
    monkeypatch.setattr(st, "_cpu_inference", lambda *a, **k: None)
    whole = call.run(False)
    for x, y in zip(chunked[:2], whole[:2]):
        torch.testing.assert_close(x, y, rtol=1e-5, atol=1e-6)
    check(call, False)
    # fixed-length histories: the chunks are views of k/v
    fixed = Call(rng, [2] * 10, [6] * 10, 4, 2, 32, torch.float32)
    monkeypatch.undo()
    monkeypatch.setattr(st, "CPU_CHUNK_BYTES", 1)
    monkeypatch.setattr(st, "CPU_CHUNK_MIN_SEGMENTS", 4)
    check(fixed, False)


# --------------------------------------------------------------------------------------------
# torch.compile, argument errors
# --------------------------------------------------------------------------------------------


@pytest.mark.skipif(test_small_seq._inductor_available() is not None, reason="no inductor")
@pytest.mark.parametrize("grads", [False, True], ids=["infer", "train"])
def test_torch_compile_fullgraph_many_queries(grads, allow_contract_errors):
    import torch._dynamo

    torch._dynamo.reset()
    rng = Rng(0, f"compile_mq{grads}")
    call = Call(rng, [3, 0, 5, 2], [4, 7, 0, 30], 4, 2, 32, torch.float32, q_lead=1,
                kv_dtype=torch.int64)

    def fn(q, k, v, cu_q, cu_kv):
        return fused_attn_small_seq(q, k, v, cu_q, cu_kv, call.max_q, call.max_kv,
                                    return_lse=True)

    compiled = torch.compile(fn, fullgraph=True)
    leaves = [t.detach().clone().requires_grad_(grads) for t in (call.q, call.k, call.v)]
    with torch.set_grad_enabled(grads):
        out, lse = compiled(*leaves, call.cu_q, call.cu_kv)
    rout, rlse, rg = call.reference()
    assert_rel("out (compiled)", out, rout, TOL_FP32, str(call))
    assert_lse_equal_pattern(lse, rlse, str(call))
    if grads:
        g = torch.autograd.grad(out, leaves, call.dout)
        for name, x, r in zip(("dq", "dk", "dv"), g, rg):
            assert_rel(f"{name} (compiled)", x, r, TOL_FP32, str(call))
    # a bad segment is counted inside the compiled graph too
    bad_kv = call.cu_kv.clone()
    bad_kv[3] = 10**12
    with torch.no_grad():
        out = compiled(*[t.detach() for t in leaves], call.cu_q, bad_kv)[0]
    assert torch.isnan(out[6:8]).all()
    with pytest.raises(SmallSeqContractError, match=r"first bad segment: 2\b"):
        check_errors()


def _thd_args(**change):
    args = dict(q=torch.randn(10, 4, 64), k=torch.randn(12, 2, 64), v=torch.randn(12, 2, 64),
                cu_seqlens_q=torch.tensor([0, 3, 10], dtype=torch.int64),
                cu_seqlens_kv=torch.tensor([0, 5, 12], dtype=torch.int32),
                max_seqlen_q=7, max_seqlen_kv=300)
    args.update(change)
    return args


@pytest.mark.parametrize("change,match", [
    pytest.param(dict(max_seqlen_q=0), "max_seqlen_q", id="max_q_0"),
    pytest.param(dict(max_seqlen_q=3.0), "max_seqlen_q", id="max_q_float"),
    pytest.param(dict(max_seqlen_kv=0), "max_seqlen_kv", id="max_kv_0"),
    pytest.param(dict(cu_seqlens_q=torch.tensor([0, 3, 10], dtype=torch.int16)),
                 "cu_seqlens_q", id="cu_q_int16"),
    pytest.param(dict(cu_seqlens_kv=torch.tensor([0, 5, 9, 12], dtype=torch.int32)),
                 "cu_seqlens_kv", id="cu_kv_len"),
    pytest.param(dict(cu_seqlens_q=torch.tensor([[0, 3, 10]])), "cu_seqlens_q", id="cu_q_2d"),
    pytest.param(dict(cu_seqlens_q=torch.tensor([], dtype=torch.int64)), "cu_seqlens_q",
                 id="cu_q_empty"),
    pytest.param(dict(max_seqlen_q=1), "cu_seqlens_q", id="one_query_needs_b_rows"),
    pytest.param(dict(q=torch.randn(10, 3, 64)), "heads", id="gqa_ratio"),
])
def test_argument_errors(change, match):
    fused_attn_small_seq(**_thd_args())  # the base call is valid
    with pytest.raises(ValueError, match=match):
        fused_attn_small_seq(**_thd_args(**change))


def test_bshd_max_seqlen_q_must_equal_s_q():
    q, k = torch.randn(2, 3, 2, 64), torch.randn(2, 5, 2, 64)
    lens = torch.tensor([5, 2])
    fused_attn_small_seq(q, k, k, max_seqlen_q=3, max_seqlen_kv=5, qkv_layout=BSHD,
                         seqlens_kv=lens)
    with pytest.raises(ValueError, match="max_seqlen_q"):
        fused_attn_small_seq(q, k, k, max_seqlen_q=4, max_seqlen_kv=5, qkv_layout=BSHD,
                             seqlens_kv=lens)


def test_rows_past_int32_rejected():
    """Tensors with 2^31 or more rows are refused on the host (meta tensors: no memory)."""
    meta = dict(device="meta")
    q = torch.empty(2**31, 2, 8, **meta)
    k = torch.empty(4, 2, 8, **meta)
    cu = torch.zeros(3, dtype=torch.int64, **meta)
    with pytest.raises(ValueError, match=r"\bq has 2147483648 rows"):
        fused_attn_small_seq(q, k, k, cu, cu, 2, 4)


def test_backend_kernel_without_tiled_kernels_raises():
    if small_seq_mod.ops.HAS_TILED_OPS and torch.cuda.is_available():
        pytest.skip("this build has the tiled kernels")
    with pytest.raises(ValueError, match="backend='kernel'"):
        fused_attn_small_seq(**_thd_args(), backend="kernel")


# --------------------------------------------------------------------------------------------
# routes: the tiled ops' glue (on emulated ops), the varlen route
# --------------------------------------------------------------------------------------------


def _define_emulated_tiled_ops():
    """rocm_attn::small_seq_tiled_fwd/bwd with CPU impls from the torch path, for a build
    without the extension (the schemas of the C++ ops)."""
    from rocm_attn.small_seq_torch import torch_path

    lib = torch.library.Library("rocm_attn", "FRAGMENT")
    lib.define("small_seq_tiled_fwd(Tensor q, Tensor k, Tensor v, Tensor? cu_seqlens_q, "
               "Tensor? cu_seqlens_kv, Tensor? seqlens_kv, int max_seqlen_q, int max_seqlen_kv, "
               "float softmax_scale, bool return_softmax, int[] plan) -> (Tensor, Tensor, "
               "Tensor)")
    lib.define("small_seq_tiled_bwd(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, "
               "Tensor lse, Tensor? dlse, Tensor? cu_seqlens_q, Tensor? cu_seqlens_kv, "
               "Tensor? seqlens_kv, int max_seqlen_q, int max_seqlen_kv, float softmax_scale, "
               "int[] plan) -> (Tensor, Tensor, Tensor)")

    def fwd(q, k, v, cu_q, cu_kv, seqlens, max_q, max_kv, scale, return_softmax, plan):
        with torch.no_grad():
            out, lse, probs = torch_path(q, k, v, cu_q, cu_kv, seqlens, max_q, max_kv, scale,
                                         q.dim() == 3, False, True, return_softmax)
        return out.contiguous(), lse.contiguous(), probs.contiguous()

    def bwd(dout, q, k, v, out, lse, dlse, cu_q, cu_kv, seqlens, max_q, max_kv, scale, plan):
        leaves = [t.detach().requires_grad_() for t in (q, k, v)]
        with torch.enable_grad():
            o, l, _ = torch_path(*leaves, cu_q, cu_kv, seqlens, max_q, max_kv, scale,
                                 q.dim() == 3, False, True, False)
            outs, grads = [o], [dout]
            if dlse is not None:
                outs.append(l)
                grads.append(dlse)
            return tuple(g.contiguous() for g in torch.autograd.grad(
                outs, leaves, grads, allow_unused=True, materialize_grads=True))

    lib.define("small_seq_tiled_fwd_row_max(Tensor q, Tensor k, Tensor v, Tensor? cu_seqlens_q, "
               "Tensor? cu_seqlens_kv, Tensor? seqlens_kv, int max_seqlen_q, int max_seqlen_kv, "
               "float softmax_scale, bool return_softmax, int[] plan) -> (Tensor, Tensor, "
               "Tensor, Tensor)")

    def fwd_row_max(q, k, v, cu_q, cu_kv, seqlens, max_q, max_kv, scale, return_softmax, plan):
        """THD only: each row's max logit (float64 scores), -inf without keys / on padding."""
        _ROW_MAX_CALLS.append(1)
        out, lse, probs = fwd(q, k, v, cu_q, cu_kv, seqlens, max_q, max_kv, scale,
                              return_softmax, plan)
        g = q.shape[1] // k.shape[1]
        rmax = torch.full((q.shape[1], q.shape[0]), -math.inf, dtype=torch.float64)
        for i in range(cu_q.numel() - 1):
            q0, q1, k0, k1 = int(cu_q[i]), int(cu_q[i + 1]), int(cu_kv[i]), int(cu_kv[i + 1])
            if q1 > q0 and k1 > k0:
                ks = k[k0:k1].double().repeat_interleave(g, dim=1)
                sc = torch.einsum("nhd,mhd->hnm", q[q0:q1].double(), ks) * scale
                rmax[:, q0:q1] = sc.amax(dim=2)
        return out, lse, probs, rmax.float()

    lib.impl("small_seq_tiled_fwd", fwd, "CPU")
    lib.impl("small_seq_tiled_bwd", bwd, "CPU")
    lib.impl("small_seq_tiled_fwd_row_max", fwd_row_max, "CPU")
    return lib


_ROW_MAX_CALLS = []


_EMULATED = []


@pytest.fixture
def emulated_tiled_ops(monkeypatch):
    """The tiled ops on the CPU (torch-path impls), registered by rocm_attn.ops' glue; calls
    route to them."""
    if torch.cuda.is_available() or small_seq_mod.ops.tiled_ops_registered() and not _EMULATED:
        pytest.skip("real tiled ops present")
    if not _EMULATED:
        _EMULATED.append(_define_emulated_tiled_ops())
    assert small_seq_mod.ops.register_tiled_ops()
    monkeypatch.setattr(small_seq_mod, "_tiled_problems", lambda q, k, v: [])
    yield
    # other tests see a build without tiled ops again
    monkeypatch.setattr(small_seq_mod.ops, "HAS_TILED_OPS", False)


@pytest.mark.parametrize("with_lse_grad", [False, True], ids=["dout", "dout_dlse"])
def test_tiled_op_glue_autograd_and_compile(emulated_tiled_ops, with_lse_grad):
    """Through the registered autograd (tiled backward op, dlse), the fakes (torch.compile
    fullgraph) and the routing: the results of the float64 oracle."""
    import torch._dynamo

    monkey_ops = small_seq_mod.ops
    monkey_ops.HAS_TILED_OPS = True
    rng = Rng(0, f"glue{with_lse_grad}")
    call = Call(rng, [3, 1, 0, 4], [5, 0, 2, 40], 4, 2, 64, torch.float32, q_lead=2)
    leaves = [t.detach().clone().requires_grad_() for t in (call.q, call.k, call.v)]
    dlse = rng.randn(4, call.total_q)
    dlse[:, :2] = 0  # padding rows: lse -inf, no cotangent

    def fn(q, k, v, cu_q, cu_kv):
        return fused_attn_small_seq(q, k, v, cu_q, cu_kv, call.max_q, call.max_kv,
                                    return_lse=True)

    rleaves = [t.detach().double().requires_grad_() for t in (call.q, call.k, call.v)]
    rout, rlse = oracle(*rleaves, call.segs, call.total_q)
    finite = torch.isfinite(rlse)
    for runner in (fn, torch.compile(fn, fullgraph=True)):
        torch._dynamo.reset()
        out, lse = runner(*leaves, call.cu_q, call.cu_kv)
        assert_rel("out", out, rout, TOL_FP32, str(call))
        assert_lse_equal_pattern(lse, rlse, str(call))
        outs, cots = [out], [call.dout]
        routs, rcots = [rout], [call.dout.double()]
        if with_lse_grad:
            outs.append(lse)
            cots.append(dlse)
            routs.append(torch.where(finite, rlse, 0))
            rcots.append(dlse.double())
        g = torch.autograd.grad(outs, leaves, cots)
        rg = torch.autograd.grad(routs, rleaves, rcots, retain_graph=True)
        for name, x, r in zip(("dq", "dk", "dv"), g, rg):
            assert_rel(name, x, r, TOL_FP32, str(call))


def test_tiled_op_glue_max_logit_from_row_max(emulated_tiled_ops, monkeypatch):
    """return_max_logit on the tiled path reads the row_max op's rows (no sharpened second
    pass, no exact CPU pass): eager and torch.compile(fullgraph=True), with gradients through
    out; padding rows and a segment without keys drop out; equal to the float64 oracle. The
    call stays on the tiled kernels where the flash route would take the plain call."""
    import torch._dynamo
    from rocm_attn.reference import reference_max_logit

    def forbidden(*_a, **_k):
        raise AssertionError("a second max_logit pass ran")

    monkeypatch.setattr(small_seq_mod, "_sharpened_max_logit", forbidden)
    monkeypatch.setattr(small_seq_mod, "_max_logit", forbidden)
    monkeypatch.setattr(small_seq_mod.small_seq_flash, "takes_route", lambda *a, **k: True)
    monkeypatch.setattr(small_seq_mod.small_seq_flash, "flash_route", forbidden)
    monkeypatch.setattr(small_seq_mod.ops, "HAS_TILED_OPS", True)
    rng = Rng(0, "rowmax")
    call = Call(rng, [3, 1, 0, 4], [5, 0, 2, 40], 4, 2, 64, torch.float32, q_lead=2, q_tail=1)
    leaves = [t.detach().clone().requires_grad_() for t in (call.q, call.k, call.v)]
    valid_cu_q = call.cu_q - call.cu_q[0]
    want = reference_max_logit(call.q[2:-1].double(), call.k.double(), valid_cu_q, call.cu_kv,
                               "no_mask")

    def fn(q, k, v, cu_q, cu_kv):
        return fused_attn_small_seq(q, k, v, cu_q, cu_kv, call.max_q, call.max_kv,
                                    return_max_logit=True)

    for runner in (fn, torch.compile(fn, fullgraph=True)):
        torch._dynamo.reset()
        _ROW_MAX_CALLS.clear()
        out, ml = runner(*leaves, call.cu_q, call.cu_kv)
        assert _ROW_MAX_CALLS, "the row_max op did not serve the call"
        assert ml.shape == (4,) and ml.dtype == torch.float32 and not ml.requires_grad
        assert ((ml.double() - want).abs() <= 1e-5 * (1 + want.abs())).all(), (ml, want)
        g = torch.autograd.grad(out, leaves, call.dout)
        assert all(torch.isfinite(x).all() for x in g)


def test_tiled_op_no_second_derivative(emulated_tiled_ops):
    small_seq_mod.ops.HAS_TILED_OPS = True
    rng = Rng(0, "second")
    call = Call(rng, [2, 3], [4, 5], 2, 2, 64, torch.float32)
    leaves = [t.detach().clone().requires_grad_() for t in (call.q, call.k, call.v)]
    out = fused_attn_small_seq(*leaves, call.cu_q, call.cu_kv, call.max_q, call.max_kv)
    dq, _, _ = torch.autograd.grad(out, leaves, call.dout, create_graph=True)
    with pytest.raises(RuntimeError, match="no second derivative"):
        dq.sum().backward()


@pytest.mark.parametrize("layout", [THD, BSHD])
def test_varlen_route_matches_torch_path(layout, allow_contract_errors):
    """The route for histories beyond the tiled kernels (rocm_attn.attention on the valid
    segments packed back to back), run here on the CPU: the torch path's results, bad
    segments NaN and counted, gradients through attention's autograd."""
    rng = Rng(0, f"varlen{layout}")
    if layout == THD:
        call = Call(rng, [3, 0, 2, 5, 1], [30, 4, 0, 50, 2], 4, 2, 32, torch.float32,
                    max_kv=60, q_lead=1, q_tail=2, kv_dtype=torch.int64)
        call.cu_kv[4] = call.cu_kv[3] + 100  # segments 3 and 4 bad (past the end)
        args = (call.cu_q, call.cu_kv, None)
        q, k, v, dout = call.q, call.k, call.v, call.dout
        max_q, max_kv, thd = call.max_q, call.max_kv, True
        bad = [3, 4]
    else:
        b, s_q, s_kv = 4, 3, 20
        q, k, v = rng.randn(b, s_q, 4, 32), rng.randn(b, s_kv, 2, 32), rng.randn(b, s_kv, 2, 32)
        dout = rng.randn(b, s_q, 4, 32)
        args = (None, None, torch.tensor([20, 0, 21, 7]))
        max_q, max_kv, thd = s_q, 20, False
        bad = [2]
    scale = 0.125
    results = []
    for route in ("varlen", "torch"):
        leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
        if route == "varlen":
            out, lse, _ = small_seq_mod._varlen_path(*leaves, *args, max_q, max_kv, scale, thd)
        else:
            out, lse, _ = small_seq_mod.torch_path(*leaves, *args, max_q, max_kv, scale, thd,
                                                   False, True, False)
        assert read_errors() == (len(bad), bad[0]), route
        keep = torch.isfinite(out).flatten(1).all(1)
        g = torch.autograd.grad(out[keep].sum() * 0 + (out[keep] * dout[keep]).sum(), leaves)
        results.append((out, lse, g))
    (out, lse, g), (rout, rlse, rg) = results
    assert torch.equal(torch.isnan(out), torch.isnan(rout))
    assert torch.equal(torch.isnan(lse), torch.isnan(rlse))
    fin = ~torch.isnan(rout)
    torch.testing.assert_close(out[fin], rout[fin], rtol=1e-5, atol=1e-5)
    fin = ~torch.isnan(rlse)
    torch.testing.assert_close(lse[fin], rlse[fin], rtol=1e-5, atol=1e-5)
    for x, r in zip(g, rg):
        torch.testing.assert_close(x, r, rtol=1e-5, atol=1e-5)


def test_long_history_logs_its_route(caplog, monkeypatch):
    """A kernel-eligible call beyond KERNEL_MAX_SEQLEN_KV takes rocm_attn.attention and says
    why at INFO."""
    import logging

    from rocm_attn import _logging

    monkeypatch.setattr(small_seq_mod, "_tiled_problems", lambda q, k, v: [])
    _logging._seen.clear()
    q = torch.randn(2, 2, 64)
    with caplog.at_level(logging.INFO, logger="rocm_attn"):
        path = small_seq_mod._pick_path(q, q, q, False, 2, small_seq_mod.KERNEL_MAX_SEQLEN_KV + 1,
                                        True, False, False, "auto")
    assert path == "varlen"
    assert "rocm_attn.attention" in caplog.text and "limit" in caplog.text
    assert small_seq_mod._pick_path(q, q, q, False, 2, small_seq_mod.KERNEL_MAX_SEQLEN_KV,
                                    True, False, False, "auto") == "tiled"



def test_bench_cpu_rows(capsys, tmp_path):
    """`rocm-attn bench small-seq --device cpu` runs without a GPU, and our op's numbers are
    the masked SDPA anchor's."""
    import json

    from rocm_attn.bench import small_seq as bench

    out = tmp_path / "cpu.json"
    assert bench.main(["--device", "cpu", "--cases", "q1_b2048_h4_d64_kv1-16", "--reps", "1",
                       "--threads", "1", "--no-progress", "--json", str(out)]) == 0
    assert "q1_b2048_h4_d64_kv1-16" in capsys.readouterr().out
    row = json.loads(out.read_text())["rows"][0]
    assert row["max_abs_diff_vs_sdpa_mask"] < 1e-4
    assert set(row["thread_cpu_ms"]) == {"ours", "sdpa_mask", "sdpa_fixed", "einsum"}


def test_kernel_max_seqlen_kv_mirrors_the_kernels():
    """rocm_attn.small_seq.KERNEL_MAX_SEQLEN_KV is the tiled kernels' limit
    (hip_src/small_seq/tiled_params.h kSmallSeqTiledMaxSeqlenKv), where that header exists."""
    import re
    from pathlib import Path

    header = Path(__file__).resolve().parents[1] / "hip_src" / "small_seq" / "tiled_params.h"
    if not header.exists():
        pytest.skip("no tiled kernels in this checkout")
    found = re.search(r"kSmallSeqTiledMaxSeqlenKv\s*=\s*(\d+)", header.read_text())
    assert found, "kSmallSeqTiledMaxSeqlenKv not found in tiled_params.h"
    assert int(found.group(1)) == small_seq_mod.KERNEL_MAX_SEQLEN_KV
