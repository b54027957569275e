"""The tiled small-seq forward (hip_src/small_seq/tiled_fwd_kernel.h) executed on the CPU
emulation (tests/helpers/emu.py) through its own launcher: 64-lane waves with MFMA (the gfx942
code path) and 32-lane waves (the path of targets without matrix units), against the float64
oracle of tests/helpers/small_seq_tiled_cases.py. Outputs start as NaN and unread input rows are NaN,
so an unwritten output or a stray read fails.

Grid: queries per segment 1, 2, 17, 40 (and 0); keys 0, 1, 17, 64, 300; GQA groups 1, 2, 8;
head dims 64, 128, 256; bf16 and fp16; int32 and int64 offsets; THD and BSHD; strided views;
padding rows; bad segments flagged with NaN. All three kernels: the launcher sends many rows
over histories that fit a block's shared memory to the resident kernel, many rows over longer
ones to the block kernel (K/V staged per key tile), the rest to the wave kernel; the
mixed-segment cases also run on the wave kernel alone.
"""

from __future__ import annotations


import pytest
import torch

from helpers import emu
from helpers import small_seq_tiled_cases as C
from helpers import small_seq_variants as V

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module", params=["tiled_w64", "tiled_w32"], ids=["wave64", "wave32"])
def lib(request):
    return emu.emu_or_skip(request.param)


def run(lib, case, return_softmax=True):
    lib.stats(reset=True)
    lib.errors(reset=True)
    out, lse, probs = emu.small_seq_tiled_fwd(lib, *case.args(), return_softmax=return_softmax)
    assert lib.stats()["inactive_reads"] == 0, "a lane read a value from an exited lane"
    return out, lse, probs if return_softmax else None


def check_valid(lib, case, return_softmax=True):
    out, lse, probs = run(lib, case, return_softmax)
    C.check(case, out, lse, probs, f"wave {lib.wave}", expect_bad=[])
    assert lib.errors() == (0, 0), "valid inputs tripped the device error counter"
    return out, lse, probs


# every queries-per-segment value meets several key counts (and 0 queries, 0 keys)
Q_LENS = [1, 2, 17, 40, 1, 2, 17, 40, 0, 3, 1]
KV_LENS = [300, 64, 17, 1, 0, 17, 300, 64, 5, 0, 1]
GROUPS = [pytest.param(2, 2, id="g1"), pytest.param(4, 2, id="g2"), pytest.param(8, 1, id="g8")]


# the plan's choice (here the block kernel: many rows over histories longer than a block's
# shared memory holds), the wave kernel for the same calls and the block kernel forced (tuning
# of the variant table, tests/helpers/small_seq_variants.py FWD_FORCINGS)
KERNELS = V.forcings("auto", "wave", "block")
# The resident kernel (a segment's whole K/V in shared memory; the emulation gives a block
# 64 KiB, as gfx942 has): the plan's choice for many rows over histories that fit, and
# forced on every call (2), with softmax steps of four key tiles (the plan's choice here:
# histories reach 64 keys) and of one.
RESIDENT = V.forcings("auto", "resident", "resident_step16")
# histories that fit 64 KiB at d 128 (K and V of 96 keys, rows padded: 57 KiB)
KV_LENS_RESIDENT = [96, 64, 17, 1, 0, 17, 96, 64, 5, 0, 1]


@pytest.mark.parametrize("kernel", list(KERNELS))
@pytest.mark.parametrize("h_q,h_kv", GROUPS)
@pytest.mark.parametrize("d", [64, 128])
def test_mixed_segments(lib, d, h_q, h_kv, kernel):
    offsets = torch.int64 if d == 64 else torch.int32
    case = C.thd_case(d + h_q, Q_LENS, KV_LENS, h_q, h_kv, d, torch.bfloat16, offsets=offsets)
    with emu.tuning(**KERNELS[kernel]):
        check_valid(lib, case)


