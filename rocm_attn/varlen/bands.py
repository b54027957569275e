"""Sliding windows and chunked attention as flash-expressible varlen pieces.

A flash-style varlen kernel masks every sub-sequence the same way: with ``sq`` queries and
``sk`` keys, query ``i`` sees key ``j`` iff ``i + sk - sq - wl <= j <= i + sk - sq + wr``
(bottom-right aligned; ``causal`` is ``wr = 0``), where ``(wl, wr)`` is **one** pair per call.
Context parallelism cuts every sequence into pieces whose offsets vary per sequence (chunk
sizes differ between sequences), so a window cannot be passed through unchanged. This module
cuts each (q segment x kv segment) rectangle of every sequence into at most three pieces
whose masks *are* one call-wide pair, by choosing per sequence which queries and which keys
each piece covers (the rectangles' offsets go into the per-sub-sequence ranges, never into the
call's window).

Coordinates
-----------
Everything is in **kv positions** of the (global, valid) sequence: a key at index ``j`` of its
sequence sits at ``j``; a query at index ``i`` of a sequence with ``n_q`` queries and ``n_kv``
keys sits at ``p = i + n_kv - n_q`` (bottom-right alignment, as in
:func:`rocm_attn.reference.attention_mask`). The mask is: ``p - L <= j <= p + R`` (``L`` / ``R``
the window, unbounded when ``-1``), ``j <= p`` when causal (so ``R = 0``), and with
``chunk_size = C``: ``j // C == p // C`` (all constraints intersect).

A :class:`Segment` is a run of consecutive positions of every sequence stored in consecutive
rows of a step tensor (a dual-chunk half, a whole sequence). Chunking first splits a rectangle
into per-chunk sub-rectangles (a query never sees another chunk); each sub-rectangle
``[q0, q1) x [k0, k1)`` then splits by rows:

* rows ``p < k1 - R`` (the right edge of their window falls inside the keys): piece ``diag``,
  keys ``[max(k0, r0 - L), r1 + R)`` for rows ``[r0, r1)``. The key range ends exactly ``R``
  after the last row, so the window is ``(L + R, 0)`` causal for every sequence.
* rows ``p >= k1 - R`` (they see up to the last key): keys ``[max(k0, p - L), k1)``. A window
  whose right edge is cut off by the keys cannot be bottom-right aligned with a call-wide
  offset, so they split into piece ``rev``: keys ``[max(k0, t0 - L), t1 - L)`` for rows
  ``[t0, t1)``, mask ``j >= i + sk - sq`` (window ``(0, -1)``: a square with its diagonal at the
  bottom-right corner, or that square cut on the left, which keeps the alignment), and piece
  ``full``: keys ``[max(k0, t1 - L), k1)``, seen by every one of those rows (no mask).
* when the sub-rectangle is *aligned* (its rows and keys end at the same position, e.g. a
  dual-chunk half with itself, or a whole sequence), one piece ``native`` covers it with the
  user's own window and causal flag (keys ``[max(k0, r0 - L), k1)``).

Cutting the keys on the left never changes a bottom-right mask, which is why every piece may
start its keys at ``max(k0, ...)``. Every (query, key) pair of the mask falls in exactly one
piece; rows that see nothing are in no piece; every row of a piece sees at least one key.

Which pieces a rectangle can have is known on the host from how its segments are ordered
(:data:`RELATIONS`), so calls that are always empty are never made.
"""

from __future__ import annotations

from typing import List, NamedTuple, Optional, Tuple

import torch

__all__ = [
    "INF",
    "MaskSpec",
    "Segment",
    "RELATIONS",
    "PIECES",
    "pieces_for",
    "piece_mask",
    "slot_bound",
    "pair_slots",
    "piece_ranges",
    "reachable",
]

# "unbounded" in position arithmetic: far beyond any position, far inside int64
INF = 1 << 40

# aligned: q and kv ranges of every sequence end at the same position
# before:  every key precedes every query (kv segment ends at or before the q segment starts)
# after:   every key follows every query
# whole:   the kv segment ends at or after the q segment's end (e.g. the whole kv sequence)
RELATIONS = ("aligned", "before", "after", "whole")
PIECES = ("native", "diag", "rev", "full")


