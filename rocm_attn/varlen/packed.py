"""Packed execution of general steps (``StepMeta.packed_kv_rows`` set: windows, chunking).

A general step's sub-sequences sit anywhere in its q / kv tensors (q ranges disjoint, kv
ranges may overlap), so kernels that read sub-sequences back to back get **packed buffers**:
row ``d`` of a buffer comes from source row ``src[d]`` (:func:`packed_rows`, a binary search
per row, no sync). Results then go straight into the caller's accumulators by index, so a
call costs memory traffic in proportion to its packed buffer (often half the local rows), not
to the local tensor:

* :func:`merge_packed`: online-softmax merge of a call's packed output and LSE into the
  running ``(out, lse)``;
* :func:`add_packed`: ``grad[src[d]] += grad_p[d]`` (kv rows read by several sub-sequences sum
  their contributions).

Accumulators carry **one dummy row** past the real ones: packed rows outside every
sub-sequence (buffer slack) read a clamped source row and write to the dummy row, which the
caller drops (:func:`accumulator_rows`).
"""

from __future__ import annotations

from typing import NamedTuple, Optional, Tuple

import torch

from .. import thd
from .meta import StepMeta

__all__ = ["PackedRows", "packed_rows", "step_rows", "gather_packed", "scatter_packed",
           "scatter_add_packed", "merge_packed", "add_packed", "forward_into", "backward_into",
           "forward_direct_into", "add_direct"]


class PackedRows(NamedTuple):
    """Where every row of a packed buffer comes from: sub-sequence ``i`` occupies packed rows
    ``[cu[i], cu[i+1])`` and reads source rows ``[start[i], start[i] + cu[i+1] - cu[i])``."""

    valid: torch.Tensor  # bool [packed]: the packed row belongs to a sub-sequence
    src: torch.Tensor  # int64 [packed]: its source row (clamped into range when not valid)
    src_rows: int  # rows of the source tensor (without a dummy row)

    @property
    def targets(self) -> torch.Tensor:
        """Source row, or the dummy row ``src_rows`` for packed rows outside sub-sequences."""
        return torch.where(self.valid, self.src, torch.full_like(self.src, self.src_rows))


def packed_rows(cu: torch.Tensor, starts: torch.Tensor, packed: int, src_rows: int
                ) -> PackedRows:
    """Row map of a packed buffer of ``packed`` rows (host int, at least ``cu[-1]``).

    ``cu`` int32 ``[m+1]`` (packed offsets), ``starts`` int ``[m+1]`` (source start of every
    sub-sequence; the last entry is ignored). Source ranges may overlap and come in any order.
    """
    c = cu.long()
    m = c.numel() - 1
    d = torch.arange(packed, device=cu.device, dtype=torch.int64)
    seg = torch.searchsorted(c[1:].contiguous(), d, right=True)  # m past the last row
    s = torch.cat([starts[:-1].long(), starts.new_zeros(1, dtype=torch.int64)])
    first = torch.cat([c[:-1], c[-1:]])
    src = s[seg] + (d - first[seg])
    return PackedRows(seg < m, src.clamp(0, max(src_rows - 1, 0)), src_rows)


def step_rows(meta: StepMeta, q_rows: int, kv_rows: int) -> Tuple[PackedRows, PackedRows]:
    """Row maps of a general step whose q / kv tensors have ``q_rows`` / ``kv_rows`` rows."""
    packed_q = q_rows if meta.packed_q_rows is None else meta.packed_q_rows
    return (packed_rows(meta.cu_seqlens_q, meta.cu_seqlens_q_padded, packed_q, q_rows),
            packed_rows(meta.cu_seqlens_kv, meta.cu_seqlens_kv_padded, meta.packed_kv_rows,
                        kv_rows))


def _view(mask: torch.Tensor, ndim: int, dim: int) -> torch.Tensor:
    shape = [1] * ndim
    shape[dim] = -1
    return mask.view(shape)


def gather_packed(x: torch.Tensor, rows: PackedRows, dim: int = 0) -> torch.Tensor:
    """Packed buffer of ``x`` (differentiable): rows outside every sub-sequence are zero."""
    d = dim % x.dim()
    if x.shape[d] == 0:
        shape = list(x.shape)
        shape[d] = rows.valid.numel()
        return x.new_zeros(shape)
    return x.index_select(d, rows.src).masked_fill(~_view(rows.valid, x.dim(), d), 0)


def scatter_packed(x_p: torch.Tensor, rows: PackedRows, fill: float, dim: int = 0
                   ) -> torch.Tensor:
    """Inverse of :func:`gather_packed` for **disjoint** sub-sequences (q side): a tensor with
    ``rows.src_rows`` rows at ``dim``, ``fill`` where no sub-sequence wrote (differentiable)."""
    y = x_p.movedim(dim, 0)
    out = y.new_full((rows.src_rows + 1,) + tuple(y.shape[1:]), fill)
    out = out.index_copy(0, rows.targets, y)
    return out[: rows.src_rows].movedim(0, dim)


def scatter_add_packed(x_p: torch.Tensor, rows: PackedRows) -> torch.Tensor:
    """Sum the packed rows into their source rows (a tensor of ``rows.src_rows`` rows)."""
    out = x_p.new_zeros((rows.src_rows + 1,) + tuple(x_p.shape[1:]))
    out.index_add_(0, rows.targets, x_p)
    return out[: rows.src_rows]


def accumulator_rows(rows: int) -> int:
    """Rows of an accumulator that packed steps write into: the real ones plus a dummy row."""
    return rows + 1


