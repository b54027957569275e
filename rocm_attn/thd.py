"""THD context-parallel helpers: partition, reorder, copy, read halves, merge, correct, chunk.

Every public function here validates its host-side arguments (types, dtypes, devices, ranks,
shapes, host ints), optionally validates the *values* of the device-side ``cu_seqlens``
(``validate=True``, which synchronises), and then calls an implementation with the same name
prefixed ``_torch_`` (vectorised torch: the CPU path and the oracle of the HIP kernels). A
compiled kernel with the same signature as the ``_torch_`` function can be slotted in with
:func:`register_kernel`; ``backend="auto"`` then picks it for tensors on a GPU.

Conventions
-----------
* THD: ``x [t, ...]`` (any trailing dims, e.g. ``[t, h, d]``; any strides). The token dim is
  dim 0 unless a function takes ``dim``. ``cu_seqlens*``: int32 ``[b + 1]`` on ``x``'s device.
* LSE: float32 ``[h, t]`` (token dim **last**). LSE functions take the token dim as the last dim.
* Dual-chunk ("load-balanced") sharding over ``cp`` ranks: the padded length ``L`` of every
  sequence is a multiple of ``2*cp``; the sequence is split into ``2*cp`` chunks of
  ``H = L / (2*cp)`` tokens; rank ``r`` holds chunk ``r`` followed by chunk ``2*cp-1-r`` (its
  *first* and *second half*). The rank-local THD tensor is that, for every sequence in order;
  its ``cu_seqlens_padded`` is the global one divided by ``cp`` (:func:`local_cu_seqlens`).
  Functions that map between global and rank-local layouts take the **global**
  ``cu_seqlens_padded`` (whose entries must all be multiples of ``2*cp``, starting at 0);
  functions working on one rank's tensors take the **local** one (even lengths).
* Slack: a tensor may have more rows than ``cu_seqlens[-1]`` (e.g. the host-known bound
  of :func:`pad_for_cp`). Slack rows are carried along as an extra "sequence" so that every
  layout change is a bijection (partition of all ranks + all-gather + reorder is the identity
  on every row); their contents are junk and never mix with sequence tokens.
* No host-device sync, no ``.item()``/``.tolist()``, no output size derived from device data:
  sizes come from tensor shapes and host ints. Everything is CUDA/HIP-graph capturable and
  traceable by ``torch.compile(fullgraph=True)``. Work scales with tokens (or with
  ``max_chunks`` for the chunk metadata), never with ``max_seqlen * num_seqs``; a token finds
  its sequence by binary search (:func:`token_to_seq`), so nothing caps the number of
  sequences.
* Device values are checked on request: ``validate=True`` (or env ``ROCM_ATTN_VALIDATE=1``)
  reads them on the host (on a GPU this synchronises) and raises ``ValueError`` naming the
  first bad sequence (or row). :func:`partition`, :func:`partitioned_indices`,
  :func:`chunkify`, :func:`pad_for_cp`, :func:`merge_rows_` and :func:`add_rows_` (and
  :func:`rocm_attn.shard_for_cp`) also check by default (``validate=None``) when their tensors
  are on the CPU, where the read costs no sync, except while torch.compile traces the call
  (``validate=False`` skips it). Unchecked, bad values give junk results but never an
  out-of-bounds access (every gather index is clamped into range).
"""

from __future__ import annotations

import logging
from typing import Callable, Dict, NamedTuple, Optional, Tuple, Union

import torch

from . import _ext, _logging
from .errors import validate_mode

__all__ = [
    "ChunkedStep",
    "register_kernel",
    "token_to_seq",
    "local_cu_seqlens",
    "partitioned_indices",
    "partition",
    "reorder_to_contiguous",
    "reorder_to_rank_sharded",
    "copy_valid_tokens",
    "read_half",
    "merge_partial",
    "lse_correction",
    "out_correction",
    "grad_correction",
    "merge_rows_",
    "add_rows_",
    "max_chunks_bound",
    "chunkify",
    "ring_step",
    "chunkify_diagonal",
    "chunkify_below",
    "chunkify_above",
    "chunkify_ring_step",
    "padded_size_bound",
    "pad_for_cp",
]

GRAD_OPS = ("none", "copy", "add")
_HALVES = {"first": 0, "second": 1, 0: 0, 1: 1}
# Stand-in chunk size for "no chunking": larger than any sequence, small enough that
# (chunk id + 1) * size stays far inside int64.
_NO_CHUNK = 1 << 40

# --------------------------------------------------------------------------
# kernel slots
# --------------------------------------------------------------------------

_KERNELS: Dict[str, Callable] = {}


def register_kernel(name: str, fn: Callable) -> None:
    """Slot a compiled implementation of ``name`` (e.g. ``"partition"``) behind the public API.

    ``fn`` must have exactly the signature and semantics of ``_torch_<name>`` in this module
    (arguments already validated). ``backend="auto"`` uses it for tensors on a GPU when the
    extension is loaded; ``backend="torch"`` bypasses it; ``backend="kernel"`` requires it.
    """
    if name not in _TORCH:
        raise ValueError(f"unknown thd function {name!r}; known: {sorted(_TORCH)}")
    _KERNELS[name] = fn


def _impl(name: str, t: torch.Tensor, backend: str) -> Callable:
    if backend not in ("auto", "kernel", "torch"):
        raise ValueError(f"backend must be 'auto', 'kernel' or 'torch', got {backend!r}")
    if backend != "torch":
        fn = _KERNELS.get(name)
        if fn is not None and _ext.kernels_usable(t):
            _logging.log_choice(_log, ("thd", name, "kernel"),
                                "rocm_attn.thd.%s: kernel (a call it cannot serve falls back to "
                                "the torch path, logged with the reason)", name)
            return fn
        if not t.is_cuda:
            why = f"tensors on {t.device}; the kernels run on CUDA and ROCm GPUs"
        else:
            why = _ext.extension_error() or "this build has no kernel for it"
        if backend == "kernel":
            raise ValueError(
                f"backend='kernel': no usable kernel for rocm_attn.thd.{name}: {why}. Use "
                "backend='auto' (falls back to the torch path) or backend='torch'."
            )
        _logging.log_choice(_log, ("thd", name, "torch", why), "rocm_attn.thd.%s: torch path (%s)",
                            name, why)
    return _TORCH[name]


# --------------------------------------------------------------------------
# host-side argument checks (no sync)
# --------------------------------------------------------------------------


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _check_int(name: str, v, lo: int = 0) -> int:
    if not _is_int(v) or v < lo:
        raise ValueError(f"{name} must be an int >= {lo}, got {v!r}")
    return int(v)


def _check_cp_rank(cp, rank=None, rank_name: str = "rank") -> None:
    _check_int("cp", cp, 1)
    if rank is not None and (not _is_int(rank) or not 0 <= rank < cp):
        raise ValueError(f"{rank_name} must be an int in [0, cp={cp}), got {rank!r}")


def _check_tensor(name: str, t, min_dim: int = 1, floating: bool = False) -> None:
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dim() < min_dim:
        raise ValueError(f"{name} must have at least {min_dim} dim(s), got shape {tuple(t.shape)}")
    if floating and not t.dtype.is_floating_point:
        raise ValueError(f"{name} must be floating point, got {t.dtype}")


def _check_cu(name: str, cu, device: Optional[torch.device]) -> None:
    if not isinstance(cu, torch.Tensor):
        raise ValueError(f"{name} must be an int32 torch.Tensor [b+1], got {type(cu).__name__}")
    if cu.dtype != torch.int32:
        raise ValueError(f"{name} must have dtype torch.int32, got {cu.dtype}")
    if cu.dim() != 1 or cu.numel() < 1:
        raise ValueError(f"{name} must be 1-D with b+1 >= 1 entries, got shape {tuple(cu.shape)}")
    if device is not None and cu.device != device:
        raise ValueError(f"{name} must be on {device} (the device of the data), got {cu.device}")


def _check_writable(name: str, t: torch.Tensor) -> None:
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


def _check_same_b(name: str, cu: torch.Tensor, ref_name: str, ref: torch.Tensor) -> None:
    if cu.numel() != ref.numel():
        raise ValueError(
            f"{name} must have b+1 = {ref.numel()} entries like {ref_name}, got {cu.numel()}"
        )


def _norm_dim(name: str, t: torch.Tensor, dim) -> int:
    if not _is_int(dim) or not -t.dim() <= dim < t.dim():
        raise ValueError(f"dim must be an int in [{-t.dim()}, {t.dim()}) for {name} "
                         f"of shape {tuple(t.shape)}, got {dim!r}")
    return dim % t.dim()


