"""``attn_with_cp``: the public entry point; validates arguments, builds a
:class:`~rocm_attn.cp.steps.CPPlan` and dispatches to the comm type's autograd Function."""

from __future__ import annotations

from collections import OrderedDict

import hashlib
import logging
import struct
from typing import Optional, Sequence, Tuple, Union

import torch
import torch.distributed as dist

from .._checks import check_chunk_size, check_window, is_int
from ..errors import validate_mode
from ..reference import MASK_TYPES
from ..varlen import formats
from ..varlen.backends import resolve_backend
from ..varlen.checks import DTYPES, check_qkv, check_seq_args
from . import comm
from .a2a import A2AAttnFunc
from .a2a_p2p import A2AP2PAttnFunc, ring_plan
from .all_gather import AllGatherAttnFunc
from .p2p import RingAttnFunc
from .steps import CPPlan, side_geometry

__all__ = ["COMM_TYPES", "attn_with_cp"]

COMM_TYPES = ("p2p", "all_gather", "a2a", "a2a+p2p")
_FUNCS = {"p2p": RingAttnFunc, "all_gather": AllGatherAttnFunc, "a2a": A2AAttnFunc}
# comm types whose ring steps need identical q and kv sequences under a causal / masked mask
_RING_TYPES = ("p2p", "a2a+p2p")

_log = logging.getLogger("rocm_attn.cp")


# --------------------------------------------------------------------------
# host checks (no sync)
# --------------------------------------------------------------------------


def _check_tensors(q, k, v) -> None:
    check_qkv(q, k, v, "attn_with_cp", "rank-local THD")
    for name, t in (("q", q), ("k", k)):
        if t.shape[0] % 2:
            raise ValueError(
                f"{name} has {t.shape[0]} rank-local tokens, an odd count: a rank-local shard "
                "holds two equal halves of every sequence (shard with rocm_attn.shard_for_cp)")


# --------------------------------------------------------------------------
# value checks (read cu_seqlens on the host: on CPU tensors, or with validate=True)
# --------------------------------------------------------------------------


def _check_side_values(side: str, cu: torch.Tensor, cu_p: torch.Tensor, padded_given: bool,
                       cp: int, rows: int, max_seqlen: int) -> None:
    c = cu.long().cpu()
    p = cu_p.long().cpu()
    pname = f"cu_seqlens_{side}_padded" if padded_given else f"cu_seqlens_{side}"
    if int(p[0]) != 0:
        raise ValueError(f"{pname}[0] must be 0, got {int(p[0])}")
    plens = p[1:] - p[:-1]
    bad = torch.nonzero(plens < 0)
    if bad.numel():
        i = int(bad[0, 0])
        raise ValueError(f"{pname} must be non-decreasing: sequence {i} has length "
                         f"{int(plens[i])}")
    bad = torch.nonzero(plens % (2 * cp))
    if bad.numel():
        i = int(bad[0, 0])
        if padded_given:
            raise ValueError(
                f"{pname}: sequence {i} has a padded length of {int(plens[i])}, not a multiple "
                f"of 2*cp = {2 * cp} (dual-chunk sharding cuts every sequence into 2*cp equal "
                "chunks); pad with rocm_attn.thd.pad_for_cp")
        raise ValueError(
            f"{pname}: sequence {i} has length {int(plens[i])}, not a multiple of 2*cp = "
            f"{2 * cp}. Without cu_seqlens_{side}_padded the sequence lengths themselves define "
            "the dual-chunk layout; pad the sequences (rocm_attn.thd.pad_for_cp) and pass "
            f"cu_seqlens_{side}_padded")
    lens = c[1:] - c[:-1]
    bad = torch.nonzero(lens < 0)
    if bad.numel():
        i = int(bad[0, 0])
        raise ValueError(f"cu_seqlens_{side} must be non-decreasing: sequence {i} has length "
                         f"{int(lens[i])}")
    bad = torch.nonzero(lens > plens)
    if bad.numel():
        i = int(bad[0, 0])
        raise ValueError(f"sequence {i} has {int(lens[i])} valid {side} tokens (cu_seqlens_{side})"
                         f" but a padded slot of {int(plens[i])} ({pname})")
    need = int(p[-1]) // cp
    if cp > 1 and need and rows == int(p[-1]):
        raise ValueError(
            f"the local {side} shard has {rows} tokens, the unsharded global total {pname}[-1]"
            f" = {rows}, where {pname}[-1] // cp = {need} (plus optional slack rows) is "
            "expected: pass this rank's shard (rocm_attn.shard_for_cp), not the global tensor")
    if rows < need:
        raise ValueError(
            f"the local {side} shard has {rows} tokens but {pname}[-1] // cp = {int(p[-1])} // "
            f"{cp} = {need}: every rank holds {pname}[-1] // cp tokens (plus optional slack "
            "rows); shard the global tensors with rocm_attn.shard_for_cp")
    longest = int(lens.max()) if lens.numel() else 0
    if longest > max_seqlen:
        raise ValueError(f"max_seqlen_{side} = {max_seqlen} but sequence "
                         f"{int(torch.argmax(lens))} has {longest} valid tokens")


