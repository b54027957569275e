"""Materialise the tensors a :class:`~rocm_attn.cp.steps.StepMeta` names (``q_layout`` /
``kv_layout``) and fold step results back into rank-local accumulators, with
:mod:`rocm_attn.thd` helpers (``read_half``, ``merge_partial``, ``grad_correction``); and the
row maps that pack a step's sub-sequences into contiguous buffers and scatter results back
(:class:`PackedRows`, for steps whose kv ranges may overlap)."""

from __future__ import annotations

from typing import NamedTuple, Optional

import torch

from .. import thd

__all__ = ["select_rows", "select_lse", "merge_step", "fold_grad", "place_half", "PackedRows",
           "packed_rows", "gather_packed", "scatter_packed", "scatter_add_packed"]


def select_rows(x: torch.Tensor, layout: str, local_cu_padded: torch.Tensor) -> torch.Tensor:
    """Rows of the rank-local ``x [t, ...]`` a step reads: all of them (``"full"`` /
    ``"global"``) or one half of every local sequence (``thd.read_half``)."""
    if layout in ("full", "global"):
        return x
    return thd.read_half(x, local_cu_padded, "first" if layout == "first_half" else "second")


def select_lse(lse: Optional[torch.Tensor], layout: str,
               local_cu_padded: torch.Tensor) -> Optional[torch.Tensor]:
    """As :func:`select_rows` for an LSE ``[h, t]`` (token dim last); None passes through."""
    if lse is None or layout in ("full", "global"):
        return lse
    return thd.read_half(lse, local_cu_padded, "first" if layout == "first_half" else "second",
                         dim=-1)


def merge_step(out: torch.Tensor, lse: torch.Tensor, out_step: torch.Tensor,
               lse_step: torch.Tensor, q_layout: str, local_cu_padded: torch.Tensor) -> None:
    """Online-softmax merge of a step result into the running ``(out, lse)`` (in place)."""
    if q_layout == "first_half":
        raise ValueError("merge of a first-half step is not needed by any comm type")
    thd.merge_partial(out, lse, out_step, lse_step, local_cu_padded,
                      only_second_half=q_layout == "second_half", inplace=True)


_HALF_OPS = {"full": ("add", "add"), "global": ("add", "add"),
             "first_half": ("add", "none"), "second_half": ("none", "add")}


def fold_grad(grad: torch.Tensor, grad_step: torch.Tensor, layout: str,
              local_cu_padded: torch.Tensor) -> None:
    """``grad += grad_step`` on the rows the step covered (in place; ``thd.grad_correction``)."""
    first, second = _HALF_OPS[layout]
    thd.grad_correction(grad, grad_step, local_cu_padded, first, second, inplace=True)


def place_half(dst: torch.Tensor, half_vals: torch.Tensor, layout: str,
               local_cu_padded: torch.Tensor, token_dim_last: bool = False) -> None:
    """Write a one-half result into ``dst`` (in place): outputs ``[t, ...]`` or, with
    ``token_dim_last``, LSE ``[h, t]``."""
    ops = ("copy", "none") if layout == "first_half" else ("none", "copy")
    if token_dim_last:
        dst, half_vals = dst.movedim(-1, 0), half_vals.movedim(-1, 0)
    thd.grad_correction(dst, half_vals, local_cu_padded, ops[0], ops[1], inplace=True)


# --------------------------------------------------------------------------
# packed buffers of a step (sync-free row maps)
# --------------------------------------------------------------------------


class PackedRows(NamedTuple):
    """Where every row of a packed buffer comes from: sub-sequence ``i`` occupies packed rows
    ``[cu[i], cu[i+1])`` and reads source rows ``[start[i], start[i] + cu[i+1] - cu[i])``."""

    valid: torch.Tensor  # bool [packed]: the packed row belongs to a sub-sequence
    src: torch.Tensor  # int64 [packed]: its source row (clamped into range when not valid)
    src_rows: int  # rows of the source tensor


def packed_rows(cu: torch.Tensor, starts: torch.Tensor, packed: int, src_rows: int
                ) -> PackedRows:
    """Row map of a packed buffer of ``packed`` rows (host int, at least ``cu[-1]``).

    ``cu`` int32 ``[m+1]`` (packed offsets), ``starts`` int ``[m+1]`` (source start of every
    sub-sequence; the last entry is ignored). Source ranges may overlap (kv read by two
    sub-sequences) and come in any order. Binary search per packed row: no sync.
    """
    c = cu.long()
    m = c.numel() - 1
    d = torch.arange(packed, device=cu.device, dtype=torch.int64)
    seg = torch.searchsorted(c[1:].contiguous(), d, right=True)  # m past the last row
    s = torch.cat([starts[:-1].long(), starts.new_zeros(1, dtype=torch.int64)])
    first = torch.cat([c[:-1], c[-1:]])
    src = s[seg] + (d - first[seg])
    valid = seg < m
    return PackedRows(valid, src.clamp(0, max(src_rows - 1, 0)), src_rows)


def gather_packed(x: torch.Tensor, rows: PackedRows, dim: int = 0) -> torch.Tensor:
    """Packed buffer of ``x`` (differentiable): rows outside every sub-sequence are zero."""
    d = dim % x.dim()
    if x.shape[d] == 0:
        shape = list(x.shape)
        shape[d] = rows.valid.numel()
        return x.new_zeros(shape)
    got = x.index_select(d, rows.src)
    shape = [1] * x.dim()
    shape[d] = -1
    return got.masked_fill(~rows.valid.view(shape), 0)


def _targets(rows: PackedRows) -> torch.Tensor:
    # rows outside every sub-sequence go to a dummy row past the end (dropped afterwards)
    return torch.where(rows.valid, rows.src, torch.full_like(rows.src, rows.src_rows))


def scatter_packed(x_p: torch.Tensor, rows: PackedRows, fill: float, dim: int = 0
                   ) -> torch.Tensor:
    """Inverse of :func:`gather_packed` for **disjoint** sub-sequences (q side): a tensor with
    ``rows.src_rows`` rows at ``dim``, ``fill`` where no sub-sequence wrote (differentiable)."""
    y = x_p.movedim(dim, 0)
    out = y.new_full((rows.src_rows + 1,) + tuple(y.shape[1:]), fill)
    out = out.index_copy(0, _targets(rows), y)
    return out[: rows.src_rows].movedim(0, dim)


def scatter_add_packed(x_p: torch.Tensor, rows: PackedRows) -> torch.Tensor:
    """Sum the packed rows into their source rows (kv gradients: a kv row read by several
    sub-sequences gets the sum of their contributions)."""
    out = x_p.new_zeros((rows.src_rows + 1,) + tuple(x_p.shape[1:]))
    out.index_add_(0, _targets(rows), x_p)
    return out[: rows.src_rows]
