"""``cp_comm_type="a2a+p2p"``: Ulysses all-to-all inside groups of ``a`` ranks, ring across the
``G = cp / a`` groups (hierarchical context parallelism: a2a on the fast intra-node links, p2p
between nodes).

Why it composes: CP rank ``r = g*a + i`` (``g`` its rank in the ring group, ``i`` in the a2a
group) holds dual-chunk chunks ``r`` and ``2cp-1-r`` of every sequence. The ``a`` ranks of
group ``g`` together hold chunks ``g*a .. g*a+a-1`` and ``2cp-a-g*a .. 2cp-1-g*a``: exactly
coarse chunks ``g`` and ``2G-1-g`` of the same sequence cut into ``2G`` chunks of ``a*H``
tokens. So after an all-to-all inside the group (tokens of the group, ``h/a`` heads) and a
fixed row permutation (:func:`coarse_rows`), every rank holds a dual-chunk shard of a
``G``-rank ring, and the p2p ring (:mod:`.p2p`, every mask it supports) runs on it unchanged;
outputs, LSE and gradients go back the same way.

``cp_group`` is the pair ``(a2a_group, p2p_group)``; the CP rank (which shard a process holds)
is ``p2p_rank * a + a2a_rank``.
"""

from __future__ import annotations

import dataclasses
from typing import Tuple

import torch

from ..second_derivative import no_second_derivative
from . import comm
from .p2p import ring_backward, ring_forward
from .steps import CPPlan, side_geometry

__all__ = ["A2AP2PAttnFunc", "coarse_rows", "ring_plan"]


def coarse_rows(cu_seqlens_padded: torch.Tensor, cp: int, a: int, t: int) -> torch.Tensor:
    """Row of the group-gathered tensor (``a`` rank-local shards of ``t`` rows, a2a-group order)
    that lands at every row of the coarse dual-chunk shard of the ``cp / a``-rank ring.

    Per sequence (fine chunk ``H``, local start ``s = cu_padded / cp``): coarse first half =
    members' first halves in member order; coarse second half = members' second halves in
    reverse member order (higher ranks hold earlier second-half chunks). Slack rows follow
    member by member. Returns int64 ``[a * t]``, a permutation; no sync.
    """
    p = cu_seqlens_padded.long()
    dev = p.device
    loc = torch.div(p, cp, rounding_mode="floor")  # fine local starts [b+1]
    coarse = loc * a  # coarse local starts
    rows = torch.arange(a * t, device=dev, dtype=torch.int64)
    seq = torch.searchsorted(coarse[1:].contiguous(), rows, right=True)
    b = p.numel() - 1
    ext = lambda v: torch.cat([v, v.new_zeros(1)])  # noqa: E731 - index b: slack
    h = ext(torch.div(loc[1:] - loc[:-1], 2, rounding_mode="floor"))[seq]
    off = rows - ext(coarse[:-1])[seq]
    hs = h.clamp(min=1)
    blk = torch.div(off, hs, rounding_mode="floor")  # 0 .. 2a-1: fine chunk within the slot
    first = blk < a
    member = torch.where(first, blk, 2 * a - 1 - blk)
    within = off - blk * h + torch.where(first, torch.zeros_like(h), h)
    src = member * t + ext(loc[:-1])[seq] + within
    # slack: member by member after the last sequence
    end = loc[-1]
    slack = max(t, 0) - end
    e = rows - a * end
    sm = torch.div(e, slack.clamp(min=1), rounding_mode="floor")
    src_slack = sm * t + end + (e - sm * slack)
    return torch.where(seq >= b, src_slack, src).clamp(0, max(a * t - 1, 0))


