"""Custom-op plumbing for the compiled kernels: fake (meta) impls and the eager call path.

The ops, and the small-seq forward's autograd (a C++ autograd function registered as the op's
Autograd kernel), are defined in C++ (hip_src/bindings/). Registering fake impls lets
torch.compile trace through them. Nothing here runs when the extension is absent.

The tiled small-seq ops (``small_seq_tiled_fwd/bwd``: many queries per segment, long histories,
int64 offsets) are defined in C++ too (hip_src/bindings/); their fake impls and the forward's
autograd (calling the backward op) are registered here, only when a build has them
(:data:`HAS_TILED_OPS`).

``small_seq_fwd_row_max`` / ``small_seq_tiled_fwd_row_max`` are the two forwards with one more
output, each row's maximum scaled logit (``fused_attn_small_seq(return_max_logit=True)``);
their fakes and autograd (the same backward ops) are registered here, in Python: only calls
asking for max_logit pay that layer's host cost.

Host cost matters: a small-seq call can take 20-30 us on the GPU, about what Python dispatch
costs. :func:`small_seq_forward` therefore skips what it can: the call's plan (the kernels the
op runs, rocm_attn.small_seq_plan) is one dict look-up per call shape; when nothing needs a
gradient it calls the op's C++ function directly (``_C.small_seq_fwd_direct``: no schema
boxing, no dispatcher), or the op below the autograd layer where that cannot serve (tensor
subclasses, dispatch modes, the profiler); when something needs a gradient it calls the op,
whose C++ autograd runs the backward (with the backward's plan, given at the forward) on the
autograd engine's thread without Python. (A Python autograd
layer, register_autograd or an autograd.Function, cost 60-300 us of host time per
forward+backward step on an H200 host: docs/kernels.md#small-seq-host-path.)
"""

from __future__ import annotations

import torch

from . import _ext, small_seq_plan, tuning

# rocm_attn._C.small_seq_fwd_direct, when the extension is loaded (None otherwise).
_fwd_direct = None
if _ext.HAS_EXTENSION:
    from . import _C

    _fwd_direct = getattr(_C, "small_seq_fwd_direct", None)


def _small_seq_fwd_fake(q, k, v, cu_seqlens_q, cu_seqlens_kv, seqlens_kv, max_seqlen_kv,
                        softmax_scale, return_softmax, plan, backward_plan):
    batch = q.shape[0]
    h_q = q.shape[-2]
    out = torch.empty_like(q, memory_format=torch.contiguous_format)
    lse = q.new_empty((h_q, batch), dtype=torch.float32)
    probs = q.new_empty((batch, h_q, max_seqlen_kv) if return_softmax else (0,), dtype=torch.float32)
    return out, lse, probs


def _small_seq_bwd_fake(dout, q, k, v, out, lse, dlse, cu_seqlens_q, cu_seqlens_kv, seqlens_kv,
                        max_seqlen_kv, softmax_scale, plan):
    return (
        torch.empty_like(q, memory_format=torch.contiguous_format),
        torch.empty_like(k, memory_format=torch.contiguous_format),
        torch.empty_like(v, memory_format=torch.contiguous_format),
    )


def _needs_autograd(q, k, v) -> bool:
    return torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)


# The one-query plans of each call shape (rocm_attn.small_seq_plan.one_query_plans) by
# (tuning generation, device index, head dim, q heads, kv heads, max_seqlen_kv): one dict look-up
# per eager call, where planning (the tuning's values, the plan's own cache) cost several
# microseconds of a path whose GPU time is 20-30 us.
_one_query_plans: dict = {}


def _plans(q, k, max_seqlen_kv):
    """(plan, backward_plan) of a one-query call; empty where q or k has no heads dim (the op
    then refuses the call by its own checks, as for any call the one-query kernels do not
    take)."""
    if q.dim() < 2 or k.dim() < 2:
        return (), ()
    if torch.compiler.is_compiling():
        return small_seq_plan.one_query_plans(q, k, max_seqlen_kv)  # a constant of the trace
    shape = q.shape
    key = (tuning.generation(), q.get_device(), shape[-1], shape[-2], k.shape[-2], max_seqlen_kv)
    plans = _one_query_plans.get(key)
    if plans is None:
        if len(_one_query_plans) >= 4096:
            _one_query_plans.clear()
        plans = _one_query_plans[key] = small_seq_plan.one_query_plans(q, k, max_seqlen_kv)
    return plans


