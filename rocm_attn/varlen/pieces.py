"""Step metadata of windowed / chunked attention: every (q segment x kv segment) rectangle of
every sequence cut into the pieces of :mod:`~rocm_attn.varlen.bands`, one varlen call per piece
kind and group of rectangles with disjoint q rows (the ``packed_kv_rows`` contract of
:class:`~rocm_attn.varlen.meta.StepMeta`), optionally addressed to whole tensors
(:class:`~rocm_attn.varlen.meta.DirectCall`).

The rectangles come from the caller: ``rocm_attn.attention`` has one per call (whole
sequences, :func:`whole_sequence_meta`); context parallelism has the dual-chunk halves of a
ring step or an all-gather (:mod:`rocm_attn.cp.steps`).
"""

from __future__ import annotations

from typing import List, NamedTuple, Optional, Tuple

import torch

from .bands import MaskSpec, Segment, pair_slots, piece_mask, piece_ranges, pieces_for, slot_bound
from .meta import DirectCall, StepMeta, cu_from_lens
from .packed import packed_rows

__all__ = ["Pair", "piece_metas", "whole_sequence_meta", "whole_sequence_metas",
           "top_left_pairs", "direct_call", "with_direct_packed", "ROW_ORDER"]


class Pair(NamedTuple):
    """One (q segment x kv segment) rectangle of every sequence, with host bounds."""

    q_name: str  # which q rows: pairs of one call must have different q names
    kv_name: str  # which kv rows ("first" / "second" half of a ring step's kv, else one name)
    q: Segment
    kv: Segment
    relation: str  # bands.RELATIONS
    distance: Optional[int]  # dual-chunk halves: |chunk index difference|; None otherwise
    q_max: int  # bound of one sequence's q segment rows
    q_total: int  # bound of the sum of q segment rows over the sequences
    kv_max: int
    kv_total: int


def _cover(start: torch.Tensor, length: torch.Tensor, rows: int):
    """Sub-sequences ``[start_i, start_i + len_i)`` as a ``thd.copy_valid_tokens`` layout:
    ``(cu, starts)`` int32 ``[m+1]``, cumulative lengths and starts followed by ``rows``."""
    cu = torch.cat([length.new_zeros(1), torch.cumsum(length, 0)]).to(torch.int32)
    return cu, torch.cat([start, start.new_full((1,), rows)]).to(torch.int32)


def _covered_rows(cu: torch.Tensor, starts: torch.Tensor, bound: int, rows: int):
    """``(src, dst)`` int64 ``[bound]``: the rows of a :func:`_cover` in order, then slack
    (``src`` clamped, ``dst`` = the dummy row ``rows``): a packed row map."""
    m = packed_rows(cu, starts, bound, rows)
    return m.src, m.targets


def direct_call(q_start: torch.Tensor, q_len: torch.Tensor, kv_start: torch.Tensor,
                kv_len: torch.Tensor, q_rows: int, kv_rows: int, q_bound: int,
                kv_bound: int) -> DirectCall:
    """:class:`DirectCall` of sub-sequences ``[start, start + len)`` (int64 ``[m]``, any order;
    once sorted by q start their q ranges **and kv ranges** must be disjoint and increasing,
    which the callers guarantee by construction). ``*_bound``: host bounds of the covered rows."""
    # a sub-sequence without queries or without keys contributes nothing: drop it (it sits
    # empty at row 0, sorted first)
    live = (q_len > 0) & (kv_len > 0)
    key = torch.where(live, 2 * q_start + 1, torch.zeros_like(q_start))
    order = torch.sort(key, stable=True).indices
    live = live[order]
    qs, ql, ks, kl = (torch.where(live, x[order], torch.zeros_like(x))
                      for x in (q_start, q_len, kv_start, kv_len))

    def bounds(start, length, rows):
        end = start + length
        prev_end = torch.cat([end.new_zeros(1), end])  # end of sub-sequence i-1 (0 before)
        nxt = torch.cat([start, start.new_full((1,), rows)])  # start of i (rows after the last)
        return prev_end, nxt

    qe, qn = bounds(qs, ql, q_rows)
    ke, kn = bounds(ks, kl, kv_rows)
    cu_q = torch.stack([qe, qn, qn], 1).flatten()
    cu_kv = torch.stack([ke, ke, kn], 1).flatten()
    cu_q = torch.cat([cu_q, cu_q.new_full((1,), q_rows)]).to(torch.int32)
    cu_kv = torch.cat([cu_kv, cu_kv.new_full((1,), kv_rows)]).to(torch.int32)
    q_cover, kv_cover = _cover(qs, ql, q_rows), _cover(ks, kl, kv_rows)
    q_src, q_dst = _covered_rows(*q_cover, max(1, q_bound), q_rows)
    kv_src, kv_dst = _covered_rows(*kv_cover, max(1, kv_bound), kv_rows)
    return DirectCall(cu_q, cu_kv, q_src, q_dst, kv_src, kv_dst, q_rows, kv_rows,
                      *q_cover, *kv_cover)


