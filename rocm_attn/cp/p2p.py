"""``cp_comm_type="p2p"``: ring attention over dual-chunk shards.

Forward: ``cp`` steps; at step ``s`` this rank holds the kv of ``kv_rank = (rank - s) % cp``,
posts the exchange that brings the next one (``RingExchange``: batched isend/irecv, on a side
stream on GPUs) *before* computing the step, computes it (metadata from
:func:`~rocm_attn.cp.steps.ring_step_metas`: diagonal / below / above under a causal mask) and
merges it into the accumulators with ``thd.merge_rows_`` / ``thd.merge_partial``, then waits
for the exchange. The kv held at the last step (that of ``rank + 1``) is kept for the backward.

With a window or chunking a step may be several attention calls (one per piece kind, see
:mod:`~rocm_attn.varlen.bands`), run on packed buffers and merged by index into accumulators with
a dummy row (:mod:`~rocm_attn.varlen.packed`), or none when the mask cannot reach that step's kv:
its compute is skipped, its exchange still runs (the kv must travel on to the ranks that need
it, so every rank makes the same exchanges).

Backward: the ring **in reverse**. Iteration ``i`` computes forward step ``cp - 1 - i``, i.e.
the kv of ``(rank + 1 + i) % cp``: the first is the kv the forward ended with (saved, so no
exchange precedes it), the last the rank's own. kv and the dK/dV accumulators travel from
``rank + 1`` to ``rank - 1``: at iteration ``i`` the rank receives the accumulator of the kv it
holds (``rank + 1`` added its iteration ``i - 1`` part), adds its own part and sends it on.
The accumulator of the rank's own kv arrives during the last iteration, so the gradients are
finished there: no hop after the loop (a forward-order ring needs one more, which no compute
hides), and ``cp - 2`` kv exchanges instead of ``cp - 1``. Without the saved kv
(``ROCM_ATTN_CP_SAVE_RING_KV=0``, one kv shard less activation memory) it is fetched first.

Accumulators: fp32 (fp64 for fp64 inputs); with fp16 / bf16 at ``cp = 2`` without window or
chunking every row merges (adds) exactly two partial results, each in fp32 and rounded once,
which is what fp32 accumulators rounded at the end give, so the accumulators are the
output dtype (half the bytes of every pass, no final conversion). With direct flash calls and
no window or chunking the first result written into an accumulator seeds it
(``packed.seed_direct``) instead of being merged into zeros.
"""

from __future__ import annotations

import os

import torch

from ..varlen import packed
from ..varlen.backends import accum_dtype
from ..varlen.max_logit import call_max_logit, combine
from . import comm, layouts
from .autograd import make_cp_function
from .steps import CPPlan, ring_step_metas, uses_direct_calls, uses_packed_steps

__all__ = ["RingAttnFunc"]


def _kv_step(kv: torch.Tensor, layout: str, local_cu_kv: torch.Tensor):
    return (layouts.select_rows(kv[0], layout, local_cu_kv),
            layouts.select_rows(kv[1], layout, local_cu_kv))


def step_max_logits(plan: CPPlan, q, kv, step: int, acc):
    """``acc`` max-combined with the max logit of every call of ring step ``step`` (the step
    tensors its metas index: q / kv rows of their layouts)."""
    cu_q, cu_kv = plan.local_cu_q_padded, plan.local_cu_kv_padded
    for meta in ring_step_metas(plan, step):
        q_s = layouts.select_rows(q, meta.q_layout, cu_q)
        k_s = layouts.select_rows(kv[0], meta.kv_layout, cu_kv)
        # the causal diagonal step: local q against the same sequences' local kv
        acc = combine(acc, call_max_logit(plan.backend, q_s, k_s, meta, plan.softmax_scale,
                                          square=meta.kind == "diagonal"))
    return acc


def forward_step(out, lse, plan: CPPlan, q, kv, step: int, fresh: bool) -> bool:
    """Attention of ring step ``step`` (kv ``[2, t_kv, ...]`` of ``kv_rank``) merged into the
    accumulators; returns the new ``fresh``. ``fresh``: nothing was merged yet; with seeding
    accumulators (:func:`_seeds`) they are then uninitialised and the step writes every row,
    otherwise they are zero / ``-inf`` and only packed calls use it (the first one writes)."""
    cu_q, cu_kv = plan.local_cu_q_padded, plan.local_cu_kv_padded
    for meta in ring_step_metas(plan, step):
        if meta.direct is not None:  # whole tensors, merged by row index
            packed.forward_direct_into(out, lse, plan.backend, q, kv[0], kv[1], meta,
                                       plan.softmax_scale, first=fresh and _seeds(plan))
            fresh = False
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


