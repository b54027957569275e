"""Per-step attention metadata of context-parallel attention: the one place that says, for every
attention call a comm type makes, which rows of which tensor attend to which, under which mask.

A comm type (``p2p.py``, ``all_gather.py``, ``a2a.py``) never computes ranges itself: it asks
this module for a :class:`StepMeta` per attention call, materialises the q / kv tensors the
meta names (``q_layout`` / ``kv_layout``), hands both to a per-step backend (``backends.py``)
and folds the result back with :mod:`rocm_attn.thd` helpers. Masks that later issues add
(sliding windows, chunked attention) change only this file: the per-sequence lengths and
offsets below and the ``attn_mask_type`` / ``window_size`` of every step.

Geometry (dual-chunk sharding, DESIGN section 2)
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
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, List, NamedTuple, Optional, Tuple

import torch

from .. import thd

__all__ = [
    "CPPlan",
    "SideGeometry",
    "StepMeta",
    "side_geometry",
    "ring_step_meta",
    "all_gather_step_metas",
    "a2a_step_meta",
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

    @property
    def causal(self) -> bool:
        return self.attn_mask_type == "causal"

    @property
    def local_cu_q_padded(self) -> torch.Tensor:
        """Rank-local padded cu_seqlens of q (int32): for merge / read_half / grad_correction."""
        return thd.local_cu_seqlens(self.cu_seqlens_q_padded, self.cp)

    @property
    def local_cu_kv_padded(self) -> torch.Tensor:
        return thd.local_cu_seqlens(self.cu_seqlens_kv_padded, self.cp)


class StepMeta(NamedTuple):
    """One attention call of a comm type.

    Sub-sequence ``i`` (one per global sequence) has ``cu_seqlens_q[i+1] - cu_seqlens_q[i]``
    valid queries starting at row ``cu_seqlens_q_padded[i]`` of the step's q tensor, and
    likewise for kv; all four int32 ``[b+1]``. Rows outside those ranges are never read; the
    step's output is zero and its LSE ``-inf`` there. ``attn_mask_type`` (``"causal"``:
    bottom-right aligned, or ``"no_mask"``) and ``window_size`` apply inside every sub-sequence.
    ``max_seqlen_*`` are host upper bounds of the valid counts (for kernels that size grids).
    """

    kind: str  # diagonal | below | above | full | first_half | second_half | global
    q_layout: str  # one of Q_LAYOUTS: the local q, one half of it (thd.read_half), or global
    kv_layout: str  # one of KV_LAYOUTS
    kv_rank: int  # rank whose kv the step reads (p2p); -1 for gathered kv
    cu_seqlens_q: torch.Tensor
    cu_seqlens_kv: torch.Tensor
    cu_seqlens_q_padded: torch.Tensor
    cu_seqlens_kv_padded: torch.Tensor
    max_seqlen_q: int
    max_seqlen_kv: int
    attn_mask_type: str
    window_size: Tuple[int, int]


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


def _cu(lens: torch.Tensor) -> torch.Tensor:
    return torch.cat([lens.new_zeros(1), torch.cumsum(lens, 0)]).to(torch.int32)


def _bound(max_seqlen: int, rows: int) -> int:
    return max(0, min(max_seqlen, rows))


def _meta(kind, q_layout, kv_layout, kv_rank, plan: CPPlan, q_lens, kv_lens, mask,
          max_q, max_kv) -> StepMeta:
    return StepMeta(
        kind=kind,
        q_layout=q_layout,
        kv_layout=kv_layout,
        kv_rank=kv_rank,
        cu_seqlens_q=_cu(q_lens),
        cu_seqlens_kv=_cu(kv_lens),
        cu_seqlens_q_padded=_starts(plan.geom_q, q_layout).to(torch.int32),
        cu_seqlens_kv_padded=_starts(plan.geom_kv, kv_layout).to(torch.int32),
        max_seqlen_q=max_q,
        max_seqlen_kv=max_kv,
        attn_mask_type=mask,
        window_size=(-1, -1),  # NOTE: windows / chunks (masks issue) get per-step values here
    )


def _check_scope(plan: CPPlan) -> None:
    if plan.window_size != (-1, -1) or plan.chunk_size is not None:
        raise NotImplementedError("step metadata for sliding windows / chunked attention")


# --------------------------------------------------------------------------
# comm types
# --------------------------------------------------------------------------


def ring_step_meta(plan: CPPlan, step: int) -> StepMeta:
    """Metadata of ring step ``step`` (0 .. cp-1) of the p2p comm type on ``plan.rank``.

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


def all_gather_step_metas(plan: CPPlan) -> List[StepMeta]:
    """Metadata of the all_gather comm type: q from the local shard, kv = global (gathered and
    reordered to contiguous order, ``thd.reorder_to_contiguous``).

    Causal: one step per local half. The half is global chunk ``c`` of every sequence; its
    ``qv`` valid queries sit at global positions ``c*H_q ..`` and (bottom-right) see kv
    ``[0, c*H_q + i + n_kv - n_q]``, i.e. a kv prefix of ``c*H_q + qv + n_kv - n_q`` tokens
    with the causal diagonal at the step's bottom-right corner (exact for ``n_q != n_kv`` too).
    """
    _check_scope(plan)
    gq, gkv, cp, r = plan.geom_q, plan.geom_kv, plan.cp, plan.rank
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


def a2a_step_meta(plan: CPPlan) -> StepMeta:
    """Metadata of the a2a (Ulysses) comm type: whole global sequences (one head group)."""
    _check_scope(plan)
    return _meta("global", "global", "global", -1, plan, plan.geom_q.n, plan.geom_kv.n,
                 plan.attn_mask_type, max(0, plan.max_seqlen_q), max(0, plan.max_seqlen_kv))