# --------------------------------------------------------------------------
# public API
# --------------------------------------------------------------------------


def attn_with_cp(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_kv: torch.Tensor,
    max_seqlen_q: int,
    max_seqlen_kv: int,
    cp_group,
    cp_comm_type: str = "p2p",
    attn_mask_type: str = "causal",
    window_size: Sequence[int] = (-1, -1),
    chunk_size: Optional[int] = None,
    cu_seqlens_q_padded: Optional[torch.Tensor] = None,
    cu_seqlens_kv_padded: Optional[torch.Tensor] = None,
    softmax_scale: Optional[float] = None,
    backend: str = "auto",
    *,
    return_lse: bool = False,
    return_max_logit: bool = False,
    qkv_format: str = "thd",
    validate: Optional[bool] = None,
    min_seqlen: Optional[int] = None,
) -> Union[torch.Tensor, Tuple[torch.Tensor, ...]]:
    """Context-parallel attention over THD, BSHD or SBHD sequences sharded across ``cp_group``.

    Every rank passes its shard in dual-chunk order (:func:`rocm_attn.shard_for_cp`: for every
    sequence, chunk ``rank`` then chunk ``2*cp-1-rank`` of its ``2*cp`` equal chunks) and the
    **global** cu_seqlens (the same on every rank). Differentiable: each comm type is a
    ``torch.autograd.Function`` whose backward communicates explicitly. Every rank of the group
    must make the call (and its backward) with the same arguments but its own shard.

    Parameters
    ----------
    q : torch.Tensor
        Rank-local ``[t_q, h_q, d]``, ``t_q = cu_seqlens_q_padded[-1] // cp`` (more rows are
        allowed as slack: they get zero outputs and gradients). float16 / bfloat16 / float32 /
        float64; any strides.
    k, v : torch.Tensor
        Rank-local ``[t_kv, h_kv, d]``, ``h_q % h_kv == 0`` (GQA / MQA).
    cu_seqlens_q, cu_seqlens_kv : torch.Tensor
        Global int32 ``[b+1]``: valid tokens per sequence.
    max_seqlen_q, max_seqlen_kv : int
        Host upper bounds of the valid sequence lengths (sizes kernel grids).
    cp_group : torch.distributed.ProcessGroup
        The context-parallel group (gloo on CPU, NCCL / RCCL on GPUs). For ``"a2a+p2p"``, the
        pair ``(a2a_group, p2p_group)``; the process holds the shard of CP rank
        ``p2p_rank * a2a_size + a2a_rank`` of ``cp = a2a_size * p2p_size``.
    cp_comm_type : str
        ``"p2p"`` (ring with batched isend/irecv), ``"all_gather"`` (all-gather K/V, reduce-
        scatter dK/dV), ``"a2a"`` (Ulysses all-to-all; needs ``h_q % cp == h_kv % cp == 0``) or
        ``"a2a+p2p"`` (all-to-all inside the a2a group, ring across groups; heads multiples of
        the a2a group size).
    attn_mask_type : str
        Transformer Engine's: ``"no_mask"`` / ``"padding"``, ``"causal"`` /
        ``"padding_causal"`` (top-left aligned: query ``i`` at kv position ``p = i``),
        ``"causal_bottom_right"`` / ``"padding_causal_bottom_right"`` (``p = i + n_kv -
        n_q``); causal: keys ``j <= p``. With equal q and kv lengths the two alignments agree;
        ``"p2p"`` / ``"a2a+p2p"`` need identical q and kv sequences for a causal mask.
    window_size : (int, int)
        Sliding window ``(left, right)``, ``-1`` = unbounded, as Transformer Engine's: query at
        ``p`` (aligned as the mask type says; bottom-right for the non-causal types) sees keys
        ``p - left <= j <= p + right``, intersected with ``j <= p`` when causal. Every comm
        type; ``"p2p"`` needs identical q and kv sequences for a window.
    chunk_size : int, optional
        Chunked attention (Llama-4 style): ``p`` sees ``j`` only when ``j // chunk_size ==
        p // chunk_size`` (chunks from the start of every sequence); combines with the mask
        type and the window (all constraints apply). Every comm type; ``"p2p"`` needs
        identical q and kv sequences. See ``docs/cp.md`` for the support matrix.
    cu_seqlens_q_padded, cu_seqlens_kv_padded : torch.Tensor, optional
        Global int32 ``[b+1]`` starting at 0: where every sequence's slot starts; every slot
        length a multiple of ``2*cp`` (valid tokens first, padding after). They define the
        dual-chunk layout; when None, ``cu_seqlens_*`` itself is the layout and must have
        lengths that are multiples of ``2*cp``.
    softmax_scale : float, optional
        Default ``1 / sqrt(d)``.
    backend : str
        Per-step attention: ``"auto"``, ``"reference"`` (pure torch, any device) or
        ``"torch_flash"`` (CUDA / ROCm, fp16 / bf16, ``d <= 256``).
    return_lse : bool
        Also return the LSE (differentiable).
    return_max_logit : bool
        Also return, last, the per-head maximum of the scaled logits over the (query, key)
        pairs the mask allows across the whole CP group: float32 ``[h_q]``, the same on every
        rank (a ``MAX`` all-reduce over the group), ``-inf`` for a head with none; padding
        rows never count; not differentiable; no host sync. One extra pass per attention
        call (``rocm_attn.varlen.max_logit``): ``torch_flash`` steps run their flash call once
        more at ``softmax_scale * 2^16`` and read the LSE (over by at most
        ``ln(max_seqlen_kv) / 2^16`` plus float32 rounding), ``reference`` steps an exact
        blocked pass.
    qkv_format : str
        ``"thd"`` (default), ``"bshd"`` (``[b, s/cp, h, d]``) or ``"sbhd"``
        (``[s/cp, b, h, d]``): every rank holds chunks ``rank`` and ``2cp-1-rank`` of the
        ``2cp`` chunks of every batch row (Transformer Engine's sharding;
        :func:`rocm_attn.shard_for_cp` with ``qkv_format`` makes it), ``s % (2cp) == 0``.
        ``cu_seqlens_q`` / ``cu_seqlens_kv`` are then optional (global valid lengths, a prefix
        of every row: the padding mask types) and ``max_seqlen_*`` default to ``s``; the
        ``*_padded`` arguments are THD-only. The LSE comes back ``[b, h_q, s/cp]``.
    validate : bool, optional
        Check the cu_seqlens *values* (layout, divisibility, shard size, max_seqlen,
        min_seqlen) and that every rank of the group makes the same call (an all-gather of a
        small signature; all ranks raise on a mismatch). Reading them synchronises, so by
        default (None) this runs for CPU tensors or with env ``ROCM_ATTN_VALIDATE=1`` only
        (not while torch.compile traces); ``True`` / ``False`` force it on / off. Every rank
        must pass the same value. See ``docs/cp.md``, "Checks".
    min_seqlen : int, optional
        A promise: every sequence with at least one valid token has at least ``min_seqlen``
        of them (q and kv). With a window or chunking, ``"p2p"`` skips the compute of ring
        steps the mask cannot reach for sequences that long (``docs/cp.md`` says how many
        run); without the promise only steps beyond reach for *any* length are skipped. A
        broken promise gives wrong results (checked when values are validated).

    Returns
    -------
    out : torch.Tensor
        Rank-local, q's shape and dtype, same layout as ``q``; zero at padding rows.
    lse : torch.Tensor
        Only with ``return_lse``: ``[h_q, t_q]`` (bshd / sbhd: ``[b, h_q, s/cp]``), natural
        log, float32 (float64 for float64 inputs), ``-inf`` at padding rows and rows with no
        allowed key.
    max_logit : torch.Tensor
        Only with ``return_max_logit``: float32 ``[h_q]``, last.

    Raises
    ------
    ValueError
        Bad arguments (each message names the argument), a rank outside ``cp_group``, a shard
        size inconsistent with ``cu_seqlens_*_padded[-1] // cp``, lengths not divisible by
        ``2*cp``, heads not divisible by ``cp`` for ``"a2a"`` (by the a2a group size for
        ``"a2a+p2p"``), ``"p2p"`` / ``"a2a+p2p"`` with a causal mask, a window or chunking
        between different q and kv sequences, ``"a2a+p2p"`` without a pair of groups, a
        broken ``min_seqlen`` promise, ``backend="torch_flash"`` for inputs it cannot serve;
        when checked, ranks whose calls differ or a rank whose arguments fail (on every rank)
        and an unsharded global tensor passed as a shard.
    """
    formats.check_format(qkv_format, q, k, v)
    if qkv_format != "thd":
        cp_size = _group_info(cp_group, cp_comm_type)[0] if cp_comm_type in COMM_TYPES else 1
        b, s_q = formats.dims(q, qkv_format)
        s_kv = formats.dims(k, qkv_format)[1]
        cu_seqlens_q, cu_seqlens_q_padded = formats.batch_cu_seqlens(
            "q", cu_seqlens_q, cu_seqlens_q_padded, b, s_q * cp_size, q.device)
        cu_seqlens_kv, cu_seqlens_kv_padded = formats.batch_cu_seqlens(
            "kv", cu_seqlens_kv, cu_seqlens_kv_padded, b, s_kv * cp_size, q.device)
        max_seqlen_q = s_q * cp_size if max_seqlen_q is None else max_seqlen_q
        max_seqlen_kv = s_kv * cp_size if max_seqlen_kv is None else max_seqlen_kv
        q, k, v = (formats.to_thd(x, qkv_format) for x in (q, k, v))
    for name, val in (("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_kv", cu_seqlens_kv),
                      ("max_seqlen_q", max_seqlen_q), ("max_seqlen_kv", max_seqlen_kv)):
        if val is None:
            raise ValueError(f"{name} is required for qkv_format='thd'")
    plan = _make_plan(q, k, v, cu_seqlens_q, cu_seqlens_kv, max_seqlen_q, max_seqlen_kv,
                      cp_group, cp_comm_type, attn_mask_type, window_size, chunk_size,
                      cu_seqlens_q_padded, cu_seqlens_kv_padded, softmax_scale, backend,
                      bool(return_lse), validate, min_seqlen, bool(return_max_logit))
    _log.debug("attn_with_cp: comm=%s mask=%s cp=%d rank=%d backend=%s", cp_comm_type,
               plan.attn_mask_type, plan.cp, plan.rank, plan.backend.name)
    if cp_comm_type == "a2a+p2p":
        a2a_group, p2p_group = cp_group
        a, i = comm.group_info(a2a_group)
        num_groups, g = comm.group_info(p2p_group)
        ring = ring_plan(plan, p2p_group, g, num_groups, a)
        out, lse, max_logit = A2AP2PAttnFunc.apply(q, k, v, plan, (a2a_group, a, ring))
        groups = [a2a_group, p2p_group]
    else:
        out, lse, max_logit = _FUNCS[cp_comm_type].apply(q, k, v, plan)
        groups = [cp_group]
    if plan.meta_stale is not None:  # shared step metadata built from other cu_seqlens values
        out = torch.where(plan.meta_stale, out.new_full((), float("nan")), out)
        lse = torch.where(plan.meta_stale, lse.new_full((), float("nan")), lse)
    if qkv_format != "thd":
        out = formats.from_thd(out, qkv_format, b, s_q)
        lse = formats.lse_from_thd(lse, qkv_format, b, s_q)
    result = (out,) + ((lse,) if return_lse else ())
    if return_max_logit:
        result += (comm.all_reduce_max(max_logit, groups),)
    return result[0] if len(result) == 1 else result


