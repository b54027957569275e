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
edge, causal bottom-right as in the call), in tiles of ``BLOCK_KV`` keys. The (block, tile)
items are listed back to back on the device, so a block near the start of a causal sequence
forms only its few tiles; the list's length is a host bound (its shapes must be known without
reading device values): every block times the widest range's tiles (``BLOCK_Q + left + right``
keys with a finite window, else ``max_seqlen_kv``), or, where the caller knows that queries and
keys have equal lengths (self-attention: the tiles of a causal block stop at its diagonal),
the tiles of as many full-length triangles as the rows fill, about half. Scores are formed in
float32 from the inputs, masked per element (row and key validity, causal, window) and
max-reduced; padding rows and rows outside every sub-sequence are never read. Not
differentiable.
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


def step_max_logit(q: torch.Tensor, k: torch.Tensor, meta: StepMeta, scale: float,
                   square: bool = False) -> torch.Tensor:
    """float32 ``[h_q]`` max logit of one call: ``q`` / ``k`` the step tensors its
    ``cu_seqlens_*_padded`` starts index (both contracts of :class:`StepMeta`). ``square``:
    the caller knows that every sub-sequence of the call has as many queries as keys
    (:func:`segments_max_logit`)."""
    q_len = (meta.cu_seqlens_q[1:] - meta.cu_seqlens_q[:-1]).long()
    kv_len = (meta.cu_seqlens_kv[1:] - meta.cu_seqlens_kv[:-1]).long()
    rows = meta.packed_q_rows if meta.packed_kv_rows is not None and meta.packed_q_rows \
        else q.shape[0]
    return segments_max_logit(
        q, k, meta.cu_seqlens_q_padded[:-1].long(), q_len, meta.cu_seqlens_kv_padded[:-1].long(),
        kv_len, causal=meta.attn_mask_type == "causal", window=tuple(meta.window_size),
        max_q=meta.max_seqlen_q, max_kv=meta.max_seqlen_kv, q_rows=rows, scale=scale,
        square=square)


