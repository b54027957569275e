"""GPU tests of the Hopper warpgroup backward over long histories (257-4096 keys): the dQ kernel
that streams K / V through a ring of 64-key steps (hip_src/small_seq/
tiled_bwd_warpgroup_dq_stream_kernel.h) beside the per-key-block dK / dV kernel, and the one- and
two-tile walks over many key blocks, against the float64 oracle: dq, dk and dv, ragged histories
ending mid-step, on a step's last key and one past it, of 0 and 1 keys, GQA 8/2, MQA, d 64 and
128, Delta from the dQ kernel or from the Delta pass, dlse; bitwise determinism; bitwise equality
with the staged dQ kernel where both serve (65-256 keys: the same sums in the same order).

The op is called directly with out and LSE from the oracle (as tests/test_small_seq_tiled_bwd_gpu.py
does), its outputs poisoned with NaN through the caching allocator, NaN q padding and k/v rows
around the segments; one test goes through ``fused_attn_small_seq``'s autograd with the flash
route off (the A/B against the route). Every test is marked ``gpu`` and skipped without a device,
and skipped where the build or device has no warpgroup kernels (sm_90a build on a 9.0 device).

Bounds: tests/helpers/small_seq_tiled_bwd_cases.py (1e-2 bf16 / 5e-3 fp16 relative error).
"""

from __future__ import annotations

import os
import sys

import pytest
import torch

import rocm_attn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from rocm_attn import fused_attn_small_seq, small_seq_plan  # noqa: E402
from helpers.gpu import gpu_marks  # noqa: E402
from helpers.small_seq_tiled_gpu import DTYPES, lens, tiled_device  # noqa: E402
from helpers import small_seq_tiled_bwd_cases as G  # noqa: E402
from helpers import small_seq_tiled_cases as C  # noqa: E402
from test_small_seq_tiled_bwd_gpu import check, op  # noqa: E402  (the short-history file's)

# every test starts and ends with a clean device error counter (tests/conftest.py)
pytestmark = [*gpu_marks(thd_ops=False), pytest.mark.usefixtures("clean_error_counter")]

# (h_q, h_kv): MHA, GQA 8/2, MQA
GROUPS = [pytest.param(8, 8, id="g1"), pytest.param(8, 2, id="g4"),
          pytest.param(8, 1, id="mqa")]

# Per max_seqlen_kv, histories ending on and off 64-key steps, 0 and 1 keys, the longest.
KV_LENS = {
    300: [300, 0, 1, 257, 63, 64, 65, 129, 299, 256],
    1000: [1000, 0, 1, 999, 257, 64, 513, 700, 65, 128],
    4096: [4096, 0, 1, 4095, 1000, 64, 2049, 3001, 4033, 65],
}
# Queries per segment: 1 (a tile mostly past the segment), whole and cut 64-row tiles, an odd
# number of tiles per (segment, kv head) (one warpgroup of the last pair idle), none.
Q_LENS = [64, 1, 17, 130, 0, 33, 200, 2, 16, 5]


@pytest.fixture(scope="module")
def dev():
    device = tiled_device("small_seq_tiled_bwd")
    if not rocm_attn.small_seq_flash.warpgroup_kernels():
        pytest.skip("needs the Hopper warpgroup kernels (sm_90a build on a 9.0 device)")
    return device


