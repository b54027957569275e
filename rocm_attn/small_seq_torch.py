"""The torch path of ``fused_attn_small_seq``: every layout, dtype, device and length.

Segments are gathered into padded batches, ``[b, max_q, h_q, d]`` queries and
``[b, max_kv, h_kv, d]`` keys/values (one gather per segment, never one per query), and every
query of a segment attends to all of the segment's keys. Nothing reads an offset on the host,
so the path runs on GPU tensors without a sync and traces under ``torch.compile``.

Two contracts, matching the kernels that serve the same call:

* ``one_query`` (``max_seqlen_q == 1``, int32 offsets, ``max_seqlen_kv <= 16``: the
  ``small_seq_fwd`` kernels): a THD segment has exactly one query row ``q0`` with
  ``0 <= q0 < total_q``; lse and probs are indexed by segment; q rows that no valid segment
  writes are NaN.
* otherwise (the tiled kernels, hip_src/small_seq/tiled_segment.h): a THD segment has query rows
  ``q0 .. q1-1`` with ``0 <= q0 <= q1 <= total_q`` and ``q1 - q0 <= max_seqlen_q``; lse and probs
  are indexed by query row; rows before ``cu_seqlens_q[0]`` and from ``cu_seqlens_q[b]`` on are
  padding (out 0, lse -inf, probs 0); a bad segment writes NaN to its rows
  ``max(q0, 0) .. min(q1, q0 + max_seqlen_q, total_q) - 1``; other rows that no valid segment
  covers (only possible when some segment is bad) are NaN.

In both, keys ``k0 .. k1-1`` with ``0 <= k0 <= k1 <= total_kv`` and ``k1 - k0 <= max_seqlen_kv``
(BSHD: ``0 <= seqlens_kv[i] <= min(s_kv, max_seqlen_kv)``); a bad segment reads no key, is counted
(errors.record_torch_path_errors) and its keys get zero gradient.

Two formulations:

* inference (no gradient, no probs): F.scaled_dot_product_attention on the padded batch with a
  key mask. Padded key slots are filled with the segment's own last key (the gather rows are
  clamped into the segment), so keys of other segments, which may hold NaN, are never read:
  the mask alone cannot hide a NaN key from SDPA (NaN + -inf is NaN).
* training (and probs): matmuls in float32 (float64 for float64 inputs) with the padding rows
  replaced through torch.where (a product would keep a NaN, and its backward would pass
  ``0 * NaN`` on), so nothing of another segment reaches a segment's output or gradients.

GQA/MQA never repeats K/V: the query heads of one kv head are folded into the query-row
dimension (``[b, h_kv, group * max_q, d]``), exact since no mask depends on the query row.

On CPU tensors in eager mode (THD, many queries per segment, no probs) the counts are read on
the host, where they already are: the padded batch then takes the data's own largest counts
when the segments are alike, and otherwise the segments run in groups by the powers of two of
their counts (_cpu_grouped), each padded to its own counts. So a generous bound (a server's
``max_candidates=8192``) or ragged counts cost what the rows and pairs that exist cost. On
other devices and under torch.compile the path stays sync-free and pads to the bounds.
"""

from __future__ import annotations

from typing import NamedTuple, Optional, Tuple

import torch
import torch.nn.functional as F
from torch.fx.experimental.symbolic_shapes import statically_known_true

from . import errors

NEG_INF = float("-inf")
NAN = float("nan")
# Bytes of padded q, k, v one chunk of the CPU inference path gathers: small enough to stay in
# the caches, and far below glibc's mmap threshold (32 MiB), so the buffers are reused from the
# heap: a fresh mmap of the whole padded batch costs a page fault per 4 KiB on every call, more
# than the attention itself (docs/performance.md#fused_attn_small_seq-on-cpu).
CPU_CHUNK_BYTES = 2 * 2**20
# ... but at least this many segments per chunk, so that Python's cost per chunk (a few ops)
# stays small next to the chunk's work.
CPU_CHUNK_MIN_SEGMENTS = 16
# Bytes of one chunk's elementwise products in the one-query inference path (width x h_q x d
# values per segment): measured on a 2-core EPYC VM, 2 MiB chunks ran as fast as 8 MiB ones and
# 1.2x faster than 0.5 MiB ones (per-op cost).
CPU_ONE_QUERY_CHUNK_BYTES = 2 * 2**20


class Segments(NamedTuple):
    """Per-segment rows of one call (all int64 / bool, ``[b]`` unless said otherwise)."""

    bad: torch.Tensor          # segment breaks the contract
    q_rows: torch.Tensor       # [b, max_q] rows of q to gather (clamped into q)
    nq: torch.Tensor           # valid queries (0 for a bad segment)
    nkv: torch.Tensor          # valid keys (0 for a bad segment)
    k_start: torch.Tensor      # first key row (0 for a bad segment)
    nan_lo: Optional[torch.Tensor]   # bad segment's NaN rows lo .. hi-1 (THD, tiled contract)
    nan_hi: Optional[torch.Tensor]
    pad_lead: Optional[torch.Tensor]  # THD tiled: rows [0, pad_lead) and [pad_tail, total_q)
    pad_tail: Optional[torch.Tensor]  # are padding (0-dim int64)
    q_start: Optional[torch.Tensor] = None  # THD: first query row (0 for a bad segment)


