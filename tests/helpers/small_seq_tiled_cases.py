"""Inputs and the float64 oracle of the tiled small-seq kernels (helpers of
tests/test_emu_small_seq_tiled.py and tests/test_small_seq_tiled_gpu.py; no tests here).

The oracle follows the contract of docs/kernels.md#tiled-small-seq-kernels in float64 (the
offsets read per segment on the host, the attention batched over segments on the inputs'
device: tests/helpers/segment_attention.py): every query of a segment attends to all of the
segment's keys; empty segments give out 0, lse -inf, probs 0; a bad segment gives NaN on its
rows max(q0, 0) .. min(q1, q0 + max_q, total_q) - 1; rows of a THD q outside every segment are
padding (out 0, lse -inf, probs 0).
Rows that no segment may read (k/v before cu_seqlens_kv[0] or after cu_seqlens_kv[b], BSHD rows
past a length, q padding rows) are NaN in the inputs: reading one shows in the outputs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import List, Optional, Sequence

import torch

from . import segment_attention as SA

TOL_OUT = {torch.bfloat16: 1e-2, torch.float16: 5e-3}  # rounding of a 16-bit output
TOL_F32 = 1e-4  # lse / probs (fp32 from 16-bit inputs)


@dataclass
class TiledCase:
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    cu_q: Optional[torch.Tensor]
    cu_kv: Optional[torch.Tensor]
    seqlens: Optional[torch.Tensor]
    max_q: int
    max_kv: int
    scale: float
    name: str = ""

    def args(self):
        return (self.q, self.k, self.v, self.cu_q, self.cu_kv, self.seqlens, self.max_q,
                self.max_kv, self.scale)

    @property
    def total_q(self) -> int:
        return self.q.shape[0] if self.q.dim() == 3 else self.q.shape[0] * self.q.shape[1]

    @property
    def batch(self) -> int:
        return self.cu_q.numel() - 1 if self.cu_q is not None else self.q.shape[0]

    def __str__(self):
        return (f"{self.name} q{tuple(self.q.shape)} k{tuple(self.k.shape)} {self.q.dtype} "
                f"max_q={self.max_q} max_kv={self.max_kv}")


def _randn(gen, shape, dtype, device):
    return torch.randn(*shape, generator=gen, dtype=torch.float32).to(device=device, dtype=dtype)


def _cumsum(lens: Sequence[int], start: int, dtype, device) -> torch.Tensor:
    out = [start]
    for n in lens:
        out.append(out[-1] + int(n))
    return torch.tensor(out, dtype=dtype, device=device)


def thd_case(seed: int, q_lens: Sequence[int], kv_lens: Sequence[int], h_q: int, h_kv: int,
             d: int, dtype, *, offsets=torch.int32, kv_offsets=None, strided=False,
             pad_before=0, pad_after=0, kv_pad=0, max_q=None, max_kv=None,
             device="cpu") -> TiledCase:
    """THD q [total_q, h_q, d], k/v [total_kv, h_kv, d]. pad_before / pad_after: q rows outside
    every segment; kv_pad: unread k/v rows before the first and after the last segment. With
    `strided`, q is a head slice of a wider tensor and k/v are halves of one fused tensor."""
    gen = torch.Generator().manual_seed(seed)
    total_q = pad_before + sum(q_lens) + pad_after
    total_kv = 2 * kv_pad + sum(kv_lens)
    if strided:
        q = _randn(gen, (total_q, h_q + 2, d), dtype, device)[:, 1:1 + h_q]
        kv = _randn(gen, (total_kv, 2, h_kv, d), dtype, device)
        k, v = kv[:, 0], kv[:, 1]
    else:
        q = _randn(gen, (total_q, h_q, d), dtype, device)
        k = _randn(gen, (total_kv, h_kv, d), dtype, device)
        v = _randn(gen, (total_kv, h_kv, d), dtype, device)
    nan = float("nan")
    q[:pad_before] = nan
    q[total_q - pad_after:] = nan
    for t in (k, v):
        t[:kv_pad] = nan
        t[total_kv - kv_pad:] = nan
    cu_q = _cumsum(q_lens, pad_before, offsets, device)
    cu_kv = _cumsum(kv_lens, kv_pad, kv_offsets or offsets, device)
    return TiledCase(q, k, v, cu_q, cu_kv, None, max_q or max(max(q_lens, default=1), 1),
                     max_kv or max(max(kv_lens, default=1), 1), d ** -0.5, "thd")


def bshd_case(seed: int, s_q: int, kv_lens: Sequence[int], s_kv: int, h_q: int, h_kv: int,
              d: int, dtype, *, offsets=torch.int32, max_kv=None, device="cpu") -> TiledCase:
    """BSHD q [b, s_q, h_q, d], k/v [b, s_kv, h_kv, d] with rows past each length NaN."""
    gen = torch.Generator().manual_seed(seed)
    b = len(kv_lens)
    q = _randn(gen, (b, s_q, h_q, d), dtype, device)
    k = _randn(gen, (b, s_kv, h_kv, d), dtype, device)
    v = _randn(gen, (b, s_kv, h_kv, d), dtype, device)
    for i, n in enumerate(kv_lens):
        k[i, n:] = float("nan")
        v[i, n:] = float("nan")
    seqlens = torch.tensor(list(kv_lens), dtype=offsets, device=device)
    return TiledCase(q, k, v, None, None, seqlens, s_q, max_kv or s_kv, d ** -0.5, "bshd")


@dataclass
class ContractSegments:
    """What the contract makes of a case's offsets: the valid segments with queries and keys
    (segment_attention.Segment over q as [rows, h_q, d] and k / v as [kv rows, h_kv, d]), the
    bad segment indices, nan_rows bool [rows] (a bad segment's rows max(q0, 0) .. min(q1, q0 +
    max_q, rows) - 1) and unspecified bool [rows] (a bad segment's rows past that range)."""
    valid: List[SA.Segment]
    bad: List[int]
    nan_rows: torch.Tensor
    unspecified: torch.Tensor


def contract_segments(case: TiledCase) -> ContractSegments:
    """The case's segments by the contract (offsets read on the host; no attention math)."""
    rows = case.total_q
    nan_rows = torch.zeros(rows, dtype=torch.bool)
    unspecified = torch.zeros(rows, dtype=torch.bool)
    valid: List[SA.Segment] = []
    bad: List[int] = []
    cu_q = case.cu_q.tolist() if case.cu_q is not None else None
    cu_kv = case.cu_kv.tolist() if case.cu_kv is not None else None
    seqlens = case.seqlens.tolist() if case.seqlens is not None else None
    total_kv = case.k.shape[0] if cu_kv is not None else case.k.shape[1]
    for i in range(case.batch):
        if cu_q is not None:
            q0, q1 = cu_q[i], cu_q[i + 1]
            ok = 0 <= q0 <= q1 <= rows and q1 - q0 <= case.max_q
            lo, hi = max(q0, 0), min(q1, q0 + case.max_q, rows)
        else:
            s_q = case.q.shape[1]
            q0, q1 = i * s_q, (i + 1) * s_q
            ok, lo, hi = True, q0, q1
        if cu_kv is not None:
            k0, k1 = cu_kv[i], cu_kv[i + 1]
            ok = ok and 0 <= k0 <= k1 <= total_kv and k1 - k0 <= case.max_kv
        else:
            k0, k1 = i * total_kv, i * total_kv + seqlens[i]  # rows of k as [b * s_kv, ...]
            ok = ok and 0 <= seqlens[i] <= min(total_kv, case.max_kv)
        if not ok:
            bad.append(i)
            if hi > lo:
                nan_rows[lo:hi] = True
            if min(q1, rows) > max(hi, 0):
                unspecified[max(hi, 0):min(q1, rows)] = True
        elif q1 > q0 and k1 > k0:
            valid.append(SA.Segment(i, q0, q1 - q0, k0, k1 - k0))
    return ContractSegments(valid, bad, nan_rows, unspecified & ~nan_rows)


def flat_heads(case: TiledCase):
    """q as [rows, h_q, d] and k / v as [kv rows, h_kv, d] (BSHD: [b * s, ...]): views."""
    h_q, d = case.q.shape[-2], case.q.shape[-1]
    h_kv = case.k.shape[-2]
    return (case.q.reshape(case.total_q, h_q, d), case.k.reshape(-1, h_kv, d),
            case.v.reshape(-1, h_kv, d))


def oracle(case: TiledCase, with_probs: bool = True):
    """(out [q rows, h_q, d] float64, lse [h_q, rows] float64, probs [rows, h_q, max_kv] float64
    (None without with_probs), bad segment indices, nan_rows bool [rows], unspecified bool
    [rows]) by the contract (contract_segments; the attention math batched over segments,
    segment_attention.attend)."""
    segs = contract_segments(case)
    res = SA.attend(*flat_heads(case), segs.valid, case.scale,
                    max_kv=case.max_kv if with_probs else None)
    out, lse, probs = res["out"], res["lse"], res.get("probs")
    out[segs.nan_rows] = math.nan
    lse[:, segs.nan_rows] = math.nan
    if probs is not None:
        probs[segs.nan_rows] = math.nan
    return out, lse, probs, segs.bad, segs.nan_rows, segs.unspecified


def rel_err(x: torch.Tensor, ref: torch.Tensor) -> float:
    x, ref = x.detach().double().cpu(), ref.detach().double().cpu()
    num = (x - ref).norm().item()
    den = ref.norm().item()
    return num / den if den > 0 else num


def check(case: TiledCase, out, lse, probs, ctx: str = "", expect_bad: Optional[List[int]] = None):
    """Kernel outputs against the oracle: NaN exactly on the bad segments' rows, finite and close
    everywhere else (an unwritten NaN-poisoned element fails), -inf LSE exactly where the oracle
    has it. Returns the oracle's bad segment list."""
    ctx = f"{case} {ctx}"
    ref_out, ref_lse, ref_probs, bad, nan_rows, unspecified = oracle(case)
    if expect_bad is not None:
        assert bad == expect_bad, f"oracle's bad segments {bad} != {expect_bad} ({ctx})"
    rows, h_q, d = case.total_q, case.q.shape[-2], case.q.shape[-1]
    assert out.shape == case.q.shape and out.dtype == case.q.dtype, ctx
    assert lse.shape == (h_q, rows) and lse.dtype == torch.float32, ctx
    o = out.detach().cpu().reshape(rows, h_q, d)
    lse = lse.detach().cpu()
    good = ~nan_rows & ~unspecified
    assert torch.isnan(o[nan_rows]).all(), f"out: bad segments' rows not all NaN ({ctx})"
    assert torch.isnan(lse[:, nan_rows]).all(), f"lse: bad segments' rows not all NaN ({ctx})"
    og, rg = o[good], ref_out[good]
    assert torch.isfinite(og).all(), f"out: {(~torch.isfinite(og)).sum().item()} non-finite ({ctx})"
    err = rel_err(og, rg)
    assert err < TOL_OUT[case.q.dtype], f"out: rel. error {err:.3e} ({ctx})"
    lg, rlg = lse[:, good], ref_lse[:, good]
    assert not torch.isnan(lg).any(), f"lse: NaN on good rows ({ctx})"
    assert torch.equal(torch.isneginf(lg), torch.isneginf(rlg)), f"lse: -inf pattern ({ctx})"
    fin = torch.isfinite(rlg)
    if fin.any():
        err = rel_err(lg[fin], rlg[fin])
        assert err < TOL_F32, f"lse: rel. error {err:.3e} ({ctx})"
    if probs is not None:
        pr = probs.detach().cpu()
        assert pr.shape == (rows, h_q, case.max_kv) and pr.dtype == torch.float32, ctx
        assert torch.isnan(pr[nan_rows]).all(), f"probs: bad rows not NaN ({ctx})"
        pg = pr[good]
        assert torch.isfinite(pg).all(), f"probs: non-finite on good rows ({ctx})"
        err = rel_err(pg, ref_probs[good])
        assert err < TOL_F32, f"probs: rel. error {err:.3e} ({ctx})"
    return bad
