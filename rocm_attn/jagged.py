"""Jagged inputs as the recommendation stack hands them over: torchrec ``JaggedTensor`` (values
with offsets, lengths or both), packed rows with lengths only, and FBGEMM's int64 offsets.

``TargetAttention`` reads its inputs through :func:`target_attention_inputs`;
:func:`fused_attn_small_seq_jagged` does the same for :func:`rocm_attn.fused_attn_small_seq`.
torchrec is never imported: a jagged tensor is recognised by its methods (``values()`` and
``offsets_or_none()`` / ``lengths_or_none()``), so rocm_attn neither requires nor pins it.
Offsets computed from lengths are int64 (a cumulative sum on the device, no host sync); offsets
a jagged tensor carries are used as they are, int32 or int64.
"""

from __future__ import annotations

from typing import Optional, Tuple, Union

import torch
import torch.nn.functional as F

from .small_seq import fused_attn_small_seq

INT_DTYPES = (torch.int32, torch.int64)


def is_jagged(x) -> bool:
    """True for a torchrec ``JaggedTensor`` (or anything with its accessors): not a tensor, with
    ``values()`` and ``offsets_or_none()`` or ``lengths_or_none()``."""
    return (not isinstance(x, torch.Tensor) and callable(getattr(x, "values", None))
            and (callable(getattr(x, "offsets_or_none", None))
                 or callable(getattr(x, "lengths_or_none", None))))


def _is_keyed(x) -> bool:
    """A torchrec ``KeyedJaggedTensor``: several features, each its own jagged tensor."""
    return not isinstance(x, torch.Tensor) and callable(getattr(x, "keys", None)) and \
        callable(getattr(x, "to_dict", None))


def offsets_from_lengths(lengths: torch.Tensor, name: str = "lengths") -> torch.Tensor:
    """int64 offsets ``[n+1]`` (0, then the running sum) of int32/int64 ``lengths [n]``,
    computed on the lengths' device without a host sync."""
    if (not isinstance(lengths, torch.Tensor) or lengths.is_nested
            or lengths.dtype not in INT_DTYPES or lengths.dim() != 1):
        got = (f"{lengths.dtype} {tuple(lengths.shape)}" if isinstance(lengths, torch.Tensor)
               and not lengths.is_nested else type(lengths).__name__)
        raise ValueError(f"{name} must be a 1-D int32 or int64 tensor, got {got}")
    return F.pad(lengths.long().cumsum(0), (1, 0))


def jagged_parts(x, name: str) -> Tuple[torch.Tensor, torch.Tensor]:
    """(values, offsets ``[n+1]``) of a jagged tensor: its own offsets when it carries them,
    else int64 offsets from its lengths."""
    if _is_keyed(x):
        raise ValueError(
            f"{name} is a KeyedJaggedTensor (several features): pass one feature's "
            f"JaggedTensor, e.g. the EmbeddingCollection output's [\"history\"]")
    if not is_jagged(x):
        raise ValueError(f"{name} must be a jagged tensor (values with offsets or lengths), "
                         f"got {type(x).__name__}")
    values = x.values()
    if not isinstance(values, torch.Tensor):
        raise ValueError(f"{name}.values() must be a tensor, got {type(values).__name__}")
    offsets = x.offsets_or_none() if callable(getattr(x, "offsets_or_none", None)) else None
    if offsets is None:
        lengths = x.lengths_or_none() if callable(getattr(x, "lengths_or_none", None)) else None
        if lengths is None:
            raise ValueError(f"{name} carries neither offsets nor lengths")
        offsets = offsets_from_lengths(lengths, f"{name}.lengths()")
    return values, offsets


def target_attention_inputs(candidate, history, seqlens, cu_seqlens, lengths,
                            candidate_offsets):
    """TargetAttention's inputs with jagged forms resolved to the forms it checks and runs:

    * ``history`` a jagged tensor: its values and offsets (as ``cu_seqlens``);
    * ``history`` packed rows ``[total, e]`` with ``lengths [users]``: offsets from the
      lengths (a keyword of its own: a padded history's ``seqlens`` with rows of the wrong
      rank stays an error, not a silent reading as packed rows);
    * ``candidate`` a jagged tensor: its values, and its offsets as ``candidate_offsets``.

    Returns (candidate, history, seqlens, cu_seqlens, candidate_offsets).
    """
    if is_jagged(candidate) or _is_keyed(candidate):
        if candidate_offsets is not None:
            raise ValueError("a jagged candidate carries its own offsets: pass no "
                             "candidate_offsets with it")
        candidate, candidate_offsets = jagged_parts(candidate, "candidate")
    jagged = is_jagged(history) or _is_keyed(history)
    if jagged or lengths is not None:
        given = [n for n, x in (("seqlens", seqlens), ("cu_seqlens", cu_seqlens),
                                ("lengths", lengths)) if x is not None]
        if jagged and given:
            raise ValueError(f"a jagged history carries its own offsets or lengths: pass no "
                             f"{' / '.join(given)} with it")
        if len(given) > 1:
            raise ValueError(f"pass one of seqlens (padded history), cu_seqlens or lengths "
                             f"(packed history), got {' and '.join(given)}")
    if jagged:
        history, cu_seqlens = jagged_parts(history, "history")
    elif lengths is not None:
        if not isinstance(history, torch.Tensor) or history.is_nested or history.dim() != 2:
            got = (tuple(history.shape) if isinstance(history, torch.Tensor)
                   and not history.is_nested else type(history).__name__)
            raise ValueError(f"lengths go with a packed history [total, kv_embed_dim], got "
                             f"{got} (a padded history takes seqlens)")
        cu_seqlens = offsets_from_lengths(lengths, "lengths")
    return candidate, history, seqlens, cu_seqlens, candidate_offsets


