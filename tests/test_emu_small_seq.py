"""Small-seq forward and backward kernels executed on the CPU emulation (tests/helpers/emu.py):
64-lane waves with MFMA (the gfx942 code paths) and 32-lane waves, through the project's own
launchers, against the float64 oracle and the torch path with the bounds of
tests/test_small_seq_gpu.py (out / grads within max(2 x the torch path's error, 1e-2 bf16 /
5e-3 fp16), lse / probs within 1e-4). Outputs start as NaN, so an unwritten element fails.

Kernel variants: the launcher's own choice (MFMA for GQA groups at 64 lanes, the pipelined
general loop for one q head per kv head) and, through its environment switches, the general
kernels for every group (tuning small_seq_mma=0, small_seq_pipe=0).
"""

from __future__ import annotations

import pytest
import torch

import test_small_seq_gpu as SG
from helpers import emu
from rocm_attn.small_seq import _scale
from test_small_seq import (  # noqa: F401  (helpers only: no test functions are imported)
    TOL_LOW,
    Rng,
    assert_lse,
    assert_rel,
    bshd_case,
    random_lens,
    rel_err,
    run_ref,
    thd_case,
)

pytestmark = pytest.mark.usefixtures("one_torch_thread")

TOL_KERNEL_F32 = SG.TOL_KERNEL_F32


@pytest.fixture(scope="module")
def lib64():
    return emu.emu_or_skip("w64")


MODES = {
    "launcher": {},  # the launcher's choice: MFMA for groups >= 2 (wave64), pipelined for 1
    "general": {"small_seq_mma": 0, "small_seq_pipe": 0},
}


@pytest.fixture(params=list(MODES))
def mode(request):
    with emu.tuning(**MODES[request.param]):
        yield request.param


def need(lib, direction, case):
    q, _, _ = case.qkv()
    if not emu.small_seq_compiled(lib.wave, direction, case.dtype, q.shape[-1], case.max_kv):
        pytest.skip("variant not in the emulation build (helpers.emu.SMALL_SEQ_VARIANTS)")


def emu_run(lib, case, grads=True):
    """(out, lse, probs, grads wrt the leaves) of the emulated kernels, like run_op."""
    q, k, v = case.qkv()
    scale = _scale(q, case.scale)
    args = (case.cu_q, case.cu_kv, case.seqlens, case.max_kv, scale)
    out, lse, probs = emu.small_seq_fwd(lib, q, k, v, *args)
    g = None
    if grads:
        dq, dk, dv = emu.small_seq_bwd(lib, case.dout, q, k, v, out, lse, None, *args)
        if len(case.leaves) == 3:
            g = (dq, dk, dv)
        else:  # q, k, v are views of one fused projection: its gradient
            fused = torch.zeros_like(case.leaves[0])
            for view, part in zip(case.make(fused), (dq, dk, dv)):
                view += part
            g = (fused,)
    return out, lse, probs, g


def check_emu(lib, case, grads=True):
    """Emulated kernels vs the float64 oracle and the torch path (the GPU tests' check)."""
    lib.stats(reset=True)
    out, lse, probs, g = emu_run(lib, case, grads)
    SG.check_against_oracle(case, out, lse, probs, g, f"{case}, wave {lib.wave}")
    assert lib.stats()["inactive_reads"] == 0, "a lane read a value from an exited lane"
    assert lib.errors() == (0, 0), "valid inputs tripped the device error counter"
    return out, lse, probs, g


# GQA groups: 1 (general / pipelined), 2..8 (one tile of q heads; the backward's one-tile MFMA
# kernel), 12 and 24 (the backward's blocked kernel; 24 is two forward passes of 16, the second
# partial).
GROUPS = [pytest.param(2, 2, id="g1"), pytest.param(4, 2, id="g2"),
          pytest.param(10, 2, id="g5"), pytest.param(12, 1, id="g12"),
          pytest.param(24, 1, id="g24")]


