"""One autograd wrapper shape for the comm types whose forward and backward are plain
functions of (q, k, v, plan): the p2p ring and all_gather."""

from __future__ import annotations

from typing import Callable

import torch

from ..second_derivative import no_second_derivative
from .steps import CPPlan

ForwardFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, CPPlan], tuple]
BackwardFn = Callable[..., tuple]


def make_cp_function(name: str, forward_fn: ForwardFn, backward_fn: BackwardFn,
                     doc: str) -> type:
    """A torch.autograd.Function running forward_fn(q, k, v, plan) -> (out, lse, max_logit,
    *extra) (``max_logit``: ``[h_q]`` float32, or empty when not asked; not differentiable) and
    backward_fn(dout, dlse, q, k, v, out, lse, plan, *extra) -> (dq, dk, dv), with explicit
    communication inside both (no autograd through collectives); ``extra``: tensors (or None)
    the forward keeps for the backward, e.g. the p2p ring's last kv."""

    def forward(ctx, q, k, v, plan: CPPlan):
        out, lse, max_logit, *extra = forward_fn(q, k, v, plan)
        ctx.save_for_backward(q, k, v, out, lse, *extra)
        ctx.plan = plan
        ctx.set_materialize_grads(False)
        ctx.mark_non_differentiable(max_logit)
        return out, lse, max_logit

    def backward(ctx, dout, dlse, _dmax_logit):
        q, k, v, out, lse, *extra = ctx.saved_tensors
        if dout is None:  # every rank must run the same collectives: a missing cotangent is 0
            dout = torch.zeros_like(out)
        with torch.no_grad():
            dq, dk, dv = backward_fn(dout, dlse, q, k, v, out, lse, ctx.plan, *extra)
        return (*no_second_derivative("attn_with_cp", (dq, dk, dv), (q, k, v)), None)

    return type(name, (torch.autograd.Function,),
                {"forward": staticmethod(forward), "backward": staticmethod(backward),
                 "__doc__": doc})
