"""The tiled small-seq backward (hip_src/small_seq/tiled_bwd_kernel.h) executed on the CPU
emulation (tests/helpers/emu.py) through its own launcher: 64-lane waves with MFMA (the gfx942
code path) and 32-lane waves (the path of targets without matrix units), against the float64
gradient oracle of tests/helpers/small_seq_tiled_bwd_cases.py. The forward's out and LSE come from the
float64 oracle, so these tests do not depend on the forward kernel. Gradients start as NaN and
unread input rows are NaN, so an unwritten gradient or a stray read fails.

Grid: queries per segment 1, 2, 17 (and 0); keys 0, 1, 17, 64, 300; GQA groups 1, 2, 8; head
dims 64, 128 (256 at 64 lanes); bf16 and fp16; int32 and int64 offsets; THD and BSHD; dlse;
padding rows; bad segments; bitwise determinism (twice, and in reverse schedule order).
"""

from __future__ import annotations

import re

import pytest
import torch

from helpers import emu
from helpers import small_seq_tiled_bwd_cases as G
from helpers import small_seq_tiled_cases as C

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module", params=["tiled_w64", "tiled_w32"], ids=["wave64", "wave32"])
def lib(request):
    return emu.emu_or_skip(request.param)


def run(lib, case, dout, out, lse, dlse):
    lib.stats(reset=True)
    lib.errors(reset=True)
    grads = emu.small_seq_tiled_bwd(lib, dout, case.q, case.k, case.v, out, lse, dlse, case.cu_q,
                                    case.cu_kv, case.seqlens, case.max_q, case.max_kv, case.scale)
    assert lib.stats()["inactive_reads"] == 0, "a lane read a value from an exited lane"
    assert lib.errors() == (0, 0), "the backward counts no segment (the forward did)"
    return grads


def check(lib, case, seed=0, dlse=False):
    dout, out, lse, dl = G.inputs(case, seed, dlse)
    dq, dk, dv = run(lib, case, dout, out, lse, dl)
    G.check_grads(case, dout, dl, dq, dk, dv, f"wave {lib.wave}")
    return dout, out, lse, dl, (dq, dk, dv)


# every queries-per-segment value meets several key counts (and 0 queries, 0 keys)
Q_LENS = [1, 2, 17, 1, 2, 17, 0, 3, 17]
KV_LENS = [300, 64, 17, 17, 1, 0, 5, 0, 64]
GROUPS = [pytest.param(2, 2, id="g1"), pytest.param(4, 2, id="g2"), pytest.param(8, 1, id="g8")]


@pytest.mark.parametrize("passes", list(G.BWD_PASSES))
@pytest.mark.parametrize("h_q,h_kv", GROUPS)
@pytest.mark.parametrize("d", [64, 128])
def test_mixed_segments(lib, d, h_q, h_kv, passes):
    offsets = torch.int64 if d == 64 else torch.int32
    case = C.thd_case(d + h_q, Q_LENS, KV_LENS, h_q, h_kv, d, torch.bfloat16, offsets=offsets)
    with emu.tuning(**G.BWD_PASSES[passes]):
        check(lib, case, seed=d + h_q, dlse=h_q == 4)


@pytest.mark.parametrize("h_q,h_kv", [(8, 2), (2, 2)], ids=["g4", "g1"])
def test_block_passes_many_row_tiles(lib, h_q, h_kv):
    """A dQ pass (more than one key tile and more than one row tile) takes the block dK / dV
    and dQ passes: many row tiles per segment, dQ of one-key-tile segments included."""
    case = C.thd_case(19, [40, 3, 70, 0, 33], [100, 16, 5, 9, 0], h_q, h_kv, 64, torch.bfloat16,
                      offsets=torch.int64)
    lib.mark_kernels()
    with emu.tuning(**G.BWD_PASSES["passes"]):
        check(lib, case, seed=19, dlse=True)
    run_names = "\n".join(lib.kernels_run(since_mark=True))
    assert "small_seq_tiled_bwd_dkv_block_kernel" in run_names
    assert "small_seq_tiled_bwd_dq_block_kernel" in run_names