@pytest.mark.parametrize("h_q,h_kv", GROUPS)
@pytest.mark.parametrize("kv", [1, 7, 16], ids=["kv1", "kv7", "kv16"])  # one per bucket
@pytest.mark.parametrize("d", [64, 128, 256, 512])
def test_forward_backward(lib, mode, d, kv, h_q, h_kv):
    rng = Rng(0, f"emu{lib.wave}{mode}{d}{kv}{h_q}{h_kv}")
    case = thd_case(rng, 37, h_q, h_kv, d, kv, torch.bfloat16)
    need(lib, "fwd", case)
    check_emu(lib, case, grads=True)


@pytest.mark.parametrize("h_q,h_kv", [(2, 2), (8, 2), (16, 1)], ids=["g1", "g4", "g16"])
@pytest.mark.parametrize("kv", [3, 16])
def test_fp16(lib64, mode, kv, h_q, h_kv):
    rng = Rng(0, f"emufp16{mode}{kv}{h_q}{h_kv}")
    case = thd_case(rng, 29, h_q, h_kv, 128, kv, torch.float16)
    check_emu(lib64, case, grads=True)


@pytest.mark.parametrize("h_q,h_kv", [(2, 2), (8, 2)], ids=["g1", "g4"])
@pytest.mark.parametrize("d", [64, 256])
def test_bshd_and_strided(lib, d, h_q, h_kv):
    """BSHD with padding rows past each segment (s_kv > lengths), and THD q/k/v as views of one
    fused projection (arbitrary token strides)."""
    rng = Rng(1, f"emubshd{lib.wave}{d}{h_q}")
    case = bshd_case(rng, 23, h_q, h_kv, d, 16, torch.bfloat16, s_kv=12)
    check_emu(lib, case, grads=True)
    case = thd_case(rng, 23, h_q, h_kv, d, 16, torch.bfloat16, strided=True, pad_before=3,
                    pad_after=5)
    check_emu(lib, case, grads=True)


@pytest.mark.parametrize("h_q,h_kv", [(2, 2), (8, 2)], ids=["g1", "g4"])
def test_empty_segments(lib, mode, h_q, h_kv):
    rng = Rng(2, f"emuempty{lib.wave}{mode}{h_q}")
    lens = random_lens(rng, 40, 16)
    lens[::3] = 0
    case = thd_case(rng, 40, h_q, h_kv, 128, 16, torch.bfloat16, lens=lens)
    check_emu(lib, case, grads=True)
    lens = torch.zeros(9, dtype=torch.int64)  # every segment empty
    case = thd_case(rng, 9, h_q, h_kv, 64, 4, torch.bfloat16, lens=lens)
    check_emu(lib, case, grads=True)