def thd_segments(cu_seqlens_q, cu_seqlens_kv, total_q: int, total_kv: int, max_q: int,
                 max_kv: int, one_query: bool, with_q_rows: bool = True) -> Segments:
    """The contract of every segment, computed in int64 without a host sync.

    ``with_q_rows=False`` leaves ``q_rows`` (``[b, max_q]``, the size of the bound) None for a
    caller that works from ``q_start`` and the counts (:func:`_cpu_grouped`).

    Every condition is checked on the raw values (``q0 <= q1`` rather than ``q1 - q0 >= 0``):
    an int64 difference of two unchecked offsets can overflow and an int32 one can wrap into
    the valid range; a difference is only used where the conditions beside it hold.
    """
    q0, q1 = cu_seqlens_q[:-1].long(), cu_seqlens_q[1:].long()
    k0, k1 = cu_seqlens_kv[:-1].long(), cu_seqlens_kv[1:].long()
    if one_query:
        ok_q = (q1 - q0 == 1) & (q0 >= 0) & (q0 < total_q)
    else:
        ok_q = (q0 >= 0) & (q0 <= q1) & (q1 <= total_q) & (q1 - q0 <= max_q)
    ok_kv = (k0 >= 0) & (k0 <= k1) & (k1 <= total_kv) & (k1 - k0 <= max_kv)
    valid = ok_q & ok_kv
    zero = torch.zeros_like(q0)
    nq = torch.where(valid, q1 - q0, zero)
    q_start = torch.where(valid, q0, zero)
    q_rows = _q_rows(q_start, max_q, total_q) if with_q_rows else None
    nan_lo = nan_hi = pad_lead = pad_tail = None
    if not one_query:
        # rows a bad segment writes NaN to (the kernels' rule); q0 is clamped before adding
        # max_q so that a huge int64 offset cannot overflow (then lo > hi anyway)
        nan_lo = q0.clamp(min=0)
        nan_hi = torch.minimum(q1.clamp(max=total_q), q0.clamp(max=total_q) + max_q)
        pad_lead = cu_seqlens_q[0].long().clamp(0, total_q)
        pad_tail = cu_seqlens_q[-1].long().clamp(0, total_q)
    return Segments(~valid, q_rows, nq, torch.where(valid, k1 - k0, zero),
                    torch.where(valid, k0, zero), nan_lo, nan_hi, pad_lead, pad_tail, q_start)


def _q_rows(q_start: torch.Tensor, max_q: int, total_q: int) -> torch.Tensor:
    """[b, max_q] rows of q of every segment's query slots, clamped into q."""
    q_rows = q_start.unsqueeze(1) + torch.arange(max_q, device=q_start.device)
    return q_rows.clamp(0, max(total_q - 1, 0))


def bshd_segments(seqlens_kv, b: int, s_q: int, s_kv: int, max_kv: int) -> Segments:
    lens = seqlens_kv.long()
    valid = (lens >= 0) & (lens <= min(s_kv, max_kv))
    zero = torch.zeros_like(lens)
    q_rows = torch.zeros((b, s_q), dtype=torch.long, device=lens.device)  # unused for BSHD
    return Segments(~valid, q_rows, torch.full_like(lens, s_q), torch.where(valid, lens, zero),
                    zero, None, None, None, None)


def _gather_rows(x: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """x[rows] for int64 rows of any shape (clamped into x; zeros when x has no row), as one
    index_select (cheaper than advanced indexing on the CPU)."""
    shape = tuple(rows.shape) + tuple(x.shape[1:])
    n = x.shape[0]
    # a symbolic size when traced with dynamic shapes (dynamo, torch.export), else an int (or,
    # under the legacy ONNX exporter, a traced size: a tensor that reads as a bool). NOTE: a
    # static size takes the plain test also under dynamo: torch 2.4's dynamo cannot trace
    # statically_known_true
    symbolic = isinstance(n, torch.SymInt)
    if statically_known_true(n == 0) if symbolic else n == 0:
        return x.new_zeros(shape)
    if statically_known_true(n != 0) if symbolic else True:
        return x.index_select(0, rows.reshape(-1)).view(shape)
    # A row count nothing decides (data-dependent: jagged inputs under torch.export): a zero
    # row appended serves an empty x too (its rows are clamped to 0), with no guard on it.
    padded = torch.cat([x, x.new_zeros((1,) + tuple(x.shape[1:]))])
    return padded.index_select(0, rows.reshape(-1)).view(shape)


def _fold_heads(qp: torch.Tensor, h_kv: int) -> torch.Tensor:
    """[b, mq, h_q, d] -> [b, h_kv, group * mq, d] (query heads of one kv head side by side)."""
    b, mq, h_q, d = qp.shape
    group = h_q // h_kv
    if mq == 1:
        return qp.view(b, h_kv, group, d)
    return qp.view(b, mq, h_kv, group, d).permute(0, 2, 3, 1, 4).reshape(b, h_kv, group * mq, d)


def _unfold_heads(x: torch.Tensor, mq: int, h_q: int) -> torch.Tensor:
    """[b, h_kv, group * mq, *rest] -> [b, mq, h_q, *rest]."""
    b, h_kv = x.shape[:2]
    rest = tuple(x.shape[3:])
    group = h_q // h_kv
    if mq == 1:
        return x.reshape((b, 1, h_q) + rest)
    x = x.reshape((b, h_kv, group, mq) + rest)
    return x.movedim(3, 1).reshape((b, mq, h_q) + rest)


def _attend_inference(qp, kp, vp, nkv, scale: float, compute, want_lse: bool,
                      maybe_empty: bool = True):
    """(out [b, mq, h_q, d] in compute dtype, lse [b, mq, h_q] or None) by SDPA with a key mask.

    kp/vp padded slots must hold finite values of the segment (see the module docstring)."""
    b, mq, h_q, d = qp.shape
    h_kv, width = kp.shape[2], kp.shape[1]
    qf = _fold_heads(qp.to(compute), h_kv)
    kf = kp.to(compute).transpose(1, 2)
    vf = vp.to(compute).transpose(1, 2)
    keep = torch.arange(width, device=qp.device) < nkv.unsqueeze(1)  # [b, s]
    mask = keep.view(b, 1, 1, width)
    lse = None
    if want_lse:
        scores = torch.matmul(qf, kf.transpose(-1, -2)) * scale
        scores = scores.masked_fill(~mask, NEG_INF)
        lse = torch.logsumexp(scores, dim=-1)  # -inf for a segment without keys
        p = torch.exp(scores - torch.where(torch.isfinite(lse), lse, 0).unsqueeze(-1))
        out = torch.matmul(p, vf)
    else:
        out = F.scaled_dot_product_attention(qf, kf, vf, attn_mask=mask, scale=scale)
    if maybe_empty:  # a segment without keys: 0 (SDPA gives NaN for it on some versions)
        out = torch.where((nkv > 0).view(b, 1, 1, 1), out, out.new_zeros(()))
    out = _unfold_heads(out, mq, h_q)
    if lse is not None:
        lse = _unfold_heads(lse.unsqueeze(-1), mq, h_q).squeeze(-1)
    return out, lse


def _safe_softmax_lse(scores: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """Softmax and natural-log LSE over the last dim where masked entries are -inf; a row of
    only -inf gives probabilities 0 and LSE -inf, and its backward gives no NaN."""
    m = scores.amax(dim=-1, keepdim=True)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m)).detach()  # exact: a constant
    e = torch.exp(scores - m)
    s = e.sum(dim=-1, keepdim=True)
    nonempty = s > 0
    s_safe = torch.where(nonempty, s, torch.ones_like(s))
    lse = torch.where(nonempty, torch.log(s_safe) + m, torch.full_like(s, NEG_INF))
    return e / s_safe, lse.squeeze(-1)


