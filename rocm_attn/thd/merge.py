"""Combining partial attention results: the online-softmax merge (:func:`merge_partial`, its
two-pass halves :func:`lse_correction` / :func:`out_correction`, and :func:`merge_rows_` by row
index), and the gradient counterparts (:func:`grad_correction`, :func:`add_rows_`).
Conventions: :mod:`rocm_attn.thd`."""

from __future__ import annotations

from typing import Optional, Tuple

import torch

from .._checks import check_cu
from ..errors import validate_mode
from ._checks import (check_even, check_row_maps, check_tensor, check_values, check_writable,
                      validate_cu_values, validate_row_index)
from ._dispatch import impl, torch_path
from ._index import clamp_rows, half_index, step_rows_of

__all__ = ["GRAD_OPS", "merge_partial", "lse_correction", "out_correction", "grad_correction",
           "merge_rows_", "add_rows_"]


GRAD_OPS = ("none", "copy", "add")


def _check_out_lse(out_name, out, lse_name, lse):
    check_tensor(out_name, out, 1, floating=True)
    check_tensor(lse_name, lse, 1)
    if lse.dtype not in (torch.float32, torch.float64):
        raise ValueError(f"{lse_name} must be float32 (or float64), got {lse.dtype}")
    if lse.device != out.device:
        raise ValueError(f"{lse_name} must be on {out.device} like {out_name}, got {lse.device}")
    if (lse.dim() > out.dim() or lse.shape[-1] != out.shape[0]
            or tuple(lse.shape[:-1]) != tuple(out.shape[1:lse.dim()])):
        raise ValueError(
            f"{lse_name} {tuple(lse.shape)} must be [*heads, t] for {out_name} {tuple(out.shape)} "
            f"= [t, *heads, ...] (LSE is [h, t] for out [t, h, d])")


def _check_merge_shapes(out, lse, out_step, lse_step, cu_seqlens_padded, only_second_half,
                        step_name="out_step", lse_step_name="lse_step"):
    if out is not None:
        _check_out_lse("out", out, "lse", lse)
    else:
        check_tensor("lse", lse, 1)
        if lse.dtype not in (torch.float32, torch.float64):
            raise ValueError(f"lse must be float32 (or float64), got {lse.dtype}")
    if out_step is not None:
        _check_out_lse(step_name, out_step, lse_step_name, lse_step)
    else:
        check_tensor(lse_step_name, lse_step, 1)
        if lse_step.dtype not in (torch.float32, torch.float64):
            raise ValueError(f"{lse_step_name} must be float32 (or float64), got {lse_step.dtype}")
    if lse_step.device != lse.device:
        raise ValueError(f"{lse_step_name} must be on {lse.device}, got {lse_step.device}")
    t = lse.shape[-1]
    if only_second_half:
        check_even("lse", t, "only_second_half")
        t_step = t // 2
        what = "half the tokens of lse (only_second_half=True)"
    else:
        t_step = t
        what = "the tokens of lse"
    if tuple(lse_step.shape) != tuple(lse.shape[:-1]) + (t_step,):
        raise ValueError(f"{lse_step_name} must have shape {tuple(lse.shape[:-1]) + (t_step,)} "
                         f"({what}), got {tuple(lse_step.shape)}")
    if out is not None and out_step is not None:
        want = (t_step,) + tuple(out.shape[1:])
        if tuple(out_step.shape) != want:
            raise ValueError(f"{step_name} must have shape {want} ({what}), got "
                             f"{tuple(out_step.shape)}")
    if only_second_half:
        if cu_seqlens_padded is None:
            raise ValueError("only_second_half=True needs cu_seqlens_padded (the local one)")
        check_cu("cu_seqlens_padded", cu_seqlens_padded, lse.device)
    elif cu_seqlens_padded is not None:
        check_cu("cu_seqlens_padded", cu_seqlens_padded, lse.device)


def _lse_weight(lse, ndim):
    """[*heads, t] -> [t, *heads, 1, ...] broadcastable against an ndim out."""
    w = lse.movedim(-1, 0)
    return w.reshape(tuple(w.shape) + (1,) * (ndim - w.dim()))


