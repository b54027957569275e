"""Communication of context-parallel attention over ``torch.distributed`` (NCCL / RCCL on GPUs,
gloo on CPU): group introspection, the ring exchange, and token-dim collectives.

Every collective here is explicit (no autograd through collectives): the autograd Functions of
the comm types call these in their forward and backward.
"""

from __future__ import annotations

from typing import Dict, Tuple

import torch
import torch.distributed as dist

from .. import thd

__all__ = ["group_info", "RingExchange", "all_gather_tokens", "reduce_scatter_tokens",
           "all_to_all_tokens", "seq_to_head", "head_to_seq"]

# P2P tags (gloo matches messages by tag; NCCL by issue order, which is the same on all ranks)
TAG_KV = 7101
TAG_DKV = 7102


def group_info(group) -> Tuple[int, int]:
    """``(cp, rank)``: the size of ``group`` and this process's rank in it.

    ``group`` is a ``torch.distributed`` ``ProcessGroup`` (e.g. ``dist.group.WORLD`` or one from
    ``dist.new_group``). Objects with ``size()`` and ``rank()`` methods are accepted too (they
    let argument checks run without a process group; any communication needs a real group).

    Raises
    ------
    ValueError
        ``group`` is None or not a group, this process is not a member of it, or
        ``torch.distributed`` is not initialised.
    """
    if group is None:
        raise ValueError("cp_group is required: a torch.distributed ProcessGroup "
                         "(dist.group.WORLD for all ranks, or one from dist.new_group)")
    non_member = getattr(getattr(dist, "GroupMember", None), "NON_GROUP_MEMBER", object())
    if group is non_member:
        raise ValueError("this process is not a member of cp_group (dist.new_group returned "
                         "NON_GROUP_MEMBER on this rank): call attn_with_cp only on the ranks "
                         "of the group")
    if isinstance(group, dist.ProcessGroup):
        if not dist.is_initialized():
            raise ValueError("torch.distributed is not initialised (init_process_group first)")
        cp, rank = dist.get_world_size(group), dist.get_rank(group)
    elif callable(getattr(group, "size", None)) and callable(getattr(group, "rank", None)):
        cp, rank = group.size(), group.rank()
    else:
        raise ValueError(f"cp_group must be a torch.distributed ProcessGroup, got "
                         f"{type(group).__name__}")
    if not isinstance(cp, int) or cp < 1:
        raise ValueError(f"cp_group has an invalid size {cp!r}")
    if not isinstance(rank, int) or not 0 <= rank < cp:
        raise ValueError(f"this process has rank {rank!r} in cp_group of size {cp}: it is not a "
                         "member of the group")
    return cp, rank


def _global_rank(group, group_rank: int) -> int:
    if group is None or group is dist.group.WORLD:
        return group_rank
    get = getattr(dist, "get_global_rank", None) or getattr(dist.distributed_c10d,
                                                             "_get_global_rank")
    return get(group, group_rank)


# --------------------------------------------------------------------------
# ring exchange (p2p)
# --------------------------------------------------------------------------

_SIDE_STREAMS: Dict[torch.device, "torch.cuda.Stream"] = {}


def _side_stream(device: torch.device):
    s = _SIDE_STREAMS.get(device)
    if s is None:
        s = _SIDE_STREAMS[device] = torch.cuda.Stream(device=device)
    return s


class RingExchange:
    """Send ``send`` to the next rank of the ring and receive the previous rank's tensor
    (``reverse``: send to the previous rank, receive from the next).

    Posted at construction with ``dist.batch_isend_irecv`` (one isend + one irecv), completed by
    :meth:`wait`, which returns the received tensor. On a GPU the ops are issued on a side
    stream (after it waits for the current stream, so ``send`` is ready) and :meth:`wait` makes
    the current stream wait for them: the transfer overlaps the attention computed between
    construction and ``wait``. On CPU (gloo) the ops are asynchronous and ``wait`` blocks.
    ``send`` must not be modified before :meth:`wait`; this object keeps it alive until then.
    """

    def __init__(self, send: torch.Tensor, group, cp: int, rank: int, tag: int,
                 reverse: bool = False):
        self.send = send
        self.recv = torch.empty_like(send)
        step = -1 if reverse else 1
        nxt = _global_rank(group, (rank + step) % cp)
        prv = _global_rank(group, (rank - step) % cp)
        ops = [dist.P2POp(dist.isend, send, nxt, group, tag),
               dist.P2POp(dist.irecv, self.recv, prv, group, tag)]
        self.stream = None
        if send.is_cuda:
            self.stream = _side_stream(send.device)
            self.stream.wait_stream(torch.cuda.current_stream(send.device))
            with torch.cuda.stream(self.stream):
                self.works = dist.batch_isend_irecv(ops)
            # the caching allocator must not reuse these while the side stream uses them
            send.record_stream(self.stream)
            self.recv.record_stream(self.stream)
        else:
            self.works = dist.batch_isend_irecv(ops)

    def wait(self) -> torch.Tensor:
        for w in self.works:
            w.wait()
        if self.stream is not None:
            torch.cuda.current_stream(self.recv.device).wait_stream(self.stream)
        self.works = []
        self.send = None
        return self.recv