def with_direct_packed(meta: StepMeta, q_rows: int, kv_rows: int) -> StepMeta:
    """A packed-contract ``meta`` (``packed_kv_rows`` set) with its :class:`DirectCall` over
    tensors of ``q_rows`` / ``kv_rows`` rows; its sorted q and kv ranges must both be increasing
    (the groups of :func:`group_direct`)."""
    q_len = (meta.cu_seqlens_q[1:] - meta.cu_seqlens_q[:-1]).long()
    kv_len = (meta.cu_seqlens_kv[1:] - meta.cu_seqlens_kv[:-1]).long()
    q_start = meta.cu_seqlens_q_padded[:-1].long()
    kv_start = meta.cu_seqlens_kv_padded[:-1].long()
    q_bound, kv_bound = meta.packed_q_rows or q_rows, meta.packed_kv_rows
    return meta._replace(direct=direct_call(q_start, q_len, kv_start, kv_len, q_rows, kv_rows,
                                            min(q_bound, q_rows), min(kv_bound, kv_rows)))


def _group_by_q(pairs: List[Pair]) -> List[List[Pair]]:
    """Split pairs into groups with pairwise different q segments (q rows of a call must be
    disjoint, kv rows may repeat), first fit in order."""
    groups: List[List[Pair]] = []
    for p in pairs:
        for g in groups:
            if all(o.q_name != p.q_name for o in g):
                g.append(p)
                break
        else:
            groups.append([p])
    return groups


# Row order of the pair names within every sequence of a step tensor: the q halves "A" / "B"
# and the kv halves "first" / "second" of a rank-local sequence (the names cp.steps gives its
# pairs). Pairs with other names have no order and never share a direct call.
ROW_ORDER = {"A": 0, "B": 1, "first": 0, "second": 1}


def group_direct(pairs: List[Pair]) -> List[List[Pair]]:
    """Split pairs into groups a :class:`DirectCall` can serve: per sequence, the q segments of
    a group in row order must have their kv segments in row order too, all distinct (so that
    sorted q ranges come with disjoint increasing kv ranges), first fit in order."""
    def fits(group, p):
        members = sorted(group + [p], key=lambda x: ROW_ORDER.get(x.q_name, 0))
        qs = [ROW_ORDER.get(x.q_name, -1) for x in members]
        kvs = [ROW_ORDER.get(x.kv_name, -1) for x in members]
        return (len(set(x.q_name for x in members)) == len(members)
                and len(set(x.kv_name for x in members)) == len(members)
                and min(qs + kvs) >= 0 and kvs == sorted(kvs))

    groups: List[List[Pair]] = []
    for p in pairs:
        for g in groups:
            if fits(g, p):
                g.append(p)
                break
        else:
            groups.append([p])
    return groups