def small_seq_forward(q, k, v, cu_seqlens_q, cu_seqlens_kv, seqlens_kv, max_seqlen_kv,
                      softmax_scale, return_softmax):
    """``rocm_attn::small_seq_fwd`` (out, lse, probs) with the plan of the call, with the least
    host work per call.

    Skipping the autograd layer is exact when no input needs a gradient: that layer would only
    redispatch. Calls that need a gradient, and every call while torch.compile traces or
    torch.func transforms run, take the op through the normal dispatch.
    """
    op = torch.ops.rocm_attn.small_seq_fwd.default
    args = (q, k, v, cu_seqlens_q, cu_seqlens_kv, seqlens_kv, max_seqlen_kv, softmax_scale,
            return_softmax, *_plans(q, k, max_seqlen_kv))
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


def _small_seq_fwd_row_max_fake(q, k, v, cu_seqlens_q, cu_seqlens_kv, seqlens_kv,
                                max_seqlen_kv, softmax_scale, return_softmax, plan,
                                backward_plan):
    out, lse, probs = _small_seq_fwd_fake(q, k, v, cu_seqlens_q, cu_seqlens_kv, seqlens_kv,
                                          max_seqlen_kv, softmax_scale, return_softmax, plan,
                                          backward_plan)
    return out, lse, probs, torch.empty_like(lse)


def _row_max_setup_context(ctx, inputs, output):
    q, k, v, cu_seqlens_q, cu_seqlens_kv, seqlens_kv, max_kv, scale, _, _, backward_plan = inputs
    ctx.save_for_backward(q, k, v, output[0], output[1], cu_seqlens_q, cu_seqlens_kv,
                          seqlens_kv)
    ctx.bounds = (max_kv, scale, backward_plan)
    ctx.set_materialize_grads(False)


def _row_max_backward(ctx, dout, dlse, *_not_differentiable):
    """Gradients of (out, lse) of ``small_seq_fwd_row_max`` by the one-query backward op;
    probs and row_max are not differentiable."""
    q, k, v, out, lse, cu_seqlens_q, cu_seqlens_kv, seqlens_kv = ctx.saved_tensors
    if dout is None and dlse is None:
        return (None,) * 11
    dq, dk, dv = torch.ops.rocm_attn.small_seq_bwd(
        (dout if dout is not None else torch.zeros_like(out)).contiguous(), q, k, v, out, lse,
        None if dlse is None else dlse.contiguous(), cu_seqlens_q, cu_seqlens_kv, seqlens_kv,
        *ctx.bounds)
    grads = (dq, dk, dv)
    if torch.is_grad_enabled() and not torch.compiler.is_compiling():
        from .second_derivative import no_second_derivative

        grads = no_second_derivative("fused_attn_small_seq", grads, (q, k, v))
    return (*grads, None, None, None, None, None, None, None, None)


def _has_op(name: str) -> bool:
    try:
        return hasattr(torch.ops.rocm_attn, name)
    except (AttributeError, RuntimeError):
        return False


# Whether this build has the forward ops that also write each row's maximum logit
# (``small_seq_fwd_row_max``; the tiled one, ``small_seq_tiled_fwd_row_max``, is registered with
# the tiled ops below); without them return_max_logit takes the sharpened-LSE pass.
HAS_ROW_MAX_OP = False
HAS_TILED_ROW_MAX_OP = False

if _ext.HAS_EXTENSION:
    torch.library.register_fake("rocm_attn::small_seq_fwd")(_small_seq_fwd_fake)
    torch.library.register_fake("rocm_attn::small_seq_bwd")(_small_seq_bwd_fake)
    if _has_op("small_seq_fwd_row_max"):
        HAS_ROW_MAX_OP = True
        torch.library.register_fake("rocm_attn::small_seq_fwd_row_max")(
            _small_seq_fwd_row_max_fake)
        torch.library.register_autograd("rocm_attn::small_seq_fwd_row_max", _row_max_backward,
                                        setup_context=_row_max_setup_context)


# --------------------------------------------------------------------------------------------
# tiled small-seq ops
# --------------------------------------------------------------------------------------------


def tiled_ops_registered() -> bool:
    """Whether ``rocm_attn::small_seq_tiled_fwd`` and ``_bwd`` exist (this build has them)."""
    try:
        ns = torch.ops.rocm_attn
        return hasattr(ns, "small_seq_tiled_fwd") and hasattr(ns, "small_seq_tiled_bwd")
    except (AttributeError, RuntimeError):
        return False


def _query_rows(q) -> int:
    """Rows of lse / probs: THD q ``[total_q, h_q, d]`` -> total_q; BSHD ``[b, s_q, h_q, d]``
    -> b * s_q."""
    return q.shape[0] if q.dim() == 3 else q.shape[0] * q.shape[1]


