"""Unit tests of rocm_attn.varlen.bands (windows and chunks as flash-expressible pieces), the
packed-row helpers of rocm_attn.varlen.packed and the ring-step reach rule, against brute force."""

from __future__ import annotations

import itertools
import random

import pytest
import torch

from rocm_attn.varlen import bands, packed
from rocm_attn.varlen.bands import MaskSpec, Segment
from rocm_attn.reference import attention_mask

T64 = torch.int64


def _truth(p: int, j: int, spec: MaskSpec) -> bool:
    if spec.causal and j > p:
        return False
    if spec.left is not None and j < p - spec.left:
        return False
    if spec.right is not None and j > p + spec.right:
        return False
    return spec.chunk is None or j // spec.chunk == p // spec.chunk


def _rectangle(rel: str, rng: random.Random):
    """Random (q0, nq, k0, nk) in kv positions satisfying the relation."""
    nq, nk = rng.randint(0, 12), rng.randint(0, 12)
    if rel == "aligned":
        end = rng.randint(0, 30)
        nk = min(nk, end)
        return end - nq, nq, end - nk, nk
    if rel == "before":
        k0 = rng.randint(0, 10)
        return k0 + nk + rng.randint(0, 6), nq, k0, nk
    if rel == "after":
        q0 = rng.randint(-3, 10)
        return q0, nq, max(0, q0 + nq) + rng.randint(0, 6), nk
    q0 = rng.randint(-3, 15)  # whole: the kv segment starts at 0 and ends after the queries
    return q0, nq, 0, max(nk, q0 + nq)


def _covered(rel, spec, q0, nq, k0, nk):
    """{(p, j): times covered} by the flash masks of the pieces of one rectangle."""
    one = lambda x: torch.tensor([x], dtype=T64)  # noqa: E731
    q = Segment(one(q0), one(nq), one(100))
    kv = Segment(one(k0), one(nk), one(200))
    slots = bands.pair_slots(q, kv, spec.chunk, bands.slot_bound(nq, 1, spec.chunk))
    cover = {}
    for piece in bands.pieces_for(rel, spec):
        mask_type, window = bands.piece_mask(piece, spec)
        r0, r1, s0, s1 = bands.piece_ranges(piece, slots, spec)
        for a in range(r0.numel()):
            sq, sk = int(r1[a] - r0[a]), int(s1[a] - s0[a])
            assert (sq == 0) == (sk == 0), f"{piece}: one empty side"
            if sq == 0:
                continue
            # a piece's "causal" is flash's, bottom-right: the reference's "causal_bottom_right"
            m = attention_mask(sq, sk, "causal_bottom_right" if mask_type == "causal" else mask_type,
                               window)
            assert bool(m.any(dim=1).all()), f"{piece}: a row of the piece sees no key"
            for i, jj in torch.nonzero(m).tolist():
                key = (int(r0[a]) + i, int(s0[a]) + jj)
                cover[key] = cover.get(key, 0) + 1
    return cover


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("rel", bands.RELATIONS)
def test_pieces_cover_the_mask_exactly_once(rel, seed):
    rng = random.Random(1000 * seed + bands.RELATIONS.index(rel))
    for _ in range(120):
        spec = MaskSpec.make(rng.random() < 0.5,
                             (rng.choice([-1, 0, 1, 3, 7]), rng.choice([-1, 0, 2, 5])),
                             rng.choice([None, 1, 3, 4, 8]))
        q0, nq, k0, nk = _rectangle(rel, rng)
        want = {(p, j): 1 for p in range(q0, q0 + nq) for j in range(k0, k0 + nk)
                if _truth(p, j, spec)}
        assert _covered(rel, spec, q0, nq, k0, nk) == want, (rel, spec, q0, nq, k0, nk)


