"""The flash route of ``fused_attn_small_seq``: many candidates per user on NVIDIA GPUs.

Where segments hold many candidates over a long enough history, the attention is a dense
matrix product per segment and flash-attention's tiles run full: torch's flash varlen kernels
then beat the tiled kernels (on an H100, forward by up to 1.6x, forward+backward by 1.3-3.6x;
docs/kernels.md#flash-route). The route runs those kernels (``aten._flash_attention_forward`` /
``_backward``: GQA native, no padding, strides as given) and keeps the tiled kernels'
contract (hip_src/small_seq/tiled_segment.h) whatever the offsets hold:

1. flash offsets: each of ``cu_seqlens_q`` / ``cu_seqlens_kv`` clamped into its tensor and made
   non-decreasing (a running maximum; one kernel for both arrays, no host sync), so flash
   touches only rows inside q, k, v. For valid offsets they are the offsets themselves.
2. flash on those offsets.
3. ``rocm_attn::small_seq_flash_contract_fwd`` (hip_src/small_seq/flash_contract_kernel.h), one
   block per segment: bad segments counted and NaN, padding rows 0 / -inf, rows without keys
   lse -inf; a valid segment that flash saw on other rows or keys (only when some segment is
   bad, so the call is flagged) NaN instead of the tiled kernels' value.

The backward is flash's (``_flash_attention_backward``) followed by
``small_seq_flash_contract_bwd``; with an LSE cotangent (flash has no slot for it) the tiled
backward runs instead, on the same saved out and LSE. Flash's dQ sums key blocks with atomics:
bitwise run-to-run identical only where a segment's keys fit two of flash's key blocks, or under
``torch.use_deterministic_algorithms(True)`` (torch then runs flash's deterministic backward);
dK and dV are always deterministic.

Which calls take it: tuning ``small_seq_flash_route`` (``ROCM_ATTN_SMALL_SEQ_FLASH_ROUTE``): 1 =
the rule :func:`route_wins` and histories beyond the tiled kernels (the default), 2 = every
call it can serve (tests), 0 = never. It serves THD calls without ``return_softmax`` on a CUDA
build of torch whose flash varlen kernels pass the varlen backend's probe
(rocm_attn/varlen/backends.py). ROCm builds keep the tiled kernels.
"""

# NOTE: no `from __future__ import annotations`: torch.library.custom_op reads the annotations
# as types (torch 2.4 cannot parse them as strings).
from typing import Optional, Tuple

import torch

from . import _ext, errors, small_seq_plan, tuning

# The rule of tuning value 1 and its bounds live in the kernel plan (small_seq_plan.route_wins,
# docs/kernels.md#flash-route), beside the choices of the tiled kernels it is weighed against.
route_wins = small_seq_plan.route_wins


def _route_mode() -> int:
    """Tuning ``small_seq_flash_route`` (0 without the compiled extension)."""
    return tuning.values().get("small_seq_flash_route", 0)


def warpgroup_kernels() -> bool:
    """Whether the current device runs the tiled kernels' warpgroup-MMA variants (Hopper, an
    sm_90a build; False without the compiled extension)."""
    if not _ext.HAS_EXTENSION:
        return False
    from . import _C

    return bool(_C.warpgroup_mma())


def route_selects(head_dim: int, max_seqlen_q: int, max_seqlen_kv: int, backward: bool,
                  long_history: bool = False, group: int = 1) -> bool:
    """Whether the tuning value picks the route for a call of this head dim and these bounds
    (``group``: q heads per kv head): 2 always, 1 for histories beyond the tiled kernels
    (``long_history``) and where :func:`route_wins`, 0 never."""
    tuning = small_seq_plan.current_tuning()
    tuning["small_seq_flash_route"] = _route_mode()
    call = small_seq_plan.Call(head_dim, group, 1, max_seqlen_q, max_seqlen_kv,
                               backward=backward)
    return small_seq_plan.route_selects(call, warpgroup_kernels(), tuning, long_history)


def needs_backward(q, k, v) -> bool:
    """Whether a call's result will be differentiated: grad mode on and an input requiring
    grad (known at trace time under torch.compile)."""
    return torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)


