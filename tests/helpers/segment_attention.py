"""Float64 attention over many segments at once: the math of the tiled small-seq oracles
(tests/helpers/small_seq_tiled_cases.py, small_seq_tiled_bwd_cases.py; no tests here).

Every query of a segment attends to all of the segment's keys (no mask); q head h reads kv head
h // group. Segments are sorted by size and padded into batches of at most a budget of score
elements, so that a case of hundreds of segments costs a few batched products, not a Python
loop of small ones; the math runs on the inputs' device (a GPU in the GPU tests, where float64
products are fast) and the results come back on the CPU. The backward is the analytic softmax
backward, dS = P (dP - Delta + dlse) with Delta = rowsum(dO . out) from the float64 out: the
gradient of sum(out . dO) + sum(lse . dlse). ROCM_ATTN_TEST_ORACLE_DEVICE (e.g. "cpu") moves
the math elsewhere: under compute-sanitizer, whose instrumentation slows every GPU kernel,
tools/gpu_check.sh's memcheck runs set it to the CPU.

Where two segments share a row (only garbage offsets make them), the later segment's values
stand, as if the segments were written one after the other.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence

import torch

# Score elements (segments x q heads x queries x keys) per batch: several float64 tensors of this
# size are alive at once.
BUDGET = {"cpu": 1 << 22, "cuda": 1 << 25}


@dataclass(frozen=True)
class Segment:
    """Segment `index` (its order among the segments): queries q0 .. q0 + nq - 1 of q viewed as
    [rows, h_q, d], keys k0 .. k0 + nk - 1 of k / v viewed as [kv rows, h_kv, d]."""
    index: int
    q0: int
    nq: int
    k0: int
    nk: int


def _owners(n: int, ranges: Sequence[tuple]) -> torch.Tensor:
    """Per row, the index of the last segment whose range (index, start, length) holds it; -1."""
    owner = torch.full((n,), -1, dtype=torch.int64)
    for index, start, length in ranges:
        owner[start:start + length] = index
    return owner


def _batches(segments: List[Segment], h_q: int, budget: int) -> List[List[Segment]]:
    """Segments sorted by (keys, queries), cut into batches whose padded score tensor
    (count x h_q x max queries x max keys) stays within the budget (one segment at least)."""
    batches: List[List[Segment]] = []
    cur: List[Segment] = []
    max_q = max_k = 0
    for seg in sorted(segments, key=lambda s: (s.nk, s.nq)):
        mq, mk = max(max_q, seg.nq), max(max_k, seg.nk)
        if cur and (len(cur) + 1) * h_q * mq * mk > budget:
            batches.append(cur)
            cur, mq, mk = [], seg.nq, seg.nk
        cur.append(seg)
        max_q, max_k = mq, mk
    if cur:
        batches.append(cur)
    return batches


def _gather(x: torch.Tensor, start: torch.Tensor, count: torch.Tensor, width: int):
    """x[start + j] for j < width per segment ([n, width, ...]; rows past a segment's count
    read its last row and are set to 0 by `where`, so a non-finite row cannot leak into
    them), and the [n, width] mask of live rows."""
    j = torch.arange(width, device=x.device)
    live = j < count[:, None]
    rows = start[:, None] + torch.minimum(j, (count - 1).clamp(min=0)[:, None])
    got = x[rows]
    keep = live.reshape(live.shape + (1,) * (got.dim() - 2))
    return torch.where(keep, got, torch.zeros((), dtype=got.dtype, device=got.device)), live, rows


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, segments: List[Segment],
           scale: float, *, max_kv: Optional[int] = None, dout: Optional[torch.Tensor] = None,
           dlse: Optional[torch.Tensor] = None) -> Dict[str, torch.Tensor]:
    """q [rows, h_q, d], k / v [kv rows, h_kv, d] (any float dtype, one device); segments with
    nq, nk >= 1. Returns CPU float64 tensors: out [rows, h_q, d], lse [h_q, rows] (rows no
    segment holds: out 0, lse -inf), probs [rows, h_q, max_kv] when max_kv is given; with dout
    [rows, h_q, d] (and dlse [h_q, rows] or None) also dq [rows, h_q, d] and dk / dv
    [kv rows, h_kv, d] (0 where no segment holds the row)."""
    dev = torch.device(os.environ.get("ROCM_ATTN_TEST_ORACLE_DEVICE", q.device))
    if dout is not None:
        dout, dlse = dout.to(dev), dlse.to(dev) if dlse is not None else None
    q, k, v = q.to(dev), k.to(dev), v.to(dev)
    rows, h_q, d = q.shape
    kv_rows, h_kv, _ = k.shape
    group = h_q // h_kv
    qf, kf, vf = q.detach().double(), k.detach().double(), v.detach().double()
    out = torch.zeros(rows, h_q, d, dtype=torch.float64, device=dev)
    lse = torch.full((rows, h_q), -math.inf, dtype=torch.float64, device=dev)
    probs = (torch.zeros(rows, h_q, max_kv, dtype=torch.float64, device=dev)
             if max_kv is not None else None)
    backward = dout is not None
    if backward:
        gf = dout.detach().double().reshape(rows, h_q, d)
        lf = dlse.detach().double().t() if dlse is not None else None  # [rows, h_q]
        dq = torch.zeros(rows, h_q, d, dtype=torch.float64, device=dev)
        dk = torch.zeros(kv_rows, h_kv, d, dtype=torch.float64, device=dev)
        dv = torch.zeros(kv_rows, h_kv, d, dtype=torch.float64, device=dev)
    q_owner = _owners(rows, [(s.index, s.q0, s.nq) for s in segments]).to(dev)
    if backward:
        k_owner = _owners(kv_rows, [(s.index, s.k0, s.nk) for s in segments]).to(dev)
    budget = BUDGET.get(dev.type, BUDGET["cpu"])
    for batch in _batches(segments, h_q, budget):
        def col(name):
            return torch.tensor([getattr(s, name) for s in batch], dtype=torch.int64, device=dev)
        index, q0, nq, k0, nk = (col(n) for n in ("index", "q0", "nq", "k0", "nk"))
        mq, mk = int(nq.max()), int(nk.max())
        n = len(batch)
        qs, q_live, q_rows = _gather(qf, q0, nq, mq)  # [n, mq, h_q, d]
        ks, k_live, k_rows = _gather(kf, k0, nk, mk)  # [n, mk, h_kv, d]
        vs, _, _ = _gather(vf, k0, nk, mk)
        qg = qs.reshape(n, mq, h_kv, group, d)
        s = torch.einsum("nqhgd,nkhd->nhgqk", qg, ks) * scale
        s = s.masked_fill(~k_live[:, None, None, None, :], -math.inf)
        ls = torch.logsumexp(s, dim=-1)  # [n, h_kv, group, mq]
        p = torch.exp(s - ls[..., None])
        o = torch.einsum("nhgqk,nkhd->nqhgd", p, vs)
        # rows this batch's segments own (a later segment sharing a row owns it)
        q_sel = q_live & (q_owner[q_rows] == index[:, None])
        r = q_rows[q_sel]
        out[r] = o.reshape(n, mq, h_q, d)[q_sel]
        lse[r] = ls.permute(0, 3, 1, 2).reshape(n, mq, h_q)[q_sel]
        if probs is not None:
            probs[r, :, :mk] = p.permute(0, 3, 1, 2, 4).reshape(n, mq, h_q, mk)[q_sel]
        if not backward:
            continue
        gs, _, _ = _gather(gf, q0, nq, mq)
        gg = gs.reshape(n, mq, h_kv, group, d)
        dp = torch.einsum("nqhgd,nkhd->nhgqk", gg, vs)
        delta = (gg * o).sum(-1).permute(0, 2, 3, 1)  # [n, h_kv, group, mq]
        if lf is not None:
            ld, _, _ = _gather(lf, q0, nq, mq)  # [n, mq, h_q]
            delta = delta - ld.reshape(n, mq, h_kv, group).permute(0, 2, 3, 1)
        ds = p * (dp - delta[..., None])
        dq[r] = (torch.einsum("nhgqk,nkhd->nqhgd", ds, ks) * scale).reshape(n, mq, h_q, d)[q_sel]
        k_sel = k_live & (k_owner[k_rows] == index[:, None])
        rk = k_rows[k_sel]
        dk[rk] = (torch.einsum("nhgqk,nqhgd->nkhd", ds, qg) * scale)[k_sel]
        dv[rk] = torch.einsum("nhgqk,nqhgd->nkhd", p, gg)[k_sel]
    res = {"out": out.cpu(), "lse": lse.t().contiguous().cpu()}
    if probs is not None:
        res["probs"] = probs.cpu()
    if backward:
        res.update(dq=dq.cpu(), dk=dk.cpu(), dv=dv.cpu())
    return res