def test_one_key_tile_fp16_dlse(lib):
    """Every segment within one key tile (kv <= 16: dQ from the dK/dV pass, no dQ pass), fp16,
    with an LSE gradient."""
    case = C.thd_case(3, [1, 17, 2, 0, 5], [16, 3, 1, 7, 0], 8, 2, 128, torch.float16)
    check(lib, case, seed=3, dlse=True)


def test_d256(lib):
    case = C.thd_case(4, [1, 17, 2], [17, 40, 3], 4, 2, 256, torch.bfloat16, offsets=torch.int64)
    check(lib, case, seed=4)


def test_q1_long_histories(lib):
    """One query per segment over long histories (the q=1 path past 16 keys), GQA group 4."""
    case = C.thd_case(11, [1] * 5, [64, 300, 1, 17, 0], 8, 2, 64, torch.bfloat16, max_kv=320)
    check(lib, case, seed=11, dlse=True)


@pytest.mark.parametrize("offsets", [torch.int32, torch.int64], ids=["i32", "i64"])
def test_strided_views_and_padding_rows(lib, offsets):
    """q a head slice of a wider tensor, k/v halves of one fused tensor; q rows before and after
    the segments (padding: dq 0) and unread k/v rows around them (dk = dv = 0)."""
    case = C.thd_case(12, [2, 17, 1, 0, 5], [17, 64, 0, 3, 1], 4, 2, 64, torch.bfloat16,
                      offsets=offsets, strided=True, pad_before=3, pad_after=5, kv_pad=4)
    _, _, _, _, (dq, dk, dv) = check(lib, case, seed=12)
    assert (dq[:3] == 0).all() and (dq[-5:] == 0).all()
    assert (dk[:4] == 0).all() and (dv[-4:] == 0).all()


@pytest.mark.parametrize("offsets", [torch.int32, torch.int64], ids=["i32", "i64"])
def test_bshd(lib, offsets):
    """BSHD q [b, s_q, h, d], k/v [b, s_kv, h, d] with seqlens_kv: rows past a length get zero
    gradient; a length past s_kv is a bad segment (NaN dq, zero dk / dv)."""
    case = C.bshd_case(14, 17, [0, 1, 17, 40, 3], 40, 4, 2, 64, torch.bfloat16, offsets=offsets)
    check(lib, case, seed=14)
    case = C.bshd_case(15, 3, [5, 41, 2], 40, 2, 2, 128, torch.bfloat16, offsets=offsets,
                       max_kv=64)
    case.seqlens[1] = 41  # <= max_seqlen_kv but > s_kv
    _, _, _, _, (dq, dk, dv) = check(lib, case, seed=15)
    assert torch.isnan(dq[1]).all() and (dk[1] == 0).all() and (dv[1] == 0).all()


@pytest.mark.parametrize("passes", list(G.BWD_PASSES))
def test_bad_segments_int64(lib, passes):
    """Offsets that break the contract, int64: more queries than max_seqlen_q, a negative key
    count, keys past the end of k/v (2^40): NaN dq on the bad segments' rows, zero dk / dv on
    their keys, nothing read out of bounds, every other segment exact."""
    q_lens, kv_lens = [3, 1, 17, 2, 40, 5, 1, 2], [5, 17, 64, 3, 10, 4, 9, 7]
    case = C.thd_case(16, q_lens, kv_lens, 4, 2, 64, torch.bfloat16, offsets=torch.int64,
                      max_q=17, max_kv=64, pad_before=2, pad_after=2)
    case.cu_kv[6] = case.cu_kv[5] - 1  # segment 5: -1 keys (6 then overlaps 4's keys)
    case.cu_kv[8] = 2**40  # segment 7: keys past the end of k/v
    with emu.tuning(**G.BWD_PASSES[passes]):
        _, _, _, _, (dq, dk, dv) = check(lib, case, seed=16)
    k7 = int(case.cu_kv[7])
    assert (dk[k7:] == 0).all() and (dv[k7:] == 0).all()


def test_bad_segments_int32_wrap(lib):
    """int32 offsets whose 32-bit difference wraps into the valid range (2147483640 to
    -2147483640 reads as 16 keys) and a negative start: flagged, never read."""
    case = C.thd_case(17, [1, 2, 17, 1, 3], [4, 6, 9, 2, 5], 2, 2, 128, torch.bfloat16,
                      max_kv=16)
    case.cu_kv[2] = 2147483640
    case.cu_kv[3] = -2147483640
    check(lib, case, seed=17)