def takes_route(q, k, v, thd: bool, max_seqlen_q: int, max_seqlen_kv: int,
                return_softmax: bool, long_history: bool = False) -> bool:
    """Whether a call the tiled kernels (or, with ``long_history``, the varlen attention) would
    serve takes the flash route instead."""
    if (not thd or return_softmax or not q.is_cuda or torch.version.hip is not None
            or q.shape[0] == 0 or k.shape[0] == 0):
        return False
    # NOTE: an exported program keeps the compiled ops (AOTInductor packages run C++ ops; the
    # route's ops are Python custom ops), so export traces the tiled kernels / varlen attention
    if errors.exporting():
        return False
    # (no extension: the tuning value reads 0, so route_selects is False)
    if not route_selects(q.shape[-1], max_seqlen_q, max_seqlen_kv, needs_backward(q, k, v),
                         long_history, group=q.shape[-2] // max(k.shape[-2], 1)):
        return False
    from .varlen import backends

    return backends.flash_problem(q) is None


def flash_offsets(cu: torch.Tensor, total: int) -> torch.Tensor:
    """``cu`` clamped into ``[0, total]`` and made non-decreasing, int32: offsets that address
    only rows of a ``total``-row tensor; equal to ``cu`` where ``cu`` is valid. The definition
    the route's kernel (``small_seq_flash_offsets``, :func:`route_offsets`) is tested against."""
    clamped = cu.to(torch.int64).clamp(0, total)
    return torch.cummax(clamped, 0).values.to(torch.int32)


def _flash_max_q(max_seqlen_q: int) -> int:
    # aten's flash wrapper takes max_seqlen_q == 1 with GQA for one query per sequence (no
    # varlen q; only route_offsets' one-query case passes 1); a looser bound only grows the grid
    # (rocm_attn/varlen/backends.py)
    return max(2, max_seqlen_q)


def route_offsets(q, k, cu_seqlens_q, cu_seqlens_kv,
                  max_seqlen_q: int) -> Tuple[torch.Tensor, torch.Tensor, bool]:
    """(q offsets for flash, kv offsets for flash, whether the forward takes flash's one-query
    path). The offsets are :func:`flash_offsets` of each side, made by one kernel
    (``small_seq_flash_offsets``: one launch instead of four torch ops per side, which are most
    of the route's cost on short calls).

    One query per segment with GQA and no padding rows (``q.shape[0] == b``, known on the host)
    takes flash's one-query path, which tiles the GQA group's query heads of a kv head together
    (4x fewer, fuller tiles at group 4) and reads q row ``i`` as segment ``i``'s query whatever
    ``cu_seqlens_q`` holds. Its q offsets are then ``arange(b + 1)`` (what valid offsets are
    there), for the backward too, and the contract kernel, handed those as the offsets flash
    used, flags every other segment as it flags a segment flash saw on other rows."""
    b = cu_seqlens_q.shape[0] - 1
    both = torch.ops.rocm_attn.small_seq_flash_offsets(q, k, cu_seqlens_q, cu_seqlens_kv)
    fq, fk = both[0], both[1]
    if max_seqlen_q == 1 and q.shape[0] == b and q.shape[-2] > k.shape[-2]:
        return torch.arange(b + 1, dtype=torch.int32, device=q.device), fk, True
    return fq, fk, False


@torch.library.custom_op("rocm_attn::small_seq_flash_fwd", mutates_args=())
def small_seq_flash_fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                        cu_seqlens_q: torch.Tensor, cu_seqlens_kv: torch.Tensor,
                        max_seqlen_q: int, max_seqlen_kv: int, softmax_scale: float,
                        lse_differentiable: bool) -> Tuple[torch.Tensor, torch.Tensor]:
    """(out, lse [h_q, total_q] float32) of a THD call on the flash route. The LSE carries a
    gradient only with ``lse_differentiable`` (the caller returns it): traced backward graphs
    pass a zero cotangent for every differentiable output, which would send the gradients
    to the tiled backward."""
    from .varlen import backends

    fq, fk, one_query = route_offsets(q, k, cu_seqlens_q, cu_seqlens_kv, max_seqlen_q)
    out, lse, _, _, _ = backends.aten_flash_ops()[0](
        q, k, v, fq, fk, 1 if one_query else _flash_max_q(max_seqlen_q), max_seqlen_kv, 0.0,
        False, False, scale=softmax_scale)
    lse = lse.float()
    torch.ops.rocm_attn.small_seq_flash_contract_fwd(out, lse, k, cu_seqlens_q, cu_seqlens_kv,
                                                     fq, fk, max_seqlen_q, max_seqlen_kv)
    # flash allocates out like q (a permuted q gives a permuted out); the op's is contiguous
    return out.contiguous(), lse


@small_seq_flash_fwd.register_fake
def _(q, k, v, cu_seqlens_q, cu_seqlens_kv, max_seqlen_q, max_seqlen_kv, softmax_scale,
      lse_differentiable):
    return (torch.empty_like(q, memory_format=torch.contiguous_format),
            q.new_empty((q.shape[-2], q.shape[0]), dtype=torch.float32))