def _make_plan(q, k, v, cu_seqlens_q, cu_seqlens_kv, max_seqlen_q, max_seqlen_kv, cp_group,
               cp_comm_type, attn_mask_type, window_size, chunk_size, cu_seqlens_q_padded,
               cu_seqlens_kv_padded, softmax_scale, backend, return_lse, validate,
               min_seqlen=None, return_max_logit=False) -> CPPlan:
    args = (q, k, v, cu_seqlens_q, cu_seqlens_kv, max_seqlen_q, max_seqlen_kv, cp_group,
            cp_comm_type, attn_mask_type, window_size, chunk_size, cu_seqlens_q_padded,
            cu_seqlens_kv_padded, softmax_scale, backend, return_lse, validate, min_seqlen,
            return_max_logit)
    groups = _exchange_groups(cp_group)
    if not groups or not _cross_rank_check_on(validate, q):
        return _make_local_plan(*args)
    # every rank reaches the exchange, its own arguments good or bad, so that an error on one
    # rank raises on all of them instead of leaving the others waiting in a collective
    try:
        plan = _make_local_plan(*args)
    except ValueError as e:
        _exchange_signatures(groups, None, e)
        raise
    _exchange_signatures(groups, _signature(plan, q, k, cp_comm_type), None)
    return plan