def _to_coarse(x: torch.Tensor, head_dim: int, idx: torch.Tensor, group, a: int):
    """Rank-local tokens, all heads -> the group's tokens in coarse order, heads ``/ a``."""
    h = x.shape[head_dim]
    shape = list(x.shape)
    blocks = x.reshape(shape[:head_dim] + [a, h // a] + shape[head_dim + 1:]).movedim(
        head_dim, 0)  # [a, t, ..., h/a, ...]: block j goes to member j
    got = comm.all_to_all_tokens(blocks, group, a)  # block j: member j's tokens, my heads
    return got.reshape([a * shape[0]] + list(got.shape[2:])).index_select(0, idx)


def _from_coarse(y: torch.Tensor, head_dim: int, idx: torch.Tensor, group, a: int):
    """Inverse of :func:`_to_coarse`."""
    gathered = torch.empty_like(y).index_copy_(0, idx, y)
    t = y.shape[0] // a
    got = comm.all_to_all_tokens(gathered.reshape([a, t] + list(y.shape[1:])), group, a)
    merged = got.movedim(0, head_dim)  # [t, ..., a, h/a, ...]
    shape = list(merged.shape)
    return merged.reshape(shape[:head_dim] + [shape[head_dim] * shape[head_dim + 1]]
                          + shape[head_dim + 2:])


def ring_plan(plan: CPPlan, p2p_group, g: int, num_groups: int, a: int) -> CPPlan:
    """The plan of the ring across groups: ``num_groups`` ranks, coarse shards of ``a`` times
    the rows, the same masks, backend and global cu_seqlens."""
    return dataclasses.replace(
        plan, group=p2p_group, cp=num_groups, rank=g, rows_q=a * plan.rows_q,
        rows_kv=a * plan.rows_kv,
        geom_q=side_geometry(plan.cu_seqlens_q, plan.cu_seqlens_q_padded, num_groups),
        geom_kv=side_geometry(plan.cu_seqlens_kv, plan.cu_seqlens_kv_padded, num_groups),
        meta_cache={})


class A2AP2PAttnFunc(torch.autograd.Function):
    """Differentiable hierarchical CP attention: a2a in, ring, a2a out (and back in backward)."""

    @staticmethod
    def forward(ctx, q, k, v, plan: CPPlan, groups: Tuple):
        a2a_group, a, ring = groups
        idx_q = coarse_rows(plan.cu_seqlens_q_padded, plan.cp, a, q.shape[0])
        idx_kv = coarse_rows(plan.cu_seqlens_kv_padded, plan.cp, a, k.shape[0])
        q_c = _to_coarse(q, 1, idx_q, a2a_group, a)
        kv_c = _to_coarse(torch.stack([k, v], dim=1), 2, idx_kv, a2a_group, a)
        k_c, v_c = kv_c[:, 0].contiguous(), kv_c[:, 1].contiguous()
        out_c, lse_c, ml_c, last_kv = ring_forward(q_c, k_c, v_c, ring)
        max_logit = ml_c
        if plan.return_max_logit:  # this rank's head block of the a2a group
            hb, i = q_c.shape[1], comm.group_info(a2a_group)[1]
            max_logit = q.new_full((q.shape[1],), float("-inf"), dtype=torch.float32)
            max_logit[i * hb:(i + 1) * hb] = ml_c
        out = _from_coarse(out_c, 1, idx_q, a2a_group, a)
        lse = _from_coarse(lse_c.t().contiguous(), 1, idx_q, a2a_group, a).t().contiguous()
        ctx.save_for_backward(q_c, k_c, v_c, out_c, lse_c, idx_q, idx_kv, last_kv, q, k, v)
        ctx.plan, ctx.groups = plan, groups
        ctx.dtypes = (q.dtype, k.dtype, v.dtype)
        ctx.out_shape, ctx.lse_shape = tuple(out.shape), tuple(lse.shape)
        ctx.set_materialize_grads(False)
        ctx.mark_non_differentiable(max_logit)
        return out, lse, max_logit

    @staticmethod
    def backward(ctx, dout, dlse, _dmax_logit):
        q_c, k_c, v_c, out_c, lse_c, idx_q, idx_kv, last_kv, q, k, v = ctx.saved_tensors
        a2a_group, a, ring = ctx.groups
        # every rank must make the same collectives: a missing cotangent is sent as zeros
        if dout is None:
            dout = torch.zeros(ctx.out_shape, dtype=out_c.dtype, device=out_c.device)
        dout_c = _to_coarse(dout, 1, idx_q, a2a_group, a)
        dlse_c = None
        if ctx.plan.return_lse:
            if dlse is None:
                dlse = torch.zeros(ctx.lse_shape, dtype=lse_c.dtype, device=lse_c.device)
            dlse_c = _to_coarse(dlse.t().contiguous(), 1, idx_q, a2a_group, a).t().contiguous()
        with torch.no_grad():
            dq_c, dk_c, dv_c = ring_backward(dout_c, dlse_c, q_c, k_c, v_c, out_c, lse_c, ring,
                                             last_kv)
            dq = _from_coarse(dq_c, 1, idx_q, a2a_group, a)
            dkv = _from_coarse(torch.stack([dk_c, dv_c], dim=1), 2, idx_kv, a2a_group, a)
        qd, kd, vd = ctx.dtypes
        grads = (dq.to(qd), dkv[:, 0].to(kd), dkv[:, 1].to(vd))
        return (*no_second_derivative("attn_with_cp", grads, (q, k, v)), None, None)
