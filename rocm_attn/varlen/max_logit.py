"""``max_logit``: the per-head maximum of the scaled attention logits ``scale * q_i . k_j``
over the (query, key) pairs a call's mask allows (QK-Clip / MuonClip read it every step).

It cannot be derived from the LSE, and torch's flash kernels do not expose their scores, so
it is one extra pass per attention call over the same sub-sequences the call attends
(:class:`~rocm_attn.varlen.meta.StepMeta`: the pieces and bands a window or chunking cuts
the sequences into, or a ring step's halves), reduced with ``max`` over the calls and, under
context parallelism, over the group.

The pass is blocked and sync-free: the query rows of every sub-sequence are cut into blocks of
``BLOCK_Q`` rows (a host bound on their count from the call's row bound); every block reads
only the keys its rows can see (from its first row's left window edge to its last row's right
edge, causal bottom-right as in the call), ``BLOCK_KV`` keys at a time, for a host-known number
of iterations (the widest such range: ``BLOCK_Q + left + right`` with a finite window, else
``max_seqlen_kv``). Scores are formed in float32 from the inputs, masked per element (row and
key validity, causal, window) and max-reduced; padding rows and rows outside every
sub-sequence are never read. Not differentiable.
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch

from .meta import StepMeta

__all__ = ["BLOCK_Q", "BLOCK_KV", "step_max_logit", "segments_max_logit", "combine"]

BLOCK_Q = 64
BLOCK_KV = 256
# score elements (float32) one batch of query blocks may form at once: bounds the pass's memory
_SCORES_PER_BATCH = 1 << 26
_INF = 1 << 40


def combine(acc: Optional[torch.Tensor], part: torch.Tensor) -> torch.Tensor:
    """Elementwise max of two per-head maxima (``acc`` None: ``part``)."""
    return part if acc is None else torch.maximum(acc, part)


def step_max_logit(q: torch.Tensor, k: torch.Tensor, meta: StepMeta, scale: float
                   ) -> torch.Tensor:
    """float32 ``[h_q]`` max logit of one call: ``q`` / ``k`` the step tensors its
    ``cu_seqlens_*_padded`` starts index (both contracts of :class:`StepMeta`)."""
    q_len = (meta.cu_seqlens_q[1:] - meta.cu_seqlens_q[:-1]).long()
    kv_len = (meta.cu_seqlens_kv[1:] - meta.cu_seqlens_kv[:-1]).long()
    rows = meta.packed_q_rows if meta.packed_kv_rows is not None and meta.packed_q_rows \
        else q.shape[0]
    return segments_max_logit(
        q, k, meta.cu_seqlens_q_padded[:-1].long(), q_len, meta.cu_seqlens_kv_padded[:-1].long(),
        kv_len, causal=meta.attn_mask_type == "causal", window=tuple(meta.window_size),
        max_q=meta.max_seqlen_q, max_kv=meta.max_seqlen_kv, q_rows=rows, scale=scale)


def segments_max_logit(q: torch.Tensor, k: torch.Tensor, q_start: torch.Tensor,
                       q_len: torch.Tensor, kv_start: torch.Tensor, kv_len: torch.Tensor, *,
                       causal: bool, window: Tuple[int, int], max_q: int, max_kv: int,
                       q_rows: int, scale: float) -> torch.Tensor:
    """float32 ``[h_q]`` max logit over sub-sequences ``i``: queries
    ``q[q_start[i] : q_start[i] + q_len[i]]`` against keys ``k[kv_start[i] : + kv_len[i]]``,
    mask bottom-right aligned (query ``r`` at ``p = r + kv_len - q_len``; ``causal``:
    ``j <= p``; ``window`` ``(left, right)``, ``-1`` unbounded: ``p - left <= j <= p + right``).
    ``max_q`` / ``max_kv`` bound the lengths, ``q_rows`` their sum (host ints). ``-inf`` for a
    head with no allowed pair."""
    h_q, d = q.shape[1], q.shape[2]
    h_kv = k.shape[1]
    g = h_q // h_kv
    dev = q.device
    best = torch.full((h_q,), float("-inf"), dtype=torch.float32, device=dev)
    m = q_len.numel()
    if m == 0 or q.shape[0] == 0 or k.shape[0] == 0 or max_q <= 0 or max_kv <= 0:
        return best
    left = _INF if window[0] < 0 else int(window[0])
    right = 0 if causal else (_INF if window[1] < 0 else int(window[1]))
    bq, bk = BLOCK_Q, BLOCK_KV
    nb = torch.where((q_len > 0) & (kv_len > 0), (q_len + bq - 1) // bq, torch.zeros_like(q_len))
    n_blocks = max(1, min(q_rows // bq + m, m * (-(-max_q // bq))))
    width = max_kv if max(left, right) >= _INF else min(max_kv, bq + left + right)
    n_kv_iters = -(-width // bk)
    incl = torch.cumsum(nb, 0)
    per_batch = max(1, _SCORES_PER_BATCH // (h_q * bq * bk))
    ar_q = torch.arange(bq, device=dev)
    ar_k = torch.arange(bk, device=dev)
    qf = q.float() if q.dtype != torch.float64 else q
    for b0 in range(0, n_blocks, per_batch):
        blk = torch.arange(b0, min(n_blocks, b0 + per_batch), device=dev)
        seq = torch.searchsorted(incl, blk, right=True)
        live = seq < m
        s = seq.clamp(max=m - 1)
        a = blk - (incl - nb)[s]
        nq, nk = q_len[s], kv_len[s]
        off = nk - nq  # bottom-right: row r sits at r + off
        r = a.unsqueeze(1) * bq + ar_q  # [B, bq] rows of the sub-sequence
        row_ok = live.unsqueeze(1) & (r < nq.unsqueeze(1))
        q_idx = (q_start[s].unsqueeze(1) + r).clamp(0, q.shape[0] - 1)
        qb = qf[q_idx].reshape(blk.numel(), bq, h_kv, g, d)
        first_p = a * bq + off
        last_p = torch.minimum(a * bq + bq, nq) - 1 + off
        j_lo = (first_p - left).clamp(min=0)
        j_hi = torch.minimum(last_p + right, nk - 1)
        pos = (r + off.unsqueeze(1)).unsqueeze(-1)  # [B, bq, 1]
        for c in range(n_kv_iters):
            j = j_lo.unsqueeze(1) + c * bk + ar_k  # [B, bk]
            col_ok = j <= j_hi.unsqueeze(1)
            k_idx = (kv_start[s].unsqueeze(1) + j).clamp(0, k.shape[0] - 1)
            kb = k[k_idx]
            kb = kb.float() if kb.dtype != torch.float64 else kb
            # scaled before the max: a negative scale turns the order around
            sc = torch.einsum("bqhgd,bkhd->bhgqk", qb, kb) * scale
            jj = j.unsqueeze(1)  # [B, 1, bk]
            ok = row_ok.unsqueeze(-1) & col_ok.unsqueeze(1) & (jj >= pos - left) \
                & (jj <= pos + right)
            sc = sc.masked_fill(~ok.view(blk.numel(), 1, 1, bq, bk), float("-inf"))
            part = sc.amax(dim=(0, 3, 4)).reshape(h_q).float()
            best = torch.maximum(best, part)
    return best
