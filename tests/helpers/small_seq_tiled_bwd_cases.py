"""The float64 gradient oracle of the tiled small-seq backward (helper of
tests/test_emu_small_seq_tiled_bwd.py and tests/test_small_seq_tiled_bwd_gpu.py; no tests here).

By the contract of docs/kernels.md#tiled-small-seq-backward in float64 (the math batched over
segments, tests/helpers/segment_attention.py): every query of a valid segment attends to all
of its keys; dq of a bad segment's rows max(q0, 0) .. min(q1, q0 + max_q, total_q) - 1 is NaN;
q rows outside every segment (padding) get dq 0; k/v rows that no segment covers, and a bad
segment's keys, get dk = dv = 0. Rows the contract leaves open (a bad segment's queries past
max_seqlen_q; k/v rows claimed by two segments, which only garbage offsets produce) are excluded
from the comparison.
"""

from __future__ import annotations

import math
from typing import Optional

import torch

from . import segment_attention as SA
from . import small_seq_tiled_cases as C

# The dK / dV and dQ passes for every call: the wave kernel of pass 2 where there is no dQ pass
# (one key tile, or one row tile), else the block variants of both passes
# (tiled_bwd_block_kernel.h: row / key tiles staged in shared memory); tuning values for
# rocm_attn.tuning.override (GPU) and helpers.emu.tuning (CPU emulation). They keep the Hopper
# warpgroup kernel off (it would take the calls of 64+ rows per (segment, kv head) on an sm_90a
# GPU), the streaming kernel (calls of at most 4 rows per (segment, kv head)) and the
# one-row-tile instance of the dK / dV pass (calls of at most 16).
BWD_PASSES = {
    "passes": {"small_seq_tiled_bwd_warpgroup": 0, "small_seq_tiled_bwd_stream": 0,
               "small_seq_tiled_bwd_row_tile": 0},
}
# The dK / dV pass's one-row-tile instance (tiled_bwd_kernel.h) for the calls it serves (at most
# 16 rows per (segment, kv head), more than the streaming kernel's 4); calls of more rows fall
# back to BWD_PASSES. Delta fused where every history fits one key tile (max_seqlen_kv <= 16:
# the instance computes each row's Delta itself, rowsum(P dP) - dlse, and the Delta pass is not
# launched), else from the Delta pass.
ROW_TILE_PASS = {"small_seq_tiled_bwd_row_tile": 1, "small_seq_tiled_bwd_stream": 0,
                 "small_seq_tiled_bwd_warpgroup": 0}
# The streaming kernel (tiled_bwd_stream_kernel.h) for the calls it serves (at most 4 rows per
# (segment, kv head)), on every target, with one (segment, kv head) per wave and per block (the
# launcher picks by the number of them); calls of more rows fall back to the passes above.
STREAM_PASSES = {
    "stream_wave": {"small_seq_tiled_bwd_stream": 2, "small_seq_tiled_bwd_warpgroup": 0},
    "stream_block": {"small_seq_tiled_bwd_stream": 3, "small_seq_tiled_bwd_warpgroup": 0},
}
# The warpgroup kernels (tiled_bwd_warpgroup_tma_kernel.h and the two-tile and streaming dQ
# kernels) for every call they can serve (d 64 / 128, on an sm_90a build on Hopper, tile copies
# permitting; elsewhere the calls fall back to the passes above): GPU tests only. Delta comes
# from the kernels themselves (the dK / dV kernel from its own P and dP up to 64 keys, past that
# the dQ kernel from dO and out) or, for the one- and two-tile walks, from the Delta pass.
WARPGROUP_PASS = {"small_seq_tiled_bwd_warpgroup": 2}

# Relative (norm) error of a 16-bit gradient: the rounding of the output and of P / dS as
# product operands (as flash-attention does).
TOL_GRAD = {torch.bfloat16: 1e-2, torch.float16: 5e-3}