def _merge_math(out, lse, out_step, lse_step):
    """Stable online-softmax merge, computed in >= fp32. Returns (out in out.dtype, lse)."""
    cdt = torch.promote_types(torch.float32, lse.dtype)
    cdt = torch.promote_types(cdt, lse_step.dtype)
    if out is not None:
        cdt = torch.promote_types(torch.promote_types(cdt, out.dtype), out_step.dtype)
    a = lse.to(cdt)
    b = lse_step.to(cdt)
    mx = torch.maximum(a, b)
    mn = torch.minimum(a, b)
    empty = mx == float("-inf")
    safe_mx = torch.where(empty, torch.zeros_like(mx), mx)
    new = torch.where(empty, mx, safe_mx + torch.log1p(torch.exp(mn - safe_mx)))
    if out is None:
        return None, new.to(lse.dtype)
    safe_new = torch.where(empty, torch.zeros_like(new), new)
    w = _lse_weight(torch.exp(a - safe_new), out.dim())
    ws = _lse_weight(torch.exp(b - safe_new), out.dim())
    # a zero weight drops its side entirely: an empty running accumulator (lse = -inf) may hold
    # junk (torch.empty), and a step row with no keys contributes nothing
    zero = torch.zeros((), dtype=cdt, device=out.device)
    o = torch.where(w > 0, out.to(cdt) * w, zero)
    o = o + torch.where(ws > 0, out_step.to(cdt) * ws, zero)
    return o.to(out.dtype), new.to(lse.dtype)


def _correction_math(out, out_step, lse, lse_step):
    """out + out_step * exp(lse_step - lse) in >= fp32 (lse: the final combined LSE)."""
    cdt = torch.promote_types(torch.promote_types(torch.float32, out.dtype), out_step.dtype)
    cdt = torch.promote_types(cdt, lse.dtype)
    a = lse.to(cdt)
    b = lse_step.to(cdt)
    ok = b != float("-inf")
    w = torch.exp(torch.where(ok, b - a, torch.full_like(b, float("-inf"))))
    w = _lse_weight(w, out.dim())
    o = out.to(cdt) + torch.where(w > 0, out_step.to(cdt) * w,
                                  torch.zeros((), dtype=cdt, device=out.device))
    return o.to(out.dtype)


def _write_back(t, new, inplace):
    if inplace:
        t.copy_(new)
        return t
    return new


def _index_write(t, dim, idx, vals, inplace):
    if inplace:
        return t.index_copy_(dim, idx, vals)
    return t.index_copy(dim, idx, vals)


@torch_path("merge_partial")
def _torch_merge_partial(out, lse, out_step, lse_step, cu_seqlens_padded, only_second_half,
                         inplace):
    if not only_second_half:
        o, l_ = _merge_math(out, lse, out_step, lse_step)
        return _write_back(out, o, inplace), _write_back(lse, l_, inplace)
    idx = half_index(cu_seqlens_padded.long(), out.shape[0], 1)
    o, l_ = _merge_math(out.index_select(0, idx), lse.index_select(-1, idx), out_step, lse_step)
    return (_index_write(out, 0, idx, o, inplace),
            _index_write(lse, lse.dim() - 1, idx, l_, inplace))


