"""fused_attn_small_seq: one query token per segment attending to 1..16 keys.

Target attention in recommendation models: a candidate item (the query) attends to a short
user-behaviour history (keys/values), for 30k+ segments per batch. The compiled HIP/CUDA
kernels serve fp16/bf16 with head dims 64/128/256/512; a vectorised torch path serves the same
API everywhere else (CPU, fp32, other head dims, or ``backend="torch"``).
"""

from __future__ import annotations

import logging
import math
from typing import List, Optional, Tuple, Union

import torch

from . import _ext, _logging, errors, ops  # noqa: F401  (ops registers fake impls and autograd)
from ._checks import is_int
from .reference import reference_small_seq

log = logging.getLogger("rocm_attn")

LAYOUTS = ("thd_thd_thd", "bshd_bshd_bshd")
KERNEL_HEAD_DIMS = (64, 128, 256, 512)
KERNEL_DTYPES = (torch.float16, torch.bfloat16)
TORCH_PATH_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
MAX_SEQLEN_KV = 16
# Largest finite float32: the kernels (and the torch path for 16/32-bit inputs) apply
# softmax_scale in float32, so a larger scale would be inf there.
FLOAT32_MAX = float(torch.finfo(torch.float32).max)
LAYOUT_RANKS = {"thd_thd_thd": 3, "bshd_bshd_bshd": 4}

# (layout, dtype, head dim, device) the kernels have served through the checked path: calls
# like these try the op first (_kernels_unchecked).
_served_by_kernels: set = set()


def _check_tensor(name: str, t, rank: int, shape_doc: str) -> None:
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor {shape_doc}, got {type(t).__name__}")
    if t.dim() != rank:
        raise ValueError(f"{name} must be {shape_doc}, got shape {tuple(t.shape)}")
    if t.dtype not in TORCH_PATH_DTYPES:
        raise ValueError(f"{name} must be float16, bfloat16 or float32, got {t.dtype}")
    if t.numel() and t.stride(-1) != 1:
        raise ValueError(f"{name} must have a contiguous last (head) dim, got strides {t.stride()}")


def _check_index(name: str, t, numel: int, device: torch.device) -> None:
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name} must be an int32 tensor of {numel} entries, got {type(t).__name__}")
    if t.dtype != torch.int32 or t.dim() != 1 or t.numel() != numel:
        raise ValueError(
            f"{name} must be a 1-D int32 tensor of {numel} entries, got {t.dtype} {tuple(t.shape)}"
        )
    if t.device != device:
        raise ValueError(f"{name} must be on {device} (the device of q), got {t.device}")
    if not t.is_contiguous():
        raise ValueError(f"{name} must be contiguous (kernels index it directly), got strides {t.stride()}")


def _kernel_alignment_problem(name: str, t: torch.Tensor) -> Optional[str]:
    """Why t cannot be read with 16-byte vectors (None when it can).

    Strides are static under torch.compile and checked there too; the data pointer is not
    known while tracing (the C++ op checks it at run time).
    """
    if not torch.compiler.is_compiling() and t.data_ptr() % 16:
        return f"{name} must be 16-byte aligned for the kernel (data_ptr % 16 = {t.data_ptr() % 16})"
    for dim in range(t.dim() - 1):
        if t.stride(dim) % 8 and t.shape[dim] != 1:
            return f"{name} stride {t.stride(dim)} of dim {dim} must be a multiple of 8 elements"
    return None


def _check_scale(softmax_scale) -> None:
    """softmax_scale is None or a real number that is finite in float32 (any sign: zero gives
    uniform weights, a negative scale favours the least similar keys)."""
    if softmax_scale is None:
        return
    if isinstance(softmax_scale, bool) or not isinstance(softmax_scale, (int, float)):
        raise ValueError(
            f"softmax_scale must be a float or None, got {type(softmax_scale).__name__}")
    try:
        finite = math.isfinite(softmax_scale) and abs(float(softmax_scale)) <= FLOAT32_MAX
    except OverflowError:  # an int beyond the float range
        finite = False
    if not finite:
        raise ValueError(
            f"softmax_scale must be finite in float32 (|softmax_scale| <= {FLOAT32_MAX:.4g}; the "
            f"kernels apply it in float32), got {softmax_scale!r}")


