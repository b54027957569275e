"""Custom-op plumbing for the compiled kernels: fake (meta) impls and autograd.

The ops themselves are defined in C++ (hip_src/torch_bindings.cpp, TORCH_LIBRARY). Registering
a fake impl lets torch.compile trace through them; registering autograd makes them
differentiable. Nothing here runs when the extension is absent.

Host cost matters: a small-seq call can take 20-30 us on the GPU, about what Python dispatch
costs. :func:`small_seq_forward` therefore skips what it can: when nothing needs a gradient it
calls the op's C++ function directly (``_C.small_seq_fwd_direct``: no schema boxing, no
dispatcher), or the op below the autograd layer where that cannot serve (tensor subclasses,
dispatch modes); when something does, it goes through :class:`SmallSeqAttention`, a plain
autograd.Function. The registered autograd (``register_autograd``) serves
torch.compile and direct ``torch.ops`` callers; in eager its generic wrapper cost 3x the host
time of the Function per forward+backward step (H200 host, h1 d128 kv4: 517 us; its
zero-filled gradients for the unused LSE and weights outputs alone took two fills).
"""

from __future__ import annotations

import torch

from . import _ext

# rocm_attn._C.small_seq_fwd_direct, when the extension is loaded (None otherwise).
_fwd_direct = None
if _ext.HAS_EXTENSION:
    from . import _C

    _fwd_direct = getattr(_C, "small_seq_fwd_direct", None)


def _small_seq_fwd_fake(q, k, v, cu_seqlens_q, cu_seqlens_kv, seqlens_kv, max_seqlen_kv,
                        softmax_scale, return_softmax):
    batch = q.shape[0]
    h_q = q.shape[-2]
    out = torch.empty_like(q, memory_format=torch.contiguous_format)
    lse = q.new_empty((h_q, batch), dtype=torch.float32)
    probs = q.new_empty((batch, h_q, max_seqlen_kv) if return_softmax else (0,), dtype=torch.float32)
    return out, lse, probs


def _small_seq_bwd_fake(dout, q, k, v, out, lse, dlse, cu_seqlens_q, cu_seqlens_kv, seqlens_kv,
                        max_seqlen_kv, softmax_scale):
    return (
        torch.empty_like(q, memory_format=torch.contiguous_format),
        torch.empty_like(k, memory_format=torch.contiguous_format),
        torch.empty_like(v, memory_format=torch.contiguous_format),
    )


def _small_seq_setup_context(ctx, inputs, output):
    q, k, v, cu_seqlens_q, cu_seqlens_kv, seqlens_kv, max_seqlen_kv, softmax_scale, _ = inputs
    out, lse, probs = output
    ctx.mark_non_differentiable(probs)
    ctx.save_for_backward(q, k, v, out, lse, cu_seqlens_q, cu_seqlens_kv, seqlens_kv)
    ctx.max_seqlen_kv = max_seqlen_kv
    ctx.softmax_scale = softmax_scale


def _small_seq_backward(ctx, dout, dlse, dprobs):
    # Gradients flow through `out` and `lse` (the LSE term matters when partial results are
    # merged, as in context parallelism); the attention weights are returned for inspection
    # and are not differentiable.
    q, k, v, out, lse, cu_seqlens_q, cu_seqlens_kv, seqlens_kv = ctx.saved_tensors
    dq, dk, dv = _small_seq_bwd_call(dout, q, k, v, out, lse, dlse, cu_seqlens_q, cu_seqlens_kv,
                                     seqlens_kv, ctx.max_seqlen_kv, ctx.softmax_scale)
    return dq, dk, dv, None, None, None, None, None, None


def _small_seq_bwd_call(dout, q, k, v, out, lse, dlse, cu_seqlens_q, cu_seqlens_kv, seqlens_kv,
                        max_seqlen_kv, softmax_scale):
    """dq, dk, dv of the kernels; dout None (only the LSE is used) reads as zeros."""
    if dout is None:
        dout = torch.zeros_like(out)
    return torch.ops.rocm_attn.small_seq_bwd.default(
        dout.contiguous(), q, k, v, out, lse, None if dlse is None else dlse.contiguous(),
        cu_seqlens_q, cu_seqlens_kv, seqlens_kv, max_seqlen_kv, softmax_scale,
    )