def contract_rows(case: C.TiledCase, grads):
    """(dq, dk, dv) restricted to the rows whose gradients the contract fixes: all but a bad
    segment's queries past max_seqlen_q and k/v rows that two segments claim (only garbage
    offsets produce them), which hold either writer's value, by schedule."""
    dq, dk, dv = grads
    segs = C.contract_segments(case)
    q_rows = (~segs.unspecified).to(dq.device)
    if case.cu_kv is not None:
        kv_rows = (_kv_claims(case, segs) <= 1).to(dk.device)
    else:
        kv_rows = torch.ones(dk.shape[:2], dtype=torch.bool, device=dk.device)
    return dq.reshape(case.total_q, -1)[q_rows], dk[kv_rows], dv[kv_rows]


def assert_same_bits(grads, others, case: Optional[C.TiledCase] = None) -> None:
    """(dq, dk, dv) and another (dq, dk, dv): bitwise equal, NaN payloads included; with `case`,
    on the rows the contract fixes (contract_rows)."""
    if case is not None:
        grads, others = contract_rows(case, grads), contract_rows(case, others)
    for name, a, b in zip(("dq", "dk", "dv"), grads, others):
        assert torch.equal(a.view(torch.uint8), b.view(torch.uint8)), name


def assert_close_grads(grads, others, case: Optional[C.TiledCase] = None, tol=None) -> None:
    """(dq, dk, dv) and another (dq, dk, dv) of the same call by other kernels: NaN at the same
    elements, the finite ones within the oracle's bound of each other (relative norm); with
    `case`, on the rows the contract fixes (contract_rows)."""
    dtype = grads[0].dtype
    if case is not None:
        grads, others = contract_rows(case, grads), contract_rows(case, others)
    for name, a, b in zip(("dq", "dk", "dv"), grads, others):
        a, b = a.detach().cpu().double(), b.detach().cpu().double()
        assert torch.equal(torch.isnan(a), torch.isnan(b)), f"{name}: NaN elements differ"
        keep = ~torch.isnan(a)
        err = C.rel_err(a[keep], b[keep])
        assert err < (tol if tol is not None else TOL_GRAD[dtype]), \
            f"{name}: rel. difference {err:.3e}"


def inputs(case: C.TiledCase, seed: int, with_dlse: bool):
    """(dout in the input dtype with q's shape, out in the input dtype and lse float32 from the
    float64 forward oracle, dlse float32 [h_q, total_q] or None)."""
    gen = torch.Generator().manual_seed(seed)
    ref_out, ref_lse, _, _, _, _ = C.oracle(case, with_probs=False)
    dev = case.q.device
    dout = torch.randn(*case.q.shape, generator=gen).to(device=dev, dtype=case.q.dtype)
    out = ref_out.reshape(case.q.shape).to(device=dev, dtype=case.q.dtype)
    lse = ref_lse.float().to(dev)
    dlse = None
    if with_dlse:
        dlse = torch.randn(*lse.shape, generator=gen).float().to(dev)
    return dout, out, lse, dlse


def _kv_claims(case: C.TiledCase, segs: C.ContractSegments) -> torch.Tensor:
    """Per k/v row (THD) the number of writers claiming it: a valid segment its keys, a bad one
    (segs.bad) its clamped ordered range (the kernel zeroes it), and the ranges before
    cu_seqlens_kv[0] and from cu_seqlens_kv[b] on (zeroed too)."""
    rows = case.k.shape[0]
    claims = torch.zeros(rows, dtype=torch.int64)
    bad = set(segs.bad)
    cu_kv = case.cu_kv.tolist()
    for i in range(case.batch):
        k0, k1 = cu_kv[i], cu_kv[i + 1]
        a, b = (min(max(k0, 0), rows), min(max(k1, 0), rows)) if i in bad else (k0, k1)
        if a < b:
            claims[a:b] += 1
    # the rows before the first segment and from the end of the last (zeroed by the kernel)
    claims[:min(max(cu_kv[0], 0), rows)] += 1
    claims[min(max(cu_kv[-1], 0), rows):] += 1
    return claims


