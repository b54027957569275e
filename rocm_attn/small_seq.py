"""fused_attn_small_seq: segments of query tokens attending to a user-behaviour history.

Target attention in recommendation models: candidate items (the queries) attend to the user's
history (keys/values), for thousands of users (segments) per batch; every query of a segment
attends to all of the segment's keys. Which implementation serves a call:

* one query per segment, int32 offsets, ``max_seqlen_kv <= 16``: the ``small_seq_fwd/bwd``
  kernels (fp16/bf16, head dims 64/128/256/512);
* any other call up to ``KERNEL_MAX_SEQLEN_KV`` keys: the tiled kernels
  (``small_seq_tiled_fwd/bwd``: fp16/bf16, head dims 64/128/256; int32 or int64 offsets),
  except that on CUDA builds of torch THD calls with segments of many candidates over a long
  enough history take torch's flash varlen kernels with the same contract (the flash route,
  rocm_attn/small_seq_flash.py, tuning ``small_seq_flash_route``);
* a kernel-eligible call with longer histories: on CUDA builds the flash route (unless it
  returns the LSE), else the package's varlen attention (``rocm_attn.attention``); logged at
  INFO;
* everything else (CPU, fp32/fp64, other head dims, ``backend="torch"``): the torch path
  (rocm_attn/small_seq_torch.py), any length.
"""

from __future__ import annotations

import inspect
import logging
import math
from typing import List, Optional, Tuple, Union

import torch

from . import _ext, _logging, errors, ops  # noqa: F401  (ops registers fake impls and autograd)
from . import small_seq_flash, small_seq_plan
from ._checks import FLOAT32_MAX, check_softmax_scale, is_int
from .small_seq_torch import bshd_segments, thd_segments, torch_path

log = logging.getLogger("rocm_attn")

LAYOUTS = ("thd_thd_thd", "bshd_bshd_bshd")
KERNEL_HEAD_DIMS = (64, 128, 256, 512)
KERNEL_DTYPES = (torch.float16, torch.bfloat16)
TORCH_PATH_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
# Largest max_seqlen_kv of the one-query kernels (small_seq_fwd/bwd).
MAX_SEQLEN_KV = 16
# Head dims and largest max_seqlen_kv the tiled kernels serve (hip_src/small_seq/tiled_params.h
# kSmallSeqTiledMaxSeqlenKv); longer histories take rocm_attn.attention.
TILED_HEAD_DIMS = (64, 128, 256)
KERNEL_MAX_SEQLEN_KV = 4096
OFFSET_DTYPES = (torch.int32, torch.int64)
# Rows of q, k, v (and offsets' values) are int32 in the kernels.
MAX_ROWS = 2**31 - 1
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
    # stride first: with a data-dependent row count (jagged inputs under export) the row count
    # cannot be guarded on, and a contiguous head dim needs no look at it
    if t.stride(-1) != 1 and t.numel():
        raise ValueError(f"{name} must have a contiguous last (head) dim, got strides {t.stride()}")


def _check_index(name: str, t, numel: int, device: torch.device) -> None:
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name} must be an int32 or int64 tensor of {numel} entries, got "
                         f"{type(t).__name__}")
    if t.dtype not in OFFSET_DTYPES or t.dim() != 1 or t.numel() != numel:
        raise ValueError(f"{name} must be a 1-D int32 or int64 tensor of {numel} entries, got "
                         f"{t.dtype} {tuple(t.shape)}")
    if t.device != device:
        raise ValueError(f"{name} must be on {device} (the device of q), got {t.device}")
    if not t.is_contiguous():
        raise ValueError(f"{name} must be contiguous (kernels index it directly), got strides {t.stride()}")


def _check_bound(name: str, value) -> None:
    if not is_int(value) or value < 1:
        raise ValueError(f"{name} must be an int >= 1 (a host bound on every segment), got "
                         f"{value!r}")


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