def _attend_general(qp, kp, vp, nq, nkv, scale: float, compute):
    """(out [b, mq, h_q, d], lse [b, mq, h_q], probs [b, mq, h_q, s]) in compute dtype, with
    every padding row replaced through torch.where (differentiable, NaN-isolating)."""
    b, mq, h_q, d = qp.shape
    width, h_kv = kp.shape[1], kp.shape[2]
    dev = qp.device
    keep_q = (torch.arange(mq, device=dev) < nq.unsqueeze(1)).view(b, mq, 1, 1)
    keep_k = torch.arange(width, device=dev) < nkv.unsqueeze(1)  # [b, s]
    zero = qp.new_zeros((), dtype=compute)
    qf = _fold_heads(torch.where(keep_q, qp.to(compute), zero), h_kv)
    kf = torch.where(keep_k.view(b, width, 1, 1), kp.to(compute), zero).transpose(1, 2)
    vf = torch.where(keep_k.view(b, width, 1, 1), vp.to(compute), zero).transpose(1, 2)
    scores = torch.matmul(qf, kf.transpose(-1, -2)) * scale  # [b, h_kv, g*mq, s]
    scores = scores.masked_fill(~keep_k.view(b, 1, 1, width), NEG_INF)
    if width > 0:
        p, lse = _safe_softmax_lse(scores)
    else:
        p, lse = scores, scores.new_full(scores.shape[:-1], NEG_INF)
    out = torch.matmul(p, vf)
    return (_unfold_heads(out, mq, h_q), _unfold_heads(lse.unsqueeze(-1), mq, h_q).squeeze(-1),
            _unfold_heads(p, mq, h_q))


def _scatter_rows(vals: torch.Tensor, dest: torch.Tensor, base: torch.Tensor) -> torch.Tensor:
    """base (``[total_q + 1, ...]``, the last row a dump) with vals ``[b, mq, ...]`` written at
    rows dest ``[b, mq]`` (rows that go nowhere name the dump row)."""
    flat = vals.reshape((-1,) + tuple(vals.shape[2:]))
    return base.index_put((dest.reshape(-1),), flat)