def merge_partial(out: torch.Tensor, lse: torch.Tensor, out_step: torch.Tensor,
                  lse_step: torch.Tensor, cu_seqlens_padded: Optional[torch.Tensor] = None,
                  only_second_half: bool = False, *, inplace: bool = False,
                  validate: Optional[bool] = None,
                  backend: str = "auto") -> Tuple[torch.Tensor, torch.Tensor]:
    """Online-softmax merge of a partial attention result into the running one.

    ``new_lse = max + log1p(exp(min - max))`` of ``(lse, lse_step)`` (``-inf`` when both are
    ``-inf``, never NaN) and ``out = out * exp(lse - new_lse) + out_step * exp(lse_step -
    new_lse)``, computed in float32 (float64 if any input is) and rounded to ``out.dtype`` once.
    A side whose weight is 0 (its LSE is ``-inf``) is dropped, so ``out`` may start as junk with
    ``lse = -inf``: ``(zeros/empty, full(-inf))`` is the identity of the merge. A row with no
    allowed key must carry LSE ``-inf`` (some flash-attention builds write ``+inf`` there: map
    it to ``-inf`` before merging).

    Parameters
    ----------
    out : ``[t, h, d]`` (any trailing dims) running output. **May be a float32 accumulator**
        while ``out_step`` is bf16/fp16: keep the accumulator in fp32 across ring steps and
        round to the model dtype once at the end.
    lse : float32 ``[h, t]`` running LSE (token dim last).
    out_step, lse_step : the partial result: ``[t, h, d]`` / ``[h, t]``; with
        ``only_second_half=True`` they cover only the second half of every local sequence,
        ``[t/2, h, d]`` / ``[h, t/2]`` in the layout of :func:`read_half` (ring attention steps
        where only ``q``'s second halves attend: see :func:`chunkify_above`).
    cu_seqlens_padded : local int32 ``[b+1]``; required for ``only_second_half``.
    inplace : write into ``out`` and ``lse`` (and return them) instead of new tensors.

    Returns
    -------
    ``(out, lse)`` with the dtypes of ``out`` and ``lse``.
    """
    _check_merge_shapes(out, lse, out_step, lse_step, cu_seqlens_padded, only_second_half)
    if validate_mode(validate) and only_second_half:
        validate_cu_values("cu_seqlens_padded", cu_seqlens_padded, lse.shape[-1], 2,
                            " (a local sequence is two equal halves)", total_name="out")
    fn = impl("merge_partial", out, backend)
    return fn(out, lse, out_step, lse_step, cu_seqlens_padded, bool(only_second_half),
              bool(inplace))


@torch_path("lse_correction")
def _torch_lse_correction(lse, lse_step, cu_seqlens_padded, only_second_half, inplace):
    if not only_second_half:
        _, l_ = _merge_math(None, lse, None, lse_step)
        return _write_back(lse, l_, inplace)
    idx = half_index(cu_seqlens_padded.long(), lse.shape[-1], 1)
    _, l_ = _merge_math(None, lse.index_select(-1, idx), None, lse_step)
    return _index_write(lse, lse.dim() - 1, idx, l_, inplace)


def lse_correction(lse: torch.Tensor, lse_step: torch.Tensor,
                   cu_seqlens_padded: Optional[torch.Tensor] = None,
                   only_second_half: bool = False, *, inplace: bool = False,
                   validate: Optional[bool] = None, backend: str = "auto") -> torch.Tensor:
    """LSE half of :func:`merge_partial`: ``lse = logaddexp(lse, lse_step)`` (stable, fp32).

    For the two-pass ring forward: accumulate the LSE of every step first, then add each step's
    output with :func:`out_correction` against the final LSE. Shapes and ``only_second_half``
    as in :func:`merge_partial`.
    """
    _check_merge_shapes(None, lse, None, lse_step, cu_seqlens_padded, only_second_half)
    if validate_mode(validate) and only_second_half:
        validate_cu_values("cu_seqlens_padded", cu_seqlens_padded, lse.shape[-1], 2,
                            " (a local sequence is two equal halves)", total_name="lse")
    fn = impl("lse_correction", lse, backend)
    return fn(lse, lse_step, cu_seqlens_padded, bool(only_second_half), bool(inplace))


@torch_path("out_correction")
def _torch_out_correction(out, out_step, lse, lse_step, cu_seqlens_padded, only_second_half,
                          inplace):
    if not only_second_half:
        return _write_back(out, _correction_math(out, out_step, lse, lse_step), inplace)
    idx = half_index(cu_seqlens_padded.long(), out.shape[0], 1)
    o = _correction_math(out.index_select(0, idx), out_step, lse.index_select(-1, idx), lse_step)
    return _index_write(out, 0, idx, o, inplace)


def out_correction(out: torch.Tensor, out_step: torch.Tensor, lse: torch.Tensor,
                   lse_step: torch.Tensor, cu_seqlens_padded: Optional[torch.Tensor] = None,
                   only_second_half: bool = False, *, inplace: bool = False,
                   validate: Optional[bool] = None, backend: str = "auto") -> torch.Tensor:
    """``out += out_step * exp(lse_step - lse)`` where ``lse`` is the **final** combined LSE
    (after every :func:`lse_correction`). Computed in fp32, rounded to ``out.dtype`` once per
    call: start from ``out = zeros(..., dtype=float32)`` to round only at the end. Rows with
    ``lse_step = -inf`` add nothing. Shapes and ``only_second_half`` as in :func:`merge_partial`.
    """
    _check_merge_shapes(out, lse, out_step, lse_step, cu_seqlens_padded, only_second_half)
    if validate_mode(validate) and only_second_half:
        validate_cu_values("cu_seqlens_padded", cu_seqlens_padded, lse.shape[-1], 2,
                            " (a local sequence is two equal halves)", total_name="out")
    fn = impl("out_correction", out, backend)
    return fn(out, out_step, lse, lse_step, cu_seqlens_padded, bool(only_second_half),
              bool(inplace))