def _validate(q, k, v, cu_seqlens_q, cu_seqlens_kv, seqlens_kv, max_seqlen_q, max_seqlen_kv,
              softmax_scale, qkv_layout) -> int:
    """Check every host-side argument; returns the batch size (number of segments)."""
    if qkv_layout not in LAYOUTS:
        raise ValueError(f"qkv_layout must be one of {LAYOUTS}, got {qkv_layout!r}")
    _check_bound("max_seqlen_q", max_seqlen_q)
    _check_bound("max_seqlen_kv", max_seqlen_kv)
    check_softmax_scale(softmax_scale, q.shape[-1] if isinstance(q, torch.Tensor) else 0)
    thd = qkv_layout == "thd_thd_thd"
    if thd:
        _check_tensor("q", q, 3, "[total_q, h_q, d]")
        _check_tensor("k", k, 3, "[total_kv, h_kv, d]")
        _check_tensor("v", v, 3, "[total_kv, h_kv, d]")
        if seqlens_kv is not None:
            raise ValueError("seqlens_kv is for qkv_layout='bshd_bshd_bshd'; THD takes cu_seqlens_kv")
        if cu_seqlens_q is None or cu_seqlens_kv is None:
            raise ValueError("cu_seqlens_q and cu_seqlens_kv are required for qkv_layout='thd_thd_thd'")
        if max_seqlen_q == 1:
            # one query per segment: q holds exactly the b query rows
            batch = q.shape[0]
        else:
            if not isinstance(cu_seqlens_q, torch.Tensor) or cu_seqlens_q.dim() != 1 \
                    or cu_seqlens_q.numel() < 1:
                raise ValueError("cu_seqlens_q must be a 1-D int32 or int64 tensor of b+1 >= 1 "
                                 f"entries, got {cu_seqlens_q!r:.80}")
            batch = cu_seqlens_q.numel() - 1
        _check_index("cu_seqlens_q", cu_seqlens_q, batch + 1, q.device)
        _check_index("cu_seqlens_kv", cu_seqlens_kv, batch + 1, q.device)
        rows = (("q", q.shape[0]), ("k", k.shape[0]))
    else:
        _check_tensor("q", q, 4, "[b, s_q, h_q, d]")
        _check_tensor("k", k, 4, "[b, s_kv, h_kv, d]")
        _check_tensor("v", v, 4, "[b, s_kv, h_kv, d]")
        if cu_seqlens_q is not None or cu_seqlens_kv is not None:
            raise ValueError("qkv_layout='bshd_bshd_bshd' takes seqlens_kv, not cu_seqlens_q/kv")
        if q.shape[1] != max_seqlen_q:
            raise ValueError(f"q has s_q = {q.shape[1]} query rows per segment "
                             f"{tuple(q.shape)}; max_seqlen_q must equal s_q, got {max_seqlen_q}")
        batch = q.shape[0]
        if k.shape[0] != batch:
            raise ValueError(f"k batch {k.shape[0]} must equal q batch {batch}")
        if seqlens_kv is None:
            raise ValueError("seqlens_kv (int32 or int64 [b]) is required for "
                             "qkv_layout='bshd_bshd_bshd'")
        _check_index("seqlens_kv", seqlens_kv, batch, q.device)
        rows = (("q", q.shape[0] * q.shape[1]), ("k", k.shape[0] * k.shape[1]))
    for name, n in rows:
        if isinstance(n, torch.SymInt):
            # traced with a symbolic count (jagged inputs): checked when the graph runs. NOTE:
            # a static count takes the plain check below, also under torch.compile, since
            # torch 2.4's dynamo cannot trace torch._check's message function
            torch._check(n <= MAX_ROWS, lambda: f"{name} has more than 2^31 - 1 rows (tokens)")
        elif n > MAX_ROWS:
            raise ValueError(f"{name} has {n} rows (tokens); at most 2^31 - 1 are supported")
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


def _one_query_call(cu_seqlens_q, cu_seqlens_kv, seqlens_kv, max_seqlen_q, max_seqlen_kv) -> bool:
    """Whether the call is under today's one-query contract (the small_seq_fwd/bwd kernels):
    max_seqlen_q 1, int32 offsets, max_seqlen_kv <= 16."""
    return (max_seqlen_q == 1 and max_seqlen_kv <= MAX_SEQLEN_KV
            and all(t is None or t.dtype == torch.int32
                    for t in (cu_seqlens_q, cu_seqlens_kv, seqlens_kv)))


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


def _tiled_problems(q, k, v) -> List[str]:
    """Why the tiled kernels cannot serve this call (empty when they can)."""
    reasons = [r for r in _kernel_problems(q, k, v) if not r.startswith("head dim")]
    if q.shape[-1] not in TILED_HEAD_DIMS:
        dims = ", ".join(str(d) for d in TILED_HEAD_DIMS)
        reasons.append(f"head dim {q.shape[-1]} (tiled kernels: {dims})")
    if not reasons and not ops.HAS_TILED_OPS:
        reasons.append("this build has no tiled small-seq kernels (rocm_attn::small_seq_tiled_fwd "
                       "is not registered)")
    return reasons


