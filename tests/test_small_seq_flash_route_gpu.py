"""GPU tests of fused_attn_small_seq's flash route (rocm_attn/small_seq_flash.py): torch's flash
varlen kernels with the contract kernels (hip_src/small_seq/flash_contract_kernel.h) around
them, called directly (``small_seq_flash_fwd`` / ``_bwd``) and through fused_attn_small_seq.

Same oracles, poisoning and bounds as the tiled kernels' GPU tests
(tests/helpers/small_seq_tiled_cases.py, small_seq_tiled_bwd_cases.py): the route keeps their
contract. Bad offsets here leave no valid segment overlapping another (the case where the
route gives NaN instead of the tiled kernels' values: tests/test_emu_small_seq_flash_contract.py).
Skipped where torch's flash kernels cannot serve (ROCm builds, no flash).
"""

from __future__ import annotations

import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import rocm_attn  # noqa: E402
from rocm_attn import fused_attn_small_seq, small_seq_flash, small_seq_plan  # noqa: E402
from rocm_attn import small_seq as small_seq_mod  # noqa: E402
from rocm_attn.errors import read_errors  # noqa: E402
from helpers.gpu import gpu_marks, poison_allocator  # noqa: E402
from helpers.small_seq_tiled_gpu import DTYPES, GROUPS, lens, tiled_device  # noqa: E402
from helpers import small_seq_tiled_bwd_cases as G  # noqa: E402
from helpers import small_seq_tiled_cases as C  # noqa: E402

pytestmark = [*gpu_marks(thd_ops=False), pytest.mark.usefixtures("clean_error_counter")]


@pytest.fixture(scope="module")
def dev():
    device = tiled_device("small_seq_tiled_fwd")
    why = small_seq_flash.route_problem(ignore_tuning=True)
    if why is None:
        from rocm_attn.varlen import backends

        why = backends.flash_problem(torch.empty(1, 1, 64, device=device,
                                                  dtype=torch.bfloat16))
    if why:
        pytest.skip(f"no flash route here: {why}")
    return device


def fwd(case, lse_grad=False):
    poison_allocator(case.q.device)
    return small_seq_flash.small_seq_flash_fwd(case.q, case.k, case.v, case.cu_q, case.cu_kv,
                                               case.max_q, case.max_kv, case.scale, lse_grad)


def bwd(case, dout, out, lse):
    poison_allocator(case.q.device)
    return small_seq_flash.small_seq_flash_bwd(dout, case.q, case.k, case.v, out, lse,
                                               case.cu_q, case.cu_kv, case.max_q, case.max_kv,
                                               case.scale)


def check(case, expect_bad=(), seed=0):
    """Forward against the oracle, then the backward on the oracle's out / LSE."""
    out, lse = fwd(case)
    C.check(case, out, lse, None, expect_bad=list(expect_bad))
    torch.cuda.synchronize()
    want = (len(expect_bad), expect_bad[0]) if expect_bad else (0, -1)
    assert read_errors(reset=True) == want
    dout, r_out, r_lse, _ = G.inputs(case, seed, False)
    grads = bwd(case, dout, r_out, r_lse)
    torch.cuda.synchronize()
    G.check_grads(case, dout, None, *grads)
    assert read_errors(reset=True) == (0, -1), "the backward counts nothing"


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("h_q,h_kv", GROUPS)
@pytest.mark.parametrize("d", [64, 128, 256])
def test_many_queries_per_segment(dev, d, h_q, h_kv, dtype):
    """Queries per segment 1, 2, 17 and 512 (and 0) against keys 17, 64, 256, 1000 (and 0),
    padding rows around the segments, int64 offsets."""
    q_lens = [1, 2, 17, 512, 0, 1, 17, 2, 512, 3]
    kv_lens = [17, 64, 256, 1000, 5, 0, 1000, 17, 64, 256]
    case = C.thd_case(d + h_q + h_kv, q_lens, kv_lens, h_q, h_kv, d, dtype, pad_before=3,
                      pad_after=2, kv_pad=2, offsets=torch.int64, device=dev)
    check(case)


def test_ragged_many_candidates_strided(dev):
    """200 users x up to 300 candidates over up to 300 keys, q a head slice and k / v halves
    of one fused tensor (flash reads the strides as given), int32 offsets."""
    gen = torch.Generator().manual_seed(5)
    case = C.thd_case(5, lens(gen, 200, 0, 300), lens(gen, 200, 0, 300), 8, 2, 128,
                      torch.bfloat16, strided=True, max_q=300, max_kv=300, device=dev)
    check(case, seed=5)