@pytest.mark.parametrize("kernel", list(RESIDENT))
@pytest.mark.parametrize("h_q,h_kv", GROUPS)
@pytest.mark.parametrize("d", [64, 128])
def test_resident_kernel(lib, d, h_q, h_kv, kernel):
    """Segments of 0..40 queries over 0..96 keys; the shared memory starts as NaN (the
    emulation poisons it), so a key tile read before it was staged fails."""
    offsets = torch.int32 if d == 64 else torch.int64
    case = C.thd_case(30 + d + h_q, Q_LENS, KV_LENS_RESIDENT, h_q, h_kv, d, torch.bfloat16,
                      offsets=offsets, pad_before=2, pad_after=3)
    with emu.tuning(**RESIDENT[kernel]):
        check_valid(lib, case, return_softmax=kernel != "auto")
        if kernel != "auto":
            assert any("small_seq_tiled_fwd_resident_kernel" in k for k in lib.kernels_run())
        if kernel == "resident":  # one block per item, and splits of a segment's row tiles
            with emu.tuning(small_seq_tiled_fwd_grid=0):
                check_valid(lib, case, return_softmax=False)


@pytest.mark.parametrize("max_q", [2, 3])
def test_few_rows_over_long_histories_take_the_wave_kernel(lib, max_q):
    """A (segment, kv head) of 16 or 24 rows (8 q heads per kv head) over histories past 64
    keys: more rows than a 32-lane wave's tile, fewer than half a default block. The block
    kernel's small blocks stage by cp.async, which the emulated device (as HIP builds) has
    not: the wave kernel serves them, and no block kernel runs."""
    q_lens = [max_q, 1, max_q, 0, 2, max_q, 1]
    kv_lens = [300, 65, 17, 100, 0, 1, 200]
    case = C.thd_case(50 + max_q, q_lens, kv_lens, 8, 1, 128, torch.bfloat16, max_q=max_q,
                      max_kv=300, pad_before=1, pad_after=2)
    lib.mark_kernels()
    check_valid(lib, case)
    ran = [k for k in lib.kernels_run(since_mark=True) if "small_seq_tiled_fwd" in k]
    assert ran and not any("block_kernel" in k for k in ran), ran


def test_resident_kernel_bad_segments(lib):
    """The resident kernel flags bad segments (too many queries, negative key count, keys past
    the end of k/v) and stages nothing for them; the other segments stay exact."""
    q_lens, kv_lens = [3, 1, 17, 2, 40, 5, 1, 2], [5, 17, 64, 3, 10, 1, 0, 7]
    case = C.thd_case(36, q_lens, kv_lens, 4, 2, 64, torch.bfloat16, offsets=torch.int64,
                      max_q=17, max_kv=64, pad_before=2, pad_after=2)
    case.cu_kv[6] = case.cu_kv[5] - 1
    case.cu_kv[8] = 2**40
    with emu.tuning(small_seq_tiled_resident=2):
        out, lse, probs = run(lib, case)
    bad = C.check(case, out, lse, probs, f"wave {lib.wave}", expect_bad=[4, 5, 7])
    assert lib.errors() == (len(bad), 0x7FFFFFFF - bad[0])


@pytest.mark.parametrize("h_q,h_kv", [(2, 2), (8, 2)], ids=["g1", "g4"])
def test_fp16_and_d256(lib, h_q, h_kv):
    case = C.thd_case(7 + h_q, [1, 17, 2, 0], [64, 17, 300, 3], h_q, h_kv, 128, torch.float16)
    check_valid(lib, case)
    case = C.thd_case(8 + h_q, [1, 17, 2], [17, 40, 0], h_q, h_kv, 256, torch.bfloat16,
                      offsets=torch.int64)
    check_valid(lib, case)


def test_q1_long_histories(lib):
    """One query per segment over long histories (the q=1 path past 16 keys), GQA group 4."""
    case = C.thd_case(11, [1] * 6, [64, 300, 1, 17, 0, 256], 8, 2, 128, torch.bfloat16,
                      max_kv=320)
    check_valid(lib, case)
    check_valid(lib, case, return_softmax=False)


