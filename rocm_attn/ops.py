"""Custom-op plumbing for the compiled kernels: fake (meta) impls and autograd.

The ops themselves are defined in C++ (hip_src/torch_bindings.cpp, TORCH_LIBRARY). Registering
a fake impl lets torch.compile trace through them; registering autograd makes them
differentiable. Nothing here runs when the extension is absent.

Host cost matters: a small-seq call can take 20-30 us on the GPU, about what Python dispatch
costs. :func:`small_seq_forward` therefore calls the op overload directly and, when nothing
needs a gradient, below the autograd layer (whose registered Python kernel would otherwise run
on every call just to find that no graph is needed).
"""

from __future__ import annotations

import torch

from . import _ext


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
    if dout is None:
        dout = torch.zeros_like(out)
    dq, dk, dv = torch.ops.rocm_attn.small_seq_bwd.default(
        dout.contiguous(), q, k, v, out, lse, None if dlse is None else dlse.contiguous(),
        cu_seqlens_q, cu_seqlens_kv, seqlens_kv, ctx.max_seqlen_kv, ctx.softmax_scale,
    )
    return dq, dk, dv, None, None, None, None, None, None


def _needs_autograd(*tensors) -> bool:
    return torch.is_grad_enabled() and any(t.requires_grad for t in tensors)


def small_seq_forward(q, k, v, cu_seqlens_q, cu_seqlens_kv, seqlens_kv, max_seqlen_kv,
                      softmax_scale, return_softmax):
    """``rocm_attn::small_seq_fwd`` (out, lse, probs), with the least host work per call.

    Skipping the autograd layer is exact when no input needs a gradient: that layer would only
    redispatch. While torch.compile traces, the op goes through the normal dispatch (the trace
    records it once; host cost is not paid per call there).
    """
    op = torch.ops.rocm_attn.small_seq_fwd.default
    args = (q, k, v, cu_seqlens_q, cu_seqlens_kv, seqlens_kv, max_seqlen_kv, softmax_scale,
            return_softmax)
    if torch.compiler.is_compiling() or _needs_autograd(q, k, v):
        return op(*args)
    with torch._C._AutoDispatchBelowAutograd():
        return op(*args)


if _ext.HAS_EXTENSION:
    torch.library.register_fake("rocm_attn::small_seq_fwd")(_small_seq_fwd_fake)
    torch.library.register_fake("rocm_attn::small_seq_bwd")(_small_seq_bwd_fake)
    torch.library.register_autograd(
        "rocm_attn::small_seq_fwd", _small_seq_backward, setup_context=_small_seq_setup_context
    )
