"""Materialise the tensors a :class:`~rocm_attn.varlen.meta.StepMeta` names (``q_layout`` /
``kv_layout``) and fold step results back into rank-local accumulators, with
:mod:`rocm_attn.thd` helpers (``read_half``, ``merge_partial``, ``grad_correction``)."""

from __future__ import annotations

from typing import Optional

import torch

from .. import thd

__all__ = ["select_rows", "select_lse", "merge_step", "fold_grad", "place_half",
           "step_backward"]


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


def step_backward(plan, meta, dq: torch.Tensor, dout: torch.Tensor, q: torch.Tensor,
                  k_s: torch.Tensor, v_s: torch.Tensor, out: torch.Tensor, lse: torch.Tensor,
                  dlse: Optional[torch.Tensor]):
    """Backward of a core step (q rows of ``meta.q_layout``, kv tensors as the step reads them):
    dQ folded into ``dq`` at once, ``(dk_s, dv_s)`` returned for the comm type to fold."""
    sel, cu_q = meta.q_layout, plan.local_cu_q_padded
    dq_s, dk_s, dv_s = plan.backend.backward(
        select_rows(dout, sel, cu_q), select_rows(q, sel, cu_q), k_s, v_s,
        select_rows(out, sel, cu_q), select_lse(lse, sel, cu_q), select_lse(dlse, sel, cu_q),
        meta, plan.softmax_scale)
    fold_grad(dq, dq_s, sel, cu_q)
    return dk_s, dv_s
