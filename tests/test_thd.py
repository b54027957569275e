"""Tests of rocm_attn.thd (torch path) against plain Python-loop oracles."""

import math
import random

import pytest
import torch

from rocm_attn import thd
from rocm_attn.reference import attention_mask, reference_attention

NEG_INF = float("-inf")
I32 = torch.int32


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    # these tests run many small ops: on a shared 2-core box intra-op threads only contend
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


# ---------------------------------------------------------------------------
# helpers / oracles (plain Python loops over sequences)
# ---------------------------------------------------------------------------


def cu_of(lens):
    out = [0]
    for n in lens:
        out.append(out[-1] + n)
    return torch.tensor(out, dtype=I32)


def rand_lens(rng, b, max_len, allow_empty=True):
    lens = [rng.randint(0 if allow_empty else 1, max_len) for _ in range(b)]
    # make sure the corner cases are there
    if b >= 3:
        lens[0] = 0 if allow_empty else 1
        lens[1] = 1
    rng.shuffle(lens)
    return lens


def round_up(n, m):
    return -(-n // m) * m


def padded_lens(lens, cp):
    return [round_up(n, 2 * cp) for n in lens]


def oracle_partition_rows(plens, cp, rank, total):
    """Global rows of rank's shard, sequence by sequence; slack in rank blocks."""
    rows, start = [], 0
    for L in plens:
        h = L // (2 * cp)
        rows += list(range(start + rank * h, start + (rank + 1) * h))
        rows += list(range(start + (2 * cp - 1 - rank) * h, start + (2 * cp - rank) * h))
        start += L
    slack_loc = (total - start) // cp
    rows += list(range(start + rank * slack_loc, start + (rank + 1) * slack_loc))
    return rows


def oracle_half_rows(local_lens, half):
    rows, start = [], 0
    for L in local_lens:
        h = L // 2
        rows += list(range(start + half * h, start + (half + 1) * h))
        start += L
    return rows


def make_cp_case(rng, b, max_len, cp, slack=0, trailing=(3, 2)):
    lens = rand_lens(rng, b, max_len)
    plens = padded_lens(lens, cp)
    total = sum(plens) + slack * 2 * cp
    x = torch.randn((total,) + trailing)
    return lens, plens, cu_of(plens), x


# ---------------------------------------------------------------------------
# token_to_seq / partition / reorder
# ---------------------------------------------------------------------------


def test_token_to_seq_loop():
    rng = random.Random(0)
    lens = rand_lens(rng, 40, 6)
    cu = cu_of(lens)
    seq = thd.token_to_seq(cu, int(cu[-1]) + 3)
    want = [i for i, n in enumerate(lens) for _ in range(n)] + [len(lens)] * 3
    assert seq.tolist() == want
    assert seq.dtype == torch.int64


@pytest.mark.parametrize("cp", [1, 2, 4, 8])
@pytest.mark.parametrize("slack", [0, 3])
def test_partition_vs_loop_and_round_trip(cp, slack):
    rng = random.Random(cp * 10 + slack)
    lens, plens, cu_p, x = make_cp_case(rng, 13, 5 * cp, cp, slack)
    total = x.shape[0]
    shards = []
    for r in range(cp):
        want_rows = oracle_partition_rows(plens, cp, r, total)
        idx = thd.partitioned_indices(cu_p, cp, r, total, validate=True)
        assert idx.tolist() == want_rows
        shard = thd.partition(x, cu_p, cp, r, validate=True)
        assert torch.equal(shard, x[want_rows])
        shards.append(shard)
    gathered = torch.cat(shards)
    assert torch.equal(thd.reorder_to_contiguous(gathered, cu_p, cp, validate=True), x)
    assert torch.equal(thd.reorder_to_rank_sharded(x, cu_p, cp, validate=True), gathered)
    # local cu_seqlens
    assert torch.equal(thd.local_cu_seqlens(cu_p, cp), cu_p // cp)


def test_partition_strided_and_lse_dim():
    rng = random.Random(5)
    cp = 2
    lens, plens, cu_p, _ = make_cp_case(rng, 7, 12, cp)
    total = sum(plens)
    fused = torch.randn(total, 3, 4, 16)  # fused qkv projection [t, 3, h, d]
    k = fused[:, 1]  # non-contiguous token stride
    assert not k.is_contiguous()
    for r in range(cp):
        rows = oracle_partition_rows(plens, cp, r, total)
        assert torch.equal(thd.partition(k, cu_p, cp, r), k[rows])
        lse = torch.randn(4, total)
        assert torch.equal(thd.partition(lse, cu_p, cp, r, dim=-1), lse[:, rows])


# ---------------------------------------------------------------------------
# copy_valid_tokens / read_half / pad_for_cp
# ---------------------------------------------------------------------------


def test_copy_valid_tokens_vs_loop():
    rng = random.Random(1)
    b = 17
    lens = rand_lens(rng, b, 7)
    src_slots = [n + rng.randint(0, 3) for n in lens]
    dst_slots = [n + rng.randint(0, 3) for n in lens]
    cu, cu_s, cu_d = cu_of(lens), cu_of(src_slots), cu_of(dst_slots)
    src = torch.randn(sum(src_slots) + 2, 2, 8, dtype=torch.bfloat16)
    dst0 = torch.randn(sum(dst_slots) + 1, 2, 8)
    for fill in (None, 0.0):
        dst = dst0.clone()
        ret = thd.copy_valid_tokens(dst, src, cu, cu_d, cu_s, fill=fill, validate=True)
        assert ret is dst
        want = dst0.clone() if fill is None else torch.full_like(dst0, fill)
        for i, n in enumerate(lens):
            want[int(cu_d[i]) : int(cu_d[i]) + n] = src[int(cu_s[i]) : int(cu_s[i]) + n].float()
        assert torch.equal(dst, want)
    # LSE layout [h, t] with the token dim last, packed source
    lse_src = torch.randn(3, int(cu[-1]))
    lse_dst = torch.zeros(3, sum(dst_slots))
    thd.copy_valid_tokens(lse_dst, lse_src, cu, cu_d, dim=-1, fill=NEG_INF)
    want = torch.full_like(lse_dst, NEG_INF)
    for i, n in enumerate(lens):
        want[:, int(cu_d[i]) : int(cu_d[i]) + n] = lse_src[:, int(cu[i]) : int(cu[i]) + n]
    assert torch.equal(lse_dst, want)


@pytest.mark.parametrize("half", ["first", "second"])
def test_read_half_vs_loop(half):
    rng = random.Random(2)
    local_lens = [2 * rng.randint(0, 6) for _ in range(11)] + [2]
    cu = cu_of(local_lens)
    x = torch.randn(sum(local_lens), 4, 8)[:, :, ::2]  # strided
    rows = oracle_half_rows(local_lens, 0 if half == "first" else 1)
    assert torch.equal(thd.read_half(x, cu, half, validate=True), x[rows])
    lse = torch.randn(4, sum(local_lens))
    assert torch.equal(thd.read_half(lse, cu, half, dim=-1), lse[:, rows])


@pytest.mark.parametrize("cp", [1, 2, 4, 8])
def test_pad_for_cp_vs_loop(cp):
    rng = random.Random(3 + cp)
    lens = rand_lens(rng, 15, 19)
    cu = cu_of(lens)
    x = torch.randn(sum(lens), 2, 4)
    plens = padded_lens(lens, cp)
    exact = sum(plens)
    bound = thd.padded_size_bound(x.shape[0], len(lens), cp)
    assert bound >= exact and bound % (2 * cp) == 0
    for total in (None, "bound", exact + 2 * cp):
        xp, cu_p = thd.pad_for_cp(x, cu, cp, total, validate=True)
        n_rows = {None: exact, "bound": bound}.get(total, total)
        assert xp.shape == (n_rows, 2, 4)
        assert cu_p.dtype == I32 and cu_p.tolist() == cu_of(plens).tolist()
        want = torch.zeros_like(xp)
        for i, n in enumerate(lens):
            want[int(cu_p[i]) : int(cu_p[i]) + n] = x[int(cu[i]) : int(cu[i]) + n]
        assert torch.equal(xp, want)
        # and it partitions / round-trips, slack included
        shards = [thd.partition(xp, cu_p, cp, r) for r in range(cp)]
        assert torch.equal(thd.reorder_to_contiguous(torch.cat(shards), cu_p, cp), xp)


# ---------------------------------------------------------------------------
# 50k sequences: index helpers (vectorised oracles)
# ---------------------------------------------------------------------------


def test_50k_sequences():
    g = torch.Generator().manual_seed(0)
    b, cp = 50_000, 2
    lens = torch.randint(0, 9, (b,), generator=g)
    cu = torch.cat([torch.zeros(1, dtype=torch.long), lens.cumsum(0)]).to(I32)
    t = int(cu[-1])
    seq = thd.token_to_seq(cu, t)
    assert torch.equal(seq, torch.repeat_interleave(torch.arange(b), lens))

    # pad_for_cp, exact size
    x = torch.arange(t, dtype=torch.float32).unsqueeze(1)
    xp, cu_p = thd.pad_for_cp(x, cu, cp, None)
    plens = (lens + 2 * cp - 1) // (2 * cp) * (2 * cp)
    assert torch.equal(cu_p.long()[1:] - cu_p.long()[:-1], plens)
    seq_p = torch.repeat_interleave(torch.arange(b), plens)
    off = torch.arange(xp.shape[0]) - cu_p.long()[seq_p]
    valid = off < lens[seq_p]
    assert torch.equal(xp[valid, 0], x[:, 0])
    assert bool((xp[~valid] == 0).all())

    # partition + reorder round trip on the padded tensor; check against a vectorised oracle
    shards = [thd.partition(xp, cu_p, cp, r) for r in range(cp)]
    assert torch.equal(thd.reorder_to_contiguous(torch.cat(shards), cu_p, cp), xp)
    h = plens // (2 * cp)
    for r in range(cp):
        # rank r holds chunk r then chunk 2cp-1-r of every sequence
        loc_len = 2 * h
        seq_l = torch.repeat_interleave(torch.arange(b), loc_len)
        lo = torch.arange(int(loc_len.sum())) - (torch.cumsum(loc_len, 0) - loc_len)[seq_l]
        hh = h[seq_l]
        g_rows = cu_p.long()[seq_l] + torch.where(lo < hh, r * hh + lo,
                                                  (2 * cp - 1 - r) * hh + lo - hh)
        assert torch.equal(thd.partitioned_indices(cu_p, cp, r, xp.shape[0]), g_rows)

    # read_half on the local layout
    cu_loc = thd.local_cu_seqlens(cu_p, cp)
    second = thd.read_half(shards[1], cu_loc, "second")
    assert second.shape[0] == shards[1].shape[0] // 2

    # chunkify
    cs = 3
    mc = thd.max_chunks_bound(t, b, cs)
    cuc = thd.chunkify(cu, cs, mc, validate=True)
    nch = (lens + cs - 1) // cs
    seq_c = torch.repeat_interleave(torch.arange(b), nch)
    k = torch.arange(int(nch.sum())) - (torch.cumsum(nch, 0) - nch)[seq_c]
    starts = cu.long()[seq_c] + k * cs
    assert cuc.shape == (mc + 1,)
    assert torch.equal(cuc[: starts.numel()].long(), starts)
    assert bool((cuc[starts.numel():] == t).all())

    # a dual-chunk step on 50k sequences: q runs tile the local tensor
    st = thd.chunkify_ring_step(cu_loc, 4, cp, 1, 1, thd.max_chunks_bound(
        int(cu_loc[-1]), b, 4, dual_chunk=True), validate=True)
    assert int(st.cu_seqlens_q[-1]) == int(cu_loc[-1])
    assert torch.equal(st.cu_seqlens_q, st.cu_seqlens_q_padded)


# ---------------------------------------------------------------------------
# merge
# ---------------------------------------------------------------------------


def merge_oracle(out, lse, out_step, lse_step):
    """float64, element by element over tokens and heads."""
    out = out.double().clone()
    lse = lse.double().clone()
    t, h = out.shape[0], out.shape[1]
    for i in range(t):
        for j in range(h):
            a, b = float(lse[j, i]), float(lse_step[j, i])
            if a == NEG_INF and b == NEG_INF:
                out[i, j] = 0.0
                lse[j, i] = NEG_INF
                continue
            m = max(a, b)
            new = m + math.log(math.exp(a - m) + math.exp(b - m))
            wa, wb = math.exp(a - new), math.exp(b - new)
            oa = out[i, j] * wa if wa > 0 else 0.0
            ob = out_step[i, j].double() * wb if wb > 0 else 0.0
            out[i, j] = oa + ob
            lse[j, i] = new
    return out, lse


def test_merge_vs_oracle_with_inf_rows():
    g = torch.Generator().manual_seed(3)
    t, h, d = 12, 3, 5
    out = torch.randn(t, h, d, generator=g)
    out_step = torch.randn(t, h, d, generator=g)
    lse = torch.randn(h, t, generator=g) * 3
    lse_step = torch.randn(h, t, generator=g) * 3
    lse[0, :4] = NEG_INF  # running empty
    lse_step[1, 2:6] = NEG_INF  # step empty
    lse[2, 7:9] = NEG_INF
    lse_step[2, 7:9] = NEG_INF  # both empty
    lse_step[0, 10] = 1e4  # huge gap: stable
    out[:4, 0] = float("nan")  # junk in an empty accumulator row is ignored
    o, l_ = thd.merge_partial(out, lse, out_step, lse_step)
    wo, wl = merge_oracle(out, lse, out_step, lse_step)
    assert not torch.isnan(o).any() and not torch.isnan(l_).any()
    torch.testing.assert_close(o.double(), wo, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(l_.double(), wl, rtol=1e-6, atol=1e-5)
    assert bool((l_[2, 7:9] == NEG_INF).all()) and bool((o[7:9, 2] == 0).all())
    # identity element: (empty, -inf)
    o2, l2 = thd.merge_partial(torch.empty(t, h, d), torch.full((h, t), NEG_INF), out_step,
                               lse_step)
    ok = lse_step != NEG_INF
    torch.testing.assert_close(o2[ok.t()], out_step[ok.t()])
    assert torch.equal(l2, lse_step)
    # in place
    oc, lc = out.clone(), lse.clone()
    r = thd.merge_partial(oc, lc, out_step, lse_step, inplace=True)
    assert r[0] is oc and r[1] is lc
    assert torch.equal(oc, o) and torch.equal(lc, l_)


def split_kv(lens_kv, rng):
    cut = [rng.randint(0, n) for n in lens_kv]
    return cut, [n - c for n, c in zip(lens_kv, cut)]


def gather_kv(k, cu, a_lens, b_lens):
    rows_a, rows_b = [], []
    for i, (a, b_) in enumerate(zip(a_lens, b_lens)):
        s = int(cu[i])
        rows_a += list(range(s, s + a))
        rows_b += list(range(s + a, s + a + b_))
    return k[rows_a], k[rows_b]


@pytest.mark.parametrize("compute", [torch.float64, torch.float32])
def test_merge_equals_full_attention(compute):
    rng = random.Random(4)
    g = torch.Generator().manual_seed(4)
    b, hq, hkv, d = 9, 4, 2, 16
    lens_q = rand_lens(rng, b, 5)
    lens_kv = [rng.randint(0, 9) for _ in range(b)]
    cu_q, cu_kv = cu_of(lens_q), cu_of(lens_kv)
    q = torch.randn(sum(lens_q), hq, d, generator=g, dtype=compute)
    k = torch.randn(sum(lens_kv), hkv, d, generator=g, dtype=compute)
    v = torch.randn(sum(lens_kv), hkv, d, generator=g, dtype=compute)
    a, bb = split_kv(lens_kv, rng)
    ka, kb = gather_kv(k, cu_kv, a, bb)
    va, vb = gather_kv(v, cu_kv, a, bb)
    o1, l1 = reference_attention(q, ka, va, cu_q, cu_of(a), "no_mask", compute_dtype=compute)
    o2, l2 = reference_attention(q, kb, vb, cu_q, cu_of(bb), "no_mask", compute_dtype=compute)
    full_o, full_l = reference_attention(q, k, v, cu_q, cu_kv, "no_mask")
    o, l_ = thd.merge_partial(o1, l1, o2, l2)
    tol = 1e-12 if compute == torch.float64 else 1e-5
    torch.testing.assert_close(o.double(), full_o.double(), rtol=tol, atol=tol)
    torch.testing.assert_close(l_.double(), full_l.double(), rtol=tol, atol=tol)
    # two-pass form: lse_correction over the steps, then out_correction against the final LSE
    lse_fin = thd.lse_correction(l1, l2)
    acc = torch.zeros_like(o1, dtype=torch.float64)
    for os_, ls_ in ((o1, l1), (o2, l2)):
        acc = thd.out_correction(acc, os_, lse_fin, ls_)
    torch.testing.assert_close(acc, full_o.double(), rtol=tol, atol=tol)
    torch.testing.assert_close(lse_fin.double(), full_l.double(), rtol=tol, atol=tol)


def test_merge_bf16_in_fp32():
    g = torch.Generator().manual_seed(6)
    t, h, d = 64, 4, 32
    steps = [(torch.randn(t, h, d, generator=g).bfloat16(), torch.randn(h, t, generator=g) * 4)
             for _ in range(4)]
    # fp32 accumulator across bf16 steps
    acc = torch.zeros(t, h, d)
    lse = torch.full((h, t), NEG_INF)
    for o_s, l_s in steps:
        acc, lse = thd.merge_partial(acc, lse, o_s, l_s)
    ref_o = torch.zeros(t, h, d, dtype=torch.float64)
    ref_l = torch.full((h, t), NEG_INF, dtype=torch.float64)
    for o_s, l_s in steps:
        ref_o, ref_l = merge_oracle_vec(ref_o, ref_l, o_s.double(), l_s.double())
    torch.testing.assert_close(acc.double(), ref_o, rtol=1e-5, atol=1e-6)
    assert acc.dtype == torch.float32 and lse.dtype == torch.float32
    # bf16 running output: merged in fp32 and rounded once
    o_bf, l_bf = thd.merge_partial(steps[0][0], steps[0][1], steps[1][0], steps[1][1])
    o32, _ = thd.merge_partial(steps[0][0].float(), steps[0][1], steps[1][0].float(), steps[1][1])
    assert o_bf.dtype == torch.bfloat16
    assert torch.equal(o_bf, o32.bfloat16())


def merge_oracle_vec(o, l_, os_, ls_):
    new = torch.logaddexp(l_, ls_)
    safe = torch.where(new == NEG_INF, torch.zeros_like(new), new)
    w, ws = torch.exp(l_ - safe).t().unsqueeze(-1), torch.exp(ls_ - safe).t().unsqueeze(-1)
    return o * w + os_ * ws, new


def test_merge_only_second_half_vs_loop():
    rng = random.Random(7)
    local_lens = [2 * rng.randint(0, 5) for _ in range(10)] + [2]
    cu = cu_of(local_lens)
    t, h, d = sum(local_lens), 2, 4
    g = torch.Generator().manual_seed(7)
    out = torch.randn(t, h, d, generator=g)
    lse = torch.randn(h, t, generator=g)
    out_s = torch.randn(t // 2, h, d, generator=g, dtype=torch.float64).bfloat16()
    lse_s = torch.randn(h, t // 2, generator=g)
    lse_s[:, ::3] = NEG_INF
    rows = oracle_half_rows(local_lens, 1)
    first = oracle_half_rows(local_lens, 0)
    o, l_ = thd.merge_partial(out, lse, out_s, lse_s, cu, only_second_half=True, validate=True)
    wo, wl = merge_oracle(out[rows], lse[:, rows], out_s, lse_s)
    torch.testing.assert_close(o[rows].double(), wo, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(l_[:, rows].double(), wl, rtol=1e-6, atol=1e-6)
    assert torch.equal(o[first], out[first]) and torch.equal(l_[:, first], lse[:, first])
    lc = thd.lse_correction(lse, lse_s, cu, only_second_half=True)
    assert torch.equal(lc, l_)
    oc = thd.out_correction(out, out_s, l_, lse_s, cu, only_second_half=True)
    assert torch.equal(oc[first], out[first])


# ---------------------------------------------------------------------------
# grad_correction
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("ops", [(a, b) for a in thd.GRAD_OPS for b in thd.GRAD_OPS])
def test_grad_correction_vs_loop(ops):
    rng = random.Random(8)
    local_lens = [2 * rng.randint(0, 5) for _ in range(9)] + [2, 0]
    cu = cu_of(local_lens)
    t = sum(local_lens)
    g = torch.Generator().manual_seed(8)
    grad = torch.randn(t, 3, 4, generator=g)
    halves = [oracle_half_rows(local_lens, 0), oracle_half_rows(local_lens, 1)]

    def oracle(step, half_only):
        want = grad.clone()
        for hi, op in enumerate(ops):
            if op == "none":
                continue
            src = step if half_only is not None else step[halves[hi]]
            if op == "copy":
                want[halves[hi]] = src.float()
            else:
                want[halves[hi]] = want[halves[hi]] + src.float()
        return want

    full = torch.randn(t, 3, 4, generator=g)
    got = thd.grad_correction(grad, full, cu, *ops, validate=True)
    assert torch.equal(got, oracle(full, None))
    gi = grad.clone()
    thd.grad_correction(gi, full, cu, *ops, inplace=True)
    assert torch.equal(gi, oracle(full, None))
    if (ops[0] == "none") != (ops[1] == "none"):
        half = torch.randn(t // 2, 3, 4, generator=g).bfloat16()
        got = thd.grad_correction(grad, half, cu, *ops)
        assert torch.equal(got, oracle(half, True))
    else:
        with pytest.raises(ValueError, match="exactly one"):
            thd.grad_correction(grad, full[: t // 2], cu, *ops)


# ---------------------------------------------------------------------------
# chunkify
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("cs", [1, 2, 3, 7, 100])
def test_chunkify_vs_loop(cs):
    rng = random.Random(cs)
    lens = rand_lens(rng, 20, 17)
    cu = cu_of(lens)
    mc = thd.max_chunks_bound(sum(lens), len(lens), cs)
    got = thd.chunkify(cu, cs, mc, validate=True)
    want = [0]
    for n in lens:
        for s in range(0, n, cs):
            want.append(want[-1] + min(cs, n - s))
    want += [want[-1]] * (mc + 1 - len(want))
    assert got.dtype == I32 and got.tolist() == want
    # causal chunked attention == causal attention over the chunks
    q = torch.randn(sum(lens), 2, 8)
    ref, _ = reference_attention(q, q, q, cu, cu, "causal", chunk_size=cs)
    via, _ = reference_attention(q, q, q, got, got, "causal")
    torch.testing.assert_close(via, ref)


def test_chunkify_empty_batch():
    cu = torch.zeros(1, dtype=I32)
    assert thd.chunkify(cu, 4, 3).tolist() == [0, 0, 0, 0]
    st = thd.chunkify_diagonal(cu, 4, 2, 0, 3)
    assert st.cu_seqlens_q.tolist() == [0, 0, 0, 0]


def global_positions(local_lens, cp, rank):
    """Per local row: (sequence, global position) for rank's shard."""
    out = []
    for i, L in enumerate(local_lens):
        h = L // 2
        out += [(i, rank * h + o) for o in range(h)]
        out += [(i, (2 * cp - 1 - rank) * h + o) for o in range(h)]
    return out


def true_mask(local_lens, cp, rank, kv_rank, cs):
    qpos = global_positions(local_lens, cp, rank)
    kpos = global_positions(local_lens, cp, kv_rank)
    masks = [attention_mask(L * cp, L * cp, "causal", chunk_size=cs) for L in local_lens]
    m = torch.zeros(len(qpos), len(kpos), dtype=torch.bool)
    for a, (si, p) in enumerate(qpos):
        for bb, (sj, pk) in enumerate(kpos):
            if si == sj:
                m[a, bb] = masks[si][p, pk]
    return m


def predicted_mask(st, local_lens):
    t = sum(local_lens)
    q_rows = list(range(t)) if st.q_layout == "full" else oracle_half_rows(local_lens, 1)
    kv_rows = list(range(t)) if st.kv_layout == "full" else oracle_half_rows(local_lens, 0)
    m = torch.zeros(t, t, dtype=torch.bool)
    cq, ck = st.cu_seqlens_q.tolist(), st.cu_seqlens_kv.tolist()
    pq, pk = st.cu_seqlens_q_padded.tolist(), st.cu_seqlens_kv_padded.tolist()
    covered = []
    for j in range(len(cq) - 1):
        sq, skv = cq[j + 1] - cq[j], ck[j + 1] - ck[j]
        assert sq >= 0 and skv >= 0
        assert pq[j] + sq <= pq[j + 1] and pk[j] + skv <= pk[j + 1]  # padded-cu contract
        covered += list(range(pq[j], pq[j] + sq))
        sub = attention_mask(sq, skv, st.attn_mask_type)
        for a in range(sq):
            for bb in range(skv):
                if sub[a, bb]:
                    m[q_rows[pq[j] + a], kv_rows[pk[j] + bb]] = True
    assert covered == list(range(len(q_rows)))  # every q row of the step in exactly one run
    assert pq[-1] == len(q_rows) and pk[-1] == len(kv_rows)
    return m


@pytest.mark.parametrize("cp", [2, 4, 8])
def test_chunkify_ring_steps_vs_brute_force_mask(cp):
    rng = random.Random(100 + cp)
    for cs in (None, 1, 2, 3, 5, 16):
        local_lens = [2 * rng.randint(0, 3 if cp == 8 else 5) for _ in range(5)] + [2, 0]
        cu = cu_of(local_lens)
        t = sum(local_lens)
        mc = thd.max_chunks_bound(t, len(local_lens), cs, dual_chunk=True)
        for rank in range(cp):
            union = torch.zeros(t, t, dtype=torch.bool)
            for step in range(cp):
                kind, kv_rank = thd.ring_step(rank, step, cp)
                for layout in (("half", "full") if kind == "below" else ("half",)):
                    st = thd.chunkify_ring_step(cu, cs, cp, rank, step, mc, layout, validate=True)
                    assert st.attn_mask_type == ("causal" if kind == "diagonal" else "no_mask")
                    want = true_mask(local_lens, cp, rank, kv_rank, cs)
                    got = predicted_mask(st, local_lens)
                    assert torch.equal(got, want), (cs, rank, step, kind, layout)
                    if kind == "diagonal":
                        assert torch.equal(st.cu_seqlens_q, st.cu_seqlens_kv)
                union |= want
            assert union.any() or t == 0


def test_ring_step_named_variants():
    cu = cu_of([4, 8, 0, 2])
    a = thd.chunkify_below(cu, 3, 4, 2, 1, 20)
    b = thd.chunkify_ring_step(cu, 3, 4, 2, 1, 20)
    assert all(torch.equal(x, y) for x, y in zip(a[:4], b[:4])) and a[4:] == b[4:]
    a = thd.chunkify_above(cu, 3, 4, 1, 3, 20)
    b = thd.chunkify_ring_step(cu, 3, 4, 1, 2, 20)
    assert all(torch.equal(x, y) for x, y in zip(a[:4], b[:4])) and a[4:] == b[4:]
    assert thd.ring_step(0, 1, 4) == ("above", 3)
    assert thd.ring_step(3, 2, 4) == ("below", 1)
    with pytest.raises(ValueError, match="kv_rank < rank"):
        thd.chunkify_below(cu, 3, 4, 1, 2, 20)


@pytest.mark.parametrize("cp,cs", [(2, 3), (2, None), (4, 5)])
def test_ring_attention_with_chunks_end_to_end(cp, cs):
    """Simulated ring: every rank, every step, reference attention on the step metadata,
    merged; equals global chunked causal attention on the valid tokens."""
    rng = random.Random(cp * 7 + (cs or 0))
    g = torch.Generator().manual_seed(cp)
    lens = rand_lens(rng, 5, 6 * cp)
    cu = cu_of(lens)
    h, d = 2, 8
    q, k, v = (torch.randn(sum(lens), h, d, generator=g, dtype=torch.float64) for _ in range(3))
    (qp, cu_p), (kp, _), (vp, _) = (thd.pad_for_cp(x, cu, cp, None) for x in (q, k, v))
    ref, ref_lse = reference_attention(q, k, v, cu, cu, "causal", chunk_size=cs)
    ref_p, _ = thd.pad_for_cp(ref, cu, cp, None)
    valid_p, _ = thd.pad_for_cp(torch.ones(sum(lens), 1, 1), cu, cp, None)
    cu_loc = thd.local_cu_seqlens(cu_p, cp)
    t_loc = qp.shape[0] // cp
    mc = thd.max_chunks_bound(t_loc, len(lens), cs, dual_chunk=True)
    for rank in range(cp):
        ql = thd.partition(qp, cu_p, cp, rank)
        out = torch.zeros(t_loc, h, d, dtype=torch.float32)  # fp32 accumulator
        lse = torch.full((h, t_loc), NEG_INF)
        for step in range(cp):
            st = thd.chunkify_ring_step(cu_loc, cs, cp, rank, step, mc)
            kind, kv_rank = thd.ring_step(rank, step, cp)
            kl, vl = (thd.partition(x, cu_p, cp, kv_rank) for x in (kp, vp))
            qs = ql if st.q_layout == "full" else thd.read_half(ql, cu_loc, "second")
            if st.kv_layout == "first_half":
                kl, vl = (thd.read_half(x, cu_loc, "first") for x in (kl, vl))
            o_s, l_s = reference_attention(
                qs, kl, vl, st.cu_seqlens_q, st.cu_seqlens_kv, st.attn_mask_type,
                cu_seqlens_q_padded=st.cu_seqlens_q_padded,
                cu_seqlens_kv_padded=st.cu_seqlens_kv_padded)
            out, lse = thd.merge_partial(out, lse, o_s, l_s.float(), cu_loc,
                                         only_second_half=kind == "above")
        want = thd.partition(ref_p, cu_p, cp, rank)
        keep = thd.partition(valid_p, cu_p, cp, rank)[:, 0, 0] > 0
        torch.testing.assert_close(out[keep].double(), want[keep], rtol=1e-5, atol=1e-6)
    assert ref_lse.shape == (h, sum(lens))


# ---------------------------------------------------------------------------
# errors
# ---------------------------------------------------------------------------


def test_host_errors():
    x = torch.randn(8, 2, 4)
    cu = cu_of([4, 4])
    with pytest.raises(ValueError, match="int32"):
        thd.partition(x, cu.long(), 2, 0)
    with pytest.raises(ValueError, match="1-D"):
        thd.partition(x, cu.reshape(1, -1), 2, 0)
    with pytest.raises(ValueError, match="must be on"):
        thd.partition(x, cu.to("meta"), 2, 0)
    with pytest.raises(ValueError, match="rank"):
        thd.partition(x, cu, 2, 2)
    with pytest.raises(ValueError, match="cp"):
        thd.partition(x, cu, 0, 0)
    with pytest.raises(ValueError, match="multiple of cp"):
        thd.partition(x[:7], cu, 2, 0)
    with pytest.raises(ValueError, match="even"):
        thd.read_half(x[:7], cu, "first")
    with pytest.raises(ValueError, match="half"):
        thd.read_half(x, cu, "third")
    lse = torch.randn(2, 8)
    with pytest.raises(ValueError, match="lse_step"):
        thd.merge_partial(x, lse, x, lse[:, :4])
    thd.merge_partial(x, lse, x[:4], lse[:, :4], cu, only_second_half=True)  # fine
    with pytest.raises(ValueError, match="out_step must have shape"):
        thd.merge_partial(x, lse, x[:4, :, :3], lse[:, :4], cu, only_second_half=True)
    with pytest.raises(ValueError, match="needs cu_seqlens_padded"):
        thd.merge_partial(x, lse, x[:4], lse[:, :4], None, only_second_half=True)
    with pytest.raises(ValueError, match=r"\[\*heads, t\]"):
        thd.merge_partial(x, lse.t(), x, lse.t())
    with pytest.raises(ValueError, match="float32"):
        thd.merge_partial(x, lse.half(), x, lse)
    with pytest.raises(ValueError, match="first_half_op"):
        thd.grad_correction(x, x, cu, "mul", "none")
    with pytest.raises(ValueError, match="full\\) or"):
        thd.grad_correction(x, x[:3], cu, "add", "none")
    with pytest.raises(ValueError, match="multiple of 2\\*cp"):
        thd.pad_for_cp(x, cu, 2, 6)
    with pytest.raises(ValueError, match="chunk_size"):
        thd.chunkify(cu, 0, 4)
    with pytest.raises(ValueError, match="backend"):
        thd.partition(x, cu, 2, 0, backend="cuda")
    with pytest.raises(ValueError, match="no usable kernel"):
        thd.partition(x, cu, 2, 0, backend="kernel")
    with pytest.raises(ValueError, match="match in every dim"):
        thd.copy_valid_tokens(x, x[:, :1], cu)


def test_validate_errors():
    x = torch.randn(12, 2, 4)
    bad = cu_of([4, 6, 2])  # 6 is not divisible by 2*cp = 4
    thd.partition(x, bad, 2, 0, validate=False)  # unchecked: junk but in bounds
    with pytest.raises(ValueError, match="sequence 1 has length 6, not divisible by 4"):
        thd.partition(x, bad, 2, 0, validate=True)
    with pytest.raises(ValueError, match="not divisible by 4"):
        thd.reorder_to_contiguous(x, bad, 2, validate=True)
    with pytest.raises(ValueError, match="not divisible by 4"):
        thd.partitioned_indices(bad, 2, 1, 12, validate=True)
    odd = cu_of([3, 3])
    with pytest.raises(ValueError, match="not divisible by 2"):
        thd.read_half(torch.randn(6, 1), odd, "first", validate=True)
    with pytest.raises(ValueError, match="not divisible by 2"):
        thd.grad_correction(torch.randn(6, 1), torch.randn(6, 1), odd, "add", "add",
                            validate=True)
    with pytest.raises(ValueError, match="not divisible by 2"):
        thd.merge_partial(torch.randn(6, 1, 2), torch.randn(1, 6), torch.randn(3, 1, 2),
                          torch.randn(1, 3), odd, only_second_half=True, validate=True)
    with pytest.raises(ValueError, match="not divisible by 2"):
        thd.chunkify_diagonal(odd, 2, 2, 0, 8, validate=True)
    dec = torch.tensor([0, 4, 2], dtype=I32)
    with pytest.raises(ValueError, match="non-decreasing"):
        thd.chunkify(dec, 2, 8, validate=True)
    with pytest.raises(ValueError, match="only 12 tokens"):
        thd.partition(x, cu_of([8, 8]), 2, 0, validate=True)
    with pytest.raises(ValueError, match="max_chunks=2 is too small"):
        thd.chunkify(cu_of([5, 5]), 2, 2, validate=True)
    with pytest.raises(ValueError, match="max_chunks=1 is too small"):
        thd.chunkify_diagonal(cu_of([8, 8]), 2, 2, 0, 1, validate=True)
    with pytest.raises(ValueError, match="total_padded=4 is too small"):
        thd.pad_for_cp(torch.randn(6, 1), cu_of([3, 3]), 2, 4, validate=True)
    with pytest.raises(ValueError, match="padded slot"):
        thd.copy_valid_tokens(torch.zeros(6, 1), torch.randn(6, 1), cu_of([3, 3]),
                              cu_of([2, 4]), validate=True)
    with pytest.raises(ValueError, match=r"\[0\] must be 0"):
        thd.partition(torch.randn(8, 1), torch.tensor([4, 8], dtype=I32), 2, 0, validate=True)


def test_cpu_values_checked_by_default():
    """On CPU tensors (no sync) partition, chunkify, pad_for_cp and shard_for_cp check the
    cu_seqlens values by default; validate=False keeps the unchecked path."""
    from rocm_attn import shard_for_cp

    x = torch.randn(12, 2, 4)
    bad = cu_of([4, 6, 2])  # 6 is not divisible by 2*cp = 4
    with pytest.raises(ValueError, match="cu_seqlens_padded: sequence 1 has length 6"):
        thd.partition(x, bad, 2, 0)
    with pytest.raises(ValueError, match="cu_seqlens_padded: sequence 1 has length 6"):
        shard_for_cp(x, bad, 2, 1)
    with pytest.raises(ValueError, match="cu_seqlens_padded: sequence 1 has length 6"):
        thd.partitioned_indices(bad, 2, 1, 12)
    with pytest.raises(ValueError, match="cu_seqlens_padded ends at 16 but x has only 12"):
        shard_for_cp(x, cu_of([8, 8]), 2, 0)
    assert shard_for_cp(x, bad, 2, 1, validate=False).shape == (6, 2, 4)
    dec = torch.tensor([0, 4, 2], dtype=I32)
    with pytest.raises(ValueError, match="cu_seqlens must be non-decreasing: sequence 1"):
        thd.chunkify(dec, 2, 8)
    with pytest.raises(ValueError, match="max_chunks=2 is too small"):
        thd.chunkify(cu_of([5, 5]), 2, 2)
    with pytest.raises(ValueError, match="cu_seqlens ends at 9 but x has only 6"):
        thd.pad_for_cp(torch.randn(6, 1), cu_of([3, 6]), 2)
    with pytest.raises(ValueError, match="total_padded=4 is too small"):
        thd.pad_for_cp(torch.randn(6, 1), cu_of([3, 3]), 2, 4)
    # good values pass unchanged
    cu_p = cu_of([4, 8])
    assert torch.equal(shard_for_cp(x, cu_p, 2, 1), thd.partition(x, cu_p, 2, 1, validate=False))


@pytest.mark.parametrize("bad", ["rows_high", "rows_negative", "step_rows_high"])
def test_merge_rows_and_add_rows_reject_out_of_range_rows(bad):
    """Out-of-range row indices are a ValueError naming the argument (CPU: checked by default),
    not an IndexError; validate=False clamps them into range like the GPU kernels."""
    g = torch.Generator().manual_seed(3)
    t, n = 6, 3
    out = torch.randn(t, 2, 4, generator=g, dtype=torch.float64)
    lse = torch.randn(2, t, generator=g, dtype=torch.float64)
    out_s = torch.randn(n, 2, 4, generator=g, dtype=torch.float64)
    lse_s = torch.randn(2, n, generator=g, dtype=torch.float64)
    rows = torch.tensor([0, 2, 5])
    step_rows = torch.tensor([2, 1, 0])
    if bad == "rows_high":
        rows, val = torch.tensor([0, 6, 2]), "rows\\[1\\] = 6"
    elif bad == "rows_negative":
        rows, val = torch.tensor([-1, 2, 5]), "rows\\[0\\] = -1"
    else:
        step_rows, val = torch.tensor([2, 3, 0]), "step_rows\\[1\\] = 3"
    with pytest.raises(ValueError, match=val + " is out of range"):
        thd.merge_rows_(out.clone(), lse.clone(), out_s, lse_s, rows, step_rows)
    with pytest.raises(ValueError, match=val + " is out of range"):
        thd.add_rows_(out.clone(), out_s, rows, step_rows)
    # unchecked: clamped into range, never an index error; the in-range rows are exact
    got = thd.add_rows_(out.clone(), out_s, rows, step_rows, validate=False)
    want = out.clone()
    for k in range(n):
        want[int(rows[k].clamp(0, t - 1))] += out_s[int(step_rows[k].clamp(0, n - 1))]
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)  # add_rows_ adds in fp32


def test_copy_valid_tokens_rejects_expanded_dst():
    """An expanded (stride-0) dst would get every write once per alias: ValueError naming dst."""
    cu = cu_of([2, 3])
    dst = torch.zeros(1, 4).expand(5, 4)
    with pytest.raises(ValueError, match="dst is written in place but its elements overlap"):
        thd.copy_valid_tokens(dst, torch.randn(5, 4), cu)
    with pytest.raises(ValueError, match="grad is written in place"):
        thd.add_rows_(dst, torch.randn(2, 4), torch.tensor([0, 1]))


def test_env_validate(monkeypatch):
    monkeypatch.setenv("ROCM_ATTN_VALIDATE", "1")
    with pytest.raises(ValueError, match="not divisible"):
        thd.partition(torch.randn(12, 1), cu_of([4, 6, 2]), 2, 0)


# ---------------------------------------------------------------------------
# torch.compile
# ---------------------------------------------------------------------------


def test_compile_partition_and_merge():
    """One fullgraph compile (one inductor build keeps this test fast) of partition, a full
    merge and a second-half merge, against eager."""
    torch._dynamo.reset()
    rng = random.Random(11)
    cp = 2
    lens, plens, cu_p, x = make_cp_case(rng, 9, 12, cp, slack=1)
    cu_loc = thd.local_cu_seqlens(cu_p, cp)
    t_loc = x.shape[0] // cp

    def fn(x, cu_p, out, lse, out_s, lse_s, cu_loc):
        shard = thd.partition(x, cu_p, cp, 1)
        o, l_ = thd.merge_partial(out, lse, out_s, lse_s)
        o, l_ = thd.merge_partial(o, l_, out_s[: t_loc // 2], lse_s[:, : t_loc // 2], cu_loc,
                                  only_second_half=True)
        return shard, o, l_

    g = torch.Generator().manual_seed(1)
    out = torch.randn(t_loc, 3, 2, generator=g)
    lse = torch.randn(3, t_loc, generator=g)
    lse[0, :3] = NEG_INF
    out_s = torch.randn(t_loc, 3, 2, generator=g).bfloat16()
    lse_s = torch.randn(3, t_loc, generator=g)
    lse_s[0, :5] = NEG_INF
    args = (x, cu_p, out, lse, out_s, lse_s, cu_loc)
    got = torch.compile(fn, fullgraph=True)(*args)
    want = fn(*args)
    assert torch.equal(got[0], want[0])
    torch.testing.assert_close(got[1], want[1], rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(got[2], want[2], rtol=1e-6, atol=1e-6)
    assert not torch.isnan(got[1]).any() and not torch.isnan(got[2]).any()


def test_merge_rows_equals_merge_partial_on_gathered_rows():
    """merge_rows_ (packed results merged by row index) is merge_partial on the named rows."""
    gen = torch.Generator().manual_seed(5)
    t, n, h, d = 40, 17, 2, 8
    out = torch.randn(t, h, d, generator=gen, dtype=torch.float64)
    lse = torch.randn(h, t, generator=gen, dtype=torch.float64)
    lse[0, 3] = float("-inf")
    out_step = torch.randn(n, h, d, generator=gen, dtype=torch.float64)
    lse_step = torch.randn(h, n, generator=gen, dtype=torch.float64)
    rows = torch.randperm(t, generator=gen)[:n]
    want_o, want_l = thd.merge_partial(out[rows], lse[:, rows], out_step, lse_step)
    got_o, got_l = thd.merge_rows_(out.clone(), lse.clone(), out_step, lse_step, rows)
    torch.testing.assert_close(got_o[rows], want_o, rtol=0, atol=0)
    torch.testing.assert_close(got_l[:, rows], want_l, rtol=0, atol=0)
    others = torch.ones(t, dtype=torch.bool)
    others[rows] = False
    assert torch.equal(got_o[others], out[others]) and torch.equal(got_l[:, others], lse[:, others])
    with pytest.raises(ValueError, match="rows must be int64"):
        thd.merge_rows_(out, lse, out_step, lse_step, rows.int())


def test_merge_rows_with_step_rows_reads_named_step_rows():
    """step_rows: entry k merges step row step_rows[k] (a result laid out like out, whose other
    rows hold junk) into row rows[k]: the same as gathering those step rows first."""
    gen = torch.Generator().manual_seed(6)
    t, n, h, d = 40, 17, 2, 8
    out = torch.randn(t, h, d, generator=gen, dtype=torch.float64)
    lse = torch.randn(h, t, generator=gen, dtype=torch.float64)
    step_o = torch.randn(t, h, d, generator=gen, dtype=torch.float64)
    step_l = torch.randn(h, t, generator=gen, dtype=torch.float64)
    rows = torch.randperm(t, generator=gen)[:n]
    want_o, want_l = thd.merge_rows_(out.clone(), lse.clone(), step_o[rows], step_l[:, rows], rows)
    step_o_junk, step_l_junk = step_o.clone(), step_l.clone()
    junk = torch.ones(t, dtype=torch.bool)
    junk[rows] = False
    step_o_junk[junk] = float("nan")
    step_l_junk[:, junk] = float("nan")
    got_o, got_l = thd.merge_rows_(out.clone(), lse.clone(), step_o_junk, step_l_junk, rows,
                                   rows.clone())
    assert torch.equal(got_o, want_o) and torch.equal(got_l, want_l)
    with pytest.raises(ValueError, match="step_rows must be int64"):
        thd.merge_rows_(out, lse, step_o, step_l, rows, rows[:-1])


def test_add_rows_adds_named_rows_only():
    gen = torch.Generator().manual_seed(7)
    t, n, h, d = 30, 11, 3, 4
    grad = torch.randn(t, h, d, generator=gen)
    step = torch.randn(t, h, d, generator=gen, dtype=torch.float64).to(torch.bfloat16)
    rows = torch.randperm(t, generator=gen)[:n]
    got = thd.add_rows_(grad.clone(), step, rows, rows)
    want = grad.clone()
    want[rows] = (grad[rows].double() + step[rows].double()).float()
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
    others = torch.ones(t, dtype=torch.bool)
    others[rows] = False
    assert torch.equal(got[others], grad[others])
    packed = thd.add_rows_(grad.clone(), step[rows], rows)  # step row k -> row rows[k]
    assert torch.equal(packed, got)
    with pytest.raises(ValueError, match="rows must be int64"):
        thd.add_rows_(grad, step[rows], rows.int())
    with pytest.raises(ValueError, match="differ after the token dim"):
        thd.add_rows_(grad, step[rows, :1], rows)
