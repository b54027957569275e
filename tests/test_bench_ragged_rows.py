"""The ragged-request benchmark's rows, per-user drawing, floors and float64 check
(rocm_attn/bench/ragged_rows.py, ragged_check.py), on CPU."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from rocm_attn.bench import ragged_check as check
from rocm_attn.bench import ragged_rows as R
from rocm_attn.bench import small_seq_ranking as ranking


def test_every_row_name_spells_the_row_and_parses_back():
    names = [r.name for r in R.ROWS]
    assert len(set(names)) == len(names)
    for row in R.ROWS:
        assert R.parse_row(row.name) == row
    assert R.parse_row("u256_cln100s1:1-1000_kzipf1.1:16-4096_h8kv2_d128_bf16") == R.Row(
        256, R.Dist("lognormal", 1, 1000, median=100, sigma=1.0),
        R.Dist("zipf", 16, 4096, exponent=1.1), h_kv=2)
    assert R.parse_dist("ln1.5s0.25:2-9").spell() == "ln1.5s0.25:2-9"
    assert R.parse_dist("7") == R.Dist("fixed", 7, 7) and not R.parse_dist("7").ragged


@pytest.mark.parametrize("bad, what", [
    ("u8_c1-4_k1-4_h8kv3_d128_bf16", "multiple of h_kv"),
    ("u8_c1-4_k1-4_h8kv8_d96_bf16", "d must be one of"),
    ("u8_c4-1_k1-4_h8kv8_d128_bf16", "lo <= hi"),
    ("u8_c0-4_k1-4_h8kv8_d128_bf16", "lo <= hi"),
    ("u8_cln0s1:1-4_k1-4_h8kv8_d128_bf16", "median > 0"),
    ("u8_c1-4_kzipf0:1-4_h8kv8_d128_bf16", "exponent > 0"),
    ("u8_c1-4_kpoisson3_h8kv8_d128_bf16", "not a distribution"),
    ("u8_c1-4_k1-4_h8kv8_d128_fp32", "not a ragged row name"),
])
def test_bad_rows_are_named(bad, what):
    with pytest.raises(ValueError, match=what):
        R.parse_row(bad)


def test_issue_rows_are_the_issue_table():
    """The ranking issue's eight request batches, in its order."""
    spelled = [(r.users, r.cands.lo, r.cands.hi, r.keys.lo, r.keys.hi, r.h_q, r.h_kv, r.d, r.dtype)
               for r in R.ISSUE_ROWS]
    assert spelled == [
        (512, 64, 512, 16, 512, 8, 8, 128, "bf16"),
        (256, 128, 1024, 64, 384, 8, 2, 128, "bf16"),
        (128, 100, 300, 1000, 4000, 8, 2, 128, "bf16"),
        (256, 50, 200, 8, 64, 8, 8, 256, "fp16"),
        (256, 512, 512, 256, 256, 8, 8, 128, "bf16"),
        (4096, 1, 32, 1, 64, 8, 1, 64, "bf16"),
        (2048, 8, 64, 4, 16, 8, 8, 128, "bf16"),
        (8192, 1, 1, 32, 1024, 8, 8, 128, "bf16"),
    ]
    equal = R.ISSUE_ROWS[4]
    assert not equal.cands.ragged and not equal.keys.ragged
    assert all(r.cands.kind in ("uniform", "fixed") and r.keys.kind in ("uniform", "fixed")
               for r in R.ISSUE_ROWS)


def test_drawn_rows_cover_the_benchmark_matrix():
    rows = R.DRAWN_ROWS
    assert {r.d for r in rows} == {64, 128, 256}
    assert {r.heads for r in rows} == {"MHA", "GQA", "MQA"}
    assert {r.dtype for r in rows} == {"bf16", "fp16"}
    kinds = {d.kind for r in rows for d in (r.cands, r.keys)}
    assert {"lognormal", "zipf", "uniform"} <= kinds
    assert max(r.cands.hi for r in rows) == 1000 and max(r.keys.hi for r in rows) == 4096
    assert all(r.cands.hi <= 1000 and r.keys.hi <= 4096 for r in rows)


@pytest.mark.parametrize("dist", [R.Dist("uniform", 3, 40), R.Dist("fixed", 5, 5),
                                  R.Dist("lognormal", 1, 4096, median=256, sigma=1.0),
                                  R.Dist("zipf", 16, 4096, exponent=1.1)],
                         ids=lambda d: d.spell())
