"""The flash route of fused_attn_small_seq (rocm_attn/small_seq_flash.py) on the CPU: the route's
own code (flash offsets, the custom op, its fake, its autograd, the LSE-cotangent fallback,
the contract kernels) with torch's flash varlen kernels stood in for by
tests/helpers/flash_emulator.py and the contract kernels run on the CPU emulation of
hip_src/ (tests/helpers/emu.py), against the float64 oracle of test_small_seq_segments. The
GPU tests (tests/test_small_seq_tiled_gpu.py) run the real kernels.
"""

from __future__ import annotations

import math
import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from helpers import emu, flash_emulator  # noqa: E402
from rocm_attn import fused_attn_small_seq, small_seq_flash, small_seq_plan  # noqa: E402
from rocm_attn.varlen import backends  # noqa: E402
import test_small_seq_segments as seg_tests  # noqa: E402
from test_small_seq_segments import Call, Rng, assert_rel  # noqa: E402

emulated_tiled_ops = seg_tests.emulated_tiled_ops
TOL_BF16 = 3e-2
_CONTRACT_LIB = []


def _define_contract_ops(lib_emu):
    """rocm_attn::small_seq_flash_contract_fwd/bwd (the C++ schemas) on the CPU, run by the
    emulated contract kernels."""
    lib = torch.library.Library("rocm_attn", "FRAGMENT")
    lib.define("small_seq_flash_contract_fwd(Tensor(a!) out, Tensor(b!) lse, Tensor k, "
               "Tensor cu_seqlens_q, Tensor cu_seqlens_kv, Tensor flash_cu_seqlens_q, "
               "Tensor flash_cu_seqlens_kv, int max_seqlen_q, int max_seqlen_kv) -> ()")
    lib.define("small_seq_flash_contract_bwd(Tensor(a!) dq, Tensor(b!) dk, Tensor(c!) dv, "
               "Tensor cu_seqlens_q, Tensor cu_seqlens_kv, Tensor flash_cu_seqlens_q, "
               "Tensor flash_cu_seqlens_kv, int max_seqlen_q, int max_seqlen_kv) -> ()")

    def fwd(out, lse, k, cu_q, cu_kv, fq, fk, max_q, max_kv):
        emu.small_seq_flash_contract_fwd(lib_emu, out, lse, k, cu_q, cu_kv, fq, fk, max_q, max_kv)

    def bwd(dq, dk, dv, cu_q, cu_kv, fq, fk, max_q, max_kv):
        emu.small_seq_flash_contract_bwd(lib_emu, dq, dk, dv, cu_q, cu_kv, fq, fk, max_q, max_kv)

    lib.define("small_seq_flash_offsets(Tensor q, Tensor k, Tensor cu_seqlens_q, "
               "Tensor cu_seqlens_kv) -> Tensor")

    def offsets(q, k, cu_q, cu_kv):
        return emu.small_seq_flash_offsets(lib_emu, q.shape[0], k.shape[0], cu_q, cu_kv)

    lib.impl("small_seq_flash_offsets", offsets, "CPU")
    lib.impl("small_seq_flash_contract_fwd", fwd, "CPU")
    lib.impl("small_seq_flash_contract_bwd", bwd, "CPU")
    return lib


@pytest.fixture
def route_on_cpu(emulated_tiled_ops, monkeypatch):
    lib_emu = emu.emu_or_skip("tiled_w64")
    if not _CONTRACT_LIB:
        _CONTRACT_LIB.append(_define_contract_ops(lib_emu))
    monkeypatch.setattr(small_seq_flash, "takes_route", lambda *a, **kw: True)
    calls = {"forward": 0, "backward": 0}

    def counted(kind, fn):
        def call(*args, **kw):
            calls[kind] += 1
            return fn(*args, **kw)
        return call

    monkeypatch.setattr(backends, "_aten_flash",
                        lambda: (counted("forward", flash_emulator.flash_forward),
                                 counted("backward", flash_emulator.flash_backward)))
    # a bad segment's flash sub-sequence may exceed the bounds: left uninitialised
    monkeypatch.setattr(flash_emulator, "LONG_SPANS_UNINITIALISED", True)
    lib_emu.errors(reset=True)
    lib_emu.flash_calls = calls
    return lib_emu


