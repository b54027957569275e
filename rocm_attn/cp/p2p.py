"""``cp_comm_type="p2p"``: ring attention over dual-chunk shards.

Forward: ``cp`` steps; at step ``s`` this rank holds the kv of ``kv_rank = (rank - s) % cp``,
posts the exchange that brings the next one (``RingExchange``: batched isend/irecv, on a side
stream on GPUs) *before* computing the step, computes it (metadata from
:func:`~rocm_attn.cp.steps.ring_step_metas`: diagonal / below / above under a causal mask) and
merges it into fp32 (fp64) accumulators with ``thd.merge_partial`` (``only_second_half`` for
``above`` steps), then waits for the exchange. The output is rounded to the input dtype once.

With a window or chunking a step may be several attention calls (one per piece kind, see
:mod:`~rocm_attn.cp.bands`), run on packed buffers and merged by index into accumulators with
a dummy row (:mod:`~rocm_attn.cp.packed`), or none when the mask cannot reach that step's kv:
its compute is skipped, its exchange still runs (the kv must travel on to the ranks that need
it, so every rank makes the same exchanges).

Backward: the same ring. dQ accumulates locally; dK/dV accumulators travel with the kv they
belong to: at step ``s`` the rank receives the accumulator of ``kv_rank`` (from the previous
rank, which added its step ``s-1`` contribution), adds its own step contribution and sends it
on. After the last step one more hop brings every accumulator home, rounded to the input
dtype first (the finished gradient: half the bytes of the one exchange no compute hides). The kv exchange of the next
step is posted before the step's compute; the accumulator exchange after it.
"""

from __future__ import annotations

import torch

from . import comm, layouts, packed
from .autograd import make_cp_function
from .backends import accum_dtype
from .steps import CPPlan, ring_step_metas, uses_direct_calls, uses_packed_steps

__all__ = ["RingAttnFunc"]


def _kv_step(kv: torch.Tensor, layout: str, local_cu_kv: torch.Tensor):
    return (layouts.select_rows(kv[0], layout, local_cu_kv),
            layouts.select_rows(kv[1], layout, local_cu_kv))


def forward_step(out, lse, plan: CPPlan, q, kv, step: int, fresh: bool) -> bool:
    """Attention of ring step ``step`` (kv ``[2, t_kv, ...]`` of ``kv_rank``) merged into the
    accumulators; returns the new ``fresh`` (no packed call merged yet)."""
    cu_q, cu_kv = plan.local_cu_q_padded, plan.local_cu_kv_padded
    for meta in ring_step_metas(plan, step):
        if meta.direct is not None:  # whole tensors, merged by row index
            packed.forward_direct_into(out, lse, plan.backend, q, kv[0], kv[1], meta,
                                       plan.softmax_scale)
            continue
        k_s, v_s = _kv_step(kv, meta.kv_layout, cu_kv)
        if meta.packed_kv_rows is not None:
            packed.forward_into(out, lse, plan.backend, q, k_s, v_s, meta, plan.softmax_scale,
                                first=fresh)
            fresh = False
            continue
        q_s = layouts.select_rows(q, meta.q_layout, cu_q)
        o_s, l_s = plan.backend.forward(q_s, k_s, v_s, meta, plan.softmax_scale)
        layouts.merge_step(out, lse, o_s, l_s.to(lse.dtype), meta.q_layout, cu_q)
    return fresh


def backward_step(dq, plan: CPPlan, dout, dlse, q, kv, out, lse, step: int) -> list:
    """Gradients of ring step ``step``: dQ added into ``dq`` at once; the dK/dV parts come back
    as a list for :func:`fold_kv_grads` (their accumulator arrives later)."""
    cu_kv = plan.local_cu_kv_padded
    grads, step_dkv = [], None
    for meta in ring_step_metas(plan, step):
        if meta.direct is not None:  # whole tensors
            dc = meta.direct
            dq_s, dk_s, dv_s = plan.backend.backward_direct(dout, q, kv[0], kv[1], out, lse,
                                                            dlse, meta, plan.softmax_scale)
            packed.add_direct(dq, dq_s, dc.q_src, dc.q_dst)
            grads.append((dc, dk_s, dv_s))
            continue
        k_s, v_s = _kv_step(kv, meta.kv_layout, cu_kv)
        if meta.packed_kv_rows is not None:
            if step_dkv is None:
                step_dkv = kv.new_zeros((2, kv.shape[1] + 1) + tuple(kv.shape[2:]),
                                        dtype=dq.dtype)
                grads.append((None, step_dkv, None))
            packed.backward_into(dq, step_dkv[0], step_dkv[1], plan.backend, dout, q, k_s, v_s,
                                 out, lse, dlse, meta, plan.softmax_scale)
            continue
        dk_s, dv_s = layouts.step_backward(plan, meta, dq, dout, q, k_s, v_s, out, lse, dlse)
        grads.append((meta.kv_layout, dk_s, dv_s))
    return grads