def torch_path(q, k, v, cu_seqlens_q, cu_seqlens_kv, seqlens_kv, max_seqlen_q: int,
               max_seqlen_kv: int, scale: float, thd: bool, one_query: bool,
               return_lse: bool, return_softmax: bool):
    """(out, lse, probs) of fused_attn_small_seq; see the module docstring for the contract.

    THD q is ``[total_q, h_q, d]`` (``one_query``: ``[b, h_q, d]``); BSHD q ``[b, s_q, h_q, d]``.
    probs is an empty tensor unless ``return_softmax``; lse holds no values (empty, or zeros)
    unless ``return_lse`` or a gradient asks for it."""
    compute = torch.float64 if q.dtype == torch.float64 else torch.float32
    h_q = q.shape[-2]
    dev = q.device
    # the CPU reads offsets on the host for free; not while tracing, nor on fake tensors
    cpu_eager = (dev.type == "cpu" and not torch.compiler.is_compiling()
                 and not errors.holds_no_values(q))
    needs_grad = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad
                                              or v.requires_grad)
    inference = not needs_grad and not return_softmax
    grouped = False
    if thd:
        total_q, total_kv = q.shape[0], k.shape[0]
        b = cu_seqlens_q.numel() - 1
        mq = max_seqlen_q
        grouped = cpu_eager and not one_query and not return_softmax
        seg = thd_segments(cu_seqlens_q, cu_seqlens_kv, total_q, total_kv, mq, max_seqlen_kv,
                           one_query, with_q_rows=not grouped)
        width = max_seqlen_kv
        if grouped:
            errors.record_torch_path_errors(seg.bad)
            tight = _tight_bounds(seg)
            if tight is None:
                return _cpu_grouped(q, k, v, seg, scale, compute, return_lse, inference)
            # every segment valid and alike: the padded batch at the data's own largest
            # counts, as with tight bounds (the bounds only size the padding from here on)
            mq, width = tight
            seg = seg._replace(q_rows=_q_rows(seg.q_start, mq, total_q))
    else:
        b, mq = q.shape[0], q.shape[1]
        width = min(k.shape[1], max_seqlen_kv)
        seg = bshd_segments(seqlens_kv, b, mq, k.shape[1], max_seqlen_kv)
    if not grouped:
        errors.record_torch_path_errors(seg.bad)
    if inference and cpu_eager:
        fast = _cpu_inference(q, k, v, seg, thd, one_query, mq, width, scale, compute,
                              return_lse)
        if fast is not None:
            return fast
    slot = torch.arange(width, device=dev)
    if thd:
        qp = _gather_rows(q, seg.q_rows)  # [b, mq, h_q, d]
        if inference:
            # padded slots repeat the segment's last key: never another segment's row
            last = (seg.nkv - 1).clamp(min=0).unsqueeze(1)
            rows = seg.k_start.unsqueeze(1) + torch.minimum(slot.unsqueeze(0), last)
        else:
            rows = seg.k_start.unsqueeze(1) + slot.unsqueeze(0)
        rows = rows.clamp(0, max(total_kv - 1, 0))
        kp, vp = _gather_rows(k, rows), _gather_rows(v, rows)
    else:
        qp = q
        kp, vp = k[:, :width], v[:, :width]
        if inference:
            # BSHD padding rows may hold anything: replace them (SDPA's mask cannot hide NaN)
            keep = (slot.unsqueeze(0) < seg.nkv.unsqueeze(1)).view(b, width, 1, 1)
            kp = torch.where(keep, kp, kp.new_zeros(()))
            vp = torch.where(keep, vp, vp.new_zeros(()))
    if inference:
        out, lse = _attend_inference(qp, kp, vp, seg.nkv, scale, compute, return_lse)
        probs = None
        if lse is None:
            lse = out.new_zeros((b, mq, h_q), dtype=torch.float32)
    else:
        out, lse, probs = _attend_general(qp, kp, vp, seg.nq, seg.nkv, scale, compute)
        if not return_softmax:
            # placed only when asked for: [rows, h_q, max_seqlen_kv] has the bound's size
            probs = None
    out = out.to(q.dtype)
    lse = lse.to(torch.float32)
    if probs is not None:
        probs = probs.detach().to(torch.float32)  # for inspection, as on the kernel path
        if width < max_seqlen_kv:
            probs = F.pad(probs, (0, max_seqlen_kv - width))
    return place_rows(seg, out, lse, probs, q, thd, one_query, max_seqlen_kv)


def place_rows(seg: Segments, out, lse, probs, q, thd: bool, one_query: bool,
               max_seqlen_kv: int):
    """Per-segment results (out ``[b, mq, h_q, d]``, lse ``[b, mq, h_q]``, probs
    ``[b, mq, h_q, max_kv]`` or None) -> (out like q, lse ``[h_q, rows]``, probs ``[rows, h_q,
    max_kv]`` or empty) under the contract's placement rules (module docstring)."""
    b, mq, h_q, d = out.shape
    dev = q.device
    bad4 = seg.bad.view(b, 1, 1, 1)
    if one_query or not thd:
        # lse / probs by segment (one_query) or by row = batch * s_q + j (BSHD)
        lse_rows = torch.where(seg.bad.view(b, 1, 1), NAN, lse).reshape(b * mq, h_q).t()
        probs_rows = None
        if probs is not None:
            probs_rows = torch.where(bad4, NAN, probs).reshape(b * mq, h_q, max_seqlen_kv)
        if thd:  # one_query THD: out placed at each valid segment's query row, NaN elsewhere
            total_q = q.shape[0]
            dest = torch.where(seg.bad, total_q, seg.q_rows[:, 0]).unsqueeze(1)
            base = out.new_full((total_q + 1, h_q, d), NAN)
            out = _scatter_rows(out, dest, base)[:-1]
        else:
            out = torch.where(bad4, NAN, out)
        return out, lse_rows, _probs_or_empty(probs_rows, q)
    # THD, tiled contract: scatter by query row
    total_q = q.shape[0]
    j = torch.arange(mq, device=dev).unsqueeze(0)
    dest = torch.where(j < seg.nq.unsqueeze(1), seg.q_rows[:, :1] + j, total_q)
    nan_row = seg.nan_lo.unsqueeze(1) + j
    nan_dest = torch.where(seg.bad.unsqueeze(1) & (nan_row < seg.nan_hi.unsqueeze(1)),
                           nan_row, total_q)
    rows_all = torch.arange(total_q + 1, device=dev)
    padding = (rows_all < seg.pad_lead) | (rows_all >= seg.pad_tail)
    # rows a bad segment names, and rows neither padding nor written by a valid segment: NaN
    true = torch.ones((), dtype=torch.bool, device=dev).expand(dest.numel())
    no_row = torch.zeros(total_q + 1, dtype=torch.bool, device=dev)
    written = no_row.index_put((dest.reshape(-1),), true)
    named_bad = no_row.index_put((nan_dest.reshape(-1),), true)
    nan_rows = (named_bad | ~(written | padding))[:-1]

    def place(vals, pad_value, rest):
        base = vals.new_full((total_q + 1,) + rest, pad_value)
        placed = _scatter_rows(vals, dest, base)[:-1]
        return torch.where(nan_rows.view((-1,) + (1,) * len(rest)), NAN, placed)

    out = place(out, 0.0, (h_q, d))
    lse_rows = place(lse, NEG_INF, (h_q,)).t()
    probs_rows = None if probs is None else place(probs, 0.0, (h_q, max_seqlen_kv))
    return out, lse_rows, _probs_or_empty(probs_rows, q)