@pytest.mark.parametrize("h_q,h_kv", [(2, 2), (8, 2), (24, 1)], ids=["g1", "g4", "g24"])
@pytest.mark.parametrize("d", [64, 512])
def test_contract_violations(lib, mode, d, h_q, h_kv):
    """Segments longer than max_seqlen_kv, one past the end of k/v and one with a negative length:
    each counted once in the device error counter (lowest index reported), NaN outputs there,
    the rest correct, nothing read out of bounds."""
    rng = Rng(3, f"emuviol{lib.wave}{mode}{d}{h_q}")
    b, max_kv, bad = 61, 8, [40, 5, 17]
    lens = random_lens(rng, b, max_kv)
    for i in bad:
        lens[i] = max_kv + 1 + int(rng.randint(0, 3, (1,)))
    case = thd_case(rng, b, h_q, h_kv, d, max_kv, torch.bfloat16, lens=lens)
    need(lib, "fwd", case)
    q, k, v = case.qkv()
    cu_kv = case.cu_kv.clone()
    cu_kv[-1] = k.shape[0] + 50  # the last segment runs past the end of k/v
    cu_kv[31] = cu_kv[30] - 1  # segment 30: -1 keys
    c = cu_kv.long()
    n = c[1:] - c[:-1]
    is_bad = (n < 0) | (n > max_kv) | (c[:-1] < 0) | (c[1:] > k.shape[0])
    bad = is_bad.nonzero().flatten().tolist()
    assert {5, 17, 30, 40, b - 1} <= set(bad)
    lib.errors(reset=True)
    lib.stats(reset=True)
    scale = _scale(q, None)
    out, lse, probs = emu.small_seq_fwd(lib, q, k, v, case.cu_q, cu_kv, None, max_kv, scale)
    count, first = lib.errors(reset=True)
    assert count == len(bad), f"bad segments counted {count} times, want {len(bad)}"
    assert 0x7FFFFFFF - first == bad[0]
    assert torch.isnan(out[is_bad]).all() and torch.isnan(lse[:, is_bad]).all()
    assert torch.isnan(probs[is_bad]).all()
    good = ~is_bad
    # segments whose rows did not change, against the oracle of the unchanged case
    same = good & (case.cu_kv[1:] == cu_kv[1:]) & (case.cu_kv[:-1] == cu_kv[:-1])
    rout, rlse, rprobs, _ = run_ref(case, grads=False)
    assert_rel("out (good segments)", out[same], rout[same], TOL_LOW[torch.bfloat16], str(case))
    assert_lse(lse[:, same], rlse[:, same], TOL_KERNEL_F32, str(case))
    assert_rel("probs (good)", probs[same], rprobs[same], TOL_KERNEL_F32, str(case))
    assert torch.isfinite(out[good]).all()
    # the backward (the forward counted them): NaN dq there, finite dq elsewhere
    dq, dk, dv = emu.small_seq_bwd(lib, case.dout, q, k, v, out, lse, None, case.cu_q, cu_kv,
                                   None, max_kv, scale)
    assert lib.errors(reset=True) == (0, 0)
    assert torch.isnan(dq[is_bad]).all() and torch.isfinite(dq[good]).all()
    assert lib.stats()["inactive_reads"] == 0


def test_launcher_picks_mfma_at_64_lanes(lib64):
    """GQA groups take the MFMA kernels at 64 lanes (their exchanges show up); the general
    kernels issue none."""
    rng = Rng(4, "emupick")
    case = thd_case(rng, 16, 8, 2, 128, 16, torch.bfloat16)
    lib64.lib.ra_emu_set_faults(1)  # swapped MFMA operands: only the MFMA path is affected
    try:
        with pytest.raises(AssertionError):
            check_emu(lib64, case, grads=False)
        with emu.tuning(small_seq_mma=0):
            check_emu(lib64, case, grads=True)
    finally:
        lib64.lib.ra_emu_set_faults(0)


@pytest.mark.parametrize("h_q,h_kv", [(8, 2), (24, 1)], ids=["g4", "g24"])
def test_swapped_mfma_operands_fail_attention(lib64, h_q, h_kv):
    """The GQA forward and backward with MFMA operands swapped must fail the attention check."""
    rng = Rng(5, f"emuswap{h_q}")
    case = thd_case(rng, 16, h_q, h_kv, 64, 16, torch.bfloat16)
    lib64.lib.ra_emu_set_faults(1)
    try:
        with pytest.raises(AssertionError):
            check_emu(lib64, case, grads=False)
        rout, rlse, _, rg = run_ref(case, grads=True)
        lib64.lib.ra_emu_set_faults(0)
        out, lse, _, _ = emu_run(lib64, case, grads=False)
        lib64.lib.ra_emu_set_faults(1)
        q, k, v = case.qkv()
        dq, dk, dv = emu.small_seq_bwd(lib64, case.dout, q, k, v, out, lse, None, case.cu_q,
                                       case.cu_kv, None, case.max_kv, _scale(q, None))
        errs = [rel_err(x, r) for x, r in zip((dq, dk, dv), rg)]
        assert max(errs) > 0.1, f"backward with swapped operands passed: {errs}"
    finally:
        lib64.lib.ra_emu_set_faults(0)