@pytest.mark.parametrize("offsets", [torch.int32, torch.int64], ids=["i32", "i64"])
def test_strided_views_and_padding_rows(lib, offsets):
    """q a head slice of a wider tensor, k/v halves of one fused tensor; q rows before and after
    the segments (padding: out 0, lse -inf, probs 0) and unread k/v rows around them."""
    case = C.thd_case(12, [2, 17, 1, 0, 5], [17, 64, 0, 3, 1], 4, 2, 64, torch.bfloat16,
                      offsets=offsets, strided=True, pad_before=3, pad_after=5, kv_pad=4)
    out, lse, probs = check_valid(lib, case)
    assert (out[:3] == 0).all() and (out[-5:] == 0).all()
    assert torch.isneginf(lse[:, :3]).all() and torch.isneginf(lse[:, -5:]).all()
    # every segment without queries: all rows are padding
    case = C.thd_case(13, [0, 0, 0], [3, 0, 17], 2, 1, 64, torch.bfloat16, offsets=offsets,
                      pad_before=2, pad_after=4, max_q=1)
    out, lse, probs = check_valid(lib, case)
    assert (out == 0).all() and torch.isneginf(lse).all() and (probs == 0).all()


@pytest.mark.parametrize("offsets", [torch.int32, torch.int64], ids=["i32", "i64"])
def test_bshd(lib, offsets):
    """BSHD q [b, s_q, h, d] (s_q = max_seqlen_q), k/v [b, s_kv, h, d] with seqlens_kv; one length
    past s_kv is a bad segment."""
    case = C.bshd_case(14, 17, [0, 1, 17, 40, 3], 40, 4, 2, 64, torch.bfloat16, offsets=offsets)
    check_valid(lib, case)
    case = C.bshd_case(15, 3, [5, 41, 2], 40, 2, 2, 128, torch.bfloat16, offsets=offsets,
                       max_kv=64)
    case.seqlens[1] = 41  # <= max_seqlen_kv but > s_kv
    out, lse, probs = run(lib, case)
    C.check(case, out, lse, probs, f"wave {lib.wave}", expect_bad=[1])
    assert lib.errors() == (1, 0x7FFFFFFF - 1)


def test_bad_segments_int64(lib):
    """Offsets that break the contract, int64: a segment with more queries than max_seqlen_q, a
    negative key count, keys past the end of k/v (2^40): each counted once (lowest index
    reported), NaN on its rows, nothing read out of bounds, every other segment exact."""
    q_lens, kv_lens = [3, 1, 17, 2, 40, 5, 1, 2], [5, 17, 64, 3, 10, 1, 0, 7]
    case = C.thd_case(16, q_lens, kv_lens, 4, 2, 64, torch.bfloat16, offsets=torch.int64,
                      max_q=17, max_kv=64, pad_before=2, pad_after=2)
    case.cu_kv[6] = case.cu_kv[5] - 1  # segment 5: -1 keys
    case.cu_kv[8] = 2**40  # segment 7: keys past the end of k/v
    out, lse, probs = run(lib, case)
    bad = C.check(case, out, lse, probs, f"wave {lib.wave}", expect_bad=[4, 5, 7])
    assert lib.errors() == (len(bad), 0x7FFFFFFF - bad[0])


def test_bad_segments_int32_wrap(lib):
    """int32 offsets whose 32-bit difference wraps into the valid range (2147483640 to
    -2147483640 reads as 16 keys) and a negative start: flagged, never read."""
    case = C.thd_case(17, [1, 2, 17, 1, 3], [4, 6, 9, 2, 5], 2, 2, 128, torch.bfloat16,
                      max_kv=16)
    case.cu_kv[2] = 2147483640
    case.cu_kv[3] = -2147483640
    out, lse, probs = run(lib, case)
    C.check(case, out, lse, probs, f"wave {lib.wave}", expect_bad=[1, 2, 3])
    assert lib.errors() == (3, 0x7FFFFFFF - 1)


