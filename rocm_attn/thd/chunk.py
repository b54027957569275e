"""Chunked-attention metadata: split sequences into chunks (:func:`chunkify`), and the
sub-sequences of every ring step of causal (chunked) attention under dual-chunk sharding
(:func:`chunkify_diagonal` / ``_below`` / ``_above`` / ``_ring_step``).
Conventions: :mod:`rocm_attn.thd`."""

from __future__ import annotations

from typing import NamedTuple, Optional, Tuple

import torch

from .._checks import check_chunk_size, check_cu, check_int, is_int
from ..errors import validate_mode
from ._checks import check_cp_rank, chunk_or_no_chunk, check_values, validate_cu_values
from ._dispatch import impl, torch_path
from ._index import seq_of

__all__ = ["ChunkedStep", "max_chunks_bound", "chunkify", "ring_step", "chunkify_diagonal",
           "chunkify_below", "chunkify_above", "chunkify_ring_step"]


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
    check_int("total_tokens", total_tokens)
    check_int("num_seqs", num_seqs)
    if chunk_size is None:
        return min(total_tokens, num_seqs)
    cs = check_chunk_size(chunk_size, allow_none=False)
    return min(total_tokens, total_tokens // cs + (4 if dual_chunk else 1) * num_seqs)


@torch_path("chunkify")
def _torch_chunkify(cu_seqlens, chunk_size, max_chunks):
    c = cu_seqlens.long()
    lens = (c[1:] - c[:-1]).clamp_min(0)
    n = torch.div(lens + (chunk_size - 1), chunk_size, rounding_mode="floor")
    incl = torch.cumsum(n, 0)
    total = n.sum().reshape(1)
    excl_ext = torch.cat([incl - n, total])
    j = torch.arange(max_chunks + 1, device=c.device, dtype=torch.int64)
    seq = seq_of(torch.cat([c.new_zeros(1), incl]), j)
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
    check_cu("cu_seqlens", cu_seqlens, None)
    cs = check_chunk_size(chunk_size, allow_none=False)
    max_chunks = check_int("max_chunks", max_chunks)
    if check_values(validate, cu_seqlens):
        validate_cu_values("cu_seqlens", cu_seqlens)
        lens = (cu_seqlens[1:] - cu_seqlens[:-1]).long()
        need = int(torch.div(lens + cs - 1, cs, rounding_mode="floor").sum())
        if need > max_chunks:
            raise ValueError(f"max_chunks={max_chunks} is too small: the sequences split into "
                             f"{need} chunks of {cs} (see max_chunks_bound)")
    return impl("chunkify", cu_seqlens, backend)(cu_seqlens, cs, max_chunks)


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


@torch_path("chunkify_cp_step")
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
    s = seq_of(torch.cat([lp.new_zeros(1), incl]), j)  # sequence of slot j; b when trailing
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
    check_cu("cu_seqlens_padded", cu_seqlens_padded, None)
    cs = chunk_or_no_chunk(chunk_size)
    check_cp_rank(cp, rank)
    check_cp_rank(cp, kv_rank, "kv_rank")
    max_chunks = check_int("max_chunks", max_chunks)
    if kind == "diagonal" and kv_rank != rank:
        raise ValueError(f"the diagonal step has kv_rank == rank, got rank={rank}, "
                         f"kv_rank={kv_rank}")
    if kind == "below" and not kv_rank < rank:
        raise ValueError(f"a below step needs kv_rank < rank, got rank={rank}, kv_rank={kv_rank}")
    if kind == "above" and not kv_rank > rank:
        raise ValueError(f"an above step needs kv_rank > rank, got rank={rank}, kv_rank={kv_rank}")
    if kv_layout not in ("half", "full"):
        raise ValueError(f"kv_layout must be 'half' or 'full', got {kv_layout!r}")
    out = impl("chunkify_cp_step", cu_seqlens_padded, backend)(
        cu_seqlens_padded, cs, cp, rank, kv_rank, max_chunks, kind, kv_layout)
    if validate_mode(validate):
        validate_cu_values("cu_seqlens_padded", cu_seqlens_padded, None, 2,
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
    check_cp_rank(cp, rank)
    if not is_int(step) or not 0 <= step < cp:
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