@pytest.mark.parametrize("h_q,h_kv,d", [(2, 2, 128), (8, 2, 64), (24, 1, 256)],
                         ids=["g1", "g4", "g24"])
def test_schedule_order_does_not_matter(lib, monkeypatch, h_q, h_kv, d):
    """Blocks, waves and lanes run in reverse order (RA_EMU_REVERSE=1), then one wave per item
    instead of the grid-stride loop's several (tuning small_seq_fwd_grid / _bwd_grid = 0): bitwise the same
    outputs and gradients (a result that depended on the order would be a race)."""
    rng = Rng(6, f"emuorder{lib.wave}{h_q}{d}")
    case = thd_case(rng, 45, h_q, h_kv, d, 16, torch.bfloat16)
    first = emu_run(lib, case)
    monkeypatch.setenv("RA_EMU_REVERSE", "1")
    second = emu_run(lib, case)
    monkeypatch.delenv("RA_EMU_REVERSE")
    with emu.tuning(small_seq_fwd_grid=0, small_seq_bwd_grid=0):
        third = emu_run(lib, case)
    for other in (second, third):
        for name, a, b in zip(("out", "lse", "probs"), first[:3], other[:3]):
            assert torch.equal(a.view(torch.uint8), b.view(torch.uint8)), name
        for name, a, b in zip(("dq", "dk", "dv"), first[3], other[3]):
            assert torch.equal(a.view(torch.uint8), b.view(torch.uint8)), name


def _record(kernel, *params):
    """A one-launch plan of kernel with params in LAUNCH_PARAMS order (small_seq_plan)."""
    from rocm_attn import small_seq_plan as sp

    ints = [sp.KERNEL_IDS[kernel], *params]
    return [1, 0] + ints + [0] * (sp.LAUNCH_INTS - len(ints))


def test_launcher_runs_the_plan_not_the_tuning(lib64):
    """The launcher runs the kernel its plan names, whatever the library's tuning says: with the
    library's small_seq_mma at 0 (the general kernels, where the launcher chose by the tuning)
    a plan naming the MFMA forward still runs it (swapped MFMA operands fail the check), and a
    plan naming the general kernel passes with the faults on."""
    rng = Rng(4, "emuplan")
    case = thd_case(rng, 16, 8, 2, 128, 16, torch.bfloat16)
    q, k, v = case.qkv()
    args = (case.cu_q, case.cu_kv, None, case.max_kv, _scale(q, None))
    rout, rlse, _, _ = run_ref(case, grads=False)
    lib64.lib.ra_emu_set_faults(1)  # swapped MFMA operands: only the MFMA path is affected
    try:
        with emu.tuning(small_seq_mma=0):
            out, _, _ = emu.small_seq_fwd(lib64, q, k, v, *args,
                                          plan=_record("fwd_mma", 128, 16, 4))
            assert rel_err(out, rout) > 0.1, "the MFMA forward did not run"
        with emu.tuning(small_seq_mma=3):
            out, lse, _ = emu.small_seq_fwd(lib64, q, k, v, *args,
                                            plan=_record("fwd", 128, 16, 0, 4))
            assert rel_err(out, rout) < 1e-2
            assert_lse(lse, rlse, 1e-4, "the general kernel's plan, faults on")
    finally:
        lib64.lib.ra_emu_set_faults(0)


