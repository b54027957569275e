"""``cp_comm_type="all_gather"``: all-gather K/V, attend with the local Q.

Forward: K and V (stacked, one collective) are all-gathered and put in global contiguous order
with ``thd.reorder_to_contiguous``; the local q attends in the steps of
:func:`~rocm_attn.cp.steps.all_gather_step_metas` (causal: one step per local half, each with
its own cu_seqlens and bottom-right causal offset; no mask: one step) and the halves are placed
into the output; with a window or chunking the steps are the pieces of
:mod:`~rocm_attn.varlen.bands` of both local halves against the whole kv sequence, run on packed
buffers and merged by index (several calls may cover one row; :mod:`~rocm_attn.varlen.packed`).
Backward: K/V are gathered again (not saved: saves ``cp`` x the kv memory),
every step's dK/dV accumulate into a global fp32 (fp64) buffer, which is put back in rank
order (``thd.reorder_to_rank_sharded``) and reduce-scattered.
"""

from __future__ import annotations

import torch

from .. import thd
from ..varlen import packed
from ..varlen.backends import accum_dtype
from ..varlen.max_logit import call_max_logit, combine
from . import comm, layouts
from .autograd import make_cp_function
from .steps import CPPlan, all_gather_step_metas, uses_packed_steps

__all__ = ["AllGatherAttnFunc"]


def _gather_kv(k, v, plan: CPPlan):
    kv = comm.all_gather_tokens(torch.stack([k, v], dim=1), plan.group, plan.cp)
    kv = thd.reorder_to_contiguous(kv, plan.cu_seqlens_kv_padded, plan.cp)
    return kv[:, 0], kv[:, 1]  # [T, h_kv, d] each, global order


def all_gather_forward(q, k, v, plan: CPPlan):
    cdt = accum_dtype(q.dtype)
    cu_q = plan.local_cu_q_padded
    k_g, v_g = _gather_kv(k, v, plan)
    t = q.shape[0]
    rows = packed.accumulator_rows(t) if uses_packed_steps(plan, "all_gather") else t
    out = torch.zeros((rows,) + tuple(q.shape[1:]), dtype=cdt, device=q.device)
    lse = torch.full((q.shape[1], rows), float("-inf"), dtype=cdt, device=q.device)
    fresh = True  # no packed call merged yet: the first one writes
    max_logit = None
    for meta in all_gather_step_metas(plan):
        if plan.return_max_logit:
            q_m = q if meta.packed_kv_rows is not None else layouts.select_rows(
                q, meta.q_layout, cu_q)
            max_logit = combine(max_logit, call_max_logit(plan.backend, q_m, k_g, meta,
                                                          plan.softmax_scale))
        if meta.packed_kv_rows is not None:  # pieces: merge (several may cover one row)
            packed.forward_into(out, lse, plan.backend, q, k_g, v_g, meta, plan.softmax_scale,
                                first=fresh)
            fresh = False
            continue
        q_s = layouts.select_rows(q, meta.q_layout, cu_q)
        o_s, l_s = plan.backend.forward(q_s, k_g, v_g, meta, plan.softmax_scale)
        if meta.q_layout == "full":
            out.copy_(o_s)
            lse.copy_(l_s)
        else:
            layouts.place_half(out, o_s.to(cdt), meta.q_layout, cu_q)
            layouts.place_half(lse, l_s.to(cdt), meta.q_layout, cu_q, token_dim_last=True)
    if max_logit is None:
        max_logit = q.new_full((q.shape[1],) if plan.return_max_logit else (0,), float("-inf"),
                               dtype=torch.float32)
    return out[:t].to(q.dtype), lse[:, :t].contiguous(), max_logit


def all_gather_backward(dout, dlse, q, k, v, out, lse, plan: CPPlan):
    cdt = accum_dtype(q.dtype)
    k_g, v_g = _gather_kv(k, v, plan)
    extra = 1 if uses_packed_steps(plan, "all_gather") else 0  # dummy rows of packed steps
    t, t_g = q.shape[0], k_g.shape[0]
    dq = torch.zeros((t + extra,) + tuple(q.shape[1:]), dtype=cdt, device=q.device)
    dkv = torch.zeros((t_g + extra, 2) + tuple(k_g.shape[1:]), dtype=cdt, device=q.device)
    for meta in all_gather_step_metas(plan):
        if meta.packed_kv_rows is not None:
            packed.backward_into(dq, dkv[:, 0], dkv[:, 1], plan.backend, dout, q, k_g, v_g, out,
                                 lse, dlse, meta, plan.softmax_scale)
            continue
        dk_s, dv_s = layouts.step_backward(plan, meta, dq, dout, q, k_g, v_g, out, lse, dlse)
        dkv[:, 0] += dk_s
        dkv[:, 1] += dv_s
    dkv = thd.reorder_to_rank_sharded(dkv[:t_g], plan.cu_seqlens_kv_padded, plan.cp)
    dkv = comm.reduce_scatter_tokens(dkv, plan.group, plan.cp)
    return dq[:t].to(q.dtype), dkv[:, 0].to(k.dtype), dkv[:, 1].to(v.dtype)


AllGatherAttnFunc = make_cp_function(
    "AllGatherAttnFunc", all_gather_forward, all_gather_backward,
    "Differentiable all-gather CP attention; explicit collectives in forward and backward.")