def _run(call, dlse=None, compiled=False, return_lse=True):
    leaves = [t.detach().clone().requires_grad_() for t in (call.q, call.k, call.v)]

    def fn(q, k, v, cu_q, cu_kv):
        return fused_attn_small_seq(q, k, v, cu_q, cu_kv, call.max_q, call.max_kv,
                                    return_lse=return_lse)

    runner = torch.compile(fn, fullgraph=True) if compiled else fn
    res = runner(*leaves, call.cu_q, call.cu_kv)
    out, lse = res if return_lse else (res, None)
    outs, cots = [out], [call.dout]
    if dlse is not None:
        outs.append(lse)
        cots.append(dlse)
    return out, lse, torch.autograd.grad(outs, leaves, cots)


@pytest.mark.parametrize("mode", ["eager", "compiled", "dlse"])
def test_route_matches_oracle(route_on_cpu, mode):
    """Padding rows, a segment without queries, one without keys, GQA, int64 kv offsets: out,
    LSE and gradients of the float64 oracle (bf16 inputs). Flash's backward serves the
    gradients, eager and compiled (without return_lse: a traced backward would pass the LSE a
    zero cotangent); with an LSE cotangent the tiled backward does."""
    import torch._dynamo

    torch._dynamo.reset()
    rng = Rng(0, f"flash-route-{mode}")
    call = Call(rng, [5, 0, 9, 3], [7, 4, 0, 11], 4, 2, 64, torch.bfloat16, q_lead=2, q_tail=3,
                kv_dtype=torch.int64)
    dlse = None
    if mode == "dlse":
        dlse = rng.randn(4, call.total_q)
    compiled = mode == "compiled"
    out, lse, grads = _run(call, dlse, compiled=compiled, return_lse=not compiled)
    assert route_on_cpu.errors() == (0, 0)
    want_backward = 0 if mode == "dlse" else 1  # an LSE cotangent takes the tiled backward
    assert route_on_cpu.flash_calls == {"forward": 1, "backward": want_backward}
    leaves = [t.detach().double().requires_grad_() for t in (call.q, call.k, call.v)]
    rout, rlse = seg_tests.oracle(*leaves, call.segs, call.total_q)
    assert_rel("out", out, rout, TOL_BF16, str(call))
    finite = torch.isfinite(rlse)
    if compiled:
        lse = small_seq_flash.small_seq_flash_fwd(call.q, call.k, call.v, call.cu_q, call.cu_kv,
                                                  call.max_q, call.max_kv, 64 ** -0.5, True)[1]
    assert torch.equal(torch.isfinite(lse), finite), "LSE: -inf exactly where no key is"
    assert (lse[~finite] == -math.inf).all()
    assert torch.allclose(lse[finite].double(), rlse[finite], atol=2e-2)
    outs, cots = [rout], [call.dout.double()]
    if dlse is not None:
        outs.append(torch.where(finite, rlse, 0))
        cots.append(torch.where(finite, dlse.double(), 0))
    rg = torch.autograd.grad(outs, leaves, cots)
    for name, x, r in zip(("dq", "dk", "dv"), grads, rg):
        assert_rel(name, x, r, TOL_BF16, str(call))


def test_route_bad_segments_nan_and_counted(route_on_cpu):
    """A segment with too many queries and one past the end of k: NaN rows, counted, zero
    gradient on the bad segments' keys; the valid segments keep the oracle's values."""
    rng = Rng(1, "flash-route-bad")
    call = Call(rng, [4, 6, 3, 5], [3, 5, 4, 2], 2, 2, 64, torch.bfloat16, max_q=5, max_kv=5)
    call.cu_kv[4] = call.total_kv + 9  # segment 3's keys run past k
    out, lse, grads = _run(call)
    count, lowest = route_on_cpu.errors()
    assert count == 2 and 0x7FFFFFFF - lowest == 1
    q_rows = [(int(call.cu_q[i]), int(call.cu_q[i + 1])) for i in range(4)]
    for i in (1, 3):  # NaN on the bad segments' rows (at most max_q of them)
        a, b = q_rows[i][0], min(q_rows[i][1], q_rows[i][0] + call.max_q)
        assert torch.isnan(out[a:b].float()).all() and torch.isnan(lse[:, a:b]).all()
        assert torch.isnan(grads[0][a:b].float()).all()
    good = [s for i, s in enumerate(call.segs) if i in (0, 2)]
    leaves = [t.detach().double().requires_grad_() for t in (call.q, call.k, call.v)]
    rout, _ = seg_tests.oracle(*leaves, good, call.total_q)
    rg = torch.autograd.grad(rout, leaves, call.dout.double())
    for i in (0, 2):
        a, b = q_rows[i]
        assert_rel("out", out[a:b], rout[a:b], TOL_BF16, f"segment {i}")
        assert_rel("dq", grads[0][a:b], rg[0][a:b], TOL_BF16, f"segment {i}")
        k0, n = call.segs[i][2], call.segs[i][3]
        for name, x, r in zip(("dk", "dv"), grads[1:], rg[1:]):
            assert_rel(name, x[k0:k0 + n], r[k0:k0 + n], TOL_BF16, f"segment {i}")
    k0, n = call.segs[1][2], call.segs[1][3]  # bad segment 1's ordered keys: zero gradient
    assert (grads[1][k0:k0 + n] == 0).all() and (grads[2][k0:k0 + n] == 0).all()


