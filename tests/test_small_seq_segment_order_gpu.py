"""The tiled forward's segment order (hip_src/small_seq/tiled_order_kernel.h: the segments longest
history first) on a GPU, ahead of every tiled forward kernel the tuning can force (wave, block,
resident, and on sm_90a builds the warpgroup kernels: tile copies, streaming, warp-specialized,
which the CPU emulation cannot run).

Ordered (tuning small_seq_tiled_segment_order 2) and in segment order (0), each kernel writes
bitwise the same out, lse and row maxima on ragged batches of 0..1000-key histories (padding
rows, empty segments, a bad segment among them), and the error counter reports the same; the
ordered result matches the float64 oracle. Garbage offsets (for compute-sanitizer's memcheck:
the order's reads of them stay inside the offset arrays, its writes inside its buffer). Outputs
come from a NaN-poisoned allocator, so an unwritten row fails. The backward's block passes (dK / dV
ordered by rows, dQ by keys) write bitwise the gradients of segment order, on valid and garbage
offsets. The emulated twin: tests/test_emu_small_seq_segment_order.py."""

from __future__ import annotations

import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))

from helpers import small_seq_tiled_bwd_cases as G
from helpers import small_seq_tiled_cases as C
from helpers.gpu import gpu_marks, poison_allocator
from helpers.small_seq_tiled_gpu import lens, tiled_device
from test_small_seq_row_max_gpu import KERNELS

import rocm_attn
from rocm_attn import small_seq_plan
from rocm_attn.errors import read_errors

pytestmark = [*gpu_marks(thd_ops=False), pytest.mark.usefixtures("clean_error_counter")]


@pytest.fixture(scope="module")
def dev():
    return tiled_device("small_seq_tiled_fwd_row_max")


def _run(case, order_mode):
    """(out, lse, row_max), the error counter, and the plan's kernels, under the order mode."""
    with rocm_attn.tuning.override(small_seq_tiled_segment_order=order_mode):
        poison_allocator(case.q.device)
        plan = small_seq_plan.tiled_fwd_plan(case.q, case.k, case.max_q, case.max_kv, False,
                                             max_logit=True)
        read_errors(reset=True)
        out, lse, _, rmax = torch.ops.rocm_attn.small_seq_tiled_fwd_row_max(
            case.q, case.k, case.v, case.cu_q, case.cu_kv, case.seqlens, case.max_q,
            case.max_kv, case.scale, False, plan)
        return (out, lse, rmax), read_errors(reset=True), plan


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int16 if t.element_size() == 2 else torch.int32)


def _same(case, expect_bad=()):
    ordered, errs_ordered, plan = _run(case, 2)
    plain, errs_plain, plain_plan = _run(case, 0)
    assert plan[0] == plain_plan[0] + 1, "the forced order added no launch"
    for got, want, name in zip(ordered, plain, ("out", "lse", "row_max")):
        assert torch.equal(_bits(got), _bits(want)), f"{name}: ordered and plain differ"
    assert errs_ordered == errs_plain and errs_plain[0] == len(expect_bad)
    return ordered


@pytest.mark.parametrize("kernel", list(KERNELS))
@pytest.mark.parametrize("h_q,h_kv,d", [(8, 8, 128), (8, 2, 128), (8, 1, 64)],
                         ids=["mha", "gqa", "mqa_d64"])
def test_order_changes_nothing_an_item_writes(dev, kernel, h_q, h_kv, d):
    gen = torch.Generator().manual_seed(d + h_kv)
    q_lens = lens(gen, 24, 0, 300) + [0, 130, 1]
    kv_lens = lens(gen, 24, 0, 400) + [1000, 0, 999]
    with rocm_attn.tuning.override(**KERNELS[kernel]):
        case = C.thd_case(d + h_q, q_lens, kv_lens, h_q, h_kv, d, torch.bfloat16, pad_before=2,
                          pad_after=3, device=dev)
        out, lse, _ = _same(case)
        cpu = C.TiledCase(*(t.cpu() if isinstance(t, torch.Tensor) else t
                            for t in (case.q, case.k, case.v, case.cu_q, case.cu_kv,
                                      case.seqlens)), case.max_q, case.max_kv, case.scale)
        C.check(cpu, out.cpu(), lse.cpu(), None, f"{kernel} ordered", expect_bad=[])
        case = C.bshd_case(d + 1, 70, lens(gen, 12, 0, 1000) + [0, 1000], 1000, h_q, h_kv, d,
                           torch.float16, device=dev)
        _same(case)


