"""Host-side argument checks of the THD helpers (no sync), and the checks of device values
that run only when asked for (``validate``) or when they cost no sync (CPU tensors).

The checks every op family shares (ints, cu_seqlens, windows, chunk sizes) live in
:mod:`rocm_attn._checks`; these are the THD ones (ranks, token dims, halves, row maps).
"""

from __future__ import annotations

from typing import Optional

import torch

from .._checks import check_chunk_size, check_int, is_int
from ..errors import validate_mode


HALVES = {"first": 0, "second": 1, 0: 0, 1: 1}
# Stand-in chunk size for "no chunking": larger than any sequence, small enough that
# (chunk id + 1) * size stays far inside int64.
NO_CHUNK = 1 << 40


def check_cp_rank(cp, rank=None, rank_name: str = "rank") -> None:
    check_int("cp", cp, 1)
    if rank is not None and (not is_int(rank) or not 0 <= rank < cp):
        raise ValueError(f"{rank_name} must be an int in [0, cp={cp}), got {rank!r}")


def check_tensor(name: str, t, min_dim: int = 1, floating: bool = False) -> None:
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dim() < min_dim:
        raise ValueError(f"{name} must have at least {min_dim} dim(s), got shape {tuple(t.shape)}")
    if floating and not t.dtype.is_floating_point:
        raise ValueError(f"{name} must be floating point, got {t.dtype}")


def check_writable(name: str, t: torch.Tensor) -> None:
    """An in-place output must not have elements sharing memory (an expanded, stride-0 view
    or another self-overlapping layout): the write would land once per alias. While
    torch.compile traces, only the stride-0 test runs (the general overlap query returns a
    Python int, which dynamo cannot put in a graph)."""
    expanded = any(st == 0 and n > 1 for n, st in zip(t.shape, t.stride()))
    overlap = (not torch.compiler.is_compiling()
               and torch._debug_has_internal_overlap(t) == 1)
    if expanded or overlap:
        raise ValueError(f"{name} is written in place but its elements overlap in memory "
                         f"(shape {tuple(t.shape)}, strides {tuple(t.stride())}; e.g. an "
                         "expand()ed tensor): pass a tensor with its own storage per element "
                         "(.clone() / .contiguous())")


def norm_dim(name: str, t: torch.Tensor, dim) -> int:
    if not is_int(dim) or not -t.dim() <= dim < t.dim():
        raise ValueError(f"dim must be an int in [{-t.dim()}, {t.dim()}) for {name} "
                         f"of shape {tuple(t.shape)}, got {dim!r}")
    return dim % t.dim()


def check_half(half) -> int:
    if half not in HALVES or isinstance(half, bool):
        raise ValueError(f"half must be 'first' or 'second' (or 0 / 1), got {half!r}")
    return HALVES[half]


def check_even(name: str, n: int, what: str) -> None:
    if n % 2:
        raise ValueError(f"{name} has {n} tokens along its token dim; {what} needs an even count "
                         "(every local sequence is two equal halves)")


def chunk_or_no_chunk(chunk_size) -> int:
    """A chunk size (None: no chunking) as an int; None becomes :data:`NO_CHUNK`."""
    cs = check_chunk_size(chunk_size, allow_none=True)
    return NO_CHUNK if cs is None else cs


def check_values(validate, *tensors: Optional[torch.Tensor]) -> bool:
    """Whether a function with value checks by default runs them: ``validate=True`` / "sync"
    (or env ``ROCM_ATTN_VALIDATE=1``), or ``validate=None`` with every tensor on the CPU, where
    reading values costs no device sync. Not while torch.compile traces a default call: a value
    read there is a data-dependent guard (graph break), so compiled code keeps the eager GPU
    contract (clamped indices, no check)."""
    if validate is None and not validate_mode(None):
        return (all(t is None or t.device.type == "cpu" for t in tensors)
                and not torch.compiler.is_compiling())
    return validate_mode(validate)


def first_bad(mask: torch.Tensor) -> int:
    idx = torch.nonzero(mask.reshape(-1))
    return int(idx[0, 0]) if idx.numel() else -1


def validate_row_index(name: str, rows: torch.Tensor, n: int, what: str) -> None:
    """Raise ValueError unless every entry of ``rows`` is in ``[0, n)``. Synchronises."""
    if rows.numel() == 0:
        return
    bad = (rows < 0) | (rows >= n)
    i = first_bad(bad)
    if i >= 0:
        raise ValueError(f"{name}[{i}] = {int(rows[i])} is out of range: entries must be in "
                         f"[0, {n}) ({what} = {n})")


def validate_cu_values(name: str, cu: torch.Tensor, total: Optional[int] = None,
                        divisor: int = 1, divisor_why: str = "", zero_start: bool = False,
                        total_name: str = "the tensor") -> None:
    """Raise ValueError on bad cu_seqlens values. Synchronises."""
    c = cu.long()
    if zero_start and int(c[0]) != 0:
        raise ValueError(f"{name}[0] must be 0, got {int(c[0])}")
    if int(c[0]) < 0:
        raise ValueError(f"{name}[0] must be >= 0, got {int(c[0])}")
    lens = c[1:] - c[:-1]
    i = first_bad(lens < 0)
    if i >= 0:
        raise ValueError(f"{name} must be non-decreasing: sequence {i} has length {int(lens[i])} "
                         f"({name}[{i}]={int(c[i])}, {name}[{i + 1}]={int(c[i + 1])})")
    if divisor > 1:
        i = first_bad(lens % divisor != 0)
        if i >= 0:
            raise ValueError(f"{name}: sequence {i} has length {int(lens[i])}, not divisible by "
                             f"{divisor}{divisor_why}")
        if int(c[0]) % divisor:
            raise ValueError(f"{name}[0]={int(c[0])} must be a multiple of {divisor}{divisor_why}")
    if total is not None and int(c[-1]) > total:
        raise ValueError(f"{name} ends at {int(c[-1])} but {total_name} has only {total} tokens")


def validate_valid_in_padded(name: str, cu: torch.Tensor, pname: str, cu_p: torch.Tensor) -> None:
    lens = (cu[1:] - cu[:-1]).long()
    slots = (cu_p[1:] - cu_p[:-1]).long()
    i = first_bad(lens > slots)
    if i >= 0:
        raise ValueError(f"sequence {i} has {int(lens[i])} valid tokens ({name}) but a padded slot "
                         f"of only {int(slots[i])} ({pname})")


def check_row_index(name: str, rows: torch.Tensor, n: Optional[int], what: str) -> None:
    if rows.dtype != torch.int64 or rows.dim() != 1 or (n is not None and rows.numel() != n):
        want = "int64 [n]" if n is None else f"int64 [n] with n = {what} = {n}"
        raise ValueError(f"{name} must be {want}, got {rows.dtype} {list(rows.shape)}")


def check_row_maps(rows: torch.Tensor, step_rows: Optional[torch.Tensor], step_n: int,
                    step_what: str) -> None:
    """``rows`` names one row per step row (``step_n`` of them), or, with ``step_rows``, both
    are int64 ``[n]`` of one length (merge_rows_ / add_rows_)."""
    if step_rows is None:
        check_row_index("rows", rows, step_n, step_what)
    else:
        check_row_index("rows", rows, None, "")
        check_row_index("step_rows", step_rows, rows.numel(), "rows.numel()")
