"""The unit of work of the attention engine: one varlen attention call (:class:`StepMeta`),
and the same call addressed to whole tensors for kernels that read sub-sequences in place
(:class:`DirectCall`).

Every attention call, one device or context parallel, is described by a :class:`StepMeta`:
``rocm_attn.attention`` makes one; every comm type of :func:`rocm_attn.attn_with_cp` asks
:mod:`rocm_attn.cp.steps` for one or more per step. A per-step backend
(:mod:`~rocm_attn.varlen.backends`) computes it.
"""

from __future__ import annotations

from typing import NamedTuple, Optional, Tuple

import torch

__all__ = ["StepMeta", "DirectCall", "cu_from_lens"]


class StepMeta(NamedTuple):
    """One attention call of a comm type.

    Sub-sequence ``i`` has ``cu_seqlens_q[i+1] - cu_seqlens_q[i]`` valid queries starting at
    row ``cu_seqlens_q_padded[i]`` of the step's q tensor, and likewise for kv; all four int32
    ``[m+1]``. Rows outside those ranges are never read; the step's output is zero and its LSE
    ``-inf`` there. ``attn_mask_type`` (``"causal"``: bottom-right aligned, or ``"no_mask"``)
    and ``window_size`` (flash convention, bottom-right aligned) apply inside every
    sub-sequence. ``max_seqlen_*`` are host upper bounds of the valid counts (for kernels that
    size grids).

    Two contracts, told apart by ``packed_kv_rows``:

    * ``None`` (the core steps and the chunkify-based ring steps): one sub-sequence per
      sequence or chunk run, starts non-decreasing, ``start[i] + len[i] <= start[i+1]`` on both
      sides (the ``cu_seqlens_*_padded`` convention of ``reference_attention``).
    * an int (windowed / chunked steps from :mod:`~rocm_attn.varlen.bands`): q ranges are disjoint
      but in any order, kv ranges may overlap (two q halves reading the same kv half), the
      last entry of ``cu_seqlens_*_padded`` is unused, and the sums of the q / kv lengths are
      at most ``packed_q_rows`` / ``packed_kv_rows`` (the sizes of the packed buffers,
      :mod:`~rocm_attn.varlen.packed`; ``packed_q_rows`` None: the q tensor's rows).
    """

    kind: str  # diagonal | below | above | full | first_half | second_half | global
    q_layout: str  # the tensor its q rows index (cp.steps.Q_LAYOUTS; "global": whole sequences)
    kv_layout: str  # likewise for kv (cp.steps.KV_LAYOUTS)
    kv_rank: int  # rank whose kv the step reads (p2p); -1 for gathered kv
    cu_seqlens_q: torch.Tensor
    cu_seqlens_kv: torch.Tensor
    cu_seqlens_q_padded: torch.Tensor
    cu_seqlens_kv_padded: torch.Tensor
    max_seqlen_q: int
    max_seqlen_kv: int
    attn_mask_type: str
    window_size: Tuple[int, int]
    packed_kv_rows: Optional[int] = None
    packed_q_rows: Optional[int] = None
    # the same call addressed to the whole rank-local (p2p) or gathered tensors, for backends
    # that read sub-sequences in place (:class:`DirectCall`); None where not built
    direct: Optional["DirectCall"] = None


class DirectCall(NamedTuple):
    """A step as one varlen call over whole tensors, no copies: the step's sub-sequences (sorted,
    disjoint on both sides) with **dummy sub-sequences** in between, so that a kernel reading
    sub-sequences back to back (flash varlen: ``cu_seqlens`` only) finds each one in place.

    Before every real sub-sequence ``i`` come a dummy with the q gap and no keys, and one with
    no queries and the kv gap; after the last, the same for the tails: ``3m + 2``
    sub-sequences, ``cu_q`` / ``cu_kv`` int32 ``[3m + 3]``. A kernel writes nothing useful at
    gap rows (zeros, or nothing at all past ``max_seqlen`` rows of a dummy), so results are
    read back only at the rows the real sub-sequences cover: entry ``k`` of ``q_src`` is such a
    row (slack entries clamp into the tensor), ``q_dst`` the same row or the dummy row
    ``q_rows`` of an accumulator (:mod:`~rocm_attn.varlen.packed`); likewise for kv.
    """

    cu_q: torch.Tensor
    cu_kv: torch.Tensor
    q_src: torch.Tensor  # int64 [P_q]
    q_dst: torch.Tensor
    kv_src: torch.Tensor  # int64 [P_kv]
    kv_dst: torch.Tensor
    q_rows: int  # rows of the q tensor the call reads (full local / gathered)
    kv_rows: int
    # the covered rows as thd.copy_valid_tokens layouts (int32 [m+1]): sub-sequence i covers
    # rows [starts[i], starts[i] + cu[i+1] - cu[i]); starts ends with the tensor's rows
    q_cover_cu: torch.Tensor
    q_cover_starts: torch.Tensor
    kv_cover_cu: torch.Tensor
    kv_cover_starts: torch.Tensor


def cu_from_lens(lens: torch.Tensor) -> torch.Tensor:
    """int32 ``[m+1]`` cumulative offsets of ``m`` lengths (0 first)."""
    return torch.cat([lens.new_zeros(1), torch.cumsum(lens, 0)]).to(torch.int32)