def _ceil_log2(n: torch.Tensor) -> torch.Tensor:
    """ceil(log2(n)) of int64 n >= 1, exactly (int arithmetic; float log2 rounds near 2^k)."""
    e = torch.zeros_like(n)
    m = n - 1
    for shift in (32, 16, 8, 4, 2, 1):
        big = m >= (1 << shift)
        e = e + big * shift
        m = torch.where(big, m >> shift, m)
    return e + (m > 0)


def _group_keys(seg: Segments) -> torch.Tensor:
    """Per segment: its group in _cpu_grouped (the powers of two at or above its query and key
    counts), or -1 for a segment without queries (it writes no row)."""
    bq = _ceil_log2(seg.nq.clamp(min=1))
    bk = torch.where(seg.nkv > 0, _ceil_log2(seg.nkv.clamp(min=1)) + 1, 0)
    return torch.where(seg.nq > 0, bq * 64 + bk, -1)


def _tight_bounds(seg: Segments) -> Optional[Tuple[int, int]]:
    """(largest query count, largest key count) of a CPU call whose segments are all valid and
    alike enough that one batch padded to those counts costs at most twice the grouped work
    (_cpu_grouped); None when the grouped form pays (ragged counts, or a bad segment, whose
    NaN rows only the grouped form places exactly without the bound-sized slots). Reads the
    counts on the host (free on the CPU)."""
    b = seg.nq.numel()
    if b == 0 or bool(seg.bad.any()):
        return None
    mq, width = max(int(seg.nq.max()), 1), max(int(seg.nkv.max()), 1)
    key = _group_keys(seg)
    bq, bk = key // 64, key % 64
    grouped = int(torch.where(key >= 0, (1 << bq) * (1 << (bk - 1).clamp(min=0)), 0).sum())
    return (mq, width) if b * mq * width <= 2 * grouped + 64 * b else None


def _cpu_grouped(q, k, v, seg: Segments, scale: float, compute, return_lse: bool,
                 inference: bool):
    """(out, lse, empty probs) of a THD call under the tiled contract on CPU tensors, with time
    and memory proportional to the rows and (query, key) pairs that exist, whatever the bounds.

    The padded batch is ``[b, max_q]`` queries by ``max_kv`` keys: with a generous bound (a
    server's ``max_candidates=8192`` for 64 candidates, or every user's bound taken from the
    total row count) nearly all of it is padding, and with ragged counts even the data's own
    largest counts pad most segments many times over. Here the segments are grouped by the
    powers of two at or above their query and key counts (a host read of the counts: free on
    the CPU), and each group is padded only to its own largest counts, so every group's padded
    work is under 4x its (query, key) pairs. Each group runs the padded batch's formulations
    (_attend_inference without a gradient, _attend_general with one), so NaN isolation and
    gradients are the same; the rows are then placed by the contract's rules (padding rows
    0 / -inf, a bad segment's rows NaN; the caller counts it). Differentiable: gathers and
    the final placement are index ops."""
    total_q, h_q, d = q.shape
    total_kv = k.shape[0]
    dev = q.device
    nq, nkv = seg.nq, seg.nkv
    key = _group_keys(seg)
    order = torch.argsort(key, stable=True)
    keys, counts = torch.unique_consecutive(key[order], return_counts=True)
    outs, lses, dests = [], [], []
    at = 0
    for kk, n in zip(keys.tolist(), counts.tolist()):
        idx = order[at:at + n]
        at += n
        if kk < 0:
            continue  # segments without queries write no row
        nq_g, nkv_g = nq[idx], nkv[idx]
        mq_g, w_g = int(nq_g.max()), int(nkv_g.max())
        q_rows = _q_rows(seg.q_start[idx], mq_g, total_q)
        keep = torch.arange(mq_g, device=dev) < nq_g.unsqueeze(1)  # [n, mq_g]
        if w_g == 0:  # no keys: out 0, lse -inf (nothing to differentiate)
            rows = int(nq_g.sum())
            outs.append(q.new_zeros((rows, h_q, d)))
            lses.append(q.new_full((rows, h_q), NEG_INF, dtype=torch.float32))
            dests.append(q_rows[keep])
            continue
        qp = _gather_rows(q, q_rows)
        slot = torch.arange(w_g, device=dev).unsqueeze(0)
        if inference:
            # padded slots repeat the segment's last key: never another segment's row
            slot = torch.minimum(slot, (nkv_g - 1).clamp(min=0).unsqueeze(1))
        k_rows = (seg.k_start[idx].unsqueeze(1) + slot).clamp(0, max(total_kv - 1, 0))
        kp, vp = _gather_rows(k, k_rows), _gather_rows(v, k_rows)
        if inference:
            o, lse = _attend_inference(qp, kp, vp, nkv_g, scale, compute, return_lse)
            if lse is None:
                lse = o.new_zeros(o.shape[:-1], dtype=torch.float32)
        else:
            o, lse, _ = _attend_general(qp, kp, vp, nq_g, nkv_g, scale, compute)
        outs.append(o[keep].to(q.dtype))
        lses.append(lse[keep].to(torch.float32))
        dests.append(q_rows[keep])
    dest = torch.cat(dests) if dests else torch.zeros(0, dtype=torch.long, device=dev)
    out = q.new_zeros((total_q, h_q, d))
    lse = q.new_full((total_q, h_q), NEG_INF, dtype=torch.float32)
    if dests:
        out = out.index_put((dest,), torch.cat(outs))
        lse = lse.index_put((dest,), torch.cat(lses))
    if bool(seg.bad.any()):
        # the contract's NaN rows: every row a bad segment names, and rows neither padding nor
        # written by a valid segment (only possible beside a bad segment); O(total_q + b)
        rows_all = torch.arange(total_q, device=dev)
        padding = (rows_all < seg.pad_lead) | (rows_all >= seg.pad_tail)
        written = torch.zeros(total_q, dtype=torch.bool, device=dev)
        written[dest] = True
        lo, hi = seg.nan_lo[seg.bad], seg.nan_hi[seg.bad]
        named = lo < hi
        delta = torch.zeros(total_q + 1, dtype=torch.long, device=dev)
        delta.index_add_(0, lo[named], torch.ones_like(lo[named]))
        delta.index_add_(0, hi[named], -torch.ones_like(hi[named]))
        nan_rows = (delta.cumsum(0)[:total_q] > 0) | ~(written | padding)
        out = torch.where(nan_rows.view(-1, 1, 1), NAN, out)
        lse = torch.where(nan_rows.view(-1, 1), NAN, lse)
    return out, lse.t(), q.new_empty((0,), dtype=torch.float32)


