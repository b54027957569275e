"""Reference attention for packed variable-length ("THD") tensors.

This module is the test oracle of the package and the plain-torch (CPU) path.
It favours clarity and exactness over speed: :func:`reference_attention` loops
over sequences on the host (it calls ``.tolist()`` on ``cu_seqlens``) and
computes in float64 by default. It is differentiable with autograd, so tests
can obtain reference gradients with ``torch.autograd.grad``.

Conventions (shared by the whole package)
-----------------------------------------
* THD layout: ``q [total_q, h_q, d]``, ``k, v [total_kv, h_kv, d]``,
  ``cu_seqlens_q / cu_seqlens_kv`` int32 ``[b + 1]``. ``h_q % h_kv == 0``;
  query head ``i`` uses kv head ``i // (h_q // h_kv)`` (GQA / MQA).
* Optional ``cu_seqlens_*_padded`` give where each sequence starts in memory;
  the valid tokens of sequence ``i`` are
  ``[cu_padded[i], cu_padded[i] + (cu[i+1] - cu[i]))``. Everything else is
  padding: never read, zero in the output, ``-inf`` in the LSE.
* LSE: natural log, shape ``[h_q, total_q]`` (head-major), float32 (float64
  when computing in float64).
* ``softmax_scale`` defaults to ``1 / sqrt(d)``.
* Mask types are Transformer Engine's (:data:`MASK_TYPES`). For a sequence
  with ``sq`` queries and ``skv`` keys, query ``i`` sits at kv position
  ``p = i`` for ``"causal"`` / ``"padding_causal"`` (top-left aligned) and
  ``p = i + (skv - sq)`` for every other type (bottom-right aligned).
  Causal: ``j <= p``. Window ``(left, right)`` (``-1`` = unbounded):
  ``p - left <= j <= p + right``, so it follows the mask's alignment as TE's
  does. Chunked (``chunk_size``): ``j // chunk_size == p // chunk_size``
  (chunks aligned to the start of the kv sequence). All active constraints
  are intersected. With ``sq == skv`` both alignments agree.
* A query row with no allowed key gets a zero output and ``LSE = -inf``, never
  NaN.
"""

from __future__ import annotations

from typing import List, NamedTuple, Optional, Sequence, Tuple

import torch

from ._checks import (check_chunk_size, check_cu, check_same_b, check_softmax_scale,
                      check_window, is_int)

__all__ = [
    "MASK_TYPES",
    "normalize_mask_type",
    "attention_mask",
    "reference_attention",
    "reference_max_logit",
    "reference_small_seq",
    "top_left",
]

# Transformer Engine's mask types -> whether the mask is causal. The "padding"
# variants equal their base in THD (lengths are explicit). "causal" and
# "padding_causal" are top-left aligned, the others bottom-right
# (:func:`top_left`).
MASK_TYPES = {
    "no_mask": False,
    "padding": False,
    "causal": True,
    "padding_causal": True,
    "causal_bottom_right": True,
    "padding_causal_bottom_right": True,
}


# --------------------------------------------------------------------------
# argument validation
# --------------------------------------------------------------------------


def normalize_mask_type(attn_mask_type: str) -> bool:
    """Validate ``attn_mask_type`` and return whether it is causal.

    Parameters
    ----------
    attn_mask_type : str
        One of :data:`MASK_TYPES`.

    Returns
    -------
    bool
        ``True`` for the causal variants.

    Raises
    ------
    ValueError
        For an unknown mask type.
    """
    if not isinstance(attn_mask_type, str) or attn_mask_type not in MASK_TYPES:
        raise ValueError(
            f"attn_mask_type must be one of {sorted(MASK_TYPES)}, got {attn_mask_type!r}"
        )
    return MASK_TYPES[attn_mask_type]


def top_left(attn_mask_type: str) -> bool:
    """Whether ``attn_mask_type`` aligns the mask (and the window) top-left: ``"causal"`` and
    ``"padding_causal"``, as in Transformer Engine; every other type is bottom-right aligned."""
    normalize_mask_type(attn_mask_type)
    return attn_mask_type in ("causal", "padding_causal")


