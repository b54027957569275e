"""The compiled THD kernels (hip_src/thd) behind the kernel slots, and their fake (meta) impls.

One row gather/scatter kernel serves partition, the two reorders, read_half,
copy_valid_tokens and pad_for_cp (raw bytes: any 2/4/8-byte dtype); one merge kernel
serves merge_partial, lse_correction and out_correction (fp32 math, bf16/fp16/fp32 rows,
e.g. an fp32 accumulator with bf16 steps); one kernel serves grad_correction. Each
``kernel_<name>`` has the signature and semantics of ``_torch_<name>``. A call the kernels
do not serve (a layout whose dims do not merge into [outer, tokens, heads, contiguous
elements], another dtype, mixed copy dtypes, fp64 math, inputs that require grad under
autograd, an in-place call whose inputs share memory with its outputs) goes to the torch
path through :func:`fallback` (logged). The checks here mirror the C++ ones of the
bindings so that those never fire.
"""

from __future__ import annotations

import logging
from typing import Callable, Dict, Optional

import torch

from .. import _logging
from ._dispatch import TORCH, register_kernel
from ._index import padded_cu_seqlens


_log = logging.getLogger("rocm_attn")

_KERNEL_COPY_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
_KERNEL_MATH_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
_GRAD_OP_CODES = {"none": 0, "copy": 1, "add": 2}
_I32_MAX = 2**31 - 1
_KERNEL_OPS = ("thd_gather", "thd_copy_valid_tokens_", "thd_merge", "thd_merge_",
               "thd_merge_rows_", "thd_add_rows_", "thd_out_correction_", "thd_grad_correction",
               "thd_grad_correction_")


def fallback(name: str, why: str, *args):
    """Run the torch path for a call the kernels do not serve."""
    _logging.log_choice(_log, ("thd", name, "torch", why), "rocm_attn.thd.%s: torch path (%s)",
                        name, why)
    return TORCH[name](*args)


def collapse(t: torch.Tensor, begin: int, end: int):
    """Dims [begin, end) of t merged into one: (size, stride), or None when they do not merge.
    Size-1 dims are skipped; an empty range is (1, 1)."""
    size, stride, first = 1, 1, True
    for i in range(end - 1, begin - 1, -1):
        n = t.shape[i]
        if n == 1:
            continue
        if first:
            size, stride, first = n, t.stride(i), False
        elif t.stride(i) == stride * size:
            size *= n
        else:
            return None
    return size, stride


def _row_split(ts, begin: int):
    """Dims [begin, ndim) of tensors with one trailing shape as [heads, contiguous elements]:
    (heads, elements), or None."""
    nd = ts[0].dim()
    s = begin
    while s < nd:
        tails = [collapse(t, s, nd) for t in ts]
        if all(c is not None and (c[0] == 1 or c[1] == 1) for c in tails):
            break
        s += 1
    elems = collapse(ts[0], s, nd)[0]
    heads = [collapse(t, begin, s) for t in ts]
    if any(h is None for h in heads):
        return None
    return heads[0][0], elems


def _autograd_problem(*ts) -> Optional[str]:
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in ts):
        return "inputs require grad (the torch path is differentiable, the kernels are not)"
    return None


def _overlap_problem(*ts) -> Optional[str]:
    """In-place calls: no two tensors may share memory (checked in eager only; under
    torch.compile functionalization gives every mutated tensor its own buffer)."""
    if torch.compiler.is_compiling():
        return None
    ptrs = [t.untyped_storage().data_ptr() for t in ts if t is not None and t.numel()]
    if len(set(ptrs)) != len(ptrs):
        return "in place with tensors sharing memory"
    return None


def _copy_problem(ts, dim: int) -> Optional[str]:
    """Why the row kernel cannot copy these tensors along token dim ``dim`` (None: it can)."""
    for t in ts:
        if t.dtype not in _KERNEL_COPY_DTYPES:
            return f"dtype {t.dtype}"
        if collapse(t, 0, dim) is None:
            return "the dims before the token dim do not merge into one"
    split = _row_split(ts, dim + 1)
    if split is None:
        return "the dims after the token dim are not [heads, contiguous elements]"
    if split[0] > _I32_MAX or split[1] * ts[0].element_size() > _I32_MAX:
        return "rows too large"
    return _autograd_problem(*ts)


