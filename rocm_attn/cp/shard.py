"""User helpers: global THD tensor <-> rank-local dual-chunk shard."""

from __future__ import annotations

from typing import Optional

import torch

from .. import thd
from . import comm

__all__ = ["shard_for_cp", "gather_from_cp"]


def _batch_view(x: torch.Tensor, qkv_format: str):
    """A bshd / sbhd tensor as THD ``[b*s, ...]`` with its padded cu_seqlens (every batch row
    one sequence), and ``(b, s)``."""
    if qkv_format not in ("bshd", "sbhd"):
        raise ValueError(f"qkv_format must be 'thd', 'bshd' or 'sbhd', got {qkv_format!r}")
    if not isinstance(x, torch.Tensor) or x.dim() < 2:
        raise ValueError(f"x must be a [{', '.join(qkv_format)}] tensor")
    xb = x if qkv_format == "bshd" else x.transpose(0, 1)
    b, s = xb.shape[0], xb.shape[1]
    cu = torch.arange(b + 1, dtype=torch.int32, device=x.device) * s
    return xb.reshape((b * s,) + tuple(xb.shape[2:])), cu, b, s


def _from_batch(y: torch.Tensor, qkv_format: str, b: int) -> torch.Tensor:
    y = y.reshape((b, y.shape[0] // b) + tuple(y.shape[1:]))
    return y if qkv_format == "bshd" else y.transpose(0, 1).contiguous()


def shard_for_cp(x: torch.Tensor, cu_seqlens_padded: Optional[torch.Tensor], cp: int,
                 rank: int, *, dim: int = 0, validate: Optional[bool] = None,
                 qkv_format: str = "thd") -> torch.Tensor:
    """The shard of ``rank`` of a global THD tensor under dual-chunk sharding
    (:func:`rocm_attn.thd.partition`): for every sequence, chunk ``rank`` then chunk
    ``2*cp-1-rank`` of its ``2*cp`` equal chunks.

    Parameters
    ----------
    x : torch.Tensor
        Global ``[T, ...]`` (tokens at ``dim``; ``dim=-1`` for an LSE ``[h, T]``), laid out as
        ``cu_seqlens_padded`` says, ``T % cp == 0`` (rows past ``cu_seqlens_padded[-1]`` are
        slack, dealt to the ranks in equal blocks).
    cu_seqlens_padded : torch.Tensor
        Global int32 ``[b+1]``, starting at 0, every length a multiple of ``2*cp``
        (:func:`rocm_attn.thd.pad_for_cp` makes it).
    cp, rank : int
        Group size and this rank's index in it.
    validate : bool, optional
        Check the ``cu_seqlens_padded`` values (start 0, non-decreasing, lengths multiples of
        ``2*cp``, end within ``T``); raises ``ValueError`` naming the first bad sequence.
        Default (None): for CPU tensors (no sync there; skipped while torch.compile traces)
        or with env ``ROCM_ATTN_VALIDATE=1``; on a GPU ``True`` synchronises.

    qkv_format : str
        ``"thd"`` (default), or ``"bshd"`` / ``"sbhd"``: ``x`` is ``[b, s, ...]`` /
        ``[s, b, ...]`` (``cu_seqlens_padded`` and ``dim`` unused, pass None), every batch row
        one sequence, ``s % (2*cp) == 0``; the shard is ``[b, s // cp, ...]`` /
        ``[s // cp, b, ...]``: chunks ``rank`` and ``2*cp-1-rank`` of every row
        (Transformer Engine's sharding).

    Returns
    -------
    torch.Tensor
        ``[T // cp, ...]``: the rank-local input of :func:`rocm_attn.attn_with_cp`.
    """
    if qkv_format != "thd":
        xt, cu, b, s = _batch_view(x, qkv_format)
        if s % (2 * cp):
            raise ValueError(f"qkv_format={qkv_format!r}: the sequence length {s} must be a "
                             f"multiple of 2*cp = {2 * cp}")
        return _from_batch(thd.partition(xt, cu, cp, rank, validate=validate), qkv_format, b)
    return thd.partition(x, cu_seqlens_padded, cp, rank, dim=dim, validate=validate)


def gather_from_cp(x_local: torch.Tensor, cu_seqlens_padded: Optional[torch.Tensor], cp: int,
                   group, *, dim: int = 0, qkv_format: str = "thd") -> torch.Tensor:
    """Inverse of :func:`shard_for_cp` across the group: all-gather the rank shards and restore
    per-sequence contiguous order (:func:`rocm_attn.thd.reorder_to_contiguous`). A collective:
    every rank of ``group`` must call it. Not differentiable (meant for outputs, gradients,
    checkpoints and tests).

    Parameters
    ----------
    x_local : torch.Tensor
        Rank-local ``[t, ...]`` (tokens at ``dim``), the same shape on every rank.
    cu_seqlens_padded : torch.Tensor
        The **global** padded cu_seqlens (int32 ``[b+1]``).
    cp : int
        Must equal the size of ``group``.
    group : torch.distributed.ProcessGroup

    qkv_format : str
        ``"bshd"`` / ``"sbhd"``: the inverse of :func:`shard_for_cp` with that format
        (``cu_seqlens_padded`` and ``dim`` unused).

    Returns
    -------
    torch.Tensor
        Global ``[cp * t, ...]`` on every rank.
    """
    if qkv_format != "thd":
        xt, _, b, s = _batch_view(x_local.detach(), qkv_format)
        cu = torch.arange(b + 1, dtype=torch.int32, device=x_local.device) * (s * cp)
        return _from_batch(gather_from_cp(xt, cu, cp, group), qkv_format, b)
    size, _ = comm.group_info(group)
    if cp != size:
        raise ValueError(f"gather_from_cp: cp={cp} but the group has {size} ranks")
    if not isinstance(x_local, torch.Tensor) or x_local.dim() < 1:
        raise ValueError("x_local must be a torch.Tensor with a token dim")
    d = dim % x_local.dim()
    gathered = comm.all_gather_tokens(x_local.detach().movedim(d, 0), group, cp)
    return thd.reorder_to_contiguous(gathered, cu_seqlens_padded, cp).movedim(0, d)
