"""A CPU emulator of ``aten._flash_attention_forward`` / ``_backward`` (varlen), for tests.

It reproduces what the aten wrapper and the flash-attention 2 kernels do with the arguments
(read from PyTorch's ``aten/src/ATen/native/transformers/cuda/flash_attn/flash_api.cpp`` and
the kernels' masking), so the ``torch_flash`` backend's packing, window and LSE handling can be
tested without a GPU:

* ``max_seqlen_q == 1``: ``is_causal`` is dropped; with GQA and no window the wrapper then
  takes a non-varlen path (the emulator refuses it: the backend must never get there).
* ``is_causal`` sets ``window_size_right = 0``; a window ``>= max_seqlen_k`` becomes ``-1``;
  then ``(-1, r >= 0) -> (max_seqlen_k, r)`` and ``(l >= 0, -1) -> (l, max_seqlen_k)``.
* per sub-sequence (``sq``, ``sk`` from cu_seqlens) query ``i`` sees keys
  ``[max(0, i + sk - sq - wl), min(sk, i + 1 + sk - sq + wr))`` when a window is active.
* a row without keys: output 0, LSE ``+inf``; rows past ``cu_seqlens_q[-1]`` (and dk / dv rows
  past ``cu_seqlens_k[-1]``) are left uninitialised: NaN here.
* the grids cover ``max_seqlen_q`` rows (forward, dq) / ``max_seqlen_k`` rows (dk, dv) of every
  sub-sequence: a longer one is allowed only without keys (forward) / without queries (dk, dv),
  i.e. a dummy; its rows past the bound stay uninitialised (NaN here), the rest are zero.
* ``cu_seqlens`` must be non-decreasing (asserted).
* a real sub-sequence longer than the bounds asserts, unless ``LONG_SPANS_UNINITIALISED`` is
  set (the flash route of fused_attn_small_seq passes bad segments on): then its rows (and, in
  the backward, its keys) are left uninitialised, as rows the kernels' grids miss are.

Computation in the input dtype (use float64 for exact comparisons); LSE is float32 as in aten.
"""

from __future__ import annotations

import torch

NAN = float("nan")
LONG_SPANS_UNINITIALISED = False


def _too_long(sq, sk, max_q, max_k) -> bool:
    return LONG_SPANS_UNINITIALISED and (sq > max_q or sk > max_k)


def _windows(max_q, max_k, is_causal, wl, wr, h, h_k):
    wl = -1 if wl is None else wl
    wr = -1 if wr is None else wr
    if max_q == 1:
        is_causal = False
        if h > h_k and wl < 0 and wr < 0:
            raise NotImplementedError("emulator: the seqlenq_ngroups_swapped path (max_seqlen_q "
                                      "== 1, GQA, no window) is not varlen")
    if is_causal:
        wr = 0
    if wl >= max_k:
        wl = -1
    if wr >= max_k:
        wr = -1
    if wl < 0 and wr >= 0:
        wl = max_k
    if wl >= 0 and wr < 0:
        wr = max_k
    return wl, wr


def _mask(sq, sk, wl, wr):
    i = torch.arange(sq).unsqueeze(1)
    j = torch.arange(sk).unsqueeze(0)
    if wl < 0 and wr < 0:
        return torch.ones(sq, sk, dtype=torch.bool)
    return (j >= i + sk - sq - wl) & (j < i + 1 + sk - sq + wr)


def _spans(cu_q, cu_k):
    cq, ck = cu_q.tolist(), cu_k.tolist()
    assert len(cq) == len(ck), "cu_seqlens_q and cu_seqlens_k differ in length"
    assert all(a <= b for a, b in zip(cq, cq[1:])), "cu_seqlens_q decreases"
    assert all(a <= b for a, b in zip(ck, ck[1:])), "cu_seqlens_k decreases"
    return [(cq[b], cq[b + 1], ck[b], ck[b + 1]) for b in range(len(cq) - 1)]


def _scores(q, k, v, span, max_q, max_k, g, scale, wl, wr):
    """One real sub-sequence: its mask, K and V repeated over the GQA group, and the scaled
    scores ``[h, sq, sk]`` (unmasked)."""
    q0, q1, k0, k1 = span
    sq, sk = q1 - q0, k1 - k0
    assert sq <= max_q and sk <= max_k, "a sub-sequence exceeds max_seqlen"
    kk = k[k0:k1].repeat_interleave(g, dim=1)
    vv = v[k0:k1].repeat_interleave(g, dim=1)
    return _mask(sq, sk, wl, wr), kk, vv, torch.einsum("ihd,jhd->hij", q[q0:q1], kk) * scale