def _one_query_chunk(q_c, kc, vc, out_c, scale: float) -> None:
    """One query per segment, a chunk of n segments whose every key slot holds a key: q_c
    [n, h_kv, group, d], kc / vc [n, width, h_kv, d] (views of THD rows); writes out_c
    [n, h_kv, group, d].

    Elementwise products summed over d, then over the keys: every K / V element is read once, in
    its THD layout. SDPA on these shapes ([1, d] x [d, width] per head) reads K / V through
    strided head views and took 1.7x as long (docs/performance.md#fused_attn_small_seq-on-cpu)."""
    scores = (kc.unsqueeze(3) * q_c.unsqueeze(1)).sum(-1)  # [n, width, h_kv, group]
    probs = scores.mul_(scale).softmax(1)
    torch.sum(vc.unsqueeze(3) * probs.unsqueeze(-1), 1, out=out_c)


def _one_query_packed(qg, kr, vr, nkv, out_g, scale: float, width: int) -> None:
    """One query per segment over packed histories: qg [b, h_kv, group, d], kr / vr
    [R, h_kv, d] the key rows of every segment back to back (segment i's keys are rows
    ``sum(nkv[:i]) ..`` of kr, nkv[i] <= width of them, no gaps); writes out_g
    [b, h_kv, group, d], 0 for a segment without keys.

    Per chunk of segments (about CPU_ONE_QUERY_CHUNK_BYTES of products), no K / V gather: each
    key row gets its segment's q rows (one index_select of q), scores are q times the key summed
    over d ([rows, h_q]); the softmax over a segment's keys runs on the scores put into a small
    [n, h_q, width] buffer of -inf (softmax over its last, contiguous dim) and taken back per
    row; out is the sum over each segment's rows of p times the value (index_add_). Every value
    a segment reads is its own (the -inf slots never come back, the sum names only its rows), so
    a non-finite key or value stays in its segment
    (docs/performance.md#fused_attn_small_seq-on-cpu)."""
    b, h_kv, group, d = qg.shape
    h_q = h_kv * group
    total = kr.shape[0]
    rows_per_chunk = max(CPU_CHUNK_MIN_SEGMENTS * width,
                         CPU_ONE_QUERY_CHUNK_BYTES // (h_q * d * qg.element_size()))
    ends = torch.cumsum(nkv, 0)
    # chunks cut where the rows pass each multiple of rows_per_chunk, and at least every
    # rows_per_chunk segments (bounds the score buffer when many histories are empty)
    marks = torch.tensor(range(rows_per_chunk, total, rows_per_chunk), dtype=ends.dtype)
    cuts = torch.searchsorted(ends, marks, right=True)
    bounds = sorted(set(cuts.tolist()).union(range(0, b, rows_per_chunk))) + [b]
    row_bounds = torch.cat([ends.new_zeros(1), ends])[bounds].tolist()
    seg_of_row = torch.repeat_interleave(torch.arange(b), nkv, output_size=total)
    slot = torch.arange(total) - torch.repeat_interleave(ends - nkv, nkv, output_size=total)
    # (row, q head) -> its score's place in a [b, h_q, width] layout; each chunk's buffer holds
    # its own segments' part
    stride = h_q * width
    place = torch.add(slot, seg_of_row, alpha=stride)
    head = torch.arange(h_q) * width
    prod_buf = qg.new_empty((max(r1 - r0 for r0, r1 in zip(row_bounds, row_bounds[1:])),
                             h_kv, group, d))
    score_buf = qg.new_empty(max(e - s for s, e in zip(bounds, bounds[1:])) * h_q * width)
    for s, e, r0, r1 in zip(bounds, bounds[1:], row_bounds, row_bounds[1:]):
        out_g[s:e].zero_()
        if r1 == r0:
            continue
        rows = seg_of_row[r0:r1]
        pos_c = (place[r0:r1] - s * stride).unsqueeze(1) + head  # [rows, h_q]
        prod = torch.index_select(qg, 0, rows, out=prod_buf[:r1 - r0])
        scores = prod.mul_(kr[r0:r1].unsqueeze(2)).sum(-1).mul_(scale)  # [rows, h_kv, group]
        padded = score_buf[:(e - s) * h_q * width].fill_(NEG_INF)
        padded.put_(pos_c, scores)
        p = padded.view(e - s, h_q, width).softmax(-1).take(pos_c)  # [rows, h_q]
        torch.mul(vr[r0:r1].unsqueeze(2), p.view(r1 - r0, h_kv, group, 1), out=prod)
        out_g.index_add_(0, rows, prod)


def _cpu_inference(q, k, v, seg: Segments, thd: bool, one_query: bool, mq: int, width: int,
                   scale: float, compute, return_lse: bool):
    """(out, lse or empty, empty probs) of an inference call on CPU tensors, computed chunk by
    chunk of segments, or None when this call needs the general path (a bad segment, no k/v
    rows).

    Reading offsets on the host is free on the CPU. With every segment valid, the query rows of
    consecutive segments are consecutive (one_query: segment i is row i), so each chunk's
    results are copied to one slice of the output; padded k/v go to one reused buffer per
    chunk (CPU_CHUNK_BYTES), which SDPA reads while it is still in the caches."""
    if k.numel() == 0 or bool(seg.bad.any()):
        return None
    b = seg.bad.numel()
    h_q, d = q.shape[-2], q.shape[-1]
    h_kv = k.shape[-2]
    elem = torch.tensor([], dtype=compute).element_size()
    per_segment = (mq * h_q + 2 * width * h_kv) * d * elem
    n_chunk = max(CPU_CHUNK_MIN_SEGMENTS, CPU_CHUNK_BYTES // max(per_segment, 1))
    if thd:
        k_rows_of, v_rows_of = k, v
        kv_start = seg.k_start
    else:  # BSHD: rows batch * s_kv + j of k viewed as [b * s_kv, h_kv, d]
        s_kv = k.shape[1]
        k_rows_of = k.reshape((-1,) + tuple(k.shape[2:]))
        v_rows_of = v.reshape((-1,) + tuple(v.shape[2:]))
        kv_start = torch.arange(b) * s_kv
    maybe_empty = bool((seg.nkv == 0).any())
    # each history starts where the previous one ends (always in THD; in BSHD only when every
    # batch row but the last is full)
    back_to_back = torch.equal(kv_start[1:], kv_start[:-1] + seg.nkv[:-1])
    # every segment full and back to back (fixed-length histories): each chunk's k/v are views
    # of k/v, no gather
    packed_full = not maybe_empty and bool((seg.nkv == width).all()) and back_to_back
    if thd and not one_query:
        total_q = q.shape[0]
        lead, tail = int(seg.pad_lead), int(seg.pad_tail)
        # every segment valid: its rows follow the previous segment's (lead = cu_seqlens_q[0])
        cu = [lead] + (lead + torch.cumsum(seg.nq, 0)).tolist()
        out = q.new_empty((total_q, h_q, d))
        out[:lead].zero_()
        out[tail:].zero_()
        lse = q.new_full((total_q, h_q), NEG_INF, dtype=torch.float32) if return_lse else None
        keep_q = torch.arange(mq).unsqueeze(0) < seg.nq.unsqueeze(1)  # [b, mq]
    else:
        out = q.new_empty(q.shape)
        lse = q.new_empty((b * mq, h_q), dtype=torch.float32) if return_lse else None
    none = q.new_empty((0,), dtype=torch.float32)  # the lse / probs this call does not return
    if one_query and not return_lse and q.dtype == compute:
        # one query per segment, inference: products on K / V read in their THD rows, no gather
        # (docs/performance.md#fused_attn_small_seq-on-cpu)
        group = h_q // h_kv
        qg = q.view(b, h_kv, group, d)
        out_g = out.view(b, h_kv, group, d)
        r0 = int(kv_start[0])
        if packed_full:
            # full histories: chunks of segments small enough that the products stay in the
            # caches (CPU_ONE_QUERY_CHUNK_BYTES), K / V as views; the row-wise form below took
            # 1.2x as long here (a q gather and a segment sum more)
            per_seg = width * h_q * d * elem
            segs = max(CPU_CHUNK_MIN_SEGMENTS, CPU_ONE_QUERY_CHUNK_BYTES // max(per_seg, 1))
            for s in range(0, b, segs):
                e = min(b, s + segs)
                n = e - s
                kc = k_rows_of[r0 + s * width:r0 + e * width].view(n, width, h_kv, d)
                vc = v_rows_of[r0 + s * width:r0 + e * width].view(n, width, h_kv, d)
                _one_query_chunk(qg[s:e], kc, vc, out_g[s:e], scale)
            return out, none, none
        if back_to_back:
            # ragged histories packed back to back: products on the key rows
            # (_one_query_packed); histories with gaps (BSHD) gather below
            total = int(seg.nkv.sum())
            _one_query_packed(qg, k_rows_of[r0:r0 + total], v_rows_of[r0:r0 + total], seg.nkv,
                              out_g, scale, width)
            return out, none, none
    if packed_full and not return_lse and not (thd and not one_query):
        # no gather: one SDPA call over every segment, k/v as views
        kc = k_rows_of[int(kv_start[0]):int(kv_start[0]) + b * width].view(b, width, h_kv, d)
        vc = v_rows_of[int(kv_start[0]):int(kv_start[0]) + b * width].view(b, width, h_kv, d)
        qc = q.view(b, mq, h_q, d)
        o = F.scaled_dot_product_attention(
            _fold_heads(qc.to(compute), h_kv), kc.to(compute).transpose(1, 2),
            vc.to(compute).transpose(1, 2), scale=scale)
        o = _unfold_heads(o, mq, h_q).view(out.shape)
        if o.dtype == out.dtype and o.is_contiguous():
            out = o  # one query per segment: SDPA's output is already out's layout, no copy
        else:
            out.copy_(o)
        return out, none, none
    # the paths below gather each chunk's keys (unless packed_full) and mask the padded slots
    last = (seg.nkv - 1).clamp(min=0).unsqueeze(1)
    slot = torch.arange(width).unsqueeze(0)
    # padded slots repeat the segment's last key (never another segment's row)
    k_rows = (kv_start.unsqueeze(1) + torch.minimum(slot, last)).clamp(0, k_rows_of.shape[0] - 1)
    kbuf = k.new_empty((n_chunk * width,) + tuple(k.shape[-2:]))
    vbuf = v.new_empty((n_chunk * width,) + tuple(v.shape[-2:]))
    mask = (slot < seg.nkv.unsqueeze(1)).view(b, 1, 1, width)
    empty = (seg.nkv == 0).view(b, 1, 1, 1)
    if not return_lse and not packed_full and (one_query or not thd) and q.dtype == compute:
        # the common inference call, with as few ops per chunk as it takes (Python's cost per
        # op is comparable to a small chunk's work): chunks cut up front by split()
        qf = _fold_heads(q.view(b, mq, h_q, d), h_kv)  # a view for one query per segment
        out_f = out.view(b, mq, h_q, d)
        for rows_c, q_c, mask_c, empty_c, out_c in zip(
                k_rows.view(-1).split(n_chunk * width), qf.split(n_chunk), mask.split(n_chunk),
                empty.split(n_chunk), out_f.split(n_chunk)):
            n = q_c.shape[0]
            kc = torch.index_select(k_rows_of, 0, rows_c, out=kbuf[:n * width])
            vc = torch.index_select(v_rows_of, 0, rows_c, out=vbuf[:n * width])
            o = F.scaled_dot_product_attention(
                q_c, kc.view(n, width, h_kv, d).transpose(1, 2),
                vc.view(n, width, h_kv, d).transpose(1, 2), attn_mask=mask_c, scale=scale)
            if maybe_empty:
                o = torch.where(empty_c, o.new_zeros(()), o)
            out_c.copy_(_unfold_heads(o, mq, h_q))
        return out, none, none
    for s in range(0, b, n_chunk):
        e = min(b, s + n_chunk)
        n = e - s
        if packed_full:
            r0 = int(kv_start[s])
            kc, vc = k_rows_of[r0:r0 + n * width], v_rows_of[r0:r0 + n * width]
        else:
            kc = torch.index_select(k_rows_of, 0, k_rows[s:e].reshape(-1), out=kbuf[:n * width])
            vc = torch.index_select(v_rows_of, 0, k_rows[s:e].reshape(-1), out=vbuf[:n * width])
        kc = kc.view(n, width, h_kv, d)
        vc = vc.view(n, width, h_kv, d)
        if not thd:
            qc = q[s:e]
        elif one_query:
            qc = q[s:e].unsqueeze(1)
        elif cu[e] - cu[s] == n * mq:  # every segment of the chunk has max_q queries
            qc = q[cu[s]:cu[e]].view(n, mq, h_q, d)
        else:
            qc = _gather_rows(q, seg.q_rows[s:e])
        if return_lse:
            o, lc = _attend_inference(qc, kc, vc, seg.nkv[s:e], scale, compute, True,
                                      maybe_empty)
        else:  # the same as _attend_inference, with the mask cut from one built up front
            o = F.scaled_dot_product_attention(
                _fold_heads(qc.to(compute), h_kv), kc.to(compute).transpose(1, 2),
                vc.to(compute).transpose(1, 2), attn_mask=mask[s:e], scale=scale)
            if maybe_empty:
                o = torch.where(empty[s:e], o.new_zeros(()), o)
            o = _unfold_heads(o, mq, h_q)
        if thd and not one_query:
            if cu[e] - cu[s] == n * mq:
                out[cu[s]:cu[e]] = o.reshape(n * mq, h_q, d)
                if lse is not None:
                    lse[cu[s]:cu[e]] = lc.reshape(n * mq, h_q)
                continue
            keep = keep_q[s:e].reshape(-1)
            out[cu[s]:cu[e]] = o.reshape(n * mq, h_q, d)[keep]
            if lse is not None:
                lse[cu[s]:cu[e]] = lc.reshape(n * mq, h_q)[keep]
        else:
            out[s:e] = o.view(out[s:e].shape)
            if lse is not None:
                lse[s * mq:e * mq] = lc.reshape(n * mq, h_q)
    return out, lse.t() if lse is not None else none, none


def _probs_or_empty(probs, q):
    if probs is not None:
        return probs
    return q.new_empty((0,), dtype=torch.float32)