def test_draws_stay_in_range_and_match_the_distribution(dist):
    x = dist.draw(20000, torch.Generator().manual_seed(3))
    assert x.dtype == torch.int64 and x.shape == (20000,)
    assert int(x.min()) >= dist.lo and int(x.max()) <= dist.hi
    mean = dist.mean()
    # the sample mean within 5 standard errors of the exact mean
    sem = float(x.double().std()) / math.sqrt(2e4)
    assert abs(float(x.double().mean()) - mean) <= 5 * sem


def test_long_tails():
    gen = torch.Generator().manual_seed(0)
    ln = R.Dist("lognormal", 1, 4096, median=256, sigma=1.0).draw(20000, gen).double()
    assert abs(float(ln.median()) - 256) < 10  # the median, unmoved by rounding and clipping
    assert float(ln.mean()) > 1.5 * float(ln.median())  # a tail of heavy users above it
    zipf = R.Dist("zipf", 1, 1000, exponent=1.1).draw(20000, gen)
    counts = torch.bincount(zipf, minlength=1001)
    assert counts[1] > counts[2] > counts[4] > counts[16]  # most users short
    assert int(zipf.max()) > 500  # and a few near the top


def test_lengths_are_seeded_per_row():
    row = R.ISSUE_ROWS[0]
    a, b = R.draw_lengths(row, 0), R.draw_lengths(row, 0)
    assert torch.equal(a.cands, b.cands) and torch.equal(a.keys, b.keys)
    c = R.draw_lengths(row, 1)
    assert not torch.equal(a.keys, c.keys)
    # another row of the same distributions draws other users
    other = R.Row(row.users, row.cands, row.keys, h_kv=2)
    assert not torch.equal(R.draw_lengths(other, 0).keys, a.keys)
    cu_q, cu_kv = a.offsets()
    assert cu_q.dtype == torch.int32 and cu_q[0] == 0 and int(cu_q[-1]) == a.total_q
    assert torch.equal(cu_kv[1:] - cu_kv[:-1], a.keys.int())
    assert a.pairs == int((a.cands * a.keys).sum()) and a.max_kv == int(a.keys.max())


def test_byte_floor_is_the_ranking_grids():
    """The same count as the ranking grid's floor_bytes on the same THD tensors."""
    row = R.Row(6, R.Dist("uniform", 1, 9), R.Dist("uniform", 2, 30), h_q=8, h_kv=2, d=64)
    n = R.draw_lengths(row, 5)
    x = {"q": torch.empty(n.total_q, row.h_q, row.d), "k": torch.empty(n.total_kv, row.h_kv, row.d)}
    assert R.floor_bytes(row, n) == ranking.floor_bytes(x, elem=2)
    fwd, both = R.floor_bytes(row, n)
    qb, kvb = n.total_q * 8 * 64 * 2, 2 * n.total_kv * 2 * 64 * 2
    assert fwd == 2 * qb + kvb  # q, out; K and V once
    assert both == fwd + 4 * qb + 2 * kvb  # + q, out, dout read, dq written; K, V read, dK, dV


def test_matrix_floor_counts_valid_pairs():
    row = R.Row(3, R.Dist("uniform", 1, 9), R.Dist("uniform", 2, 30), h_q=4, h_kv=1, d=256)
    n = R.draw_lengths(row, 2)
    pairs = sum(int(c) * int(k) for c, k in zip(n.cands, n.keys))
    fwd, both = R.matrix_flops(row, n)
    assert fwd == 2 * (2 * pairs * 4 * 256)
    assert both == 7 * (2 * pairs * 4 * 256)


def test_floor_is_the_larger_bound():
    row = R.ISSUE_ROWS[2]  # 1000-4000 keys: the products outweigh the bytes at an H200's rates
    n = R.draw_lengths(row, 0)
    fwd, _ = R.floors(row, n, 4.2e12, 680e12)
    assert fwd.bound == "matrix" and fwd.ms == fwd.matrix_ms > fwd.bytes_ms
    assert fwd.bytes_ms == pytest.approx(R.floor_bytes(row, n)[0] / 4.2e12 * 1e3)
    short = R.ISSUE_ROWS[6]  # 4-16 keys: bytes
    f, _ = R.floors(short, R.draw_lengths(short, 0), 4.2e12, 680e12)
    assert f.bound == "bytes" and f.ms == f.bytes_ms
    with pytest.raises(ValueError, match="rates must be positive"):
        R.floors(row, n, 0.0, 1.0)