def _setup_context(ctx, inputs, output):
    q, k, v, cu_seqlens_q, cu_seqlens_kv, max_q, max_kv, scale, lse_differentiable = inputs
    out, lse = output
    if not lse_differentiable:
        ctx.mark_non_differentiable(lse)
    ctx.save_for_backward(q, k, v, out, lse, cu_seqlens_q, cu_seqlens_kv)
    ctx.bounds = (max_q, max_kv, scale)
    ctx.set_materialize_grads(False)


@torch.library.custom_op("rocm_attn::small_seq_flash_bwd", mutates_args=())
def small_seq_flash_bwd(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                        out: torch.Tensor, lse: torch.Tensor, cu_seqlens_q: torch.Tensor,
                        cu_seqlens_kv: torch.Tensor, max_seqlen_q: int, max_seqlen_kv: int,
                        softmax_scale: float) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv) by flash's backward and the contract kernel (no LSE cotangent). An op of
    its own, so that traced backward graphs hold it whole."""
    from .varlen import backends

    fq, fk, _ = route_offsets(q, k, cu_seqlens_q, cu_seqlens_kv, max_seqlen_q)
    dq, dk, dv = backends.aten_flash_ops()[1](
        dout.contiguous(), q, k, v, out, lse, fq, fk, _flash_max_q(max_seqlen_q), max_seqlen_kv,
        0.0, False, torch.zeros(2, dtype=torch.uint64, device=q.device),
        torch.empty(0, device=q.device), scale=softmax_scale)
    torch.ops.rocm_attn.small_seq_flash_contract_bwd(dq, dk, dv, cu_seqlens_q, cu_seqlens_kv,
                                                     fq, fk, max_seqlen_q, max_seqlen_kv)
    return dq.contiguous(), dk.contiguous(), dv.contiguous()


@small_seq_flash_bwd.register_fake
def _(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_kv, max_seqlen_q, max_seqlen_kv,
      softmax_scale):
    return tuple(torch.empty_like(t, memory_format=torch.contiguous_format) for t in (q, k, v))


def _backward(ctx, dout, dlse):
    q, k, v, out, lse, cu_seqlens_q, cu_seqlens_kv = ctx.saved_tensors
    max_q, max_kv, scale = ctx.bounds
    if dout is None and dlse is None:
        return (None,) * 9
    if dlse is None:
        dq, dk, dv = small_seq_flash_bwd(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_kv,
                                         max_q, max_kv, scale)
    else:  # flash's backward has no LSE cotangent: the tiled backward, same out and LSE
        if dout is None:
            dout = torch.zeros_like(out)
        dq, dk, dv = torch.ops.rocm_attn.small_seq_tiled_bwd(
            dout, q, k, v, out, lse, dlse, cu_seqlens_q, cu_seqlens_kv, None, max_q, max_kv,
            scale, small_seq_plan.tiled_bwd_plan(q, k, max_q, max_kv))
    grads = (dq, dk, dv)
    if torch.is_grad_enabled() and not torch.compiler.is_compiling():
        # backward(create_graph=True): the gradients themselves are not differentiable
        from .second_derivative import no_second_derivative

        grads = no_second_derivative("fused_attn_small_seq", grads, (q, k, v))
    return (*grads, None, None, None, None, None, None)


small_seq_flash_fwd.register_autograd(_backward, setup_context=_setup_context)


def flash_route(q, k, v, cu_seqlens_q, cu_seqlens_kv, max_seqlen_q: int, max_seqlen_kv: int,
                scale: float, return_lse: bool) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(out, lse, probs) of a call on the flash route (probs: empty, as the tiled op's)."""
    out, lse = small_seq_flash_fwd(q, k, v, cu_seqlens_q, cu_seqlens_kv, max_seqlen_q,
                                   max_seqlen_kv, scale, return_lse)
    return out, lse, lse.new_empty((0,))


def route_problem(ignore_tuning: bool = False) -> Optional[str]:
    """Why this process cannot take the flash route at all (None: it can, on suitable calls);
    ``ignore_tuning``: whether it could with the route switched on."""
    if not _ext.HAS_EXTENSION:
        return "no compiled extension (the contract kernels)"
    if torch.version.hip is not None:
        return "a ROCm build of torch (the route is for NVIDIA GPUs)"
    if not ignore_tuning and _route_mode() <= 0:
        return "tuning small_seq_flash_route is 0"
    return None
