"""Each row's maximum scaled logit from the small-seq forward kernels on a GPU (the ops
``small_seq_fwd_row_max`` / ``small_seq_tiled_fwd_row_max``), and
``fused_attn_small_seq(return_max_logit=True)`` reducing them per head with no second pass.

Every tiled kernel family the tuning can force (wave, block, resident, and on sm_90a builds the
warpgroup kernels: cp.async, tensor-tile copies, streaming, warp-specialized, which the CPU
emulation cannot run) and the one-query kernels, against a float64 max over each row's scores:
rows within float32 rounding, -inf without keys and on padding rows, NaN on a bad segment's rows;
out and LSE bit for bit those of the plain op (the tiled kernels' ROW_MAX instances keep the
lazy reference maximum and carry each row's exact maximum apart, so they rescale exactly as the
plain instances). Outputs come from a NaN-poisoned allocator, so an unwritten row fails."""

from __future__ import annotations

import math
import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))

from helpers import small_seq_tiled_cases as C
from helpers.gpu import gpu_marks, poison_allocator
from helpers.small_seq_tiled_gpu import lens, tiled_device
from test_emu_small_seq_row_max import _check_heads, _check_rows, _oracle_rows, _rising_case

import rocm_attn
from rocm_attn import small_seq as small_seq_mod
from rocm_attn import small_seq_plan
from rocm_attn.errors import read_errors
from rocm_attn.reference import reference_max_logit

pytestmark = [*gpu_marks(thd_ops=False), pytest.mark.usefixtures("clean_error_counter")]

_NO_WG = {"small_seq_tiled_warpgroup": 0}
KERNELS = {
    "auto": {},
    "wave": {**_NO_WG, "small_seq_tiled_block": 0, "small_seq_tiled_resident": 0},
    "block": {**_NO_WG, "small_seq_tiled_block": 2, "small_seq_tiled_resident": 0},
    "resident": {**_NO_WG, "small_seq_tiled_resident": 2},
    "warpgroup": {"small_seq_tiled_warpgroup": 2},
    "warpgroup_cp_async": {"small_seq_tiled_warpgroup": 2, "small_seq_tiled_warpgroup_tma": 0},
    "warpgroup_stream": {"small_seq_tiled_warpgroup": 2, "small_seq_tiled_warpgroup_stream": 2},
    "warpgroup_ws": {"small_seq_tiled_warpgroup": 2, "small_seq_tiled_warpgroup_ws": 2},
}


@pytest.fixture(scope="module")
def dev():
    return tiled_device("small_seq_tiled_fwd_row_max")


def _tiled(case, row_max):
    poison_allocator(case.q.device)
    plan = small_seq_plan.tiled_fwd_plan(case.q, case.k, case.max_q, case.max_kv, False,
                                         max_logit=row_max)
    if row_max:
        return torch.ops.rocm_attn.small_seq_tiled_fwd_row_max(
            case.q, case.k, case.v, case.cu_q, case.cu_kv, case.seqlens, case.max_q,
            case.max_kv, case.scale, False, plan)
    return torch.ops.rocm_attn.small_seq_tiled_fwd(
        case.q, case.k, case.v, case.cu_q, case.cu_kv, case.seqlens, case.max_q, case.max_kv,
        case.scale, False, plan)


def _check_case(case, expect_bad=()):
    out0, lse0, _ = _tiled(case, False)
    read_errors(reset=True)  # each call counts a bad segment: read the row_max call's alone
    out, lse, _, rmax = _tiled(case, True)
    # the ROW_MAX instances rescale as the plain ones: out and LSE bit for bit (NaN included)
    assert torch.equal(out.view(torch.int16), out0.view(torch.int16))
    assert torch.equal(lse.view(torch.int32), lse0.view(torch.int32))
    cpu = C.TiledCase(*(t.cpu() if isinstance(t, torch.Tensor) else t
                        for t in (case.q, case.k, case.v, case.cu_q, case.cu_kv, case.seqlens)),
                      case.max_q, case.max_kv, case.scale)
    segs = C.contract_segments(cpu)
    assert segs.bad == list(expect_bad)
    q, k, _ = C.flat_heads(cpu)
    rows_of = [(list(range(s.q0, s.q0 + s.nq)), list(range(s.k0, s.k0 + s.nk)))
               for s in segs.valid]
    ref = _oracle_rows(q, k, rows_of, case.scale)
    n_keys = torch.zeros(cpu.total_q, dtype=torch.int64)
    for s in segs.valid:
        n_keys[s.q0:s.q0 + s.nq] = s.nk
    rmax, lse = rmax.cpu(), lse.cpu()
    _check_rows(rmax, ref, lse, nan_rows=segs.nan_rows, skip_rows=segs.unspecified,
                n_keys=None if expect_bad else n_keys)
    _check_heads(rmax, ref, nan_rows=segs.nan_rows, skip_rows=segs.unspecified)
    errs = read_errors(reset=True)
    assert errs[0] == len(expect_bad)