def _check_half(half) -> int:
    if half not in _HALVES or isinstance(half, bool):
        raise ValueError(f"half must be 'first' or 'second' (or 0 / 1), got {half!r}")
    return _HALVES[half]


def _check_even(name: str, n: int, what: str) -> None:
    if n % 2:
        raise ValueError(f"{name} has {n} tokens along its token dim; {what} needs an even count "
                         "(every local sequence is two equal halves)")


def _check_chunk_size(chunk_size, allow_none: bool) -> int:
    if chunk_size is None and allow_none:
        return _NO_CHUNK
    if not _is_int(chunk_size) or chunk_size <= 0:
        raise ValueError(f"chunk_size must be a positive int{' or None' if allow_none else ''}, "
                         f"got {chunk_size!r}")
    return int(chunk_size)


# --------------------------------------------------------------------------
# device-value checks (on GPU only with validate=True: there they synchronise)
# --------------------------------------------------------------------------


def _check_values(validate, *tensors: Optional[torch.Tensor]) -> bool:
    """Whether a function with value checks by default runs them: ``validate=True`` / "sync"
    (or env ``ROCM_ATTN_VALIDATE=1``), or ``validate=None`` with every tensor on the CPU, where
    reading values costs no device sync. Not while torch.compile traces a default call: a value
    read there is a data-dependent guard (graph break), so compiled code keeps the eager GPU
    contract (clamped indices, no check)."""
    if validate is None and not validate_mode(None):
        return (all(t is None or t.device.type == "cpu" for t in tensors)
                and not torch.compiler.is_compiling())
    return validate_mode(validate)


def _validate_row_index(name: str, rows: torch.Tensor, n: int, what: str) -> None:
    """Raise ValueError unless every entry of ``rows`` is in ``[0, n)``. Synchronises."""
    if rows.numel() == 0:
        return
    bad = (rows < 0) | (rows >= n)
    i = _first_bad(bad)
    if i >= 0:
        raise ValueError(f"{name}[{i}] = {int(rows[i])} is out of range: entries must be in "
                         f"[0, {n}) ({what} = {n})")


def _first_bad(mask: torch.Tensor) -> int:
    idx = torch.nonzero(mask.reshape(-1))
    return int(idx[0, 0]) if idx.numel() else -1


def _validate_cu_values(name: str, cu: torch.Tensor, total: Optional[int] = None,
                        divisor: int = 1, divisor_why: str = "", zero_start: bool = False,
                        total_name: str = "the tensor") -> None:
    """Raise ValueError on bad cu_seqlens values. Synchronises."""
    c = cu.long()
    if zero_start and int(c[0]) != 0:
        raise ValueError(f"{name}[0] must be 0, got {int(c[0])}")
    if int(c[0]) < 0:
        raise ValueError(f"{name}[0] must be >= 0, got {int(c[0])}")
    lens = c[1:] - c[:-1]
    i = _first_bad(lens < 0)
    if i >= 0:
        raise ValueError(f"{name} must be non-decreasing: sequence {i} has length {int(lens[i])} "
                         f"({name}[{i}]={int(c[i])}, {name}[{i + 1}]={int(c[i + 1])})")
    if divisor > 1:
        i = _first_bad(lens % divisor != 0)
        if i >= 0:
            raise ValueError(f"{name}: sequence {i} has length {int(lens[i])}, not divisible by "
                             f"{divisor}{divisor_why}")
        if int(c[0]) % divisor:
            raise ValueError(f"{name}[0]={int(c[0])} must be a multiple of {divisor}{divisor_why}")
    if total is not None and int(c[-1]) > total:
        raise ValueError(f"{name} ends at {int(c[-1])} but {total_name} has only {total} tokens")


def _validate_valid_in_padded(name: str, cu: torch.Tensor, pname: str, cu_p: torch.Tensor) -> None:
    lens = (cu[1:] - cu[:-1]).long()
    slots = (cu_p[1:] - cu_p[:-1]).long()
    i = _first_bad(lens > slots)
    if i >= 0:
        raise ValueError(f"sequence {i} has {int(lens[i])} valid tokens ({name}) but a padded slot "
                         f"of only {int(slots[i])} ({pname})")


# --------------------------------------------------------------------------
# index helpers (torch; int64 math; sync-free)
# --------------------------------------------------------------------------


