"""GPU tests of the tiled small-seq backward op, ``torch.ops.rocm_attn.small_seq_tiled_bwd``
(hip_src/small_seq/tiled_bwd_kernel.h), called directly with out and LSE from the float64
oracle (so they do not depend on the forward kernel): any number of queries per segment, long
histories, GQA, int32 / int64 offsets, THD and BSHD, dlse, garbage offsets, determinism.

Every test is marked ``gpu`` and skipped unless a CUDA/ROCm device is present and the compiled
extension is loaded. The gradient oracle is float64 (tests/helpers/small_seq_tiled_bwd_cases.py,
cross-checked against autograd through rocm_attn.reference in
tests/test_emu_small_seq_tiled_bwd.py). dq / dk / dv are allocated by the op, so they are
poisoned through the caching allocator (NaN in every float dtype) before each call: an element
the kernels forget to write shows as NaN, and NaN never passes. Input rows no segment may read
(q padding, k/v around the segments, BSHD rows past a length) are NaN too.

Bounds: gradients within 1e-2 (bf16) / 5e-3 (fp16) relative error of the oracle.
"""

from __future__ import annotations

import os
import re
import sys

import pytest
import torch

import rocm_attn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from rocm_attn import small_seq_plan  # noqa: E402
from rocm_attn.errors import read_errors  # noqa: E402
from helpers.gpu import gpu_marks, poison_allocator  # noqa: E402
from helpers.small_seq_tiled_gpu import DTYPES, GROUPS, lens, tiled_device  # noqa: E402
from helpers import small_seq_tiled_bwd_cases as G  # noqa: E402
from helpers import small_seq_tiled_cases as C  # noqa: E402

# every test starts and ends with a clean device error counter (tests/conftest.py)
pytestmark = [*gpu_marks(thd_ops=False), pytest.mark.usefixtures("clean_error_counter")]


@pytest.fixture(scope="module")
def dev():
    return tiled_device("small_seq_tiled_bwd")


def op(case: C.TiledCase, dout, out, lse, dlse, poison=True):
    if poison:
        poison_allocator(case.q.device)
    return torch.ops.rocm_attn.small_seq_tiled_bwd(
        dout, case.q, case.k, case.v, out, lse, dlse, case.cu_q, case.cu_kv, case.seqlens,
        case.max_q, case.max_kv, case.scale,
        small_seq_plan.tiled_bwd_plan(case.q, case.k, case.max_q, case.max_kv))


def _passes(name):
    """Tuning values of a pass name: G.BWD_PASSES' or the warpgroup kernels'."""
    if name == "warpgroup":
        return G.WARPGROUP_PASS
    return G.BWD_PASSES[name]


def warpgroup_device(dev) -> bool:
    """Whether this device and build run the Hopper warpgroup kernels."""
    return rocm_attn.small_seq_flash.warpgroup_kernels()


def check(case, seed=0, dlse=False):
    """Gradients against the oracle; the backward leaves the error counter alone (the forward
    counts bad segments). Returns the inputs and the gradients."""
    dout, out, lse, dl = G.inputs(case, seed, dlse)
    grads = op(case, dout, out, lse, dl)
    torch.cuda.synchronize()
    G.check_grads(case, dout, dl, *grads)
    assert read_errors(reset=True) == (0, -1), "the backward touched the error counter"
    return (dout, out, lse, dl), grads


