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

Backends that run torch's flash kernels (``torch_flash``) use the **sharpened-LSE pass**
instead (:func:`sharpened_step_max_logit`), about one flash forward: the same flash call as
the step (same sub-sequences, mask, window: right by construction) once more with
``softmax_scale * T``, reading only its LSE. Row ``i`` with ``n_i`` visible keys and maximum
scaled logit ``m_i`` has ``LSE_T(i) = T * m_i + ln(sum_j exp(T * (s_ij - m_i)))`` and the sum
lies in ``[1, n_i]``, so

    ``m_i <= LSE_T(i) / T <= m_i + ln(n_i) / T``

and ``max_logit[h] = max_i LSE_T(i) / T`` over the rows that see a key
(:func:`max_logit_from_sharpened_lse`). Flash subtracts the running maximum in float32, so a
large scale does not overflow the exponentials; in float32 the LSE and the division (exact:
``T`` is a power of two) add about ``|m| * 2^-23``. Error bound, over-estimate only (besides
rounding): ``ln(max_seqlen_kv) / T + 4 * |m| * 2^-24`` (:func:`sharpened_error_bound`). ``T``
(:data:`TEMPERATURE`, ``2^16``) is bounded above because the kernels compute
``exp2(x * c - fl(m * c))`` with ``c = scale * T * log2(e)``: the rounding residual of
``fl(m * c)``, half an ulp, is exponentiated, and once ``|m| * c`` passes ~``2^30`` the row's
sum overflows. With ``T = 2^16`` that is ``|max logit|`` above ~11,000, where the pass returns
``+inf`` (loud, never an under-estimate); below it the ``ln(n) / T`` term is at most
``1.8e-4`` for 131,072 keys and ``3.3e-4`` for ``2^31``.
"""

from __future__ import annotations

import math
from typing import Optional, Tuple

import torch

from .meta import StepMeta

__all__ = ["BLOCK_Q", "BLOCK_KV", "TEMPERATURE", "step_max_logit", "segments_max_logit",
           "combine", "max_logit_from_sharpened_lse", "rows_with_keys",
           "sharpened_step_max_logit", "sharpened_error_bound", "call_max_logit"]

BLOCK_Q = 64
BLOCK_KV = 256
# score elements (float32) one batch of query blocks may form at once: bounds the pass's memory
_SCORES_PER_BATCH = 1 << 26
_INF = 1 << 40
# the sharpening temperature of the flash pass: a power of two (dividing by it is exact); see
# the module docstring for the bound it sets (ln(n) / T) and the overflow limit (|m| ~ 2^30 / T)
TEMPERATURE = 2.0 ** 16


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


def max_logit_from_sharpened_lse(lse_t: torch.Tensor, has_keys: torch.Tensor,
                                 temperature: float = TEMPERATURE) -> torch.Tensor:
    """float32 ``[h]`` max logit from an LSE at ``softmax_scale * temperature``: ``lse_t``
    ``[h, rows]``, ``has_keys`` bool ``[rows]`` the rows that see at least one key (others,
    padding and garbage included, are ignored). ``max_rows lse_t / temperature``; ``-inf`` with
    no such row; a non-finite LSE at a row with keys (overflow) propagates (``+inf`` / NaN)."""
    if lse_t.dim() != 2 or has_keys.shape != lse_t.shape[1:]:
        raise ValueError(f"lse_t must be [h, rows] and has_keys [rows], got "
                         f"{tuple(lse_t.shape)} and {tuple(has_keys.shape)}")
    x = lse_t.float() / temperature
    x = torch.where(has_keys.unsqueeze(0), x, torch.full_like(x, float("-inf")))
    if x.shape[1] == 0:
        return x.new_full((x.shape[0],), float("-inf"))
    return x.amax(dim=1)


def sharpened_error_bound(max_seqlen_kv: int, max_abs_logit: float,
                          temperature: float = TEMPERATURE) -> float:
    """Bound of ``|sharpened - exact|`` for rows of at most ``max_seqlen_kv`` keys and logits of
    at most ``max_abs_logit`` in magnitude (float32 LSE: ``4 * |m| * 2^-24``, ``ln(n) / T``);
    not counting the scores' own rounding, which the call's forward shares."""
    return math.log(max(max_seqlen_kv, 1)) / temperature + 4 * max_abs_logit * 2.0 ** -24


def rows_with_keys(cu_q: torch.Tensor, cu_kv: torch.Tensor, rows: int, causal: bool,
                   window: Tuple[int, int]) -> torch.Tensor:
    """bool ``[rows]``: the packed rows (sub-sequence ``i`` at ``[cu_q[i], cu_q[i+1])``) that
    see at least one key under a bottom-right mask (query ``r`` at ``p = r + n_kv - n_q``,
    keys ``max(0, p - left) <= j <= min(n_kv - 1, p + right)``, ``right`` 0 when causal). On
    the device, no sync; rows past ``cu_q[-1]`` are False."""
    c = cu_q.long()
    m = c.numel() - 1
    d = torch.arange(rows, device=cu_q.device)
    if m <= 0:
        return torch.zeros(rows, dtype=torch.bool, device=cu_q.device)
    seg = torch.searchsorted(c[1:].contiguous(), d, right=True)
    live = seg < m
    s = seg.clamp(max=m - 1)
    nq = (c[1:] - c[:-1])[s]
    nk = (cu_kv[1:] - cu_kv[:-1]).long()[s]
    p = d - c[s] + nk - nq
    left = _INF if window[0] < 0 else int(window[0])
    right = 0 if causal else (_INF if window[1] < 0 else int(window[1]))
    lo = (p - left).clamp(min=0)
    hi = torch.minimum(p + right, nk - 1)
    return live & (hi >= lo)


def sharpened_step_max_logit(backend, q: torch.Tensor, k: torch.Tensor, meta: StepMeta,
                             scale: float) -> torch.Tensor:
    """float32 ``[h_q]`` max logit of one call from the backend's own flash call at
    ``scale * TEMPERATURE`` (``backend.packed_lse``)."""
    lse_t = backend.packed_lse(q, k, meta, scale * TEMPERATURE)
    keys = rows_with_keys(meta.cu_seqlens_q, meta.cu_seqlens_kv, lse_t.shape[1],
                          meta.attn_mask_type == "causal", tuple(meta.window_size))
    return max_logit_from_sharpened_lse(lse_t, keys)


def call_max_logit(backend, q: torch.Tensor, k: torch.Tensor, meta: StepMeta, scale: float,
                   square: bool = False) -> torch.Tensor:
    """float32 ``[h_q]`` max logit of one call of ``backend``: the sharpened-LSE pass where the
    backend runs flash kernels (it has ``packed_lse``), else the exact blocked pass
    (:func:`step_max_logit`; ``square`` as there)."""
    if getattr(backend, "packed_lse", None) is not None:
        return sharpened_step_max_logit(backend, q, k, meta, scale)
    return step_max_logit(q, k, meta, scale, square)