def fold_kv_grads(dkv, grads: list, plan: CPPlan) -> None:
    """Add a step's dK/dV parts (:func:`backward_step`) into the accumulator ``dkv``."""
    cu_kv = plan.local_cu_kv_padded
    for where, dk_s, dv_s in grads:
        if where is None:  # packed steps' accumulator (dummy row included)
            dkv += dk_s
        elif isinstance(where, str):  # a kv layout
            layouts.fold_grad(dkv[0], dk_s, where, cu_kv)
            layouts.fold_grad(dkv[1], dv_s, where, cu_kv)
        else:  # a DirectCall
            packed.add_direct(dkv[0], dk_s, where.kv_src, where.kv_dst)
            packed.add_direct(dkv[1], dv_s, where.kv_src, where.kv_dst)


def ring_forward(q, k, v, plan: CPPlan):
    cdt = accum_dtype(q.dtype)
    t = q.shape[0]
    rows = packed.accumulator_rows(t) if _dummy_row(plan) else t
    out = torch.zeros((rows,) + tuple(q.shape[1:]), dtype=cdt, device=q.device)
    lse = torch.full((q.shape[1], rows), float("-inf"), dtype=cdt, device=q.device)
    fresh = True  # no packed call merged yet: the first one writes
    kv = torch.stack([k, v])  # [2, t_kv, h_kv, d]: one message per step
    for step in range(plan.cp):
        pending = (comm.RingExchange(kv, plan.group, plan.cp, plan.rank, comm.TAG_KV)
                   if step < plan.cp - 1 else None)
        fresh = forward_step(out, lse, plan, q, kv, step, fresh)
        if pending is not None:
            kv = pending.wait()
    return out[:t].to(q.dtype), lse[:, :t].contiguous()


def ring_backward(dout, dlse, q, k, v, out, lse, plan: CPPlan):
    cdt = accum_dtype(q.dtype)
    extra = 1 if _dummy_row(plan) else 0  # dummy rows of packed / direct steps
    t, t_kv = q.shape[0], k.shape[0]
    dq = torch.zeros((t + extra,) + tuple(q.shape[1:]), dtype=cdt, device=q.device)
    kv = torch.stack([k, v])
    # accumulator of the kv held
    dkv = torch.zeros((2, t_kv + extra) + tuple(k.shape[1:]), dtype=cdt, device=q.device)
    pending_dkv = None
    for step in range(plan.cp):
        pending_kv = (comm.RingExchange(kv, plan.group, plan.cp, plan.rank, comm.TAG_KV)
                      if step < plan.cp - 1 else None)
        grads = backward_step(dq, plan, dout, dlse, q, kv, out, lse, step)
        if pending_dkv is not None:
            dkv = pending_dkv.wait()  # the accumulator of the kv received for this step
        fold_kv_grads(dkv, grads, plan)
        if plan.cp > 1:
            # the last hop only carries the finished dK/dV home: rounded to the input dtype
            # before it travels (half the bytes of the one exchange no compute hides)
            last = step == plan.cp - 1
            send = dkv[:, :t_kv].to(k.dtype).contiguous() if last else dkv
            pending_dkv = comm.RingExchange(send, plan.group, plan.cp, plan.rank, comm.TAG_DKV)
        if pending_kv is not None:
            kv = pending_kv.wait()
    if pending_dkv is not None:
        home = pending_dkv.wait()  # the finished dK/dV of this rank's own kv
        return dq[:t].to(q.dtype), home[0], home[1]
    return (dq[:t].to(q.dtype), dkv[0, :t_kv].to(k.dtype), dkv[1, :t_kv].to(v.dtype))


def _dummy_row(plan: CPPlan) -> bool:
    """Accumulators carry a dummy row for packed steps and for direct calls (slack entries of
    their row maps land there)."""
    return uses_packed_steps(plan, "p2p") or uses_direct_calls(plan)


RingAttnFunc = make_cp_function(
    "RingAttnFunc", ring_forward, ring_backward,
    "Differentiable ring attention; explicit communication in forward and backward.")