def _pick_path(q, k, v, one_query: bool, max_seqlen_q: int, max_seqlen_kv: int, thd: bool,
               return_softmax: bool, return_lse: bool, backend: str,
               max_logit: bool = False) -> str:
    """"kernel" (small_seq_fwd), "tiled", "flash" (small_seq_flash.flash_route), "varlen"
    (rocm_attn.attention) or "torch". ``max_logit``: the call returns max_logit, which the
    tiled kernels write in the same pass, while the flash route would run its flash kernels
    twice (the sharpened pass), so such a call stays on the tiled kernels."""
    if backend not in ("auto", "kernel", "torch"):
        raise ValueError(f"backend must be 'auto', 'kernel' or 'torch', got {backend!r}")
    if backend == "torch":
        _logging.log_choice(log, ("small_seq", "torch", "asked"),
                            "fused_attn_small_seq: torch path (backend='torch')")
        return "torch"
    reasons = _kernel_problems(q, k, v) if one_query else _tiled_problems(q, k, v)
    long_history = not one_query and max_seqlen_kv > KERNEL_MAX_SEQLEN_KV
    if long_history:
        # the varlen attention needs no tiled kernel: only the device, dtype and head dim
        reasons = [r for r in reasons if not r.startswith("this build")]
        if return_softmax and not reasons:
            reasons = [f"return_softmax with max_seqlen_kv {max_seqlen_kv} > "
                       f"{KERNEL_MAX_SEQLEN_KV} (the varlen attention returns no weights)"]
    if reasons and backend == "kernel":
        raise ValueError(
            "backend='kernel' cannot serve this call: " + "; ".join(reasons) + ". Use "
            "backend='auto' (falls back to the torch path, same results) or backend='torch'.")
    if reasons:
        why = "; ".join(reasons)
        _logging.log_choice(log, ("small_seq", "torch", why),
                            "fused_attn_small_seq: torch path (%s)", why)
        return "torch"
    # NOTE: beyond the tiled kernels the route serves no LSE cotangent (its backward hands that
    # to the tiled backward), so a call returning the LSE stays on the varlen attention
    if long_history and not return_lse and small_seq_flash.takes_route(
            q, k, v, thd, max_seqlen_q, max_seqlen_kv, return_softmax, long_history=True):
        _logging.log_choice(log, ("small_seq", "flash-long", q.device.type, q.dtype),
                            "fused_attn_small_seq: max_seqlen_kv %d > %d (the tiled kernels' "
                            "limit): flash route (torch's flash varlen kernels, "
                            "rocm_attn/small_seq_flash.py)", max_seqlen_kv, KERNEL_MAX_SEQLEN_KV)
        return "flash"
    if long_history:
        _logging.log_choice(log, ("small_seq", "varlen", q.device.type, q.dtype),
                            "fused_attn_small_seq: max_seqlen_kv %d > %d (the tiled kernels' "
                            "limit): rocm_attn.attention (varlen) serves the call",
                            max_seqlen_kv, KERNEL_MAX_SEQLEN_KV)
        return "varlen"
    if not one_query and not (max_logit and ops.HAS_TILED_ROW_MAX_OP) \
            and small_seq_flash.takes_route(q, k, v, thd, max_seqlen_q, max_seqlen_kv,
                                            return_softmax):
        _logging.log_choice(log, ("small_seq", "flash", q.device.type, q.dtype, q.shape[-1]),
                            "fused_attn_small_seq: flash route (up to %d rows per segment and "
                            "kv head over up to %d keys: torch's flash varlen kernels, "
                            "rocm_attn/small_seq_flash.py)",
                            max_seqlen_q * (q.shape[-2] // k.shape[-2]), max_seqlen_kv)
        return "flash"
    kind = "kernel" if one_query else "tiled"
    _logging.log_choice(log, ("small_seq", kind, q.device.type, q.dtype, q.shape[-1]),
                        "fused_attn_small_seq: compiled %s kernels (%s, %s, head dim %d)",
                        "one-query" if one_query else "tiled", q.device, q.dtype, q.shape[-1])
    small_seq_plan.log_plan(log, q, k, max_seqlen_q, max_seqlen_kv, "thd" if thd else "bshd",
                            one_query or not (max_seqlen_q == 1 and max_seqlen_kv <= 16),
                            return_softmax, return_lse, small_seq_flash.needs_backward(q, k, v))
    return kind


def _call_shape(q, qkv_layout) -> tuple:
    """What makes calls alike for _served_by_kernels: layout, dtype, head dim, device."""
    return (qkv_layout, q.dtype, q.shape[-1], q.device)


def _scale(q, softmax_scale) -> float:
    return 1.0 / math.sqrt(q.shape[-1]) if softmax_scale is None else float(softmax_scale)


def _kernels_unchecked(q, k, v, cu_seqlens_q, cu_seqlens_kv, seqlens_kv, max_seqlen_q,
                       max_seqlen_kv, softmax_scale, qkv_layout, return_softmax, backend,
                       row_max=False):
    """The kernels' (out, lse, probs) with the C++ op as the only argument check, or None
    (``row_max``: (out, lse, probs, row_max) from the op that also writes each row's maximum
    logit, :func:`_row_max_op`).

    Host cost: a small batch runs 25 us on the GPU, and _validate plus _pick_path cost about
    20 us of Python per call on the GPU machines' hosts. The op checks the same arguments
    itself (bindings/small_seq.cpp make_params: ranks, shapes, dtypes, devices, cu_seqlens /
    seqlens_kv, head dims, alignment). So a call shaped like one the kernels have already
    served through the checked path (same layout, dtype, head dim, device) goes straight to
    the op; None (the caller then takes the checked path, which raises the ValueError naming
    the argument, or picks the torch path) when the call differs or the op refuses it.
    """
    if (backend not in ("auto", "kernel") or type(max_seqlen_q) is not int or max_seqlen_q != 1
            or type(max_seqlen_kv) is not int
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
        if row_max:
            if not ops.HAS_ROW_MAX_OP:
                return None
            return torch.ops.rocm_attn.small_seq_fwd_row_max(
                q, k, v, cu_seqlens_q, cu_seqlens_kv, seqlens_kv, max_seqlen_kv,
                _scale(q, softmax_scale), return_softmax, *ops._plans(q, k, max_seqlen_kv))
        return ops.small_seq_forward(q, k, v, cu_seqlens_q, cu_seqlens_kv, seqlens_kv,
                                     max_seqlen_kv, _scale(q, softmax_scale), return_softmax)
    except (RuntimeError, TypeError, ValueError):  # the op refused the arguments
        return None


def _checked_call(q, k, v, cu_seqlens_q, cu_seqlens_kv, seqlens_kv, max_seqlen_q,
                  max_seqlen_kv, softmax_scale, qkv_layout, return_softmax, return_lse,
                  backend, row_max=False):
    """(out, lse, probs) after every Python check, from the path that serves the call;
    ``row_max``: (out, lse, probs, row_max), row_max ``[h_q, rows]`` (each row's maximum scaled
    logit, written by the kernels) where the one-query or tiled kernels serve the call, else
    None."""
    batch = _validate(q, k, v, cu_seqlens_q, cu_seqlens_kv, seqlens_kv, max_seqlen_q,
                      max_seqlen_kv, softmax_scale, qkv_layout)
    scale = _scale(q, softmax_scale)
    thd = qkv_layout == "thd_thd_thd"
    one_query = _one_query_call(cu_seqlens_q, cu_seqlens_kv, seqlens_kv, max_seqlen_q,
                                max_seqlen_kv)
    if batch == 0:
        if backend not in ("auto", "kernel", "torch"):
            raise ValueError(f"backend must be 'auto', 'kernel' or 'torch', got {backend!r}")
        # no segment: every q row is padding (out 0, lse -inf)
        rows = q.shape[0] if thd else 0
        lse = q.new_full((q.shape[-2], rows), float("-inf"), dtype=torch.float32)
        outputs = (torch.zeros_like(q), lse,
                   q.new_zeros((rows, q.shape[-2], max_seqlen_kv), dtype=torch.float32))
        return outputs + (lse.clone(),) if row_max else outputs
    path = _pick_path(q, k, v, one_query, max_seqlen_q, max_seqlen_kv, thd, return_softmax,
                      return_lse, backend, row_max)
    if row_max and (ops.HAS_ROW_MAX_OP if path == "kernel"
                    else path == "tiled" and ops.HAS_TILED_ROW_MAX_OP):
        outputs = _row_max_op(path, q, k, v, cu_seqlens_q, cu_seqlens_kv, seqlens_kv,
                              max_seqlen_q, max_seqlen_kv, scale, return_softmax)
    else:
        outputs = _path_call(path, q, k, v, cu_seqlens_q, cu_seqlens_kv, seqlens_kv,
                             max_seqlen_q, max_seqlen_kv, scale, thd, one_query, return_softmax,
                             return_lse)
        outputs = outputs + (None,) if row_max else outputs
    if path == "kernel":
        _served_by_kernels.add(_call_shape(q, qkv_layout))
    return outputs


def _row_max_op(path, q, k, v, cu_seqlens_q, cu_seqlens_kv, seqlens_kv, max_seqlen_q,
                max_seqlen_kv, scale, return_softmax):
    """(out, lse, probs, row_max) of the kernels' ops that also write each row's maximum
    scaled logit (``small_seq_fwd_row_max``: one-query, ``small_seq_tiled_fwd_row_max``:
    tiled); the same launch as the plain op plus one float per row and q head."""
    if path == "kernel":
        return torch.ops.rocm_attn.small_seq_fwd_row_max(
            q, k, v, cu_seqlens_q, cu_seqlens_kv, seqlens_kv, max_seqlen_kv, scale,
            return_softmax, *ops._plans(q, k, max_seqlen_kv))
    return torch.ops.rocm_attn.small_seq_tiled_fwd_row_max(
        q, k, v, cu_seqlens_q, cu_seqlens_kv, seqlens_kv, max_seqlen_q, max_seqlen_kv, scale,
        return_softmax,
        small_seq_plan.tiled_fwd_plan(q, k, max_seqlen_q, max_seqlen_kv, return_softmax,
                                      max_logit=True))


def _path_call(path, q, k, v, cu_seqlens_q, cu_seqlens_kv, seqlens_kv, max_seqlen_q,
               max_seqlen_kv, scale, thd, one_query, return_softmax, return_lse):
    """(out, lse, probs) of the path _pick_path chose."""
    if path == "kernel":
        return ops.small_seq_forward(q, k, v, cu_seqlens_q, cu_seqlens_kv, seqlens_kv,
                                     max_seqlen_kv, scale, return_softmax)
    if path == "flash":
        return small_seq_flash.flash_route(q, k, v, cu_seqlens_q, cu_seqlens_kv, max_seqlen_q,
                                           max_seqlen_kv, scale, return_lse)
    if path == "tiled":
        return torch.ops.rocm_attn.small_seq_tiled_fwd(
            q, k, v, cu_seqlens_q, cu_seqlens_kv, seqlens_kv, max_seqlen_q, max_seqlen_kv,
            scale, return_softmax,
            small_seq_plan.tiled_fwd_plan(q, k, max_seqlen_q, max_seqlen_kv, return_softmax))
    if path == "varlen":
        return _varlen_path(q, k, v, cu_seqlens_q, cu_seqlens_kv, seqlens_kv, max_seqlen_q,
                            max_seqlen_kv, scale, thd)
    return torch_path(q, k, v, cu_seqlens_q, cu_seqlens_kv, seqlens_kv, max_seqlen_q,
                      max_seqlen_kv, scale, thd, one_query, return_lse, return_softmax)


def _packed_rows(start: torch.Tensor, n: torch.Tensor, total: int):
    """Pack segments' rows ``start[i] .. start[i] + n[i] - 1`` back to back into ``total`` rows.

    Returns (cu int32 [b+1] of the packed layout; the source row of every packed row int64
    [total], clamped into the source; the segments that did not fit, bool [b]). Valid segments
    of one call fit unless some other segment is bad (only then can two overlap)."""
    end = torch.cumsum(n, 0)
    overflow = end > total
    cu = torch.cat([n.new_zeros(1), end]).clamp(max=total)
    r = torch.arange(total, device=n.device)
    seg = torch.searchsorted(cu[1:].contiguous(), r, right=True).clamp(max=max(n.numel() - 1, 0))
    src = (start[seg] + r - cu[seg]).clamp(0, max(total - 1, 0))
    return cu.to(torch.int32), src, overflow


def _varlen_path(q, k, v, cu_seqlens_q, cu_seqlens_kv, seqlens_kv, max_seqlen_q,
                 max_seqlen_kv, scale, thd):
    """(out, lse, probs) by rocm_attn.attention (non-causal varlen) for histories longer than
    the tiled kernels serve, with the same per-segment contract: a bad segment is counted,
    packed with no rows (so it reads nothing) and its rows are NaN; padding rows 0 / -inf.

    The valid segments' rows are packed back to back (packed sizes are capped at q's and k's
    row counts: only offsets that already break the contract can overlap beyond them)."""
    from .small_seq_torch import place_rows
    from .varlen import attention

    h_q, d = q.shape[-2], q.shape[-1]
    if thd:
        total_q, total_kv = q.shape[0], k.shape[0]
        seg = thd_segments(cu_seqlens_q, cu_seqlens_kv, total_q, total_kv, max_seqlen_q,
                           max_seqlen_kv, one_query=False)
        q2, k2, v2 = q, k, v
        q_start = seg.q_rows[:, 0]
        b = seg.bad.numel()
    else:
        b, s_q, s_kv = q.shape[0], q.shape[1], k.shape[1]
        seg = bshd_segments(seqlens_kv, b, s_q, s_kv, max_seqlen_kv)
        q2, k2, v2 = (t.reshape((-1,) + tuple(t.shape[2:])) for t in (q, k, v))
        total_q, total_kv = b * s_q, b * s_kv
        q_start = torch.arange(b, device=q.device) * s_q
        seg = seg._replace(k_start=torch.where(seg.bad, 0, torch.arange(b, device=q.device) * s_kv))
    nq = torch.where(seg.bad, 0, seg.nq)
    _, _, q_overflow = _packed_rows(q_start, nq, total_q)
    _, _, kv_overflow = _packed_rows(seg.k_start, seg.nkv, total_kv)
    # a valid segment that overlaps a bad one's rows may not fit: flagged as well
    bad = seg.bad | q_overflow | kv_overflow
    seg = seg._replace(bad=bad, nq=torch.where(bad, 0, seg.nq), nkv=torch.where(bad, 0, seg.nkv),
                       k_start=torch.where(bad, 0, seg.k_start))
    errors.record_torch_path_errors(seg.bad)
    cu_q, src_q, _ = _packed_rows(q_start, seg.nq, total_q)
    cu_kv, src_kv, _ = _packed_rows(seg.k_start, seg.nkv, total_kv)
    q_p = q2.index_select(0, src_q) if total_q else q2
    k_p = k2.index_select(0, src_kv) if total_kv else k2
    v_p = v2.index_select(0, src_kv) if total_kv else v2
    out_p, lse_p = attention(q_p, k_p, v_p, cu_q, cu_kv, max_seqlen_q, max_seqlen_kv,
                             softmax_scale=scale, return_lse=True)
    # back to [b, max_q] slots, then to q's rows with the torch path's placement rules
    j = torch.arange(max_seqlen_q, device=q.device)
    slot = (cu_q[:-1].long().unsqueeze(1) + j).clamp(0, max(total_q - 1, 0))
    out_s = out_p.index_select(0, slot.reshape(-1)).view(b, max_seqlen_q, h_q, d)
    lse_s = lse_p.float().t().index_select(0, slot.reshape(-1)).view(b, max_seqlen_q, h_q)
    return place_rows(seg, out_s, lse_s, None, q, thd, False, max_seqlen_kv)


def fused_attn_small_seq(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: Optional[torch.Tensor] = None,
    cu_seqlens_kv: Optional[torch.Tensor] = None,
    max_seqlen_q: int = 1,
    max_seqlen_kv: Optional[int] = None,
    *positional_after_max_seqlen_kv,
    softmax_scale: Optional[float] = None,
    qkv_layout: str = "thd_thd_thd",
    return_softmax: bool = False,
    seqlens_kv: Optional[torch.Tensor] = None,
    return_lse: bool = False,
    backend: str = "auto",
    validate: Union[None, bool, str] = None,
    return_max_logit: bool = False,
) -> Union[torch.Tensor, Tuple[torch.Tensor, ...]]:
    """Attention of each segment's query tokens over the segment's key/value tokens.

    Every query of a segment attends to all of the segment's keys (cross attention, no mask).

    Every argument after ``max_seqlen_kv`` is keyword-only: flash-attn's
    ``flash_attn_varlen_func`` has ``dropout_p`` in the 8th place, where this op once took
    ``softmax_scale``, so a positional 8th argument raises TypeError instead of meaning
    something else.

    Parameters
    ----------
    q : THD ``[total_q, h_q, d]`` (``max_seqlen_q == 1``: ``[b, h_q, d]``, one row per
        segment) or BSHD ``[b, s_q, h_q, d]``.
    k, v : ``[total_kv, h_kv, d]`` (THD) or ``[b, s_kv, h_kv, d]`` (BSHD).
        ``h_q % h_kv == 0`` (GQA/MQA). Any strides with a contiguous head dim (slices of a
        fused projection work without a copy).
    cu_seqlens_q, cu_seqlens_kv : int32 or int64 ``[b+1]`` (THD; each its own dtype). Segment i
        has query rows ``cu_seqlens_q[i]:cu_seqlens_q[i+1]`` and keys
        ``cu_seqlens_kv[i]:cu_seqlens_kv[i+1]`` (either may be empty).
    max_seqlen_q : host bound >= 1 on every segment's query count (BSHD: must equal s_q).
    max_seqlen_kv : host bound >= 1 on every segment's key count; any length is served.
        None (the default): BSHD takes ``s_kv`` (k's shape); THD takes the longest segment of
        ``cu_seqlens_kv``, read on the host (free on the CPU, one device sync on a GPU, logged
        at DEBUG). torch.compile, torch.export and graph capture cannot read it: pass the
        bound there (None raises ValueError), and pass it wherever a sync matters.
    softmax_scale : defaults to ``1/sqrt(d)``. Any value finite in float32 (zero and negative
        included); nan, inf and ``|scale| > 3.4e38`` raise ValueError.
    qkv_layout : ``"thd_thd_thd"`` or ``"bshd_bshd_bshd"``.
    return_softmax : also return the attention weights, float32
        ``[rows, h_q, max_seqlen_kv]`` (zero past each segment's length; not differentiable).
    seqlens_kv : int32 or int64 ``[b]``, key counts for the BSHD layout.
    return_lse : also return the float32 natural-log LSE ``[h_q, rows]`` (``-inf`` for rows
        without keys); differentiable, so merged partial results backpropagate.
    backend : ``"auto"`` (kernels when they serve the call, else torch), ``"kernel"`` or
        ``"torch"``.
    validate : ``"sync"``/True raises SmallSeqContractError at the call when one of this call's
        segments broke the contract (synchronises; errors of earlier calls are left for
        ``check_errors``); default from env ``ROCM_ATTN_VALIDATE``.

    Rows of lse and probs: one per segment when ``max_seqlen_q == 1`` with int32 offsets and
    ``max_seqlen_kv <= 16`` (today's contract, where q has exactly b rows); otherwise one per
    query row (THD: the row of q; BSHD: ``batch * s_q + j``), and THD q rows outside every
    segment (before ``cu_seqlens_q[0]``, from ``cu_seqlens_q[b]`` on) are padding: out 0,
    lse -inf.

    Paths: one query, int32 offsets, ``max_seqlen_kv <= 16``: the one-query kernels; other
    calls with ``max_seqlen_kv <= KERNEL_MAX_SEQLEN_KV``: the tiled kernels (head dims
    64/128/256); longer histories: ``rocm_attn.attention`` (logged at INFO); CPU, fp32/fp64
    and other head dims: the torch path (any length). All paths share one contract.

    return_max_logit : also return, last, the per-head maximum of the scaled logits over every
        segment's (query, key) pairs: float32 ``[h_q]``, ``-inf`` for a head with none; not
        differentiable, no host sync. Where the one-query or tiled kernels serve the call they
        write each row's maximum beside its LSE (the running maximum their online softmax keeps
        anyway; one float per row and q head) and the call reduces it per head: exact (the
        kernels' float32 scores). Where torch's flash kernels serve it (the flash route) or
        the varlen attention does (histories past the tiled kernels' limit), which expose no
        scores, the call's own path runs once more at ``softmax_scale * 2^16`` and the maximum
        is read from that LSE (the sharpened-LSE pass of ``rocm_attn.varlen.max_logit``: at
        most ``ln(max_seqlen_kv) / 2^16`` above the exact value, plus float32 rounding;
        ``+inf`` past ``|max logit|`` ~11,000); on the CPU an exact blocked pass over the same
        segments.

    Returns
    -------
    out with q's shape and dtype, then lse if ``return_lse``, then probs if
    ``return_softmax``, then max_logit if ``return_max_logit``. A segment with no keys yields
    zeros; a segment that breaks the contract yields NaN and is counted (see ``rocm_attn.check_errors``).
    """
    if positional_after_max_seqlen_kv:
        raise TypeError(_positional_message(len(positional_after_max_seqlen_kv)))
    if max_seqlen_kv is None:
        max_seqlen_kv = _bound_from_data(k, cu_seqlens_kv, qkv_layout)
    validating = errors.validate_mode(validate)
    if validating:
        # Earlier calls' errors are kept for check_errors(); this call raises for its own only.
        errors.set_aside_errors()
    # the one-query and tiled kernels write each row's maximum logit beside its LSE; the other
    # paths return None for it (below: the sharpened pass on a GPU, the exact pass on the CPU)
    row_max = bool(return_max_logit)
    outputs = _kernels_unchecked(q, k, v, cu_seqlens_q, cu_seqlens_kv, seqlens_kv, max_seqlen_q,
                                 max_seqlen_kv, softmax_scale, qkv_layout, return_softmax,
                                 backend, row_max)
    if outputs is None:
        outputs = _checked_call(q, k, v, cu_seqlens_q, cu_seqlens_kv, seqlens_kv, max_seqlen_q,
                                max_seqlen_kv, softmax_scale, qkv_layout, return_softmax,
                                return_lse, backend, row_max)
    out, lse, probs = outputs[:3]
    if validating:
        errors.check_call_errors()
    result = (out,) + ((lse,) if return_lse else ()) + ((probs,) if return_softmax else ())
    if return_max_logit:
        rows = outputs[3] if row_max else None
        if rows is not None:
            result += (max_logit_from_row_max(rows),)
        else:
            args = (q, k, cu_seqlens_q, cu_seqlens_kv, seqlens_kv, max_seqlen_q, max_seqlen_kv,
                    softmax_scale, qkv_layout)
            result += ((_sharpened_max_logit(v, backend, *args) if q.is_cuda
                        else _max_logit(*args)),)
    return result[0] if len(result) == 1 else result


def max_logit_from_row_max(row_max: torch.Tensor) -> torch.Tensor:
    """float32 ``[h_q]`` max logit from the kernels' per-row maxima ``[h_q, rows]``: the max over
    rows, on the device (no sync). Rows without keys and padding rows hold ``-inf`` and drop
    out (``-inf`` for a head with no key anywhere); a contract-breaking segment's rows hold NaN,
    which propagates, as its LSE does through the sharpened pass. Not differentiable."""
    row_max = row_max.detach()
    if row_max.shape[1] == 0:
        return row_max.new_full((row_max.shape[0],), float("-inf"))
    return row_max.amax(dim=1)


def _sharpened_max_logit(v, backend, q, k, cu_seqlens_q, cu_seqlens_kv, seqlens_kv,
                         max_seqlen_q, max_seqlen_kv, softmax_scale, qkv_layout) -> torch.Tensor:
    """float32 ``[h_q]`` max logit on a GPU: the call's own path once more at
    ``softmax_scale * TEMPERATURE`` with its LSE (the sharpened-LSE pass of
    :mod:`rocm_attn.varlen.max_logit`: at most ``ln(max_seqlen_kv) / T`` above the exact
    maximum, plus float32 rounding). Rows without keys and padding rows have LSE ``-inf`` and
    drop out; a contract-breaking segment's NaN rows propagate (and it is counted again)."""
    from .varlen.max_logit import TEMPERATURE, max_logit_from_sharpened_lse

    scale_t = _scale(q, softmax_scale) * TEMPERATURE
    with torch.no_grad():
        outputs = _kernels_unchecked(q, k, v, cu_seqlens_q, cu_seqlens_kv, seqlens_kv,
                                     max_seqlen_q, max_seqlen_kv, scale_t, qkv_layout, False,
                                     backend)
        if outputs is None:
            outputs = _checked_call(q, k, v, cu_seqlens_q, cu_seqlens_kv, seqlens_kv,
                                    max_seqlen_q, max_seqlen_kv, scale_t, qkv_layout, False,
                                    True, backend)
    lse = outputs[1]
    # a row's LSE is -inf in every head or in none (keys are per segment)
    return max_logit_from_sharpened_lse(lse, (lse != float("-inf")).any(dim=0))


def _max_logit(q, k, cu_seqlens_q, cu_seqlens_kv, seqlens_kv, max_seqlen_q, max_seqlen_kv,
               softmax_scale, qkv_layout) -> torch.Tensor:
    """float32 ``[h_q]`` max of the scaled logits over every segment (no mask): the blocked
    pass of :mod:`rocm_attn.varlen.max_logit` over the call's segments, on any path."""
    from .varlen.max_logit import segments_max_logit

    dev = q.device
    if qkv_layout == "bshd_bshd_bshd":
        b, s_q, s_kv = q.shape[0], q.shape[1], k.shape[1]
        q2, k2 = q.reshape(b * s_q, *q.shape[2:]), k.reshape(b * s_kv, *k.shape[2:])
        ar = torch.arange(b, device=dev)
        q_start, q_len = ar * s_q, torch.full_like(ar, s_q)
        kv_len = (torch.full_like(ar, s_kv) if seqlens_kv is None
                  else seqlens_kv.to(dev).long().clamp(0, s_kv))
        kv_start = ar * s_kv
    else:
        q2, k2 = q, k
        b = cu_seqlens_kv.numel() - 1
        if cu_seqlens_q is None:  # one query row per segment
            q_start = torch.arange(b, device=dev)
            q_len = torch.ones_like(q_start)
        else:
            c = cu_seqlens_q.long()
            q_start, q_len = c[:-1], (c[1:] - c[:-1]).clamp(min=0)
        c = cu_seqlens_kv.long()
        kv_start, kv_len = c[:-1], (c[1:] - c[:-1]).clamp(min=0)
    with torch.no_grad():
        return segments_max_logit(q2, k2, q_start, q_len, kv_start, kv_len, causal=False,
                                  window=(-1, -1), max_q=max(1, int(max_seqlen_q)),
                                  max_kv=max(1, int(max_seqlen_kv)), q_rows=q2.shape[0],
                                  scale=_scale(q, softmax_scale))


def _bound_from_data(k, cu_seqlens_kv, qkv_layout) -> int:
    """max_seqlen_kv when the caller gives none: BSHD ``s_kv``; THD the longest segment of
    cu_seqlens_kv (one host read), capped at k's rows (no valid segment has more keys), so that
    a default never turns a valid call into NaN."""
    if not isinstance(k, torch.Tensor) or k.dim() < 3:
        return 1  # the argument checks raise for k
    if qkv_layout == "bshd_bshd_bshd":
        return max(int(k.shape[1]), 1) if k.dim() == 4 else 1
    rows = max(int(k.shape[0]), 1)
    if not isinstance(cu_seqlens_kv, torch.Tensor) or cu_seqlens_kv.dim() != 1:
        return 1  # the argument checks raise for cu_seqlens_kv
    if errors.holds_no_values(cu_seqlens_kv) or errors.holds_no_values(k):
        return rows  # shape probing: the bound every valid call meets
    if (torch.compiler.is_compiling() or errors.exporting()
            or (torch.cuda.is_available() and torch.cuda.is_current_stream_capturing())):
        raise ValueError(
            "fused_attn_small_seq: max_seqlen_kv must be given while torch.compile or "
            "torch.export traces the call or a graph is captured (the THD default reads "
            "cu_seqlens_kv on the host)")
    lens = cu_seqlens_kv.long().diff()
    longest = int(lens.max()) if lens.numel() else 0
    bound = min(max(longest, 1), rows)
    log.debug("fused_attn_small_seq: max_seqlen_kv=%d from cu_seqlens_kv (one host read); pass "
              "max_seqlen_kv to skip it", bound)
    return bound


def _positional_message(n: int) -> str:
    return (f"fused_attn_small_seq takes at most 7 positional arguments (q, k, v, cu_seqlens_q, "
            f"cu_seqlens_kv, max_seqlen_q, max_seqlen_kv), got {7 + n}: pass softmax_scale, "
            f"qkv_layout, return_softmax and the rest by keyword. NOTE: in flash-attn's "
            f"flash_attn_varlen_func the 8th positional argument is dropout_p (this op has no "
            f"dropout); here a positional softmax_scale of 0.0 would give uniform weights.")


def _public_signature() -> inspect.Signature:
    """fused_attn_small_seq's signature as users see it: a bare ``*`` after max_seqlen_kv (the
    ``*positional_after_max_seqlen_kv`` catch-all exists only to raise the message above)."""
    sig = inspect.signature(fused_attn_small_seq)
    params = [p for p in sig.parameters.values() if p.kind is not p.VAR_POSITIONAL]
    return sig.replace(parameters=params)


fused_attn_small_seq.__signature__ = _public_signature()