# (direction, q heads (kv heads 2), head dim, plan, the launcher's code)
BAD_PLANS = [
    ("fwd", 8, 128, _record("bwd", 128, 16, 0, 4), emu.HIP_ERROR_NOT_SUPPORTED),
    ("bwd", 8, 128, _record("fwd_mma", 128, 16, 4), emu.HIP_ERROR_NOT_SUPPORTED),
    ("fwd", 8, 128, _record("tiled_fwd_wave", 128, 16, 4), emu.HIP_ERROR_NOT_SUPPORTED),
    ("fwd", 8, 128, _record("fwd", 64, 16, 0, 4), emu.HIP_ERROR_INVALID_VALUE),     # head dim
    ("fwd", 8, 128, _record("fwd", 128, 8, 0, 4), emu.HIP_ERROR_INVALID_VALUE),     # bucket < 13
    ("fwd", 8, 128, _record("fwd", 128, 12, 0, 4), emu.HIP_ERROR_INVALID_VALUE),    # no bucket
    ("fwd", 8, 128, _record("fwd", 128, 16, 1, 4), emu.HIP_ERROR_INVALID_VALUE),    # PIPE, GQA
    ("fwd", 2, 512, _record("fwd", 512, 16, 1, 4), emu.HIP_ERROR_INVALID_VALUE),    # 2 chunks
    ("fwd", 2, 128, _record("fwd", 128, 16, 2, 4), emu.HIP_ERROR_INVALID_VALUE),    # PIPE 2
    ("fwd", 2, 128, _record("fwd_mma", 128, 16, 4), emu.HIP_ERROR_INVALID_VALUE),   # group 1
    ("fwd", 2, 128, _record("fwd", 128, 16, 0, -1), emu.HIP_ERROR_INVALID_VALUE),   # factor
    ("bwd", 2, 128, _record("bwd_mma", 128, 16, 4), emu.HIP_ERROR_INVALID_VALUE),   # group 1
    ("bwd", 32, 128, _record("bwd_mma", 128, 16, 4), emu.HIP_ERROR_INVALID_VALUE),  # group 16
    ("bwd", 16, 128, _record("bwd_mma_wide", 128, 16, 4), emu.HIP_ERROR_INVALID_VALUE),  # 8
    ("bwd", 8, 128, _record("bwd", 128, 16, 1, 4), emu.HIP_ERROR_INVALID_VALUE),    # PIPE, GQA
    ("bwd", 2, 128, _record("bwd", 128, 16, 1, 4)[:-1], emu.HIP_ERROR_INVALID_VALUE),  # short
    ("fwd", 2, 128, [2, 0] + _record("fwd", 128, 16, 0, 4)[2:] * 2,
     emu.HIP_ERROR_INVALID_VALUE),                                                # two launches
]


@pytest.mark.parametrize("direction,h_q,d,plan,code", BAD_PLANS,
                         ids=[f"{c[0]}-{i}" for i, c in enumerate(BAD_PLANS)])
def test_invalid_plans_launch_nothing(lib64, direction, h_q, d, plan, code):
    """A plan the launcher cannot run as given (another direction's kernel, another head dim, a
    kv bucket that does not hold the history, a kernel of another GQA group, PIPE where the
    variant has no pipelined loop or the call a GQA group) is refused with the code the
    bindings turn into their errors ('no kernel for the plan', 'does not fit'), and nothing
    runs: the outputs stay NaN."""
    rng = Rng(7, f"emubadplan{h_q}{d}")
    case = thd_case(rng, 16, h_q, 2, d, 13, torch.bfloat16)
    q, k, v = case.qkv()
    args = (case.cu_q, case.cu_kv, None, case.max_kv, _scale(q, None))
    rc = []
    if direction == "fwd":
        outputs = emu.small_seq_fwd(lib64, q, k, v, *args, plan=plan, rc=rc)
    else:
        out, lse, _ = emu.small_seq_fwd(lib64, q, k, v, *args)
        outputs = emu.small_seq_bwd(lib64, case.dout, q, k, v, out, lse, None, *args, plan=plan,
                                    rc=rc)
    assert rc == [code]
    assert all(torch.isnan(t.float()).all() for t in outputs[:2])