@pytest.mark.parametrize("kernel", ["auto", "wave", "warpgroup_ws"])
def test_order_with_a_bad_segment(dev, kernel):
    with rocm_attn.tuning.override(**KERNELS[kernel]):
        case = C.thd_case(5, [70, 90, 4, 200], [30, 600, 6, 1000], 8, 2, 128, torch.bfloat16,
                          max_kv=500, device=dev)
        _same(case, expect_bad=[1, 3])


@pytest.mark.parametrize("kernel", ["auto", "wave", "block", "warpgroup_stream",
                                    "warpgroup_ws"])
def test_order_of_garbage_offsets(dev, kernel):
    """Offsets that hold anything: nothing is read or written out of bounds (memcheck), every
    bad segment is counted as in segment order."""
    gen = torch.Generator().manual_seed(17)
    with rocm_attn.tuning.override(**KERNELS[kernel]):
        case = C.thd_case(17, lens(gen, 40, 0, 100), lens(gen, 40, 0, 800), 8, 2, 128,
                          torch.bfloat16, max_kv=800, device=dev)
        b = case.cu_q.numel() - 1
        case.cu_q.copy_(torch.randint(-50, 3000, (b + 1,), generator=gen, dtype=torch.int32))
        case.cu_kv.copy_(torch.randint(-3000, 30000, (b + 1,), generator=gen,
                                       dtype=torch.int32))
        _, errs_ordered, _ = _run(case, 2)
        _, errs_plain, _ = _run(case, 0)
        torch.cuda.synchronize()
        assert errs_ordered == errs_plain and errs_plain[0] > 0


# the backward's block passes (the warpgroup kernels and the flash route off)
BWD_BLOCK = {**G.BWD_PASSES["passes"], "small_seq_flash_route": 0}


def _bwd(case, order_mode):
    dout, out, lse, dlse = G.inputs(case, 3, True)
    with rocm_attn.tuning.override(small_seq_tiled_segment_order=order_mode, **BWD_BLOCK):
        plan = small_seq_plan.tiled_bwd_plan(case.q, case.k, case.max_q, case.max_kv)
        poison_allocator(case.q.device)
        grads = torch.ops.rocm_attn.small_seq_tiled_bwd(
            dout, case.q, case.k, case.v, out, lse, dlse, case.cu_q, case.cu_kv, case.seqlens,
            case.max_q, case.max_kv, case.scale, plan)
        return grads, plan, (dout, dlse)


@pytest.mark.parametrize("h_q,h_kv,d", [(8, 8, 128), (8, 2, 64), (8, 1, 256)],
                         ids=["mha", "gqa_d64", "mqa_d256"])
def test_backward_order_changes_no_gradient(dev, h_q, h_kv, d):
    gen = torch.Generator().manual_seed(d + h_kv + 1)
    case = C.thd_case(d + 3, lens(gen, 24, 0, 90) + [0, 70, 1],
                      lens(gen, 24, 0, 400) + [1000, 0, 999], h_q, h_kv, d, torch.bfloat16,
                      pad_before=2, pad_after=3, device=dev)
    ordered, plan, (dout, dlse) = _bwd(case, 2)
    plain, plain_plan, _ = _bwd(case, 0)
    assert plan[0] == plain_plan[0] + 2, "the forced orders added no launches"
    G.assert_same_bits(ordered, plain, case)
    G.check_grads(case, dout, dlse, *ordered, "ordered block passes")


def test_backward_order_of_garbage_offsets(dev):
    """Garbage offsets through the ordered block passes (for memcheck): the gradients on the rows
    the contract fixes are those of segment order."""
    gen = torch.Generator().manual_seed(29)
    case = C.thd_case(29, lens(gen, 40, 0, 60), lens(gen, 40, 0, 800), 8, 2, 128,
                      torch.bfloat16, max_kv=800, device=dev)
    b = case.cu_q.numel() - 1
    case.cu_q.copy_(torch.randint(-50, 2000, (b + 1,), generator=gen, dtype=torch.int32))
    case.cu_kv.copy_(torch.randint(-3000, 30000, (b + 1,), generator=gen, dtype=torch.int32))
    ordered, _, _ = _bwd(case, 2)
    plain, _, _ = _bwd(case, 0)
    torch.cuda.synchronize()
    G.assert_same_bits(ordered, plain, case)