class SmallSeqAttention(torch.autograd.Function):
    """Eager autograd of the small-seq kernels: one node, gradients not materialised.

    Same math as the registered autograd below (which torch.compile traces); this one skips
    its generic wrapper and never builds zero gradients for outputs the caller did not use.
    NOTE: forward takes ctx (no separate setup_context): with setup_context, Function.apply
    binds the arguments through inspect.signature on every call. torch.func transforms need
    setup_context, so they take the registered autograd (small_seq_forward). The index
    tensors are kept as attributes, not saved tensors: they never require gradients, and each
    saved tensor costs an unpack (version check) in the backward.
    """

    @staticmethod
    def forward(ctx, q, k, v, cu_seqlens_q, cu_seqlens_kv, seqlens_kv, max_seqlen_kv,
                softmax_scale, return_softmax):
        out, lse, probs = _fwd_below_autograd(q, k, v, cu_seqlens_q, cu_seqlens_kv, seqlens_kv,
                                              max_seqlen_kv, softmax_scale, return_softmax)
        ctx.set_materialize_grads(False)
        ctx.mark_non_differentiable(probs)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.index = (cu_seqlens_q, cu_seqlens_kv, seqlens_kv)
        ctx.max_seqlen_kv = max_seqlen_kv
        ctx.softmax_scale = softmax_scale
        return out, lse, probs

    @staticmethod
    def backward(ctx, dout, dlse, dprobs):
        if torch.is_grad_enabled():  # create_graph=True: the kernels have no second derivative
            return _backward_once_differentiable(ctx, dout, dlse, dprobs)
        return _small_seq_function_backward(ctx, dout, dlse, dprobs)


def _small_seq_function_backward(ctx, dout, dlse, dprobs):
    if dout is None and dlse is None:
        return (None,) * 9
    q, k, v, out, lse = ctx.saved_tensors
    with torch._C._AutoDispatchBelowAutograd():
        dq, dk, dv = _small_seq_bwd_call(dout, q, k, v, out, lse, dlse, *ctx.index,
                                         ctx.max_seqlen_kv, ctx.softmax_scale)
    return dq, dk, dv, None, None, None, None, None, None


_backward_once_differentiable = torch.autograd.function.once_differentiable(
    _small_seq_function_backward)


def _needs_autograd(q, k, v) -> bool:
    return torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)


def small_seq_forward(q, k, v, cu_seqlens_q, cu_seqlens_kv, seqlens_kv, max_seqlen_kv,
                      softmax_scale, return_softmax):
    """``rocm_attn::small_seq_fwd`` (out, lse, probs), with the least host work per call.

    Skipping the autograd layer is exact when no input needs a gradient: that layer would only
    redispatch. While torch.compile traces (or torch.func transforms run), the op goes through
    the normal dispatch and its registered autograd (a trace records it once; host cost is not
    paid per call there).
    """
    op = torch.ops.rocm_attn.small_seq_fwd.default
    args = (q, k, v, cu_seqlens_q, cu_seqlens_kv, seqlens_kv, max_seqlen_kv, softmax_scale,
            return_softmax)
    if torch.compiler.is_compiling() or torch._C._are_functorch_transforms_active():
        return op(*args)
    if _needs_autograd(q, k, v):
        return SmallSeqAttention.apply(*args)
    return _fwd_below_autograd(*args)


def _fwd_below_autograd(*args):
    """The forward op's outputs, dispatched below autograd or, where nothing else could see
    the call, by the direct entry point.

    NOTE: dispatch and torch-function modes (fake tensors, debug modes) and the profiler (it
    records ops at dispatch) are entitled to see the op: only without them does the direct call
    stand in for it.
    """
    if (_fwd_direct is not None and not torch._C._len_torch_dispatch_stack()
            and not torch._C._is_torch_function_mode_enabled()
            and not torch._C._autograd._profiler_enabled()):
        outputs = _fwd_direct(*args)
        if outputs is not None:
            return outputs
    with torch._C._AutoDispatchBelowAutograd():
        return torch.ops.rocm_attn.small_seq_fwd.default(*args)


if _ext.HAS_EXTENSION:
    torch.library.register_fake("rocm_attn::small_seq_fwd")(_small_seq_fwd_fake)
    torch.library.register_fake("rocm_attn::small_seq_bwd")(_small_seq_bwd_fake)
    torch.library.register_autograd(
        "rocm_attn::small_seq_fwd", _small_seq_backward, setup_context=_small_seq_setup_context
    )
