"""Gradients that refuse a second derivative: the backward passes of the attention ops are
computed without a graph, so a second derivative through them must raise, not read as zero."""

from __future__ import annotations

from typing import Sequence

import torch

__all__ = ["no_second_derivative"]


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