def _math_dtype_problem(**named) -> Optional[str]:
    for name, t in named.items():
        if t is not None and t.dtype not in _KERNEL_MATH_DTYPES:
            return f"{name} dtype {t.dtype} (kernels: float16, bfloat16, float32)"
    return None


def _merge_problem(out, lse, out_step, lse_step) -> Optional[str]:
    for name, lt in (("lse", lse), ("lse_step", lse_step)):
        if lt.dtype != torch.float32:
            return f"{name} dtype {lt.dtype} (kernels: float32)"
        c = collapse(lt, 0, lt.dim() - 1)
        if c is None or c[0] > _I32_MAX:
            return f"{name}: the head dims do not merge into one"
    if out is not None:
        why = _math_dtype_problem(out=out, out_step=out_step)
        if why:
            return why
        nh = lse.dim() - 1
        for name, o in (("out", out), ("out_step", out_step)):
            tail = collapse(o, 1 + nh, o.dim())
            if (collapse(o, 1, 1 + nh) is None or tail is None
                    or not (tail[0] == 1 or tail[1] == 1) or tail[0] > _I32_MAX):
                return f"{name} is not [t, heads, contiguous elements]"
    return _autograd_problem(out, lse, out_step, lse_step)


def _cu(cu: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    return None if cu is None else cu.contiguous()


def kernel_partition(x, cu_seqlens_padded, cp, rank, dim):
    why = _copy_problem((x,), dim)
    if why:
        return fallback("partition", why, x, cu_seqlens_padded, cp, rank, dim)
    return torch.ops.rocm_attn.thd_gather(x, _cu(cu_seqlens_padded), 0, cp, rank, dim)


def kernel_reorder_to_contiguous(x_gathered, cu_seqlens_padded, cp, dim):
    why = _copy_problem((x_gathered,), dim)
    if why:
        return fallback("reorder_to_contiguous", why, x_gathered, cu_seqlens_padded, cp, dim)
    return torch.ops.rocm_attn.thd_gather(x_gathered, _cu(cu_seqlens_padded), 1, cp, 0, dim)


def kernel_reorder_to_rank_sharded(x, cu_seqlens_padded, cp, dim):
    why = _copy_problem((x,), dim)
    if why:
        return fallback("reorder_to_rank_sharded", why, x, cu_seqlens_padded, cp, dim)
    return torch.ops.rocm_attn.thd_gather(x, _cu(cu_seqlens_padded), 2, cp, 0, dim)


def kernel_read_half(x, cu_seqlens_padded, half, dim):
    why = _copy_problem((x,), dim)
    if why:
        return fallback("read_half", why, x, cu_seqlens_padded, half, dim)
    return torch.ops.rocm_attn.thd_gather(x, _cu(cu_seqlens_padded), 3, 1, half, dim)


def _fill_problem(fill, dtype) -> Optional[str]:
    if fill is None:
        return None
    f = float(fill)
    if f == f and abs(f) != float("inf") and abs(f) > torch.finfo(dtype).max:
        return f"fill {fill!r} overflows {dtype}"  # the torch path raises for it
    return None


def kernel_copy_valid_tokens(dst, src, cu_seqlens, cu_seqlens_dst_padded, cu_seqlens_src_padded,
                              dim, fill):
    why = ("src and dst dtypes differ" if src.dtype != dst.dtype else None) \
        or _copy_problem((src, dst), dim) or _fill_problem(fill, dst.dtype) \
        or _overlap_problem(dst, src)
    if why:
        return fallback("copy_valid_tokens", why, dst, src, cu_seqlens, cu_seqlens_dst_padded,
                         cu_seqlens_src_padded, dim, fill)
    torch.ops.rocm_attn.thd_copy_valid_tokens_(
        dst, src, _cu(cu_seqlens), _cu(cu_seqlens_dst_padded), _cu(cu_seqlens_src_padded), dim,
        None if fill is None else float(fill))
    return dst


def kernel_pad_for_cp(x, cu_seqlens, cp, total_padded):
    why = _copy_problem((x,), 0)
    if why:
        return fallback("pad_for_cp", why, x, cu_seqlens, cp, total_padded)
    cu_p = padded_cu_seqlens(cu_seqlens, cp)
    out = x.new_empty((total_padded,) + tuple(x.shape[1:]))
    torch.ops.rocm_attn.thd_copy_valid_tokens_(out, x, _cu(cu_seqlens), cu_p, None, 0, 0.0)
    return out, cu_p


def kernel_merge_partial(out, lse, out_step, lse_step, cu_seqlens_padded, only_second_half,
                          inplace):
    why = _merge_problem(out, lse, out_step, lse_step) or (
        _overlap_problem(out, lse, out_step, lse_step) if inplace else None)
    if why:
        return fallback("merge_partial", why, out, lse, out_step, lse_step, cu_seqlens_padded,
                         only_second_half, inplace)
    cu = _cu(cu_seqlens_padded) if only_second_half else None
    if inplace:
        torch.ops.rocm_attn.thd_merge_(out, lse, out_step, lse_step, cu, only_second_half)
        return out, lse
    o, l_ = torch.ops.rocm_attn.thd_merge(out, lse, out_step, lse_step, cu, only_second_half,
                                          False)
    return o, l_


def _row_maps_problem(device: torch.device, rows: torch.Tensor,
                     step_rows: Optional[torch.Tensor]) -> Optional[str]:
    for name, r in (("rows", rows), ("step_rows", step_rows)):
        if r is not None and r.device != device:
            return f"{name} on {r.device}"
    return None


def _grad_problem(grad: torch.Tensor, step: torch.Tensor, step_name: str) -> Optional[str]:
    """Why the grad kernel cannot add ``step`` rows into ``grad`` rows (None: it can)."""
    split = _row_split((grad, step), 1)
    return _math_dtype_problem(grad=grad, **{step_name: step}) or (
        "rows are not [heads, contiguous elements]" if split is None
        or split[0] > _I32_MAX or split[1] > _I32_MAX else None) \
        or _autograd_problem(grad, step)


def kernel_merge_rows_(out, lse, out_step, lse_step, rows, step_rows):
    why = (_merge_problem(out, lse, out_step, lse_step)
           or _overlap_problem(out, lse, out_step, lse_step)
           or _row_maps_problem(lse.device, rows, step_rows))
    if why:
        return fallback("merge_rows_", why, out, lse, out_step, lse_step, rows, step_rows)
    torch.ops.rocm_attn.thd_merge_rows_(out, lse, out_step, lse_step, rows.contiguous(),
                                        None if step_rows is None else step_rows.contiguous())
    return out, lse


def kernel_add_rows_(grad, step, rows, step_rows):
    why = (_grad_problem(grad, step, "step") or _overlap_problem(grad, step)
           or _row_maps_problem(grad.device, rows, step_rows))
    if why:
        return fallback("add_rows_", why, grad, step, rows, step_rows)
    torch.ops.rocm_attn.thd_add_rows_(grad, step, rows.contiguous(),
                                      None if step_rows is None else step_rows.contiguous())
    return grad


def kernel_lse_correction(lse, lse_step, cu_seqlens_padded, only_second_half, inplace):
    why = _merge_problem(None, lse, None, lse_step) or (
        _overlap_problem(lse, lse_step) if inplace else None)
    if why:
        return fallback("lse_correction", why, lse, lse_step, cu_seqlens_padded,
                         only_second_half, inplace)
    cu = _cu(cu_seqlens_padded) if only_second_half else None
    if inplace:
        torch.ops.rocm_attn.thd_merge_(None, lse, None, lse_step, cu, only_second_half)
        return lse
    return torch.ops.rocm_attn.thd_merge(None, lse, None, lse_step, cu, only_second_half,
                                         False)[1]


def kernel_out_correction(out, out_step, lse, lse_step, cu_seqlens_padded, only_second_half,
                           inplace):
    why = _merge_problem(out, lse, out_step, lse_step) or (
        _overlap_problem(out, out_step, lse, lse_step) if inplace else None)
    if why:
        return fallback("out_correction", why, out, out_step, lse, lse_step, cu_seqlens_padded,
                         only_second_half, inplace)
    cu = _cu(cu_seqlens_padded) if only_second_half else None
    if inplace:
        torch.ops.rocm_attn.thd_out_correction_(out, out_step, lse, lse_step, cu,
                                                only_second_half)
        return out
    return torch.ops.rocm_attn.thd_merge(out, lse, out_step, lse_step, cu, only_second_half,
                                         True)[0]


def kernel_grad_correction(grad, grad_step, cu_seqlens_padded, first_half_op, second_half_op,
                            inplace):
    if first_half_op == "none" and second_half_op == "none":
        return grad  # as the torch path: nothing to do, grad itself
    why = _grad_problem(grad, grad_step, "grad_step") or (
        _overlap_problem(grad, grad_step) if inplace else None)
    if why:
        return fallback("grad_correction", why, grad, grad_step, cu_seqlens_padded,
                         first_half_op, second_half_op, inplace)
    ops = (_GRAD_OP_CODES[first_half_op], _GRAD_OP_CODES[second_half_op])
    if inplace:
        torch.ops.rocm_attn.thd_grad_correction_(grad, grad_step, _cu(cu_seqlens_padded), *ops)
        return grad
    return torch.ops.rocm_attn.thd_grad_correction(grad, grad_step, _cu(cu_seqlens_padded),
                                                   *ops)


def _fake_gather(x, cu_seqlens_padded, mode, cp, rank, dim):
    n = x.shape[dim]
    shape = list(x.shape)
    shape[dim] = n // cp if mode == 0 else (n // 2 if mode == 3 else n)
    return x.new_empty(shape)


def _fake_merge(out, lse, out_step, lse_step, cu_seqlens_padded, only_second_half, correction):
    new_out = lse.new_empty((0,)) if out is None else out.new_empty(out.shape)
    new_lse = lse.new_empty((0,)) if correction else lse.new_empty(lse.shape)
    return new_out, new_lse


def _fake_grad_correction(grad, grad_step, cu_seqlens_padded, first_half_op, second_half_op):
    return grad.new_empty(grad.shape)


def _fake_mutating(*args):
    return None


KERNEL_IMPLS: Dict[str, Callable] = {
    "partition": kernel_partition,
    "reorder_to_contiguous": kernel_reorder_to_contiguous,
    "reorder_to_rank_sharded": kernel_reorder_to_rank_sharded,
    "read_half": kernel_read_half,
    "copy_valid_tokens": kernel_copy_valid_tokens,
    "pad_for_cp": kernel_pad_for_cp,
    "merge_partial": kernel_merge_partial,
    "merge_rows_": kernel_merge_rows_,
    "add_rows_": kernel_add_rows_,
    "lse_correction": kernel_lse_correction,
    "out_correction": kernel_out_correction,
    "grad_correction": kernel_grad_correction,
}


def register_compiled_kernels() -> bool:
    """Fake impls of the THD ops and the kernel slots; False when this build lacks the ops."""
    if not all(hasattr(torch.ops.rocm_attn, op) for op in _KERNEL_OPS):
        return False
    torch.library.register_fake("rocm_attn::thd_gather")(_fake_gather)
    torch.library.register_fake("rocm_attn::thd_merge")(_fake_merge)
    torch.library.register_fake("rocm_attn::thd_grad_correction")(_fake_grad_correction)
    for op in ("thd_copy_valid_tokens_", "thd_merge_", "thd_merge_rows_", "thd_add_rows_",
               "thd_out_correction_", "thd_grad_correction_"):
        torch.library.register_fake(f"rocm_attn::{op}")(_fake_mutating)
    for name, fn in KERNEL_IMPLS.items():
        register_kernel(name, fn)
    return True