def test_pieces_for_prunes_on_the_host():
    causal_win = MaskSpec.make(True, (5, 0), None)
    assert bands.pieces_for("after", causal_win) == []
    assert bands.pieces_for("whole", causal_win) == ["diag"]
    assert bands.pieces_for("before", causal_win) == ["rev", "full"]
    assert bands.pieces_for("before", MaskSpec.make(True, (-1, -1), 8)) == ["full"]
    full_win = MaskSpec.make(False, (4, 2), None)
    assert bands.pieces_for("whole", full_win) == ["diag", "rev", "full"]
    assert bands.pieces_for("aligned", full_win) == ["native"]


def test_piece_masks():
    spec = MaskSpec.make(False, (4, 2), None)
    assert bands.piece_mask("native", spec) == ("no_mask", (4, 2))
    assert bands.piece_mask("diag", spec) == ("causal", (6, 0))
    assert bands.piece_mask("rev", spec) == ("no_mask", (0, -1))
    assert bands.piece_mask("full", spec) == ("no_mask", (-1, -1))
    causal = MaskSpec.make(True, (-1, 7), 16)  # causal absorbs the right window
    assert causal.right == 0 and bands.piece_mask("native", causal) == ("causal", (-1, 0))
    assert causal.reach("left") == 15 and causal.reach("right") == 0
    assert MaskSpec.make(True, (-1, -1), None).plain
    assert not MaskSpec.make(False, (-1, 0), None).plain


def test_reach_rule_is_exact_at_the_edge():
    # halves d chunks apart are (d-1)*H + 1 positions apart at the closest
    spec = MaskSpec.make(True, (51, 0), None)
    assert bands.reachable("before", spec, 2, 50)
    assert not bands.reachable("before", MaskSpec.make(True, (50, 0), None), 2, 50)
    assert not bands.reachable("after", spec, 1, 50)  # causal never looks ahead
    assert bands.reachable("after", MaskSpec.make(False, (0, 1), None), 1, 10**6)
    assert not bands.reachable("before", MaskSpec.make(True, (0, 0), None), 1, 1)
    assert bands.reachable("before", MaskSpec.make(True, (-1, 0), None), 7, 10**6)
    # chunk 3: positions at most 2 apart share a chunk
    assert bands.reachable("before", MaskSpec.make(True, (-1, 0), 3), 2, 1)
    assert not bands.reachable("before", MaskSpec.make(True, (-1, 0), 3), 3, 1)


