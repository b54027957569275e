"""THD layout changes for context parallelism: dual-chunk partition and its inverses, copying
valid tokens between packed and padded layouts, reading one half of every local sequence, and
padding sequences to a multiple of ``2*cp`` (conventions: :mod:`rocm_attn.thd`)."""

from __future__ import annotations

from typing import Optional, Tuple, Union

import torch

from .._checks import check_cu, check_int, check_same_b, is_int
from ..errors import validate_mode
from ._checks import (check_cp_rank, check_even, check_half, check_tensor, check_values,
                      check_writable, norm_dim, validate_cu_values, validate_valid_in_padded)
from ._dispatch import impl, torch_path
from ._index import (bcast, copy_rows, global_to_gathered, half_index, local_to_global,
                     padded_cu_seqlens, seq_of)

__all__ = ["token_to_seq", "local_cu_seqlens", "partitioned_indices", "partition",
           "reorder_to_contiguous", "reorder_to_rank_sharded", "copy_valid_tokens", "read_half",
           "padded_size_bound", "pad_for_cp"]


def token_to_seq(cu_seqlens: torch.Tensor, num_tokens: int) -> torch.Tensor:
    """Sequence index of every token row, by binary search on ``cu_seqlens`` (no sync).

    Parameters
    ----------
    cu_seqlens : int32 ``[b+1]``, non-decreasing.
    num_tokens : host int, the number of rows.

    Returns
    -------
    int64 ``[num_tokens]``: ``i`` for rows in ``[cu[i], cu[i+1])`` (empty sequences are never
    returned for a row inside ``[cu[0], cu[-1])``), ``b`` for rows ``>= cu[-1]`` (slack), ``0``
    for rows ``< cu[0]``.
    """
    check_cu("cu_seqlens", cu_seqlens, None)
    check_int("num_tokens", num_tokens)
    pos = torch.arange(num_tokens, device=cu_seqlens.device, dtype=torch.int64)
    return seq_of(cu_seqlens.long(), pos)


def local_cu_seqlens(cu_seqlens_padded: torch.Tensor, cp: int) -> torch.Tensor:
    """Rank-local ``cu_seqlens_padded`` (int32) of dual-chunk sharding: the global one // cp."""
    check_cu("cu_seqlens_padded", cu_seqlens_padded, None)
    check_cp_rank(cp)
    return torch.div(cu_seqlens_padded, cp, rounding_mode="floor").to(torch.int32)


@torch_path("partitioned_indices")
def _torch_partitioned_indices(cu_seqlens_padded, cp, rank, total_tokens):
    local_rows = total_tokens // cp
    rows = torch.arange(local_rows, device=cu_seqlens_padded.device, dtype=torch.int64)
    return local_to_global(cu_seqlens_padded.long(), cp, rank, local_rows, rows)


def partitioned_indices(cu_seqlens_padded: torch.Tensor, cp: int, rank: int, total_tokens: int,
                        *, validate: Optional[bool] = None, backend: str = "auto") -> torch.Tensor:
    """Global token rows held by ``rank`` under dual-chunk sharding, in rank-local order.

    Parameters
    ----------
    cu_seqlens_padded : int32 ``[b+1]``, **global**, starting at 0, every length a multiple of
        ``2*cp``.
    cp, rank : host ints, ``0 <= rank < cp``.
    total_tokens : host int, rows of the global tensor (``>= cu_seqlens_padded[-1]``, a multiple
        of ``cp``). Rows past ``cu_seqlens_padded[-1]`` (slack) are dealt to the ranks in
        contiguous blocks of ``total_tokens/cp - cu_seqlens_padded[-1]/cp``.

    Returns
    -------
    int64 ``[total_tokens // cp]``: local row ``l`` of ``rank`` is global row ``idx[l]``.
    """
    check_cu("cu_seqlens_padded", cu_seqlens_padded, None)
    check_cp_rank(cp, rank)
    check_int("total_tokens", total_tokens)
    if total_tokens % cp:
        raise ValueError(f"total_tokens ({total_tokens}) must be a multiple of cp ({cp})")
    if check_values(validate, cu_seqlens_padded):
        validate_cu_values("cu_seqlens_padded", cu_seqlens_padded, total_tokens, 2 * cp,
                            f" (2*cp = {2 * cp}, dual-chunk sharding)", zero_start=True)
    fn = impl("partitioned_indices", cu_seqlens_padded, backend)
    return fn(cu_seqlens_padded, cp, rank, total_tokens)


@torch_path("partition")
def _torch_partition(x, cu_seqlens_padded, cp, rank, dim):
    idx = _torch_partitioned_indices(cu_seqlens_padded, cp, rank, x.shape[dim])
    return x.index_select(dim, idx)