@pytest.mark.parametrize("garbage", [False, True], ids=["valid", "garbage"])
def test_one_query_per_segment_gqa(dev, garbage):
    """One query per segment, no padding rows, GQA: flash's one-query path (q row i read as
    segment i's query), forward and backward. Valid offsets against the oracle; a garbage q
    offset flags its segment."""
    gen = torch.Generator().manual_seed(12)
    b = 300
    case = C.thd_case(12, [1] * b, lens(gen, b, 0, 1000), 8, 2, 128, torch.bfloat16,
                      offsets=torch.int64, max_q=1, max_kv=1000, device=dev)
    assert small_seq_flash.route_offsets(case.q, case.k, case.cu_q, case.cu_kv, 1)[2]
    if garbage:
        case.cu_q[b] = 2**40  # the last segment: queries past the end of q
    check(case, expect_bad=(b - 1,) if garbage else (), seed=12)


def test_garbage_offsets_no_oob(dev):
    """Garbage int64 offsets (2^40, negative, more queries than max_seqlen_q, fewer than zero
    keys, keys past the end): NaN rows and dq on the bad segments, zero dk / dv on their ordered
    keys, counted once, no out-of-bounds access (run under compute-sanitizer), every other
    segment exact."""
    q_lens, kv_lens = [3, 1, 17, 2, 40, 5, 1, 2, 4], [5, 17, 64, 3, 10, 1, 0, 7, 9]
    case = C.thd_case(10, q_lens, kv_lens, 8, 2, 128, torch.bfloat16, offsets=torch.int64,
                      max_q=17, max_kv=64, pad_before=2, pad_after=2, kv_pad=3, device=dev)
    case.cu_q[2] = -(2**40)  # segments 1 and 2: queries before the start of q
    case.cu_kv[8] = case.cu_kv[7] - 1  # segment 7: -1 keys
    case.cu_kv[9] = 2**40  # segment 8: keys past the end of k / v
    check(case, expect_bad=(1, 2, 4, 7, 8), seed=10)


@pytest.mark.parametrize("entries", [1, 2, 300, 5000])
def test_route_offsets_kernel(dev, entries):
    """The one-launch offsets kernel equals flash_offsets (clamp, running maximum) on both sides
    for garbage int64 / int32 offsets (negative, past the end, decreasing, past int32), and
    returns valid offsets unchanged; no out-of-bounds access (run under compute-sanitizer)."""
    gen = torch.Generator().manual_seed(entries)
    total_q, total_kv = 2 * entries + 3, 7 * entries + 1
    q = torch.zeros(total_q, 2, 64, device=dev, dtype=torch.bfloat16)
    k = torch.zeros(total_kv, 1, 64, device=dev, dtype=torch.bfloat16)
    valid_q = torch.sort(torch.randint(0, total_q + 1, (entries,), generator=gen)).values
    valid_kv = torch.sort(torch.randint(0, total_kv + 1, (entries,), generator=gen)).values
    noise = torch.randint(-2**40, 2**40, (entries,), generator=gen)
    wild = torch.rand(entries, generator=gen) < 0.3
    for cu_q, cu_kv in ((valid_q.int(), valid_kv.int()),
                        (torch.where(wild, noise, valid_q), valid_kv.int()),
                        (valid_q.int(), torch.where(wild, -valid_kv, valid_kv))):
        got = torch.ops.rocm_attn.small_seq_flash_offsets(q, k, cu_q.to(dev), cu_kv.to(dev)).cpu()
        assert torch.equal(got[0], small_seq_flash.flash_offsets(cu_q, total_q))
        assert torch.equal(got[1], small_seq_flash.flash_offsets(cu_kv, total_kv))
    got = torch.ops.rocm_attn.small_seq_flash_offsets(q, k, valid_q.to(dev), valid_kv.to(dev))
    assert torch.equal(got.cpu().long(), torch.stack([valid_q, valid_kv]))


def long_history_case(seed, dev, bad=False):
    """Histories past the tiled kernels' KERNEL_MAX_SEQLEN_KV keys (and short ones, empty
    segments) with int64 offsets; with ``bad``, the last segment's keys run past the end of
    k / v."""
    limit = small_seq_mod.KERNEL_MAX_SEQLEN_KV
    q_lens, kv_lens = [1, 100, 3, 0, 64, 2], [limit + 904, limit + 1, 17, 10, 0, limit + 1904]
    case = C.thd_case(seed, q_lens, kv_lens, 8, 2, 128, torch.bfloat16, offsets=torch.int64,
                      max_q=100, max_kv=limit + 1904, pad_before=1, kv_pad=2, device=dev)
    if bad:
        case.cu_kv[-1] = 2**40
    return case