def flash_forward(q, k, v, cu_q, cu_k, max_q, max_k, dropout_p, is_causal, return_debug_mask,
                  *, scale=None, window_size_left=None, window_size_right=None, **_):
    assert dropout_p == 0.0 and not return_debug_mask
    h, h_k, d = q.shape[1], k.shape[1], q.shape[2]
    wl, wr = _windows(max_q, max_k, is_causal, window_size_left, window_size_right, h, h_k)
    scale = d ** -0.5 if scale is None else scale
    out = torch.full_like(q, NAN)
    lse = torch.full((h, q.shape[0]), NAN, dtype=torch.float32)
    g = h // h_k
    for q0, q1, k0, k1 in _spans(cu_q, cu_k):
        sq, sk = q1 - q0, k1 - k0
        if sq == 0 or _too_long(sq, sk, max_q, max_k):
            continue
        if sk == 0:  # no key: the kernel writes zeros and LSE +inf (rows its grid covers)
            out[q0:q0 + min(sq, max_q)] = 0
            lse[:, q0:q0 + min(sq, max_q)] = float("inf")
            continue
        # fp32 scores, softmax and LSE, as flash accumulates them (bf16 ones round the LSE to
        # 2^-5 near 4, past the tests' 2e-2 against the float64 oracle); out in q's dtype.
        m, kk, vv, s = _scores(q.float(), k.float(), v.float(), (q0, q1, k0, k1), max_q, max_k, g,
                               scale, wl, wr)
        s = s.masked_fill(~m, float("-inf"))
        mx = s.amax(-1, keepdim=True)
        mx = torch.where(torch.isfinite(mx), mx, torch.zeros_like(mx))
        e = torch.exp(s - mx)
        tot = e.sum(-1, keepdim=True)
        empty = tot == 0
        p = e / torch.where(empty, torch.ones_like(tot), tot)
        out[q0:q1] = torch.einsum("hij,jhd->ihd", p, vv).to(q.dtype)
        row_lse = torch.where(empty, torch.full_like(tot, float("inf")), torch.log(tot) + mx)
        lse[:, q0:q1] = row_lse.squeeze(-1)
    return out, lse, torch.zeros(2, dtype=torch.uint64), torch.empty(0), torch.empty(0)


def flash_backward(dout, q, k, v, out, lse, cu_q, cu_k, max_q, max_k, dropout_p, is_causal,
                   rng_state, unused, *, scale=None, window_size_left=None,
                   window_size_right=None, **_):
    assert dropout_p == 0.0
    h, h_k, d = q.shape[1], k.shape[1], q.shape[2]
    wl, wr = _windows(max_q, max_k, is_causal, window_size_left, window_size_right, h, h_k)
    scale = d ** -0.5 if scale is None else scale
    g = h // h_k
    dq = torch.full_like(q, NAN)
    dk = torch.full_like(k, NAN)
    dv = torch.full_like(v, NAN)
    for q0, q1, k0, k1 in _spans(cu_q, cu_k):
        sq, sk = q1 - q0, k1 - k0
        if _too_long(sq, sk, max_q, max_k):
            continue
        if sq == 0 or sk == 0:  # a dummy: zeros on the rows the grids cover
            dk[k0:k0 + min(sk, max_k)] = 0
            dv[k0:k0 + min(sk, max_k)] = 0
            dq[q0:q0 + min(sq, max_q)] = 0
            continue
        m, kk, vv, s = _scores(q, k, v, (q0, q1, k0, k1), max_q, max_k, g, scale, wl, wr)
        row_lse = lse[:, q0:q1].to(q.dtype).unsqueeze(-1)  # +inf rows: P = 0
        p = torch.exp(s - row_lse).masked_fill(~m, 0)
        do = dout[q0:q1]
        dd = (do * out[q0:q1]).sum(-1).t().unsqueeze(-1)  # [h, sq, 1]
        dp = torch.einsum("ihd,jhd->hij", do, vv)
        ds = p * (dp - dd)
        dq[q0:q1] = torch.einsum("hij,jhd->ihd", ds, kk) * scale
        dk_e = torch.einsum("hij,ihd->jhd", ds, q[q0:q1]) * scale
        dv_e = torch.einsum("hij,ihd->jhd", p, do)
        dk[k0:k1] = dk_e.reshape(sk, h_k, g, d).sum(2)
        dv[k0:k1] = dv_e.reshape(sk, h_k, g, d).sum(2)
    return dq, dk, dv