@pytest.mark.parametrize("kernel", list(KERNELS))
def test_one_block_per_item(lib, kernel):
    """The grid-stride loops with a grid of one block per item group (tuning
    small_seq_tiled_fwd_grid=0) and with the default residency-sized grid give the same
    results, for the wave and the block kernel."""
    case = C.thd_case(18, Q_LENS, KV_LENS, 4, 2, 64, torch.bfloat16)
    with emu.tuning(**KERNELS[kernel]):
        a = check_valid(lib, case)
        with emu.tuning(small_seq_tiled_fwd_grid=0):
            b = check_valid(lib, case)
    for x, y in zip(a, b):
        assert torch.equal(x, y)


def test_oracle_matches_reference_attention():
    """The tests' segment-by-segment oracle agrees with rocm_attn.reference (no mask) on valid
    THD inputs, in float64 (no emulation involved)."""
    from rocm_attn.reference import reference_attention

    case = C.thd_case(19, [1, 2, 17, 40, 0, 3], [300, 64, 17, 1, 5, 0], 8, 2, 64, torch.float32)
    case.q, case.k, case.v = case.q.double(), case.k.double(), case.v.double()
    out, lse, probs, bad, _, _ = C.oracle(case)
    assert bad == []
    ref_out, ref_lse = reference_attention(case.q, case.k, case.v, case.cu_q, case.cu_kv,
                                           attn_mask_type="no_mask", softmax_scale=case.scale)
    torch.testing.assert_close(out, ref_out, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(lse, ref_lse.double(), rtol=1e-12, atol=1e-12)
    sums = probs.sum(-1)[torch.isfinite(lse.T)]
    assert torch.allclose(sums, torch.ones_like(sums))


@pytest.mark.parametrize("d", [64, 128])
def test_one_tile_instance(lib, d):
    """Histories of at most one key tile (max_seqlen_kv <= 16, d <= 128) run the wave kernel's
    one-tile instance (tiled_fwd_kernel.h ONE_TILE: no streaming path, registers capped),
    bitwise equal to the general wave kernel (tuning small_seq_tiled_one_tile=0), on ragged
    segments of 0..40 queries with a GQA group of 4, int64 offsets and padding rows; bad
    segments are flagged the same way by both."""
    gen = torch.Generator().manual_seed(60 + d)
    q_lens = torch.randint(0, 41, (24,), generator=gen).tolist()
    kv_lens = torch.randint(0, 17, (24,), generator=gen).tolist()
    q_lens[:3], kv_lens[:3] = [40, 5, 1], [16, 0, 1]
    case = C.thd_case(61 + d, q_lens, kv_lens, 8, 2, d, torch.bfloat16, offsets=torch.int64,
                      max_q=40, max_kv=16, pad_before=2, pad_after=1)
    wave = {"small_seq_tiled_block": 0, "small_seq_tiled_resident": 0}
    results = {}
    for one_tile in (1, 0):
        with emu.tuning(**wave, small_seq_tiled_one_tile=one_tile):
            lib.mark_kernels()
            results[one_tile] = check_valid(lib, case)
            ran = [k for k in lib.kernels_run(since_mark=True) if "small_seq_tiled_fwd" in k]
        # <T, D, ONE_TILE, ROW_MAX>: the plain instances (no row maxima asked)
        want = "true, false>" if one_tile else "false, false>"
        assert ran and all(k.endswith(want) for k in ran), ran
    for x, y in zip(results[1], results[0]):
        assert torch.equal(x, y)
    bad_case = C.thd_case(17, [1, 2, 17, 1, 3], [4, 6, 9, 2, 5], 2, 2, d, torch.bfloat16,
                          max_kv=16)
    bad_case.cu_kv[2] = 2147483640
    bad_case.cu_kv[3] = -2147483640
    for one_tile in (1, 0):
        with emu.tuning(**wave, small_seq_tiled_one_tile=one_tile):
            out, lse, probs = run(lib, bad_case)
        C.check(bad_case, out, lse, probs, f"wave {lib.wave}", expect_bad=[1, 2, 3])
        assert lib.errors() == (3, 0x7FFFFFFF - 1)