def test_chunk_slots_bound_is_enough():
    rng = random.Random(5)
    for _ in range(200):
        b = rng.randint(1, 5)
        chunk = rng.randint(1, 9)
        n = [rng.randint(0, 40) for _ in range(b)]
        pos = [rng.randint(-5, 50) for _ in range(b)]
        need = sum((p + m - 1) // chunk - p // chunk + 1 for p, m in zip(pos, n) if m)
        assert need <= bands.slot_bound(sum(n), b, chunk)
        seg = Segment(torch.tensor(pos), torch.tensor(n), torch.zeros(b, dtype=T64))
        slots = bands.pair_slots(seg, seg, chunk, bands.slot_bound(sum(n), b, chunk))
        assert int(slots.live.sum()) == need


def test_packed_rows_gather_scatter():
    x = torch.arange(10.0).reshape(10, 1)
    cu = torch.tensor([0, 3, 3, 5], dtype=torch.int32)
    starts = torch.tensor([6, 0, 2, 99], dtype=torch.int32)  # any order, overlap allowed
    rows = packed.packed_rows(cu, starts, 7, 10)
    got = packed.gather_packed(x, rows)
    assert got.flatten().tolist() == [6, 7, 8, 2, 3, 0, 0]
    back = packed.scatter_packed(got, rows, -1.0)
    assert back.flatten().tolist() == [-1, -1, 2, 3, -1, -1, 6, 7, 8, -1]
    cu2 = torch.tensor([0, 3, 5], dtype=torch.int32)
    rows2 = packed.packed_rows(cu2, torch.tensor([1, 2, 0], dtype=torch.int32), 6, 4)
    summed = packed.scatter_add_packed(torch.ones(6, 1), rows2)
    assert summed.flatten().tolist() == [0, 1, 2, 2]
    lse = torch.arange(20.0).reshape(2, 10)
    g = packed.gather_packed(lse, rows, dim=-1)
    assert g[1].tolist() == [16, 17, 18, 12, 13, 0, 0]


class _Group:
    def __init__(self, size, rank):
        self._s, self._r = size, rank

    def size(self):
        return self._s

    def rank(self):
        return self._r


@pytest.mark.parametrize("seed", range(4))
def test_packed_buffers_hold_every_step(seed):
    """Host bounds of the packed buffers (packed_q_rows / packed_kv_rows, max_seqlen_*) hold
    for every step of every comm type on random sequences, windows and chunk sizes."""
    from rocm_attn.cp import api, steps

    rng = random.Random(seed)
    for _ in range(12):
        cp = rng.choice([1, 2, 4])
        rank = rng.randrange(cp)
        lens = [rng.choice([0, 1, 5, 17, 40, 90]) for _ in range(rng.randint(1, 4))]
        plens = [-(-n // (2 * cp)) * 2 * cp + 2 * cp * rng.randint(0, 1) for n in lens]
        cu = torch.tensor([0] + list(itertools.accumulate(lens)), dtype=torch.int32)
        cu_p = torch.tensor([0] + list(itertools.accumulate(plens)), dtype=torch.int32)
        mask = rng.choice(["causal", "no_mask"])
        window = (rng.choice([-1, 0, 3, 20]), rng.choice([-1, 0, 7]))
        chunk = rng.choice([None, 4, 16])
        if window == (-1, -1) and chunk is None:
            continue
        t = int(cu_p[-1]) // cp
        x = torch.zeros(t, cp, 8, dtype=torch.float64)
        plan = api._make_plan(x, x, x, cu, cu, max(lens), max(lens), _Group(cp, rank), "p2p",
                              mask, window, chunk, cu_p, cu_p, None, "reference", True, False)
        metas = [m for s in range(cp) for m in steps.ring_step_metas(plan, s)]
        metas += steps.all_gather_step_metas(plan) + [steps.a2a_step_meta(plan)]
        for m in metas:
            ql = m.cu_seqlens_q[1:] - m.cu_seqlens_q[:-1]
            kl = m.cu_seqlens_kv[1:] - m.cu_seqlens_kv[:-1]
            assert int(ql.max()) <= m.max_seqlen_q and int(kl.max()) <= m.max_seqlen_kv, m.kind
            if m.packed_kv_rows is not None:
                assert int(m.cu_seqlens_kv[-1]) <= m.packed_kv_rows, (m.kind, lens, window)
                assert int(m.cu_seqlens_q[-1]) <= m.packed_q_rows, (m.kind, lens, window)


def test_ring_steps_run_matches_the_step_metadata():
    from rocm_attn.cp import api, steps

    rng = random.Random(9)
    for _ in range(25):
        cp = rng.choice([2, 3, 4, 8])
        rank = rng.randrange(cp)
        causal = rng.random() < 0.5
        window = (rng.choice([-1, 0, 5, 40]), rng.choice([-1, 0, 9]))
        chunk = rng.choice([None, 8, 64])
        min_seqlen = rng.choice([0, 64, 400])
        n = max(min_seqlen, 2 * cp)
        lens = [-(-n // (2 * cp)) * 2 * cp]
        cu = torch.tensor([0, lens[0]], dtype=torch.int32)
        x = torch.zeros(lens[0] // cp, 1, 8, dtype=torch.float64)
        plan = api._make_plan(x, x, x, cu, cu, lens[0], lens[0], _Group(cp, rank), "p2p",
                              "causal" if causal else "no_mask", window, chunk, None, None,
                              None, "reference", True, False, min_seqlen)
        want = [s for s in range(cp) if steps.ring_step_metas(plan, s)]
        assert steps.ring_steps_run(cp, rank, causal, window, chunk, min_seqlen) == want