# --------------------------------------------------------------------------
# masks
# --------------------------------------------------------------------------


def attention_mask(
    sq: int,
    skv: int,
    attn_mask_type: str = "causal",
    window_size: Sequence[int] = (-1, -1),
    chunk_size: Optional[int] = None,
    device: Optional[torch.device] = None,
) -> torch.Tensor:
    """Dense boolean mask of one sequence (``True`` = may attend).

    Parameters
    ----------
    sq, skv : int
        Number of query and key tokens of the sequence.
    attn_mask_type : str
        One of :data:`MASK_TYPES`. Query ``i`` sits at ``p = i`` for
        ``"causal"`` / ``"padding_causal"`` (top-left) and at
        ``p = i + (skv - sq)`` otherwise (bottom-right); causal: ``j <= p``.
    window_size : (int, int)
        Sliding window ``(left, right)``, ``-1`` = unbounded:
        ``p - left <= j <= p + right``.
    chunk_size : int, optional
        Chunked attention: ``j // chunk_size == p // chunk_size``.
    device : torch.device, optional
        Device of the returned mask.

    Returns
    -------
    torch.BoolTensor
        ``[sq, skv]``.
    """
    causal = normalize_mask_type(attn_mask_type)
    left, right = check_window(window_size)
    chunk = check_chunk_size(chunk_size)
    if not is_int(sq) or not is_int(skv) or sq < 0 or skv < 0:
        raise ValueError(f"sq and skv must be non-negative ints, got sq={sq!r}, skv={skv!r}")
    shift = 0 if top_left(attn_mask_type) else skv - sq
    pos = torch.arange(sq, device=device, dtype=torch.int64).unsqueeze(1) + shift
    j = torch.arange(skv, device=device, dtype=torch.int64).unsqueeze(0)
    mask = torch.ones(sq, skv, dtype=torch.bool, device=device)
    if causal:
        mask &= j <= pos
    if left >= 0:
        mask &= j >= pos - left
    if right >= 0:
        mask &= j <= pos + right
    if chunk is not None:
        # floor division: a negative position (sq > skv) lands in a chunk
        # before the first key, so it sees nothing.
        mask &= torch.div(j, chunk, rounding_mode="floor") == torch.div(
            pos, chunk, rounding_mode="floor"
        )
    return mask


# --------------------------------------------------------------------------
# softmax helper
# --------------------------------------------------------------------------


def _safe_softmax_lse(scores: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """Softmax and logsumexp over the last dim, where masked entries are -inf.

    Rows that are entirely -inf give probabilities 0 and LSE -inf, and the
    backward produces no NaN (every division / log is guarded).
    """
    m = scores.amax(dim=-1, keepdim=True)
    # The shift is a constant of the softmax: detaching it is exact.
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m)).detach()
    e = torch.exp(scores - m)
    s = e.sum(dim=-1, keepdim=True)
    nonempty = s > 0
    s_safe = torch.where(nonempty, s, torch.ones_like(s))
    p = e / s_safe
    lse = torch.where(
        nonempty, torch.log(s_safe) + m, torch.full_like(s, float("-inf"))
    ).squeeze(-1)
    return p, lse


# --------------------------------------------------------------------------
# THD reference
# --------------------------------------------------------------------------