@pytest.mark.parametrize("passes", list(G.BWD_PASSES))
def test_deterministic(lib, monkeypatch, passes):
    """Twice, then with blocks, waves and lanes in reverse order (RA_EMU_REVERSE=1): bitwise the
    same gradients (a result that depended on the schedule, e.g. a missing barrier of the block
    pass's staging, would be a race)."""
    case = C.thd_case(18, [17, 2, 1, 17], [300, 64, 17, 5], 8, 2, 64, torch.bfloat16)
    assert_schedule_free(lib, case, G.BWD_PASSES[passes], 18, monkeypatch)


def assert_schedule_free(lib, case, knobs, seed, monkeypatch):
    """The gradients of `case` under tuning `knobs`, checked against the oracle, then computed
    again and with blocks, waves and lanes in reverse order (RA_EMU_REVERSE=1): bitwise the
    same each time."""
    with emu.tuning(**knobs):
        dout, out, lse, dl, first = check(lib, case, seed=seed, dlse=True)
        second = run(lib, case, dout, out, lse, dl)
        monkeypatch.setenv("RA_EMU_REVERSE", "1")
        third = run(lib, case, dout, out, lse, dl)
        monkeypatch.delenv("RA_EMU_REVERSE")
    G.assert_same_bits(first, second)
    G.assert_same_bits(first, third)


def test_oracle_matches_autograd_of_reference():
    """The gradient oracle agrees with autograd through rocm_attn.reference (no mask) on valid
    THD inputs, in float64 (no emulation involved)."""
    from rocm_attn.reference import reference_attention

    case = C.thd_case(19, [1, 2, 17, 0, 3], [300, 64, 17, 5, 0], 8, 2, 64, torch.float32)
    case.q, case.k, case.v = case.q.double(), case.k.double(), case.v.double()
    gen = torch.Generator().manual_seed(19)
    dout = torch.randn(*case.q.shape, generator=gen, dtype=torch.float64)
    dq, dk, dv, _, _, _, _ = G.oracle_grads(case, dout, None)
    q, k, v = (t.clone().requires_grad_(True) for t in (case.q, case.k, case.v))
    out, _ = reference_attention(q, k, v, case.cu_q, case.cu_kv, attn_mask_type="no_mask",
                                 softmax_scale=case.scale)
    rq, rk, rv = torch.autograd.grad((out * dout).sum(), (q, k, v))
    for x, r in ((dq, rq), (dk, rk), (dv, rv)):
        torch.testing.assert_close(x, r, rtol=1e-10, atol=1e-10)


def test_swapped_mfma_operands_fail(lib):
    """With MFMA operands swapped (the emulation's fault switch) the 64-lane gradients must fail
    the oracle: the comparison sees the matrix-unit path."""
    if lib.wave != 64:
        pytest.skip("the 32-lane path has no matrix units")
    case = C.thd_case(20, [17, 2, 1], [64, 17, 5], 8, 2, 64, torch.bfloat16)
    dout, out, lse, dl = G.inputs(case, 20, False)
    lib.lib.ra_emu_set_faults(1)
    try:
        dq, dk, dv = run(lib, case, dout, out, lse, dl)
    finally:
        lib.lib.ra_emu_set_faults(0)
    with pytest.raises(AssertionError):
        G.check_grads(case, dout, dl, dq, dk, dv)