class MaskSpec(NamedTuple):
    """The mask of a CP call, normalised: ``left`` / ``right`` None = unbounded (``-1`` in
    ``window_size``), ``right == 0`` when causal (causal ``j <= p`` absorbs any right window)."""

    causal: bool
    left: Optional[int]
    right: Optional[int]
    chunk: Optional[int]

    @staticmethod
    def make(causal: bool, window_size: Tuple[int, int], chunk_size: Optional[int]) -> "MaskSpec":
        left = None if window_size[0] < 0 else int(window_size[0])
        right = 0 if causal else (None if window_size[1] < 0 else int(window_size[1]))
        return MaskSpec(bool(causal), left, right, chunk_size)

    @property
    def plain(self) -> bool:
        """No window and no chunking: the masks of the core CP steps apply unchanged."""
        return self.left is None and (self.right is None or self.causal) and self.chunk is None

    def reach(self, side: str) -> Optional[int]:
        """Largest ``p - j`` (``side="left"``) or ``j - p`` (``"right"``) the mask allows; None
        when unbounded. Chunking bounds both by ``chunk_size - 1``."""
        w = self.left if side == "left" else self.right
        c = None if self.chunk is None else self.chunk - 1
        if w is None:
            return c
        return w if c is None else min(w, c)


class Segment(NamedTuple):
    """A run of positions of every sequence stored in consecutive rows (int64 ``[b]`` each)."""

    pos: torch.Tensor  # kv position of the segment's first row
    n: torch.Tensor  # valid rows (the segment's valid tokens are a prefix of it)
    row: torch.Tensor  # row of the first token in the step's tensor


def pieces_for(relation: str, spec: MaskSpec) -> List[str]:
    """Pieces a rectangle with this relation can have under ``spec`` (host-only decision)."""
    if relation == "aligned":
        return ["native"]
    if relation == "before":  # all rows past the keys: right edges never cut the keys
        return (["rev"] if spec.left is not None else []) + ["full"]
    if relation == "after":  # keys after all rows: the left edge never matters
        if spec.causal:
            return []
        return (["diag"] if spec.right is not None else []) + ["full"]
    if relation == "whole":
        if spec.causal:  # every row p < k1: no row sees past the last key
            return ["diag"]
        out = ["diag"] if spec.right is not None else []
        out += ["rev"] if spec.left is not None else []
        return out + ["full"]
    raise ValueError(f"unknown relation {relation!r}")


def piece_mask(piece: str, spec: MaskSpec) -> Tuple[str, Tuple[int, int]]:
    """``(attn_mask_type, window_size)`` of a call over one piece kind (flash convention)."""
    if piece == "native":
        left = -1 if spec.left is None else spec.left
        if spec.causal:
            return "causal", (left, 0)
        return "no_mask", (left, -1 if spec.right is None else spec.right)
    if piece == "diag":  # spec.right is finite here (0 when causal)
        left = -1 if spec.left is None else spec.left + spec.right
        return "causal", (left, 0)
    if piece == "rev":
        return "no_mask", (0, -1)
    if piece == "full":
        return "no_mask", (-1, -1)
    raise ValueError(f"unknown piece {piece!r}")


def reachable(relation: str, spec: MaskSpec, chunk_distance: Optional[int], min_h: int) -> bool:
    """Whether a rectangle between two dual-chunk halves ``chunk_distance`` chunks apart can
    hold a visible pair, for any sequence whose chunks have at least ``min_h`` tokens.

    Halves ``d >= 1`` chunks apart are at least ``(d - 1) * H + 1`` positions apart (from the
    first query of the later half to the last key of the earlier one), ``H >= min_h``; the mask
    reaches ``spec.reach(...)`` positions. Host-only: decides which ring steps run at all.
    """
    if relation in ("aligned", "whole") or chunk_distance is None or chunk_distance <= 0:
        return True
    if relation == "after" and spec.causal:
        return False
    reach = spec.reach("left" if relation == "before" else "right")
    if reach is None:
        return True
    return (chunk_distance - 1) * max(1, min_h) + 1 <= reach


