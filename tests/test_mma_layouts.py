"""CPU model of hip_src/common/mma.h: fragment index logic checked against the vendors' layouts.

The GPU test (tests/test_common_gpu.py::test_mma_tiles) is the real check; this one runs
anywhere. It models each instruction from its ISA definition alone (which lane and register
holds which matrix element), then fills the registers exactly as mma.h's loaders do and runs
mma.h's sequence of instructions, and compares the results with plain matrix products. When
mma.h's lane/piece arithmetic changes, this model must change with it (each function below
names the mma.h function it mirrors); a disagreement between the two is a layout bug.

Registers are modelled as Python tuples of the 16-bit values they hold (low half first), as
floats; packing and rounding are not modelled (the GPU test covers them).
"""

from __future__ import annotations

import numpy as np
import pytest

# ---------------------------------------------------------------------------------------------
# The instructions, from the ISA documents only.
# ---------------------------------------------------------------------------------------------


def nv_mma_m16n8k16(c, a, b):
    """PTX mma.sync.aligned.m16n8k16.row.col.f32: per-lane a[4] (pairs), b[2] (pairs), c[4]."""
    A = np.zeros((16, 16))
    B = np.zeros((16, 8))
    C = np.zeros((16, 8))
    for lane in range(32):
        g, t = lane >> 2, lane & 3
        for e in range(2):
            A[g, 2 * t + e] = a[lane][0][e]
            A[g + 8, 2 * t + e] = a[lane][1][e]
            A[g, 2 * t + 8 + e] = a[lane][2][e]
            A[g + 8, 2 * t + 8 + e] = a[lane][3][e]
            B[2 * t + e, g] = b[lane][0][e]
            B[2 * t + 8 + e, g] = b[lane][1][e]
            C[g, 2 * t + e] = c[lane][e]
            C[g + 8, 2 * t + e] = c[lane][2 + e]
    D = A @ B + C
    out = []
    for lane in range(32):
        g, t = lane >> 2, lane & 3
        out.append([D[g, 2 * t], D[g, 2 * t + 1], D[g + 8, 2 * t], D[g + 8, 2 * t + 1]])
    return out