@pytest.mark.parametrize("kernel", list(KERNELS))
@pytest.mark.parametrize("h_q,h_kv", [(8, 8), (8, 2), (4, 1)], ids=["g1", "g4", "g4mqa"])
@pytest.mark.parametrize("d", [64, 128])
def test_tiled_row_max_every_kernel(dev, d, h_q, h_kv, kernel):
    """Ragged segments of 0..512 queries over 0..300 keys (whole and partial row tiles and key
    steps), padding rows, GQA; BSHD; histories of at most 16 keys."""
    with rocm_attn.tuning.override(**KERNELS[kernel]):
        case = C.thd_case(d + h_q, [1, 2, 17, 512, 0, 64, 65, 130, 3],
                          [17, 64, 256, 300, 5, 0, 1, 63, 129], h_q, h_kv, d, torch.bfloat16,
                          pad_before=2, pad_after=3, device=dev)
        # rising maxima along each history: the lazy reference max lags the written one
        case.k[-20:] = (case.k[-20:].float() * 5).to(case.k.dtype)
        _check_case(case)
        gen = torch.Generator().manual_seed(d + h_kv)
        case = C.bshd_case(d + 2, 70, lens(gen, 12, 0, 100) + [0, 100], 100, h_q, h_kv, d,
                           torch.float16, device=dev)
        _check_case(case)
        case = C.thd_case(d + 3, [64, 1, 130, 0, 512, 65], [16, 3, 0, 9, 16, 1], h_q, h_kv, d,
                          torch.bfloat16, offsets=torch.int64, device=dev)
        _check_case(case)


@pytest.mark.parametrize("kernel", ["auto", "wave", "warpgroup", "warpgroup_ws"])
def test_tiled_row_max_bad_segment(dev, kernel):
    """A segment past max_seqlen_kv: its rows NaN (as its LSE), the others exact."""
    with rocm_attn.tuning.override(**KERNELS[kernel]):
        case = C.thd_case(5, [70, 90, 4], [30, 200, 6], 8, 2, 128, torch.bfloat16, max_kv=64,
                          device=dev)
        _check_case(case, expect_bad=[1])


@pytest.mark.parametrize("kernel", list(KERNELS))
@pytest.mark.parametrize("rise", [4.0, 60.0], ids=["no_rescale", "rescales"])
@pytest.mark.parametrize("d", [64, 128])
def test_tiled_row_max_rising_scores(dev, d, rise, kernel):
    """Scores that climb along long ragged histories (test_emu_small_seq_row_max._rising_case):
    by less than the lazy threshold, so that the softmax's reference maximum stays at the first
    key step's (a row maximum read from it would be ~4 low), and by 60, so that it moves every
    few steps. Many candidates per segment (several 64-row tiles: the warpgroup kernels' items
    of more than one tile). Rows exact, out and LSE those of the plain op bit for bit."""
    with rocm_attn.tuning.override(**KERNELS[kernel]):
        cpu = _rising_case(d + int(rise), [3, 130, 2, 70], [300, 129, 40, 256], 8, 2, d, rise)
        case = C.TiledCase(*(t.to(dev) if isinstance(t, torch.Tensor) else t
                             for t in (cpu.q, cpu.k, cpu.v, cpu.cu_q, cpu.cu_kv, cpu.seqlens)),
                           cpu.max_q, cpu.max_kv, cpu.scale)
        plan = small_seq_plan.plan_tiled_forward(
            small_seq_plan.Call(d, 8, 2, case.max_q, case.max_kv, max_logit=True),
            small_seq_plan.device_of(case.q.device.index),
            {**small_seq_plan.DEFAULT_TUNING, **small_seq_plan.current_tuning()})
        (launch,) = plan.launches
        assert launch.param("ROW_MAX") is True, str(plan)  # histories of several key steps
        _check_case(case)


def test_tiled_row_max_d256(dev):
    case = C.thd_case(9, [1, 40, 0, 7], [300, 17, 4, 0], 4, 2, 256, torch.bfloat16,
                      pad_after=2, device=dev)
    _check_case(case)