def slot_bound(total_rows: int, num_seqs: int, chunk: Optional[int]) -> int:
    """Host bound on the slots (sub-rectangles) of one pair: one per sequence, or one per
    chunk a q segment touches (``n // C + 2`` for ``n`` rows at any offset, and at most ``n``).
    ``total_rows`` bounds the sum of the q segment's valid rows over the sequences."""
    if chunk is None:
        return max(1, num_seqs)
    return max(1, min(total_rows, total_rows // chunk + 2 * num_seqs))


class Slots(NamedTuple):
    """Per-slot geometry of one (q segment x kv segment) pair, int64 ``[m]``."""

    seq: torch.Tensor  # sequence of the slot (b for trailing, unused slots)
    live: torch.Tensor  # bool: the slot is a real sub-rectangle
    q0: torch.Tensor  # positions [q0, q1) x [k0, k1) of the sub-rectangle
    q1: torch.Tensor
    k0: torch.Tensor
    k1: torch.Tensor


def _ext(v: torch.Tensor) -> torch.Tensor:
    """[b] -> [b+1] with a trailing 0, so that index b (unused slots) is safe."""
    return torch.cat([v, v.new_zeros(1)])


def pair_slots(q: Segment, kv: Segment, chunk: Optional[int], max_slots: int) -> Slots:
    """Sub-rectangles of a pair: one per sequence, or one per chunk id the q segment touches.

    Sync-free: slot ``j`` finds its sequence by binary search over the per-sequence slot
    counts; slots past the last real one are ``live == False`` (zero-sized).
    """
    Q0, Q1 = q.pos, q.pos + q.n
    K0, K1 = kv.pos, kv.pos + kv.n
    b = q.pos.numel()
    dev = q.pos.device
    if chunk is None:
        live = torch.ones(b, dtype=torch.bool, device=dev)
        return Slots(torch.arange(b, device=dev), live, Q0, Q1, K0, K1)
    lo = torch.div(Q0, chunk, rounding_mode="floor")
    hi = torch.div(Q1 - 1, chunk, rounding_mode="floor")
    cnt = torch.where(q.n > 0, hi - lo + 1, torch.zeros_like(lo))
    incl = torch.cumsum(cnt, 0)
    j = torch.arange(max_slots, device=dev, dtype=torch.int64)
    seq = torch.searchsorted(incl, j, right=True)  # b for trailing slots
    live = seq < b
    c = _ext(lo)[seq] + (j - _ext(incl - cnt)[seq])
    c0, c1 = c * chunk, (c + 1) * chunk
    q0 = torch.maximum(_ext(Q0)[seq], c0)
    q1 = torch.minimum(_ext(Q1)[seq], c1)
    k0 = torch.maximum(_ext(K0)[seq], c0)
    k1 = torch.minimum(_ext(K1)[seq], c1)
    return Slots(seq, live, q0, q1, k0, k1)


def piece_ranges(piece: str, slots: Slots, spec: MaskSpec
                 ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Rows ``[r0, r1)`` and keys ``[s0, s1)`` (positions) of one piece in every slot; empty
    pieces come back with ``r1 == r0`` and ``s1 == s0`` (never one empty side alone)."""
    L = INF if spec.left is None else spec.left
    R = INF if spec.right is None else spec.right
    q0, q1, k0, k1 = slots.q0, slots.q1, slots.k0, slots.k1
    if piece == "native":
        r0, r1 = torch.maximum(q0, k0 - R), q1
        s0, s1 = torch.maximum(k0, r0 - L), k1
    elif piece == "diag":
        r0, r1 = torch.maximum(q0, k0 - R), torch.minimum(q1, k1 - R)
        s0, s1 = torch.maximum(k0, r0 - L), r1 + R
    elif piece in ("rev", "full"):
        r0, r1 = torch.maximum(q0, k1 - R), torch.minimum(q1, k1 + L)
        if piece == "rev":
            s0, s1 = torch.maximum(k0, r0 - L), torch.minimum(k1, r1 - L)
        else:
            s0, s1 = torch.maximum(k0, r1 - L), k1
    else:
        raise ValueError(f"unknown piece {piece!r}")
    ok = slots.live & (r1 > r0) & (s1 > s0)
    r1 = torch.where(ok, r1, r0)
    s1 = torch.where(ok, s1, s0)
    return r0, r1, s0, s1