def backward_step(dq, plan: CPPlan, dout, dlse, q, kv, out, lse, step: int,
                  first: bool = False) -> list:
    """Gradients of ring step ``step``: dQ added into ``dq`` at once; the dK/dV parts come back
    as a list for :func:`fold_kv_grads` (their accumulator arrives later). ``first`` (seeding
    plans only): ``dq`` is uninitialised and this step seeds it."""
    cu_kv = plan.local_cu_kv_padded
    grads, step_dkv = [], None
    for meta in ring_step_metas(plan, step):
        if meta.direct is not None:  # whole tensors
            dc = meta.direct
            dq_s, dk_s, dv_s = plan.backend.backward_direct(dout, q, kv[0], kv[1], out, lse,
                                                            dlse, meta, plan.softmax_scale)
            if first:
                packed.seed_direct(dq, dq_s, dc.q_cover_cu, dc.q_cover_starts, 0.0)
            else:
                packed.add_direct(dq, dq_s, dc.q_src, dc.q_dst)
            grads.append((dc, dk_s, dv_s))
            continue
        k_s, v_s = _kv_step(kv, meta.kv_layout, cu_kv)
        if meta.packed_kv_rows is not None:
            if step_dkv is None:
                step_dkv = kv[0].new_zeros((2, kv[0].shape[0] + 1) + tuple(kv[0].shape[1:]),
                                           dtype=dq.dtype)
                grads.append((None, step_dkv, None))
            packed.backward_into(dq, step_dkv[0], step_dkv[1], plan.backend, dout, q, k_s, v_s,
                                 out, lse, dlse, meta, plan.softmax_scale)
            continue
        dk_s, dv_s = layouts.step_backward(plan, meta, dq, dout, q, k_s, v_s, out, lse, dlse)
        grads.append((meta.kv_layout, dk_s, dv_s))
    return grads


def fold_kv_grads(dkv, grads: list, plan: CPPlan, first: bool = False) -> None:
    """Add a step's dK/dV parts (:func:`backward_step`) into the accumulator ``dkv``;
    ``first`` (seeding plans only): ``dkv`` is uninitialised and these parts seed it."""
    cu_kv = plan.local_cu_kv_padded
    for where, dk_s, dv_s in grads:
        if where is None:  # packed steps' accumulator (dummy row included)
            dkv += dk_s
        elif isinstance(where, str):  # a kv layout
            layouts.fold_grad(dkv[0], dk_s, where, cu_kv)
            layouts.fold_grad(dkv[1], dv_s, where, cu_kv)
        elif first:  # the one DirectCall of a seeding plan's step
            packed.seed_direct(dkv[0], dk_s, where.kv_cover_cu, where.kv_cover_starts, 0.0)
            packed.seed_direct(dkv[1], dv_s, where.kv_cover_cu, where.kv_cover_starts, 0.0)
        else:  # a DirectCall
            packed.add_direct(dkv[0], dk_s, where.kv_src, where.kv_dst)
            packed.add_direct(dkv[1], dv_s, where.kv_src, where.kv_dst)


def _accumulator(plan: CPPlan, rows: int, rest, dtype, device, fill: float, lead=()):
    """A ``lead + (rows,) + rest`` accumulator, plus the dummy row where the plan's steps need
    one: uninitialised for seeding plans (the first step writes every row), else ``fill``."""
    shape = tuple(lead) + (rows + (1 if _dummy_row(plan) else 0),) + tuple(rest)
    if _seeds(plan):
        return torch.empty(shape, dtype=dtype, device=device)
    return torch.full(shape, fill, dtype=dtype, device=device)