def _make_local_plan(q, k, v, cu_seqlens_q, cu_seqlens_kv, max_seqlen_q, max_seqlen_kv,
                     cp_group, cp_comm_type, attn_mask_type, window_size, chunk_size,
                     cu_seqlens_q_padded, cu_seqlens_kv_padded, softmax_scale, backend,
                     return_lse, validate, min_seqlen=None, return_max_logit=False) -> CPPlan:
    if cp_comm_type not in COMM_TYPES:
        raise ValueError(f"cp_comm_type must be one of {COMM_TYPES}, got {cp_comm_type!r}")
    cp, rank = _group_info(cp_group, cp_comm_type)
    mask_type = formats.resolve_mask_type(attn_mask_type, None, "causal")
    causal = MASK_TYPES[mask_type]
    window = check_window(window_size)
    check_chunk_size(chunk_size)
    if min_seqlen is None:
        min_seqlen = 0
    elif not is_int(min_seqlen) or min_seqlen < 0:
        raise ValueError(f"min_seqlen must be None or an int >= 0, got {min_seqlen!r}")
    masked = window != (-1, -1) or chunk_size is not None
    _check_tensors(q, k, v)
    h_q, h_kv = q.shape[1], k.shape[1]
    if cp_comm_type == "a2a" and (h_q % cp or h_kv % cp):
        raise ValueError(f"cp_comm_type='a2a' shards heads over the group: h_q ({h_q}) and "
                         f"h_kv ({h_kv}) must both be multiples of cp ({cp}); use 'p2p' or "
                         "'all_gather'")
    if cp_comm_type == "a2a+p2p":
        a = comm.group_info(cp_group[0])[0]
        if h_q % a or h_kv % a:
            raise ValueError(f"cp_comm_type='a2a+p2p' shards heads over the a2a group: h_q "
                             f"({h_q}) and h_kv ({h_kv}) must both be multiples of its size "
                             f"({a})")
    dev = q.device
    softmax_scale = check_seq_args(q, cu_seqlens_q, cu_seqlens_kv, cu_seqlens_q_padded,
                                   cu_seqlens_kv_padded, max_seqlen_q, max_seqlen_kv,
                                   softmax_scale)
    step_backend = resolve_backend(backend, q)
    cu_q_p = cu_seqlens_q if cu_seqlens_q_padded is None else cu_seqlens_q_padded
    cu_kv_p = cu_seqlens_kv if cu_seqlens_kv_padded is None else cu_seqlens_kv_padded

    check_values = validate_mode(validate) or (validate is None and dev.type == "cpu")
    if check_values:
        _check_side_values("q", cu_seqlens_q, cu_q_p, cu_seqlens_q_padded is not None, cp,
                           q.shape[0], max_seqlen_q)
        _check_side_values("kv", cu_seqlens_kv, cu_kv_p, cu_seqlens_kv_padded is not None, cp,
                           k.shape[0], max_seqlen_kv)
        if (causal or masked) and cp_comm_type in _RING_TYPES and not (
                torch.equal(cu_seqlens_q, cu_seqlens_kv) and torch.equal(cu_q_p, cu_kv_p)):
            what = "a causal mask" if causal else _mask_words(window, chunk_size)
            raise ValueError(
                f"cp_comm_type={cp_comm_type!r} with {what} needs identical q and kv sequences "
                "(cu_seqlens_q == cu_seqlens_kv and the same padded layout): its ring steps "
                "rely on q and kv chunks at the same positions; use 'all_gather' or 'a2a' for "
                "masked attention between different q and kv lengths")
        _check_min_seqlen(min_seqlen, cu_seqlens_q, cu_seqlens_kv)
    # a top-left causal mask is the bottom-right one where every sequence has as many queries
    # as keys (the ring types need identical q and kv sequences for a causal mask anyway)
    top_left = (cp_comm_type not in _RING_TYPES and formats.causal_top_left(mask_type)
                and not formats.lengths_equal(cu_seqlens_q, cu_seqlens_kv, check_values))
    shared, stale = _shared_step_cache(
        (cu_seqlens_q, cu_seqlens_kv, cu_q_p, cu_kv_p),
        (cp_comm_type, cp, rank, causal, top_left, window, chunk_size, max_seqlen_q,
         max_seqlen_kv,
         q.shape[0], k.shape[0], min_seqlen, step_backend.name, str(dev)),
        by_value=check_values or dev.type == "cpu")
    return CPPlan(
        meta_cache=shared, meta_stale=stale,
        group=cp_group, cp=cp, rank=rank, attn_mask_type="causal" if causal else "no_mask",
        window_size=window, chunk_size=chunk_size, softmax_scale=float(softmax_scale),
        cu_seqlens_q=cu_seqlens_q, cu_seqlens_kv=cu_seqlens_kv, cu_seqlens_q_padded=cu_q_p,
        cu_seqlens_kv_padded=cu_kv_p, max_seqlen_q=max_seqlen_q, max_seqlen_kv=max_seqlen_kv,
        rows_q=q.shape[0], rows_kv=k.shape[0], backend=step_backend, return_lse=return_lse,
        geom_q=side_geometry(cu_seqlens_q, cu_q_p, cp),
        geom_kv=side_geometry(cu_seqlens_kv, cu_kv_p, cp), min_seqlen=min_seqlen,
        top_left=top_left, return_max_logit=return_max_logit)