def _segments(x, offsets, lengths, name: str):
    """(rows, offsets or None) of one operand: a jagged tensor, or rows with offsets or
    lengths (or neither)."""
    if is_jagged(x) or _is_keyed(x):
        if offsets is not None or lengths is not None:
            raise ValueError(f"{name} is jagged and carries its own offsets: pass no "
                             f"{name}_offsets / {name}_lengths with it")
        return jagged_parts(x, name)
    if offsets is not None and lengths is not None:
        raise ValueError(f"pass one of {name}_offsets or {name}_lengths, not both")
    if lengths is not None:
        offsets = offsets_from_lengths(lengths, f"{name}_lengths")
    return x, offsets


def fused_attn_small_seq_jagged(
    q, k, v, *,
    max_seqlen_kv: int,
    q_offsets: Optional[torch.Tensor] = None,
    q_lengths: Optional[torch.Tensor] = None,
    kv_offsets: Optional[torch.Tensor] = None,
    kv_lengths: Optional[torch.Tensor] = None,
    max_seqlen_q: Optional[int] = None,
    **kwargs,
) -> Union[torch.Tensor, Tuple[torch.Tensor, ...]]:
    """:func:`rocm_attn.fused_attn_small_seq` (THD layout) on jagged operands.

    Parameters
    ----------
    q : ``[total_q, h_q, d]`` rows, or a jagged tensor with such values. Without offsets or
        lengths (neither q jagged nor ``q_offsets`` / ``q_lengths``), q is one row per segment
        (``[b, h_q, d]``, the one-query form).
    k, v : ``[total_kv, h_kv, d]`` rows, or jagged tensors with such values; the segments'
        keys come from ``kv_offsets`` / ``kv_lengths`` or from k's offsets (v's rows must
        follow the same offsets: its own are not read, which would need a host sync).
    max_seqlen_kv : host bound on every segment's key count (as in fused_attn_small_seq).
    q_offsets, kv_offsets : int32 or int64 ``[b+1]`` (FBGEMM's int64 offsets as they are).
    q_lengths, kv_lengths : int32 or int64 ``[b]``: offsets from them (int64, on the device).
    max_seqlen_q : host bound on every segment's query count when q is segmented (default:
        q's row count, always a valid bound; a tighter one lets the op size its work).
    **kwargs : fused_attn_small_seq's keyword arguments (softmax_scale, return_lse, backend,
        validate, ...).

    Returns what fused_attn_small_seq returns: out with q's rows (``[total_q, h_q, d]``), then
    lse / probs when asked for.
    """
    q, cu_q = _segments(q, q_offsets, q_lengths, "q")
    k, cu_kv = _segments(k, kv_offsets, kv_lengths, "kv")
    if is_jagged(v) or _is_keyed(v):
        v, _ = jagged_parts(v, "v")
    if not isinstance(cu_kv, torch.Tensor):
        raise ValueError("the keys' segments are needed: pass k as a jagged tensor, or "
                         "kv_offsets / kv_lengths")
    if cu_q is None:
        if max_seqlen_q not in (None, 1):
            raise ValueError(f"q without offsets or lengths is one row per segment; "
                             f"max_seqlen_q must be 1 or None, got {max_seqlen_q}")
        # the one-query form: the op reads q's rows as segments 0..b-1
        cu_q = torch.arange(cu_kv.shape[0], dtype=cu_kv.dtype, device=cu_kv.device)
        bound = 1
    else:
        rows = q.shape[0] if isinstance(q, torch.Tensor) else 0  # the op names a bad q
        # NOTE: at least 2: the op reads max_seqlen_q == 1 as its one-query form (q holds
        # exactly one row per segment), which segmented q need not be.
        bound = max(max_seqlen_q if max_seqlen_q is not None else rows, 2)
    return fused_attn_small_seq(q, k, v, cu_q, cu_kv, max_seqlen_q=bound,
                                max_seqlen_kv=max_seqlen_kv, **kwargs)