# --------------------------------------------------------------------------
# token-dim collectives (dim 0, rank blocks in rank order)
# --------------------------------------------------------------------------


def all_gather_tokens(x: torch.Tensor, group, cp: int) -> torch.Tensor:
    """``[t, ...]`` on every rank -> ``[cp*t, ...]``: the rank shards concatenated in rank order
    (the layout :func:`rocm_attn.thd.reorder_to_contiguous` takes)."""
    x = x.contiguous()
    if cp == 1:
        return x
    out = x.new_empty((cp * x.shape[0],) + tuple(x.shape[1:]))
    fn = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    fn(out, x, group=group)
    return out


def reduce_scatter_tokens(x: torch.Tensor, group, cp: int) -> torch.Tensor:
    """``[cp*t, ...]`` (rank blocks in rank order, e.g. from
    :func:`rocm_attn.thd.reorder_to_rank_sharded`) -> ``[t, ...]``: the sum over ranks of this
    rank's block."""
    x = x.contiguous()
    if cp == 1:
        return x
    out = x.new_empty((x.shape[0] // cp,) + tuple(x.shape[1:]))
    fn = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    fn(out, x, group=group)
    return out


def all_to_all_tokens(x: torch.Tensor, group, cp: int) -> torch.Tensor:
    """``[cp, ...]`` blocks: block ``j`` goes to rank ``j``; returns ``[cp, ...]`` where block
    ``j`` came from rank ``j``."""
    x = x.contiguous()
    if cp == 1:
        return x
    out = torch.empty_like(x)
    dist.all_to_all_single(out, x, group=group)
    return out


def seq_to_head(x: torch.Tensor, head_dim: int, cu_seqlens_padded: torch.Tensor, group,
                cp: int) -> torch.Tensor:
    """Ulysses forward: rank-local tokens, all heads -> all tokens (global contiguous order),
    heads ``[rank*h/cp, (rank+1)*h/cp)``.

    ``x [t, ..., h, ...]`` with the heads at ``head_dim`` (``h % cp == 0``); returns
    ``[cp*t, ..., h/cp, ...]`` reordered with :func:`rocm_attn.thd.reorder_to_contiguous`.
    """
    h = x.shape[head_dim]
    shape = list(x.shape)
    split = shape[:head_dim] + [cp, h // cp] + shape[head_dim + 1:]
    blocks = x.reshape(split).movedim(head_dim, 0)  # [cp, t, ..., h/cp, ...]
    got = all_to_all_tokens(blocks, group, cp)  # block j: rank j's tokens, my heads
    gathered = got.reshape([cp * shape[0]] + list(got.shape[2:]))
    return thd.reorder_to_contiguous(gathered, cu_seqlens_padded, cp)


def head_to_seq(y: torch.Tensor, head_dim: int, cu_seqlens_padded: torch.Tensor, group,
                cp: int) -> torch.Tensor:
    """Inverse of :func:`seq_to_head`: ``[cp*t, ..., h/cp, ...]`` (global order, this rank's
    heads) -> ``[t, ..., h, ...]`` (this rank's tokens, all heads)."""
    sharded = thd.reorder_to_rank_sharded(y, cu_seqlens_padded, cp)  # block j: rank j's tokens
    t = y.shape[0] // cp
    blocks = sharded.reshape([cp, t] + list(y.shape[1:]))
    got = all_to_all_tokens(blocks, group, cp)  # block j: my tokens, rank j's heads
    merged = got.movedim(0, head_dim)  # [t, ..., cp, h/cp, ...]
    shape = list(merged.shape)
    return merged.reshape(shape[:head_dim] + [shape[head_dim] * shape[head_dim + 1]]
                          + shape[head_dim + 2:])



def all_reduce_max(x: torch.Tensor, groups) -> torch.Tensor:
    """``x`` max-reduced over every process group of ``groups`` (in place, returned); groups of
    one rank and stand-ins without communication are skipped. No host sync."""
    for g in groups:
        if isinstance(g, dist.ProcessGroup) and dist.get_world_size(g) > 1:
            dist.all_reduce(x, op=dist.ReduceOp.MAX, group=g)
    return x
