"""Per-step attention metadata of context-parallel attention: the one place that says, for every
attention call a comm type makes, which rows of which tensor attend to which, under which mask.

A comm type (``p2p.py``, ``all_gather.py``, ``a2a.py``) never computes ranges itself: it asks
this module for a :class:`~rocm_attn.varlen.meta.StepMeta` per attention call, materialises the
q / kv tensors the meta names (``q_layout`` / ``kv_layout``), hands both to a per-step backend
(:mod:`rocm_attn.varlen.backends`)
and folds the result back with :mod:`rocm_attn.thd` helpers (or, for windowed / chunked
steps, merges packed results by index: :mod:`~rocm_attn.varlen.packed`).

Geometry (dual-chunk sharding, docs/design.md#dual-chunk-geometry)
------------------------------------------------
Sequence ``i`` has ``n_i`` valid tokens (from ``cu_seqlens``) in a padded slot of ``L_i``
tokens (from ``cu_seqlens_padded``; padding at the end of the slot), ``L_i % (2*cp) == 0``.
The slot is cut into ``2*cp`` chunks of ``H_i = L_i / (2*cp)``; rank ``r`` holds chunk ``r``
(its *first half*) then chunk ``2*cp-1-r`` (its *second half*). Since padding sits at the end of
the slot, chunk ``c`` holds ``clamp(n_i - c*H_i, 0, H_i)`` valid tokens at its start, and the
valid tokens of a rank-local sequence are always a prefix of it (the second half has valid
tokens only when the first half is full). Every step therefore describes each sub-sequence by a
start row in the step's tensor (``cu_seqlens_*_padded``) and a count of valid rows from there
(``cu_seqlens_*``), the convention of :func:`rocm_attn.reference.reference_attention`; padding
rows are never read.

Step kinds
----------
* p2p, causal (:func:`ring_step_meta`), kv from ``kv_rank = (rank - step) % cp``
  (:func:`rocm_attn.thd.ring_step`):

  - ``diagonal`` (``kv_rank == rank``): q = kv = the full local tensors, ``causal``. In local
    order ``[chunk r, chunk 2cp-1-r]`` causal is exactly the global causal mask restricted to
    these tokens (chunk ``r`` sees itself causally, chunk ``2cp-1-r`` sees all of chunk ``r``).
  - ``below`` (``kv_rank < rank``): q = full local, kv = the first half of kv_rank (chunk
    ``kv_rank``, before both q chunks), ``no_mask``.
  - ``above`` (``kv_rank > rank``): q = the second half (chunk ``2cp-1-r``, after both kv
    chunks), kv = the full kv of kv_rank, ``no_mask``; merged with ``only_second_half``.

  Every rank does the same work per step (``below`` and ``above`` both compute half of a full
  local block), which is the point of dual-chunk sharding.
* p2p, no mask: every step is ``full`` (full q, full kv of kv_rank, ``no_mask``).
* all_gather (:func:`all_gather_step_metas`), kv = the all-gathered, reordered (global) kv:
  causal: two steps ``first_half`` / ``second_half`` (q = one half, its chunk ``c``) attending
  to the global kv prefix it may see, ``causal`` with the bottom-right offset that puts the
  chunk at its global position; no mask: one ``full`` step.
* a2a (:func:`a2a_step_meta`): one ``global`` step over whole sequences (a head group).

Windows and chunking (:func:`ring_step_metas`, and the masked branches of the two others)
-----------------------------------------------------------------------------------------
* p2p, causal chunked without window: one call per step from
  :func:`rocm_attn.thd.chunkify_ring_step` (runs of one chunk id), clipped to valid tokens.
* anything else with a window or chunking: every step is a set of (q segment x kv segment)
  rectangles per sequence (p2p: the two q halves x the two kv halves, related by their chunk
  order; all_gather: the two q halves x the whole kv sequence; a2a: whole sequences), cut into
  the pieces of :mod:`~rocm_attn.varlen.bands`; one call per piece kind and set of pairs with
  disjoint q rows (``packed_kv_rows`` contract). Pairs the mask cannot reach for sequences of
  ``plan.min_seqlen`` tokens are dropped on the host (:func:`rocm_attn.varlen.bands.reachable`); a
  ring step left without pairs runs no attention.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, List, NamedTuple, Optional, Tuple

import torch

from .. import thd
from ..varlen.bands import MaskSpec, Segment, reachable
from ..varlen.meta import StepMeta, cu_from_lens
from ..varlen.pieces import (Pair, direct_call, piece_metas, top_left_pairs, whole_sequence_meta,
                             whole_sequence_metas, with_direct_packed)

__all__ = [
    "CPPlan",
    "SideGeometry",
    "side_geometry",
    "ring_step_meta",
    "ring_step_metas",
    "ring_steps_run",
    "with_direct",
    "uses_direct_calls",
    "all_gather_step_metas",
    "a2a_step_meta",
    "a2a_step_metas",
]

# q_layout values: which tensor a step's q rows index
Q_LAYOUTS = ("full", "first_half", "second_half", "global")
# kv_layout values
KV_LAYOUTS = ("full", "first_half", "global")


class SideGeometry(NamedTuple):
    """Per-sequence geometry of one side (q or kv) of a CP problem (int64 device tensors)."""

    n: torch.Tensor  # [b] valid tokens of every global sequence
    H: torch.Tensor  # [b] tokens of one of its 2*cp chunks
    cu_padded: torch.Tensor  # [b+1] global padded cu_seqlens (slot starts, then the end)
    cp: int


def side_geometry(cu_seqlens: torch.Tensor, cu_seqlens_padded: torch.Tensor,
                  cp: int) -> SideGeometry:
    """Geometry of one side from its **global** ``cu_seqlens`` and ``cu_seqlens_padded``."""
    c = cu_seqlens.long()
    p = cu_seqlens_padded.long()
    n = c[1:] - c[:-1]
    H = torch.div(p[1:] - p[:-1], 2 * cp, rounding_mode="floor")
    return SideGeometry(n, H, p, cp)


@dataclass(frozen=True, eq=False)
class CPPlan:
    """Everything a comm type needs for one ``attn_with_cp`` call (built and validated by
    ``api.py``). cu_seqlens are the **global** ones; ``*_padded`` default to them."""

    group: Any
    cp: int
    rank: int
    attn_mask_type: str  # normalised: "causal" | "no_mask"
    window_size: Tuple[int, int]
    chunk_size: Optional[int]
    softmax_scale: float
    cu_seqlens_q: torch.Tensor
    cu_seqlens_kv: torch.Tensor
    cu_seqlens_q_padded: torch.Tensor
    cu_seqlens_kv_padded: torch.Tensor
    max_seqlen_q: int
    max_seqlen_kv: int
    rows_q: int  # rank-local rows of q (>= cu_seqlens_q_padded[-1] // cp; the rest is slack)
    rows_kv: int
    backend: Any  # a backends.StepBackend
    return_lse: bool  # the caller sees the LSE (so it may carry a gradient)
    geom_q: SideGeometry
    geom_kv: SideGeometry
    # promise: every sequence with a valid token has >= min_seqlen of them (0: no promise);
    # lets the ring skip steps a window or chunk cannot reach (bands.reachable)
    min_seqlen: int = 0
    # causal mask top-left aligned (Transformer Engine's "causal") on sequences whose q and kv
    # lengths may differ (where they are equal it is the bottom-right mask): all_gather and a2a
    # run the pieces of varlen.pieces.top_left_pairs
    top_left: bool = False
    # the forward also computes the per-head max logit (varlen.max_logit)
    return_max_logit: bool = False
    # step metadata computed in the forward, reused by the backward (the plan lives in the
    # autograd context); a plan derived with dataclasses.replace must get a fresh dict
    meta_cache: dict = field(default_factory=dict, compare=False, repr=False)
    # device bool: the cu_seqlens changed since a shared meta_cache was built from them (a
    # write that bypassed the version counter); the caller poisons the output. None: the cache
    # is keyed on the values themselves, or was built for this call.
    meta_stale: Optional[torch.Tensor] = field(default=None, compare=False, repr=False)

    @property
    def causal(self) -> bool:
        return self.attn_mask_type == "causal"

    @property
    def spec(self) -> MaskSpec:
        return MaskSpec.make(self.causal, self.window_size, self.chunk_size)

    @property
    def min_chunk_tokens(self) -> int:
        """Lower bound of the dual-chunk size ``H`` of every sequence with a valid token."""
        return max(1, -(-self.min_seqlen // (2 * self.cp)))

    @property
    def local_cu_q_padded(self) -> torch.Tensor:
        """Rank-local padded cu_seqlens of q (int32): for merge / read_half / grad_correction."""
        return thd.local_cu_seqlens(self.cu_seqlens_q_padded, self.cp)

    @property
    def local_cu_kv_padded(self) -> torch.Tensor:
        return thd.local_cu_seqlens(self.cu_seqlens_kv_padded, self.cp)


def _layout_starts(meta: StepMeta, side: str, g: "SideGeometry") -> torch.Tensor:
    """Start rows (int64 ``[m]``) of a core meta's sub-sequences in the **full** rank-local (or
    global) tensor. In a half tensor sequence ``i`` starts at ``hs_i = cu_padded[i] / 2cp``; in
    the full local tensor at ``2 hs_i``, its second half ``H_i`` later: a half row ``r`` of
    sequence ``i`` is full row ``r + hs_i`` (``+ H_i``)."""
    layout = meta.q_layout if side == "q" else meta.kv_layout
    starts = (meta.cu_seqlens_q_padded if side == "q" else meta.cu_seqlens_kv_padded).long()
    starts = starts[:-1]
    if layout in ("full", "global"):
        return starts
    half_starts = _starts(g, "first_half")
    b = g.n.numel()
    seq = torch.searchsorted(half_starts[1:].contiguous(), starts, right=True).clamp(max=b - 1)
    full = starts + half_starts[seq]
    return full if layout == "first_half" else full + g.H[seq]


def with_direct(meta: StepMeta, plan: "CPPlan", q_rows: int, kv_rows: int) -> StepMeta:
    """``meta`` with its :class:`~rocm_attn.varlen.meta.DirectCall` over tensors of ``q_rows`` /
    ``kv_rows`` rows (the full local or the gathered ones). Core metas (one sub-sequence per
    sequence, halves allowed) and packed metas whose sorted q and kv ranges are both increasing
    (:func:`rocm_attn.varlen.pieces.group_direct`)."""
    if meta.packed_kv_rows is not None:
        return with_direct_packed(meta, q_rows, kv_rows)
    q_len = (meta.cu_seqlens_q[1:] - meta.cu_seqlens_q[:-1]).long()
    kv_len = (meta.cu_seqlens_kv[1:] - meta.cu_seqlens_kv[:-1]).long()
    q_start = _layout_starts(meta, "q", plan.geom_q)
    kv_start = _layout_starts(meta, "kv", plan.geom_kv)
    q_bound = q_rows // 2 if meta.q_layout in ("first_half", "second_half") else q_rows
    kv_bound = kv_rows // 2 if meta.kv_layout == "first_half" else kv_rows
    return meta._replace(direct=direct_call(q_start, q_len, kv_start, kv_len, q_rows, kv_rows,
                                            min(q_bound, q_rows), min(kv_bound, kv_rows)))


# --------------------------------------------------------------------------
# per-sequence counts (sync-free torch on the cu_seqlens' device)
# --------------------------------------------------------------------------


def _chunk_valid(g: SideGeometry, c) -> torch.Tensor:
    """Valid tokens of global chunk ``c`` (int or int64 [b]) of every sequence: a prefix."""
    return (g.n - c * g.H).clamp(min=0).minimum(g.H)


def _local_valid(g: SideGeometry, rank: int) -> torch.Tensor:
    """Valid tokens of every rank-local sequence of ``rank`` (a prefix of it)."""
    return _chunk_valid(g, rank) + _chunk_valid(g, 2 * g.cp - 1 - rank)


def _starts(g: SideGeometry, layout: str) -> torch.Tensor:
    """Row where every sequence starts in a tensor of the given layout, int64 [b+1]."""
    if layout == "full":
        return torch.div(g.cu_padded, g.cp, rounding_mode="floor")
    if layout in ("first_half", "second_half"):
        return torch.div(g.cu_padded, 2 * g.cp, rounding_mode="floor")
    if layout == "global":
        return g.cu_padded
    raise ValueError(f"unknown layout {layout!r}")


def _bound(max_seqlen: int, rows: int) -> int:
    return max(0, min(max_seqlen, rows))


def _meta(kind, q_layout, kv_layout, kv_rank, plan: CPPlan, q_lens, kv_lens, mask,
          max_q, max_kv) -> StepMeta:
    return StepMeta(
        kind=kind,
        q_layout=q_layout,
        kv_layout=kv_layout,
        kv_rank=kv_rank,
        cu_seqlens_q=cu_from_lens(q_lens),
        cu_seqlens_kv=cu_from_lens(kv_lens),
        cu_seqlens_q_padded=_starts(plan.geom_q, q_layout).to(torch.int32),
        cu_seqlens_kv_padded=_starts(plan.geom_kv, kv_layout).to(torch.int32),
        max_seqlen_q=max_q,
        max_seqlen_kv=max_kv,
        attn_mask_type=mask,
        window_size=(-1, -1),  # NOTE: windows / chunks (masks issue) get per-step values here
    )


def _check_scope(plan: CPPlan) -> None:
    if not plan.spec.plain:
        raise ValueError("the core step metadata serves no window and no chunking; use "
                         "ring_step_metas / all_gather_step_metas / a2a_step_meta")


# --------------------------------------------------------------------------
# comm types
# --------------------------------------------------------------------------


def ring_step_meta(plan: CPPlan, step: int) -> StepMeta:
    """Metadata of ring step ``step`` (0 .. cp-1) of the p2p comm type on ``plan.rank``, for
    masks without window or chunking (the core steps; see :func:`ring_step_metas`).

    The kv tensor of the step is the **rank-local** kv of ``kv_rank = (rank - step) % cp``
    (``kv_layout`` ``"full"``, or ``"first_half"``: ``thd.read_half(kv, local_cu, "first")``).
    """
    _check_scope(plan)
    gq, gkv, cp, r = plan.geom_q, plan.geom_kv, plan.cp, plan.rank
    kind, kv_rank = thd.ring_step(r, step, cp)
    full_q = _bound(plan.max_seqlen_q, plan.rows_q)
    half_q = _bound(plan.max_seqlen_q, plan.rows_q // 2)
    full_kv = _bound(plan.max_seqlen_kv, plan.rows_kv)
    half_kv = _bound(plan.max_seqlen_kv, plan.rows_kv // 2)
    if not plan.causal:
        return _meta("full", "full", "full", kv_rank, plan, _local_valid(gq, r),
                     _local_valid(gkv, kv_rank), "no_mask", full_q, full_kv)
    if kind == "diagonal":
        return _meta(kind, "full", "full", kv_rank, plan, _local_valid(gq, r),
                     _local_valid(gkv, r), "causal", full_q, full_kv)
    if kind == "below":
        return _meta(kind, "full", "first_half", kv_rank, plan, _local_valid(gq, r),
                     _chunk_valid(gkv, kv_rank), "no_mask", full_q, half_kv)
    return _meta(kind, "second_half", "full", kv_rank, plan, _chunk_valid(gq, 2 * cp - 1 - r),
                 _local_valid(gkv, kv_rank), "no_mask", half_q, full_kv)


def uses_packed_steps(plan: CPPlan, comm_type: str) -> bool:
    """Whether the steps of ``comm_type`` ("p2p" / "all_gather") under this plan follow the
    packed contract (``packed_kv_rows`` set), so that the comm type allocates accumulators
    with the dummy row of :mod:`~rocm_attn.varlen.packed`: any window or chunking, except causal
    chunked p2p without window (the chunkify helpers' steps)."""
    spec = plan.spec
    if comm_type == "all_gather" and plan.top_left:  # the pieces of top_left_pairs
        return True
    if spec.plain:
        return False
    return not (comm_type == "p2p" and _chunkify_ring(spec))


def _chunkify_ring(spec: MaskSpec) -> bool:
    return spec.causal and spec.left is None and spec.chunk is not None


def ring_step_metas(plan: CPPlan, step: int) -> List[StepMeta]:
    """The attention calls of ring step ``step`` on ``plan.rank``; an empty list when the mask
    cannot reach the kv of this step for any sequence (the step's compute is skipped; its
    communication still runs, so every rank makes the same exchanges).

    * no window, no chunking: one call (:func:`ring_step_meta`);
    * causal chunked attention without window: one call from the THD chunkify helpers
      (:func:`rocm_attn.thd.chunkify_ring_step`), runs clipped to the valid tokens;
    * anything with a window (or non-causal chunking): the pieces of :mod:`.bands` between
      the two q halves and the two kv halves, one call per piece kind and set of disjoint q
      halves.
    """
    key = ("ring", step)
    if key not in plan.meta_cache:
        plan.meta_cache[key] = _ring_step_metas(plan, step)
    return plan.meta_cache[key]


def _ring_step_metas(plan: CPPlan, step: int) -> List[StepMeta]:
    spec = plan.spec
    rows = (plan.rows_q, plan.rows_kv) if uses_direct_calls(plan) else None

    def annotate(meta: StepMeta) -> StepMeta:
        return meta if rows is None else with_direct(meta, plan, *rows)

    if spec.plain:
        return [annotate(ring_step_meta(plan, step))]
    kind, kv_rank = thd.ring_step(plan.rank, step, plan.cp)
    pairs = [p for p in _ring_pairs(plan, kv_rank)
             if reachable(p.relation, spec, p.distance, plan.min_chunk_tokens)]
    if not pairs:
        return []
    if _chunkify_ring(spec):
        return [annotate(_chunked_ring_meta(plan, step))]
    return piece_metas(plan.spec, pairs, kind, kv_rank, "full", "full", rows)


def all_gather_step_metas(plan: CPPlan) -> List[StepMeta]:
    """Metadata of the all_gather comm type: q from the local shard, kv = global (gathered and
    reordered to contiguous order, ``thd.reorder_to_contiguous``).

    Causal without window or chunking: one step per local half. The half is global chunk ``c``
    of every sequence; its ``qv`` valid queries sit at global positions ``c*H_q ..`` and
    (bottom-right) see kv ``[0, c*H_q + i + n_kv - n_q]``, i.e. a kv prefix of
    ``c*H_q + qv + n_kv - n_q`` tokens with the causal diagonal at the step's bottom-right
    corner (exact for ``n_q != n_kv`` too). With a window or chunking: the :mod:`.bands` pieces
    of both local halves against the whole kv sequence (``q_layout`` ``"full"``: one call per
    piece kind serves both halves; each half's kv range is cut to what its window sees).
    """
    if ("all_gather",) not in plan.meta_cache:
        plan.meta_cache[("all_gather",)] = _all_gather_step_metas(plan)
    return plan.meta_cache[("all_gather",)]


def _all_gather_step_metas(plan: CPPlan) -> List[StepMeta]:
    gq, gkv, cp, r = plan.geom_q, plan.geom_kv, plan.cp, plan.rank
    if plan.top_left:
        kv = _global_segment(gkv, shift=None)
        q_max = _bound(plan.max_seqlen_q, plan.rows_q // 2)
        pairs = []
        for name, c, first in (("A", r, True), ("B", 2 * cp - 1 - r, False)):
            pairs += top_left_pairs(name, _half_segment(gq, plan, c, first), kv, q_max,
                                    plan.rows_q // 2, max(0, plan.max_seqlen_kv),
                                    _gkv_rows(plan))
        return piece_metas(plan.spec, pairs, "all_gather", -1, "full", "global")
    if not plan.spec.plain:
        kv = _global_segment(gkv, shift=None)
        pairs = [Pair(name, "G", _half_segment(gq, plan, c, first, gkv.n - gq.n), kv, "whole",
                       None,
                       _bound(plan.max_seqlen_q, plan.rows_q // 2), plan.rows_q // 2,
                       max(0, plan.max_seqlen_kv), _gkv_rows(plan))
                 for name, c, first in (("A", r, True), ("B", 2 * cp - 1 - r, False))]
        return piece_metas(plan.spec, pairs, "all_gather", -1, "full", "global")
    glob_kv = max(0, plan.max_seqlen_kv)
    if not plan.causal:
        return [_meta("full", "full", "global", -1, plan, _local_valid(gq, r), gkv.n, "no_mask",
                      _bound(plan.max_seqlen_q, plan.rows_q), glob_kv)]
    metas = []
    for half, c in (("first_half", r), ("second_half", 2 * cp - 1 - r)):
        qv = _chunk_valid(gq, c)
        kv = (c * gq.H + qv + gkv.n - gq.n).clamp(min=0).minimum(gkv.n)
        kv = torch.where(qv > 0, kv, torch.zeros_like(kv))
        metas.append(_meta(half, half, "global", -1, plan, qv, kv, "causal",
                           _bound(plan.max_seqlen_q, plan.rows_q // 2), glob_kv))
    return metas


def a2a_step_metas(plan: CPPlan) -> List[StepMeta]:
    """The calls of the a2a comm type: :func:`a2a_step_meta`, or for a top-left causal mask
    between different q and kv lengths the pieces of whole sequences
    (:func:`rocm_attn.varlen.pieces.whole_sequence_metas`)."""
    if not plan.top_left:
        return [a2a_step_meta(plan)]
    return whole_sequence_metas(
        plan.spec, _global_segment(plan.geom_q, None), _global_segment(plan.geom_kv, None),
        max(0, plan.max_seqlen_q), max(0, plan.max_seqlen_kv), _gq_rows(plan), _gkv_rows(plan),
        "a2a", True)


def a2a_step_meta(plan: CPPlan) -> StepMeta:
    """Metadata of the a2a (Ulysses) comm type: whole global sequences (one head group). Whole
    sequences are aligned rectangles, so a window passes through unchanged; chunking splits
    every sequence into its chunks (:func:`whole_sequence_meta`)."""
    if not plan.spec.plain:
        return whole_sequence_meta(
            plan.spec, _global_segment(plan.geom_q, plan.geom_kv.n - plan.geom_q.n),
            _global_segment(plan.geom_kv, None), max(0, plan.max_seqlen_q),
            max(0, plan.max_seqlen_kv), _gq_rows(plan), _gkv_rows(plan), "a2a")
    return _meta("global", "global", "global", -1, plan, plan.geom_q.n, plan.geom_kv.n,
                 plan.attn_mask_type, max(0, plan.max_seqlen_q), max(0, plan.max_seqlen_kv))


# --------------------------------------------------------------------------
# windowed / chunked steps (pieces of bands.py)
# --------------------------------------------------------------------------


def _gq_rows(plan: CPPlan) -> int:
    """Rows of the global (gathered) q: cp times the local rows."""
    return plan.cp * plan.rows_q


def _gkv_rows(plan: CPPlan) -> int:
    return plan.cp * plan.rows_kv


def _global_segment(g: SideGeometry, shift: Optional[torch.Tensor]) -> Segment:
    """Whole valid sequences in the global layout, positions shifted by ``shift`` (q side:
    ``n_kv - n_q``, the bottom-right alignment)."""
    pos = torch.zeros_like(g.n) if shift is None else shift
    return Segment(pos, g.n, g.cu_padded[:-1])


def _half_segment(g: SideGeometry, plan: CPPlan, c: int, first: bool,
                  shift: Optional[torch.Tensor] = None) -> Segment:
    """Global chunk ``c`` of every sequence, as the first or second half of the rank-local
    tensor that holds it (positions ``c*H ..``, plus ``shift``)."""
    start = torch.div(g.cu_padded[:-1], g.cp, rounding_mode="floor")
    pos = c * g.H if shift is None else c * g.H + shift
    return Segment(pos, _chunk_valid(g, c), start if first else start + g.H)


class _HalfPair(NamedTuple):
    q_name: str
    q_chunk: int
    q_first: bool
    kv_chunk: int
    kv_first: bool
    relation: str
    distance: int


def _ring_half_pairs(cp: int, rank: int, kv_rank: int) -> List[_HalfPair]:
    """The four (q half x kv half) rectangles of a ring step, host-only (q and kv sequences
    identical, so the chunk order alone says how the halves lie)."""
    out = []
    for name, gq, q_first in (("A", rank, True), ("B", 2 * cp - 1 - rank, False)):
        for gk, kv_first in ((kv_rank, True), (2 * cp - 1 - kv_rank, False)):
            rel = "aligned" if gq == gk else ("before" if gk < gq else "after")
            out.append(_HalfPair(name, gq, q_first, gk, kv_first, rel, abs(gq - gk)))
    return out


def ring_steps_run(cp: int, rank: int, causal: bool, window_size: Tuple[int, int] = (-1, -1),
                   chunk_size: Optional[int] = None, min_seqlen: int = 0) -> List[int]:
    """Ring steps (0 .. cp-1) in which ``rank`` runs attention under this mask when every
    non-empty sequence has at least ``min_seqlen`` tokens (host-only; the rule of
    :func:`ring_step_metas`, see docs/cp.md). The other steps only pass kv along."""
    spec = MaskSpec.make(causal, window_size, chunk_size)
    if spec.plain:
        return list(range(cp))
    min_h = max(1, -(-min_seqlen // (2 * cp)))
    return [s for s in range(cp)
            if any(reachable(p.relation, spec, p.distance, min_h)
                   for p in _ring_half_pairs(cp, rank, thd.ring_step(rank, s, cp)[1]))]


def _ring_pairs(plan: CPPlan, kv_rank: int) -> List[Pair]:
    """The four (q half x kv half) rectangles of a ring step, with their segments."""
    q_max = _bound(plan.max_seqlen_q, plan.rows_q // 2)
    kv_max = _bound(plan.max_seqlen_kv, plan.rows_kv // 2)
    return [Pair(h.q_name, "first" if h.kv_first else "second",
                  _half_segment(plan.geom_q, plan, h.q_chunk, h.q_first),
                  _half_segment(plan.geom_kv, plan, h.kv_chunk, h.kv_first), h.relation,
                  h.distance, q_max, plan.rows_q // 2, kv_max, plan.rows_kv // 2)
            for h in _ring_half_pairs(plan.cp, plan.rank, kv_rank)]


def uses_direct_calls(plan: CPPlan) -> bool:
    """Whether the plan's backend reads sub-sequences in place
    (:class:`~rocm_attn.varlen.meta.DirectCall`), so that ring steps carry one and accumulators
    need the dummy row of their row maps."""
    return bool(getattr(plan.backend, "direct", False))


def _chunked_ring_meta(plan: CPPlan, step: int) -> StepMeta:
    """Causal chunked ring step from :func:`rocm_attn.thd.chunkify_ring_step`.

    The helper cuts the padded local layout into runs of one chunk id (padding counted as
    tokens); valid tokens are a prefix of every local sequence (and of every half), so each
    run's valid rows are a prefix of the run: clipping q and kv runs to the valid rows keeps
    every mask exact (diagonal runs are identical on both sides and clip identically).
    """
    gq, gkv, cp, r, cs = plan.geom_q, plan.geom_kv, plan.cp, plan.rank, plan.chunk_size
    kind, kv_rank = thd.ring_step(r, step, cp)
    cu_loc = plan.local_cu_q_padded
    b = cu_loc.numel() - 1
    max_chunks = thd.max_chunks_bound(max(plan.rows_q, plan.rows_kv), b, cs, dual_chunk=True)
    st = thd.chunkify_ring_step(cu_loc, cs, cp, r, step, max(1, max_chunks), kv_layout="half")
    if st.q_layout == "full":
        q_valid = _local_valid(gq, r)
    else:  # second half: global chunk 2cp-1-r
        q_valid = _chunk_valid(gq, 2 * cp - 1 - r)
    kv_valid = (_chunk_valid(gkv, kv_rank) if st.kv_layout == "first_half"
                else _local_valid(gkv, kv_rank))
    q_start, q_len = _clip_runs(st.cu_seqlens_q, st.cu_seqlens_q_padded,
                                _starts(gq, st.q_layout), q_valid)
    kv_start, kv_len = _clip_runs(st.cu_seqlens_kv, st.cu_seqlens_kv_padded,
                                  _starts(gkv, st.kv_layout), kv_valid)
    q_rows = plan.rows_q if st.q_layout == "full" else plan.rows_q // 2
    kv_rows = plan.rows_kv if st.kv_layout == "full" else plan.rows_kv // 2
    return StepMeta(
        kind=f"{kind}:chunked", q_layout=st.q_layout, kv_layout=st.kv_layout, kv_rank=kv_rank,
        cu_seqlens_q=cu_from_lens(q_len), cu_seqlens_kv=cu_from_lens(kv_len),
        cu_seqlens_q_padded=q_start.to(torch.int32), cu_seqlens_kv_padded=kv_start.to(torch.int32),
        max_seqlen_q=min(cs, _bound(plan.max_seqlen_q, q_rows)),
        max_seqlen_kv=min(cs, _bound(plan.max_seqlen_kv, kv_rows)),
        attn_mask_type=st.attn_mask_type, window_size=(-1, -1))


def _clip_runs(cu: torch.Tensor, cu_padded: torch.Tensor, seq_starts: torch.Tensor,
               valid: torch.Tensor):
    """Runs ``[cu_padded[j], + cu[j+1]-cu[j])`` cut to the valid prefix of their sequence
    (``seq_starts`` int64 ``[b+1]`` of the layout, ``valid`` ``[b]``). Returns the run starts
    ``[m+1]`` (int64, unchanged) and the clipped lengths ``[m]``."""
    start = cu_padded.long()
    lens = (cu[1:] - cu[:-1]).long()
    seq = torch.searchsorted(seq_starts[1:].contiguous(), start[:-1], right=True)
    vend = torch.cat([seq_starts[:-1] + valid, valid.new_zeros(1)])[seq]
    return start, (vend - start[:-1]).clamp(min=0).minimum(lens)