def test_takes_route_rules(monkeypatch):
    """Which calls the route takes: THD only, no return_softmax, CUDA builds of torch, not while
    exporting, the tuning mode (0 never, 1 the measured rule or a history beyond the tiled
    kernels, 2 always); the rule's history bound is lower when a backward follows."""
    q = torch.empty(4, 8, 128)
    k = torch.empty(4, 2, 128)
    assert not small_seq_flash.takes_route(q, k, k, True, 64, 64, False), "CPU tensors"
    fwd_kv = small_seq_plan.ROUTE_MIN_SEQLEN_KV_FORWARD
    bwd_kv = small_seq_plan.ROUTE_MIN_SEQLEN_KV_BACKWARD
    rows = small_seq_plan.ROUTE_MIN_QUERIES
    assert small_seq_flash.route_wins(128, rows, fwd_kv, False)
    assert not small_seq_flash.route_wins(128, rows - 1, fwd_kv, False)
    assert not small_seq_flash.route_wins(128, 512, fwd_kv - 1, False)
    assert small_seq_flash.route_wins(128, 512, bwd_kv, True)
    assert not small_seq_flash.route_wins(128, 512, bwd_kv - 1, True)
    assert small_seq_flash.route_wins(256, 512, bwd_kv, False), "wide heads"
    # with the tiled forward's warpgroup-MMA kernel a forward alone at d <= 128 stays tiled
    # where segments may hold WARPGROUP_MIN_ROWS rows per kv head (candidates x group) over at
    # most ROUTE_WARPGROUP_MAX_SEQLEN_KV keys; longer histories take the route
    wg_rows = small_seq_plan.ROUTE_WARPGROUP_MIN_ROWS
    wg_kv = small_seq_plan.ROUTE_WARPGROUP_MAX_SEQLEN_KV
    assert not small_seq_flash.route_wins(128, wg_rows, wg_kv, False, warpgroup=True)
    assert not small_seq_flash.route_wins(128, wg_rows // 4, wg_kv, False, warpgroup=True,
                                          group=4)
    assert small_seq_flash.route_wins(128, wg_rows // 4, wg_kv, False, warpgroup=True)
    assert small_seq_flash.route_wins(128, wg_rows, wg_kv, False)
    for kv in (wg_kv + 1, 384, 4096):  # the ragged-request rows' histories
        assert small_seq_flash.route_wins(128, wg_rows, kv, False, warpgroup=True)
        assert small_seq_flash.route_wins(128, 300, kv, False, warpgroup=True, group=2)
    # ... except that a GQA group of ROUTE_TILED_MIN_GROUP+ keeps a forward alone past
    # ROUTE_STREAM_MIN_SEQLEN_KV keys tiled (the streaming warpgroup forward reads K / V once
    # per group), and past WS_RING_KEYS where the warp-specialized kernel streams it (d 128, two
    # row tiles), up to the tiled kernels' last key
    min_group = small_seq_plan.ROUTE_TILED_MIN_GROUP
    stream_kv = small_seq_plan.ROUTE_STREAM_MIN_SEQLEN_KV
    ring_kv = small_seq_plan.WS_RING_KEYS
    last_tiled = small_seq_plan.TILED_MAX_SEQLEN_KV
    for group in (min_group, 8):
        assert small_seq_flash.route_wins(128, 300, stream_kv, False, warpgroup=True, group=group)
        assert not small_seq_flash.route_wins(128, 300, ring_kv + 1, False, warpgroup=True,
                                              group=group, warp_specialized=True)
        assert small_seq_flash.route_wins(128, 300, ring_kv + 1, False, warpgroup=True,
                                          group=group), "no warp-specialized kernel"
        for kv in (stream_kv + 1, 1000, last_tiled):
            assert not small_seq_flash.route_wins(128, 300, kv, False, warpgroup=True,
                                                  group=group)
            assert small_seq_flash.route_wins(128, 300, kv, False, group=group), "no warpgroup"
            assert small_seq_flash.route_wins(256, 300, kv, False, warpgroup=True,
                                              group=group), "wide heads"
        assert small_seq_flash.route_wins(128, 300, last_tiled + 1, False, warpgroup=True,
                                          group=group)
    assert small_seq_flash.route_wins(128, 300, 1000, False, warpgroup=True,
                                      group=min_group - 1)
    # ... and, with the warp-specialized kernel on, at d 128 over 129-256 keys where a segment
    # may hold two whole 64-row tiles
    lo, hi = small_seq_plan.ROUTE_WS_SEQLEN_KV
    ws_rows = small_seq_plan.ROUTE_WS_MIN_ROWS
    for kv in (lo, hi):
        assert not small_seq_flash.route_wins(128, ws_rows, kv, False, warpgroup=True,
                                              warp_specialized=True)
        assert not small_seq_flash.route_wins(128, 32, kv, False, warpgroup=True, group=4,
                                              warp_specialized=True), "rows fold the group"
        assert small_seq_flash.route_wins(128, ws_rows, kv, False, warpgroup=True)
    for kv in (lo - 1, hi + 1):
        assert small_seq_flash.route_wins(128, ws_rows, max(kv, 128), False, warpgroup=True,
                                          warp_specialized=True)
    assert small_seq_flash.route_wins(128, ws_rows - 1, hi, False, warpgroup=True,
                                      warp_specialized=True), "a part-empty second tile"
    # every forward alone at d 64 stays tiled (up to the tiled kernels' last key)
    for kv in (128, hi, last_tiled):
        assert not small_seq_flash.route_wins(64, 512, kv, False, warpgroup=True)
        assert small_seq_flash.route_wins(64, 512, kv, False), "no warpgroup"
    assert small_seq_flash.route_wins(64, 512, last_tiled + 1, False, warpgroup=True)
    assert small_seq_flash.route_wins(128, ws_rows, hi, True, warpgroup=True,
                                      warp_specialized=True) == small_seq_flash.route_wins(
        128, ws_rows, hi, True, warpgroup=True), "forward alone"
    # ... and so does a call to be differentiated up to the staged warpgroup backward's last
    # key, whatever its GQA group; with a group of ROUTE_TILED_MIN_GROUP+ up to the tiled
    # kernels' last key (the streaming dQ kernel)
    last_kv = small_seq_plan.BWD_WARPGROUP_MAX_KEYS
    for group in (1, 4):
        assert not small_seq_flash.route_wins(128, 512, last_kv, True, warpgroup=True,
                                              group=group)
        assert small_seq_flash.route_wins(128, 512, last_kv + 1, True, warpgroup=True,
                                          group=group) == (group < min_group)
        assert small_seq_flash.route_wins(128, 512, last_tiled + 1, True, warpgroup=True,
                                          group=group)
        assert small_seq_flash.route_wins(128, 512, last_kv, True, group=group), "no warpgroup"
        assert small_seq_flash.route_wins(256, 512, last_kv, True, warpgroup=True,
                                          group=group), "wide heads"
    assert small_seq_flash.route_wins(256, 512, bwd_kv, False, warpgroup=True), "wide heads"
    # the streaming warpgroup forward forced (tuning small_seq_tiled_warpgroup_stream 2) keeps
    # every forward alone at d <= 128 tiled up to the tiled kernels' last key: the A/B of the
    # ragged-request rows (1000-4096 keys) that the rule otherwise sends to the route
    last_tiled = small_seq_plan.TILED_MAX_SEQLEN_KV
    for kv in (wg_kv + 1, 1000, last_tiled):
        assert not small_seq_flash.route_wins(128, 300, kv, False, warpgroup=True, group=4,
                                              stream_forced=True)
        assert not small_seq_flash.route_wins(64, 64, kv, False, warpgroup=True,
                                              stream_forced=True)
        assert small_seq_flash.route_wins(128, 300, kv, True, warpgroup=True, group=2,
                                          stream_forced=True), "a backward follows"
        assert small_seq_flash.route_wins(256, 300, kv, False, warpgroup=True,
                                          stream_forced=True), "wide heads"
        assert small_seq_flash.route_wins(128, 300, kv, False, stream_forced=True), \
            "no warpgroup"

    class FakeCuda:  # a tensor stand-in on a CUDA device
        is_cuda = True
        shape = q.shape
        requires_grad = False

    class FakeK:
        shape = k.shape
        requires_grad = False

    monkeypatch.setattr(backends, "_flash_problem", lambda q: None)
    monkeypatch.setattr(torch.version, "hip", None)
    for mode, thd, softmax, max_q, max_kv, long, want in [
            (1, True, False, 512, fwd_kv, False, True),
            (1, True, False, 512, bwd_kv, False, False),
            (1, True, False, 8, fwd_kv, False, False),
            (1, True, False, 1, 8192, True, True),
            (2, True, False, 8, 64, False, True),
            (0, True, False, 512, fwd_kv, False, False),
            (0, True, False, 1, 8192, True, False),
            (2, False, False, 512, 64, False, False),
            (2, True, True, 512, 64, False, False)]:
        monkeypatch.setattr(small_seq_flash, "_route_mode", lambda: mode)
        got = small_seq_flash.takes_route(FakeCuda(), FakeK(), FakeK(), thd, max_q, max_kv,
                                          softmax, long_history=long)
        assert got == want, (mode, thd, softmax, max_q, max_kv, long)
    # the GQA group comes from the tensors' head counts: where the warpgroup kernels run, a
    # forward alone of 128 candidates stays tiled over 256 keys with q 8 heads over k 2 (512
    # rows per kv head) and over 512 keys too (the streaming forward past
    # ROUTE_STREAM_MIN_SEQLEN_KV keys with a group of 4), and takes the route over 512 keys with
    # 8 kv heads (128 rows); over 256 keys the
    # warp-specialized kernel (on by default) keeps 128 rows tiled too; a differentiated call
    # stays tiled up to 256 keys with either group, and past it with a group of 4
    monkeypatch.setattr(small_seq_flash, "_route_mode", lambda: 1)
    monkeypatch.setattr(small_seq_flash, "warpgroup_kernels", lambda: True)

    class FakeCudaLeaf(FakeCuda):
        requires_grad = True

    class FakeK8(FakeK):
        shape = (4, 8, 128)

    assert not small_seq_flash.takes_route(FakeCuda(), FakeK(), FakeK(), True, 128, 256, False)
    # a group of 4 keeps the forward tiled past the ring of the warp-specialized kernel
    assert not small_seq_flash.takes_route(FakeCuda(), FakeK(), FakeK(), True, 128, 512, False)
    assert small_seq_flash.takes_route(FakeCuda(), FakeK8(), FakeK8(), True, 128, 1024, False)
    assert not small_seq_flash.takes_route(FakeCuda(), FakeK8(), FakeK8(), True, 128, 256, False)
    with rocm_attn_tuning_ws_off(monkeypatch):
        assert small_seq_flash.takes_route(FakeCuda(), FakeK8(), FakeK8(), True, 128, 256, False)
    for kv in (FakeK(), FakeK8()):
        assert not small_seq_flash.takes_route(FakeCudaLeaf(), kv, kv, True, 512, 256, False)
    # past the staged backward's 256 keys: the route for MHA, the streaming dQ kernel for GQA
    assert not small_seq_flash.takes_route(FakeCudaLeaf(), FakeK(), FakeK(), True, 512, 257,
                                           False)
    assert small_seq_flash.takes_route(FakeCudaLeaf(), FakeK8(), FakeK8(), True, 512, 257, False)
    monkeypatch.setattr(small_seq_flash, "_route_mode", lambda: 2)
    monkeypatch.setattr(small_seq_flash.errors, "exporting", lambda: True)
    assert not small_seq_flash.takes_route(FakeCuda(), FakeK(), FakeK(), True, 512, 64, False), \
        "export keeps the compiled ops"
    monkeypatch.setattr(small_seq_flash, "_route_mode", lambda: 1)
    leaf = torch.empty(4, 8, 128, requires_grad=True)
    assert small_seq_flash.needs_backward(leaf, k, k)
    with torch.no_grad():
        assert not small_seq_flash.needs_backward(leaf, k, k)
    monkeypatch.setattr(torch.version, "hip", "6.2")
    assert not small_seq_flash.takes_route(FakeCuda(), FakeK(), FakeK(), True, 512, 64, False)


def rocm_attn_tuning_ws_off(monkeypatch):
    """The plan's tuning with the warp-specialized forward off (no compiled extension here)."""
    import contextlib

    tuned = dict(small_seq_plan.DEFAULT_TUNING, small_seq_tiled_warpgroup_ws=0)

    @contextlib.contextmanager
    def scope():
        with monkeypatch.context() as m:
            m.setattr(small_seq_plan, "current_tuning", lambda: dict(tuned))
            yield
    return scope()


def test_flash_offsets():
    """Clamped into [0, total] and non-decreasing; valid offsets unchanged."""
    cu = torch.tensor([0, 3, 3, 9], dtype=torch.int64)
    assert torch.equal(small_seq_flash.flash_offsets(cu, 9), cu.int())
    bad = torch.tensor([-4, 7, 2, 2**40, 5], dtype=torch.int64)
    assert small_seq_flash.flash_offsets(bad, 10).tolist() == [0, 7, 7, 10, 10]


def test_route_overlapping_valid_segment_is_nan(route_on_cpu):
    """Segment 1 bad (decreasing offsets) lets segment 2 overlap segment 0's rows and keys: the
    route gives segment 2 NaN (flash saw it on other rows) rather than a wrong value, counts
    only the bad segment, and segment 0's own rows keep the oracle's values."""
    rng = Rng(2, "flash-route-overlap")
    call = Call(rng, [8, 0, 8], [4, 0, 4], 2, 2, 64, torch.bfloat16)
    call.cu_q = torch.tensor([0, 8, 2, 10], dtype=torch.int32)
    call.cu_kv = torch.tensor([0, 4, 2, 6], dtype=torch.int32)
    call.q = call.q[:10]
    call.dout = call.dout[:10]
    call.k, call.v = call.k[:6], call.v[:6]
    call.total_q = 10
    out, lse, grads = _run(call)
    count, lowest = route_on_cpu.errors()
    assert count == 1 and 0x7FFFFFFF - lowest == 1
    assert torch.isnan(out[8:10].float()).all() and torch.isnan(lse[:, 8:10]).all()
    assert torch.isnan(grads[0][8:10].float()).all()
    assert torch.isnan(grads[1][4:6].float()).all() and torch.isnan(grads[2][4:6].float()).all()
    leaves = [t.detach().double().requires_grad_() for t in (call.q, call.k, call.v)]
    rout, _ = seg_tests.oracle(*leaves, [(0, 8, 0, 4)], call.total_q)
    assert_rel("out", out[:2], rout[:2], TOL_BF16, "segment 0's own rows")


def test_route_offsets(route_on_cpu):
    """One query per segment with GQA and no padding rows takes flash's one-query path
    (q offsets arange); anything else the clamped offsets of the offsets kernel (emulated)."""
    cu = torch.arange(5, dtype=torch.int64)
    q, k_gqa, k_mha = torch.empty(4, 8, 64), torch.empty(9, 2, 64), torch.empty(9, 8, 64)
    fq, fk, one_query = small_seq_flash.route_offsets(q, k_gqa, cu, cu, 1)
    assert one_query and fq.dtype == torch.int32 and fq.tolist() == [0, 1, 2, 3, 4]
    assert fk.dtype == torch.int32 and fk.tolist() == [0, 1, 2, 3, 4]
    garbage = torch.tensor([0, 1, 2**40, 3, 4])
    fq, fk, _ = small_seq_flash.route_offsets(q, k_gqa, garbage, garbage, 1)
    assert fq.tolist() == [0, 1, 2, 3, 4] and fk.tolist() == [0, 1, 9, 9, 9]
    assert not small_seq_flash.route_offsets(q, k_mha, cu, cu, 1)[2], "no GQA group"
    padded = torch.empty(5, 8, 64)
    assert not small_seq_flash.route_offsets(padded, k_gqa, cu, cu, 1)[2], "a padding row"
    fq, _, one_query = small_seq_flash.route_offsets(q, k_gqa, garbage, cu, 3)
    assert not one_query and fq.tolist() == [0, 1, 4, 4, 4]