@pytest.mark.parametrize("bad", [False, True], ids=["valid", "garbage"])
def test_long_histories_through_fused_attn_small_seq(dev, bad):
    """Histories beyond the tiled kernels take the route (rocm_attn.attention when the LSE is
    returned): forward and gradients against the oracle, a bad segment NaN and counted, no
    out-of-bounds access (run under compute-sanitizer)."""
    case = long_history_case(11, dev, bad)
    leaves = [t.detach().clone().requires_grad_() for t in (case.q, case.k, case.v)]
    args = (case.cu_q, case.cu_kv, case.max_q, case.max_kv)
    assert small_seq_mod._pick_path(*leaves, False, case.max_q, case.max_kv, True, False,
                                    False, "auto") == "flash"
    assert small_seq_mod._pick_path(*leaves, False, case.max_q, case.max_kv, True, False,
                                    True, "auto") == "varlen"
    poison_allocator(dev)
    out = fused_attn_small_seq(*leaves, *args)
    torch.cuda.synchronize()
    expect_bad = [5] if bad else []
    C.check(case, out, fwd(case)[1], None, expect_bad=expect_bad)
    want = (2, 5) if bad else (0, -1)  # counted by the call and by the direct op
    assert read_errors(reset=True) == want
    dout = torch.randn_like(case.q)
    grads = torch.autograd.grad(out, leaves, dout)
    torch.cuda.synchronize()
    G.check_grads(case, dout, None, *grads)


@pytest.fixture
def route_rule():
    """Tuning small_seq_flash_route = 1 (the rule) for one test."""
    with rocm_attn.tuning.override(small_seq_flash_route=1):
        yield


def test_through_fused_attn_small_seq_compile_and_graph(dev, route_rule):
    """The rule sends many candidates over more keys than the warpgroup backward takes to the
    route (flash's forward and backward run); eager, torch.compile and a captured CUDA graph
    give the same results."""
    gen = torch.Generator().manual_seed(7)
    b, max_q, max_kv = 32, 160, small_seq_plan.BWD_WARPGROUP_MAX_KEYS + 44
    case = C.thd_case(7, lens(gen, b, 100, max_q), lens(gen, b, 1, max_kv), 8, 8, 128,
                      torch.bfloat16, max_q=max_q, max_kv=max_kv, device=dev)
    leaves = [t.detach().clone().requires_grad_() for t in (case.q, case.k, case.v)]
    assert small_seq_flash.takes_route(*leaves, True, max_q, max_kv, False)
    dout = torch.randn_like(case.q)

    def step(q, k, v):
        out = fused_attn_small_seq(q, k, v, case.cu_q, case.cu_kv, max_q, max_kv)
        return (out,) + torch.autograd.grad(out, (q, k, v), dout)

    # NOTE: results detached, so that no graph of an eager call outlives it: a kept graph
    # holds the leaves' grad accumulators, recorded on the default stream, and the captured
    # backward would then wait on the legacy stream (a capture error; torch's rule, not the op's)
    eager = [t.detach() for t in step(*leaves)]
    C.check(case, eager[0], fwd(case)[1], None, expect_bad=[])
    G.check_grads(case, dout, None, *eager[1:])
    compiled = [t.detach() for t in torch.compile(step)(*leaves)]
    for name, a, b in zip(("out", "dq", "dk", "dv"), eager, compiled):
        assert torch.allclose(a.float(), b.float(), atol=2e-2, rtol=2e-2), name
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            step(*leaves)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = step(*leaves)
    graph.replay()
    torch.cuda.synchronize()
    for name, a, b in zip(("out", "dq", "dk", "dv"), eager, captured):
        assert torch.allclose(a.float(), b.float(), atol=2e-2, rtol=2e-2), name
    assert read_errors(reset=True) == (0, -1)


def test_lse_cotangent_takes_the_tiled_backward(dev):
    """return_lse with a loss on the LSE: gradients of out and LSE (the tiled backward serves
    them; flash's backward has no LSE cotangent)."""
    gen = torch.Generator().manual_seed(8)
    case = C.thd_case(8, lens(gen, 16, 1, 200), lens(gen, 16, 0, 64), 8, 2, 128,
                      torch.bfloat16, max_q=200, max_kv=64, device=dev)
    leaves = [t.detach().clone().requires_grad_() for t in (case.q, case.k, case.v)]
    with rocm_attn.tuning.override(small_seq_flash_route=2):
        out, lse = fused_attn_small_seq(*leaves, case.cu_q, case.cu_kv, case.max_q, case.max_kv,
                                        return_lse=True)
    dout, _, _, dlse = G.inputs(case, 8, True)
    grads = torch.autograd.grad((out, lse), leaves, (dout, dlse))
    G.check_grads(case, dout, dlse, *grads)