@pytest.mark.parametrize("h_q,h_kv", [(2, 2), (16, 2)], ids=["g1", "g8"])
@pytest.mark.parametrize("d", [64, 128, 256, 512])
def test_one_query_row_max(dev, d, h_q, h_kv):
    """small_seq_fwd_row_max: segments of 0..16 keys; out and LSE those of small_seq_fwd."""
    lens_kv = [0, 1, 16, 15, 2, 7, 16, 3]
    g = torch.Generator().manual_seed(d + h_q)
    b = len(lens_kv)
    q = torch.randn(b, h_q, d, generator=g).to(torch.bfloat16)
    k = torch.randn(sum(lens_kv), h_kv, d, generator=g).to(torch.bfloat16)
    v = torch.randn(sum(lens_kv), h_kv, d, generator=g).to(torch.bfloat16)
    cu_q = torch.arange(b + 1, dtype=torch.int32)
    cu_kv = torch.tensor([0] + torch.tensor(lens_kv).cumsum(0).tolist(), dtype=torch.int32)
    args = [t.to(dev) for t in (q, k, v, cu_q, cu_kv)] + [None, 16, 0.3, False]
    args += small_seq_plan.one_query_plans(args[0], args[1], 16)
    poison_allocator(dev)
    out0, lse0, _ = torch.ops.rocm_attn.small_seq_fwd(*args)
    poison_allocator(dev)
    out, lse, _, rmax = torch.ops.rocm_attn.small_seq_fwd_row_max(*args)
    assert torch.equal(out.view(torch.int16), out0.view(torch.int16))
    assert torch.equal(lse, lse0)
    rows_of = [([i], list(range(int(cu_kv[i]), int(cu_kv[i + 1])))) for i in range(b)]
    ref = _oracle_rows(q, k, rows_of, 0.3)
    _check_rows(rmax.cpu(), ref, lse.cpu(), n_keys=torch.tensor(lens_kv))
    _check_heads(rmax.cpu(), ref)


@pytest.mark.parametrize("route", [0, 2], ids=["no_flash_route", "flash_route_everywhere"])
@pytest.mark.parametrize("lens_q,lens_kv,max_kv,d", [
    ([1, 1, 1, 1], [16, 3, 0, 9], 16, 128),  # one-query kernels
    ([3, 0, 5, 2], [40, 7, 200, 0], 200, 64),  # tiled kernels
])
def test_fused_call_reads_the_kernels_rows(dev, monkeypatch, lens_q, lens_kv, max_kv, d, route):
    """fused_attn_small_seq(return_max_logit=True) where the kernels serve the call: exact (no
    sharpening bound), no second pass, and out / LSE those of the plain call up to rounding;
    also under torch.compile(fullgraph=True) and with gradients. A call asking for max_logit
    stays on the tiled kernels even where the flash route would take the plain call
    (``route`` 2: every call it can serve)."""
    def forbidden(*_args, **_kw):
        raise AssertionError("the sharpened second pass ran")

    monkeypatch.setattr(small_seq_mod, "_sharpened_max_logit", forbidden)
    g = torch.Generator().manual_seed(3)
    h_q, h_kv = 8, 2
    q = torch.randn(sum(lens_q), h_q, d, generator=g).to(torch.bfloat16) * 2
    k = torch.randn(sum(lens_kv), h_kv, d, generator=g).to(torch.bfloat16)
    v = torch.randn(sum(lens_kv), h_kv, d, generator=g).to(torch.bfloat16)
    cu_q = torch.tensor([0] + torch.tensor(lens_q).cumsum(0).tolist(), dtype=torch.int32)
    cu_kv = torch.tensor([0] + torch.tensor(lens_kv).cumsum(0).tolist(), dtype=torch.int32)
    ref = reference_max_logit(q.double(), k.double(), cu_q, cu_kv, "no_mask")
    qd, kd, vd = (t.to(dev).requires_grad_() for t in (q, k, v))
    cq, ck = cu_q.to(dev), cu_kv.to(dev)

    def fn(q_, k_, v_):
        return rocm_attn.fused_attn_small_seq(q_, k_, v_, cq, ck, max(lens_q), max_kv,
                                              return_lse=True, return_max_logit=True)

    with rocm_attn.tuning.override(small_seq_flash_route=route):
        out0, lse0 = rocm_attn.fused_attn_small_seq(qd, kd, vd, cq, ck, max(lens_q), max_kv,
                                                    return_lse=True)
        # dynamic=False: the plan's head dims are constants of the trace, and this test's
        # parametrizations share fn's code object (automatic dynamic shapes would mark them)
        for runner in (fn, torch.compile(fn, fullgraph=True, dynamic=False)):
            out, lse, ml = runner(qd, kd, vd)
            assert C.rel_err(out, out0) < 1e-2
            assert torch.equal(torch.isfinite(lse), torch.isfinite(lse0))
            assert ml.dtype == torch.float32 and ml.shape == (h_q,) and not ml.requires_grad
            err = (ml.cpu().double() - ref).abs()
            assert (err <= 2e-5 * (1 + ref.abs())).all(), (ml, ref)
            out.float().sum().backward()
            assert qd.grad is not None and torch.isfinite(qd.grad).all()
            qd.grad = kd.grad = vd.grad = None
    assert not math.isnan(float(ml.max()))