def _tiled_fwd_fake(q, k, v, cu_seqlens_q, cu_seqlens_kv, seqlens_kv, max_seqlen_q,
                    max_seqlen_kv, softmax_scale, return_softmax, plan):
    rows, h_q = _query_rows(q), q.shape[-2]
    out = torch.empty_like(q, memory_format=torch.contiguous_format)
    lse = q.new_empty((h_q, rows), dtype=torch.float32)
    probs = q.new_empty((rows, h_q, max_seqlen_kv) if return_softmax else (0,),
                        dtype=torch.float32)
    return out, lse, probs


def _tiled_fwd_row_max_fake(q, k, v, cu_seqlens_q, cu_seqlens_kv, seqlens_kv, max_seqlen_q,
                            max_seqlen_kv, softmax_scale, return_softmax, plan):
    out, lse, probs = _tiled_fwd_fake(q, k, v, cu_seqlens_q, cu_seqlens_kv, seqlens_kv,
                                      max_seqlen_q, max_seqlen_kv, softmax_scale, return_softmax,
                                      plan)
    return out, lse, probs, torch.empty_like(lse)


def _tiled_bwd_fake(dout, q, k, v, out, lse, dlse, cu_seqlens_q, cu_seqlens_kv, seqlens_kv,
                    max_seqlen_q, max_seqlen_kv, softmax_scale, plan):
    return tuple(torch.empty_like(t, memory_format=torch.contiguous_format) for t in (q, k, v))


def _tiled_setup_context(ctx, inputs, output):
    q, k, v, cu_seqlens_q, cu_seqlens_kv, seqlens_kv, max_q, max_kv, scale, _, _plan = inputs
    out, lse = output[0], output[1]  # then probs (and row_max): not differentiable
    ctx.save_for_backward(q, k, v, out, lse, cu_seqlens_q, cu_seqlens_kv, seqlens_kv)
    ctx.bounds = (max_q, max_kv, scale)
    ctx.set_materialize_grads(False)


def _tiled_backward(ctx, dout, dlse, *_not_differentiable):
    """Gradients of (out, lse) by the tiled backward op; probs (and row_max) are not
    differentiable."""
    q, k, v, out, lse, cu_seqlens_q, cu_seqlens_kv, seqlens_kv = ctx.saved_tensors
    if dout is None and dlse is None:
        return (None,) * 11
    if dout is None:
        dout = torch.zeros_like(out)
    max_q, max_kv, _scale = ctx.bounds
    dq, dk, dv = torch.ops.rocm_attn.small_seq_tiled_bwd(
        dout, q, k, v, out, lse, dlse, cu_seqlens_q, cu_seqlens_kv, seqlens_kv, *ctx.bounds,
        small_seq_plan.tiled_bwd_plan(q, k, max_q, max_kv))
    grads = (dq, dk, dv)
    if torch.is_grad_enabled() and not torch.compiler.is_compiling():
        # backward(create_graph=True): the gradients themselves are not differentiable
        from .second_derivative import no_second_derivative

        grads = no_second_derivative("fused_attn_small_seq", grads, (q, k, v))
    return (*grads, None, None, None, None, None, None, None, None)


_tiled_registered = False


def register_tiled_ops() -> bool:
    """Register the tiled ops' fakes and autograd once, when the ops exist; returns whether
    they are registered. Runs at import; a test that defines the ops later calls it again."""
    global _tiled_registered, HAS_TILED_OPS, HAS_TILED_ROW_MAX_OP
    if _tiled_registered:
        return True
    if not tiled_ops_registered():
        return False
    torch.library.register_fake("rocm_attn::small_seq_tiled_fwd")(_tiled_fwd_fake)
    torch.library.register_fake("rocm_attn::small_seq_tiled_bwd")(_tiled_bwd_fake)
    torch.library.register_autograd("rocm_attn::small_seq_tiled_fwd", _tiled_backward,
                                    setup_context=_tiled_setup_context)
    if _has_op("small_seq_tiled_fwd_row_max"):
        HAS_TILED_ROW_MAX_OP = True
        torch.library.register_fake("rocm_attn::small_seq_tiled_fwd_row_max")(
            _tiled_fwd_row_max_fake)
        torch.library.register_autograd("rocm_attn::small_seq_tiled_fwd_row_max",
                                        _tiled_backward, setup_context=_tiled_setup_context)
    _tiled_registered = HAS_TILED_OPS = True
    return True


HAS_TILED_OPS = False
if _ext.HAS_EXTENSION:
    register_tiled_ops()