def _tile_bound(n_blocks: int, max_nb: int, n_kv_iters: int, right: int, square: bool) -> int:
    """Host bound of the (query block, key tile) items of a call: ``n_blocks * n_kv_iters``, or
    where every sub-sequence has as many queries as keys (``square``) and the right edge is
    finite (causal: ``right`` 0), block ``a`` of a sub-sequence reads at most
    ``(a + 1) * BLOCK_Q + right`` keys, so the sub-sequences' blocks need at most
    ``f(nb) = sum_{a < nb} min(ceil(((a + 1) * BLOCK_Q + right) / BLOCK_KV), n_kv_iters)``
    tiles. ``f`` is convex with ``f(0) = 0``, so over block counts of at most ``max_nb`` that
    sum to at most ``n_blocks`` the total is largest with as many full sub-sequences as fit."""
    dense = n_blocks * n_kv_iters
    if not square or right >= _INF:
        return dense

    def f(nb):
        return sum(min(-(-((a + 1) * BLOCK_Q + right) // BLOCK_KV), n_kv_iters)
                   for a in range(nb))

    return min(dense, (n_blocks // max_nb) * f(max_nb) + f(n_blocks % max_nb))


def segments_max_logit(q: torch.Tensor, k: torch.Tensor, q_start: torch.Tensor,
                       q_len: torch.Tensor, kv_start: torch.Tensor, kv_len: torch.Tensor, *,
                       causal: bool, window: Tuple[int, int], max_q: int, max_kv: int,
                       q_rows: int, scale: float, square: bool = False) -> torch.Tensor:
    """float32 ``[h_q]`` max logit over sub-sequences ``i``: queries
    ``q[q_start[i] : q_start[i] + q_len[i]]`` against keys ``k[kv_start[i] : + kv_len[i]]``,
    mask bottom-right aligned (query ``r`` at ``p = r + kv_len - q_len``; ``causal``:
    ``j <= p``; ``window`` ``(left, right)``, ``-1`` unbounded: ``p - left <= j <= p + right``).
    ``max_q`` / ``max_kv`` bound the lengths, ``q_rows`` their sum (host ints). ``square``: a
    promise that ``q_len == kv_len`` for every sub-sequence (self-attention), which bounds the
    key tiles of a causal call's blocks by their diagonal (:func:`_tile_bound`), so the fully
    masked tiles above it are never formed. ``-inf`` for a head with no allowed pair."""
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
    max_nb = -(-max_q // bq)
    n_blocks = max(1, min(q_rows // bq + m, m * max_nb))
    width = max_kv if max(left, right) >= _INF else min(max_kv, bq + left + right)
    n_kv_iters = -(-width // bk)
    n_items = max(1, _tile_bound(n_blocks, max_nb, n_kv_iters, right, square))
    # every query block: its sub-sequence, rows and the key range its rows can see
    incl = torch.cumsum(nb, 0)
    blk = torch.arange(n_blocks, device=dev)
    seq = torch.searchsorted(incl, blk, right=True)
    live = seq < m
    s = seq.clamp(max=m - 1)
    a = blk - (incl - nb)[s]
    nq, nk = q_len[s], kv_len[s]
    off = nk - nq  # bottom-right: row r sits at r + off
    first_p = a * bq + off
    last_p = torch.minimum(a * bq + bq, nq) - 1 + off
    j_lo = (first_p - left).clamp(min=0)
    j_hi = torch.minimum(last_p + right, nk - 1)
    # its key tiles, BLOCK_KV keys from j_lo on (none for a block that sees no key), and the
    # (block, tile) items back to back: a device list, its length bounded on the host
    tiles = torch.where(live & (j_hi >= j_lo), (j_hi - j_lo + bk) // bk, torch.zeros_like(j_lo))
    tiles_incl = torch.cumsum(tiles, 0)
    per_batch = max(1, _SCORES_PER_BATCH // (h_q * bq * bk))
    ar_q = torch.arange(bq, device=dev)
    ar_k = torch.arange(bk, device=dev)
    qf = q.float() if q.dtype != torch.float64 else q
    for i0 in range(0, n_items, per_batch):
        item = torch.arange(i0, min(n_items, i0 + per_batch), device=dev)
        n = item.numel()
        b = torch.searchsorted(tiles_incl, item, right=True)
        item_ok = b < n_blocks
        b = b.clamp(max=n_blocks - 1)
        c = item - (tiles_incl - tiles)[b]  # the item's tile of its block
        r = a[b].unsqueeze(1) * bq + ar_q  # [n, bq] rows of the sub-sequence
        row_ok = item_ok.unsqueeze(1) & (r < nq[b].unsqueeze(1))
        q_idx = (q_start[s[b]].unsqueeze(1) + r).clamp(0, q.shape[0] - 1)
        qb = qf[q_idx].reshape(n, bq, h_kv, g, d)
        j = j_lo[b].unsqueeze(1) + c.unsqueeze(1) * bk + ar_k  # [n, bk]
        col_ok = j <= j_hi[b].unsqueeze(1)
        k_idx = (kv_start[s[b]].unsqueeze(1) + j).clamp(0, k.shape[0] - 1)
        kb = k[k_idx]
        kb = kb.float() if kb.dtype != torch.float64 else kb
        # scaled before the max: a negative scale turns the order around
        sc = torch.einsum("bqhgd,bkhd->bhgqk", qb, kb) * scale
        pos = (r + off[b].unsqueeze(1)).unsqueeze(-1)  # [n, bq, 1]
        jj = j.unsqueeze(1)  # [n, 1, bk]
        ok = row_ok.unsqueeze(-1) & col_ok.unsqueeze(1) & (jj >= pos - left) \
            & (jj <= pos + right)
        sc = sc.masked_fill(~ok.view(n, 1, 1, bq, bk), float("-inf"))
        part = sc.amax(dim=(0, 3, 4)).reshape(h_q).float()
        best = torch.maximum(best, part)
    return best
