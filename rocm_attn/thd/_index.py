"""Index maps of the THD helpers' torch paths: which source row every output row reads, by
binary search over cu_seqlens (int64 math, sync-free, every index clamped into its tensor).

Dual-chunk geometry: docs/design.md#dual-chunk-geometry.
"""

from __future__ import annotations

from typing import Optional

import torch

__all__ = ["seq_of", "lens_ext", "local_to_global", "global_to_gathered", "half_index", "bcast",
           "copy_rows", "padded_cu_seqlens", "clamp_rows", "step_rows_of"]


def seq_of(bounds: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """Sequence of every position: i with bounds[i] <= pos < bounds[i+1] (skipping empty ones).

    bounds: int64 [b+1]. Positions >= bounds[-1] give b; positions < bounds[1] give 0.
    """
    return torch.searchsorted(bounds[1:].contiguous(), pos, right=True)


def lens_ext(bounds: torch.Tensor) -> torch.Tensor:
    """Lengths [b+1] with a trailing 0 so that index b (slack) is safe."""
    return torch.cat([bounds[1:] - bounds[:-1], bounds.new_zeros(1)])


def local_to_global(cu_p: torch.Tensor, cp: int, rank, local_rows: int,
                     rows: torch.Tensor) -> torch.Tensor:
    """Global row of local row ``rows`` on ``rank`` (int or int64 tensor like rows).

    cu_p: global cu_seqlens_padded as int64 [b+1]. Global rows = cp * local_rows.
    """
    loc = torch.div(cu_p, cp, rounding_mode="floor")
    seq = seq_of(loc, rows)
    lstart = loc[seq]
    half = torch.div(lens_ext(loc)[seq], 2, rounding_mode="floor")
    lo = rows - lstart
    first = lo < half
    g = cu_p[seq] + torch.where(first, rank * half + lo, (2 * cp - 1 - rank) * half + lo - half)
    # slack rows: rank r owns global slack rows [end + r*slack_loc, end + (r+1)*slack_loc)
    loc_end = loc[-1]
    slack_loc = local_rows - loc_end
    gs = cu_p[-1] + rank * slack_loc + (rows - loc_end)
    g = torch.where(rows >= loc_end, gs, g)
    return g.clamp(0, max(cp * local_rows - 1, 0))


def global_to_gathered(cu_p: torch.Tensor, cp: int, local_rows: int,
                        rows: torch.Tensor) -> torch.Tensor:
    """Row in the all-gathered tensor (rank shards concatenated) of global row ``rows``."""
    seq = seq_of(cu_p, rows)
    start = cu_p[seq]
    h = torch.div(lens_ext(cu_p)[seq], 2 * cp, rounding_mode="floor").clamp_min(1)
    o = rows - start
    k = torch.div(o, h, rounding_mode="floor")
    first = k < cp
    rank = torch.where(first, k, 2 * cp - 1 - k)
    lo = torch.where(first, o - k * h, h + o - k * h)
    src = rank * local_rows + torch.div(start, cp, rounding_mode="floor") + lo
    # slack
    end = cu_p[-1]
    loc_end = torch.div(end, cp, rounding_mode="floor")
    slack_loc = (local_rows - loc_end).clamp_min(1)
    e = rows - end
    er = torch.div(e, slack_loc, rounding_mode="floor")
    src_s = er * local_rows + loc_end + (e - er * slack_loc)
    src = torch.where(rows >= end, src_s, src)
    return src.clamp(0, max(cp * local_rows - 1, 0))


def half_index(cu_loc: torch.Tensor, local_rows: int, half: int) -> torch.Tensor:
    """Rows of the local tensor holding half ``half`` (0 first, 1 second) of every sequence.

    cu_loc: local cu_seqlens_padded, int64 [b+1], even lengths. Returns int64 [local_rows // 2].
    """
    n = local_rows // 2
    k = torch.arange(n, device=cu_loc.device, dtype=torch.int64)
    hb = torch.div(cu_loc, 2, rounding_mode="floor")
    seq = seq_of(hb, k)
    src = cu_loc[seq] + (k - hb[seq]) + half * torch.div(lens_ext(cu_loc)[seq], 2,
                                                         rounding_mode="floor")
    end = cu_loc[-1]
    slack_src = end + (k - hb[-1]) + half * torch.div(local_rows - end, 2, rounding_mode="floor")
    src = torch.where(k >= hb[-1], slack_src, src)
    return src.clamp(0, max(local_rows - 1, 0))


def bcast(v: torch.Tensor, ndim: int, dim: int) -> torch.Tensor:
    """View 1-D v so that it broadcasts along ``dim`` of an ndim tensor."""
    shape = [1] * ndim
    shape[dim] = -1
    return v.reshape(shape)


def copy_rows(dst_rows: int, src_rows: int, cu, cu_dst_p, cu_src_p, device):
    """For every dst row: (valid, src row). int64 math, clamped indices."""
    c = cu.long()
    dp = c if cu_dst_p is None else cu_dst_p.long()
    sp = c if cu_src_p is None else cu_src_p.long()
    d = torch.arange(dst_rows, device=device, dtype=torch.int64)
    seq = seq_of(dp, d)
    off = d - dp[seq]
    n = lens_ext(c)[seq]
    slot = lens_ext(dp)[seq]
    valid = (off >= 0) & (off < torch.minimum(n, slot))
    src = (sp[seq] + off).clamp(0, max(src_rows - 1, 0))
    return valid, src


def padded_cu_seqlens(cu_seqlens: torch.Tensor, cp: int) -> torch.Tensor:
    """cu_seqlens (int32 ``[b+1]``, from 0) of every sequence padded at its end to a multiple of
    ``2*cp`` tokens: the layout :func:`rocm_attn.thd.pad_for_cp` writes."""
    c = cu_seqlens.long()
    lens = (c[1:] - c[:-1]).clamp_min(0)
    plens = torch.div(lens + (2 * cp - 1), 2 * cp, rounding_mode="floor") * (2 * cp)
    return torch.cat([c.new_zeros(1), torch.cumsum(plens, 0)]).to(torch.int32)


def clamp_rows(rows: torch.Tensor, n: int) -> torch.Tensor:
    """Row indices clamped into ``[0, n)``, as the kernels clamp them (unchecked calls)."""
    return rows.clamp(0, max(n - 1, 0))


def step_rows_of(step: torch.Tensor, dim: int, step_rows: Optional[torch.Tensor]
                  ) -> torch.Tensor:
    """The step rows entry ``k`` reads: row ``k``, or ``step_rows[k]`` clamped into ``step``."""
    if step_rows is None:
        return step
    return step.index_select(dim, step_rows.clamp(0, max(step.shape[dim] - 1, 0)))
