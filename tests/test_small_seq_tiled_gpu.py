"""GPU tests of the tiled small-seq forward op, ``torch.ops.rocm_attn.small_seq_tiled_fwd``
(hip_src/small_seq/tiled_fwd_kernel.h), called directly: any number of queries per segment,
long histories, int32 / int64 offsets, THD and BSHD.

Every test is marked ``gpu`` and skipped unless a CUDA/ROCm device is present and the compiled
extension is loaded. The oracle is float64 (tests/helpers/small_seq_tiled_cases.py, cross-checked
against rocm_attn.reference in tests/test_emu_small_seq_tiled.py). Outputs are allocated by the
op, so they are poisoned through the caching allocator (NaN in every float dtype) before each
call: an element the kernel forgets to write shows as NaN, and NaN never passes. Input rows no
segment may read (q padding, k/v around the segments, BSHD rows past a length) are NaN too.

Bounds: out within 1e-2 (bf16) / 5e-3 (fp16) relative error of the oracle, lse and probs 1e-4.
"""

from __future__ import annotations

import dataclasses
import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import rocm_attn  # noqa: E402
from rocm_attn.errors import read_errors  # noqa: E402
from rocm_attn import small_seq_plan  # noqa: E402
from helpers.gpu import gpu_marks, poison_allocator  # noqa: E402
from helpers.small_seq_tiled_gpu import DTYPES, GROUPS, lens, tiled_device  # noqa: E402
from helpers import small_seq_tiled_cases as C  # noqa: E402
from helpers import small_seq_variants as V  # noqa: E402

# every test starts and ends with a clean device error counter (tests/conftest.py)
pytestmark = [*gpu_marks(thd_ops=False), pytest.mark.usefixtures("clean_error_counter")]


@pytest.fixture(scope="module")
def dev():
    return tiled_device("small_seq_tiled_fwd")


def op(case: C.TiledCase, return_softmax=True, poison=True):
    if poison:
        poison_allocator(case.q.device)
    out, lse, probs = torch.ops.rocm_attn.small_seq_tiled_fwd(
        case.q, case.k, case.v, case.cu_q, case.cu_kv, case.seqlens, case.max_q, case.max_kv,
        case.scale, return_softmax,
        small_seq_plan.tiled_fwd_plan(case.q, case.k, case.max_q, case.max_kv, return_softmax))
    return out, lse, (probs if return_softmax else None)


def check_valid(case, return_softmax=True):
    out, lse, probs = op(case, return_softmax)
    C.check(case, out, lse, probs, expect_bad=[])
    assert read_errors(reset=True) == (0, -1), "valid inputs tripped the device error counter"
    return out, lse, probs


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("h_q,h_kv", GROUPS)
@pytest.mark.parametrize("d", [64, 128, 256])
def test_many_queries_per_segment(dev, d, h_q, h_kv, dtype):
    """Queries per segment 1, 2, 17 and 512 (and 0) against keys 17, 64, 256, 1000 (and 0)."""
    q_lens = [1, 2, 17, 512, 0, 1, 17, 2, 512, 3]
    kv_lens = [17, 64, 256, 1000, 5, 0, 1000, 17, 64, 256]
    case = C.thd_case(d + h_q + h_kv, q_lens, kv_lens, h_q, h_kv, d, dtype, device=dev)
    check_valid(case)


# the plan's choice, the wave kernel only, the block kernel (K/V staged per key tile) and the
# resident kernel (a segment's whole K/V in shared memory) for every d <= 128 call they take:
# tuning of the variant table (tests/helpers/small_seq_variants.py FWD_FORCINGS)
_NO_WG = {"small_seq_tiled_warpgroup": 0}
KERNELS = V.forcings("auto", "wave", "block", "resident", "resident_step16", "resident_step64")


@pytest.mark.parametrize("kernel", list(KERNELS))
@pytest.mark.parametrize("h_q,h_kv", GROUPS)
@pytest.mark.parametrize("d", [64, 128])
def test_wave_and_block_kernels(dev, d, h_q, h_kv, kernel):
    """The tiled kernels on ragged segments of many queries over long histories, and on short
    ones (the block kernel's per-wave register path)."""
    gen = torch.Generator().manual_seed(d + h_q + h_kv)
    b = 150
    with rocm_attn.tuning.override(**KERNELS[kernel]):
        case = C.thd_case(30, lens(gen, b, 0, 100), lens(gen, b, 0, 300), h_q, h_kv, d,
                          torch.bfloat16, max_q=100, max_kv=300, device=dev)
        check_valid(case)
        case = C.thd_case(31, lens(gen, b, 0, 100), lens(gen, b, 0, 16), h_q, h_kv, d,
                          torch.float16, offsets=torch.int64, max_q=100, max_kv=16, device=dev)
        check_valid(case)


# The warpgroup-MMA kernel (Hopper, sm_90a builds: tiled_fwd_warpgroup_kernel.h) serves calls
# without probabilities; tuning 2 sends every such call of d 64 / 128 whose K/V fit there, in
# blocks of one warpgroup. Over 64-key steps CUDA builds stage it by tensor tile copies
# (tiled_fwd_warpgroup_tma_kernel.h); with small_seq_tiled_warpgroup_tma 0 only histories of at
# most 16 keys take it (cp.async staging), longer ones the other kernels. Devices without it
# take the other kernels, and the checks still hold.
WARPGROUP = {"warpgroup": {"small_seq_tiled_warpgroup": 2},
             "warpgroup_cp_async": {"small_seq_tiled_warpgroup": 2,
                                    "small_seq_tiled_warpgroup_tma": 0},
             "warpgroup_stream": {"small_seq_tiled_warpgroup": 2,
                                  "small_seq_tiled_warpgroup_stream": 2}}


@pytest.mark.parametrize("kernel", list(WARPGROUP))
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("h_q,h_kv", GROUPS)
@pytest.mark.parametrize("d", [64, 128])
def test_warpgroup_kernel(dev, d, h_q, h_kv, dtype, kernel):
    """Queries per segment 0..512 (partial and whole 64-row tiles) over 0..300 keys (partial
    and whole 64-key steps) and over 0..16 keys (16-key steps); int64 offsets with strided
    q / k / v and padding rows; BSHD."""
    q_lens = [1, 2, 17, 512, 0, 64, 65, 130, 512, 3]
    kv_lens = [17, 64, 256, 300, 5, 0, 1, 63, 64, 129]
    with rocm_attn.tuning.override(**WARPGROUP[kernel]):
        case = C.thd_case(d + h_kv, q_lens, kv_lens, h_q, h_kv, d, dtype, device=dev)
        check_valid(case, return_softmax=False)
        gen = torch.Generator().manual_seed(d + h_q)
        b = 40
        case = C.thd_case(d + 1, lens(gen, b, 0, 200), lens(gen, b, 0, 200), h_q, h_kv, d,
                          dtype, offsets=torch.int64, strided=True, pad_before=3, pad_after=5,
                          kv_pad=2, max_q=200, max_kv=200, device=dev)
        check_valid(case, return_softmax=False)
        case = C.bshd_case(d + 2, 70, lens(gen, 12, 0, 100) + [0, 100], 100, h_q, h_kv, d,
                           dtype, device=dev)
        check_valid(case, return_softmax=False)
        # histories of at most 16 keys: the 16-key-step variant
        case = C.thd_case(d + 3, [64, 1, 130, 0, 512, 65], [16, 3, 0, 9, 16, 1], h_q, h_kv, d,
                          dtype, offsets=torch.int64, pad_before=1, pad_after=2, device=dev)
        check_valid(case, return_softmax=False)


