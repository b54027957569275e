"""Several attention calls over the same q / k / v merged into one result: the calls of a
mask that one flash-style call cannot express (a top-left causal mask between different q and
kv lengths, :func:`rocm_attn.varlen.pieces.whole_sequence_metas`). One call runs as is."""

from __future__ import annotations

from typing import List, Optional

import torch

from . import packed
from .backends import accum_dtype
from .meta import StepMeta

__all__ = ["forward_calls", "backward_calls"]


def forward_calls(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, metas: List[StepMeta],
                  backend, scale: float):
    """``(out, lse)`` of the calls ``metas`` merged (online softmax): ``out`` in the
    accumulation dtype, ``lse [h_q, t_q]``; zero / ``-inf`` at rows no call covers."""
    if len(metas) == 1:
        return backend.forward(q, k, v, metas[0], scale)
    cdt = accum_dtype(q.dtype)
    rows = packed.accumulator_rows(q.shape[0])
    out = torch.zeros((rows,) + tuple(q.shape[1:]), dtype=cdt, device=q.device)
    lse = torch.full((q.shape[1], rows), float("-inf"), dtype=cdt, device=q.device)
    for i, meta in enumerate(metas):
        packed.forward_into(out, lse, backend, q, k, v, meta, scale, first=i == 0)
    return out[:-1], lse[:, :-1]


def backward_calls(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                   out: torch.Tensor, lse: torch.Tensor, dlse: Optional[torch.Tensor],
                   metas: List[StepMeta], backend, scale: float):
    """``(dq, dk, dv)`` of :func:`forward_calls` (``out`` / ``lse`` its merged result)."""
    if len(metas) == 1:
        return backend.backward(dout, q, k, v, out, lse, dlse, metas[0], scale)
    cdt = accum_dtype(q.dtype)
    dq = q.new_zeros((q.shape[0] + 1,) + tuple(q.shape[1:]), dtype=cdt)
    dk, dv = (k.new_zeros((k.shape[0] + 1,) + tuple(k.shape[1:]), dtype=cdt) for _ in range(2))
    for meta in metas:
        packed.backward_into(dq, dk, dv, backend, dout, q, k, v, out, lse, dlse, meta, scale)
    return dq[:-1], dk[:-1], dv[:-1]