def piece_metas(spec: MaskSpec, pairs: List[Pair], kind: str, kv_rank: int, q_layout: str,
                kv_layout: str, direct_rows: Optional[Tuple[int, int]] = None
                ) -> List[StepMeta]:
    """One call per piece kind and group of pairs; with ``direct_rows`` (the q / kv tensors'
    rows) grouped and annotated for :class:`DirectCall`."""
    metas = []
    group_by = group_direct if direct_rows is not None else _group_by_q
    for piece in ("native", "diag", "rev", "full"):
        with_piece = [p for p in pairs if piece in pieces_for(p.relation, spec)]
        for group in group_by(with_piece):
            meta = _calls_meta(spec, piece, group, f"{kind}:{piece}", kv_rank, q_layout,
                               kv_layout)
            if direct_rows is not None:
                meta = with_direct_packed(meta, *direct_rows)
            metas.append(meta)
    return metas


def _piece_rows(piece: str, pair: Pair, spec: MaskSpec):
    """Per-slot (q start row, q rows, kv start row, kv rows) of one piece of one pair."""
    b = pair.q.n.numel()
    slots = pair_slots(pair.q, pair.kv, spec.chunk, slot_bound(pair.q_total, b, spec.chunk))
    r0, r1, s0, s1 = piece_ranges(piece, slots, spec)

    def ext(v):
        return torch.cat([v, v.new_zeros(1)])[slots.seq]

    q_len, kv_len = r1 - r0, s1 - s0
    live = q_len > 0
    q_start = torch.where(live, ext(pair.q.row) + (r0 - ext(pair.q.pos)), torch.zeros_like(r0))
    kv_start = torch.where(live, ext(pair.kv.row) + (s0 - ext(pair.kv.pos)),
                           torch.zeros_like(s0))
    return q_start, q_len, kv_start, kv_len


def _calls_meta(spec: MaskSpec, piece: str, pairs: List[Pair], kind: str, kv_rank: int,
                q_layout: str, kv_layout: str) -> StepMeta:
    """One call over ``piece`` of every pair (slots of the pairs concatenated)."""
    parts = [_piece_rows(piece, p, spec) for p in pairs]
    q_start, q_len, kv_start, kv_len = (torch.cat([x[i] for x in parts]) for i in range(4))
    cap = spec.chunk if spec.chunk is not None else None
    max_q = max(p.q_max for p in pairs)
    max_kv = max(p.kv_max for p in pairs)
    if cap is not None:
        max_q, max_kv = min(max_q, cap), min(max_kv, cap)
    mask, window = piece_mask(piece, spec)
    end = q_start.new_zeros(1)  # the last *_padded entry is unused in this contract
    q_rows = sum(_piece_q_bound(piece, p, spec) for p in pairs)
    kv_rows = sum(_piece_kv_bound(piece, p, spec) for p in pairs)
    return StepMeta(
        kind=kind, q_layout=q_layout, kv_layout=kv_layout, kv_rank=kv_rank,
        cu_seqlens_q=cu_from_lens(q_len), cu_seqlens_kv=cu_from_lens(kv_len),
        cu_seqlens_q_padded=torch.cat([q_start, end]).to(torch.int32),
        cu_seqlens_kv_padded=torch.cat([kv_start, end]).to(torch.int32),
        max_seqlen_q=max_q, max_seqlen_kv=max_kv, attn_mask_type=mask, window_size=window,
        packed_kv_rows=max(1, kv_rows),
        packed_q_rows=max(1, q_rows))