# Step metadata (StepMeta, DirectCall: tens to hundreds of small device ops per call) shared
# by calls with the same cu_seqlens and geometry, e.g. every layer of a model in one step. Few
# entries: a new batch pushes old ones out. Two keys:
# * by value (CPU tensors, or validate on: the values are on the host for free or already read):
#   the cu_seqlens bytes, so no write of any kind can make an entry wrong;
# * by tensor identity and version (GPU default: reading values would synchronise). An entry
#   holds its tensors (no other tensor can take their ids) and a device copy of their values:
#   a write that bypasses the version counter (``.data``, DLPack) is caught on the device, no
#   sync, and the call's output and LSE become NaN (CPPlan.meta_stale) instead of silently
#   following the old layout.
_STEP_CACHE: "OrderedDict[tuple, tuple]" = OrderedDict()
_STEP_CACHE_SIZE = 8


def _shared_step_cache(tensors: tuple, params: tuple, by_value: bool
                       ) -> Tuple[dict, Optional[torch.Tensor]]:
    """``(meta_cache, stale)`` for a plan: the dict shared with earlier calls on the same
    cu_seqlens values (``by_value``) or the same unmodified tensors, and for the latter on a
    hit a device bool that is True when the values changed behind the version counter. A fresh
    dict while compiling or capturing a graph (metadata made there must not be read outside
    it)."""
    if torch.compiler.is_compiling() or (
            tensors[0].is_cuda and torch.cuda.is_current_stream_capturing()):
        return {}, None
    if by_value:
        key = ("values",) + tuple(t.detach().cpu().numpy().tobytes() for t in tensors) + params
        entry = _STEP_CACHE.get(key)
        if entry is None:
            entry = _STEP_CACHE[key] = (None, None, {})
        stale = None
    else:
        key = ("tensors",) + tuple((id(t), t._version) for t in tensors) + params
        entry = _STEP_CACHE.get(key)
        if entry is None or any(a is not b for a, b in zip(entry[0], tensors)):
            entry = _STEP_CACHE[key] = (tensors, torch.cat(tensors), {})
            stale = None
        else:
            stale = torch.cat(tensors).ne(entry[1]).any()
    while len(_STEP_CACHE) > _STEP_CACHE_SIZE:
        _STEP_CACHE.popitem(last=False)
    _STEP_CACHE.move_to_end(key)
    return entry[2], stale