def partition(x: torch.Tensor, cu_seqlens_padded: torch.Tensor, cp: int, rank: int, *,
              dim: int = 0, validate: Optional[bool] = None,
              backend: str = "auto") -> torch.Tensor:
    """Global THD tensor -> the shard of ``rank`` (dual-chunk sharding).

    ``x`` has ``T`` rows along ``dim`` (``T % cp == 0``, ``T >= cu_seqlens_padded[-1]``; see
    :func:`partitioned_indices` for slack rows); ``cu_seqlens_padded`` is the **global** one
    (lengths multiples of ``2*cp``). Returns a new contiguous tensor with ``T // cp`` rows along
    ``dim``: for every sequence, chunk ``rank`` then chunk ``2*cp-1-rank``. Its cu_seqlens is
    :func:`local_cu_seqlens`. Works for tokens ``[t, h, d]`` and, with ``dim=-1``, LSE ``[h, t]``.
    """
    check_tensor("x", x)
    check_cu("cu_seqlens_padded", cu_seqlens_padded, x.device)
    check_cp_rank(cp, rank)
    dim = norm_dim("x", x, dim)
    if x.shape[dim] % cp:
        raise ValueError(f"x has {x.shape[dim]} tokens along dim {dim}, not a multiple of "
                         f"cp ({cp})")
    if check_values(validate, cu_seqlens_padded):
        validate_cu_values("cu_seqlens_padded", cu_seqlens_padded, x.shape[dim], 2 * cp,
                            f" (2*cp = {2 * cp}, dual-chunk sharding)", zero_start=True,
                            total_name="x")
    return impl("partition", x, backend)(x, cu_seqlens_padded, cp, rank, dim)