@pytest.mark.parametrize("h_q,h_kv", [(8, 1), (2, 2)], ids=["g8", "g1"])
def test_tile_boundaries(lib, h_q, h_kv):
    """Rows per (segment, kv head) of 16 (one row tile: one item walks every key tile) and 17+
    (the dK/dV items per key tile plus the dQ pass), against 16 keys (one key tile) and 17."""
    group = h_q // h_kv
    q_lens = [16 // group, 16 // group + 1, 16 // group, 16 // group + 1, 1]
    case = C.thd_case(21 + h_q, q_lens, [16, 16, 17, 17, 33], h_q, h_kv, 64, torch.bfloat16)
    check(lib, case, seed=21, dlse=True)


# The streaming kernel (tiled_bwd_stream_kernel.h): at most 4 rows per (segment, kv head).
STREAM = "small_seq_tiled_bwd_stream_kernel"


def ran_stream(lib):
    return STREAM in "\n".join(lib.kernels_run(since_mark=True))


def check_stream(lib, case, seed, passes, dlse=False):
    lib.mark_kernels()
    with emu.tuning(**G.STREAM_PASSES[passes]):
        result = check(lib, case, seed=seed, dlse=dlse)
    assert ran_stream(lib)
    return result


@pytest.mark.parametrize("passes", list(G.STREAM_PASSES))
@pytest.mark.parametrize("h_q,h_kv,max_q", [(2, 2, 1), (4, 2, 1), (6, 2, 1), (8, 2, 1),
                                            (2, 2, 4), (4, 2, 2), (2, 1, 2)],
                         ids=["g1q1", "g2q1", "g3q1", "g4q1", "g1q4", "g2q2", "g2q2_mqa"])
@pytest.mark.parametrize("d", [64, 128])
def test_stream_rows_and_histories(lib, d, h_q, h_kv, max_q, passes):
    """Every row count 1..4 the kernel holds (queries x GQA group), histories of 0, 1, 5, 17,
    64 and 300 keys (partial block steps and several unrolled steps), segments without
    queries, with and without an LSE gradient."""
    q_lens = [max_q, 1, max_q, 0, max_q, 1, max_q]
    kv_lens = [300, 64, 17, 5, 1, 0, 33]
    offsets = torch.int64 if d == 64 else torch.int32
    case = C.thd_case(30 + d + h_q + max_q, q_lens, kv_lens, h_q, h_kv, d, torch.bfloat16,
                      offsets=offsets, max_q=max_q, max_kv=320)
    check_stream(lib, case, 30 + h_q, passes, dlse=max_q == 1)


@pytest.mark.parametrize("passes", list(G.STREAM_PASSES))
@pytest.mark.parametrize("h_q", [1, 2, 4])
def test_stream_d256_fp16(lib, h_q, passes):
    case = C.thd_case(40, [1, 1, 0, 1], [70, 1, 9, 0], h_q, 1, 256, torch.float16, max_kv=80)
    check_stream(lib, case, 40, passes, dlse=True)


@pytest.mark.parametrize("passes", list(G.STREAM_PASSES))
@pytest.mark.parametrize("offsets", [torch.int32, torch.int64], ids=["i32", "i64"])
def test_stream_strided_padding_bshd(lib, offsets, passes):
    """Strided views with q padding rows and unread k/v rows around the segments (dq 0,
    dk = dv = 0), then BSHD with a length past s_kv (a bad segment: NaN dq, zero dk / dv)."""
    case = C.thd_case(41, [1, 1, 0, 1, 1], [17, 64, 3, 0, 200], 4, 1, 64, torch.bfloat16,
                      offsets=offsets, strided=True, pad_before=3, pad_after=5, kv_pad=4)
    _, _, _, _, (dq, dk, dv) = check_stream(lib, case, 41, passes)
    assert (dq[:3] == 0).all() and (dq[-5:] == 0).all()
    assert (dk[:4] == 0).all() and (dv[-4:] == 0).all()
    for s_q, h_q in ((1, 4), (2, 2), (4, 1)):
        case = C.bshd_case(42, s_q, [5, 41, 0, 40], 40, h_q, 1, 128, torch.bfloat16,
                           offsets=offsets, max_kv=64)
        case.seqlens[1] = 41  # <= max_seqlen_kv but > s_kv
        _, _, _, _, (dq, dk, dv) = check_stream(lib, case, 42, passes)
        assert torch.isnan(dq[1]).all() and (dk[1] == 0).all() and (dv[1] == 0).all()


@pytest.mark.parametrize("passes", list(G.STREAM_PASSES))
def test_stream_bad_segments(lib, passes):
    """Bad offsets (more queries than max_seqlen_q, a negative key count, keys past the end of
    k/v, an int32 difference that wraps into range): flagged rows NaN, keys zero, nothing read
    out of bounds, the other segments exact."""
    q_lens, kv_lens = [1, 2, 1, 1, 1, 1, 1], [5, 17, 64, 3, 10, 4, 9]
    case = C.thd_case(43, q_lens, kv_lens, 2, 2, 64, torch.bfloat16, offsets=torch.int64,
                      max_q=1, max_kv=64, pad_before=2, pad_after=2)
    case.cu_kv[4] = case.cu_kv[3] - 1  # segment 3: -1 keys (4 then overlaps 2's keys)
    case.cu_kv[7] = 2**40  # segment 6: keys past the end of k/v
    _, _, _, _, (dq, dk, dv) = check_stream(lib, case, 43, passes)
    k6 = int(case.cu_kv[6])
    assert (dk[k6:] == 0).all() and (dv[k6:] == 0).all()
    case = C.thd_case(44, [1, 1, 1, 1], [4, 6, 9, 2], 4, 1, 128, torch.bfloat16, max_kv=16)
    case.cu_kv[1] = 2147483640
    case.cu_kv[2] = -2147483640
    check_stream(lib, case, 44, passes)


@pytest.mark.parametrize("passes", list(G.STREAM_PASSES))
def test_stream_deterministic(lib, monkeypatch, passes):
    """Twice, then with blocks, waves and lanes in reverse order: bitwise the same gradients
    (a block-wide item sums dq over its waves through shared memory in wave order)."""
    case = C.thd_case(45, [1, 1, 1, 1], [300, 64, 17, 5], 8, 2, 64, torch.bfloat16)
    assert_schedule_free(lib, case, G.STREAM_PASSES[passes], 45, monkeypatch)


@pytest.mark.parametrize("passes", list(G.STREAM_PASSES))
def test_stream_items_reuse_blocks(lib, passes, monkeypatch):
    """Many more (segment, kv head) items than the emulated grid's blocks, bad segments among
    them: every block and wave takes several items in turn (a block-wide item's shared-memory
    partials are overwritten by the next one only after the barrier), in both schedule
    orders."""
    gen = torch.Generator().manual_seed(48)
    b = 60
    kv_lens = torch.randint(0, 70, (b,), generator=gen).tolist()
    q_lens = torch.randint(0, 2, (b,), generator=gen).tolist()
    case = C.thd_case(48, q_lens, kv_lens, 4, 2, 64, torch.bfloat16, offsets=torch.int64,
                      max_q=1, max_kv=80)
    case.cu_kv[11] = case.cu_kv[10] - 1  # segment 10: -1 keys
    case.cu_q[31] = case.cu_q[30] + 3  # segment 30: more queries than max_seqlen_q
    check_stream(lib, case, 48, passes, dlse=True)
    monkeypatch.setenv("RA_EMU_REVERSE", "1")
    check_stream(lib, case, 48, passes, dlse=True)


def test_stream_non_finite_v_of_a_segment_without_queries(lib):
    """inf in the V rows of a segment with no queries: its keys' dk and dv are 0 (no query
    attends to them), and the other segments are exact."""
    case = C.thd_case(49, [1, 0, 1], [9, 7, 5], 8, 2, 64, torch.bfloat16)
    case.v[9:16] = float("inf")
    _, _, _, _, (dq, dk, dv) = check_stream(lib, case, 49, "stream_wave")
    assert (dk[9:16] == 0).all() and (dv[9:16] == 0).all()


def test_stream_off_keeps_matrix_passes(lib):
    """Rows past the bound (5 per kv head) and tuning 0 leave the streaming kernel out."""
    case = C.thd_case(46, [5, 1, 3], [40, 17, 2], 2, 2, 64, torch.bfloat16)
    lib.mark_kernels()
    with emu.tuning(**G.STREAM_PASSES["stream_wave"]):
        check(lib, case, seed=46)
    assert not ran_stream(lib)
    case = C.thd_case(47, [1, 1], [40, 17], 2, 2, 64, torch.bfloat16)
    with emu.tuning(**G.BWD_PASSES["passes"]):
        check(lib, case, seed=47)
    assert not ran_stream(lib)


# The dK / dV pass's one-row-tile instance (tiled_bwd_kernel.h, ROW_TILE_CALL): 5..16 rows per
# (segment, kv head); its last template argument FUSED_DELTA (Delta computed by the items, no
# Delta pass) by default where every history fits one key tile (max_seqlen_kv <= 16).
ROW_TILE = re.compile(r"small_seq_tiled_bwd_dkv_kernel<[^>]*, true, (true|false)>")
DELTA_PASS = "small_seq_tiled_bwd_delta_kernel"


def ran_row_tile(lib):
    """"fused" / "delta_pass" (the one-row-tile instance ran, with Delta computed by its items /
    from the Delta pass, which ran before it), or None (the instance did not run)."""
    names = lib.kernels_run(since_mark=True)
    found = [m.group(1) for m in (ROW_TILE.search(k) for k in names) if m]
    if not found:
        return None
    assert len(set(found)) == 1, names
    delta_pass = any(DELTA_PASS in k for k in names)
    assert delta_pass == (found[0] == "false"), names
    return "fused" if found[0] == "true" else "delta_pass"


def check_row_tile(lib, case, seed, dlse=False):
    """The instance (Delta fused where max_seqlen_kv <= 16, else from the Delta pass) against
    the oracle and against the general instance's one-row-tile items, Delta from the Delta pass:
    bitwise where the instance takes the Delta pass too (the same item, the same Delta) and at
    32 lanes (the scalar item's fused Delta = rowsum(dO O) in pass 1's lane layout and order),
    else close. The comparisons leave out the rows the contract leaves open (k/v rows two garbage
    segments claim hold either writer's value, by schedule). Returns the instance's
    gradients."""
    lib.mark_kernels()
    with emu.tuning(**G.ROW_TILE_PASS):
        dout, out, lse, dl, grads = check(lib, case, seed=seed, dlse=dlse)
    fused = case.max_kv <= 16
    assert ran_row_tile(lib) == ("fused" if fused else "delta_pass")
    lib.mark_kernels()
    with emu.tuning(**G.BWD_PASSES["passes"]):
        general = run(lib, case, dout, out, lse, dl)
    assert ran_row_tile(lib) is None
    if fused and lib.wave == 64:
        G.assert_close_grads(grads, general, case)
    else:
        G.assert_same_bits(grads, general, case)
    return grads


@pytest.mark.parametrize("h_q,h_kv,max_q", [(2, 2, 16), (2, 2, 5), (8, 1, 2), (6, 2, 5)],
                         ids=["g1q16", "g1q5", "g8q2", "g3q5"])
@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("max_kv", [16, 320], ids=["one_key_tile", "key_tiles"])
def test_row_tile_rows_and_histories(lib, d, h_q, h_kv, max_q, max_kv):
    """Row counts 5..16, histories of 0, 1, 5, 9, 16 keys (one key tile: Delta from the tile's
    own products) and of up to 300 keys (several key tiles: Delta from the Delta pass),
    segments without queries, int32 and int64 offsets."""
    if d == 256 and lib.wave == 32:
        pytest.skip("d 256 runs at 64 lanes (the 32-lane scalar path is d-generic)")
    q_lens = [max_q, 1, max_q, 0, max_q, 3, max_q, max_q]
    kv_lens = [300, 64, 17, 5, 1, 0, 16, 33] if max_kv > 16 else [16, 9, 12, 5, 1, 0, 16, 3]
    offsets = torch.int64 if d == 64 else torch.int32
    case = C.thd_case(70 + d + h_q + max_q, q_lens, kv_lens, h_q, h_kv, d, torch.bfloat16,
                      offsets=offsets, max_q=max_q, max_kv=max_kv)
    check_row_tile(lib, case, 70 + h_q, dlse=max_q == 2)


@pytest.mark.parametrize("offsets", [torch.int32, torch.int64], ids=["i32", "i64"])
def test_row_tile_bad_segments_strided_bshd(lib, offsets, monkeypatch):
    """Strided views with padding rows (dq 0: written by the fused instance, the Delta pass
    does not run), bad segments (more queries than max_seqlen_q, a negative key count, keys
    past the end), BSHD (histories past one key tile: the Delta pass); in both schedule
    orders."""
    case = C.thd_case(75, [3, 16, 2, 20, 1, 16, 4], [5, 16, 14, 12, 10, 1, 7], 2, 2, 64,
                      torch.bfloat16, offsets=offsets, strided=True, pad_before=3, pad_after=2,
                      kv_pad=3, max_q=16, max_kv=16)
    case.cu_kv[5] = case.cu_kv[4] - 1  # segment 4: -1 keys
    case.cu_kv[7] = 2**31 - 8 if offsets == torch.int32 else 2**40  # segment 6: past the end
    dq, _, _ = check_row_tile(lib, case, 75, dlse=offsets == torch.int64)
    assert (dq[:3] == 0).all() and (dq[-2:] == 0).all()
    monkeypatch.setenv("RA_EMU_REVERSE", "1")
    check_row_tile(lib, case, 75)
    case = C.bshd_case(76, 8, [5, 41, 0, 30], 30, 2, 2, 64, torch.bfloat16, offsets=offsets)
    case.seqlens[1] = 31  # <= max_seqlen_kv but > s_kv
    case.max_kv = 40
    _, dk, dv = check_row_tile(lib, case, 76, dlse=True)
    assert (dk[1] == 0).all() and (dv[1] == 0).all()


@pytest.mark.parametrize("d", [64, 128])
def test_row_tile_fused_delta_one_key_tile(lib, d):
    """Delta fused where every history fits one key tile (from that tile's products: dlse,
    empty segments, THD padding rows whose dq the instance zeroes), the Delta pass past 16
    keys."""
    case = C.thd_case(77 + d, [16, 5, 0, 3, 16, 8], [16, 1, 4, 0, 9, 16], 4, 4, d,
                      torch.float16, max_q=16, max_kv=16, pad_before=4, pad_after=3)
    dq, _, _ = check_row_tile(lib, case, 77, dlse=True)
    assert (dq[:4] == 0).all() and (dq[-3:] == 0).all()
    case = C.thd_case(78 + d, [16, 5], [17, 1], 4, 4, d, torch.float16, max_q=16, max_kv=17)
    lib.mark_kernels()
    with emu.tuning(**G.ROW_TILE_PASS):
        check(lib, case, seed=78)
    assert ran_row_tile(lib) == "delta_pass"


def test_row_tile_non_finite_dout_row(lib):
    """A NaN in one dO row of each of two segments: with Delta fused, NaN gradients stay on
    the rows and keys of those segments (each item sums only its own segment's products), the
    other segments exact as with the Delta pass."""
    q_lens, kv_lens = [4, 6, 2, 5, 3], [14, 9, 16, 12, 7]
    case = C.thd_case(79, q_lens, kv_lens, 4, 2, 64, torch.bfloat16, max_q=8, max_kv=16,
                      pad_before=2, pad_after=1)
    dout, out, lse, dl = G.inputs(case, 79, True)
    q0 = [2 + sum(q_lens[:i]) for i in range(len(q_lens) + 1)]
    k0 = [int(x) for x in case.cu_kv.tolist()]
    poisoned = (1, 2)  # segment 1: 9 keys, segment 2: 16 keys
    for seg in poisoned:
        dout[q0[seg] + 1, 3, 7] = float("nan")
    grads = {}
    for name, knobs in (("fused", G.ROW_TILE_PASS), ("delta_pass", G.BWD_PASSES["passes"])):
        lib.mark_kernels()
        with emu.tuning(**knobs):
            grads[name] = run(lib, case, dout, out, lse, dl)
        assert ran_row_tile(lib) == ("fused" if name == "fused" else None)
    dq, dk, dv = grads["fused"]
    for seg in poisoned:
        assert torch.isnan(dq[q0[seg] + 1]).any() and torch.isnan(dk[k0[seg]:k0[seg + 1]]).any()
    q_ok = torch.ones(dq.shape[0], dtype=torch.bool)
    kv_ok = torch.ones(dk.shape[0], dtype=torch.bool)
    for seg in poisoned:
        q_ok[q0[seg]:q0[seg + 1]] = False
        kv_ok[k0[seg]:k0[seg + 1]] = False
    assert not torch.isnan(dq[q_ok]).any(), "a NaN dO row leaked into another segment's dq"
    assert not torch.isnan(dk[kv_ok]).any() and not torch.isnan(dv[kv_ok]).any()
    two = grads["delta_pass"]
    G.assert_close_grads((dq[q_ok], dk[kv_ok], dv[kv_ok]),
                         (two[0][q_ok], two[1][kv_ok], two[2][kv_ok]))