# --------------------------------------------------------------------------
# cross-rank consistency (CPU tensors by default, validate="sync" anywhere)
# --------------------------------------------------------------------------

# What every rank of the group must agree on, one int64 each (the cu_seqlens as hashes of their
# values): ranks that differ in any of these would run mismatched collectives (a hang) or mix
# different layouts (a wrong result).
_SIGNATURE = ("error", "cp_comm_type", "cp", "attn_mask_type", "window_size[0]",
              "window_size[1]", "chunk_size", "max_seqlen_q", "max_seqlen_kv", "q tokens",
              "k/v tokens", "q heads", "k/v heads", "head_dim", "dtype", "softmax_scale",
              "return_lse", "min_seqlen", "b (sequences)", "cu_seqlens_q", "cu_seqlens_kv",
              "cu_seqlens_q_padded", "cu_seqlens_kv_padded")
_HASHED = ("cu_seqlens_q", "cu_seqlens_kv", "cu_seqlens_q_padded", "cu_seqlens_kv_padded")


def _exchange_groups(cp_group) -> list:
    """The process groups (of more than one rank) a consistency check exchanges over: the
    group, or both groups of an ``"a2a+p2p"`` pair (agreement within every a2a group and every
    p2p group is agreement across the whole CP group). Empty for stand-ins without
    communication (objects with ``size()`` / ``rank()``) and for anything malformed (the
    argument checks report that)."""
    cands = list(cp_group) if isinstance(cp_group, (tuple, list)) else [cp_group]
    try:
        if not dist.is_available() or not dist.is_initialized():
            return []
        return [g for g in cands if isinstance(g, dist.ProcessGroup)
                and dist.get_world_size(g) > 1 and dist.get_rank(g) >= 0]
    except (RuntimeError, ValueError):
        return []