def _piece_q_bound(piece: str, pair: Pair, spec: MaskSpec) -> int:
    """Host bound of the rows one piece covers over all sequences. Rows that see keys lying
    entirely before them are within ``reach("left")`` of the keys' end, rows that see keys
    after them within ``reach("right")`` of their start; the tail rows of a ``whole`` pair
    (``rev`` / ``full``) lie in ``[k1 - R, k1 + L)``. Everything else: the q segment."""
    b = pair.q.n.numel()
    slots = slot_bound(pair.q_total, b, spec.chunk)
    if pair.relation == "before":
        reach = spec.reach("left")
    elif pair.relation == "after":
        reach = spec.reach("right")
    elif pair.relation == "whole" and piece in ("rev", "full") and spec.left is not None \
            and spec.right is not None:
        reach = spec.left + spec.right
    else:
        reach = None
    return pair.q_total if reach is None else min(pair.q_total, slots * reach)


def _piece_kv_bound(piece: str, pair: Pair, spec: MaskSpec) -> int:
    """Host bound of the keys one piece reads over all sequences: the kv segment, or less when
    the window bounds it (per slot, a piece's keys span its rows plus the window reach:
    ``native`` rows + L (its keys end with its rows), ``diag`` rows + L + R, ``rev`` at most its
    rows, ``full`` L + R)."""
    b = pair.q.n.numel()
    slots = slot_bound(pair.q_total, b, spec.chunk)
    rows = _piece_q_bound(piece, pair, spec)
    left = spec.left
    right = 0 if spec.right is None else spec.right
    if piece == "rev":
        bound = rows
    elif left is None or (spec.right is None and piece == "full"):
        bound = pair.kv_total
    elif piece == "native":  # aligned: the keys end with the rows
        bound = rows + slots * left
    elif piece == "diag":
        bound = rows + slots * (left + right)
    else:  # full
        bound = slots * (left + right)
    return min(pair.kv_total, bound)


def whole_sequence_meta(spec: MaskSpec, q: Segment, kv: Segment, max_q: int, max_kv: int,
                        q_total: int, kv_total: int, kind: str) -> StepMeta:
    """One call over whole sequences (aligned rectangles: ``q.pos + q.n == kv.pos + kv.n``):
    the user's window as is, chunking as one sub-sequence per chunk. Used by a2a and by
    :func:`rocm_attn.attention`."""
    pair = Pair("Q", "K", q, kv, "aligned", None, max_q, q_total, max_kv, kv_total)
    return _calls_meta(spec, "native", [pair], f"{kind}:native", -1, "global", "global")




def top_left_pairs(name: str, q: Segment, kv: Segment, q_max: int, q_total: int, kv_max: int,
                   kv_total: int) -> List[Pair]:
    """A q segment at **top-left** positions (query ``i`` of a sequence at ``p = i``) against
    the whole kv sequence (positions from 0), under a causal mask: the rows before the kv end
    (relation ``whole``: its causal ``diag`` piece stops at the last key) and the rows past it
    (``before``: they see every key their window reaches), which exist only when a sequence
    has more queries than keys. Pair names: ``name`` and ``name + "+"``."""
    k1 = kv.pos + kv.n
    past = torch.maximum(q.pos, k1)
    n_past = (q.pos + q.n - past).clamp(min=0)
    tail = Segment(past, n_past, q.row + (past - q.pos))
    return [Pair(name, "K", q, kv, "whole", None, q_max, q_total, kv_max, kv_total),
            Pair(name + "+", "K", tail, kv, "before", None, q_max, q_total, kv_max, kv_total)]


def whole_sequence_metas(spec: MaskSpec, q: Segment, kv: Segment, max_q: int, max_kv: int,
                         q_total: int, kv_total: int, kind: str, top_left: bool
                         ) -> List[StepMeta]:
    """The calls over whole sequences: :func:`whole_sequence_meta` (bottom-right alignment,
    ``q.pos = n_kv - n_q``), or with ``top_left`` (``q.pos = 0``, causal) the pieces of
    :func:`top_left_pairs`."""
    if not top_left:
        return [whole_sequence_meta(spec, q, kv, max_q, max_kv, q_total, kv_total, kind)]
    pairs = top_left_pairs("Q", q, kv, max_q, q_total, max_kv, kv_total)
    return piece_metas(spec, pairs, kind, -1, "global", "global")