@torch_path("reorder_to_contiguous")
def _torch_reorder_to_contiguous(x_gathered, cu_seqlens_padded, cp, dim):
    total = x_gathered.shape[dim]
    rows = torch.arange(total, device=x_gathered.device, dtype=torch.int64)
    idx = global_to_gathered(cu_seqlens_padded.long(), cp, total // cp, rows)
    return x_gathered.index_select(dim, idx)


@torch_path("reorder_to_rank_sharded")
def _torch_reorder_to_rank_sharded(x, cu_seqlens_padded, cp, dim):
    total = x.shape[dim]
    local_rows = total // cp
    q = torch.arange(total, device=x.device, dtype=torch.int64)
    rank = torch.div(q, max(local_rows, 1), rounding_mode="floor")
    idx = local_to_global(cu_seqlens_padded.long(), cp, rank, local_rows, q - rank * local_rows)
    return x.index_select(dim, idx)


def _check_reorder(name, x, cu_seqlens_padded, cp, dim, validate):
    check_tensor(name, x)
    check_cu("cu_seqlens_padded", cu_seqlens_padded, x.device)
    check_cp_rank(cp)
    dim = norm_dim(name, x, dim)
    if x.shape[dim] % cp:
        raise ValueError(f"{name} has {x.shape[dim]} tokens along dim {dim}, not a multiple of "
                         f"cp ({cp})")
    if validate_mode(validate):
        validate_cu_values("cu_seqlens_padded", cu_seqlens_padded, x.shape[dim], 2 * cp,
                            f" (2*cp = {2 * cp}, dual-chunk sharding)", zero_start=True,
                            total_name=name)
    return dim


def reorder_to_contiguous(x_gathered: torch.Tensor, cu_seqlens_padded: torch.Tensor, cp: int, *,
                          dim: int = 0, validate: Optional[bool] = None,
                          backend: str = "auto") -> torch.Tensor:
    """All-gathered rank shards -> per-sequence contiguous (global) order.

    ``x_gathered``: the ``cp`` rank-local tensors concatenated along ``dim`` in rank order (what
    ``all_gather_into_tensor`` produces), ``cp * T_loc`` rows. ``cu_seqlens_padded``: the
    **global** one. Returns the global THD tensor (same shape): the exact inverse of
    ``torch.cat([partition(x, cu, cp, r) for r in range(cp)])``, slack rows included.
    """
    dim = _check_reorder("x_gathered", x_gathered, cu_seqlens_padded, cp, dim, validate)
    fn = impl("reorder_to_contiguous", x_gathered, backend)
    return fn(x_gathered, cu_seqlens_padded, cp, dim)


def reorder_to_rank_sharded(x: torch.Tensor, cu_seqlens_padded: torch.Tensor, cp: int, *,
                            dim: int = 0, validate: Optional[bool] = None,
                            backend: str = "auto") -> torch.Tensor:
    """Global THD order -> rank shards concatenated in rank order (inverse of
    :func:`reorder_to_contiguous`); e.g. dK/dV before a reduce-scatter in the backward pass.
    Equals ``torch.cat([partition(x, cu, cp, r) for r in range(cp)], dim)``."""
    dim = _check_reorder("x", x, cu_seqlens_padded, cp, dim, validate)
    return impl("reorder_to_rank_sharded", x, backend)(x, cu_seqlens_padded, cp, dim)


@torch_path("copy_valid_tokens")
def _torch_copy_valid_tokens(dst, src, cu_seqlens, cu_seqlens_dst_padded, cu_seqlens_src_padded,
                             dim, fill):
    valid, rows = copy_rows(dst.shape[dim], src.shape[dim], cu_seqlens, cu_seqlens_dst_padded,
                             cu_seqlens_src_padded, dst.device)
    mask = bcast(valid, dst.dim(), dim)
    keep = dst if fill is None else torch.full_like(dst, fill)
    if src.shape[dim] == 0:
        new = keep
    else:
        new = torch.where(mask, src.index_select(dim, rows).to(dst.dtype), keep)
    dst.copy_(new)
    return dst


def copy_valid_tokens(dst: torch.Tensor, src: torch.Tensor, cu_seqlens: torch.Tensor,
                      cu_seqlens_dst_padded: Optional[torch.Tensor] = None,
                      cu_seqlens_src_padded: Optional[torch.Tensor] = None, *, dim: int = 0,
                      fill: Optional[float] = None, validate: Optional[bool] = None,
                      backend: str = "auto") -> torch.Tensor:
    """Copy the valid tokens of every sequence from ``src`` into ``dst`` (in place).

    Sequence ``i`` has ``n_i = cu_seqlens[i+1] - cu_seqlens[i]`` valid tokens, read from rows
    ``[src_p[i], src_p[i] + n_i)`` and written to ``[dst_p[i], dst_p[i] + n_i)``, where
    ``src_p``/``dst_p`` are ``cu_seqlens_{src,dst}_padded`` (default: ``cu_seqlens``, i.e. the
    packed layout). Other rows of ``dst`` (padding, slack) keep their value, or get ``fill``
    (e.g. ``0.0`` for outputs, ``float('-inf')`` for LSE) when given. ``src`` may have another
    dtype (converted) and any strides; ``dim`` is the token dim (``-1`` for LSE ``[h, t]``); all
    other dims must match. Returns ``dst``.
    """
    check_tensor("dst", dst)
    check_tensor("src", src)
    check_writable("dst", dst)
    dim = norm_dim("dst", dst, dim)
    if src.dim() != dst.dim() or any(src.shape[i] != dst.shape[i]
                                     for i in range(dst.dim()) if i != dim):
        raise ValueError(f"src {tuple(src.shape)} and dst {tuple(dst.shape)} must match in every "
                         f"dim but the token dim {dim}")
    if src.device != dst.device:
        raise ValueError(f"src and dst must be on one device, got {src.device} and {dst.device}")
    check_cu("cu_seqlens", cu_seqlens, dst.device)
    for name, cp_ in (("cu_seqlens_dst_padded", cu_seqlens_dst_padded),
                      ("cu_seqlens_src_padded", cu_seqlens_src_padded)):
        if cp_ is not None:
            check_cu(name, cp_, dst.device)
            check_same_b(name, cp_, "cu_seqlens", cu_seqlens)
    if fill is not None and not isinstance(fill, (int, float)):
        raise ValueError(f"fill must be None or a number, got {fill!r}")
    if validate_mode(validate):
        validate_cu_values("cu_seqlens", cu_seqlens)
        for name, pad, t, tname in (("cu_seqlens_src_padded", cu_seqlens_src_padded, src, "src"),
                                    ("cu_seqlens_dst_padded", cu_seqlens_dst_padded, dst, "dst")):
            if pad is None:  # packed layout on this side
                validate_cu_values("cu_seqlens", cu_seqlens, t.shape[dim], total_name=tname)
            else:
                validate_cu_values(name, pad, t.shape[dim], total_name=tname)
                validate_valid_in_padded("cu_seqlens", cu_seqlens, name, pad)
    fn = impl("copy_valid_tokens", dst, backend)
    return fn(dst, src, cu_seqlens, cu_seqlens_dst_padded, cu_seqlens_src_padded, dim, fill)


@torch_path("read_half")
def _torch_read_half(x, cu_seqlens_padded, half, dim):
    idx = half_index(cu_seqlens_padded.long(), x.shape[dim], half)
    return x.index_select(dim, idx)


def read_half(x: torch.Tensor, cu_seqlens_padded: torch.Tensor, half: Union[str, int], *,
              dim: int = 0, validate: Optional[bool] = None,
              backend: str = "auto") -> torch.Tensor:
    """First or second half of every (rank-local) sequence.

    ``x``: rank-local tensor with ``T_loc`` (even) rows along ``dim``; ``cu_seqlens_padded``:
    the **local** one (even lengths). ``half``: ``"first"`` (chunk ``rank``) or ``"second"``
    (chunk ``2*cp-1-rank``). Returns ``T_loc // 2`` rows along ``dim``; its cu_seqlens is
    ``cu_seqlens_padded // 2``. Tokens: ``read_half(q, cu, "second")``; LSE ``[h, t]``:
    ``read_half(lse, cu, "second", dim=-1)``.
    """
    check_tensor("x", x)
    check_cu("cu_seqlens_padded", cu_seqlens_padded, x.device)
    h = check_half(half)
    dim = norm_dim("x", x, dim)
    check_even("x", x.shape[dim], "read_half")
    if validate_mode(validate):
        validate_cu_values("cu_seqlens_padded", cu_seqlens_padded, x.shape[dim], 2,
                            " (a local sequence is two equal halves)", total_name="x")
    return impl("read_half", x, backend)(x, cu_seqlens_padded, h, dim)


def padded_size_bound(total_tokens: int, num_seqs: int, cp: int) -> int:
    """Host bound on the padded token count of :func:`pad_for_cp`: ``T + b*(2*cp-1)``, rounded up
    to a multiple of ``2*cp`` (so the result partitions into ``cp`` shards of even length)."""
    check_int("total_tokens", total_tokens)
    check_int("num_seqs", num_seqs)
    check_cp_rank(cp)
    n = total_tokens + num_seqs * (2 * cp - 1)
    return -(-n // (2 * cp)) * (2 * cp)


@torch_path("pad_for_cp")
def _torch_pad_for_cp(x, cu_seqlens, cp, total_padded):
    cu_p = padded_cu_seqlens(cu_seqlens, cp)
    out = x.new_zeros((total_padded,) + tuple(x.shape[1:]))
    valid, rows = copy_rows(total_padded, x.shape[0], cu_seqlens, cu_p, None, x.device)
    if x.shape[0]:
        out = torch.where(bcast(valid, x.dim(), 0), x.index_select(0, rows), out)
    return out, cu_p


def pad_for_cp(x: torch.Tensor, cu_seqlens: torch.Tensor, cp: int,
               total_padded: Union[int, str, None] = "bound", *,
               validate: Optional[bool] = None,
               backend: str = "auto") -> Tuple[torch.Tensor, torch.Tensor]:
    """Pad every sequence at its end to a multiple of ``2*cp`` tokens (zeros).

    Parameters
    ----------
    x : ``[t, ...]`` packed THD tensor, any strides.
    cu_seqlens : int32 ``[b+1]``.
    cp : host int >= 1.
    total_padded : rows of the result (a multiple of ``2*cp``):

        * ``"bound"`` (default, **no sync**): :func:`padded_size_bound` ``(t, b, cp)``; rows past
          ``cu_seqlens_padded[-1]`` are zero slack, carried harmlessly by every function here.
        * an int: the caller's own bound (must be ``>=`` the padded total; checked with
          ``validate=True``).
        * ``None``: the exact padded total. **This synchronises** (reads
          ``cu_seqlens`` on the host) and is not graph-capturable.

    Returns
    -------
    ``(x_padded, cu_seqlens_padded)``: ``x_padded [total_padded, ...]`` (zeros at padding and
    slack), ``cu_seqlens_padded`` int32 ``[b+1]`` starting at 0. The valid tokens of sequence
    ``i`` are ``[cu_seqlens_padded[i], cu_seqlens_padded[i] + n_i)``.
    """
    check_tensor("x", x)
    check_cu("cu_seqlens", cu_seqlens, x.device)
    check_cp_rank(cp)
    b = cu_seqlens.numel() - 1
    if total_padded == "bound":
        total_padded = padded_size_bound(x.shape[0], b, cp)
    elif total_padded is None:
        total_padded = int(padded_cu_seqlens(cu_seqlens, cp)[-1])  # host sync, documented
    elif isinstance(total_padded, str) or not is_int(total_padded) or total_padded < 0:
        raise ValueError(f"total_padded must be 'bound', None or an int >= 0, got {total_padded!r}")
    if total_padded % (2 * cp):
        raise ValueError(f"total_padded ({total_padded}) must be a multiple of 2*cp ({2 * cp})")
    if check_values(validate, cu_seqlens):
        validate_cu_values("cu_seqlens", cu_seqlens, x.shape[0], total_name="x")
        need = int(padded_cu_seqlens(cu_seqlens, cp)[-1])  # lengths are >= 0 (checked above)
        if need > total_padded:
            raise ValueError(f"total_padded={total_padded} is too small: the padded sequences "
                             f"need {need} tokens (see padded_size_bound)")
    return impl("pad_for_cp", x, backend)(x, cu_seqlens, cp, total_padded)
