"""``cp_comm_type="a2a"`` (Ulysses): all-to-all from sequence sharding to head sharding.

Forward: q and the stacked k/v go through ``comm.seq_to_head`` (all_to_all, then
``thd.reorder_to_contiguous``): every rank holds whole sequences for ``h_q/cp`` query heads and
the matching ``h_kv/cp`` kv heads (GQA groups stay on one rank since both head counts split into
``cp`` contiguous blocks), attends once (:func:`~rocm_attn.cp.steps.a2a_step_meta`), and the
output and LSE go back with ``comm.head_to_seq``. The head-sharded q/k/v, output and LSE are
saved, so the backward needs only the dO (and dLSE) all-to-all in and the dQ/dK/dV one out.
Needs ``h_q % cp == 0`` and ``h_kv % cp == 0`` (checked by the API).
"""

from __future__ import annotations

import torch

from ..second_derivative import no_second_derivative
from ..varlen.backends import accum_dtype
from ..varlen.calls import backward_calls, forward_calls
from ..varlen.max_logit import call_max_logit, combine
from . import comm
from .steps import CPPlan, a2a_step_metas

__all__ = ["A2AAttnFunc"]


def _lse_to_seq(lse_h, plan: CPPlan):
    # [h/cp, T] -> [T, h/cp] -> [t, h] -> [h, t]
    return comm.head_to_seq(lse_h.t(), 1, plan.cu_seqlens_q_padded, plan.group, plan.cp).t()


class A2AAttnFunc(torch.autograd.Function):
    """Differentiable Ulysses CP attention; explicit all-to-all in forward and backward."""

    @staticmethod
    def forward(ctx, q, k, v, plan: CPPlan):
        cp, g = plan.cp, plan.group
        q_h = comm.seq_to_head(q, 1, plan.cu_seqlens_q_padded, g, cp)
        kv_h = comm.seq_to_head(torch.stack([k, v], dim=1), 2, plan.cu_seqlens_kv_padded, g, cp)
        k_h, v_h = kv_h[:, 0], kv_h[:, 1]
        meta = a2a_step_metas(plan)
        out_h, lse_h = forward_calls(q_h, k_h, v_h, meta, plan.backend, plan.softmax_scale)
        max_logit = q.new_empty((0,), dtype=torch.float32)
        if plan.return_max_logit:  # this rank's head block; the caller max-reduces the group
            h_q, hb = q.shape[1], q_h.shape[1]
            max_logit = torch.full((h_q,), float("-inf"), dtype=torch.float32, device=q.device)
            part = None
            # equal q and kv lengths: one cu_seqlens tensor for both, or a top-left mask
            # (whose causal pieces start queries and keys together)
            square = plan.top_left or plan.cu_seqlens_q is plan.cu_seqlens_kv
            for m in meta:
                part = combine(part, call_max_logit(plan.backend, q_h, k_h, m,
                                                    plan.softmax_scale, square))
            max_logit[plan.rank * hb:(plan.rank + 1) * hb] = part
        out_h = out_h.to(q.dtype)
        lse_h = lse_h.to(accum_dtype(q.dtype))
        out = comm.head_to_seq(out_h, 1, plan.cu_seqlens_q_padded, g, cp)
        lse = _lse_to_seq(lse_h, plan).contiguous()
        ctx.save_for_backward(q_h, k_h, v_h, out_h, lse_h, q, k, v)
        ctx.plan, ctx.meta = plan, meta
        ctx.dtypes = (q.dtype, k.dtype, v.dtype)
        ctx.out_shape, ctx.lse_shape = tuple(out.shape), tuple(lse.shape)
        ctx.set_materialize_grads(False)
        ctx.mark_non_differentiable(max_logit)
        return out, lse, max_logit

    @staticmethod
    def backward(ctx, dout, dlse, _dmax_logit):
        q_h, k_h, v_h, out_h, lse_h, q, k, v = ctx.saved_tensors
        plan, meta = ctx.plan, ctx.meta
        cp, g = plan.cp, plan.group
        # every rank must make the same collectives: a missing cotangent is sent as zeros
        if dout is None:
            dout = torch.zeros(ctx.out_shape, dtype=out_h.dtype, device=out_h.device)
        dout_h = comm.seq_to_head(dout, 1, plan.cu_seqlens_q_padded, g, cp)
        dlse_h = None
        if plan.return_lse:  # the LSE is visible to the caller on every rank
            if dlse is None:
                dlse = torch.zeros(ctx.lse_shape, dtype=lse_h.dtype, device=lse_h.device)
            dlse_h = comm.seq_to_head(dlse.t(), 1, plan.cu_seqlens_q_padded, g, cp).t()
        with torch.no_grad():
            dq_h, dk_h, dv_h = backward_calls(dout_h, q_h, k_h, v_h, out_h, lse_h, dlse_h, meta,
                                              plan.backend, plan.softmax_scale)
            dq = comm.head_to_seq(dq_h, 1, plan.cu_seqlens_q_padded, g, cp)
            dkv = comm.head_to_seq(torch.stack([dk_h, dv_h], dim=1), 2,
                                   plan.cu_seqlens_kv_padded, g, cp)
        qd, kd, vd = ctx.dtypes
        grads = (dq.to(qd), dkv[:, 0].to(kd), dkv[:, 1].to(vd))
        return (*no_second_derivative("attn_with_cp", grads, (q, k, v)), None)