@torch_path("grad_correction")
def _torch_grad_correction(grad, grad_step, cu_seqlens_padded, first_half_op, second_half_op,
                           inplace):
    t = grad.shape[0]
    full_step = grad_step.shape[0] == t
    if full_step and first_half_op == second_half_op:  # elementwise fast path
        if first_half_op == "none":
            return grad
        if first_half_op == "copy":
            new = grad_step.to(grad.dtype, copy=True)
        else:
            cdt = torch.promote_types(grad.dtype, grad_step.dtype)
            new = (grad.to(cdt) + grad_step.to(cdt)).to(grad.dtype)
        return _write_back(grad, new, inplace)
    cu = cu_seqlens_padded.long()
    res = grad
    for h, op in ((0, first_half_op), (1, second_half_op)):
        if op == "none":
            continue
        idx = half_index(cu, t, h)
        vals = grad_step.index_select(0, idx) if full_step else grad_step
        if op == "add":
            cdt = torch.promote_types(grad.dtype, grad_step.dtype)
            vals = res.index_select(0, idx).to(cdt) + vals.to(cdt)
        res = _index_write(res, 0, idx, vals.to(grad.dtype), inplace)
    return res


def grad_correction(grad: torch.Tensor, grad_step: torch.Tensor, cu_seqlens_padded: torch.Tensor,
                    first_half_op: str, second_half_op: str, *, inplace: bool = False,
                    validate: Optional[bool] = None, backend: str = "auto") -> torch.Tensor:
    """Fold one ring step's gradient into the running one, half by half.

    For the first (chunk ``rank``) and second (chunk ``2*cp-1-rank``) half of every local
    sequence independently: ``"none"`` leaves ``grad`` as is, ``"copy"`` sets it to
    ``grad_step``, ``"add"`` adds ``grad_step`` (in the promoted dtype, rounded once).

    ``grad``: rank-local ``[t, ...]``; ``cu_seqlens_padded``: the local one (even lengths).
    ``grad_step`` covers either

    * the **full** local sequences: ``[t, ...]`` (the half with op ``"none"`` is ignored), or
    * **one half** only: ``[t/2, ...]`` in the layout of :func:`read_half`. Then exactly one op
      must be ``"none"``; ``grad_step`` holds the half whose op is not ``"none"`` (e.g. dQ of an
      ``above`` step: ``("none", "add")``; dK/dV of a ``below`` step: ``("add", "none")``).

    Returns the corrected gradient (``grad`` itself when ``inplace``).
    """
    check_tensor("grad", grad, 1, floating=True)
    check_tensor("grad_step", grad_step, 1, floating=True)
    for name, op in (("first_half_op", first_half_op), ("second_half_op", second_half_op)):
        if op not in GRAD_OPS:
            raise ValueError(f"{name} must be one of {GRAD_OPS}, got {op!r}")
    if grad_step.device != grad.device:
        raise ValueError(f"grad_step must be on {grad.device}, got {grad_step.device}")
    check_cu("cu_seqlens_padded", cu_seqlens_padded, grad.device)
    t = grad.shape[0]
    check_even("grad", t, "grad_correction")
    if tuple(grad_step.shape[1:]) != tuple(grad.shape[1:]):
        raise ValueError(f"grad_step {tuple(grad_step.shape)} and grad {tuple(grad.shape)} must "
                         "match in every dim but the token dim")
    ts = grad_step.shape[0]
    if ts != t:
        if ts != t // 2:
            raise ValueError(f"grad_step must have {t} (full) or {t // 2} (one half) tokens, "
                             f"got {ts}")
        if (first_half_op == "none") == (second_half_op == "none"):
            raise ValueError(
                f"grad_step covers one half ({ts} of {t} tokens): exactly one of first_half_op / "
                f"second_half_op must be 'none', got ({first_half_op!r}, {second_half_op!r})")
    if validate_mode(validate):
        validate_cu_values("cu_seqlens_padded", cu_seqlens_padded, t, 2,
                            " (a local sequence is two equal halves)", total_name="grad")
    fn = impl("grad_correction", grad, backend)
    return fn(grad, grad_step, cu_seqlens_padded, first_half_op, second_half_op, bool(inplace))