@pytest.mark.parametrize("kernel", ["warpgroup"])
@pytest.mark.parametrize("h_q,h_kv", [(6, 2), (16, 2), (16, 1), (2, 2)])
def test_warpgroup_staging_groups(dev, h_q, h_kv, kernel):
    """GQA groups of 3 (no whole tokens in a 64-row tile: 16-key steps by cp.async, longer
    histories the kernels without warpgroups), 8 and 16 (Q
    tile copies of 8 and 4 tokens) and 1, over histories ending inside and at the end of a
    64-key step and of a 16-key one, between NaN rows no segment owns (a tile copy brings the neighbours' rows into
    shared memory: K's are masked, V's zeroed, Q's never stored), THD int64 offsets and BSHD."""
    q_lens = [1, 64, 3, 130, 0, 17, 512, 5]
    kv_lens = [300, 64, 17, 128, 40, 0, 191, 65]
    with rocm_attn.tuning.override(**WARPGROUP[kernel]):
        case = C.thd_case(70 + h_q + h_kv, q_lens, kv_lens, h_q, h_kv, 128, torch.bfloat16,
                          offsets=torch.int64, pad_before=2, pad_after=3, kv_pad=4, device=dev)
        check_valid(case, return_softmax=False)
        gen = torch.Generator().manual_seed(h_q * h_kv)
        case = C.bshd_case(71 + h_q, 70, lens(gen, 9, 0, 200) + [0, 200], 200, h_q, h_kv, 64,
                           torch.float16, device=dev)
        check_valid(case, return_softmax=False)
        # tensors shorter than a box (27 k/v rows against boxes of 64 keys; BSHD q of 3 tokens
        # per batch against boxes of up to 64)
        case = C.thd_case(73 + h_q, [64, 5], [20, 7], h_q, h_kv, 128, torch.bfloat16,
                          device=dev)
        check_valid(case, return_softmax=False)
        case = C.bshd_case(74 + h_q, 3, [30, 5, 0], 30, h_q, h_kv, 128, torch.bfloat16,
                           device=dev)
        check_valid(case, return_softmax=False)
        # histories of at most 16 keys (16-key steps, boxes of 16 keys), the last one short
        case = C.thd_case(72 + h_q, [64, 1, 130, 0, 512, 9], [16, 3, 0, 9, 16, 5], h_q, h_kv,
                          128, torch.bfloat16, offsets=torch.int64, pad_before=1, pad_after=2,
                          kv_pad=3, device=dev)
        check_valid(case, return_softmax=False)


@pytest.mark.parametrize("scale", [0.0, -0.3])
@pytest.mark.parametrize("kernel", ["wave", "block", "resident"] + list(WARPGROUP))
def test_zero_and_negative_scale(dev, kernel, scale):
    """A zero scale (uniform weights over each history) and a negative one (the least similar
    keys weigh most) over histories whose last softmax step is partial, 16-key and 64-key
    steps: each kernel matches the float64 reference; keys past a history take no part."""
    tuning = {**KERNELS, **WARPGROUP}[kernel]
    with rocm_attn.tuning.override(**tuning):
        for q_lens, kv_lens in (([64, 3, 130, 65], [17, 5, 100, 64]),
                                ([64, 3, 130, 65], [16, 5, 9, 1])):
            case = C.thd_case(23, q_lens, kv_lens, 8, 2, 128, torch.bfloat16, device=dev)
            check_valid(dataclasses.replace(case, scale=scale), return_softmax=False)


def garbage_case(dev, seed, q_lens, max_q, kv_lens=(5, 17, 64, 3, 10, 1, 0, 7, 9), max_kv=64):
    """Nine segments with garbage int64 offsets: segment 4 holds more queries than max_q
    (q_lens[4] > max_q), segment 5 -1 keys, segments 7 and 8 keys past the end of k/v (2^40 and
    -2^40). k/v are small and surrounded by unread NaN rows: a stray read would fault or show."""
    case = C.thd_case(seed, q_lens, list(kv_lens), 8, 2, 128, torch.bfloat16,
                      offsets=torch.int64, max_q=max_q, max_kv=max_kv, pad_before=2,
                      pad_after=2, kv_pad=3, device=dev)
    case.cu_kv[6] = case.cu_kv[5] - 1
    case.cu_kv[8] = 2**40
    case.cu_kv[9] = -(2**40)
    return case


def check_garbage_flagged(case, **kwargs):
    """Each bad segment of garbage_case counted once (lowest index reported), NaN on its rows,
    every other segment exact."""
    out, lse, probs = op(case, **kwargs)
    bad = C.check(case, out, lse, probs, expect_bad=[4, 5, 7, 8])
    torch.cuda.synchronize()
    assert read_errors(reset=True) == (len(bad), bad[0])


@pytest.mark.parametrize("kernel", list(WARPGROUP))
def test_warpgroup_kernel_bad_segments(dev, kernel):
    """Garbage int64 offsets under the warpgroup-MMA kernel (segments of up to 100 queries):
    flagged, NaN, no out-of-bounds access, every other segment exact."""
    case = garbage_case(dev, 19, [3, 100, 17, 2, 140, 65, 1, 70, 4], max_q=100)
    with rocm_attn.tuning.override(**WARPGROUP[kernel]):
        check_garbage_flagged(case, return_softmax=False)


def test_warpgroup_long_history_bad_segments(dev):
    """Garbage int64 offsets under the warpgroup forward over histories past 128 keys (up to
    400 rows per (segment, kv head): the plan's kernel for staging that fills a
    multiprocessor): flagged, NaN, no out-of-bounds access, every other segment exact."""
    case = garbage_case(dev, 23, [3, 100, 17, 2, 140, 65, 1, 70, 4], max_q=100,
                        kv_lens=(5, 17, 200, 3, 10, 1, 0, 7, 9), max_kv=256)
    with rocm_attn.tuning.override(small_seq_tiled_warpgroup=2):
        check_garbage_flagged(case, return_softmax=False)