def _cross_rank_check_on(validate, q) -> bool:
    """Whether the ranks compare signatures: ``validate`` True / "sync" (or env
    ``ROCM_ATTN_VALIDATE=1``), or by default for CPU tensors, where the exchange (gloo) and the
    hashes cost no device sync, except while torch.compile traces. Every rank must pass the
    same ``validate``."""
    try:
        if validate_mode(validate):
            return True
    except ValueError:
        pass  # the argument checks raise it, on every rank, after the exchange
    return (validate is None and (not isinstance(q, torch.Tensor) or q.device.type == "cpu")
            and not torch.compiler.is_compiling())


def _cu_hash(t: torch.Tensor) -> int:
    digest = hashlib.blake2b(t.detach().cpu().numpy().tobytes(), digest_size=8).digest()
    return int.from_bytes(digest, "little", signed=True)


def _signature(plan: CPPlan, q, k, cp_comm_type: str) -> list:
    scale_bits = struct.unpack("<q", struct.pack("<d", plan.softmax_scale))[0]
    chunk = -1 if plan.chunk_size is None else plan.chunk_size
    return [0, COMM_TYPES.index(cp_comm_type), plan.cp,
            int(plan.causal) + int(plan.top_left), *plan.window_size,
            chunk, plan.max_seqlen_q, plan.max_seqlen_kv, plan.rows_q, plan.rows_kv,
            q.shape[1], k.shape[1], q.shape[2], DTYPES.index(q.dtype), scale_bits,
            int(plan.return_lse), plan.min_seqlen, plan.cu_seqlens_q.numel() - 1,
            *(_cu_hash(t) for t in (plan.cu_seqlens_q, plan.cu_seqlens_kv,
                                    plan.cu_seqlens_q_padded, plan.cu_seqlens_kv_padded))]


def _show(field: str, value: int) -> str:
    if field == "cp_comm_type":
        return repr(COMM_TYPES[value]) if 0 <= value < len(COMM_TYPES) else str(value)
    if field == "attn_mask_type":
        return {0: "no_mask", 1: "causal", 2: "causal (top-left, q and kv lengths differ)"}.get(
            value, str(value))
    if field == "dtype":
        return str(DTYPES[value]) if 0 <= value < len(DTYPES) else str(value)
    if field == "softmax_scale":
        return repr(struct.unpack("<d", struct.pack("<q", value))[0])
    if field == "chunk_size" and value == -1:
        return "None"
    return str(value)


