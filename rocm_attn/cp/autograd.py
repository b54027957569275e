"""One autograd wrapper shape for the comm types whose forward and backward are plain
functions of (q, k, v, plan): the p2p ring and all_gather."""

from __future__ import annotations

from typing import Callable, Sequence

import torch

from .steps import CPPlan

ForwardFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, CPPlan], tuple]
BackwardFn = Callable[..., tuple]


def make_cp_function(name: str, forward_fn: ForwardFn, backward_fn: BackwardFn,
                     doc: str) -> type:
    """A torch.autograd.Function running forward_fn(q, k, v, plan) -> (out, lse, *extra) and
    backward_fn(dout, dlse, q, k, v, out, lse, plan, *extra) -> (dq, dk, dv), with explicit
    communication inside both (no autograd through collectives); ``extra``: tensors (or None)
    the forward keeps for the backward, e.g. the p2p ring's last kv."""

    def forward(ctx, q, k, v, plan: CPPlan):
        out, lse, *extra = forward_fn(q, k, v, plan)
        ctx.save_for_backward(q, k, v, out, lse, *extra)
        ctx.plan = plan
        ctx.set_materialize_grads(False)
        return out, lse

    def backward(ctx, dout, dlse):
        q, k, v, out, lse, *extra = ctx.saved_tensors
        if dout is None:  # every rank must run the same collectives: a missing cotangent is 0
            dout = torch.zeros_like(out)
        with torch.no_grad():
            dq, dk, dv = backward_fn(dout, dlse, q, k, v, out, lse, ctx.plan, *extra)
        return (*no_second_derivative("attn_with_cp", (dq, dk, dv), (q, k, v)), None)

    return type(name, (torch.autograd.Function,),
                {"forward": staticmethod(forward), "backward": staticmethod(backward),
                 "__doc__": doc})


class _NoSecondDerivative(torch.autograd.Function):
    """Identity on the gradients of a backward run with ``create_graph=True``, as a node hung
    off q, k, v (what a second derivative is taken with respect to) that raises when reached."""

    @staticmethod
    def forward(ctx, op: str, n: int, *tensors):
        ctx.op = op
        return tuple(g.view_as(g) for g in tensors[:n])

    @staticmethod
    def backward(ctx, *grads):
        raise RuntimeError(
            f"rocm_attn: {ctx.op} has no second derivative (its gradients were computed with "
            "create_graph=True and are now being differentiated)")


def no_second_derivative(op: str, grads: Sequence[torch.Tensor],
                         inputs: Sequence[torch.Tensor]) -> tuple:
    """The gradients of q, k, v (``inputs``, as saved by the forward) from a backward computed
    without a graph, as they must leave it.

    Unchanged unless the backward runs with ``create_graph=True`` (grad mode on) and an input
    requires grad; then they require grad through a node that raises if differentiated, as
    fused_attn_small_seq does: the backward has no derivative of its own, and gradients that
    silently stopped requiring grad would make a second derivative read as zero.
    """
    if not torch.is_grad_enabled() or not any(t.requires_grad for t in inputs):
        return tuple(grads)
    return _NoSecondDerivative.apply(op, len(grads), *grads, *inputs)