def ran_kernels(case, seed, dlse=False):
    """check() under the CUDA profiler: (gradients, names of the warpgroup backward kernels that
    ran, or None where the profiler saw no kernel: no CUPTI under compute-sanitizer)."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        _, grads = check(case, seed, dlse)
    ran = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    return grads, ([n for n in ran if "small_seq_tiled_bwd_warpgroup" in n] if ran else None)


def bwd_kernels(case) -> tuple:
    """The backward plan's kernels of a case on this device with this process's tuning."""
    call = small_seq_plan.Call(case.q.shape[-1], case.q.shape[-2], case.k.shape[-2], case.max_q,
                               case.max_kv, layout="thd" if case.cu_q is not None else "bshd")
    device = small_seq_plan.device_of(case.q.device.index)
    return small_seq_plan.plan_tiled_backward(call, device,
                                              small_seq_plan.current_tuning()).kernels


@pytest.mark.parametrize("h_q,h_kv", GROUPS)
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("max_kv", list(KV_LENS))
def test_long_histories(dev, max_kv, d, h_q, h_kv):
    """The streaming dQ kernel (Delta from dO and out) and the per-key-block dK / dV kernel over
    300, 1000 and 4096-key calls, the warpgroup backward for every call it can serve (fewer rows
    included), against the float64 oracle (int64 offsets, dlse, NaN q padding and k/v rows
    around the segments): the plan names the streaming kernel and the profiler sees it run."""
    q_lens, kv_lens = Q_LENS, KV_LENS[max_kv]
    case = C.thd_case(max_kv + d + h_q + h_kv, q_lens, kv_lens, h_q, h_kv, d, torch.bfloat16,
                      offsets=torch.int64, max_kv=max_kv, pad_before=3, pad_after=2, kv_pad=2,
                      device=dev)
    with rocm_attn.tuning.override(**G.WARPGROUP_PASS):
        assert "tiled_bwd_warpgroup_dq_stream" in bwd_kernels(case)
        (dq, dk, dv), names = ran_kernels(case, seed=d + max_kv, dlse=True)
    assert (dq[:3] == 0).all() and (dq[-2:] == 0).all()
    assert (dk[:2] == 0).all() and (dv[-2:] == 0).all()
    if names is not None:
        assert any("dq_stream" in n for n in names), names


@pytest.mark.parametrize("h_q,h_kv", GROUPS)
def test_long_histories_bshd(dev, h_q, h_kv):
    """BSHD q of 150 queries per user (the last row tile of each (user, kv head) runs past s_q)
    over histories of 0..4096 keys, NaN k/v past each length, by default tuning (BSHD calls take
    no route): the streaming dQ kernel and the dK / dV kernel against the float64 oracle."""
    case = C.bshd_case(120 + h_kv, 150, [4096, 0, 1, 1000, 2049, 65, 4033], 4096, h_q, h_kv, 128,
                       torch.bfloat16, device=dev)
    assert "tiled_bwd_warpgroup_dq_stream" in bwd_kernels(case)
    check(case, seed=121, dlse=True)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("d", [64, 128])
def test_long_histories_ragged_many_users(dev, d, dtype):
    """A ragged request batch as a ranking server sends it: 96 users of 0-120 candidates over
    0-4096 keys (GQA 8/2, more items than the grid's blocks, so that each block runs several),
    int32 offsets, strided q / k / v views, default tuning past the route (THD calls of this
    shape take the flash route by default: off here)."""
    gen = torch.Generator().manual_seed(60 + d)
    b = 96
    case = C.thd_case(60 + d, lens(gen, b, 0, 120), lens(gen, b, 0, 4096), 8, 2, d, dtype,
                      max_q=120, max_kv=4096, strided=True, pad_before=4, pad_after=3, kv_pad=3,
                      device=dev)
    with rocm_attn.tuning.override(small_seq_flash_route=0):
        assert "tiled_bwd_warpgroup_dq_stream" in bwd_kernels(case)
        _, (dq, dk, dv) = check(case, seed=61 + d, dlse=True)
    assert (dq[:4] == 0).all() and (dq[-3:] == 0).all()
    assert (dk[:3] == 0).all() and (dv[-3:] == 0).all()


ONE_TILE = ("tiled_bwd_warpgroup_tma",)  # WITH_DQ and TRANSPOSED
TWO_TILE = ("tiled_bwd_warpgroup_two_tile",)


@pytest.mark.parametrize("h_q,h_kv,max_q,walk", [(8, 2, 16, ONE_TILE), (8, 2, 32, TWO_TILE),
                                                 (8, 8, 100, TWO_TILE), (8, 1, 8, ONE_TILE)],
                         ids=["one-tile-g4", "two-tile-g4", "two-tile-g1", "one-tile-mqa"])
@pytest.mark.parametrize("d", [64, 128])
def test_walks_over_long_histories(dev, d, h_q, h_kv, max_q, walk):
    """The one- and two-tile walks (every (segment, kv head) within one or two 64-row tiles)
    over up to 4096 keys: their key blocks staged one by one, dQ summed across 64 of them."""
    q_lens = [max_q, 1, 0, max_q - 1, 3, max_q]
    kv_lens = [4096, 1, 70, 4033, 0, 2000]
    case = C.thd_case(70 + d + max_q, q_lens, kv_lens, h_q, h_kv, d, torch.bfloat16,
                      max_q=max_q, max_kv=4096, pad_before=2, pad_after=2, device=dev)
    kernels = bwd_kernels(case)
    assert kernels[0] == "tiled_bwd_delta" and len(kernels) == 2 and kernels[1] in walk, kernels
    check(case, seed=71 + d, dlse=True)


@pytest.mark.parametrize("d", [64, 128])
def test_deterministic(dev, d):
    """Two (four) backward passes of the same 4096-key call: bitwise the same dq, dk, dv, with
    other work on the device in between."""
    case = C.thd_case(80 + d, [200, 17, 1, 130], [4096, 1000, 17, 3001], 8, 2, d,
                      torch.bfloat16, max_kv=4096, device=dev)
    with rocm_attn.tuning.override(**G.WARPGROUP_PASS):
        inputs, first = check(case, seed=80 + d, dlse=True)
        for _ in range(3):
            torch.randn(1 << 20, device=case.q.device).sum()
            G.assert_same_bits(first, op(case, *inputs))


@pytest.mark.parametrize("d", [64, 128])
def test_stream_equals_staged(dev, d):
    """Over 65-256 keys, where the staged dQ kernel serves by default, the streaming one
    (tuning small_seq_tiled_bwd_dq_stream 2) computes the same sums in the same order: bitwise
    equal gradients."""
    q_lens = [64, 1, 17, 130, 0, 33, 512, 2, 16, 5]
    kv_lens = [256, 65, 129, 192, 77, 0, 200, 255, 128, 1]
    case = C.thd_case(90 + d, q_lens, kv_lens, 8, 2, d, torch.bfloat16, offsets=torch.int64,
                      max_kv=256, pad_before=3, pad_after=5, kv_pad=4, device=dev)
    grads = {}
    for stream in (1, 2):
        with rocm_attn.tuning.override(**G.WARPGROUP_PASS, small_seq_tiled_bwd_dq_stream=stream):
            assert ("tiled_bwd_warpgroup_dq_stream" in bwd_kernels(case)) == (stream == 2)
            _, grads[stream] = check(case, seed=91 + d, dlse=True)
    G.assert_same_bits(grads[1], grads[2])


def test_garbage_offsets_no_oob(dev):
    """Garbage int64 offsets on a 1000-key call (a segment of -1 keys, keys running from past the
    end of k/v, queries starting before q): NaN dq on the bad segments' rows, zero dk / dv on
    their keys, every other segment exact, and no access outside the tensors (run under
    compute-sanitizer by tools/gpu_check.sh --memcheck)."""
    q_lens = [3, 70, 17, 2, 40, 5, 1, 2, 66]
    kv_lens = [5, 1000, 64, 3, 300, 1, 0, 7, 999]
    case = C.thd_case(100, q_lens, kv_lens, 8, 2, 128, torch.bfloat16, offsets=torch.int64,
                      max_q=70, max_kv=1000, pad_before=2, pad_after=2, kv_pad=3, device=dev)
    case.cu_kv[6] = case.cu_kv[5] - 1
    case.cu_kv[8] = 2**40
    case.cu_q[2] = -2**40
    with rocm_attn.tuning.override(**G.WARPGROUP_PASS):
        assert "tiled_bwd_warpgroup_dq_stream" in bwd_kernels(case)
        check(case, seed=101)


@pytest.mark.parametrize("h_q,h_kv", GROUPS)
def test_autograd_route_off(dev, h_q, h_kv):
    """fused_attn_small_seq's forward and backward with the flash route off (the path the
    ragged benchmark's A/B runs for 257-4096-key rows): gradients against the float64 oracle on
    the op's own out and LSE, and bitwise the same on a second backward."""
    gen = torch.Generator().manual_seed(110 + h_kv)
    b, max_q, max_kv = 24, 150, 4096
    case = C.thd_case(110 + h_kv, lens(gen, b, 60, max_q), lens(gen, b, 0, max_kv), h_q, h_kv,
                      128, torch.bfloat16, max_q=max_q, max_kv=max_kv, device=dev)
    leaves = [t.detach().clone().requires_grad_() for t in (case.q, case.k, case.v)]
    dout = torch.randn_like(case.q)
    with rocm_attn.tuning.override(small_seq_flash_route=0):
        assert "tiled_bwd_warpgroup_dq_stream" in bwd_kernels(case)
        runs = []
        for _ in range(2):
            out = fused_attn_small_seq(*leaves, case.cu_q, case.cu_kv, max_q, max_kv)
            runs.append(torch.autograd.grad(out, leaves, dout))
    torch.cuda.synchronize()
    G.check_grads(case, dout, None, *runs[0])
    G.assert_same_bits(runs[0], runs[1])