def _seq_bounds(
    name: str,
    lens: List[int],
    cu: List[int],
    cu_padded: Optional[List[int]],
    total: int,
) -> List[int]:
    """Start offsets of every sequence, with bounds checks."""
    if any(n < 0 for n in lens):
        raise ValueError(f"cu_seqlens_{name} must be non-decreasing")
    if cu_padded is None:
        starts = cu[:-1]
        if cu and (cu[0] < 0 or cu[-1] > total):
            raise ValueError(
                f"cu_seqlens_{name} spans [{cu[0]}, {cu[-1]}) but the {name} tensor has "
                f"{total} tokens"
            )
        return starts
    starts = cu_padded[:-1]
    for i, n in enumerate(lens):
        if cu_padded[i] < 0 or cu_padded[i] + n > cu_padded[i + 1]:
            raise ValueError(
                f"cu_seqlens_{name}_padded: sequence {i} has {n} valid tokens but a padded "
                f"slot [{cu_padded[i]}, {cu_padded[i + 1]})"
            )
    if cu_padded and cu_padded[-1] > total:
        raise ValueError(
            f"cu_seqlens_{name}_padded ends at {cu_padded[-1]} but the {name} tensor has "
            f"{total} tokens"
        )
    return starts


class _Segments(NamedTuple):
    """A THD call's checked arguments and its sequences' lengths and memory starts."""

    window: Tuple[int, int]
    chunk: Optional[int]
    scale: float
    lens_q: List[int]
    lens_kv: List[int]
    starts_q: List[int]
    starts_kv: List[int]


def _segments(q, k, v, cu_seqlens_q, cu_seqlens_kv, attn_mask_type, window_size, chunk_size,
              softmax_scale, cu_seqlens_q_padded, cu_seqlens_kv_padded) -> _Segments:
    """The argument checks shared by :func:`reference_attention` and
    :func:`reference_max_logit` (``v`` None: no values), then the sequences' bounds (one host
    read of the offsets)."""
    normalize_mask_type(attn_mask_type)
    window = check_window(window_size)
    chunk = check_chunk_size(chunk_size)
    named = (("q", q), ("k", k)) + ((("v", v),) if v is not None else ())
    for name, t in named:
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 3:
            raise ValueError(f"{name} must have rank 3 [tokens, heads, dim], got shape {tuple(t.shape)}")
        if not t.dtype.is_floating_point:
            raise ValueError(f"{name} must be floating point, got {t.dtype}")
    if v is not None and k.shape != v.shape:
        raise ValueError(f"k and v must have the same shape, got k {tuple(k.shape)} and v {tuple(v.shape)}")
    if q.shape[2] != k.shape[2]:
        raise ValueError(f"head dims mismatched: q has d={q.shape[2]}, k/v have d={k.shape[2]}")
    if len({t.dtype for _, t in named}) != 1:
        raise ValueError(f"q, k, v must share a dtype, got {', '.join(str(t.dtype) for _, t in named)}")
    if len({t.device for _, t in named}) != 1:
        raise ValueError(f"q, k, v must be on one device, got {', '.join(str(t.device) for _, t in named)}")
    total_q, h_q, d = q.shape
    total_kv, h_kv, _ = k.shape
    if h_kv == 0 or h_q % h_kv != 0:
        raise ValueError(f"h_q ({h_q}) must be a multiple of h_kv ({h_kv})")
    check_cu("cu_seqlens_q", cu_seqlens_q)
    check_cu("cu_seqlens_kv", cu_seqlens_kv)
    if cu_seqlens_q.numel() != cu_seqlens_kv.numel():
        raise ValueError(
            "cu_seqlens_q and cu_seqlens_kv must have the same batch size, got "
            f"{cu_seqlens_q.numel() - 1} and {cu_seqlens_kv.numel() - 1}"
        )
    for name, cp in (("cu_seqlens_q_padded", cu_seqlens_q_padded), ("cu_seqlens_kv_padded", cu_seqlens_kv_padded)):
        if cp is not None:
            check_cu(name, cp)
            check_same_b(name, cp, "cu_seqlens_q", cu_seqlens_q)
    scale = check_softmax_scale(softmax_scale, d)
    cu_q = cu_seqlens_q.tolist()
    cu_kv = cu_seqlens_kv.tolist()
    lens_q = [cu_q[i + 1] - cu_q[i] for i in range(len(cu_q) - 1)]
    lens_kv = [cu_kv[i + 1] - cu_kv[i] for i in range(len(cu_kv) - 1)]
    starts_q = _seq_bounds(
        "q", lens_q, cu_q, None if cu_seqlens_q_padded is None else cu_seqlens_q_padded.tolist(), total_q
    )
    starts_kv = _seq_bounds(
        "kv", lens_kv, cu_kv, None if cu_seqlens_kv_padded is None else cu_seqlens_kv_padded.tolist(), total_kv
    )
    return _Segments(window, chunk, scale, lens_q, lens_kv, starts_q, starts_kv)