def _validate(q, k, v, cu_seqlens_q, cu_seqlens_kv, seqlens_kv, max_seqlen_q, max_seqlen_kv,
              softmax_scale, qkv_layout) -> int:
    """Check every host-side argument; returns the batch size (number of segments)."""
    if qkv_layout not in LAYOUTS:
        raise ValueError(f"qkv_layout must be one of {LAYOUTS}, got {qkv_layout!r}")
    if max_seqlen_q != 1:
        raise ValueError(f"max_seqlen_q must be 1 (one query token per segment), got {max_seqlen_q}")
    if not is_int(max_seqlen_kv) or not (
        1 <= max_seqlen_kv <= MAX_SEQLEN_KV
    ):
        raise ValueError(
            f"max_seqlen_kv must be an int in 1..{MAX_SEQLEN_KV}, got {max_seqlen_kv!r}: this op "
            f"serves histories of at most {MAX_SEQLEN_KV} items (keep the latest "
            f"{MAX_SEQLEN_KV}, or use F.scaled_dot_product_attention for longer ones)")
    _check_scale(softmax_scale)
    thd = qkv_layout == "thd_thd_thd"
    if thd:
        _check_tensor("q", q, 3, "[total_q, h_q, d]")
        _check_tensor("k", k, 3, "[total_kv, h_kv, d]")
        _check_tensor("v", v, 3, "[total_kv, h_kv, d]")
        if seqlens_kv is not None:
            raise ValueError("seqlens_kv is for qkv_layout='bshd_bshd_bshd'; THD takes cu_seqlens_kv")
        if cu_seqlens_q is None or cu_seqlens_kv is None:
            raise ValueError("cu_seqlens_q and cu_seqlens_kv are required for qkv_layout='thd_thd_thd'")
        batch = q.shape[0]
        _check_index("cu_seqlens_q", cu_seqlens_q, batch + 1, q.device)
        _check_index("cu_seqlens_kv", cu_seqlens_kv, batch + 1, q.device)
    else:
        _check_tensor("q", q, 4, "[b, 1, h_q, d]")
        _check_tensor("k", k, 4, "[b, s_kv, h_kv, d]")
        _check_tensor("v", v, 4, "[b, s_kv, h_kv, d]")
        if cu_seqlens_q is not None or cu_seqlens_kv is not None:
            raise ValueError("qkv_layout='bshd_bshd_bshd' takes seqlens_kv, not cu_seqlens_q/kv")
        if q.shape[1] != 1:
            raise ValueError(f"q must be [b, 1, h_q, d] (one query per segment), got {tuple(q.shape)}")
        batch = q.shape[0]
        if k.shape[0] != batch:
            raise ValueError(f"k batch {k.shape[0]} must equal q batch {batch}")
        if k.shape[1] > MAX_SEQLEN_KV:
            raise ValueError(f"k/v s_kv dim must be <= {MAX_SEQLEN_KV}, got {k.shape[1]}")
        if seqlens_kv is None:
            raise ValueError("seqlens_kv (int32 [b]) is required for qkv_layout='bshd_bshd_bshd'")
        _check_index("seqlens_kv", seqlens_kv, batch, q.device)
    if k.shape != v.shape:
        raise ValueError(f"k and v must have the same shape, got {tuple(k.shape)} and {tuple(v.shape)}")
    if k.dtype != q.dtype or v.dtype != q.dtype:
        raise ValueError(f"q, k, v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if k.device != q.device or v.device != q.device:
        raise ValueError(f"q, k, v must be on one device, got {q.device}, {k.device}, {v.device}")
    if k.shape[-1] != q.shape[-1]:
        raise ValueError(f"head dims differ: q has {q.shape[-1]}, k/v have {k.shape[-1]}")
    if q.shape[-1] == 0:
        raise ValueError("head dim (the last dim of q, k, v) must be >= 1, got 0")
    h_q, h_kv = q.shape[-2], k.shape[-2]
    if h_kv == 0 or h_q % h_kv:
        raise ValueError(f"num heads of q ({h_q}) must be a multiple of num heads of k/v ({h_kv})")
    return batch


def _kernel_problems(q, k, v) -> List[str]:
    """Why the compiled kernels cannot serve this call (empty when they can)."""
    reasons = []
    if not q.is_cuda:
        reasons.append(f"no compiled kernels for device {q.device}: the kernels run on CUDA and "
                       "ROCm GPUs")
    elif not _ext.HAS_EXTENSION:
        reasons.append(f"no compiled kernels: {_ext.extension_error()}")
    if q.dtype not in KERNEL_DTYPES:
        reasons.append(f"dtype {q.dtype} (kernels: float16, bfloat16)")
    if q.shape[-1] not in KERNEL_HEAD_DIMS:
        dims = ", ".join(str(d) for d in KERNEL_HEAD_DIMS)
        reasons.append(f"head dim {q.shape[-1]} (kernels: {dims})")
    if not reasons:
        for name, t in (("q", q), ("k", k), ("v", v)):
            problem = _kernel_alignment_problem(name, t)
            if problem:
                reasons.append(problem)
    return reasons


def _use_kernel(q, k, v, backend: str) -> bool:
    if backend not in ("auto", "kernel", "torch"):
        raise ValueError(f"backend must be 'auto', 'kernel' or 'torch', got {backend!r}")
    if backend == "torch":
        _logging.log_choice(log, ("small_seq", "torch", "asked"),
                            "fused_attn_small_seq: torch path (backend='torch')")
        return False
    reasons = _kernel_problems(q, k, v)
    if reasons and backend == "kernel":
        raise ValueError(
            "backend='kernel' cannot serve this call: " + "; ".join(reasons) + ". Use "
            "backend='auto' (falls back to the torch path, same results) or backend='torch'.")
    if reasons:
        why = "; ".join(reasons)
        _logging.log_choice(log, ("small_seq", "torch", why),
                            "fused_attn_small_seq: torch path (%s)", why)
        return False
    _logging.log_choice(log, ("small_seq", "kernel", q.device.type, q.dtype, q.shape[-1]),
                        "fused_attn_small_seq: compiled kernels (%s, %s, head dim %d)", q.device,
                        q.dtype, q.shape[-1])
    return True


def _call_shape(q, qkv_layout) -> tuple:
    """What makes calls alike for _served_by_kernels: layout, dtype, head dim, device."""
    return (qkv_layout, q.dtype, q.shape[-1], q.device)


def _scale(q, softmax_scale) -> float:
    return 1.0 / math.sqrt(q.shape[-1]) if softmax_scale is None else float(softmax_scale)


def _kernels_unchecked(q, k, v, cu_seqlens_q, cu_seqlens_kv, seqlens_kv, max_seqlen_q,
                       max_seqlen_kv, softmax_scale, qkv_layout, return_softmax, backend):
    """The kernels' (out, lse, probs) with the C++ op as the only argument check, or None.

    Host cost: a small batch runs 25 us on the GPU, and _validate plus _use_kernel cost about
    20 us of Python per call on the GPU machines' hosts. The op checks the same arguments
    itself (bindings/small_seq.cpp make_params: ranks, shapes, dtypes, devices, cu_seqlens /
    seqlens_kv, head dims, alignment). So a call shaped like one the kernels have already
    served through the checked path (same layout, dtype, head dim, device) goes straight to
    the op; None (the caller then takes the checked path, which raises the ValueError naming
    the argument, or picks the torch path) when the call differs or the op refuses it.
    """
    if (backend not in ("auto", "kernel") or max_seqlen_q != 1 or type(max_seqlen_kv) is not int
            or not isinstance(q, torch.Tensor) or q.shape[0] == 0
            or (softmax_scale is not None and (type(softmax_scale) is not float
                                               or not -FLOAT32_MAX <= softmax_scale <= FLOAT32_MAX))
            or LAYOUT_RANKS.get(qkv_layout) != q.dim()
            or _call_shape(q, qkv_layout) not in _served_by_kernels
            or torch.compiler.is_compiling()):
        return None
    # Every tensor on a GPU: the op dispatches on the highest backend among its arguments, and
    # a meta tensor there would run its fake impl instead of the checks.
    try:
        if not (k.is_cuda and v.is_cuda and (cu_seqlens_q is None or cu_seqlens_q.is_cuda)
                and (cu_seqlens_kv is None or cu_seqlens_kv.is_cuda)
                and (seqlens_kv is None or seqlens_kv.is_cuda)):
            return None
    except AttributeError:  # not a tensor
        return None
    try:
        return ops.small_seq_forward(q, k, v, cu_seqlens_q, cu_seqlens_kv, seqlens_kv,
                                     max_seqlen_kv, _scale(q, softmax_scale), return_softmax)
    except (RuntimeError, TypeError, ValueError):  # the op refused the arguments
        return None


def _thd_segments(cu_seqlens_q, cu_seqlens_kv, total_q: int, total_kv: int,
                  max_seqlen_kv: int):
    """The kernels' per-segment contract for THD (hip_src/small_seq/tiling.h resolve_segment).

    Segment i is valid iff it has exactly one query row q0 = cu_seqlens_q[i] with
    0 <= q0 < total_q, and its kv rows k0 = cu_seqlens_kv[i] .. k1 = cu_seqlens_kv[i+1] satisfy
    0 <= k0 <= k1 <= total_kv and k1 - k0 <= max_seqlen_kv. Computed in int64: a difference of
    two int32 offsets can wrap in 32 bits (0x7ffffff8 - (-0x7ffffff8) would read as 16).
    Returns (valid bool [b], q0 int64 [b], k0 int64 [b], len int64 [b]), without a host sync.
    """
    q0, q1 = cu_seqlens_q[:-1].long(), cu_seqlens_q[1:].long()
    k0, k1 = cu_seqlens_kv[:-1].long(), cu_seqlens_kv[1:].long()
    lens = k1 - k0
    valid = (q1 - q0 == 1) & (q0 >= 0) & (q0 < total_q)
    valid &= (k0 >= 0) & (k1 <= total_kv) & (lens >= 0) & (lens <= max_seqlen_kv)
    return valid, q0, k0, lens


def _thd_to_padded(q, k, v, cu_seqlens_q, cu_seqlens_kv, max_seqlen_kv):
    """Gather THD segments into [b, max_seqlen_kv, h, d] without a host sync.

    Returns the per-segment q rows [b, h, d], the padded k/v, the lengths (-1 for a segment
    that breaks the contract), the per-segment flag for contract violations, and each
    segment's q row (int64 [b]; meaningful where the segment is valid).
    """
    total_q, total_kv = q.shape[0], k.shape[0]
    valid, q0, k0, lens = _thd_segments(cu_seqlens_q, cu_seqlens_kv, total_q, total_kv,
                                        max_seqlen_kv)
    bad = ~valid
    # Every gather index is clamped into the tensor: a bad segment's rows are masked below,
    # never read out of bounds.
    q_rows = torch.where(valid, q0, torch.zeros_like(q0)).clamp(0, max(total_q - 1, 0))
    rows = k0.unsqueeze(1) + torch.arange(max_seqlen_kv, device=q.device).unsqueeze(0)
    rows = rows.clamp(0, max(total_kv - 1, 0))
    if total_kv == 0:
        shape = (q.shape[0], max_seqlen_kv) + tuple(k.shape[1:])
        kp, vp = k.new_zeros(shape), v.new_zeros(shape)
    else:
        kp, vp = k[rows], v[rows]
    lens = torch.where(bad, torch.full_like(lens, -1), lens)
    return q[q_rows], kp, vp, lens, bad, q0


def _mask_padding(kp, vp, lens):
    """Zero the k/v rows at or past each segment's length ([b, s, h, d]; lens -1 for a bad
    segment, which keeps none).

    NOTE: torch.where, not a product: those rows belong to other segments (THD) or are padding
    (BSHD) and may hold NaN/inf. Multiplying by 0 keeps NaN, and a masked score still passes
    0 * k to dq in the backward; where() gives them neither a value nor a gradient.
    """
    keep = torch.arange(kp.shape[1], device=kp.device).unsqueeze(0) < lens.unsqueeze(1)
    keep = keep.view(kp.shape[0], kp.shape[1], 1, 1)
    return torch.where(keep, kp, kp.new_zeros(())), torch.where(keep, vp, vp.new_zeros(()))


def _torch_path(q, k, v, cu_seqlens_q, cu_seqlens_kv, seqlens_kv, max_seqlen_kv, scale, thd):
    compute = torch.float64 if q.dtype == torch.float64 else torch.float32
    if thd:
        q3, kp, vp, lens, bad, q0 = _thd_to_padded(q, k, v, cu_seqlens_q, cu_seqlens_kv,
                                                   max_seqlen_kv)
    else:
        kp, vp, q3 = k, v, q[:, 0]
        lens64 = seqlens_kv.long()
        bad = (lens64 < 0) | (lens64 > min(max_seqlen_kv, k.shape[1]))
        lens = torch.where(bad, torch.full_like(lens64, -1), lens64)
    errors.record_torch_path_errors(bad)
    kp, vp = _mask_padding(kp, vp, lens)
    out, lse, probs = reference_small_seq(q3, kp, vp, lens, scale, compute_dtype=compute)
    width = kp.shape[1]
    if width < max_seqlen_kv:
        probs = torch.nn.functional.pad(probs, (0, max_seqlen_kv - width))
    probs = probs[..., :max_seqlen_kv].detach()  # weights are for inspection, as on the kernel path
    if thd:
        # A valid segment writes its q row (as the kernels do); rows no valid segment writes
        # (those of bad segments, or rows no segment names) are NaN. Row total_q takes the bad
        # segments' values and is dropped.
        dest = torch.where(bad, torch.full_like(q0, q.shape[0]), q0)
        placed = out.new_full((q.shape[0] + 1,) + tuple(out.shape[1:]), float("nan"))
        out = placed.index_put((dest,), out)[:q.shape[0]]
    else:
        out = out.unsqueeze(1)
    return out, lse, probs


def _checked_call(q, k, v, cu_seqlens_q, cu_seqlens_kv, seqlens_kv, max_seqlen_q,
                  max_seqlen_kv, softmax_scale, qkv_layout, return_softmax, backend):
    """(out, lse, probs) after every Python check: kernels where they serve, else torch."""
    batch = _validate(q, k, v, cu_seqlens_q, cu_seqlens_kv, seqlens_kv, max_seqlen_q,
                      max_seqlen_kv, softmax_scale, qkv_layout)
    scale = _scale(q, softmax_scale)
    if batch == 0:
        return (q.new_empty(q.shape), q.new_empty((q.shape[-2], 0), dtype=torch.float32),
                q.new_empty((0, q.shape[-2], max_seqlen_kv), dtype=torch.float32))
    if _use_kernel(q, k, v, backend):
        outputs = ops.small_seq_forward(q, k, v, cu_seqlens_q, cu_seqlens_kv, seqlens_kv,
                                        max_seqlen_kv, scale, return_softmax)
        _served_by_kernels.add(_call_shape(q, qkv_layout))
        return outputs
    return _torch_path(q, k, v, cu_seqlens_q, cu_seqlens_kv, seqlens_kv, max_seqlen_kv, scale,
                       qkv_layout == "thd_thd_thd")


def fused_attn_small_seq(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: Optional[torch.Tensor] = None,
    cu_seqlens_kv: Optional[torch.Tensor] = None,
    max_seqlen_q: int = 1,
    max_seqlen_kv: int = 16,
    softmax_scale: Optional[float] = None,
    qkv_layout: str = "thd_thd_thd",
    return_softmax: bool = False,
    *,
    seqlens_kv: Optional[torch.Tensor] = None,
    return_lse: bool = False,
    backend: str = "auto",
    validate: Union[None, bool, str] = None,
) -> Union[torch.Tensor, Tuple[torch.Tensor, ...]]:
    """Attention of one query token per segment over 0..16 key/value tokens.

    Parameters
    ----------
    q : ``[b, h_q, d]`` (THD, one row per segment) or ``[b, 1, h_q, d]`` (BSHD).
    k, v : ``[total_kv, h_kv, d]`` (THD) or ``[b, s_kv, h_kv, d]`` (BSHD, s_kv <= 16).
        ``h_q % h_kv == 0`` (GQA/MQA). Any strides with a contiguous head dim (slices of a
        fused projection work without a copy).
    cu_seqlens_q, cu_seqlens_kv : int32 ``[b+1]`` (THD). Segment i has query row
        ``cu_seqlens_q[i]`` (exactly one) and keys ``cu_seqlens_kv[i]:cu_seqlens_kv[i+1]``.
    max_seqlen_q : must be 1.
    max_seqlen_kv : host bound 1..16 on every segment's key count; picks the kernel variant.
    softmax_scale : defaults to ``1/sqrt(d)``. Any value finite in float32 (zero and negative
        included); nan, inf and ``|scale| > 3.4e38`` raise ValueError.
    qkv_layout : ``"thd_thd_thd"`` or ``"bshd_bshd_bshd"``.
    return_softmax : also return the attention weights, float32 ``[b, h_q, max_seqlen_kv]``
        (zero past each segment's length; not differentiable).
    seqlens_kv : int32 ``[b]``, key counts for the BSHD layout.
    return_lse : also return the float32 natural-log LSE ``[h_q, b]`` (``-inf`` for empty
        segments); differentiable, so merged partial results backpropagate.
    backend : ``"auto"`` (kernels when they serve the call, else torch), ``"kernel"`` or
        ``"torch"``.
    validate : ``"sync"``/True raises SmallSeqContractError at the call when one of this call's
        segments broke the contract (synchronises; errors of earlier calls are left for
        ``check_errors``); default from env ``ROCM_ATTN_VALIDATE``.

    Returns
    -------
    out with q's shape and dtype, then lse if ``return_lse``, then probs if
    ``return_softmax``. A segment with no keys yields zeros; a segment that breaks the contract
    yields NaN and is counted (see ``rocm_attn.check_errors``).
    """
    validating = errors.validate_mode(validate)
    if validating:
        # Earlier calls' errors are kept for check_errors(); this call raises for its own only.
        errors.set_aside_errors()
    outputs = _kernels_unchecked(q, k, v, cu_seqlens_q, cu_seqlens_kv, seqlens_kv, max_seqlen_q,
                                 max_seqlen_kv, softmax_scale, qkv_layout, return_softmax,
                                 backend)
    if outputs is None:
        outputs = _checked_call(q, k, v, cu_seqlens_q, cu_seqlens_kv, seqlens_kv, max_seqlen_q,
                                max_seqlen_kv, softmax_scale, qkv_layout, return_softmax,
                                backend)
    out, lse, probs = outputs
    if validating:
        errors.check_call_errors()
    result = (out,) + ((lse,) if return_lse else ()) + ((probs,) if return_softmax else ())
    return result[0] if len(result) == 1 else result
