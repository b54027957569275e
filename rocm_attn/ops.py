"""Custom-op plumbing for the compiled kernels: fake (meta) impls and the eager call path.

The ops, and the small-seq forward's autograd (a C++ autograd function registered as the op's
Autograd kernel), are defined in C++ (hip_src/bindings/). Registering fake impls lets
torch.compile trace through them. Nothing here runs when the extension is absent.

Host cost matters: a small-seq call can take 20-30 us on the GPU, about what Python dispatch
costs. :func:`small_seq_forward` therefore skips what it can: when nothing needs a gradient it
calls the op's C++ function directly (``_C.small_seq_fwd_direct``: no schema boxing, no
dispatcher), or the op below the autograd layer where that cannot serve (tensor subclasses,
dispatch modes, the profiler); when something needs a gradient it calls the op, whose C++
autograd runs the backward on the autograd engine's thread without Python. (A Python autograd
layer, register_autograd or an autograd.Function, cost 60-300 us of host time per
forward+backward step on an H200 host: docs/kernels.md#small-seq-host-path.)
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


def _needs_autograd(q, k, v) -> bool:
    return torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)


def small_seq_forward(q, k, v, cu_seqlens_q, cu_seqlens_kv, seqlens_kv, max_seqlen_kv,
                      softmax_scale, return_softmax):
    """``rocm_attn::small_seq_fwd`` (out, lse, probs), with the least host work per call.

    Skipping the autograd layer is exact when no input needs a gradient: that layer would only
    redispatch. Calls that need a gradient, and every call while torch.compile traces or
    torch.func transforms run, take the op through the normal dispatch.
    """
    op = torch.ops.rocm_attn.small_seq_fwd.default
    args = (q, k, v, cu_seqlens_q, cu_seqlens_kv, seqlens_kv, max_seqlen_kv, softmax_scale,
            return_softmax)
    if (torch.compiler.is_compiling() or torch._C._are_functorch_transforms_active()
            or _needs_autograd(q, k, v)):
        return op(*args)
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