# The tile-copy kernel's streaming instance (d 128, 64-key steps: one row tile per work item, K
# / V through a ring of two steps and a tail slot for V): by default for histories past 128
# keys with one row tile per (segment, kv head); tuning 2 takes every call it can serve,
# many-tile segments included; 0 keeps the kernel that stages whole histories.
STREAM_EDGE_KV = [0, 1, 63, 64, 65, 127, 128, 129, 191, 192, 193, 255, 256]


@pytest.mark.parametrize("stream", [pytest.param(2, id="forced"), pytest.param(1, id="auto"),
                                    pytest.param(0, id="off")])
@pytest.mark.parametrize("h_q,h_kv", [pytest.param(8, 2, id="g4"), pytest.param(8, 8, id="g1"),
                                      pytest.param(16, 1, id="g16")])
def test_warpgroup_stream(dev, h_q, h_kv, stream):
    """Histories at the ring's edges (one to four steps, the tail step partial or whole, none),
    one row tile per (segment, kv head) and more (up to 130 queries), bf16 and fp16, int64
    offsets, strided inputs, padding rows and NaN rows around k / v; BSHD."""
    n = len(STREAM_EDGE_KV)
    gen = torch.Generator().manual_seed(h_q * 31 + h_kv + stream)
    with rocm_attn.tuning.override(small_seq_tiled_warpgroup_stream=stream):
        q_lens = [64 // (h_q // h_kv) - (i % 3) for i in range(n)]
        case = C.thd_case(80 + h_q + h_kv, q_lens, STREAM_EDGE_KV, h_q, h_kv, 128,
                          torch.bfloat16, offsets=torch.int64, strided=True, pad_before=3,
                          pad_after=2, kv_pad=3, max_kv=256, device=dev)
        check_valid(case, return_softmax=False)
        q_lens = [130 if i % 4 == 0 else int(x) for i, x in enumerate(lens(gen, n, 0, 20))]
        case = C.thd_case(81 + h_q + h_kv, q_lens, STREAM_EDGE_KV, h_q, h_kv, 128,
                          torch.float16, max_kv=256, device=dev)
        check_valid(case, return_softmax=False)
        case = C.bshd_case(82 + h_q, 16, lens(gen, 10, 0, 256) + [0, 256], 256, h_q, h_kv, 128,
                           torch.bfloat16, device=dev)
        check_valid(case, return_softmax=False)


@pytest.mark.parametrize("h_q,h_kv", [pytest.param(8, 2, id="g4"), pytest.param(8, 8, id="g1")])
@pytest.mark.parametrize("d", [64, 128])
def test_warpgroup_one_tile_16_keys(dev, d, h_q, h_kv):
    """One 64-row tile per (segment, kv head) over histories of at most 16 keys (the tile-copy
    kernel's one-warpgroup blocks of 16-key steps): ragged queries and keys, int64 offsets,
    strided inputs, padding rows; garbage offsets flagged."""
    gen = torch.Generator().manual_seed(d + h_q + h_kv)
    group = h_q // h_kv
    with rocm_attn.tuning.override(small_seq_tiled_warpgroup=2):
        case = C.thd_case(90 + d + h_kv, lens(gen, 200, 0, 64 // group), lens(gen, 200, 0, 16),
                          h_q, h_kv, d, torch.bfloat16, offsets=torch.int64, strided=True,
                          pad_before=2, pad_after=3, kv_pad=2, max_q=64 // group, max_kv=16,
                          device=dev)
        check_valid(case, return_softmax=False)
        if d == 128 and group == 4:
            case = garbage_case(dev, 31, [3, 16, 12, 2, 40, 16, 1, 10, 4], max_q=16,
                                kv_lens=(5, 16, 9, 3, 16, 1, 0, 7, 9), max_kv=16)
            check_garbage_flagged(case, return_softmax=False)


@pytest.mark.parametrize("h_q,h_kv", [pytest.param(8, 2, id="g4"), pytest.param(8, 8, id="g1")])
def test_warpgroup_stream_long_histories(dev, h_q, h_kv):
    """Histories of five and six 64-key steps (257-384 keys: each ring slot refilled twice in
    one item) on the streaming instance (forced; the default rule takes it for one row tile):
    against the float64 reference, and bitwise equal to the one-warpgroup kernel that stages whole
    histories (the same products and softmax steps in the same order)."""
    kv_lens = [257, 319, 320, 321, 383, 384, 300, 5, 0, 129]
    q_lens = [64 // (h_q // h_kv) - (i % 2) for i in range(len(kv_lens))]
    case = C.thd_case(84 + h_q + h_kv, q_lens, kv_lens, h_q, h_kv, 128, torch.bfloat16,
                      offsets=torch.int64, pad_before=1, pad_after=2, kv_pad=2, max_kv=384,
                      device=dev)
    with rocm_attn.tuning.override(small_seq_tiled_warpgroup_stream=2):
        out, lse, _ = check_valid(case, return_softmax=False)
    with rocm_attn.tuning.override(small_seq_tiled_warpgroup_stream=0):
        staged_out, staged_lse, _ = check_valid(case, return_softmax=False)
    assert torch.equal(out, staged_out) and torch.equal(lse, staged_lse)


# Ragged requests over long histories (300 to 4096 keys, the tiled kernels' last): histories no
# block can stage whole, which the plan's rule streams (small_seq_plan._fwd_streams), with
# segments of none, one and up to a thousand candidates and histories of none, one key and ends
# inside a 64-key step.
LONG_Q = [1, 1000, 0, 17, 250, 64, 3, 500, 16, 1, 129, 7, 33, 2]
LONG_KV = [4096, 1000, 300, 0, 1, 4096, 63, 300, 1000, 4095, 65, 2048, 4033, 0]


def tiled_forward_plan(d, h_q, h_kv, max_q, max_kv):
    """The tiled forward's plan of a THD bf16 call on this device with this process's tuning
    (what small_seq_tiled_fwd runs: no flash route)."""
    tuning = dict(small_seq_plan.DEFAULT_TUNING, **small_seq_plan.current_tuning())
    return small_seq_plan.plan_tiled_forward(small_seq_plan.Call(d, h_q, h_kv, max_q, max_kv),
                                             small_seq_plan.device_of(), tuning)


@pytest.mark.parametrize("stream", [pytest.param(1, id="auto"), pytest.param(2, id="forced")])
@pytest.mark.parametrize("h_q,h_kv", [pytest.param(8, 2, id="g4"), pytest.param(8, 1, id="mqa"),
                                      pytest.param(8, 8, id="g1")])
@pytest.mark.parametrize("d", [64, 128])
def test_warpgroup_stream_ragged_long_histories(dev, d, h_q, h_kv, stream):
    """The streaming instance on ragged segments over 300, 1000 and 4096 keys (1 to 1000
    candidates, none and one key, histories ending inside a step): bf16 with int64 offsets,
    strided inputs, padding rows and NaN rows around k / v; fp16; BSHD. Its plan is checked
    to be the streaming instance, so that a change of the rule cannot leave this test
    exercising another kernel."""
    with rocm_attn.tuning.override(small_seq_tiled_warpgroup_stream=stream):
        plan = tiled_forward_plan(d, h_q, h_kv, max(LONG_Q), max(LONG_KV))
        if plan.kernels != ("tiled_fwd_warpgroup_tma",):
            pytest.skip(f"no streaming warpgroup forward here: {plan}")
        assert plan.launches[0].param("STREAM")
        case = C.thd_case(110 + d + h_q + h_kv, LONG_Q, LONG_KV, h_q, h_kv, d, torch.bfloat16,
                          offsets=torch.int64, strided=True, pad_before=3, pad_after=2, kv_pad=3,
                          device=dev)
        check_valid(case, return_softmax=False)
        gen = torch.Generator().manual_seed(d + h_q)
        q_lens = [int(x) for x in lens(gen, 40, 0, 300)]
        kv_lens = [int(x) for x in lens(gen, 40, 0, 4096)]
        case = C.thd_case(111 + d + h_q + h_kv, q_lens, kv_lens, h_q, h_kv, d, torch.float16,
                          max_q=300, max_kv=4096, device=dev)
        check_valid(case, return_softmax=False)
        case = C.bshd_case(112 + d + h_q, 70, [4096, 0, 1, 1000, 2500, 4033], 4096, h_q, h_kv,
                           d, torch.bfloat16, device=dev)
        check_valid(case, return_softmax=False)


def test_warpgroup_stream_long_bad_segments(dev):
    """Garbage int64 offsets under the streaming instance over histories of up to 4096 keys
    (the rule's choice: no block stages them whole): flagged, NaN, no out-of-bounds access,
    every other segment exact."""
    case = garbage_case(dev, 37, [3, 300, 17, 2, 400, 16, 1, 100, 4], max_q=300,
                        kv_lens=(5, 4096, 1000, 3, 4000, 1, 0, 2049, 9), max_kv=4096)
    check_garbage_flagged(case, return_softmax=False)


@pytest.mark.parametrize("stream", [pytest.param(2, id="forced"), pytest.param(1, id="auto")])
def test_warpgroup_stream_bad_segments(dev, stream):
    """Garbage int64 offsets under the streaming instance (histories up to 256 keys, 2 kv heads
    and a group of 4: up to 16 queries are one 64-row tile per (segment, kv head)): flagged, NaN,
    no out-of-bounds access, every other segment exact."""
    case = garbage_case(dev, 29, [3, 16, 12, 2, 40, 16, 1, 10, 4], max_q=16,
                        kv_lens=(5, 130, 200, 3, 256, 1, 0, 255, 9), max_kv=256)
    with rocm_attn.tuning.override(small_seq_tiled_warpgroup_stream=stream):
        check_garbage_flagged(case, return_softmax=False)


# The warp-specialized kernel (tiled_fwd_warpgroup_ws_kernel.h: d 128, 64-key steps, at most
# 256 keys; a copy warp brings each item's K / V steps and Q tiles while two warpgroups compute):
# by default where blocks of two warpgroups would stage the history and a (segment, kv head) may
# hold more than one row tile; tuning 2 takes every call it can serve; 0 never.
WS = {"forced": {"small_seq_tiled_warpgroup_ws": 2},
      "auto": {"small_seq_tiled_warpgroup_ws": 1}}
# Its items: from the work queue (the default) or by a grid stride, one block per
# multiprocessor either way (grid factor 1).
WS_ITEMS = [pytest.param(1, id="queue"), pytest.param(0, id="grid_stride")]


def ws_runs_case(dev, seed, h_q, h_kv, dtype=torch.bfloat16, **kwargs):
    """300 ragged segments: histories at the ring's edges and between (none to four steps, the
    tail step partial or whole), zero to five 64-row tiles per (segment, kv head)."""
    gen = torch.Generator().manual_seed(seed)
    group = h_q // h_kv
    n = 300
    kv_lens = [STREAM_EDGE_KV[i % len(STREAM_EDGE_KV)] if i % 2 else int(x)
               for i, x in enumerate(lens(gen, n, 0, 256))]
    q_lens = [int(x) for x in lens(gen, n, 0, 320 // group)]
    q_lens[:6] = [0, 1, 64 // group, 64 // group + 1, 128 // group, 320 // group]
    return C.thd_case(seed, q_lens, kv_lens, h_q, h_kv, 128, dtype, max_q=320 // group,
                      max_kv=256, device=dev, **kwargs)


@pytest.mark.parametrize("queue", WS_ITEMS)
@pytest.mark.parametrize("ws", list(WS))
@pytest.mark.parametrize("h_q,h_kv", [pytest.param(8, 2, id="g4"), pytest.param(8, 8, id="g1"),
                                      pytest.param(16, 1, id="g16")])
def test_warpgroup_ws(dev, h_q, h_kv, ws, queue):
    """Runs of 300 ragged segments with one block per multiprocessor (grid factor 1), so that
    the copy warp crosses many items ahead of the computing warpgroups (by the grid stride up
    to a full item ring): bf16 with int64 offsets, strided inputs, padding rows and NaN rows
    around k / v; fp16; BSHD."""
    with rocm_attn.tuning.override(**WS[ws], small_seq_tiled_fwd_grid=1,
                                   small_seq_tiled_ws_queue=queue):
        case = ws_runs_case(dev, 95 + h_q + h_kv, h_q, h_kv, offsets=torch.int64, strided=True,
                            pad_before=3, pad_after=2, kv_pad=3)
        check_valid(case, return_softmax=False)
        case = ws_runs_case(dev, 96 + h_q + h_kv, h_q, h_kv, torch.float16)
        check_valid(case, return_softmax=False)
        gen = torch.Generator().manual_seed(h_q + h_kv)
        case = C.bshd_case(97 + h_q, 200, lens(gen, 40, 0, 256) + [0, 256], 256, h_q, h_kv, 128,
                           torch.bfloat16, device=dev)
        check_valid(case, return_softmax=False)


@pytest.mark.parametrize("h_q,h_kv", [pytest.param(8, 2, id="g4"), pytest.param(8, 8, id="g1")])
def test_warpgroup_ws_matches_staged(dev, h_q, h_kv):
    """The warp-specialized kernel (forced) bitwise equal to the one-warpgroup kernel that stages
    whole histories: the same products and softmax steps in the same order per tile."""
    case = ws_runs_case(dev, 98 + h_q + h_kv, h_q, h_kv)
    with rocm_attn.tuning.override(small_seq_tiled_warpgroup_ws=2, small_seq_tiled_fwd_grid=1):
        out, lse, _ = check_valid(case, return_softmax=False)
    with rocm_attn.tuning.override(small_seq_tiled_warpgroup_ws=0, small_seq_tiled_warpgroup=2,
                                   small_seq_tiled_warpgroup_stream=0):
        staged_out, staged_lse, _ = check_valid(case, return_softmax=False)
    assert torch.equal(out, staged_out) and torch.equal(lse, staged_lse)


@pytest.mark.parametrize("h_q,h_kv", [pytest.param(8, 2, id="g4"), pytest.param(8, 1, id="mqa"),
                                      pytest.param(8, 8, id="g1")])
def test_warpgroup_ws_long_histories(dev, h_q, h_kv):
    """The warp-specialized kernel forced past its ring (d 128, 300-4096 keys: K / V streamed
    through the four slots, items of a pair of row tiles) on the ragged long-history segments,
    one block per multiprocessor: against the float64 reference, and bitwise equal to the
    streaming one-warpgroup instance (the same products and softmax steps in the same order per
    tile); fp16 and BSHD against the reference."""
    with rocm_attn.tuning.override(small_seq_tiled_warpgroup_ws=2):
        plan = tiled_forward_plan(128, h_q, h_kv, max(LONG_Q), max(LONG_KV))
    if plan.kernels != ("tiled_fwd_warpgroup_ws",):
        pytest.skip(f"no warp-specialized forward here: {plan}")
    case = C.thd_case(120 + h_q + h_kv, LONG_Q, LONG_KV, h_q, h_kv, 128, torch.bfloat16,
                      offsets=torch.int64, strided=True, pad_before=3, pad_after=2, kv_pad=3,
                      device=dev)
    with rocm_attn.tuning.override(small_seq_tiled_warpgroup_ws=2, small_seq_tiled_fwd_grid=1):
        out, lse, _ = check_valid(case, return_softmax=False)
    with rocm_attn.tuning.override(small_seq_tiled_warpgroup_ws=0,
                                   small_seq_tiled_warpgroup_stream=2):
        stream_out, stream_lse, _ = check_valid(case, return_softmax=False)
    assert torch.equal(out, stream_out) and torch.equal(lse, stream_lse)
    with rocm_attn.tuning.override(small_seq_tiled_warpgroup_ws=2):
        gen = torch.Generator().manual_seed(h_q + h_kv + 7)
        q_lens = [int(x) for x in lens(gen, 60, 0, 300)]
        kv_lens = [int(x) for x in lens(gen, 60, 0, 4096)]
        case = C.thd_case(121 + h_q + h_kv, q_lens, kv_lens, h_q, h_kv, 128, torch.float16,
                          max_q=300, max_kv=4096, device=dev)
        check_valid(case, return_softmax=False)
        case = C.bshd_case(122 + h_q, 70, [4096, 0, 1, 1000, 2500, 4033], 4096, h_q, h_kv, 128,
                           torch.bfloat16, device=dev)
        check_valid(case, return_softmax=False)


@pytest.mark.parametrize("queue", WS_ITEMS)
def test_warpgroup_ws_long_bad_segments(dev, queue):
    """Garbage int64 offsets under the warp-specialized kernel forced past its ring (histories
    up to 4096 keys): flagged, NaN, no out-of-bounds access, every other segment exact."""
    case = garbage_case(dev, 39, [3, 300, 17, 2, 400, 16, 1, 100, 4], max_q=300,
                        kv_lens=(5, 4096, 1000, 3, 4000, 1, 0, 2049, 9), max_kv=4096)
    with rocm_attn.tuning.override(small_seq_tiled_warpgroup_ws=2, small_seq_tiled_fwd_grid=1,
                                   small_seq_tiled_ws_queue=queue):
        check_garbage_flagged(case, return_softmax=False)


@pytest.mark.parametrize("queue", WS_ITEMS)
@pytest.mark.parametrize("ws", list(WS))
def test_warpgroup_ws_bad_segments(dev, ws, queue):
    """Garbage int64 offsets under the warp-specialized kernel (histories up to 256 keys,
    segments of up to 100 queries: up to seven row tiles per (segment, kv head)): flagged, NaN,
    no out-of-bounds access, every other segment exact."""
    case = garbage_case(dev, 33, [3, 100, 17, 2, 140, 65, 1, 70, 4], max_q=100,
                        kv_lens=(5, 130, 200, 3, 256, 1, 0, 255, 9), max_kv=256)
    with rocm_attn.tuning.override(**WS[ws], small_seq_tiled_fwd_grid=1,
                                   small_seq_tiled_ws_queue=queue):
        check_garbage_flagged(case, return_softmax=False)


# The warp-specialized kernel's work queue (tuning small_seq_tiled_ws_queue 1, the default): one
# block per multiprocessor, each taking its next item from a counter the binding zeroes per call.
WS_QUEUE = {"small_seq_tiled_warpgroup_ws": 2, "small_seq_tiled_ws_queue": 1}


def ws_queue_case(dev, seed, h_q, h_kv, long):
    """Staged histories (ws_runs_case) or ragged ones past the ring (to 4096 keys), int64
    offsets, strided inputs, padding rows and NaN rows around k / v."""
    extra = dict(offsets=torch.int64, strided=True, pad_before=3, pad_after=2, kv_pad=3)
    if not long:
        return ws_runs_case(dev, seed, h_q, h_kv, **extra)
    return C.thd_case(seed, LONG_Q * 4, LONG_KV[::-1] * 4, h_q, h_kv, 128, torch.bfloat16,
                      device=dev, **extra)


@pytest.mark.parametrize("long", [False, True], ids=["staged", "streamed"])
@pytest.mark.parametrize("h_q,h_kv", [pytest.param(8, 2, id="g4"), pytest.param(8, 8, id="g1"),
                                      pytest.param(16, 1, id="g16")])
def test_warpgroup_ws_queue(dev, h_q, h_kv, long):
    """Items from the work queue: against the float64 reference, and bitwise equal to the
    grid stride's (an item's outputs do not depend on the block that computes it)."""
    case = ws_queue_case(dev, 130 + h_q + h_kv, h_q, h_kv, long)
    with rocm_attn.tuning.override(**WS_QUEUE):
        plan = tiled_forward_plan(128, h_q, h_kv, case.max_q, case.max_kv)
        if plan.launches[0].param("QUEUE") is not True:
            pytest.skip(f"no warp-specialized forward here: {plan}")
        out, lse, _ = check_valid(case, return_softmax=False)
        again, again_lse, _ = check_valid(case, return_softmax=False)
    with rocm_attn.tuning.override(small_seq_tiled_warpgroup_ws=2, small_seq_tiled_ws_queue=0,
                                   small_seq_tiled_fwd_grid=1):
        strided_out, strided_lse, _ = check_valid(case, return_softmax=False)
    assert torch.equal(out, strided_out) and torch.equal(lse, strided_lse)
    assert torch.equal(out, again) and torch.equal(lse, again_lse)


def test_warpgroup_ws_queue_graph_replays(dev):
    """A captured call zeroes its queue in the graph: every replay computes every item again
    (a counter left at its end would leave the outputs unwritten: NaN-poisoned)."""
    case = ws_queue_case(dev, 140, 8, 2, True)
    with rocm_attn.tuning.override(**WS_QUEUE):
        plan = small_seq_plan.tiled_fwd_plan(case.q, case.k, case.max_q, case.max_kv, False)
        # the first record: the warp-specialized kernel, QUEUE after its D and grid factor
        if plan[2] != small_seq_plan.KERNEL_IDS["tiled_fwd_warpgroup_ws"] or plan[2 + 3] != 1:
            pytest.skip(f"no warp-specialized forward here: {plan}")
        expect, expect_lse, _ = check_valid(case, return_softmax=False)
        args = (case.q, case.k, case.v, case.cu_q, case.cu_kv, case.seqlens, case.max_q,
                case.max_kv, case.scale, False, plan)
        torch.ops.rocm_attn.small_seq_tiled_fwd(*args)  # warm-up outside the capture
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out, lse, _ = torch.ops.rocm_attn.small_seq_tiled_fwd(*args)
        for _ in range(3):
            out.fill_(float("nan"))
            lse.fill_(float("nan"))
            graph.replay()
            torch.cuda.synchronize()
            assert torch.equal(out, expect) and torch.equal(lse, expect_lse)


# The block kernel's two instances (tiled_fwd_kernel.h): 256 threads staging key tiles through
# registers (forced: small_seq_tiled_block 2), and, in CUDA builds, two warps copying them by
# cp.async into a ring of kTiledAsyncStages buffers (the plan's choice for 9-16 rows per
# (segment, kv head) over 17+ keys; HIP builds take the wave kernel there).
BLOCK_INSTANCES = [pytest.param(256, id="t256_regs"), pytest.param(64, id="t64_cp_async")]
# Histories at and around the edges of 16-key tiles and of the ring (three and four tiles).
EDGE_KV = [0, 1, 15, 16, 17, 31, 32, 33, 47, 48, 49, 63, 64, 65, 80, 255, 256]


def block_tuning(threads):
    return {**_NO_WG, "small_seq_tiled_block": 2 if threads == 256 else 1,
            "small_seq_tiled_resident": 0}


@pytest.mark.parametrize("threads", BLOCK_INSTANCES)
@pytest.mark.parametrize("h_q,h_kv", [pytest.param(8, 8, id="g1"), pytest.param(16, 8, id="g2"),
                                      pytest.param(8, 1, id="g8mqa")])
def test_block_staging_16_rows(dev, h_q, h_kv, threads):
    """16 query rows per (segment, kv head) (16, 8 or 2 queries per segment by the GQA group)
    under each instance of the block kernel: ragged histories of 0..256 keys and every
    tile / ring edge, int64 offsets, strided q / k / v between unread NaN rows (the last
    segment's keys end next to them: a read past a segment shows), and padding q rows; bf16
    and fp16, with and without probabilities."""
    max_q = 16 // (h_q // h_kv)
    gen = torch.Generator().manual_seed(80 + h_q + h_kv + threads)
    b = 120
    kv_lens = EDGE_KV + lens(gen, b - len(EDGE_KV) - 1, 0, 256) + [49]
    q_lens = lens(gen, b, 0, max_q)
    q_lens[:len(EDGE_KV)] = [max_q] * len(EDGE_KV)
    with rocm_attn.tuning.override(**block_tuning(threads)):
        case = C.thd_case(81 + h_q, q_lens, kv_lens, h_q, h_kv, 128, torch.bfloat16,
                          offsets=torch.int64, strided=True, pad_before=2, pad_after=3,
                          kv_pad=4, max_q=max_q, max_kv=256, device=dev)
        check_valid(case)
        check_valid(case, return_softmax=False)
        case = C.thd_case(82 + h_q, q_lens, kv_lens, h_q, h_kv, 64, torch.float16,
                          offsets=torch.int64, kv_pad=1, max_q=max_q, max_kv=256, device=dev)
        check_valid(case, return_softmax=False)


@pytest.mark.parametrize("max_kv", [32, 64, 256])
def test_block_routing_16_rows(dev, max_kv):
    """16 rows per (segment, kv head) under the plan's own choice with
    small_seq_tiled_small_block_keys = 16 (the default bound): histories of 17..256 keys take
    the block kernel's two-warp cp.async blocks (CUDA builds; HIP builds the wave kernel)."""
    gen = torch.Generator().manual_seed(90 + max_kv)
    b = 300
    case = C.thd_case(90 + max_kv, lens(gen, b, 0, 2), lens(gen, b, 0, max_kv), 8, 1, 128,
                      torch.bfloat16, offsets=torch.int64, kv_pad=2, max_q=2, max_kv=max_kv,
                      device=dev)
    with rocm_attn.tuning.override(**_NO_WG, small_seq_tiled_small_block_keys=16):
        check_valid(case, return_softmax=False)


@pytest.mark.parametrize("threads", BLOCK_INSTANCES)
def test_block_staging_bad_segments(dev, threads):
    """Garbage int64 offsets under each instance of the block kernel (16 rows per segment and
    kv head: 2 queries of 8 q heads per kv head; histories up to 256 keys whose last tile is
    partial), as garbage_case: segment 4 holds more queries than max_q, segment 5 -1 keys,
    segments 7 and 8 keys past the end of k/v: flagged, NaN, no out-of-bounds access, every
    other segment exact."""
    kv_lens = [256, 17, 200, 49, 10, 1, 0, 7, 9]  # segments 4, 5, 7 and 8 made bad below
    q_lens = [2, 1, 2, 2, 5, 2, 1, 2, 2]
    case = C.thd_case(95, q_lens, kv_lens, 16, 2, 128, torch.bfloat16,
                      offsets=torch.int64, max_q=2, max_kv=256, pad_before=2, pad_after=2,
                      kv_pad=3, device=dev)
    case.cu_kv[6] = case.cu_kv[5] - 1
    case.cu_kv[8] = 2**40
    case.cu_kv[9] = -(2**40)
    with rocm_attn.tuning.override(**block_tuning(threads)):
        check_garbage_flagged(case)


# Histories of at most one key tile (max_seqlen_kv <= 16, d <= 128) take the wave kernel's
# one-tile instance (tiled_fwd_kernel.h ONE_TILE: K/V held in registers, no streaming
# path, registers capped for more resident waves) unless tuning small_seq_tiled_one_tile is 0
# (the general wave kernel).
ONE_TILE = [pytest.param(1, id="one_tile"), pytest.param(0, id="general")]


@pytest.mark.parametrize("one_tile", ONE_TILE)
@pytest.mark.parametrize("h_q,h_kv", [pytest.param(8, 8, id="g1"), pytest.param(16, 8, id="g2"),
                                      pytest.param(8, 1, id="g8mqa")])
@pytest.mark.parametrize("d", [64, 128])
def test_wave_one_tile(dev, d, h_q, h_kv, one_tile):
    """16 query rows per (segment, kv head) (the 16-candidate rows) and up to 40 over histories
    of 0..16 keys (max_seqlen_kv 16 and 7), int64 offsets, strided inputs, padding q rows,
    with and without probabilities, under the one-tile instance and the general kernel."""
    gen = torch.Generator().manual_seed(130 + d + h_q + one_tile)
    b = 700
    with rocm_attn.tuning.override(**KERNELS["wave"], small_seq_tiled_one_tile=one_tile):
        for max_q, max_kv in ((16 // (h_q // h_kv), 16), (40, 7)):
            q_lens, kv_lens = lens(gen, b, 0, max_q), lens(gen, b, 0, max_kv)
            q_lens[:3], kv_lens[:3] = [max_q] * 3, [max_kv, 0, 1]
            case = C.thd_case(131 + max_kv, q_lens, kv_lens, h_q, h_kv, d, torch.bfloat16,
                              offsets=torch.int64, strided=True, pad_before=2, pad_after=1,
                              kv_pad=2, max_q=max_q, max_kv=max_kv, device=dev)
            check_valid(case)
            check_valid(case, return_softmax=False)


@pytest.mark.parametrize("one_tile", ONE_TILE)
def test_wave_one_tile_bad_segments(dev, one_tile):
    """Garbage int64 offsets under the one-tile instance and the general wave kernel
    (histories of at most 16 keys): flagged, NaN, no out-of-bounds access, every other segment
    exact."""
    case = garbage_case(dev, 27, [3, 16, 9, 2, 20, 5, 1, 2, 4], max_q=16,
                        kv_lens=(5, 16, 9, 3, 10, 1, 0, 7, 9), max_kv=16)
    with rocm_attn.tuning.override(**KERNELS["wave"], small_seq_tiled_one_tile=one_tile):
        check_garbage_flagged(case)


@pytest.mark.parametrize("max_q", [2, 4])
def test_few_rows_over_long_histories(dev, max_q):
    """16 or 32 rows per (segment, kv head) (8 q heads per kv head) over histories of up to
    300 keys: on NVIDIA 16 rows take the launcher's two-warp blocks of the block kernel, 32 its
    default 256-thread blocks; one segment has more keys than max_seqlen_kv and is flagged."""
    gen = torch.Generator().manual_seed(60 + max_q)
    b = 200
    q_lens, kv_lens = lens(gen, b, 0, max_q), lens(gen, b, 0, 300)
    q_lens[7], kv_lens[7] = max_q, 301
    case = C.thd_case(60 + max_q, q_lens, kv_lens, 8, 1, 128, torch.bfloat16, max_q=max_q,
                      max_kv=300, pad_before=3, pad_after=1, device=dev)
    out, lse, probs = op(case)
    C.check(case, out, lse, probs, expect_bad=[7])
    torch.cuda.synchronize()
    assert read_errors(reset=True) == (1, 7)


@pytest.mark.parametrize("h_q,h_kv", GROUPS)
@pytest.mark.parametrize("max_kv", [17, 64, 256, 1000])
def test_one_query_long_histories(dev, max_kv, h_q, h_kv):
    """q = 1 per segment over ragged histories up to max_kv (the long-history q=1 path), with
    and without return_softmax."""
    gen = torch.Generator().manual_seed(max_kv + h_kv)
    b = 300
    case = C.thd_case(max_kv, [1] * b, lens(gen, b, 0, max_kv), h_q, h_kv, 128, torch.bfloat16,
                      max_kv=max_kv, device=dev)
    check_valid(case)
    check_valid(case, return_softmax=False)


@pytest.mark.parametrize("offsets", [torch.int32, torch.int64], ids=["i32", "i64"])
@pytest.mark.parametrize("h_q,h_kv", GROUPS)
def test_ragged_many_segments(dev, h_q, h_kv, offsets):
    """Many segments with random query and key counts, empty ones included."""
    gen = torch.Generator().manual_seed(h_q * 10 + h_kv)
    b = 700
    case = C.thd_case(3, lens(gen, b, 0, 40), lens(gen, b, 0, 300), h_q, h_kv, 128,
                      torch.bfloat16, offsets=offsets, max_q=40, max_kv=300, device=dev)
    check_valid(case)


def test_mixed_offset_dtypes(dev):
    """cu_seqlens_q int32 with cu_seqlens_kv int64, and the other way round."""
    for qo, ko in ((torch.int32, torch.int64), (torch.int64, torch.int32)):
        case = C.thd_case(4, [3, 17, 1, 0], [64, 1, 0, 17], 8, 2, 128, torch.bfloat16,
                          offsets=qo, kv_offsets=ko, device=dev)
        check_valid(case)


@pytest.mark.parametrize("offsets", [torch.int32, torch.int64], ids=["i32", "i64"])
def test_strided_views_padding_rows(dev, offsets):
    """q a head slice of a wider tensor, k/v halves of one fused tensor; padding q rows before
    and after the segments (out 0, lse -inf, probs 0) and unread NaN k/v rows around them."""
    case = C.thd_case(5, [2, 17, 512, 1, 0], [17, 64, 256, 1000, 3], 8, 2, 128, torch.bfloat16,
                      offsets=offsets, strided=True, pad_before=7, pad_after=9, kv_pad=5,
                      device=dev)
    out, lse, probs = check_valid(case)
    assert (out[:7] == 0).all() and (out[-9:] == 0).all()
    assert torch.isneginf(lse[:, :7]).all() and torch.isneginf(lse[:, -9:]).all()
    assert (probs[:7] == 0).all() and (probs[-9:] == 0).all()


def test_no_queries_and_no_segments(dev):
    """All segments without queries: every q row is padding; zero segments: the same, written
    by the binding."""
    case = C.thd_case(6, [0, 0, 0], [3, 0, 17], 4, 2, 64, torch.bfloat16, pad_before=2,
                      pad_after=4, max_q=1, device=dev)
    out, lse, probs = check_valid(case)
    assert (out == 0).all() and torch.isneginf(lse).all() and (probs == 0).all()
    case = C.thd_case(7, [], [], 4, 2, 64, torch.bfloat16, pad_before=5, max_q=1, max_kv=8,
                      device=dev)
    out, lse, probs = op(case)
    assert (out == 0).all() and torch.isneginf(lse).all() and (probs == 0).all()


@pytest.mark.parametrize("offsets", [torch.int32, torch.int64], ids=["i32", "i64"])
@pytest.mark.parametrize("s_q", [1, 17, 512])
def test_bshd(dev, s_q, offsets):
    """BSHD q [b, s_q, h, d] with seqlens_kv; k/v rows past each length are NaN (never read)."""
    gen = torch.Generator().manual_seed(s_q)
    case = C.bshd_case(8, s_q, lens(gen, 24, 0, 256) + [0, 256], 256, 8, 2, 128,
                       torch.bfloat16, offsets=offsets, device=dev)
    check_valid(case)


@pytest.mark.parametrize("kernel", ["auto", "resident_step16", "block", "wave"])
def test_bad_segments_flagged_no_oob(dev, kernel):
    """Garbage int64 offsets (2^40, negative, more queries than max_seqlen_q, more keys than
    max_seqlen_kv) under each tiled kernel: each bad segment counted once (lowest index
    reported), NaN on its rows, no out-of-bounds access, every other segment exact. "auto" is
    the resident kernel here (68 rows per segment and kv head over at most 64 keys)."""
    case = garbage_case(dev, 9, [3, 1, 17, 2, 40, 5, 1, 2, 4], max_q=17)
    with rocm_attn.tuning.override(**KERNELS[kernel]):
        check_garbage_flagged(case)


def test_bad_segments_int32_wrap(dev):
    """int32 offsets whose 32-bit difference wraps into the valid range: flagged, never read."""
    case = C.thd_case(10, [1, 2, 17, 1, 3], [4, 6, 9, 2, 5], 8, 8, 64, torch.bfloat16,
                      max_kv=16, device=dev)
    case.cu_kv[2] = 2147483640
    case.cu_kv[3] = -2147483640
    out, lse, probs = op(case)
    C.check(case, out, lse, probs, expect_bad=[1, 2, 3])
    assert read_errors(reset=True) == (3, 1)


def test_bshd_length_past_s_kv_flagged(dev):
    case = C.bshd_case(11, 17, [5, 41, 2], 40, 8, 2, 128, torch.bfloat16, max_kv=64, device=dev)
    out, lse, probs = op(case)
    C.check(case, out, lse, probs, expect_bad=[1])
    assert read_errors(reset=True) == (1, 1)


def test_host_checks_name_the_argument(dev):
    case = C.thd_case(12, [2, 3], [4, 5], 8, 2, 128, torch.bfloat16, device=dev)
    f = torch.ops.rocm_attn.small_seq_tiled_fwd
    a = dict(q=case.q, k=case.k, v=case.v, cu_seqlens_q=case.cu_q, cu_seqlens_kv=case.cu_kv,
             seqlens_kv=None, max_seqlen_q=4, max_seqlen_kv=8, softmax_scale=0.1,
             return_softmax=False,
             plan=small_seq_plan.tiled_fwd_plan(case.q, case.k, 4, 8, False))

    def call(**kw):
        args = dict(a, **kw)
        return f(*args.values())

    for kw, word in [
        (dict(cu_seqlens_q=case.cu_q.float()), "cu_seqlens_q"),
        (dict(cu_seqlens_kv=case.cu_kv[:-1]), "cu_seqlens_kv"),
        (dict(cu_seqlens_q=case.cu_q.cpu()), "cu_seqlens_q"),
        (dict(max_seqlen_q=0), "max_seqlen_q"),
        (dict(max_seqlen_kv=0), "max_seqlen_kv"),
        (dict(max_seqlen_kv=10**6), "max_seqlen_kv"),
        (dict(softmax_scale=float("inf")), "softmax_scale"),
        (dict(softmax_scale=1e39), "softmax_scale"),
        (dict(k=case.k[:, :1].repeat(1, 3, 1), v=case.v[:, :1].repeat(1, 3, 1)), "heads"),
        (dict(v=case.v.half()), "dtype"),
        (dict(q=case.q[..., :96].contiguous(), k=case.k[..., :96].contiguous(),
              v=case.v[..., :96].contiguous()), "head dim"),
        (dict(seqlens_kv=case.cu_kv[1:]), "seqlens_kv"),
        (dict(plan=[1, 0, 1]), "plan"),
        # a kernel id no build has, in a record of the call's head dim (a record of another
        # head dim does not fit the call, whatever its kernel)
        (dict(plan=[1, 0, 99, case.q.shape[-1]] + [0] * 6), "no kernel for the plan"),
        (dict(plan=[1, 0, 1, 64] + [0] * 6), "does not fit this call"),
    ]:
        with pytest.raises(RuntimeError, match=word):
            call(**kw)


def test_cuda_graph_capture(dev):
    """Capture the op with static inputs; replay with new values and new device-side offsets
    copied in: bitwise equal to eager, nothing read from the host."""
    b, max_q, max_kv = 64, 33, 300

    def make(seed):
        gen = torch.Generator().manual_seed(seed)
        q_lens, kv_lens = lens(gen, b, 0, max_q), lens(gen, b, 0, max_kv)
        # fixed tensor sizes across cases: rows past the last segment are padding / unread
        return C.thd_case(seed, q_lens, kv_lens, 8, 2, 128, torch.bfloat16, max_q=max_q,
                          max_kv=max_kv, pad_after=b * max_q - sum(q_lens),
                          kv_pad=0, device=dev), sum(kv_lens)

    (first, n1), (second, n2) = make(20), make(21)
    total_kv = b * max_kv

    def pad_kv(case, n):
        k = torch.full((total_kv,) + tuple(case.k.shape[1:]), float("nan"), dtype=case.k.dtype,
                       device=dev)
        v = k.clone()
        k[:n], v[:n] = case.k, case.v
        return C.TiledCase(case.q, k, v, case.cu_q, case.cu_kv, None, max_q, max_kv, case.scale)

    first, second = pad_kv(first, n1), pad_kv(second, n2)
    static = C.TiledCase(first.q.clone(), first.k.clone(), first.v.clone(), first.cu_q.clone(),
                         first.cu_kv.clone(), None, max_q, max_kv, first.scale)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            op(static, poison=False)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = op(static, poison=False)
    for case in (second, first, second):
        for name in ("q", "k", "v", "cu_q", "cu_kv"):
            getattr(static, name).copy_(getattr(case, name))
        poison_allocator(dev)
        graph.replay()
        torch.cuda.synchronize()
        C.check(case, *captured, ctx="graph replay", expect_bad=[])
        eager = op(case)
        for name, x, y in zip(("out", "lse", "probs"), captured, eager):
            torch.testing.assert_close(x, y, rtol=0, atol=0, equal_nan=True,
                                       msg=f"{name}: graph != eager")
    assert read_errors(reset=True) == (0, -1)
    del graph