def ring_forward(q, k, v, plan: CPPlan):
    """``(out, lse, max_logit, last_kv)``: ``max_logit`` this rank's ``[h_q]`` (empty when not
    asked); ``last_kv`` is the kv ``[2, t_kv, ...]`` held at the last step
    (that of ``rank + 1``) for :func:`ring_backward`, or None when it is not kept (``cp == 1``,
    or :func:`save_ring_kv` off)."""
    cdt = _accumulator_dtype(plan, q.dtype)
    t = q.shape[0]
    out = _accumulator(plan, t, q.shape[1:], cdt, q.device, 0.0)
    lse = _accumulator(plan, t, (), accum_dtype(q.dtype), q.device, float("-inf"),
                       lead=q.shape[1:2])  # [h, rows]
    fresh = True  # nothing merged yet
    kv = torch.stack([k, v])  # [2, t_kv, h_kv, d]: one message per step
    max_logit = q.new_full((q.shape[1],) if plan.return_max_logit else (0,), float("-inf"),
                           dtype=torch.float32)
    for step in range(plan.cp):
        pending = (comm.RingExchange(kv, plan.group, plan.cp, plan.rank, comm.TAG_KV)
                   if step < plan.cp - 1 else None)
        fresh = forward_step(out, lse, plan, q, kv, step, fresh)
        if plan.return_max_logit:
            max_logit = step_max_logits(plan, q, kv, step, max_logit)
        if pending is not None:
            kv = pending.wait()
    last_kv = kv if plan.cp > 1 and save_ring_kv() else None
    return out[:t].to(q.dtype), lse[:, :t].contiguous(), max_logit, last_kv


def ring_backward(dout, dlse, q, k, v, out, lse, plan: CPPlan, last_kv=None):
    """``(dq, dk, dv)`` by the reverse ring (module docstring); ``last_kv``: what
    :func:`ring_forward` kept (None: fetched here)."""
    cp = plan.cp
    cdt = _accumulator_dtype(plan, q.dtype)
    t, t_kv = q.shape[0], k.shape[0]
    local = (k, v)  # only computed on (last iteration), never sent: no stacking copy
    ring = dict(group=plan.group, cp=cp, rank=plan.rank, reverse=True)
    kv = local if cp == 1 else last_kv
    if kv is None:  # the kv of rank + 1: one exchange no compute hides
        kv = comm.RingExchange(torch.stack(local), tag=comm.TAG_KV, **ring).wait()
    dq = _accumulator(plan, t, q.shape[1:], cdt, q.device, 0.0)
    seeds = _seeds(plan)
    dkv = pending_dkv = None
    for i in range(cp):
        step = cp - 1 - i  # the forward step whose kv (of rank + 1 + i) is held now
        pending_kv = (comm.RingExchange(kv, tag=comm.TAG_KV, **ring) if i < cp - 2 else None)
        grads = backward_step(dq, plan, dout, dlse, q, kv, out, lse, step,
                              first=i == 0 and seeds)
        if i == 0:  # the accumulator of this kv starts here
            dkv = _accumulator(plan, t_kv, k.shape[1:], cdt, q.device, 0.0, lead=(2,))
            fold_kv_grads(dkv, grads, plan, first=seeds)
        else:
            dkv = pending_dkv.wait()  # rank + 1's accumulator of the kv held now
            fold_kv_grads(dkv, grads, plan)
        if i < cp - 1:
            pending_dkv = comm.RingExchange(dkv, tag=comm.TAG_DKV, **ring)
        if pending_kv is not None:
            kv = pending_kv.wait()
        elif i == cp - 2:
            kv = local  # the last iteration is the rank's own kv
    return (dq[:t].to(q.dtype), dkv[0, :t_kv].to(k.dtype), dkv[1, :t_kv].to(v.dtype))


def _accumulator_dtype(plan: CPPlan, dtype: torch.dtype) -> torch.dtype:
    """fp32 (fp64), or the input dtype where every row merges two partial results in fp16 /
    bf16 (cp = 2, one call per step): see the module docstring."""
    if plan.cp == 2 and dtype in (torch.float16, torch.bfloat16) and plan.spec.plain:
        return dtype
    return accum_dtype(dtype)


def _seeds(plan: CPPlan) -> bool:
    """Whether the first result written into an accumulator seeds it (every step is one direct
    call: no window or chunking, a backend reading sub-sequences in place)."""
    return plan.spec.plain and uses_direct_calls(plan)


def _dummy_row(plan: CPPlan) -> bool:
    """Accumulators carry a dummy row for packed steps and for direct calls (slack entries of
    their row maps land there)."""
    return uses_packed_steps(plan, "p2p") or uses_direct_calls(plan)


def save_ring_kv() -> bool:
    """Whether the forward keeps its last kv for the backward (env ``ROCM_ATTN_CP_SAVE_RING_KV``,
    default on; ``0`` saves one kv shard of activation memory per call for one exchange in the
    backward that no compute hides)."""
    return os.environ.get("ROCM_ATTN_CP_SAVE_RING_KV", "1") != "0"


RingAttnFunc = make_cp_function(
    "RingAttnFunc", ring_forward, ring_backward,
    "Differentiable ring attention; explicit communication in forward and backward.")