def _exchange_signatures(groups: list, sig: Optional[list], error: Optional[Exception]) -> None:
    """All-gather this rank's signature (or an error flag) over every group and raise the same
    ValueError on every rank when a rank's arguments failed or the signatures differ (a rank
    with its own error returns: the caller raises that). Every rank takes part in every
    exchange, and a problem seen in one group is flagged in the next one, so that for an
    ``"a2a+p2p"`` pair (a2a groups first, then p2p groups, each p2p group meeting every a2a
    group) every rank learns of it."""
    flag = 1 if error is not None else 0  # 0 fine, 1 own error, 2 a problem seen before
    problem: Optional[ValueError] = None
    for g in groups:
        dev = (torch.device("cpu") if "gloo" in str(dist.get_backend(g)).lower()
               else torch.device("cuda", torch.cuda.current_device()))
        row = [flag] + (list(sig[1:]) if sig is not None else [0] * (len(_SIGNATURE) - 1))
        mine = torch.tensor(row, dtype=torch.int64, device=dev)
        parts = [torch.empty_like(mine) for _ in range(dist.get_world_size(g))]
        dist.all_gather(parts, mine, group=g)
        if problem is None:
            problem = _signature_problem(torch.stack(parts).cpu())
        if problem is not None and flag == 0:
            flag = 2
    if error is None and problem is not None:
        raise problem


def _signature_problem(table: torch.Tensor) -> Optional[ValueError]:
    """The error for a gathered ``[ranks, fields]`` signature table, or None when it agrees."""
    failed = [r for r in range(table.shape[0]) if int(table[r, 0])]
    if failed:
        return ValueError(
            f"attn_with_cp: rank(s) {failed} of cp_group rejected their arguments or saw ranks "
            "that did (their error says why); every rank raises so that none waits in a "
            "collective")
    for i, field in enumerate(_SIGNATURE):
        col = table[:, i].tolist()
        if len(set(col)) == 1:
            continue
        if field in _HASHED:
            same: dict = {}
            for r, x in enumerate(col):
                same.setdefault(x, []).append(r)
            alike = "; ".join(str(rs) for rs in same.values())
            return ValueError(
                f"attn_with_cp: the ranks of cp_group pass different {field} values (ranks "
                f"with equal values: {alike}); every rank must pass the same global {field}")
        vals = ", ".join(f"rank {r}: {_show(field, x)}" for r, x in enumerate(col))
        return ValueError(f"attn_with_cp: the ranks of cp_group disagree on {field} ({vals}); "
                          "every rank must make the call with the same arguments but its own "
                          "shard")
    return None


def _group_info(cp_group, cp_comm_type: str) -> Tuple[int, int]:
    """``(cp, rank)``; for ``"a2a+p2p"`` from the pair ``(a2a_group, p2p_group)``: ``cp = a * G``
    and the CP rank ``p2p_rank * a + a2a_rank``."""
    if cp_comm_type != "a2a+p2p":
        return comm.group_info(cp_group)
    if not isinstance(cp_group, (tuple, list)) or len(cp_group) != 2:
        raise ValueError("cp_comm_type='a2a+p2p' takes cp_group=(a2a_group, p2p_group): the "
                         "all-to-all group inside a node and the ring group across them, got "
                         f"{type(cp_group).__name__}")
    a, i = comm.group_info(cp_group[0])
    num_groups, g = comm.group_info(cp_group[1])
    return a * num_groups, g * a + i


def _mask_words(window: Tuple[int, int], chunk_size: Optional[int]) -> str:
    parts = []
    if window != (-1, -1):
        parts.append(f"window_size={window}")
    if chunk_size is not None:
        parts.append(f"chunk_size={chunk_size}")
    return " and ".join(parts)


def _check_min_seqlen(min_seqlen: int, cu_q: torch.Tensor, cu_kv: torch.Tensor) -> None:
    if not min_seqlen:
        return
    for side, cu in (("q", cu_q), ("kv", cu_kv)):
        lens = (cu[1:] - cu[:-1]).long().cpu()
        bad = torch.nonzero((lens > 0) & (lens < min_seqlen))
        if bad.numel():
            i = int(bad[0, 0])
            raise ValueError(f"min_seqlen={min_seqlen} promises every non-empty sequence has at "
                             f"least that many tokens, but sequence {i} has {int(lens[i])} "
                             f"valid {side} tokens")