def reference_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_kv: torch.Tensor,
    attn_mask_type: str = "causal",
    window_size: Sequence[int] = (-1, -1),
    chunk_size: Optional[int] = None,
    softmax_scale: Optional[float] = None,
    cu_seqlens_q_padded: Optional[torch.Tensor] = None,
    cu_seqlens_kv_padded: Optional[torch.Tensor] = None,
    compute_dtype: torch.dtype = torch.float64,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Exact attention over THD sequences (host loop over sequences).

    Parameters
    ----------
    q : torch.Tensor
        ``[total_q, h_q, d]``. Any strides.
    k, v : torch.Tensor
        ``[total_kv, h_kv, d]``, ``h_q % h_kv == 0``.
    cu_seqlens_q, cu_seqlens_kv : torch.Tensor
        int32 ``[b + 1]``, cumulative sequence lengths.
    attn_mask_type : str
        One of :data:`MASK_TYPES` (``"causal"`` top-left aligned,
        ``"causal_bottom_right"`` bottom-right; see :func:`attention_mask`).
    window_size : (int, int)
        Sliding window ``(left, right)``, ``-1`` = unbounded.
    chunk_size : int, optional
        Chunked attention (Llama-4 style), chunks aligned to the kv start.
    softmax_scale : float, optional
        Defaults to ``1 / sqrt(d)``.
    cu_seqlens_q_padded, cu_seqlens_kv_padded : torch.Tensor, optional
        int32 ``[b + 1]``: where each sequence starts in memory; padding
        tokens are never read.
    compute_dtype : torch.dtype
        Precision of the computation (default float64).

    Returns
    -------
    out : torch.Tensor
        ``[total_q, h_q, d]`` in ``q.dtype``; zero at padding rows and at
        rows with no allowed key.
    lse : torch.Tensor
        ``[h_q, total_q]``, natural log; float64 if ``compute_dtype`` is
        float64, else float32; ``-inf`` at padding rows and rows with no
        allowed key.

    Raises
    ------
    ValueError
        On inconsistent shapes, dtypes or arguments.
    """
    if not isinstance(compute_dtype, torch.dtype) or not compute_dtype.is_floating_point:
        raise ValueError(f"compute_dtype must be a floating torch.dtype, got {compute_dtype!r}")
    segs = _segments(q, k, v, cu_seqlens_q, cu_seqlens_kv, attn_mask_type, window_size,
                     chunk_size, softmax_scale, cu_seqlens_q_padded, cu_seqlens_kv_padded)
    total_q, h_q, d = q.shape
    h_kv = k.shape[1]
    window, chunk, softmax_scale = segs.window, segs.chunk, segs.scale
    lens_q, lens_kv, starts_q, starts_kv = segs.lens_q, segs.lens_kv, segs.starts_q, segs.starts_kv

    lse_dtype = torch.float64 if compute_dtype == torch.float64 else torch.float32
    group = h_q // h_kv
    qc = q.to(compute_dtype)
    kc = k.to(compute_dtype)
    vc = v.to(compute_dtype)

    rows: List[torch.Tensor] = []
    outs: List[torch.Tensor] = []
    lses: List[torch.Tensor] = []
    for i in range(len(lens_q)):
        sq, skv = lens_q[i], lens_kv[i]
        if sq == 0 or skv == 0:
            continue  # rows stay zero / -inf
        q_s = qc[starts_q[i] : starts_q[i] + sq].reshape(sq, h_kv, group, d)
        k_s = kc[starts_kv[i] : starts_kv[i] + skv]
        v_s = vc[starts_kv[i] : starts_kv[i] + skv]
        scores = torch.einsum("ikgd,jkd->kgij", q_s, k_s).reshape(h_q, sq, skv) * softmax_scale
        mask = attention_mask(sq, skv, attn_mask_type, window, chunk, device=q.device)
        scores = scores.masked_fill(~mask, float("-inf"))
        p, lse_s = _safe_softmax_lse(scores)  # [h_q, sq, skv], [h_q, sq]
        o_s = torch.einsum("kgij,jkd->ikgd", p.reshape(h_kv, group, sq, skv), v_s).reshape(sq, h_q, d)
        rows.append(torch.arange(starts_q[i], starts_q[i] + sq, device=q.device))
        outs.append(o_s)
        lses.append(lse_s)

    out = torch.zeros(total_q, h_q, d, dtype=compute_dtype, device=q.device)
    lse = torch.full((h_q, total_q), float("-inf"), dtype=compute_dtype, device=q.device)
    if rows:
        idx = torch.cat(rows)
        out = out.index_copy(0, idx, torch.cat(outs, dim=0))
        lse = lse.index_copy(1, idx, torch.cat(lses, dim=1))
    return out.to(q.dtype), lse.to(lse_dtype)


def reference_max_logit(
    q: torch.Tensor,
    k: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_kv: torch.Tensor,
    attn_mask_type: str = "causal",
    window_size: Sequence[int] = (-1, -1),
    chunk_size: Optional[int] = None,
    softmax_scale: Optional[float] = None,
    cu_seqlens_q_padded: Optional[torch.Tensor] = None,
    cu_seqlens_kv_padded: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """Per-head maximum of the scaled logits ``softmax_scale * q_i . k_j`` over the (query, key)
    pairs the mask allows, in float64 (the oracle of ``return_max_logit``). Same arguments and
    conventions as :func:`reference_attention`; padding rows are never read.

    Returns
    -------
    torch.Tensor
        float64 ``[h_q]``; ``-inf`` for a head with no allowed pair.
    """
    segs = _segments(q, k, None, cu_seqlens_q, cu_seqlens_kv, attn_mask_type, window_size,
                     chunk_size, softmax_scale, cu_seqlens_q_padded, cu_seqlens_kv_padded)
    h_q, d = q.shape[1], q.shape[2]
    h_kv = k.shape[1]
    window, chunk, scale = segs.window, segs.chunk, segs.scale
    lens_q, lens_kv, starts_q, starts_kv = segs.lens_q, segs.lens_kv, segs.starts_q, segs.starts_kv
    group = h_q // h_kv
    best = torch.full((h_q,), float("-inf"), dtype=torch.float64, device=q.device)
    for i, (sq, skv) in enumerate(zip(lens_q, lens_kv)):
        if sq == 0 or skv == 0:
            continue
        q_s = q[starts_q[i]:starts_q[i] + sq].double().reshape(sq, h_kv, group, d)
        k_s = k[starts_kv[i]:starts_kv[i] + skv].double()
        scores = torch.einsum("ikgd,jkd->kgij", q_s, k_s).reshape(h_q, sq, skv) * scale
        mask = attention_mask(sq, skv, attn_mask_type, window, chunk, device=q.device)
        scores = scores.masked_fill(~mask, float("-inf"))
        best = torch.maximum(best, scores.amax(dim=(1, 2)))
    return best


# --------------------------------------------------------------------------
# small-seq reference (padded form)
# --------------------------------------------------------------------------


def reference_small_seq(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    seqlens_kv: torch.Tensor,
    softmax_scale: Optional[float] = None,
    compute_dtype: torch.dtype = torch.float64,
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One query token per segment attending to its padded keys (vectorised).

    Computed in ``compute_dtype`` (float64 for the test oracle, float32 for the
    CPU path of ``fused_attn_small_seq``), with no host loop and no host-device
    sync.

    Parameters
    ----------
    q : torch.Tensor
        ``[b, h_q, d]``.
    k, v : torch.Tensor
        ``[b, s_max, h_kv, d]``, ``h_q % h_kv == 0``.
    seqlens_kv : torch.Tensor
        Integer ``[b]``: segment ``i`` attends to keys ``[0, seqlens_kv[i])``.
    softmax_scale : float, optional
        Defaults to ``1 / sqrt(d)``.

    Returns
    -------
    out : torch.Tensor
        ``[b, h_q, d]`` in ``q.dtype``; zero for segments of length 0.
    lse : torch.Tensor
        float32 ``[h_q, b]``; ``-inf`` for segments of length 0.
    probs : torch.Tensor
        float32 ``[b, h_q, s_max]``; zero beyond each segment's length.

    Notes
    -----
    A segment whose length lies outside ``[0, s_max]`` breaks the contract:
    its ``out``, ``lse`` and ``probs`` are NaN (checking it on the host would
    need a device sync).
    """
    for name, t, r in (("q", q, 3), ("k", k, 4), ("v", v, 4)):
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != r:
            raise ValueError(f"{name} must have rank {r}, got shape {tuple(t.shape)}")
        if not t.dtype.is_floating_point:
            raise ValueError(f"{name} must be floating point, got {t.dtype}")
    if k.shape != v.shape:
        raise ValueError(f"k and v must have the same shape, got k {tuple(k.shape)} and v {tuple(v.shape)}")
    b, h_q, d = q.shape
    if k.shape[0] != b:
        raise ValueError(f"k/v batch ({k.shape[0]}) must equal q batch ({b})")
    if k.shape[3] != d:
        raise ValueError(f"head dims mismatched: q has d={d}, k/v have d={k.shape[3]}")
    s_max, h_kv = k.shape[1], k.shape[2]
    if h_kv == 0 or h_q % h_kv != 0:
        raise ValueError(f"h_q ({h_q}) must be a multiple of h_kv ({h_kv})")
    if not isinstance(seqlens_kv, torch.Tensor) or seqlens_kv.dim() != 1 or seqlens_kv.numel() != b:
        raise ValueError(f"seqlens_kv must be a 1-D tensor of {b} lengths")
    if seqlens_kv.dtype.is_floating_point or seqlens_kv.dtype == torch.bool or seqlens_kv.is_complex():
        raise ValueError(f"seqlens_kv must have an integer dtype, got {seqlens_kv.dtype}")
    softmax_scale = check_softmax_scale(softmax_scale, d)
    group = h_q // h_kv

    qd = q.to(compute_dtype).reshape(b, h_kv, group, d)
    kd = k.to(compute_dtype)
    vd = v.to(compute_dtype)
    lens = seqlens_kv.to(device=q.device, dtype=torch.int64)
    valid = (lens >= 0) & (lens <= s_max)  # [b]
    keymask = torch.arange(s_max, device=q.device).unsqueeze(0) < lens.unsqueeze(1)  # [b, s]
    scores = torch.einsum("bkgd,bskd->bkgs", qd, kd).reshape(b, h_q, s_max) * softmax_scale
    scores = scores.masked_fill(~keymask.unsqueeze(1), float("-inf"))
    # keys/values beyond a segment's length are never read (they may hold junk)
    vd = torch.where(keymask.view(b, s_max, 1, 1), vd, torch.zeros_like(vd))
    if s_max > 0:
        p, lse = _safe_softmax_lse(scores)  # [b, h_q, s], [b, h_q]
    else:
        p = scores
        lse = torch.full((b, h_q), float("-inf"), dtype=compute_dtype, device=q.device)
    out = torch.einsum("bkgs,bskd->bkgd", p.reshape(b, h_kv, group, s_max), vd).reshape(b, h_q, d)
    nan = float("nan")
    out = torch.where(valid.view(b, 1, 1), out, torch.full_like(out, nan))
    lse = torch.where(valid.view(b, 1), lse, torch.full_like(lse, nan))
    p = torch.where(valid.view(b, 1, 1), p, torch.full_like(p, nan))
    return out.to(q.dtype), lse.t().to(torch.float32), p.to(torch.float32)
