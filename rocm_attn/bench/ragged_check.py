"""The ragged benchmark's correctness check: every timed column's output (and our gradients)
against a float64 oracle on a few users of the row (ragged_rows.sample_users).

Users are independent (a user's candidates attend only to its own history), so a user's rows of
a batched call are checked against that user alone in float64: out for every column, and for
the forward+backward columns dq, dK and dV of ours (the user's rows of the batched gradients).
Device-agnostic torch, tested on CPU (tests/test_bench_ragged_rows.py).
"""

from __future__ import annotations

import math
from typing import Dict, Optional, Tuple

import torch

# Relative error bounds (||x - ref|| / ||ref|| over the sampled users) of a 16-bit output and of
# 16-bit gradients: a few roundings of the dtype, as the GPU tests bound the kernels
# (tests/test_small_seq.py TOL_LOW, 1e-2 floor for bf16 gradients).
TOL_OUT = {torch.bfloat16: 1e-2, torch.float16: 5e-3}
TOL_GRAD = {torch.bfloat16: 2e-2, torch.float16: 1e-2}


def oracle_user(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                dout: Optional[torch.Tensor] = None) -> Tuple[torch.Tensor, ...]:
    """float64 attention of one user: ``q [c, h_q, d]`` over ``k, v [n, h_kv, d]`` (h_q a
    multiple of h_kv), scale 1/sqrt(d). Returns ``(out,)``, or ``(out, dq, dk, dv)`` with
    ``dout [c, h_q, d]``; all float64 on q's device."""
    q64, k64, v64 = (t.detach().double().requires_grad_(dout is not None) for t in (q, k, v))
    group = q.shape[1] // k.shape[1]
    kx = k64.repeat_interleave(group, dim=1)
    vx = v64.repeat_interleave(group, dim=1)
    scores = torch.einsum("chd,nhd->hcn", q64, kx) / math.sqrt(q.shape[-1])
    out = torch.einsum("hcn,nhd->chd", torch.softmax(scores, dim=-1), vx)
    if dout is None:
        return (out.detach(),)
    dq, dk, dv = torch.autograd.grad(out, (q64, k64, v64), dout.double())
    return out.detach(), dq, dk, dv


def rel_err(x: torch.Tensor, ref: torch.Tensor) -> float:
    """||x - ref|| / ||ref|| in float64 (the absolute norm where ref is zero); inf where x has a
    NaN or an inf, so that a non-finite value never passes."""
    x = x.detach().double()
    if not bool(torch.isfinite(x).all()):
        return math.inf
    num = (x - ref).norm().item()
    den = ref.norm().item()
    return num / den if den > 0 else num


def user_slices(cu_q: torch.Tensor, cu_kv: torch.Tensor, u: int) -> Tuple[slice, slice]:
    """User u's rows of the THD q / out and of K / V, from CPU offsets."""
    return (slice(int(cu_q[u]), int(cu_q[u + 1])), slice(int(cu_kv[u]), int(cu_kv[u + 1])))


def check_outputs(outs: Dict[str, torch.Tensor], refs: Dict[int, torch.Tensor], cu_q, cands,
                  dtype: torch.dtype) -> Dict[str, dict]:
    """Per column: the relative error of its output over the sampled users and whether it is
    within TOL_OUT. ``outs`` maps a column to its output, THD ``[total_q, h_q, d]`` or padded
    ``[users, h_q, max_q, d]`` (SDPA); ``refs`` a sampled user to its float64 out
    ``[c, h_q, d]``; ``cu_q`` and ``cands`` are the CPU offsets and counts."""
    result = {}
    ref = torch.cat([refs[u] for u in refs])
    for name, out in outs.items():
        parts = []
        for u in refs:
            if out.dim() == 4:  # padded [users, h_q, max_q, d]
                parts.append(out[u, :, :int(cands[u])].transpose(0, 1))
            else:
                parts.append(out[int(cu_q[u]):int(cu_q[u + 1])])
        err = rel_err(torch.cat(parts).to(ref.device), ref)
        result[name] = {"rel_err": err, "ok": err < TOL_OUT[dtype]}
    return result


def check_grads(grads: Tuple[torch.Tensor, torch.Tensor, torch.Tensor],
                refs: Dict[int, Tuple[torch.Tensor, torch.Tensor, torch.Tensor]], cu_q, cu_kv,
                dtype: torch.dtype) -> dict:
    """dq, dK, dV (THD, of the whole batch) against the sampled users' float64 gradients:
    the worst relative error of the three, and whether each is within TOL_GRAD."""
    errs = {}
    for i, name in enumerate(("dq", "dk", "dv")):
        parts, ref_parts = [], []
        for u, ref in refs.items():
            rows_q, rows_kv = user_slices(cu_q, cu_kv, u)
            parts.append(grads[i][rows_q if name == "dq" else rows_kv])
            ref_parts.append(ref[i])
        ref_cat = torch.cat(ref_parts)
        errs[name] = rel_err(torch.cat(parts).to(ref_cat.device), ref_cat)
    worst = max(errs.values())
    return {"rel_err": worst, "per_grad": errs, "ok": worst < TOL_GRAD[dtype]}