def _seq_of(bounds: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """Sequence of every position: i with bounds[i] <= pos < bounds[i+1] (skipping empty ones).

    bounds: int64 [b+1]. Positions >= bounds[-1] give b; positions < bounds[1] give 0.
    """
    return torch.searchsorted(bounds[1:].contiguous(), pos, right=True)


def _lens_ext(bounds: torch.Tensor) -> torch.Tensor:
    """Lengths [b+1] with a trailing 0 so that index b (slack) is safe."""
    return torch.cat([bounds[1:] - bounds[:-1], bounds.new_zeros(1)])


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
    _check_cu("cu_seqlens", cu_seqlens, None)
    _check_int("num_tokens", num_tokens)
    pos = torch.arange(num_tokens, device=cu_seqlens.device, dtype=torch.int64)
    return _seq_of(cu_seqlens.long(), pos)


def local_cu_seqlens(cu_seqlens_padded: torch.Tensor, cp: int) -> torch.Tensor:
    """Rank-local ``cu_seqlens_padded`` (int32) of dual-chunk sharding: the global one // cp."""
    _check_cu("cu_seqlens_padded", cu_seqlens_padded, None)
    _check_cp_rank(cp)
    return torch.div(cu_seqlens_padded, cp, rounding_mode="floor").to(torch.int32)


def _local_to_global(cu_p: torch.Tensor, cp: int, rank, local_rows: int,
                     rows: torch.Tensor) -> torch.Tensor:
    """Global row of local row ``rows`` on ``rank`` (int or int64 tensor like rows).

    cu_p: global cu_seqlens_padded as int64 [b+1]. Global rows = cp * local_rows.
    """
    loc = torch.div(cu_p, cp, rounding_mode="floor")
    seq = _seq_of(loc, rows)
    lstart = loc[seq]
    half = torch.div(_lens_ext(loc)[seq], 2, rounding_mode="floor")
    lo = rows - lstart
    first = lo < half
    g = cu_p[seq] + torch.where(first, rank * half + lo, (2 * cp - 1 - rank) * half + lo - half)
    # slack rows: rank r owns global slack rows [end + r*slack_loc, end + (r+1)*slack_loc)
    loc_end = loc[-1]
    slack_loc = local_rows - loc_end
    gs = cu_p[-1] + rank * slack_loc + (rows - loc_end)
    g = torch.where(rows >= loc_end, gs, g)
    return g.clamp(0, max(cp * local_rows - 1, 0))


def _global_to_gathered(cu_p: torch.Tensor, cp: int, local_rows: int,
                        rows: torch.Tensor) -> torch.Tensor:
    """Row in the all-gathered tensor (rank shards concatenated) of global row ``rows``."""
    seq = _seq_of(cu_p, rows)
    start = cu_p[seq]
    h = torch.div(_lens_ext(cu_p)[seq], 2 * cp, rounding_mode="floor").clamp_min(1)
    o = rows - start
    k = torch.div(o, h, rounding_mode="floor")
    first = k < cp
    rank = torch.where(first, k, 2 * cp - 1 - k)
    lo = torch.where(first, o - k * h, h + o - k * h)
    src = rank * local_rows + torch.div(start, cp, rounding_mode="floor") + lo
    # slack
    end = cu_p[-1]
    loc_end = torch.div(end, cp, rounding_mode="floor")
    slack_loc = (local_rows - loc_end).clamp_min(1)
    e = rows - end
    er = torch.div(e, slack_loc, rounding_mode="floor")
    src_s = er * local_rows + loc_end + (e - er * slack_loc)
    src = torch.where(rows >= end, src_s, src)
    return src.clamp(0, max(cp * local_rows - 1, 0))


def _half_index(cu_loc: torch.Tensor, local_rows: int, half: int) -> torch.Tensor:
    """Rows of the local tensor holding half ``half`` (0 first, 1 second) of every sequence.

    cu_loc: local cu_seqlens_padded, int64 [b+1], even lengths. Returns int64 [local_rows // 2].
    """
    n = local_rows // 2
    k = torch.arange(n, device=cu_loc.device, dtype=torch.int64)
    hb = torch.div(cu_loc, 2, rounding_mode="floor")
    seq = _seq_of(hb, k)
    src = cu_loc[seq] + (k - hb[seq]) + half * torch.div(_lens_ext(cu_loc)[seq], 2,
                                                         rounding_mode="floor")
    end = cu_loc[-1]
    slack_src = end + (k - hb[-1]) + half * torch.div(local_rows - end, 2, rounding_mode="floor")
    src = torch.where(k >= hb[-1], slack_src, src)
    return src.clamp(0, max(local_rows - 1, 0))


def _bcast(v: torch.Tensor, ndim: int, dim: int) -> torch.Tensor:
    """View 1-D v so that it broadcasts along ``dim`` of an ndim tensor."""
    shape = [1] * ndim
    shape[dim] = -1
    return v.reshape(shape)


# --------------------------------------------------------------------------
# partition / reorder
# --------------------------------------------------------------------------


def _torch_partitioned_indices(cu_seqlens_padded, cp, rank, total_tokens):
    local_rows = total_tokens // cp
    rows = torch.arange(local_rows, device=cu_seqlens_padded.device, dtype=torch.int64)
    return _local_to_global(cu_seqlens_padded.long(), cp, rank, local_rows, rows)


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
    _check_cu("cu_seqlens_padded", cu_seqlens_padded, None)
    _check_cp_rank(cp, rank)
    _check_int("total_tokens", total_tokens)
    if total_tokens % cp:
        raise ValueError(f"total_tokens ({total_tokens}) must be a multiple of cp ({cp})")
    if _check_values(validate, cu_seqlens_padded):
        _validate_cu_values("cu_seqlens_padded", cu_seqlens_padded, total_tokens, 2 * cp,
                            f" (2*cp = {2 * cp}, dual-chunk sharding)", zero_start=True)
    fn = _impl("partitioned_indices", cu_seqlens_padded, backend)
    return fn(cu_seqlens_padded, cp, rank, total_tokens)


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
    _check_tensor("x", x)
    _check_cu("cu_seqlens_padded", cu_seqlens_padded, x.device)
    _check_cp_rank(cp, rank)
    dim = _norm_dim("x", x, dim)
    if x.shape[dim] % cp:
        raise ValueError(f"x has {x.shape[dim]} tokens along dim {dim}, not a multiple of "
                         f"cp ({cp})")
    if _check_values(validate, cu_seqlens_padded):
        _validate_cu_values("cu_seqlens_padded", cu_seqlens_padded, x.shape[dim], 2 * cp,
                            f" (2*cp = {2 * cp}, dual-chunk sharding)", zero_start=True,
                            total_name="x")
    return _impl("partition", x, backend)(x, cu_seqlens_padded, cp, rank, dim)


def _torch_reorder_to_contiguous(x_gathered, cu_seqlens_padded, cp, dim):
    total = x_gathered.shape[dim]
    rows = torch.arange(total, device=x_gathered.device, dtype=torch.int64)
    idx = _global_to_gathered(cu_seqlens_padded.long(), cp, total // cp, rows)
    return x_gathered.index_select(dim, idx)


def _torch_reorder_to_rank_sharded(x, cu_seqlens_padded, cp, dim):
    total = x.shape[dim]
    local_rows = total // cp
    q = torch.arange(total, device=x.device, dtype=torch.int64)
    rank = torch.div(q, max(local_rows, 1), rounding_mode="floor")
    idx = _local_to_global(cu_seqlens_padded.long(), cp, rank, local_rows, q - rank * local_rows)
    return x.index_select(dim, idx)


def _check_reorder(name, x, cu_seqlens_padded, cp, dim, validate):
    _check_tensor(name, x)
    _check_cu("cu_seqlens_padded", cu_seqlens_padded, x.device)
    _check_cp_rank(cp)
    dim = _norm_dim(name, x, dim)
    if x.shape[dim] % cp:
        raise ValueError(f"{name} has {x.shape[dim]} tokens along dim {dim}, not a multiple of "
                         f"cp ({cp})")
    if validate_mode(validate):
        _validate_cu_values("cu_seqlens_padded", cu_seqlens_padded, x.shape[dim], 2 * cp,
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
    fn = _impl("reorder_to_contiguous", x_gathered, backend)
    return fn(x_gathered, cu_seqlens_padded, cp, dim)


def reorder_to_rank_sharded(x: torch.Tensor, cu_seqlens_padded: torch.Tensor, cp: int, *,
                            dim: int = 0, validate: Optional[bool] = None,
                            backend: str = "auto") -> torch.Tensor:
    """Global THD order -> rank shards concatenated in rank order (inverse of
    :func:`reorder_to_contiguous`); e.g. dK/dV before a reduce-scatter in the backward pass.
    Equals ``torch.cat([partition(x, cu, cp, r) for r in range(cp)], dim)``."""
    dim = _check_reorder("x", x, cu_seqlens_padded, cp, dim, validate)
    return _impl("reorder_to_rank_sharded", x, backend)(x, cu_seqlens_padded, cp, dim)


# --------------------------------------------------------------------------
# copy valid tokens / read half
# --------------------------------------------------------------------------


def _copy_rows(dst_rows: int, src_rows: int, cu, cu_dst_p, cu_src_p, device):
    """For every dst row: (valid, src row). int64 math, clamped indices."""
    c = cu.long()
    dp = c if cu_dst_p is None else cu_dst_p.long()
    sp = c if cu_src_p is None else cu_src_p.long()
    d = torch.arange(dst_rows, device=device, dtype=torch.int64)
    seq = _seq_of(dp, d)
    off = d - dp[seq]
    n = _lens_ext(c)[seq]
    slot = _lens_ext(dp)[seq]
    valid = (off >= 0) & (off < torch.minimum(n, slot))
    src = (sp[seq] + off).clamp(0, max(src_rows - 1, 0))
    return valid, src


def _torch_copy_valid_tokens(dst, src, cu_seqlens, cu_seqlens_dst_padded, cu_seqlens_src_padded,
                             dim, fill):
    valid, rows = _copy_rows(dst.shape[dim], src.shape[dim], cu_seqlens, cu_seqlens_dst_padded,
                             cu_seqlens_src_padded, dst.device)
    mask = _bcast(valid, dst.dim(), dim)
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
    _check_tensor("dst", dst)
    _check_tensor("src", src)
    _check_writable("dst", dst)
    dim = _norm_dim("dst", dst, dim)
    if src.dim() != dst.dim() or any(src.shape[i] != dst.shape[i]
                                     for i in range(dst.dim()) if i != dim):
        raise ValueError(f"src {tuple(src.shape)} and dst {tuple(dst.shape)} must match in every "
                         f"dim but the token dim {dim}")
    if src.device != dst.device:
        raise ValueError(f"src and dst must be on one device, got {src.device} and {dst.device}")
    _check_cu("cu_seqlens", cu_seqlens, dst.device)
    for name, cp_ in (("cu_seqlens_dst_padded", cu_seqlens_dst_padded),
                      ("cu_seqlens_src_padded", cu_seqlens_src_padded)):
        if cp_ is not None:
            _check_cu(name, cp_, dst.device)
            _check_same_b(name, cp_, "cu_seqlens", cu_seqlens)
    if fill is not None and not isinstance(fill, (int, float)):
        raise ValueError(f"fill must be None or a number, got {fill!r}")
    if validate_mode(validate):
        _validate_cu_values("cu_seqlens", cu_seqlens)
        for name, pad, t, tname in (("cu_seqlens_src_padded", cu_seqlens_src_padded, src, "src"),
                                    ("cu_seqlens_dst_padded", cu_seqlens_dst_padded, dst, "dst")):
            if pad is None:  # packed layout on this side
                _validate_cu_values("cu_seqlens", cu_seqlens, t.shape[dim], total_name=tname)
            else:
                _validate_cu_values(name, pad, t.shape[dim], total_name=tname)
                _validate_valid_in_padded("cu_seqlens", cu_seqlens, name, pad)
    fn = _impl("copy_valid_tokens", dst, backend)
    return fn(dst, src, cu_seqlens, cu_seqlens_dst_padded, cu_seqlens_src_padded, dim, fill)


def _torch_read_half(x, cu_seqlens_padded, half, dim):
    idx = _half_index(cu_seqlens_padded.long(), x.shape[dim], half)
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
    _check_tensor("x", x)
    _check_cu("cu_seqlens_padded", cu_seqlens_padded, x.device)
    h = _check_half(half)
    dim = _norm_dim("x", x, dim)
    _check_even("x", x.shape[dim], "read_half")
    if validate_mode(validate):
        _validate_cu_values("cu_seqlens_padded", cu_seqlens_padded, x.shape[dim], 2,
                            " (a local sequence is two equal halves)", total_name="x")
    return _impl("read_half", x, backend)(x, cu_seqlens_padded, h, dim)


# --------------------------------------------------------------------------
# merge / LSE correction / out correction
# --------------------------------------------------------------------------


def _check_out_lse(out_name, out, lse_name, lse):
    _check_tensor(out_name, out, 1, floating=True)
    _check_tensor(lse_name, lse, 1)
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
        _check_tensor("lse", lse, 1)
        if lse.dtype not in (torch.float32, torch.float64):
            raise ValueError(f"lse must be float32 (or float64), got {lse.dtype}")
    if out_step is not None:
        _check_out_lse(step_name, out_step, lse_step_name, lse_step)
    else:
        _check_tensor(lse_step_name, lse_step, 1)
        if lse_step.dtype not in (torch.float32, torch.float64):
            raise ValueError(f"{lse_step_name} must be float32 (or float64), got {lse_step.dtype}")
    if lse_step.device != lse.device:
        raise ValueError(f"{lse_step_name} must be on {lse.device}, got {lse_step.device}")
    t = lse.shape[-1]
    if only_second_half:
        _check_even("lse", t, "only_second_half")
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
        _check_cu("cu_seqlens_padded", cu_seqlens_padded, lse.device)
    elif cu_seqlens_padded is not None:
        _check_cu("cu_seqlens_padded", cu_seqlens_padded, lse.device)


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


def _torch_merge_partial(out, lse, out_step, lse_step, cu_seqlens_padded, only_second_half,
                         inplace):
    if not only_second_half:
        o, l_ = _merge_math(out, lse, out_step, lse_step)
        return _write_back(out, o, inplace), _write_back(lse, l_, inplace)
    idx = _half_index(cu_seqlens_padded.long(), out.shape[0], 1)
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
        _validate_cu_values("cu_seqlens_padded", cu_seqlens_padded, lse.shape[-1], 2,
                            " (a local sequence is two equal halves)", total_name="out")
    fn = _impl("merge_partial", out, backend)
    return fn(out, lse, out_step, lse_step, cu_seqlens_padded, bool(only_second_half),
              bool(inplace))


def _torch_lse_correction(lse, lse_step, cu_seqlens_padded, only_second_half, inplace):
    if not only_second_half:
        _, l_ = _merge_math(None, lse, None, lse_step)
        return _write_back(lse, l_, inplace)
    idx = _half_index(cu_seqlens_padded.long(), lse.shape[-1], 1)
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
        _validate_cu_values("cu_seqlens_padded", cu_seqlens_padded, lse.shape[-1], 2,
                            " (a local sequence is two equal halves)", total_name="lse")
    fn = _impl("lse_correction", lse, backend)
    return fn(lse, lse_step, cu_seqlens_padded, bool(only_second_half), bool(inplace))


def _torch_out_correction(out, out_step, lse, lse_step, cu_seqlens_padded, only_second_half,
                          inplace):
    if not only_second_half:
        return _write_back(out, _correction_math(out, out_step, lse, lse_step), inplace)
    idx = _half_index(cu_seqlens_padded.long(), out.shape[0], 1)
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
        _validate_cu_values("cu_seqlens_padded", cu_seqlens_padded, lse.shape[-1], 2,
                            " (a local sequence is two equal halves)", total_name="out")
    fn = _impl("out_correction", out, backend)
    return fn(out, out_step, lse, lse_step, cu_seqlens_padded, bool(only_second_half),
              bool(inplace))


# --------------------------------------------------------------------------
# gradient correction
# --------------------------------------------------------------------------


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
        idx = _half_index(cu, t, h)
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
    _check_tensor("grad", grad, 1, floating=True)
    _check_tensor("grad_step", grad_step, 1, floating=True)
    for name, op in (("first_half_op", first_half_op), ("second_half_op", second_half_op)):
        if op not in GRAD_OPS:
            raise ValueError(f"{name} must be one of {GRAD_OPS}, got {op!r}")
    if grad_step.device != grad.device:
        raise ValueError(f"grad_step must be on {grad.device}, got {grad_step.device}")
    _check_cu("cu_seqlens_padded", cu_seqlens_padded, grad.device)
    t = grad.shape[0]
    _check_even("grad", t, "grad_correction")
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
        _validate_cu_values("cu_seqlens_padded", cu_seqlens_padded, t, 2,
                            " (a local sequence is two equal halves)", total_name="grad")
    fn = _impl("grad_correction", grad, backend)
    return fn(grad, grad_step, cu_seqlens_padded, first_half_op, second_half_op, bool(inplace))


# --------------------------------------------------------------------------
# chunked-attention metadata
# --------------------------------------------------------------------------


def max_chunks_bound(total_tokens: int, num_seqs: int, chunk_size: Optional[int],
                     dual_chunk: bool = False) -> int:
    """Host upper bound on the number of sub-sequences, for ``max_chunks``.

    * ``dual_chunk=False`` (:func:`chunkify`): ``min(T, T // chunk_size + b)`` for ``b``
      sequences totalling ``T`` tokens (``sum ceil(n_i/c) <= sum (n_i//c + 1)``).
    * ``dual_chunk=True`` (:func:`chunkify_diagonal` / ``_below`` / ``_above``, ``T`` = rank-
      local tokens): each half of ``H`` tokens at any global offset touches at most
      ``H // chunk_size + 2`` chunks, so ``min(T, T // chunk_size + 4*b)``.

    ``chunk_size=None`` (no chunking): ``min(T, b)``.
    """
    _check_int("total_tokens", total_tokens)
    _check_int("num_seqs", num_seqs)
    if chunk_size is None:
        return min(total_tokens, num_seqs)
    cs = _check_chunk_size(chunk_size, False)
    return min(total_tokens, total_tokens // cs + (4 if dual_chunk else 1) * num_seqs)


def _torch_chunkify(cu_seqlens, chunk_size, max_chunks):
    c = cu_seqlens.long()
    lens = (c[1:] - c[:-1]).clamp_min(0)
    n = torch.div(lens + (chunk_size - 1), chunk_size, rounding_mode="floor")
    incl = torch.cumsum(n, 0)
    total = n.sum().reshape(1)
    excl_ext = torch.cat([incl - n, total])
    j = torch.arange(max_chunks + 1, device=c.device, dtype=torch.int64)
    seq = _seq_of(torch.cat([c.new_zeros(1), incl]), j)
    m = j - excl_ext[seq]
    b = c.numel() - 1
    start = c[seq] + torch.where(seq == b, torch.zeros_like(m), m * chunk_size)
    end = torch.cat([c[1:], c[-1:]])[seq]
    return torch.minimum(start, end).to(torch.int32)


def chunkify(cu_seqlens: torch.Tensor, chunk_size: int, max_chunks: int, *,
             validate: Optional[bool] = None, backend: str = "auto") -> torch.Tensor:
    """Split every sequence into chunks of ``chunk_size`` tokens (the last one shorter).

    Chunks are aligned to the start of each sequence (the chunked-attention convention of
    :func:`rocm_attn.reference.attention_mask`), so causal chunked attention over the original
    sequences equals causal attention over the returned sub-sequences.

    Parameters
    ----------
    cu_seqlens : int32 ``[b+1]``.
    chunk_size : host int > 0.
    max_chunks : host int >= the true number of chunks (``sum ceil(n_i / chunk_size)``), e.g.
        :func:`max_chunks_bound`. Too small a value drops the trailing chunks (checked only with
        ``validate=True``).

    Returns
    -------
    int32 ``[max_chunks + 1]``: the new cu_seqlens. Empty sequences give no chunk; entries past
    the last chunk repeat ``cu_seqlens[-1]`` (zero-length sub-sequences).
    """
    _check_cu("cu_seqlens", cu_seqlens, None)
    cs = _check_chunk_size(chunk_size, False)
    max_chunks = _check_int("max_chunks", max_chunks)
    if _check_values(validate, cu_seqlens):
        _validate_cu_values("cu_seqlens", cu_seqlens)
        lens = (cu_seqlens[1:] - cu_seqlens[:-1]).long()
        need = int(torch.div(lens + cs - 1, cs, rounding_mode="floor").sum())
        if need > max_chunks:
            raise ValueError(f"max_chunks={max_chunks} is too small: the sequences split into "
                             f"{need} chunks of {cs} (see max_chunks_bound)")
    return _impl("chunkify", cu_seqlens, backend)(cu_seqlens, cs, max_chunks)


class ChunkedStep(NamedTuple):
    """Varlen metadata of one ring step: run attention over ``max_chunks`` sub-sequences.

    Sub-sequence ``j`` has ``cu_seqlens_q[j+1]-cu_seqlens_q[j]`` queries starting at row
    ``cu_seqlens_q_padded[j]`` of the step's q tensor, and ``cu_seqlens_kv[j+1]-
    cu_seqlens_kv[j]`` keys starting at row ``cu_seqlens_kv_padded[j]`` of the step's kv
    tensor; all four are int32 ``[max_chunks + 1]`` (``*_padded`` in the sense of
    ``cu_seqlens_*_padded`` of :func:`rocm_attn.reference.reference_attention`: non-decreasing
    starts, ``start[j] + len[j] <= start[j+1]``). ``attn_mask_type`` is the mask inside every
    sub-sequence (bottom-right aligned). ``q_layout`` / ``kv_layout`` name the tensors the rows
    refer to: ``"full"`` (the rank-local tensor), ``"second_half"`` / ``"first_half"`` (the
    output of :func:`read_half`).
    """

    cu_seqlens_q: torch.Tensor
    cu_seqlens_kv: torch.Tensor
    cu_seqlens_q_padded: torch.Tensor
    cu_seqlens_kv_padded: torch.Tensor
    attn_mask_type: str
    q_layout: str
    kv_layout: str


def _torch_chunkify_cp_step(cu_seqlens_padded, chunk_size, cp, rank, kv_rank, max_chunks, kind,
                            kv_layout):
    cs = chunk_size
    lp = cu_seqlens_padded.long()
    b = lp.numel() - 1
    dev = lp.device

    def ext(v):  # per-sequence [b] -> [b+1] with a dummy 0 for trailing slots (seq == b)
        return torch.cat([v, v.new_zeros(1)])

    H = torch.div(lp[1:] - lp[:-1], 2, rounding_mode="floor").clamp_min(0)  # [b]
    zero = torch.zeros_like(H)
    # participating halves (global start, length) of q and kv, laid out A then B in memory
    qa_g, qb_g = rank * H, (2 * cp - 1 - rank) * H
    ka_g, kb_g = kv_rank * H, (2 * cp - 1 - kv_rank) * H
    if kind == "diagonal":
        qa_n, qb_n, ka_n, kb_n = H, H, H, H
    elif kind == "below":  # kv: chunk kv_rank only
        qa_n, qb_n, ka_n, kb_n = H, H, H, zero
    else:  # above: q's second half only (the q tensor is read_half(q, "second"))
        qa_n, qb_n, ka_n, kb_n = zero, H, H, H
    half_base = torch.div(lp, 2, rounding_mode="floor")
    q_base = half_base if kind == "above" else lp  # [b+1]: base of each seq, then the end
    kv_base = half_base if (kind == "below" and kv_layout == "half") else lp

    # runs of a sequence: the distinct chunk ids of its q tokens (monotone in local order)
    def span(g, n):
        lo = torch.div(g, cs, rounding_mode="floor")
        hi = torch.div(g + n - 1, cs, rounding_mode="floor")
        return lo, hi, torch.where(n > 0, hi - lo + 1, zero)

    lo_a, hi_a, cnt_a = span(qa_g, qa_n)
    lo_b, _, cnt_b = span(qb_g, qb_n)
    merged = ((qa_n > 0) & (qb_n > 0) & (hi_a == lo_b)).long()
    runs = cnt_a + cnt_b - merged
    incl = torch.cumsum(runs, 0)
    first_run = ext(incl - runs)
    j = torch.arange(max_chunks, device=dev, dtype=torch.int64)
    s = _seq_of(torch.cat([lp.new_zeros(1), incl]), j)  # sequence of slot j; b when trailing
    live = s < b
    lo_a, cnt_a, lo_b, merged = ext(lo_a), ext(cnt_a), ext(lo_b), ext(merged)
    qa_g, qb_g, ka_g, kb_g = ext(qa_g), ext(qb_g), ext(ka_g), ext(kb_g)
    qa_n, qb_n, ka_n, kb_n = ext(qa_n), ext(qb_n), ext(ka_n), ext(kb_n)
    m = j - first_run[s]
    c = torch.where(m < cnt_a[s], lo_a[s] + m, lo_b[s] + (m - cnt_a[s]) + merged[s])

    def count(c_, ga, na, gb, nb):  # tokens of the two halves with chunk id < c_
        t = c_ * cs
        return ((t - ga[s]).clamp(min=0).minimum(na[s])
                + (t - gb[s]).clamp(min=0).minimum(nb[s]))

    q0 = count(c, qa_g, qa_n, qb_g, qb_n)
    q1 = count(c + 1, qa_g, qa_n, qb_g, qb_n)
    k0 = count(c, ka_g, ka_n, kb_g, kb_n)
    k1 = count(c + 1, ka_g, ka_n, kb_g, kb_n)
    zl = torch.zeros_like(j)
    q_len = torch.where(live, q1 - q0, zl)
    kv_len = torch.where(live, k1 - k0, zl)
    q_start = torch.where(live, q_base[s] + q0, q_base[-1].expand_as(j))
    kv_start = torch.where(live, kv_base[s] + k0, kv_base[-1].expand_as(j))
    z1 = lp.new_zeros(1)
    cu_q = torch.cat([z1, torch.cumsum(q_len, 0)]).to(torch.int32)
    cu_kv = torch.cat([z1, torch.cumsum(kv_len, 0)]).to(torch.int32)
    cu_q_p = torch.cat([q_start, q_base[-1:]]).to(torch.int32)
    cu_kv_p = torch.cat([kv_start, kv_base[-1:]]).to(torch.int32)
    return cu_q, cu_kv, cu_q_p, cu_kv_p


_STEP_MASK = {  # mask inside every sub-sequence of a step kind
    "diagonal": "causal",
    "below": "no_mask",
    "above": "no_mask",
}


def _chunkify_cp_step(cu_seqlens_padded, chunk_size, cp, rank, kv_rank, max_chunks, kind,
                      kv_layout, validate, backend) -> ChunkedStep:
    _check_cu("cu_seqlens_padded", cu_seqlens_padded, None)
    cs = _check_chunk_size(chunk_size, True)
    _check_cp_rank(cp, rank)
    _check_cp_rank(cp, kv_rank, "kv_rank")
    max_chunks = _check_int("max_chunks", max_chunks)
    if kind == "diagonal" and kv_rank != rank:
        raise ValueError(f"the diagonal step has kv_rank == rank, got rank={rank}, "
                         f"kv_rank={kv_rank}")
    if kind == "below" and not kv_rank < rank:
        raise ValueError(f"a below step needs kv_rank < rank, got rank={rank}, kv_rank={kv_rank}")
    if kind == "above" and not kv_rank > rank:
        raise ValueError(f"an above step needs kv_rank > rank, got rank={rank}, kv_rank={kv_rank}")
    if kv_layout not in ("half", "full"):
        raise ValueError(f"kv_layout must be 'half' or 'full', got {kv_layout!r}")
    out = _impl("chunkify_cp_step", cu_seqlens_padded, backend)(
        cu_seqlens_padded, cs, cp, rank, kv_rank, max_chunks, kind, kv_layout)
    if validate_mode(validate):
        _validate_cu_values("cu_seqlens_padded", cu_seqlens_padded, None, 2,
                            " (a local sequence is two equal halves)")
        # recompute with room for every run to count them
        lp = cu_seqlens_padded.long()
        local = int(lp[-1] - lp[0])
        bound = max_chunks_bound(local, lp.numel() - 1, chunk_size, dual_chunk=True)
        full = _torch_chunkify_cp_step(cu_seqlens_padded, cs, cp, rank, kv_rank, bound, kind,
                                       kv_layout)
        need = int((full[0][1:] > full[0][:-1]).sum())
        if need > max_chunks:
            raise ValueError(f"max_chunks={max_chunks} is too small: this {kind} step has {need} "
                             "sub-sequences (see max_chunks_bound(..., dual_chunk=True))")
    q_layout = "second_half" if kind == "above" else "full"
    kv_lay = "first_half" if (kind == "below" and kv_layout == "half") else "full"
    return ChunkedStep(*out, _STEP_MASK[kind], q_layout, kv_lay)


_DUAL_DOC = """
    Dual-chunk sharding over ``cp`` ranks; ``cu_seqlens_padded`` is the **rank-local** one
    (every local sequence has two halves of ``H`` tokens: global chunks ``rank`` and
    ``2*cp-1-rank`` of that sequence). Chunks of ``chunk_size`` tokens are aligned to the start
    of each *global* sequence (``chunk_size=None``: no chunking, one chunk per sequence). The
    mask being reproduced is ``attention_mask(L, L, "causal", chunk_size=chunk_size)`` of every
    global sequence, restricted to the q tokens of ``rank`` and the kv tokens of ``kv_rank``.
    Padding tokens (at the end of a global sequence) are treated as tokens: under a causal mask
    no valid query sees them, so valid rows are exact.

    Every q token of the step's q tensor belongs to exactly one sub-sequence (its run of equal
    chunk id, in local order), so ``cu_seqlens_q_padded == cu_seqlens_q`` when
    ``cu_seqlens_padded[0] == 0``; a run with no allowed key gets ``kv`` length 0 (output 0,
    LSE ``-inf``). ``max_chunks``: host bound, see ``max_chunks_bound(T_loc, b, chunk_size,
    dual_chunk=True)``. Returns a :class:`ChunkedStep`.
"""


def chunkify_diagonal(cu_seqlens_padded: torch.Tensor, chunk_size: Optional[int], cp: int,
                      rank: int, max_chunks: int, *, validate: Optional[bool] = None,
                      backend: str = "auto") -> ChunkedStep:
    """Ring step 0 (kv from the same rank): q = kv = the full rank-local tensors.

    Sub-sequence = a maximal run of local tokens of one sequence with one chunk id (the run may
    span the end of the first half and the start of the second half, when one chunk covers
    the gap); q range == kv range, mask ``"causal"``. Within a run local order is global
    order, so causal on the run is exactly causal-within-chunk.
    """
    return _chunkify_cp_step(cu_seqlens_padded, chunk_size, cp, rank, rank, max_chunks,
                             "diagonal", "full", validate, backend)


def chunkify_below(cu_seqlens_padded: torch.Tensor, chunk_size: Optional[int], cp: int,
                   rank: int, kv_rank: int, max_chunks: int, kv_layout: str = "half", *,
                   validate: Optional[bool] = None, backend: str = "auto") -> ChunkedStep:
    """Ring step with ``kv_rank < rank``: q = the full local q, kv = first halves of kv_rank's kv.

    kv chunk ``kv_rank`` lies before both q chunks and kv chunk ``2*cp-1-kv_rank`` after both,
    so each q run (tokens with chunk id ``c``) sees exactly the first-half kv tokens with chunk
    id ``c``, with no mask (``"no_mask"``). ``kv_layout="half"``: kv rows index
    ``read_half(kv, cu, "first")`` (cu_seqlens ``cu // 2``); ``"full"``: the full local kv
    (no copy needed when the attention backend honours ``cu_seqlens_kv_padded``). The step
    output covers all local q tokens: merge with ``only_second_half=False``.
    """
    return _chunkify_cp_step(cu_seqlens_padded, chunk_size, cp, rank, kv_rank, max_chunks,
                             "below", kv_layout, validate, backend)


def chunkify_above(cu_seqlens_padded: torch.Tensor, chunk_size: Optional[int], cp: int,
                   rank: int, kv_rank: int, max_chunks: int, *,
                   validate: Optional[bool] = None, backend: str = "auto") -> ChunkedStep:
    """Ring step with ``kv_rank > rank``: q = second halves of q, kv = the full kv of kv_rank.

    q chunk ``rank`` sees nothing of ``kv_rank`` (both kv chunks lie after it); q chunk
    ``2*cp-1-rank`` lies after both kv chunks, so each of its runs (chunk id ``c``) sees every kv
    token with chunk id ``c`` (contiguous in local kv order), ``"no_mask"``. q rows index
    ``read_half(q, cu, "second")``; the output covers only second halves: merge it with
    ``merge_partial(..., only_second_half=True)`` and fold dQ with
    ``grad_correction(dq, dq_step, cu, "none", "add")``.
    """
    return _chunkify_cp_step(cu_seqlens_padded, chunk_size, cp, rank, kv_rank, max_chunks,
                             "above", "full", validate, backend)


for _f in (chunkify_diagonal, chunkify_below, chunkify_above):
    _f.__doc__ += _DUAL_DOC
del _f


def ring_step(rank: int, step: int, cp: int) -> Tuple[str, int]:
    """Kind and kv source of ring step ``step`` on ``rank``: kv comes from
    ``kv_rank = (rank - step) % cp``; kind ``"diagonal"`` (step 0), ``"below"``
    (``kv_rank < rank``, i.e. ``1 <= step <= rank``) or ``"above"`` (``kv_rank > rank``)."""
    _check_cp_rank(cp, rank)
    if not _is_int(step) or not 0 <= step < cp:
        raise ValueError(f"step must be an int in [0, cp={cp}), got {step!r}")
    kv_rank = (rank - step) % cp
    kind = "diagonal" if step == 0 else ("below" if kv_rank < rank else "above")
    return kind, kv_rank


def chunkify_ring_step(cu_seqlens_padded: torch.Tensor, chunk_size: Optional[int], cp: int,
                       rank: int, step: int, max_chunks: int, kv_layout: str = "half", *,
                       validate: Optional[bool] = None, backend: str = "auto") -> ChunkedStep:
    """:func:`chunkify_diagonal` / :func:`chunkify_below` / :func:`chunkify_above` for ring
    step ``step`` on ``rank`` (kind and kv rank from :func:`ring_step`). Over the ``cp`` steps
    the sub-sequences cover the causal (chunked) mask of ``rank``'s queries exactly once."""
    kind, kv_rank = ring_step(rank, step, cp)
    return _chunkify_cp_step(cu_seqlens_padded, chunk_size, cp, rank, kv_rank, max_chunks, kind,
                             kv_layout if kind == "below" else "full", validate, backend)


# --------------------------------------------------------------------------
# pad for CP
# --------------------------------------------------------------------------


def padded_size_bound(total_tokens: int, num_seqs: int, cp: int) -> int:
    """Host bound on the padded token count of :func:`pad_for_cp`: ``T + b*(2*cp-1)``, rounded up
    to a multiple of ``2*cp`` (so the result partitions into ``cp`` shards of even length)."""
    _check_int("total_tokens", total_tokens)
    _check_int("num_seqs", num_seqs)
    _check_cp_rank(cp)
    n = total_tokens + num_seqs * (2 * cp - 1)
    return -(-n // (2 * cp)) * (2 * cp)


def _torch_pad_for_cp(x, cu_seqlens, cp, total_padded):
    c = cu_seqlens.long()
    lens = (c[1:] - c[:-1]).clamp_min(0)
    plens = torch.div(lens + (2 * cp - 1), 2 * cp, rounding_mode="floor") * (2 * cp)
    cu_p = torch.cat([c.new_zeros(1), torch.cumsum(plens, 0)]).to(torch.int32)
    out = x.new_zeros((total_padded,) + tuple(x.shape[1:]))
    valid, rows = _copy_rows(total_padded, x.shape[0], cu_seqlens, cu_p, None, x.device)
    if x.shape[0]:
        out = torch.where(_bcast(valid, x.dim(), 0), x.index_select(0, rows), out)
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
    _check_tensor("x", x)
    _check_cu("cu_seqlens", cu_seqlens, x.device)
    _check_cp_rank(cp)
    b = cu_seqlens.numel() - 1
    if total_padded == "bound":
        total_padded = padded_size_bound(x.shape[0], b, cp)
    elif total_padded is None:
        lens = (cu_seqlens[1:] - cu_seqlens[:-1]).long().clamp_min(0)
        total_padded = int((torch.div(lens + 2 * cp - 1, 2 * cp, rounding_mode="floor")
                            * (2 * cp)).sum())  # host sync, documented
    elif isinstance(total_padded, str) or not _is_int(total_padded) or total_padded < 0:
        raise ValueError(f"total_padded must be 'bound', None or an int >= 0, got {total_padded!r}")
    if total_padded % (2 * cp):
        raise ValueError(f"total_padded ({total_padded}) must be a multiple of 2*cp ({2 * cp})")
    if _check_values(validate, cu_seqlens):
        _validate_cu_values("cu_seqlens", cu_seqlens, x.shape[0], total_name="x")
        lens = (cu_seqlens[1:] - cu_seqlens[:-1]).long()
        need = int((torch.div(lens + 2 * cp - 1, 2 * cp, rounding_mode="floor") * (2 * cp)).sum())
        if need > total_padded:
            raise ValueError(f"total_padded={total_padded} is too small: the padded sequences "
                             f"need {need} tokens (see padded_size_bound)")
    return _impl("pad_for_cp", x, backend)(x, cu_seqlens, cp, total_padded)


def _step_rows_of(step: torch.Tensor, dim: int, step_rows: Optional[torch.Tensor]
                  ) -> torch.Tensor:
    """The step rows entry ``k`` reads: row ``k``, or ``step_rows[k]`` clamped into ``step``."""
    if step_rows is None:
        return step
    return step.index_select(dim, step_rows.clamp(0, max(step.shape[dim] - 1, 0)))


def _clamp_rows(rows: torch.Tensor, n: int) -> torch.Tensor:
    """Row indices clamped into ``[0, n)``, as the kernels clamp them (unchecked calls)."""
    return rows.clamp(0, max(n - 1, 0))


def _torch_merge_rows_(out, lse, out_step, lse_step, rows, step_rows):
    rows = _clamp_rows(rows, min(out.shape[0], lse.shape[-1]))
    out_step = _step_rows_of(out_step, 0, step_rows)
    lse_step = _step_rows_of(lse_step, -1, step_rows)
    new_o, new_l = _merge_math(out.index_select(0, rows), lse.index_select(-1, rows), out_step,
                               lse_step)
    out.index_copy_(0, rows, new_o)
    lse.index_copy_(-1, rows, new_l)
    return out, lse


def _check_row_index(name: str, rows: torch.Tensor, n: Optional[int], what: str) -> None:
    if rows.dtype != torch.int64 or rows.dim() != 1 or (n is not None and rows.numel() != n):
        want = "int64 [n]" if n is None else f"int64 [n] with n = {what} = {n}"
        raise ValueError(f"{name} must be {want}, got {rows.dtype} {list(rows.shape)}")


def _check_row_maps(rows: torch.Tensor, step_rows: Optional[torch.Tensor], step_n: int,
                    step_what: str) -> None:
    """``rows`` names one row per step row (``step_n`` of them), or, with ``step_rows``, both
    are int64 ``[n]`` of one length (merge_rows_ / add_rows_)."""
    if step_rows is None:
        _check_row_index("rows", rows, step_n, step_what)
    else:
        _check_row_index("rows", rows, None, "")
        _check_row_index("step_rows", step_rows, rows.numel(), "rows.numel()")


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
    _check_row_maps(rows, step_rows, lse_step.shape[-1], "lse_step.shape[-1]")
    _check_writable("out", out)
    _check_writable("lse", lse)
    if _check_values(validate, rows, step_rows):
        _validate_row_index("rows", rows, min(out.shape[0], lse.shape[-1]),
                            "the rows of out and lse")
        if step_rows is not None:
            _validate_row_index("step_rows", step_rows,
                                min(out_step.shape[0], lse_step.shape[-1]),
                                "the rows of out_step and lse_step")
    return _impl("merge_rows_", lse, backend)(out, lse, out_step, lse_step, rows, step_rows)


def _torch_add_rows_(grad, step, rows, step_rows):
    rows = _clamp_rows(rows, grad.shape[0])
    step = _step_rows_of(step, 0, step_rows)
    grad.index_copy_(0, rows, (grad.index_select(0, rows).float() + step.float()).to(grad.dtype))
    return grad


def add_rows_(grad: torch.Tensor, step: torch.Tensor, rows: torch.Tensor,
              step_rows: Optional[torch.Tensor] = None, *, validate: Optional[bool] = None,
              backend: str = "auto"):
    """In place ``grad[rows[k]] += step[k]`` (``step[step_rows[k]]`` with ``step_rows``), in
    fp32 and rounded once to ``grad``'s dtype: the gradient counterpart of :func:`merge_rows_`
    (``grad [T, ...]``, ``step [n or any, ...]``, ``rows`` / ``step_rows`` int64 ``[n]``). A row
    named twice gets one of the two updates. Out-of-range entries: as in :func:`merge_rows_`."""
    _check_row_maps(rows, step_rows, step.shape[0], "step.shape[0]")
    if grad.shape[1:] != step.shape[1:]:
        raise ValueError(f"grad {list(grad.shape)} and step {list(step.shape)} differ after the "
                         "token dim")
    _check_writable("grad", grad)
    if _check_values(validate, rows, step_rows):
        _validate_row_index("rows", rows, grad.shape[0], "grad.shape[0]")
        if step_rows is not None:
            _validate_row_index("step_rows", step_rows, step.shape[0], "step.shape[0]")
    return _impl("add_rows_", grad, backend)(grad, step, rows, step_rows)


_TORCH: Dict[str, Callable] = {
    "partitioned_indices": _torch_partitioned_indices,
    "partition": _torch_partition,
    "reorder_to_contiguous": _torch_reorder_to_contiguous,
    "reorder_to_rank_sharded": _torch_reorder_to_rank_sharded,
    "copy_valid_tokens": _torch_copy_valid_tokens,
    "read_half": _torch_read_half,
    "merge_partial": _torch_merge_partial,
    "merge_rows_": _torch_merge_rows_,
    "add_rows_": _torch_add_rows_,
    "lse_correction": _torch_lse_correction,
    "out_correction": _torch_out_correction,
    "grad_correction": _torch_grad_correction,
    "chunkify": _torch_chunkify,
    "chunkify_cp_step": _torch_chunkify_cp_step,
    "pad_for_cp": _torch_pad_for_cp,
}


# --------------------------------------------------------------------------
# compiled kernels (hip_src/thd), slotted in with register_kernel
# --------------------------------------------------------------------------
#
# One row gather/scatter kernel serves partition, the two reorders, read_half,
# copy_valid_tokens and pad_for_cp (raw bytes: any 2/4/8-byte dtype); one merge kernel
# serves merge_partial, lse_correction and out_correction (fp32 math, bf16/fp16/fp32 rows,
# e.g. an fp32 accumulator with bf16 steps); one kernel serves grad_correction. Each
# ``_kernel_<name>`` has the signature and semantics of ``_torch_<name>``. A call the kernels
# do not serve (a layout whose dims do not merge into [outer, tokens, heads, contiguous
# elements], another dtype, mixed copy dtypes, fp64 math, inputs that require grad under
# autograd, an in-place call whose inputs share memory with its outputs) goes to the torch
# path through ``_fallback`` (logged at debug level). The checks below mirror the C++ ones of
# hip_src/torch_bindings.cpp so that those never fire.

_log = logging.getLogger("rocm_attn")

_KERNEL_COPY_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
_KERNEL_MATH_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
_GRAD_OP_CODES = {"none": 0, "copy": 1, "add": 2}
_I32_MAX = 2**31 - 1
_KERNEL_OPS = ("thd_gather", "thd_copy_valid_tokens_", "thd_merge", "thd_merge_",
               "thd_merge_rows_", "thd_add_rows_", "thd_out_correction_", "thd_grad_correction",
               "thd_grad_correction_")


def _fallback(name: str, why: str, *args):
    """Run the torch path for a call the kernels do not serve."""
    _logging.log_choice(_log, ("thd", name, "torch", why), "rocm_attn.thd.%s: torch path (%s)",
                        name, why)
    return _TORCH[name](*args)


def _collapse(t: torch.Tensor, begin: int, end: int):
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
        tails = [_collapse(t, s, nd) for t in ts]
        if all(c is not None and (c[0] == 1 or c[1] == 1) for c in tails):
            break
        s += 1
    elems = _collapse(ts[0], s, nd)[0]
    heads = [_collapse(t, begin, s) for t in ts]
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
        if _collapse(t, 0, dim) is None:
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
        c = _collapse(lt, 0, lt.dim() - 1)
        if c is None or c[0] > _I32_MAX:
            return f"{name}: the head dims do not merge into one"
    if out is not None:
        why = _math_dtype_problem(out=out, out_step=out_step)
        if why:
            return why
        nh = lse.dim() - 1
        for name, o in (("out", out), ("out_step", out_step)):
            tail = _collapse(o, 1 + nh, o.dim())
            if (_collapse(o, 1, 1 + nh) is None or tail is None
                    or not (tail[0] == 1 or tail[1] == 1) or tail[0] > _I32_MAX):
                return f"{name} is not [t, heads, contiguous elements]"
    return _autograd_problem(out, lse, out_step, lse_step)


def _cu(cu: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    return None if cu is None else cu.contiguous()


def _kernel_partition(x, cu_seqlens_padded, cp, rank, dim):
    why = _copy_problem((x,), dim)
    if why:
        return _fallback("partition", why, x, cu_seqlens_padded, cp, rank, dim)
    return torch.ops.rocm_attn.thd_gather(x, _cu(cu_seqlens_padded), 0, cp, rank, dim)


def _kernel_reorder_to_contiguous(x_gathered, cu_seqlens_padded, cp, dim):
    why = _copy_problem((x_gathered,), dim)
    if why:
        return _fallback("reorder_to_contiguous", why, x_gathered, cu_seqlens_padded, cp, dim)
    return torch.ops.rocm_attn.thd_gather(x_gathered, _cu(cu_seqlens_padded), 1, cp, 0, dim)


def _kernel_reorder_to_rank_sharded(x, cu_seqlens_padded, cp, dim):
    why = _copy_problem((x,), dim)
    if why:
        return _fallback("reorder_to_rank_sharded", why, x, cu_seqlens_padded, cp, dim)
    return torch.ops.rocm_attn.thd_gather(x, _cu(cu_seqlens_padded), 2, cp, 0, dim)


def _kernel_read_half(x, cu_seqlens_padded, half, dim):
    why = _copy_problem((x,), dim)
    if why:
        return _fallback("read_half", why, x, cu_seqlens_padded, half, dim)
    return torch.ops.rocm_attn.thd_gather(x, _cu(cu_seqlens_padded), 3, 1, half, dim)


def _fill_problem(fill, dtype) -> Optional[str]:
    if fill is None:
        return None
    f = float(fill)
    if f == f and abs(f) != float("inf") and abs(f) > torch.finfo(dtype).max:
        return f"fill {fill!r} overflows {dtype}"  # the torch path raises for it
    return None


def _kernel_copy_valid_tokens(dst, src, cu_seqlens, cu_seqlens_dst_padded, cu_seqlens_src_padded,
                              dim, fill):
    why = ("src and dst dtypes differ" if src.dtype != dst.dtype else None) \
        or _copy_problem((src, dst), dim) or _fill_problem(fill, dst.dtype) \
        or _overlap_problem(dst, src)
    if why:
        return _fallback("copy_valid_tokens", why, dst, src, cu_seqlens, cu_seqlens_dst_padded,
                         cu_seqlens_src_padded, dim, fill)
    torch.ops.rocm_attn.thd_copy_valid_tokens_(
        dst, src, _cu(cu_seqlens), _cu(cu_seqlens_dst_padded), _cu(cu_seqlens_src_padded), dim,
        None if fill is None else float(fill))
    return dst


def _kernel_pad_for_cp(x, cu_seqlens, cp, total_padded):
    why = _copy_problem((x,), 0)
    if why:
        return _fallback("pad_for_cp", why, x, cu_seqlens, cp, total_padded)
    c = cu_seqlens.long()
    lens = (c[1:] - c[:-1]).clamp_min(0)
    plens = torch.div(lens + (2 * cp - 1), 2 * cp, rounding_mode="floor") * (2 * cp)
    cu_p = torch.cat([c.new_zeros(1), torch.cumsum(plens, 0)]).to(torch.int32)
    out = x.new_empty((total_padded,) + tuple(x.shape[1:]))
    torch.ops.rocm_attn.thd_copy_valid_tokens_(out, x, _cu(cu_seqlens), cu_p, None, 0, 0.0)
    return out, cu_p


def _kernel_merge_partial(out, lse, out_step, lse_step, cu_seqlens_padded, only_second_half,
                          inplace):
    why = _merge_problem(out, lse, out_step, lse_step) or (
        _overlap_problem(out, lse, out_step, lse_step) if inplace else None)
    if why:
        return _fallback("merge_partial", why, out, lse, out_step, lse_step, cu_seqlens_padded,
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


def _kernel_merge_rows_(out, lse, out_step, lse_step, rows, step_rows):
    why = (_merge_problem(out, lse, out_step, lse_step)
           or _overlap_problem(out, lse, out_step, lse_step)
           or _row_maps_problem(lse.device, rows, step_rows))
    if why:
        return _fallback("merge_rows_", why, out, lse, out_step, lse_step, rows, step_rows)
    torch.ops.rocm_attn.thd_merge_rows_(out, lse, out_step, lse_step, rows.contiguous(),
                                        None if step_rows is None else step_rows.contiguous())
    return out, lse


def _kernel_add_rows_(grad, step, rows, step_rows):
    why = (_grad_problem(grad, step, "step") or _overlap_problem(grad, step)
           or _row_maps_problem(grad.device, rows, step_rows))
    if why:
        return _fallback("add_rows_", why, grad, step, rows, step_rows)
    torch.ops.rocm_attn.thd_add_rows_(grad, step, rows.contiguous(),
                                      None if step_rows is None else step_rows.contiguous())
    return grad


def _kernel_lse_correction(lse, lse_step, cu_seqlens_padded, only_second_half, inplace):
    why = _merge_problem(None, lse, None, lse_step) or (
        _overlap_problem(lse, lse_step) if inplace else None)
    if why:
        return _fallback("lse_correction", why, lse, lse_step, cu_seqlens_padded,
                         only_second_half, inplace)
    cu = _cu(cu_seqlens_padded) if only_second_half else None
    if inplace:
        torch.ops.rocm_attn.thd_merge_(None, lse, None, lse_step, cu, only_second_half)
        return lse
    return torch.ops.rocm_attn.thd_merge(None, lse, None, lse_step, cu, only_second_half,
                                         False)[1]


def _kernel_out_correction(out, out_step, lse, lse_step, cu_seqlens_padded, only_second_half,
                           inplace):
    why = _merge_problem(out, lse, out_step, lse_step) or (
        _overlap_problem(out, out_step, lse, lse_step) if inplace else None)
    if why:
        return _fallback("out_correction", why, out, out_step, lse, lse_step, cu_seqlens_padded,
                         only_second_half, inplace)
    cu = _cu(cu_seqlens_padded) if only_second_half else None
    if inplace:
        torch.ops.rocm_attn.thd_out_correction_(out, out_step, lse, lse_step, cu,
                                                only_second_half)
        return out
    return torch.ops.rocm_attn.thd_merge(out, lse, out_step, lse_step, cu, only_second_half,
                                         True)[0]


def _kernel_grad_correction(grad, grad_step, cu_seqlens_padded, first_half_op, second_half_op,
                            inplace):
    if first_half_op == "none" and second_half_op == "none":
        return grad  # as the torch path: nothing to do, grad itself
    why = _grad_problem(grad, grad_step, "grad_step") or (
        _overlap_problem(grad, grad_step) if inplace else None)
    if why:
        return _fallback("grad_correction", why, grad, grad_step, cu_seqlens_padded,
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


_KERNEL_IMPLS: Dict[str, Callable] = {
    "partition": _kernel_partition,
    "reorder_to_contiguous": _kernel_reorder_to_contiguous,
    "reorder_to_rank_sharded": _kernel_reorder_to_rank_sharded,
    "read_half": _kernel_read_half,
    "copy_valid_tokens": _kernel_copy_valid_tokens,
    "pad_for_cp": _kernel_pad_for_cp,
    "merge_partial": _kernel_merge_partial,
    "merge_rows_": _kernel_merge_rows_,
    "add_rows_": _kernel_add_rows_,
    "lse_correction": _kernel_lse_correction,
    "out_correction": _kernel_out_correction,
    "grad_correction": _kernel_grad_correction,
}


def _register_compiled_kernels() -> bool:
    """Fake impls of the THD ops and the kernel slots; False when this build lacks the ops."""
    if not all(hasattr(torch.ops.rocm_attn, op) for op in _KERNEL_OPS):
        return False
    torch.library.register_fake("rocm_attn::thd_gather")(_fake_gather)
    torch.library.register_fake("rocm_attn::thd_merge")(_fake_merge)
    torch.library.register_fake("rocm_attn::thd_grad_correction")(_fake_grad_correction)
    for op in ("thd_copy_valid_tokens_", "thd_merge_", "thd_merge_rows_", "thd_add_rows_",
               "thd_out_correction_", "thd_grad_correction_"):
        torch.library.register_fake(f"rocm_attn::{op}")(_fake_mutating)
    for name, fn in _KERNEL_IMPLS.items():
        register_kernel(name, fn)
    return True


HAS_KERNELS: bool = _ext.HAS_EXTENSION and _register_compiled_kernels()