def oracle_grads(case: C.TiledCase, dout, dlse: Optional[torch.Tensor]):
    """(dq, dk, dv float64 with the inputs' shapes, dq_mask bool [q rows], dkv_mask bool over
    k/v rows ([total_kv] THD, [b, s_kv] BSHD), dq_live, dkv_live): the masks mark the rows the
    contract fixes, the live ones those with a computed gradient (the others are exact zeros
    or NaN by the contract). The math: segment_attention.attend over the valid segments."""
    rows = case.total_q
    segs = C.contract_segments(case)
    res = SA.attend(*C.flat_heads(case), segs.valid, case.scale, dout=dout, dlse=dlse)
    dq, dk, dv = res["dq"], res["dk"], res["dv"]
    dq_live = torch.zeros(rows, dtype=torch.bool)
    dkv_live = torch.zeros(dk.shape[0], dtype=torch.bool)
    for seg in segs.valid:
        dq_live[seg.q0:seg.q0 + seg.nq] = True
        dkv_live[seg.k0:seg.k0 + seg.nk] = True
    # a bad segment's NaN rows, but those a valid segment also writes (garbage offsets only:
    # the rows of the valid segment's gradient stand, as the backward kernels leave them)
    dq[segs.nan_rows & ~dq_live] = math.nan
    kv_shape = case.k.shape
    if case.cu_kv is not None:
        dkv_mask = _kv_claims(case, segs) <= 1
    else:
        dkv_mask = torch.ones(kv_shape[:2], dtype=torch.bool)
    return (dq.reshape(case.q.shape), dk.reshape(kv_shape), dv.reshape(kv_shape),
            ~segs.unspecified, dkv_mask, dq_live, dkv_live.reshape(kv_shape[:-2]))


def check_grads(case: C.TiledCase, dout, dlse, dq, dk, dv, ctx: str = ""):
    """Kernel gradients against the oracle: NaN exactly where the contract says (a bad segment's
    dq rows), exact zeros where it says zero, finite and close everywhere else."""
    ctx = f"{case} {ctx}"
    rdq, rdk, rdv, dq_mask, dkv_mask, dq_live, dkv_live = oracle_grads(case, dout, dlse)
    assert dq.shape == case.q.shape and dq.dtype == case.q.dtype, ctx
    assert dk.shape == case.k.shape and dk.dtype == case.k.dtype, ctx
    assert dv.shape == case.v.shape and dv.dtype == case.v.dtype, ctx
    rows, h_q, d = case.total_q, case.q.shape[-2], case.q.shape[-1]
    tol = TOL_GRAD[case.q.dtype]
    pairs = [("dq", dq.detach().cpu().double().reshape(rows, h_q, d), rdq.reshape(rows, h_q, d),
              dq_mask, dq_live),
             ("dk", dk.detach().cpu().double(), rdk, dkv_mask, dkv_live),
             ("dv", dv.detach().cpu().double(), rdv, dkv_mask, dkv_live)]
    for name, x, r, mask, live in pairs:
        x, r, live = x[mask], r[mask], live[mask]
        nan = torch.isnan(r).flatten(1).all(1) if r.dim() > 1 else torch.isnan(r)
        assert torch.isnan(x[nan]).all(), f"{name}: bad segments' rows not all NaN ({ctx})"
        zero = ~live & ~nan
        assert (x[zero] == 0).all(), f"{name}: nonzero where the contract says 0 ({ctx})"
        xg, rg = x[~nan], r[~nan]
        assert torch.isfinite(xg).all(), \
            f"{name}: {(~torch.isfinite(xg)).sum().item()} non-finite ({ctx})"
        err = C.rel_err(xg, rg)
        assert err < tol, f"{name}: rel. error {err:.3e} ({ctx})"