def cdna_mfma_16x16x16(c, a, b):
    """CDNA v_mfma_f32_16x16x16 (wave64): per-lane a, b = (lo pair, hi pair) = items 0..3."""
    A = np.zeros((16, 16))
    B = np.zeros((16, 16))
    C = np.zeros((16, 16))
    for lane in range(64):
        items_a = list(a[lane][0]) + list(a[lane][1])
        items_b = list(b[lane][0]) + list(b[lane][1])
        for item in range(4):
            k = 4 * (lane // 16) + item
            A[lane % 16, k] = items_a[item]
            B[k, lane % 16] = items_b[item]
            C[4 * (lane // 16) + item, lane % 16] = c[lane][item]
    D = A @ B + C
    return [[D[4 * (lane // 16) + item, lane % 16] for item in range(4)] for lane in range(64)]


# ---------------------------------------------------------------------------------------------
# mma.h, mirrored.
# ---------------------------------------------------------------------------------------------


class Vendor:
    def __init__(self, name):
        self.name = name
        self.wave = 32 if name == "nv" else 64
        self.min_n = 8 if name == "nv" else 16

    # ra_mma_acc / ra_mma_acc_row / ra_mma_acc_col
    def acc_elems(self, n):
        return n // 2 if self.name == "nv" else 4

    def acc_row(self, lane, i):
        return (lane >> 2) + 8 * ((i >> 1) & 1) if self.name == "nv" else lane & 15

    def acc_col(self, lane, i):
        if self.name == "nv":
            return 8 * (i >> 2) + 2 * (lane & 3) + (i & 1)
        return 4 * (lane >> 4) + i

    # ra_mma_row_sum / ra_mma_col_sum: lane butterflies (xor masks), modelled on all lanes
    def _xor_sum(self, vals, masks):
        for m in masks:
            vals = [vals[lane] + vals[lane ^ m] for lane in range(self.wave)]
        return vals

    def row_sum(self, part):  # part[lane]: one value per lane for one row slot
        return self._xor_sum(part, (1, 2) if self.name == "nv" else (16, 32))

    def col_sum(self, acc):
        n_el = len(acc[0])
        out = [[0.0] * n_el for _ in range(self.wave)]
        for i in range(n_el):
            if self.name == "nv":
                v = self._xor_sum([acc[lane][i] + acc[lane][i ^ 2] for lane in range(32)],
                                  (4, 8, 16))
            else:
                v = self._xor_sum([acc[lane][i] for lane in range(64)], (1, 2, 4, 8))
            for lane in range(self.wave):
                out[lane][i] = v[lane]
        return out

    # ra_mma_load_rows: returns per lane v[h][j] = 8 values (a 16-byte piece)
    def load_rows(self, M, d, r, nrows):
        rows_per_lane = (2 if r > 8 else 1) if self.name == "nv" else 1
        out = []
        for lane in range(self.wave):
            row0, piece0 = ((lane >> 2, lane & 3) if self.name == "nv" else (lane & 15, lane >> 4))
            v = []
            for h in range(rows_per_lane):
                row = row0 + 8 * h
                ok = row < r and row < nrows
                v.append([list(M[row, 8 * (piece0 + 4 * j): 8 * (piece0 + 4 * j) + 8]) if ok
                          else [0.0] * 8 for j in range(d // 32)])
            out.append(v)
        return out

    @staticmethod
    def word(piece, w):  # 32-bit word w of a 16-byte piece: values 2w, 2w + 1
        return (piece[2 * w], piece[2 * w + 1])

    # ra_mma_dot
    def dot(self, c, x, y, d, n, rx, ry):
        for s in range(d // 16):
            j, w = s >> 1, 2 * (s & 1)
            if self.name == "nv":
                ry_rows = 2 if ry > 8 else 1
                for nt in range(n // 8):
                    a, b = [], []
                    for lane in range(32):
                        xl = x[lane]
                        zero = (0.0, 0.0)
                        a1 = self.word(xl[1][j], w) if rx > 8 else zero
                        a3 = self.word(xl[1][j], w + 1) if rx > 8 else zero
                        a.append([self.word(xl[0][j], w), a1, self.word(xl[0][j], w + 1), a3])
                        have = nt < ry_rows
                        h = nt if have else 0
                        b.append([self.word(y[lane][h][j], w) if have else zero,
                                  self.word(y[lane][h][j], w + 1) if have else zero])
                    cc = [c[lane][4 * nt: 4 * nt + 4] for lane in range(32)]
                    res = nv_mma_m16n8k16(cc, a, b)
                    for lane in range(32):
                        c[lane][4 * nt: 4 * nt + 4] = res[lane]
            else:
                a_op = [(self.word(y[l][0][j], w), self.word(y[l][0][j], w + 1)) for l in range(64)]
                b_op = [(self.word(x[l][0][j], w), self.word(x[l][0][j], w + 1)) for l in range(64)]
                res = cdna_mfma_16x16x16(c, a_op, b_op)  # swapped operands
                for lane in range(64):
                    c[lane][:] = res[lane]

    # ra_mma_to_pfrag (no rounding modelled)
    def to_pfrag(self, s, n, ns):
        f = []
        for lane in range(self.wave):
            x = s[lane]
            if self.name == "nv":
                f.append([[(x[2 * nt], x[2 * nt + 1]),
                           (x[4 + 2 * nt], x[5 + 2 * nt]) if ns == 16 else (0.0, 0.0)]
                          for nt in range(n // 8)])
            else:
                f.append([(x[0], x[1]), (x[2], x[3])])
        return f

    # ra_mma_to_pfrag_transposed: each lane packs its elements pairwise, a shuffle reads a
    # whole packed word from the source lane, the receiver keeps one half of it
    def to_pfrag_transposed(self, s):
        f = []
        for lane in range(self.wave):
            if self.name == "nv":
                g, t = lane >> 2, lane & 3
                src0, odd = 8 * t + (g >> 1), g & 1
                f.append([[(s[src0][4 * nt + 2 * hi + odd], s[src0 + 4][4 * nt + 2 * hi + odd])
                           for hi in range(2)] for nt in range(2)])
            else:
                r, q = lane & 15, lane >> 4
                v = []
                for e in range(4):
                    src = 4 * q + e + 16 * (r >> 2)
                    words = ((s[src][0], s[src][1]), (s[src][2], s[src][3]))
                    v.append(words[(r >> 1) & 1][r & 1])
                f.append([(v[0], v[1]), (v[2], v[3])])
        return f

    # ra_mma_load_vrows: per lane w[slot][word] pairs
    def load_vrows(self, V, d, r, nrows):
        out = []
        for lane in range(self.wave):
            if self.name == "nv":
                g, t = lane >> 2, lane & 3
                slots = 4 if r > 8 else 2
                w = []
                for rs in range(slots):
                    row = 2 * t + (rs & 1) + 8 * (rs >> 1)
                    ok = row < r and row < nrows
                    vals = []
                    for u in range(d // 64):
                        c0 = 8 * (g + 8 * u)
                        vals += list(V[row, c0:c0 + 8]) if ok else [0.0] * 8
                    w.append([(vals[2 * k], vals[2 * k + 1]) for k in range(d // 16)])
            else:
                rr, q = lane & 15, lane >> 4
                unit = min(8, d // 16)
                w = []
                for rs in range(4):
                    row = 4 * q + rs
                    ok = row < r and row < nrows
                    vals = []
                    if unit == 8:
                        for u in range(d // 128):
                            c0 = 8 * (rr + 16 * u)
                            vals += list(V[row, c0:c0 + 8]) if ok else [0.0] * 8
                    else:
                        vals += list(V[row, 4 * rr:4 * rr + 4]) if ok else [0.0] * 4
                    w.append([(vals[2 * k], vals[2 * k + 1]) for k in range(d // 32)])
            out.append(w)
        return out

    # ra_mma_pv
    def pv(self, o, p, v, d, n, r):
        lo_lo = lambda x, y: (x[0], y[0])  # noqa: E731
        hi_hi = lambda x, y: (x[1], y[1])  # noqa: E731
        for i in range(d // 16):
            if self.name == "nv":
                a = []
                for lane in range(32):
                    w = v[lane]
                    a0, a1 = lo_lo(w[0][i], w[1][i]), hi_hi(w[0][i], w[1][i])
                    if len(w) == 4:
                        a2, a3 = lo_lo(w[2][i], w[3][i]), hi_hi(w[2][i], w[3][i])
                    else:
                        a2 = a3 = (0.0, 0.0)
                    a.append([a0, a1, a2, a3])
                for nt in range(n // 8):
                    b = [p[lane][nt] for lane in range(32)]
                    cc = [o[lane][i][4 * nt: 4 * nt + 4] for lane in range(32)]
                    res = nv_mma_m16n8k16(cc, a, b)
                    for lane in range(32):
                        o[lane][i][4 * nt: 4 * nt + 4] = res[lane]
            else:
                wi, hi = i >> 1, (i & 1) != 0
                f = hi_hi if hi else lo_lo
                a = [(f(v[l][0][wi], v[l][1][wi]), f(v[l][2][wi], v[l][3][wi])) for l in range(64)]
                cc = [o[lane][i] for lane in range(64)]
                res = cdna_mfma_16x16x16(cc, [tuple(p[l]) for l in range(64)], a)  # swapped
                for lane in range(64):
                    o[lane][i][:] = res[lane]

    # ra_mma_store_rows: returns the [16, d] matrix written (NaN where not written) and counts
    def store_rows(self, o, d, n, nrows):
        O = np.full((16, d), np.nan)
        count = np.zeros((16, d), dtype=int)
        for lane in range(self.wave):
            if self.name == "nv":
                g, t = lane >> 2, lane & 3
                for nt in range(n // 8):
                    for e in range(2):
                        row = 8 * nt + 2 * t + e
                        if row >= nrows:
                            continue
                        for u in range(d // 64):
                            piece = []
                            for k in range(4):
                                i = 4 * u + k
                                piece += [o[lane][i][4 * nt + e], o[lane][i][4 * nt + 2 + e]]
                            c0 = 8 * (g + 8 * u)
                            O[row, c0:c0 + 8] = piece
                            count[row, c0:c0 + 8] += 1
            else:
                rr, q = lane & 15, lane >> 4
                unit = min(8, d // 16)
                for e in range(4):
                    row = 4 * q + e
                    if row >= nrows or row >= n:
                        continue
                    if unit == 8:
                        for u in range(d // 128):
                            piece = [o[lane][8 * u + k][e] for k in range(8)]
                            c0 = 8 * (rr + 16 * u)
                            O[row, c0:c0 + 8] = piece
                            count[row, c0:c0 + 8] += 1
                    else:
                        O[row, 4 * rr:4 * rr + 4] = [o[lane][k][e] for k in range(4)]
                        count[row, 4 * rr:4 * rr + 4] += 1
        return O, count


@pytest.mark.parametrize("vendor", ["nv", "cdna"])
@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("kv", [4, 8, 16])
@pytest.mark.parametrize("heads", [8, 16])
def test_mma_model_matches_matrix_products(vendor, d, kv, heads):
    """S = X Y^T, P = S, O = P V through the modelled instructions and mma.h's index logic
    (the shapes the small-seq forward uses) equal the plain products; every accumulator element
    is held by exactly one lane and every output element is written once."""
    ven = Vendor(vendor)
    rng = np.random.default_rng(d * 100 + kv * 10 + heads)
    X, Y, V = (rng.integers(-3, 4, (16, d)).astype(float) for _ in range(3))
    hb = max(heads, ven.min_n)
    ns = 8 if kv <= 8 else 16
    n_acc = ns if vendor == "nv" else 16
    ny, nv_, no = max(1, kv - 1), kv, 5

    x = ven.load_rows(X, d, hb, 16)
    y = ven.load_rows(Y, d, kv, ny)
    s = [[0.0] * ven.acc_elems(ns) for _ in range(ven.wave)]
    ven.dot(s, x, y, d, ns, hb, kv)

    Xm, Ym, Vm = X.copy(), Y.copy(), V.copy()
    Xm[hb:] = 0
    Ym[min(kv, ny):] = 0
    Vm[min(kv, nv_):] = 0
    S_ref = Xm @ Ym.T
    S = np.full((16, 16), np.nan)
    cover = np.zeros((16, 16), dtype=int)
    for lane in range(ven.wave):
        for i in range(ven.acc_elems(ns)):
            r, c = ven.acc_row(lane, i), ven.acc_col(lane, i)
            S[r, c] = s[lane][i]
            cover[r, c] += 1
    assert (cover[:, :n_acc] == 1).all() and (cover[:, n_acc:] == 0).all()
    np.testing.assert_array_equal(S[:, :n_acc], S_ref[:, :n_acc])

    # row sums (per row slot of a lane) and column sums, as the kernels reduce them
    n_el = ven.acc_elems(ns)
    slots = 2 if vendor == "nv" else 1
    slot_of = (lambda i: (i >> 1) & 1) if vendor == "nv" else (lambda i: 0)  # noqa: E731
    for slot in range(slots):
        part = [sum(s[lane][i] for i in range(n_el) if slot_of(i) == slot)
                for lane in range(ven.wave)]
        tot = ven.row_sum(part)
        for lane in range(ven.wave):
            for i in range(n_el):
                if slot_of(i) == slot:
                    assert tot[lane] == S_ref[ven.acc_row(lane, i), :n_acc].sum()
    cs = ven.col_sum(s)
    for lane in range(ven.wave):
        for i in range(n_el):
            assert cs[lane][i] == S_ref[:, ven.acc_col(lane, i)].sum()

    p = ven.to_pfrag(s, hb, ns)
    vr = ven.load_vrows(V, d, kv, nv_)
    o = [[[0.0] * (hb // 2 if vendor == "nv" else 4) for _ in range(d // 16)]
         for _ in range(ven.wave)]
    ven.pv(o, p, vr, d, hb, kv)
    O, count = ven.store_rows(o, d, hb, no)
    P = np.zeros((16, 16))
    P[:hb, :n_acc] = S_ref[:hb, :n_acc]
    O_ref = P @ Vm
    rows = min(no, hb)
    assert (count[:rows] == 1).all() and (count[rows:] == 0).all()
    np.testing.assert_array_equal(O[:rows], O_ref[:rows])


@pytest.mark.parametrize("vendor", ["nv", "cdna"])
def test_transposed_pfrag_is_the_pfrag_of_the_transpose(vendor):
    """ra_mma_to_pfrag_transposed of a 16 x 16 accumulator holding S gives, lane by lane and
    register by register, what ra_mma_to_pfrag gives for an accumulator holding S^T."""
    ven = Vendor(vendor)
    S = np.random.default_rng(7).standard_normal((16, 16))
    n_el = ven.acc_elems(16)

    def acc_of(M):
        return [[M[ven.acc_row(lane, i), ven.acc_col(lane, i)] for i in range(n_el)]
                for lane in range(ven.wave)]

    assert ven.to_pfrag_transposed(acc_of(S)) == ven.to_pfrag(acc_of(S.T), 16, 16)
    assert ven.to_pfrag_transposed(acc_of(S)) != ven.to_pfrag(acc_of(S), 16, 16)