def merge_packed(out: torch.Tensor, lse: torch.Tensor, out_p: torch.Tensor,
                 lse_p: torch.Tensor, rows: PackedRows, first: bool = False) -> None:
    """Online-softmax merge of a packed result into ``out [T+1, ...]`` / ``lse [h, T+1]`` (in
    place, last row dummy). Sub-sequences of one call have disjoint q rows, so every real row
    is written at most once per call. ``first``: the accumulators are still empty (zero /
    ``-inf``), so the result is written as is (a merge into nothing is a copy)."""
    tgt = rows.targets
    if first:
        lse_p = torch.where(rows.valid, lse_p, torch.full_like(lse_p, float("-inf")))
        out.index_copy_(0, tgt, out_p.to(out.dtype).masked_fill(~rows.valid.view(-1, 1, 1), 0))
        lse.index_copy_(1, tgt, lse_p.to(lse.dtype))
        return
    # NOTE: one pass over the packed rows on GPUs (thd merge kernel, row-index map); the
    # torch ops (gather, ~10 elementwise passes over fp32 rows, scatter) made a windowed p2p
    # ring slower than the causal one on 2 x H200 (docs/cp.md#rejected-alternatives).
    thd.merge_rows_(out, lse, out_p, lse_p, tgt, validate=False)


def add_packed(acc: torch.Tensor, x_p: torch.Tensor, rows: PackedRows) -> None:
    """``acc[src] += x_p`` (in place; ``acc`` has the dummy row)."""
    acc.index_add_(0, rows.targets, x_p.to(acc.dtype))


def forward_into(out: torch.Tensor, lse: torch.Tensor, backend, q: torch.Tensor,
                 k: torch.Tensor, v: torch.Tensor, meta: StepMeta, scale: float,
                 first: bool = False) -> None:
    """Run one general step on the step tensors and merge it into the accumulators
    (``first``: nothing was merged into them yet)."""
    mq, mkv = step_rows(meta, q.shape[0], k.shape[0])
    o_p, l_p = backend.forward_packed(gather_packed(q, mq), gather_packed(k, mkv),
                                      gather_packed(v, mkv), meta, scale)
    merge_packed(out, lse, o_p, l_p.to(lse.dtype), mq, first)


def forward_direct_into(out: torch.Tensor, lse: torch.Tensor, backend, q: torch.Tensor,
                        k: torch.Tensor, v: torch.Tensor, meta: StepMeta, scale: float,
                        first: bool = False) -> None:
    """Run a step with a :class:`~rocm_attn.varlen.meta.DirectCall` on the whole tensors and merge
    its covered rows into the accumulators (dummy row last) by index: no packing copies.
    ``first``: the accumulators hold nothing yet (not even zeros): seed them
    (:func:`seed_direct`)."""
    dc = meta.direct
    o, l_ = backend.forward_direct(q, k, v, meta, scale)
    if first:
        seed_direct(out, o, dc.q_cover_cu, dc.q_cover_starts, 0.0)
        seed_direct(lse, l_, dc.q_cover_cu, dc.q_cover_starts, float("-inf"), dim=-1)
        return
    thd.merge_rows_(out, lse, o, l_.to(lse.dtype), dc.q_dst, dc.q_src, validate=False)


def seed_direct(acc: torch.Tensor, x: torch.Tensor, cover_cu: torch.Tensor,
                cover_starts: torch.Tensor, fill: float, dim: int = 0) -> None:
    """The first write into an accumulator with a dummy row last along ``dim`` (outputs and
    gradients ``[T+1, ...]``; LSE ``[h, T+1]`` with ``dim=-1``): ``acc = x`` at the rows a
    :class:`~rocm_attn.varlen.meta.DirectCall` covers (``cover_*``: its ``q_cover_*`` or
    ``kv_cover_*``), ``fill`` everywhere else, the dummy row included.

    One row-copy pass (``thd.copy_valid_tokens``) replaces zero-initialising the accumulator
    and merging (adding) the first step into it; ``x`` (``T`` rows along ``dim``, the direct
    call's whole-tensor result) holds garbage at the rows it does not cover."""
    rows = acc.shape[dim] - 1
    thd.copy_valid_tokens(acc.narrow(dim, 0, rows), x.to(acc.dtype), cover_cu, cover_starts,
                          cover_starts, dim=dim, fill=fill, validate=False)
    acc.narrow(dim, rows, 1).fill_(fill)


def add_direct(acc: torch.Tensor, grad: torch.Tensor, src: torch.Tensor,
               dst: torch.Tensor) -> None:
    """``acc[dst[k]] += grad[src[k]]``: a direct step's covered rows into an accumulator with a
    dummy row (slack entries land there)."""
    thd.add_rows_(acc, grad, dst, src, validate=False)


def backward_into(dq: torch.Tensor, dk: torch.Tensor, dv: torch.Tensor, backend,
                  dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                  out: torch.Tensor, lse: torch.Tensor, dlse: Optional[torch.Tensor],
                  meta: StepMeta, scale: float) -> None:
    """One general step's gradients, added into ``dq`` / ``dk`` / ``dv`` (dummy rows)."""
    mq, mkv = step_rows(meta, q.shape[0], k.shape[0])
    g = gather_packed
    dq_p, dk_p, dv_p = backend.backward_packed(
        g(dout, mq), g(q, mq), g(k, mkv), g(v, mkv), g(out, mq), g(lse, mq, dim=-1),
        None if dlse is None else g(dlse, mq, dim=-1), meta, scale)
    add_packed(dq, dq_p, mq)
    add_packed(dk, dk_p, mkv)
    add_packed(dv, dv_p, mkv)