def test_padded_bytes():
    row = R.Row(4, R.Dist("fixed", 3, 3), R.Dist("uniform", 1, 10), h_q=8, h_kv=2, d=64)
    n = R.draw_lengths(row, 0)
    q = 4 * 3 * 8 * 64 * 2
    kv = 4 * n.max_kv * 8 * 64 * 2  # GQA expanded to h_q heads
    assert R.padded_bytes(row, n, False) == 2 * q + 2 * kv
    assert R.padded_bytes(row, n, True) == 2 * (2 * q + 2 * kv)


def test_sample_users_takes_the_extremes_first():
    n = R.Lengths(torch.tensor([3, 9, 1, 4, 4]), torch.tensor([5, 2, 50, 1, 7]))
    users = R.sample_users(n, 4, torch.Generator().manual_seed(0))
    assert users[:3] == [2, 1, 3] and len(set(users)) == 4
    assert sorted(R.sample_users(n, 10)) == [0, 1, 2, 3, 4]


def _user(c, n, h_q, h_kv, d, seed):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(*s, generator=g, dtype=torch.float64)
            for s in ((c, h_q, d), (n, h_kv, d), (n, h_kv, d), (c, h_q, d))]


def test_oracle_is_attention_with_grouped_heads():
    q, k, v, dout = _user(5, 7, 8, 2, 16, 0)
    out, dq, dk, dv = check.oracle_user(q, k, v, dout)
    qs, ks, vs = (t.clone().transpose(0, 1).requires_grad_() for t in (q, k, v))
    ref = F.scaled_dot_product_attention(qs, ks.repeat_interleave(4, 0), vs.repeat_interleave(4, 0))
    ref_grads = torch.autograd.grad(ref, (qs, ks, vs), dout.transpose(0, 1))
    assert torch.allclose(out, ref.transpose(0, 1), atol=1e-12)
    for got, want in zip((dq, dk, dv), ref_grads):
        assert torch.allclose(got, want.transpose(0, 1), atol=1e-12)
    assert len(check.oracle_user(q, k, v)) == 1


def test_checks_map_thd_and_padded_outputs_and_reject_errors_and_nan():
    counts = torch.tensor([2, 3, 1])
    cu = torch.tensor([0, 2, 5, 6])
    g = torch.Generator().manual_seed(1)
    exact = torch.randn(6, 4, 8, generator=g, dtype=torch.float64)
    refs = {1: exact[2:5], 2: exact[5:6]}
    padded = torch.zeros(3, 4, 3, 8, dtype=torch.float64)
    for u in range(3):
        padded[u, :, :int(counts[u])] = exact[int(cu[u]):int(cu[u + 1])].transpose(0, 1)
    padded[0] = 7.0  # a user outside the sample: not checked
    noisy = exact + 0.1 * exact.norm() / math.sqrt(exact.numel())
    nan = exact.clone()
    nan[3, 0, 0] = float("nan")
    res = check.check_outputs({"thd": exact.bfloat16(), "pad": padded.bfloat16(), "noisy": noisy,
                               "nan": nan}, refs, cu, counts, torch.bfloat16)
    assert res["thd"]["ok"] and res["pad"]["ok"] and res["thd"]["rel_err"] < 5e-3
    assert not res["noisy"]["ok"]
    assert not res["nan"]["ok"] and res["nan"]["rel_err"] == math.inf


def test_grad_check_takes_each_users_rows():
    cu_q, cu_kv = torch.tensor([0, 2, 3]), torch.tensor([0, 4, 9])
    g = torch.Generator().manual_seed(2)
    dq, dk, dv = (torch.randn(n, 2, 8, generator=g, dtype=torch.float64) for n in (3, 9, 9))
    refs = {1: (dq[2:3], dk[4:9], dv[4:9]), 0: (dq[0:2], dk[0:4], dv[0:4])}
    res = check.check_grads((dq, dk, dv), refs, cu_q, cu_kv, torch.float16)
    assert res["ok"] and res["rel_err"] == 0.0
    bad = dk.clone()
    bad[5] += 1.0  # user 1's key row
    res = check.check_grads((dq, bad, dv), refs, cu_q, cu_kv, torch.float16)
    assert not res["ok"] and res["per_grad"]["dk"] > 0 and res["per_grad"]["dq"] == 0