@torch_path("merge_rows_")
def _torch_merge_rows_(out, lse, out_step, lse_step, rows, step_rows):
    rows = clamp_rows(rows, min(out.shape[0], lse.shape[-1]))
    out_step = step_rows_of(out_step, 0, step_rows)
    lse_step = step_rows_of(lse_step, -1, step_rows)
    new_o, new_l = _merge_math(out.index_select(0, rows), lse.index_select(-1, rows), out_step,
                               lse_step)
    out.index_copy_(0, rows, new_o)
    lse.index_copy_(-1, rows, new_l)
    return out, lse


def merge_rows_(out: torch.Tensor, lse: torch.Tensor, out_step: torch.Tensor,
                lse_step: torch.Tensor, rows: torch.Tensor,
                step_rows: Optional[torch.Tensor] = None, *, validate: Optional[bool] = None,
                backend: str = "auto"):
    """In-place online-softmax merge of step row ``k`` into row ``rows[k]`` of ``(out, lse)``.

    For results computed on packed buffers (attn_with_cp's windowed / chunked steps):
    ``out [T, H, D]``, ``lse [H, T]`` float32, ``out_step [n, H, D]``, ``lse_step [H, n]``,
    ``rows`` int64 ``[n]`` in ``[0, T)``. With ``step_rows`` (int64 ``[n]``), entry ``k`` reads
    step row ``step_rows[k]`` instead (a step result of any number of rows, e.g. laid out like
    ``out``; rows only some entries name are never read). A row named twice gets one of the two
    updates (the callers send only a dropped dummy row more than once). Same math as
    :func:`merge_partial`. Entries out of range raise ``ValueError`` when values are checked
    (CPU tensors by default, ``validate=True``); unchecked, they are clamped into range (the
    kernel and the torch path alike).
    """
    check_row_maps(rows, step_rows, lse_step.shape[-1], "lse_step.shape[-1]")
    check_writable("out", out)
    check_writable("lse", lse)
    if check_values(validate, rows, step_rows):
        validate_row_index("rows", rows, min(out.shape[0], lse.shape[-1]),
                            "the rows of out and lse")
        if step_rows is not None:
            validate_row_index("step_rows", step_rows,
                                min(out_step.shape[0], lse_step.shape[-1]),
                                "the rows of out_step and lse_step")
    return impl("merge_rows_", lse, backend)(out, lse, out_step, lse_step, rows, step_rows)


@torch_path("add_rows_")
def _torch_add_rows_(grad, step, rows, step_rows):
    rows = clamp_rows(rows, grad.shape[0])
    step = step_rows_of(step, 0, step_rows)
    grad.index_copy_(0, rows, (grad.index_select(0, rows).float() + step.float()).to(grad.dtype))
    return grad


def add_rows_(grad: torch.Tensor, step: torch.Tensor, rows: torch.Tensor,
              step_rows: Optional[torch.Tensor] = None, *, validate: Optional[bool] = None,
              backend: str = "auto"):
    """In place ``grad[rows[k]] += step[k]`` (``step[step_rows[k]]`` with ``step_rows``), in
    fp32 and rounded once to ``grad``'s dtype: the gradient counterpart of :func:`merge_rows_`
    (``grad [T, ...]``, ``step [n or any, ...]``, ``rows`` / ``step_rows`` int64 ``[n]``). A row
    named twice gets one of the two updates. Out-of-range entries: as in :func:`merge_rows_`."""
    check_row_maps(rows, step_rows, step.shape[0], "step.shape[0]")
    if grad.shape[1:] != step.shape[1:]:
        raise ValueError(f"grad {list(grad.shape)} and step {list(step.shape)} differ after the "
                         "token dim")
    check_writable("grad", grad)
    if check_values(validate, rows, step_rows):
        validate_row_index("rows", rows, grad.shape[0], "grad.shape[0]")
        if step_rows is not None:
            validate_row_index("step_rows", step_rows, step.shape[0], "step.shape[0]")
    return impl("add_rows_", grad, backend)(grad, step, rows, step_rows)
