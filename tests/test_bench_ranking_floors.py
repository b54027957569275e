"""The ranking benchmark's floors (rocm_attn/bench/small_seq_ranking.py), on CPU inputs: the
byte floor counts q, out and only the valid keys of K / V; the matrix floor's FLOP count the
fewest products over every (candidate, q head, valid key) pair."""

from __future__ import annotations

import torch

from rocm_attn.bench import small_seq_ranking as ranking


def _inputs(**row):
    r = dict(users=3, cands=5, hist=7, ragged=True, h_kv=2, d=64)
    r.update(row)
    return r, ranking.make_rank_inputs(r, torch.float32, "cpu", torch.Generator().manual_seed(1))


def test_matrix_flops_count_valid_keys_only():
    r, x = _inputs()
    lens = x["lens"].tolist()
    assert x["total_kv"] == sum(lens) and all(1 <= n <= r["hist"] for n in lens)
    # one product: a multiply-add (2 FLOP) per head-dim element of every pair
    pairs = sum(r["cands"] * ranking.H_Q * n for n in lens)
    fwd, both = ranking.matrix_flops(x, r["d"])
    assert fwd == ranking.FWD_PRODUCTS * 2 * pairs * r["d"]
    assert both == ranking.FWD_BWD_PRODUCTS * 2 * pairs * r["d"]
    assert both / fwd == 3.5  # flash-attention's count: the backward is 2.5 forwards


def test_matrix_and_byte_floors_cross_where_histories_grow():
    """Per candidate, bytes stay q + out (K / V amortised over the candidates) while the
    products grow with the history: short histories are bound by bytes, long ones by the
    matrix unit at an H100's ratio of ~700 TFLOP/s to ~3 TB/s."""
    ratio = 700e12 / 3e12  # FLOP per byte at which the two floors meet

    def flop_per_byte(hist):
        r, x = _inputs(users=4, cands=512, hist=hist, ragged=False, h_kv=2, d=128)
        fwd_bytes, _ = ranking.floor_bytes(x, elem=2)  # bf16 bytes
        return ranking.matrix_flops(x, r["d"])[0] / fwd_bytes

    assert flop_per_byte(16) < ratio < flop_per_byte(512)