def check_profiled(case, seed):
    """check(case, seed, dlse=True) under the CUDA profiler: (the gradients, the names of the
    warpgroup backward kernels it ran), the names None where the profile holds no kernel at all
    (the profiler had no CUPTI: compute-sanitizer holds it), the gradients then the whole
    check."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        _, grads = check(case, seed=seed, dlse=True)
    ran = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    return grads, [n for n in ran if "small_seq_tiled_bwd_warpgroup" in n] if ran else None


@pytest.mark.parametrize("passes", list(G.BWD_PASSES))
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("h_q,h_kv", GROUPS)
@pytest.mark.parametrize("d", [64, 128, 256])
def test_many_queries_per_segment(dev, d, h_q, h_kv, dtype, passes):
    """Queries per segment 1, 2, 17 and 512 (and 0) against keys 17, 64, 256, 1000 (and 0)."""
    q_lens = [1, 2, 17, 512, 0, 1, 17, 2, 512, 3]
    kv_lens = [17, 64, 256, 1000, 5, 0, 1000, 17, 64, 256]
    case = C.thd_case(d + h_q + h_kv, q_lens, kv_lens, h_q, h_kv, d, dtype, device=dev)
    with rocm_attn.tuning.override(**G.BWD_PASSES[passes]):
        check(case, seed=d, dlse=d == 128)


@pytest.mark.parametrize("h_q,h_kv", GROUPS)
@pytest.mark.parametrize("max_kv", [16, 17, 64, 256, 1000])
def test_one_query_long_histories(dev, max_kv, h_q, h_kv):
    """q = 1 per segment over ragged histories up to max_kv (16: one key tile, no dQ pass)."""
    gen = torch.Generator().manual_seed(max_kv + h_kv)
    b = 300
    case = C.thd_case(max_kv, [1] * b, lens(gen, b, 0, max_kv), h_q, h_kv, 128, torch.bfloat16,
                      max_kv=max_kv, device=dev)
    check(case, seed=max_kv, dlse=True)


@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("h_q,h_kv", [(8, 1), (8, 8)], ids=["g8", "g1"])
def test_tile_boundaries(dev, h_q, h_kv, d):
    """Rows per (segment, kv head) of 16 (one row tile: one item walks every key tile) and 17+
    (the dK/dV items per key tile plus the dQ pass), against 16 keys (one key tile) and 17."""
    group = h_q // h_kv
    q_lens = [16 // group, 16 // group + 1, 16 // group, 16 // group + 1, 1, 16 // group + 1]
    case = C.thd_case(30 + d, q_lens, [16, 16, 17, 17, 33, 1000], h_q, h_kv, d, torch.bfloat16,
                      device=dev)
    check(case, seed=30, dlse=True)


@pytest.mark.parametrize("passes", list(G.BWD_PASSES))
@pytest.mark.parametrize("offsets", [torch.int32, torch.int64], ids=["i32", "i64"])
@pytest.mark.parametrize("h_q,h_kv", GROUPS)
def test_ragged_many_segments(dev, h_q, h_kv, offsets, passes):
    """Many segments with random query and key counts, empty ones included."""
    gen = torch.Generator().manual_seed(h_q * 10 + h_kv)
    b = 500
    case = C.thd_case(3, lens(gen, b, 0, 40), lens(gen, b, 0, 300), h_q, h_kv, 128,
                      torch.bfloat16, offsets=offsets, max_q=40, max_kv=300, device=dev)
    with rocm_attn.tuning.override(**G.BWD_PASSES[passes]):
        check(case, seed=3)


def test_mixed_offset_dtypes(dev):
    """cu_seqlens_q int32 with cu_seqlens_kv int64, and the other way round."""
    for qo, ko in ((torch.int32, torch.int64), (torch.int64, torch.int32)):
        case = C.thd_case(4, [3, 17, 1, 0], [64, 1, 0, 17], 8, 2, 128, torch.bfloat16,
                          offsets=qo, kv_offsets=ko, device=dev)
        check(case, seed=4)


@pytest.mark.parametrize("offsets", [torch.int32, torch.int64], ids=["i32", "i64"])
def test_strided_views_padding_rows(dev, offsets):
    """q a head slice of a wider tensor, k/v halves of one fused tensor; padding q rows before
    and after the segments (dq 0) and unread NaN k/v rows around them (dk = dv = 0)."""
    case = C.thd_case(5, [2, 17, 512, 1, 0], [17, 64, 256, 1000, 3], 8, 2, 128, torch.bfloat16,
                      offsets=offsets, strided=True, pad_before=7, pad_after=9, kv_pad=5,
                      device=dev)
    _, (dq, dk, dv) = check(case, seed=5)
    assert (dq[:7] == 0).all() and (dq[-9:] == 0).all()
    assert (dk[:5] == 0).all() and (dv[-5:] == 0).all()


def test_empty_segments_and_no_segments(dev):
    """Segments without queries (their keys get zero gradient), without keys (their queries get
    dq 0), and a call with no segment at all (everything zero)."""
    case = C.thd_case(6, [0, 0, 5, 0], [3, 0, 0, 17], 8, 2, 64, torch.bfloat16, pad_before=2,
                      pad_after=4, max_q=5, device=dev)
    _, (dq, dk, dv) = check(case, seed=6)
    assert (dq == 0).all() and (dk == 0).all() and (dv == 0).all()
    empty = C.thd_case(7, [], [], 8, 2, 64, torch.bfloat16, pad_before=3, kv_pad=2, device=dev)
    dout, out, lse, _ = G.inputs(empty, 7, False)
    dq, dk, dv = op(empty, dout, out, lse, None)
    assert (dq == 0).all() and (dk == 0).all() and (dv == 0).all()


@pytest.mark.parametrize("passes", ["default", "warpgroup"])
@pytest.mark.parametrize("offsets", [torch.int32, torch.int64], ids=["i32", "i64"])
@pytest.mark.parametrize("s_q", [1, 17])
def test_bshd(dev, s_q, offsets, passes):
    """BSHD q [b, s_q, h, d], k/v [b, s_kv, h, d] with seqlens_kv: rows past a length get zero
    gradient; a length past s_kv is a bad segment (NaN dq, zero dk / dv)."""
    case = C.bshd_case(8, s_q, [0, 1, 17, 300, 64], 300, 8, 2, 128, torch.bfloat16,
                       offsets=offsets, device=dev)
    check(case, seed=8)
    case = C.bshd_case(9, s_q, [5, 41, 2], 40, 8, 2, 128, torch.bfloat16, offsets=offsets,
                       max_kv=64, device=dev)
    case.seqlens[1] = 41  # <= max_seqlen_kv but > s_kv
    with rocm_attn.tuning.override(**(G.WARPGROUP_PASS if passes == "warpgroup" else {})):
        _, (dq, dk, dv) = check(case, seed=9)
    assert torch.isnan(dq[1]).all() and (dk[1] == 0).all() and (dv[1] == 0).all()


def corrupt_offsets(case, q_at: int, far: int = 2**40):
    """Garbage offsets in a case of at least 8 segments: segment 5 gets -1 keys, segment 7's
    keys run from past the end of k/v (cu_seqlens_kv[8] = far), and segments q_at - 1 and q_at
    start their queries before the start of q (cu_seqlens_q[q_at] = -far)."""
    case.cu_kv[6] = case.cu_kv[5] - 1
    case.cu_kv[8] = far
    case.cu_q[q_at] = -far


@pytest.mark.parametrize("passes", [*G.BWD_PASSES, "warpgroup"])
def test_garbage_offsets_no_oob(dev, passes):
    """Garbage int64 offsets (2^40, negative, more queries than max_seqlen_q, more keys than
    max_seqlen_kv): NaN dq on the bad segments' rows, zero dk / dv on their keys, no
    out-of-bounds access (k/v are small and surrounded by unread NaN rows; a stray read would
    fault or show), every other segment exact."""
    q_lens, kv_lens = [3, 1, 17, 2, 40, 5, 1, 2, 4], [5, 17, 64, 3, 10, 1, 0, 7, 9]
    case = C.thd_case(10, q_lens, kv_lens, 8, 2, 128, torch.bfloat16, offsets=torch.int64,
                      max_q=17, max_kv=64, pad_before=2, pad_after=2, kv_pad=3, device=dev)
    corrupt_offsets(case, q_at=2)
    with rocm_attn.tuning.override(**_passes(passes)):
        check(case, seed=10)


def test_garbage_offsets_int32_wrap(dev):
    """int32 offsets whose 32-bit difference wraps into the valid range: never read."""
    case = C.thd_case(11, [1, 2, 17, 1, 3], [4, 6, 9, 2, 5], 8, 8, 64, torch.bfloat16,
                      max_kv=16, device=dev)
    case.cu_kv[2] = 2147483640
    case.cu_kv[3] = -2147483640
    check(case, seed=11)


def test_deterministic(dev):
    """Bitwise the same gradients run to run (dK / dV reduced over 512 queries per segment in a
    fixed order, no atomics), with other work on the device in between."""
    case = C.thd_case(12, [512, 17, 1, 512], [1000, 64, 17, 16], 8, 2, 128, torch.bfloat16,
                      device=dev)
    repeated_bits(case, {}, 12)


def repeated_bits(case, knobs, seed):
    """Gradients under tuning `knobs` against the oracle, then three more times with other work
    on the device in between: bitwise the same. Returns the inputs and the first gradients."""
    with rocm_attn.tuning.override(**knobs):
        inputs, first = check(case, seed=seed, dlse=True)
        for _ in range(3):
            torch.randn(1 << 20, device=case.q.device).sum()
            G.assert_same_bits(first, op(case, *inputs))
    return inputs, first


def test_host_checks_name_the_argument(dev):
    case = C.thd_case(13, [2, 3], [4, 5], 8, 2, 128, torch.bfloat16, device=dev)
    dout, out, lse, _ = G.inputs(case, 13, False)
    f = torch.ops.rocm_attn.small_seq_tiled_bwd
    a = dict(dout=dout, q=case.q, k=case.k, v=case.v, out=out, lse=lse, dlse=None,
             cu_seqlens_q=case.cu_q, cu_seqlens_kv=case.cu_kv, seqlens_kv=None, max_seqlen_q=4,
             max_seqlen_kv=8, softmax_scale=0.1,
             plan=small_seq_plan.tiled_bwd_plan(case.q, case.k, 4, 8))

    def call(**kw):
        return f(*dict(a, **kw).values())

    for kw, word in [
        (dict(dout=dout[:-1]), "dout"),
        (dict(out=out.half()), "out"),
        (dict(lse=lse[:, :-1]), "lse"),
        (dict(lse=lse.double()), "lse"),
        (dict(dlse=lse[:1]), "dlse"),
        (dict(cu_seqlens_q=case.cu_q.float()), "cu_seqlens_q"),
        (dict(cu_seqlens_kv=case.cu_kv[:-1]), "cu_seqlens_kv"),
        (dict(cu_seqlens_q=case.cu_q.cpu()), "cu_seqlens_q"),
        (dict(max_seqlen_q=0), "max_seqlen_q"),
        (dict(max_seqlen_kv=10**6), "max_seqlen_kv"),
        (dict(softmax_scale=float("inf")), "softmax_scale"),
        (dict(k=case.k[:, :1].repeat(1, 3, 1), v=case.v[:, :1].repeat(1, 3, 1)), "heads"),
        (dict(v=case.v.half()), "dtype"),
        (dict(seqlens_kv=case.cu_kv[1:]), "seqlens_kv"),
        (dict(plan=[1, 0, 10]), "plan"),
        (dict(plan=[1, 0, 99, 128] + [0] * 6), "no kernel for the plan"),
        (dict(plan=[1, 0, 10, 64] + [0] * 6), "does not fit this call"),
    ]:
        with pytest.raises(RuntimeError, match=word):
            call(**kw)


def test_cuda_graph_capture(dev):
    """Capture the op with static inputs; replay with new values and new device-side offsets
    copied in: bitwise equal to eager, nothing read from the host."""
    b, max_q, max_kv = 32, 33, 300

    def make(seed):
        gen = torch.Generator().manual_seed(seed)
        q_lens, kv_lens = lens(gen, b, 0, max_q), lens(gen, b, 0, max_kv)
        case = C.thd_case(seed, q_lens, kv_lens + [b * max_kv - sum(kv_lens)], 8, 2, 128,
                          torch.bfloat16, max_q=max_q, max_kv=b * max_kv,
                          pad_after=b * max_q - sum(q_lens), device=dev)
        # fixed tensor sizes: one extra segment of keys pads k / v; drop it from the offsets
        case.cu_kv = case.cu_kv[:-1].contiguous()
        case.max_kv = max_kv
        return case

    first, second = make(20), make(21)
    ins = [G.inputs(c, s, True) for c, s in ((first, 20), (second, 21))]
    static = C.TiledCase(first.q.clone(), first.k.clone(), first.v.clone(), first.cu_q.clone(),
                         first.cu_kv.clone(), None, max_q, max_kv, first.scale)
    static_in = [t.clone() for t in ins[0]]
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            op(static, *static_in, poison=False)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = op(static, *static_in, poison=False)
    for case, inp in ((second, ins[1]), (first, ins[0]), (second, ins[1])):
        for name in ("q", "k", "v", "cu_q", "cu_kv"):
            getattr(static, name).copy_(getattr(case, name))
        for dst, src in zip(static_in, inp):
            dst.copy_(src)
        poison_allocator(dev)
        graph.replay()
        torch.cuda.synchronize()
        G.check_grads(case, inp[0], inp[3], *captured, "graph replay")
        eager = op(case, *inp)
        for name, x, y in zip(("dq", "dk", "dv"), captured, eager):
            torch.testing.assert_close(x, y, rtol=0, atol=0, equal_nan=True,
                                       msg=f"{name}: graph != eager")
    assert read_errors(reset=True) == (0, -1)
    del graph


# The warpgroup kernels (tiled_bwd_warpgroup_tma_kernel.h): histories of at most 256 keys here
# (16-key products up to 16 keys; one dK / dV / dQ kernel up to 64; past that the one- and
# two-tile walks, or the dK / dV kernel per 64-key block and the dQ kernel), 64-row tiles of
# (query, q head) rows.
WARPGROUP_KV_LENS = {
    16: [16, 1, 16, 16, 5, 0, 16, 3, 16, 9, 16],
    64: [17, 64, 63, 64, 5, 0, 1, 64, 17, 40, 64],
    256: [65, 256, 200, 128, 0, 129, 1, 255, 17, 192, 64],
}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("h_q,h_kv", GROUPS)
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("max_kv", list(WARPGROUP_KV_LENS))
def test_warpgroup_many_candidates(dev, max_kv, d, h_q, h_kv, dtype):
    """Queries per segment 1, 2, 17, 64, 65, 512 and 0 against keys 0, 1, 16 and (longer
    calls) whole and partial 64-key blocks, by the warpgroup kernels, against the float64
    oracle."""
    if not warpgroup_device(dev):
        pytest.skip("needs the Hopper warpgroup kernels (sm_90a build on a 9.0 device)")
    q_lens = [1, 2, 17, 512, 0, 64, 65, 17, 2, 512, 3]
    kv_lens = WARPGROUP_KV_LENS[max_kv]
    case = C.thd_case(max_kv + d + h_q + h_kv, q_lens, kv_lens, h_q, h_kv, d, dtype,
                      max_kv=max_kv, device=dev)
    with rocm_attn.tuning.override(**G.WARPGROUP_PASS):
        check(case, seed=d + max_kv, dlse=d == 128)


@pytest.mark.parametrize("h_q,h_kv,tma", [(8, 2, 0), (6, 2, 1), (16, 2, 1), (16, 1, 1)],
                         ids=["g4-no-tile-copies", "g3", "g8", "g16"])
@pytest.mark.parametrize("max_kv", list(WARPGROUP_KV_LENS))
def test_warpgroup_tile_copies(dev, max_kv, h_q, h_kv, tma):
    """The dK / dV kernel's row tiles by tile copies (CUDA sm_90a builds: GQA groups of 8 and 16,
    Q / dO boxes of 8 and 4 tokens; whole tiles copied, tiles cut by a segment's end by
    cp.async), and the calls tile copies cannot serve (tuning small_seq_tiled_warpgroup_tma 0; a
    group of 3, whose tiles hold no whole tokens), which the plan gives the wave / block
    kernels and the two-tile kernel: int64 offsets, padding q rows and NaN k/v rows around."""
    if not warpgroup_device(dev):
        pytest.skip("needs the Hopper warpgroup kernels (sm_90a build on a 9.0 device)")
    q_lens = [1, 2, 17, 512, 0, 64, 65, 17, 2, 512, 3]
    case = C.thd_case(90 + max_kv + h_q + h_kv, q_lens, WARPGROUP_KV_LENS[max_kv], h_q, h_kv,
                      128, torch.bfloat16, offsets=torch.int64, max_kv=max_kv, pad_before=3,
                      pad_after=4, kv_pad=2, device=dev)
    with rocm_attn.tuning.override(**G.WARPGROUP_PASS, small_seq_tiled_warpgroup_tma=tma):
        _, (dq, _, _) = check(case, seed=91 + max_kv, dlse=True)
    assert (dq[:3] == 0).all() and (dq[-4:] == 0).all()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("h_q,h_kv,tma", [(8, 8, 1), (8, 2, 1), (16, 2, 1), (6, 2, 1), (8, 2, 0)],
                         ids=["g1", "g4", "g8", "g3-no-tile-copies", "g4-no-tile-copies"])
def test_warpgroup_key_blocks(dev, h_q, h_kv, tma, d, dtype):
    """The backward of histories past one key block, its score products over whole 64-key
    blocks (the dK / dV kernel's transposed, S^T = K Q^T with P^T and dS^T as register
    operands; the dQ kernel's m64n64), against the float64 oracle: histories of 65..256 keys
    (one key past a block, whole blocks, 0 keys), row tiles cut by a segment's end and whole
    ones, int64 offsets, dlse, padding q rows, NaN k/v rows around the segments. Without tile
    copies (tuning small_seq_tiled_warpgroup_tma 0; a GQA group of 3 does not divide a 64-row
    tile) the calls take the wave / block kernels: no warpgroup kernel runs (512 rows per
    segment: past the two-tile walk). The CUDA profiler's kernel names show which instances
    ran: with tile copies the dK / dV kernel's last template argument (TRANSPOSED) is true."""
    if not warpgroup_device(dev):
        pytest.skip("needs the Hopper warpgroup kernels (sm_90a build on a 9.0 device)")
    q_lens = [64, 1, 17, 130, 0, 33, 512, 2, 16, 5]
    kv_lens = [256, 65, 129, 192, 77, 0, 200, 255, 128, 66]
    case = C.thd_case(97 + h_q + h_kv + d, q_lens, kv_lens, h_q, h_kv, d, dtype,
                      offsets=torch.int64, max_kv=256, pad_before=3, pad_after=5, kv_pad=4,
                      device=dev)
    with rocm_attn.tuning.override(**G.WARPGROUP_PASS, small_seq_tiled_warpgroup_tma=tma):
        (dq, dk, dv), names = check_profiled(case, 98 + d)
    assert (dq[:3] == 0).all() and (dq[-5:] == 0).all()
    assert (dk[:4] == 0).all() and (dv[-4:] == 0).all()

    def last_flag(name):  # the last template argument, demangled or mangled
        found = re.search(r"(true|false)>\s*\(", name)
        return found.group(1) == "true" if found else re.findall(r"Lb([01])E", name)[-1] == "1"

    if names is not None and not (tma and 64 % (h_q // h_kv) == 0):
        assert not names, names
    elif names is not None:  # else no CUPTI (check_profiled)
        assert any("_dq_" in n for n in names), names
        dkdv = [n for n in names if "bwd_warpgroup" in n and "_dq_" not in n
                and "two_tile" not in n]
        assert dkdv and all(last_flag(n) for n in dkdv), names


@pytest.mark.parametrize("h_kv", [2, 8], ids=["g4", "g1"])
def test_warpgroup_dq_tile_copies_bshd(dev, h_kv):
    """The dQ kernel (histories past one 64-key block) copying whole row tiles by tile copies:
    BSHD q of 100 queries, so that the last tile of each (user, kv head) runs past s_q (rows
    the copies fill with zeros), histories of 0..256 keys with NaN k/v past each length; against
    the float64 oracle."""
    if not warpgroup_device(dev):
        pytest.skip("needs the Hopper warpgroup kernels (sm_90a build on a 9.0 device)")
    case = C.bshd_case(93 + h_kv, 100, [256, 65, 0, 200, 129, 1], 256, 8, h_kv, 128,
                       torch.bfloat16, device=dev)
    with rocm_attn.tuning.override(**G.WARPGROUP_PASS):
        check(case, seed=94, dlse=True)


def test_warpgroup_dq_tile_copies_many_items(dev):
    """The tile-copy dQ kernel over more (segment, kv head) items than its grid has blocks, so
    that each block runs several items of 0..7 row tiles and its buffers' barriers carry their
    phases from item to item: against the float64 oracle, and bitwise the same run to run."""
    if not warpgroup_device(dev):
        pytest.skip("needs the Hopper warpgroup kernels (sm_90a build on a 9.0 device)")
    gen = torch.Generator().manual_seed(95)
    b = 700  # x 2 kv heads: 1400 items, over the 4 x 132 blocks of an H100 / H200 grid
    case = C.thd_case(95, lens(gen, b, 0, 112), lens(gen, b, 65, 256), 8, 2, 128,
                      torch.bfloat16, max_q=112, max_kv=256, pad_before=2, pad_after=3,
                      device=dev)
    with rocm_attn.tuning.override(**G.WARPGROUP_PASS):
        inputs, first = check(case, seed=96)
        G.assert_same_bits(first, op(case, *inputs))


@pytest.mark.parametrize("offsets", [torch.int32, torch.int64], ids=["i32", "i64"])
@pytest.mark.parametrize("max_kv", list(WARPGROUP_KV_LENS))
def test_warpgroup_ragged_strided(dev, max_kv, offsets):
    """Many ragged segments (empty ones included), strided q / k / v views, padding q rows (dq
    0, written by the kernel that computes Delta where pass 1 does not run: the dK / dV kernel up
    to 64 keys, the dQ kernel past that) and unread NaN k/v rows around the segments (dk = dv =
    0), by the warpgroup kernel."""
    if not warpgroup_device(dev):
        pytest.skip("needs the Hopper warpgroup kernels (sm_90a build on a 9.0 device)")
    gen = torch.Generator().manual_seed(40 + max_kv)
    b = 300
    case = C.thd_case(40 + max_kv, lens(gen, b, 0, 80), lens(gen, b, 0, max_kv), 8, 2, 128,
                      torch.bfloat16, offsets=offsets, max_q=80, max_kv=max_kv, strided=True,
                      pad_before=7, pad_after=9, kv_pad=5, device=dev)
    with rocm_attn.tuning.override(**G.WARPGROUP_PASS):
        _, (dq, dk, dv) = check(case, seed=41, dlse=offsets == torch.int64)
    assert (dq[:7] == 0).all() and (dq[-9:] == 0).all()
    assert (dk[:5] == 0).all() and (dv[-5:] == 0).all()


@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("max_kv", [16, 64, 256])
def test_warpgroup_fused_delta(dev, max_kv, d):
    """Delta computed by the kernels (no Delta pass: up to 64 keys the dK / dV kernel as
    rowsum(P dP) - dlse, past that the dQ kernel as rowsum(dO O) - dlse, whose tile copies also
    bring other segments' rows into a tile) against the oracle and against the wave / block
    kernels (Delta from the Delta pass): dlse, GQA, segments without keys or queries, a
    non-finite dO row (NaN on its own segment only, as with the Delta pass)."""
    if not warpgroup_device(dev):
        pytest.skip("needs the Hopper warpgroup kernels (sm_90a build on a 9.0 device)")
    q_lens = [16, 1, 0, 70, 5, 64, 3]
    kv_lens = [max_kv, 0, 3, max_kv - 1, 1, 9, max_kv]
    case = C.thd_case(50 + max_kv + d, q_lens, kv_lens, 8, 2, d, torch.bfloat16,
                      max_kv=max_kv, pad_before=3, pad_after=2, device=dev)
    with rocm_attn.tuning.override(**G.WARPGROUP_PASS):
        inputs, fused = check(case, seed=50 + d, dlse=True)
    with rocm_attn.tuning.override(**G.BWD_PASSES["passes"]):
        two_pass = op(case, *inputs)
    assert not any(torch.isnan(g).any() for g in two_pass)
    G.assert_close_grads(fused, two_pass)  # within the oracle's bound of each other
    # a NaN in one dO row of segment 3 (rows 3 + 1 + 0 .. of THD, after the 3 padding rows)
    dout = inputs[0].clone()
    row = 3 + 16 + 1 + 0 + 10
    dout[row, 0, 5] = float("nan")
    with rocm_attn.tuning.override(**G.WARPGROUP_PASS):
        dq, dk, dv = op(case, dout, *inputs[1:])
    torch.cuda.synchronize()
    seg_q = slice(3 + 17, 3 + 17 + 70)
    assert torch.isnan(dq[seg_q]).any()
    others = torch.ones(dq.shape[0], dtype=torch.bool, device=dq.device)
    others[seg_q] = False
    assert not torch.isnan(dq[others]).any(), "a NaN dO row leaked into another segment's dq"
    k0 = int(case.cu_kv[3])
    kn = int(case.cu_kv[4])
    kmask = torch.ones(dk.shape[0], dtype=torch.bool, device=dk.device)
    kmask[k0:kn] = False
    assert not torch.isnan(dk[kmask]).any() and not torch.isnan(dv[kmask]).any()


def test_warpgroup_deterministic_and_default(dev):
    """The warpgroup kernels' gradients are bitwise the same run to run (dK / dV summed over a
    segment's row tiles in order), and the default tuning takes them for 512 candidates over 64
    keys and over 256 (the same bits as forcing it)."""
    if not warpgroup_device(dev):
        pytest.skip("needs the Hopper warpgroup kernels (sm_90a build on a 9.0 device)")
    for max_kv in (64, 256):
        _deterministic_and_default(dev, max_kv)


def _deterministic_and_default(dev, max_kv):
    kv_lens = [max_kv, 64, 17, 16, 33]
    case = C.thd_case(42, [512, 17, 1, 512, 64], kv_lens, 8, 2, 128, torch.bfloat16,
                      max_kv=max_kv, device=dev)
    inputs, first = repeated_bits(case, G.WARPGROUP_PASS, 42)
    G.assert_same_bits(first, op(case, *inputs))


# The streaming kernel (tiled_bwd_stream_kernel.h): at most 4 rows (queries x GQA group) per
# (segment, kv head), any history up to the tiled limit. (h_q, h_kv, max queries per segment).
STREAM_ROWS = [pytest.param(8, 8, 1, id="g1q1"), pytest.param(8, 4, 1, id="g2q1"),
               pytest.param(8, 2, 1, id="g4q1"), pytest.param(4, 1, 1, id="g4q1mqa"),
               pytest.param(4, 4, 4, id="g1q4"), pytest.param(4, 2, 2, id="g2q2")]


@pytest.mark.parametrize("passes", list(G.STREAM_PASSES))
@pytest.mark.parametrize("h_q,h_kv,max_q", STREAM_ROWS)
@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("max_kv", [17, 256, 4096])
def test_stream_rows_and_histories(dev, max_kv, d, h_q, h_kv, max_q, passes):
    """Ragged queries (0..max_q) and histories (0..max_kv, the longest included) per segment,
    one (segment, kv head) per wave and per block, against the float64 oracle (fp16 at d 64,
    bf16 otherwise)."""
    dtype = torch.float16 if d == 64 else torch.bfloat16
    gen = torch.Generator().manual_seed(max_kv + d + h_q + max_q)
    b = 24 if max_kv == 4096 else 300
    kv_lens = lens(gen, b, 0, max_kv)
    kv_lens[1] = max_kv
    case = C.thd_case(max_kv + d + max_q, lens(gen, b, 0, max_q), kv_lens, h_q, h_kv, d, dtype,
                      max_q=max_q, max_kv=max_kv, device=dev)
    with rocm_attn.tuning.override(**G.STREAM_PASSES[passes]):
        check(case, seed=d + max_kv, dlse=max_q == 1)


@pytest.mark.parametrize("passes", list(G.STREAM_PASSES))
@pytest.mark.parametrize("offsets", [torch.int32, torch.int64], ids=["i32", "i64"])
def test_stream_strided_padding_bshd(dev, offsets, passes):
    """Strided views, padding q rows (dq 0) and unread NaN k/v rows around the segments
    (dk = dv = 0); BSHD with a length past s_kv (a bad segment: NaN dq, zero dk / dv)."""
    gen = torch.Generator().manual_seed(50)
    case = C.thd_case(50, [1] * 200, lens(gen, 200, 0, 1000), 8, 2, 128, torch.bfloat16,
                      offsets=offsets, strided=True, pad_before=7, pad_after=9, kv_pad=5,
                      max_kv=1000, device=dev)
    with rocm_attn.tuning.override(**G.STREAM_PASSES[passes]):
        _, (dq, dk, dv) = check(case, seed=50)
    assert (dq[:7] == 0).all() and (dq[-9:] == 0).all()
    assert (dk[:5] == 0).all() and (dv[-5:] == 0).all()
    case = C.bshd_case(51, 1, [5, 41, 0, 300, 64], 300, 8, 2, 128, torch.bfloat16,
                       offsets=offsets, device=dev)
    case.seqlens[1] = 301  # <= max_seqlen_kv but > s_kv
    case.max_kv = 400
    with rocm_attn.tuning.override(**G.STREAM_PASSES[passes]):
        _, (dq, dk, dv) = check(case, seed=51)
    assert torch.isnan(dq[1]).all() and (dk[1] == 0).all() and (dv[1] == 0).all()


@pytest.mark.parametrize("passes", list(G.STREAM_PASSES))
def test_stream_garbage_offsets_no_oob(dev, passes):
    """Garbage int64 offsets (keys past the end of k/v, a negative key count, queries before
    the start of q, more queries than max_seqlen_q) and an int32 difference that wraps into
    range: NaN dq on the bad segments' rows, zero dk / dv on their keys, no out-of-bounds
    access (run under compute-sanitizer by `tools/gpu_check.sh --memcheck`), the other
    segments exact."""
    q_lens, kv_lens = [1, 1, 2, 1, 1, 1, 1, 1, 1], [5, 17, 64, 300, 10, 1, 0, 7, 900]
    case = C.thd_case(52, q_lens, kv_lens, 8, 2, 128, torch.bfloat16, offsets=torch.int64,
                      max_q=1, max_kv=1000, pad_before=2, pad_after=2, kv_pad=3, device=dev)
    corrupt_offsets(case, q_at=4)
    with rocm_attn.tuning.override(**G.STREAM_PASSES[passes]):
        check(case, seed=52)
    case = C.thd_case(53, [1] * 5, [4, 6, 9, 2, 5], 8, 8, 64, torch.bfloat16, max_kv=16,
                      device=dev)
    case.cu_kv[2] = 2147483640
    case.cu_kv[3] = -2147483640
    with rocm_attn.tuning.override(**G.STREAM_PASSES[passes]):
        check(case, seed=53)


@pytest.mark.parametrize("b", [500, 6000])
def test_stream_deterministic_and_default(dev, b):
    """Bitwise the same gradients run to run in both item layouts (a block-wide item sums dq over
    its waves in order); the default tuning takes one of them (its bits: which one depends on
    the number of (segment, kv head) items against the device's residency), and they are not
    the matrix-unit passes' bits (those round P and dS to bf16 as product operands)."""
    gen = torch.Generator().manual_seed(54)
    case = C.thd_case(54, [1] * b, lens(gen, b, 0, 1000 if b == 500 else 40), 8, 2, 128,
                      torch.bfloat16, max_kv=1000, device=dev)
    layouts = {name: repeated_bits(case, G.STREAM_PASSES[name], 54)
               for name in G.STREAM_PASSES}
    inputs, _ = layouts["stream_wave"]
    default = op(case, *inputs)
    assert any(all(torch.equal(a.view(torch.uint8), d.view(torch.uint8))
                   for a, d in zip(grads, default)) for _, grads in layouts.values())
    with rocm_attn.tuning.override(**G.BWD_PASSES["passes"]):
        wave = op(case, *inputs)
    assert not torch.equal(default[1].view(torch.uint8), wave[1].view(torch.uint8))


# The dK / dV pass's one-row-tile instance (tiled_bwd_kernel.h): 5..16 rows (queries x GQA
# group) per (segment, kv head). (h_q, h_kv, max queries per segment).
ROW_TILE_ROWS = [pytest.param(8, 8, 16, id="g1q16"), pytest.param(8, 8, 5, id="g1q5"),
                 pytest.param(8, 1, 2, id="g8q2"), pytest.param(16, 1, 1, id="g16q1"),
                 pytest.param(6, 2, 4, id="g3q4")]


def assert_row_tile_matches_wave(case, inputs, grads):
    """The one-row-tile gradients against pass 2's general instance (its one-row-tile items,
    Delta from the Delta pass): bitwise where the instance takes the Delta pass too (histories
    past one key tile: the same item, the same Delta), within the oracle's bound where it fuses
    Delta (other fp32 sums)."""
    with rocm_attn.tuning.override(**G.BWD_PASSES["passes"]):
        wave = op(case, *inputs)
    if case.max_kv > 16:
        G.assert_same_bits(grads, wave)
    else:
        G.assert_close_grads(grads, wave)


@pytest.mark.parametrize("h_q,h_kv,max_q", ROW_TILE_ROWS)
@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("max_kv", [16, 17, 300, 4096])
def test_row_tile_rows_and_histories(dev, max_kv, d, h_q, h_kv, max_q):
    """Ragged queries (0..max_q) and histories (0..max_kv, the longest included: one key tile,
    Delta fused from its products, and several, Delta from the Delta pass) against the float64
    oracle and against pass 2's one-row-tile items."""
    dtype = torch.float16 if d == 64 else torch.bfloat16
    gen = torch.Generator().manual_seed(max_kv + d + h_q + max_q)
    b = 24 if max_kv == 4096 else 300
    kv_lens = lens(gen, b, 0, max_kv)
    kv_lens[1] = max_kv
    q_lens = lens(gen, b, 0, max_q)
    q_lens[2] = max_q
    case = C.thd_case(max_kv + d + max_q, q_lens, kv_lens, h_q, h_kv, d, dtype, max_q=max_q,
                      max_kv=max_kv, device=dev)
    with rocm_attn.tuning.override(**G.ROW_TILE_PASS):
        inputs, grads = check(case, seed=d + max_kv, dlse=max_q == 1 or d == 128)
    assert_row_tile_matches_wave(case, inputs, grads)


@pytest.mark.parametrize("offsets", [torch.int32, torch.int64], ids=["i32", "i64"])
def test_row_tile_strided_garbage_bshd(dev, offsets):
    """Strided views with padding q rows (dq 0: with Delta fused the instance writes them, no
    Delta pass runs) and unread NaN k/v rows around the segments (dk = dv = 0); garbage offsets
    (keys past the end of k/v, a negative key count, queries before the start of q): NaN dq on
    the bad segments' rows, zero dk / dv on their keys, no out-of-bounds access
    (compute-sanitizer); BSHD with a length past s_kv."""
    knobs = G.ROW_TILE_PASS
    gen = torch.Generator().manual_seed(60)
    case = C.thd_case(60, lens(gen, 200, 0, 16), lens(gen, 200, 0, 1000), 8, 8, 128,
                      torch.bfloat16, offsets=offsets, strided=True, pad_before=7, pad_after=9,
                      kv_pad=5, max_q=16, max_kv=1000, device=dev)
    with rocm_attn.tuning.override(**knobs):
        _, (dq, dk, dv) = check(case, seed=60, dlse=offsets == torch.int64)
    assert (dq[:7] == 0).all() and (dq[-9:] == 0).all()
    assert (dk[:5] == 0).all() and (dv[-5:] == 0).all()
    q_lens, kv_lens = [3, 16, 2, 9, 1, 16, 4, 5, 16], [5, 17, 64, 300, 10, 1, 0, 7, 900]
    case = C.thd_case(61, q_lens, kv_lens, 8, 8, 128, torch.bfloat16, offsets=offsets,
                      max_q=16, max_kv=1000, pad_before=2, pad_after=2, kv_pad=3, device=dev)
    corrupt_offsets(case, q_at=4, far=2**31 - 8 if offsets == torch.int32 else 2**40)
    with rocm_attn.tuning.override(**knobs):
        check(case, seed=61)
    case = C.bshd_case(62, 16, [5, 41, 0, 300, 64], 300, 8, 8, 128, torch.bfloat16,
                       offsets=offsets, device=dev)
    case.seqlens[1] = 301  # <= max_seqlen_kv but > s_kv
    case.max_kv = 400
    with rocm_attn.tuning.override(**knobs):
        _, (dq, dk, dv) = check(case, seed=62, dlse=True)
    assert torch.isnan(dq[1]).all() and (dk[1] == 0).all() and (dv[1] == 0).all()


@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("max_kv", [16, 300])
def test_row_tile_fused_delta(dev, max_kv, d):
    """Delta computed by the one-row-tile items as rowsum(P dP) - dlse (no Delta pass) where
    every history fits one key tile, else from the Delta pass, against the oracle and against
    pass 2's general instance (Delta from the Delta pass): dlse, GQA, segments without keys or
    queries, padding rows; a non-finite dO row (NaN on its own segment only, as with the Delta
    pass)."""
    q_lens = [4, 1, 0, 3, 4, 2, 4]
    kv_lens = [max_kv, 0, 3, max_kv - 1, 1, 9, max_kv]
    case = C.thd_case(80 + max_kv + d, q_lens, kv_lens, 8, 2, d, torch.bfloat16, max_q=4,
                      max_kv=max_kv, pad_before=3, pad_after=2, device=dev)
    with rocm_attn.tuning.override(**G.ROW_TILE_PASS):
        inputs, fused = check(case, seed=80 + d, dlse=True)
    assert (fused[0][:3] == 0).all() and (fused[0][-2:] == 0).all()
    with rocm_attn.tuning.override(**G.BWD_PASSES["passes"]):
        two_pass = op(case, *inputs)
    G.assert_close_grads(fused, two_pass)
    if max_kv > 16:  # the default takes the Delta pass past one key tile: the same bits
        G.assert_same_bits(fused, two_pass)
    # a NaN in one dO row of segment 3 (THD rows 3 + 4 + 1 + 0 .., after the 3 padding rows)
    dout = inputs[0].clone()
    q0 = 3 + 4 + 1 + 0
    dout[q0 + 1, 5, 7] = float("nan")
    with rocm_attn.tuning.override(**G.ROW_TILE_PASS):
        dq, dk, dv = op(case, dout, *inputs[1:])
    torch.cuda.synchronize()
    seg_q = slice(q0, q0 + 3)
    assert torch.isnan(dq[seg_q]).any()
    others = torch.ones(dq.shape[0], dtype=torch.bool, device=dq.device)
    others[seg_q] = False
    assert not torch.isnan(dq[others]).any(), "a NaN dO row leaked into another segment's dq"
    k0, kn = int(case.cu_kv[3]), int(case.cu_kv[4])
    kmask = torch.ones(dk.shape[0], dtype=torch.bool, device=dk.device)
    kmask[k0:kn] = False
    assert torch.isnan(dk[k0:kn]).any()
    assert not torch.isnan(dk[kmask]).any() and not torch.isnan(dv[kmask]).any()


def test_row_tile_default_and_deterministic(dev):
    """16 candidates without GQA: over 256 keys the default (Delta from the Delta pass) bitwise
    the same run to run and bitwise pass 2's one-row-tile items; over 16 keys the default fuses
    Delta (the fused bits, the same run to run)."""
    gen = torch.Generator().manual_seed(63)
    case = C.thd_case(63, [16] * 2000, lens(gen, 2000, 0, 256), 8, 8, 128, torch.bfloat16,
                      max_q=16, max_kv=256, device=dev)
    inputs, grads = repeated_bits(case, G.ROW_TILE_PASS, 63)
    G.assert_same_bits(grads, op(case, *inputs))
    assert_row_tile_matches_wave(case, inputs, grads)
    short = C.thd_case(64, [16] * 2000, lens(gen, 2000, 0, 16), 8, 8, 128, torch.bfloat16,
                       max_q=16, max_kv=16, device=dev)
    inputs, grads = repeated_bits(short, G.ROW_TILE_PASS, 64)
    G.assert_same_bits(grads, op(short, *inputs))
