"""GPU tests of rocm_attn.fused_attn_small_seq: the compiled HIP/CUDA kernels.

Every test is marked ``gpu`` and skipped unless a CUDA/ROCm device is present and the compiled
extension (rocm_attn._C) is loaded. The helpers (case builders, float64 oracle, relative-error
checks, per-run seeds) are shared with tests/test_small_seq.py.

Outputs of the kernel path are allocated by the op itself, so they are "poisoned" through the
caching allocator: before each call, big and small blocks are filled with 0xFF bytes (NaN in
fp32, fp16 and bf16) and freed, so that the op's torch.empty outputs reuse NaN memory. Any
element the kernel forgets to write shows up as NaN, and NaN never passes.

Bounds: fp16/bf16 out and dq/dk/dv must be within max(2 x the error of the torch path on the
same inputs (fp32 compute, rounded once), 1e-2 bf16 / 5e-3 fp16) of the float64 oracle; fp32
lse and probs within 1e-4.
"""

from __future__ import annotations

import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import rocm_attn  # noqa: E402
from rocm_attn import small_seq_plan  # noqa: E402
from rocm_attn import SmallSeqContractError, check_errors, fused_attn_small_seq  # noqa: E402
from rocm_attn.errors import read_errors  # noqa: E402
from helpers.gpu import gpu_marks, poison_allocator, why_no_kernels  # noqa: E402
import test_small_seq  # noqa: E402
from test_small_seq import (  # noqa: E402  (helpers only: no test functions are imported)
    BSHD,
    THD,
    TOL_FP32,
    TOL_LOW,
    Rng,
    assert_lse,
    assert_rel,
    bshd_case,
    call,
    random_lens,
    rel_err,
    run_op,
    run_ref,
    seeds,
    thd_case,
)


pytestmark = gpu_marks(thd_ops=False)

TOL_KERNEL_F32 = 1e-4  # lse / probs of the kernels (fp32 from 16-bit inputs)
DTYPES = [pytest.param(torch.bfloat16, id="bf16"), pytest.param(torch.float16, id="fp16")]
HEAD_DIMS = [64, 128, 256, 512]


@pytest.fixture
def dev():
    why = why_no_kernels(thd_ops=False)
    if why:
        pytest.skip(why)
    return torch.device("cuda", torch.cuda.current_device())


# The CPU module's error-counter fixtures: a clean counter before each test (autouse), which
# must stay clean unless the test asks for allow_contract_errors.
_error_counter = test_small_seq._error_counter
allow_contract_errors = test_small_seq.allow_contract_errors


def low_tol(dtype):
    """Error floor of a 16-bit output or gradient."""
    return TOL_LOW[dtype]


def run_kernel(case, grads=True, poison=True, **kw):
    """(out, lse, probs, grads wrt the leaves) of backend='kernel', outputs poisoned."""
    device = case.leaves[0].device
    leaves = tuple(t.detach().clone().requires_grad_(grads) for t in case.leaves)
    q, k, v = case.qkv(leaves)
    if poison:
        poison_allocator(device)
    out, lse, probs = call(case, q, k, v, backend="kernel", **kw)
    g = None
    if grads:
        if poison:
            poison_allocator(device)
        g = torch.autograd.grad(out, leaves, case.dout, allow_unused=True, materialize_grads=True)
    return out, lse, probs, g


def check_kernel(case, grads=True):
    """Kernel vs float64 oracle with the bounds of the module docstring; returns the kernel
    results."""
    out, lse, probs, g = run_kernel(case, grads)
    check_against_oracle(case, out, lse, probs, g, str(case))
    return out, lse, probs, g


def check_against_oracle(case, out, lse, probs, g, ctx):
    """Kernel results (out, lse, probs, gradients or None) against the float64 oracle, within
    twice the torch path's own error (the module docstring's bounds); also what the CPU
    emulation of the kernels is held to."""
    rout, rlse, rprobs, rg = run_ref(case, g is not None)
    tout, _, _, tg = run_op(case, backend="torch", grads=g is not None)
    q, _, _ = case.qkv()
    b, h_q = len(case.lens), q.shape[-2]
    assert out.shape == q.shape and out.dtype == q.dtype and out.is_contiguous(), ctx
    assert tuple(lse.shape) == (h_q, b) and tuple(probs.shape) == (b, h_q, case.max_kv), ctx
    assert_rel("out", out, rout, max(2 * rel_err(tout, rout), low_tol(case.dtype)), ctx)
    assert_lse(lse, rlse, TOL_KERNEL_F32, ctx)
    assert_rel("probs", probs, rprobs, TOL_KERNEL_F32, ctx)
    empty = case.lens == 0
    if empty.any():
        assert (out[empty] == 0).all(), f"empty segments must give exact zeros ({ctx})"
        assert (probs[empty] == 0).all(), ctx
    if g is not None:
        names = ("dq", "dk", "dv") if len(g) == 3 else ("dqkv",)
        for name, x, r, t in zip(names, g, rg, tg):
            assert x.dtype == case.dtype, ctx
            assert_rel(name, x, r, max(2 * rel_err(t, r), low_tol(case.dtype)), ctx)
        if empty.any():
            dq = g[0] if len(g) == 3 else None
            if dq is not None:
                assert (dq[empty] == 0).all(), f"empty segments must have dq == 0 ({ctx})"


# --------------------------------------------------------------------------------------------
# numerics against the float64 oracle
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", seeds(1))
@pytest.mark.parametrize("ratio", [1, 4], ids=["mha", "gqa4"])
@pytest.mark.parametrize("kv", [1, 2, 5, 8, 13, 16])
@pytest.mark.parametrize("d", HEAD_DIMS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_kernel_forward(dev, dtype, d, kv, ratio, seed):
    rng = Rng(seed, f"kfwd{dtype}{d}{kv}{ratio}")
    case = thd_case(rng, 333, 2 * ratio, 2, d, kv, dtype, device=dev)
    check_kernel(case, grads=False)


# GQA groups (h_q / h_kv) served by the matrix-unit forward (fwd_mma_kernel.h): powers of two and
# not, one tile of q heads per pass (8 on NVIDIA, 16 on CDNA) and several passes (12, 16, 32 on
# NVIDIA; 32 on CDNA), with partial last passes. The matrix-unit backward (bwd_mma_kernel.h)
# serves groups up to 8 with its one-tile kernel and 12, 16, 32 with its blocked kernel (blocks
# of one tile of q heads, dK/dV summed over the blocks; partial last block at 12 on NVIDIA).
GQA_GROUPS = [
    pytest.param(4, 2, id="g2"),
    pytest.param(6, 2, id="g3"),
    pytest.param(16, 2, id="g8"),
    pytest.param(12, 1, id="g12"),
    pytest.param(16, 1, id="g16"),
    pytest.param(32, 1, id="g32"),
]


@pytest.mark.parametrize("seed", seeds(1))
@pytest.mark.parametrize("h_q,h_kv", GQA_GROUPS)
@pytest.mark.parametrize("kv", [3, 8, 16], ids=["kv3", "kv8", "kv16"])  # one per bucket
@pytest.mark.parametrize("d", HEAD_DIMS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_kernel_forward_gqa(dev, dtype, d, kv, h_q, h_kv, seed):
    """Every group size x head dim x kv bucket x dtype of the GQA forward against the float64
    oracle (out, lse, probs), outputs poisoned, random lengths with an empty and a full segment."""
    rng = Rng(seed, f"kfwdgqa{dtype}{d}{kv}{h_q}{h_kv}")
    case = thd_case(rng, 157, h_q, h_kv, d, kv, dtype, device=dev)
    check_kernel(case, grads=False)


@pytest.mark.parametrize("seed", seeds(1))
@pytest.mark.parametrize("h_q,h_kv", [(8, 2), (16, 1)], ids=["g4", "g16"])
@pytest.mark.parametrize("d", [64, 128, 512])
@pytest.mark.parametrize("dtype", DTYPES)
def test_kernel_forward_gqa_matches_general_kernel(dev, dtype, d, h_q, h_kv, seed):
    """The matrix-unit forward (tuning small_seq_mma=1, the forward bit) and the general
    kernel (=0) on the same inputs: both against the oracle, and lse / probs of the two within
    fp32 rounding of each other (P is rounded to 16 bits only for the P.V product, never for lse
    or probs)."""
    rng = Rng(seed, f"kgqaab{dtype}{d}{h_q}{h_kv}")
    case = thd_case(rng, 211, h_q, h_kv, d, 16, dtype, device=dev)
    results = {}
    for mma in ("1", "0"):
        with rocm_attn.tuning.override(small_seq_mma=int(mma)):
            results[mma] = check_kernel(case, grads=False)
    (out1, lse1, probs1, _), (out0, lse0, probs0, _) = results["1"], results["0"]
    ctx = str(case)
    finite = torch.isfinite(lse0)
    assert torch.equal(finite, torch.isfinite(lse1)), ctx
    assert_rel("lse mma vs general", lse1[finite], lse0[finite], TOL_KERNEL_F32, ctx)
    assert_rel("probs mma vs general", probs1, probs0, TOL_KERNEL_F32, ctx)
    assert_rel("out mma vs general", out1, out0, 2 * low_tol(case.dtype), ctx)


@pytest.mark.parametrize("seed", seeds(1))
@pytest.mark.parametrize("h_q,h_kv", [(4, 4), (8, 2), (16, 2)], ids=["mha", "g4", "g8"])
@pytest.mark.parametrize("max_kv", [4, 8, 16])
@pytest.mark.parametrize("d", [64, 128, 256])
def test_kernel_pipelined_matches_plain(dev, d, max_kv, h_q, h_kv, seed):
    """The software-pipelined loops (tuning small_seq_pipe=3: forward, and the backward
    for one q head per kv head) against the plain grid-stride loops (=0) on a batch large enough
    that every wave runs many items (ragged lengths, empty segments included): both against the
    oracle, and lse / probs of the two within fp32 rounding of each other (gradients too, MHA)."""
    rng = Rng(seed, f"kpipe{d}{max_kv}{h_q}{h_kv}")
    case = thd_case(rng, 12_000, h_q, h_kv, d, max_kv, torch.bfloat16, device=dev)
    grads = h_q == h_kv
    results = {}
    for pipe in ("3", "0"):
        with rocm_attn.tuning.override(small_seq_pipe=int(pipe)):
            results[pipe] = check_kernel(case, grads=grads)
    (out1, lse1, probs1, g1), (out0, lse0, probs0, g0) = results["3"], results["0"]
    ctx = str(case)
    finite = torch.isfinite(lse0)
    assert torch.equal(finite, torch.isfinite(lse1)), ctx
    assert_rel("lse pipelined vs plain", lse1[finite], lse0[finite], TOL_KERNEL_F32, ctx)
    assert_rel("probs pipelined vs plain", probs1, probs0, TOL_KERNEL_F32, ctx)
    assert_rel("out pipelined vs plain", out1, out0, low_tol(case.dtype), ctx)
    if grads:
        for name, x, y in zip(("dq", "dk", "dv"), g1, g0):
            assert_rel(f"{name} pipelined vs plain", x, y, low_tol(case.dtype), ctx)


@pytest.mark.parametrize("seed", seeds(1))
@pytest.mark.parametrize("h_q,h_kv", GQA_GROUPS)
@pytest.mark.parametrize("kv", [3, 16], ids=["kv3", "kv16"])
@pytest.mark.parametrize("d", HEAD_DIMS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_kernel_backward_gqa(dev, dtype, d, kv, h_q, h_kv, seed):
    """dq, dk, dv for every group size (2..8: the matrix-unit backward's one-tile kernel; wider:
    its blocked kernel) x head dim x dtype against the float64 oracle, gradients poisoned."""
    rng = Rng(seed, f"kbwdgqa{dtype}{d}{kv}{h_q}{h_kv}")
    case = thd_case(rng, 97, h_q, h_kv, d, kv, dtype, device=dev)
    check_kernel(case, grads=True)


@pytest.mark.parametrize("seed", seeds(1))
@pytest.mark.parametrize("layout", [THD, BSHD])
@pytest.mark.parametrize("h_q,h_kv", [(4, 2), (8, 1), (24, 2)], ids=["g2", "g8", "g12"])
@pytest.mark.parametrize("d", [64, 256])
@pytest.mark.parametrize("dtype", DTYPES)
def test_kernel_backward_gqa_matches_general_kernel(dev, dtype, d, h_q, h_kv, layout, seed):
    """Same forward (matrix units), backward on matrix units (tuning small_seq_mma=3) and on
    the general kernel (=1): both against the oracle and close to each other. g12 takes the
    blocked kernel (one pass per block at d=64, three passes and two head-dim slices at d=256),
    with kv rows outside every segment (THD) or padding rows (BSHD) and two kv heads."""
    rng = Rng(seed, f"kbwdab{dtype}{d}{h_q}{h_kv}{layout}")
    if layout == THD:
        case = thd_case(rng, 151, h_q, h_kv, d, 13, dtype, device=dev, pad_before=2, pad_after=3)
    else:
        case = bshd_case(rng, 151, h_q, h_kv, d, 13, dtype, s_kv=16, device=dev)
    grads = {}
    for mask in ("3", "1"):
        with rocm_attn.tuning.override(small_seq_mma=int(mask)):
            grads[mask] = check_kernel(case, grads=True)[3]
    for name, x, y in zip(("dq", "dk", "dv"), grads["3"], grads["1"]):
        assert_rel(f"{name} mma vs general", x, y, 2 * low_tol(case.dtype), str(case))


@pytest.mark.parametrize("seed", seeds(2))
@pytest.mark.parametrize("layout", [THD, BSHD])
@pytest.mark.parametrize("scale", [None, 3.0], ids=["default_scale", "sharp"])
def test_kernel_forward_gqa_no_probs(dev, layout, scale, seed):
    """return_softmax=False (no probs pointer) and a very sharp softmax (scale 3: most weights
    underflow to 0) on the GQA forward; lse always returned."""
    rng = Rng(seed, f"kgqanoprobs{layout}{scale}")
    if layout == THD:
        case = thd_case(rng, 173, 8, 2, 128, 16, torch.bfloat16, device=dev, scale=scale)
    else:
        case = bshd_case(rng, 173, 8, 2, 128, 16, torch.bfloat16, device=dev, scale=scale)
    q, k, v = case.qkv()
    poison_allocator(dev)
    out, lse = call(case, q, k, v, backend="kernel", return_softmax=False)
    rout, rlse, _, _ = run_ref(case, grads=False)
    tout, _, _, _ = run_op(case, backend="torch", grads=False)
    assert_rel("out", out, rout, max(2 * rel_err(tout, rout), low_tol(case.dtype)), str(case))
    assert_lse(lse, rlse, TOL_KERNEL_F32, str(case))


@pytest.mark.parametrize("seed", seeds(1))
@pytest.mark.parametrize("ratio", [1, 4], ids=["mha", "gqa4"])
@pytest.mark.parametrize("kv", [1, 5, 8, 13, 16])
@pytest.mark.parametrize("d", HEAD_DIMS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_kernel_backward(dev, dtype, d, kv, ratio, seed):
    rng = Rng(seed, f"kbwd{dtype}{d}{kv}{ratio}")
    case = thd_case(rng, 333, 2 * ratio, 2, d, kv, dtype, device=dev)
    check_kernel(case, grads=True)


@pytest.mark.parametrize("seed", seeds(1))
@pytest.mark.parametrize("h_q,h_kv", [(2, 2), (8, 2), (4, 1)], ids=["mha", "gqa4", "mqa"])
@pytest.mark.parametrize("max_kv,s_kv", [(5, 5), (16, 16), (5, 16), (16, 5)],
                         ids=["s5", "s16", "s16_max5", "s5_max16"])
@pytest.mark.parametrize("d", [64, 512])
@pytest.mark.parametrize("dtype", DTYPES)
def test_kernel_bshd(dev, dtype, d, max_kv, s_kv, h_q, h_kv, seed):
    rng = Rng(seed, f"kbshd{dtype}{d}{max_kv}{s_kv}{h_q}{h_kv}")
    case = bshd_case(rng, 257, h_q, h_kv, d, max_kv, dtype, s_kv=s_kv, device=dev)
    _, _, _, (dq, dk, dv) = check_kernel(case)
    pad = torch.arange(s_kv, device=dev).unsqueeze(0) >= case.lens.unsqueeze(1)
    assert (dk[pad] == 0).all() and (dv[pad] == 0).all(), f"BSHD padding rows of dk/dv ({case})"


@pytest.mark.parametrize("seed", seeds(2))
@pytest.mark.parametrize("h_q,h_kv", [(4, 4), (8, 2), (8, 1)], ids=["mha", "gqa4", "mqa"])
@pytest.mark.parametrize("layout", [THD, BSHD])
def test_kernel_strided_fused_qkv(dev, layout, h_q, h_kv, seed):
    """q/k/v are views of one fused projection; backend='kernel' serves them without a copy
    and the gradients land in the fused tensor."""
    rng = Rng(seed, f"kstrided{layout}{h_q}{h_kv}")
    if layout == THD:
        case = thd_case(rng, 301, h_q, h_kv, 128, 11, torch.bfloat16, strided=True, device=dev)
    else:
        case = bshd_case(rng, 301, h_q, h_kv, 128, 11, torch.bfloat16, strided=True, device=dev)
    q, k, v = case.qkv()
    assert not (q.is_contiguous() or k.is_contiguous() or v.is_contiguous())
    _, _, _, (dqkv,) = check_kernel(case)
    if layout == THD:
        assert (dqkv[q.shape[0]:, :h_q] == 0).all() and (dqkv[k.shape[0]:, h_q:] == 0).all()


@pytest.mark.parametrize("seed", seeds(2))
@pytest.mark.parametrize("layout", [THD, BSHD])
def test_kernel_single_segment(dev, layout, seed):
    rng = Rng(seed, f"kone{layout}")
    lens = torch.tensor([7])
    if layout == THD:
        case = thd_case(rng, 1, 8, 2, 128, 7, torch.bfloat16, lens=lens, device=dev)
    else:
        case = bshd_case(rng, 1, 8, 2, 128, 7, torch.bfloat16, lens=lens, device=dev)
    check_kernel(case)


@pytest.mark.parametrize("seed", seeds(1))
@pytest.mark.parametrize("h_q,h_kv", [(2, 2), (2, 1)], ids=["mha", "mqa"])
def test_kernel_50k_segments(dev, h_q, h_kv, seed):
    rng = Rng(seed, f"k50k{h_q}{h_kv}")
    case = thd_case(rng, 50_000, h_q, h_kv, 64, 16, torch.bfloat16, device=dev)
    check_kernel(case)


@pytest.mark.parametrize("seed", seeds(2))
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", [THD, BSHD])
def test_kernel_empty_segments(dev, layout, dtype, seed):
    """Segments without keys: exact zeros (never NaN) for out, probs, dq (and BSHD dk/dv),
    LSE -inf."""
    rng = Rng(seed, f"kempty{layout}{dtype}")
    lens = random_lens(rng, 97, 9)
    lens[rng.randint(0, 97, (40,))] = 0
    if layout == THD:
        case = thd_case(rng, 97, 8, 2, 128, 9, dtype, lens=lens, device=dev)
    else:
        case = bshd_case(rng, 97, 8, 2, 128, 9, dtype, lens=lens, device=dev)
    out, lse, probs, (dq, dk, dv) = check_kernel(case)
    empty = case.lens == 0
    assert torch.isneginf(lse[:, empty]).all()
    assert (out[empty] == 0).all() and (dq[empty] == 0).all()
    if layout == BSHD:
        assert (dk[empty] == 0).all() and (dv[empty] == 0).all()


@pytest.mark.parametrize("layout", [THD, BSHD])
def test_kernel_all_segments_empty(dev, layout):
    rng = Rng(0, f"kallempty{layout}")
    lens = torch.zeros(33, dtype=torch.int64)
    if layout == THD:
        case = thd_case(rng, 33, 4, 2, 64, 4, torch.bfloat16, lens=lens, device=dev)
        assert case.leaves[1].shape[0] == 0
    else:
        case = bshd_case(rng, 33, 4, 2, 64, 4, torch.bfloat16, lens=lens, device=dev)
    out, lse, probs, (dq, dk, dv) = run_kernel(case)
    assert (out == 0).all() and torch.isneginf(lse).all() and (probs == 0).all()
    assert (dq == 0).all() and (dk == 0).all() and (dv == 0).all()


@pytest.mark.parametrize("seed", seeds(2))
@pytest.mark.parametrize("ratio", [1, 4], ids=["mha", "gqa4"])
def test_kernel_kv_tokens_outside_cu_seqlens(dev, ratio, seed):
    """THD k/v rows before cu_seqlens_kv[0] and after cu_seqlens_kv[-1]: exactly zero gradient
    (written by the kernel over poisoned memory), and never read (NaN there changes nothing)."""
    rng = Rng(seed, f"koutside{ratio}")
    case = thd_case(rng, 211, 2 * ratio, 2, 128, 12, torch.bfloat16, pad_before=3, pad_after=5,
                    device=dev)
    _, _, _, (_, dk, dv) = check_kernel(case)
    for x in (dk, dv):
        assert (x[:3] == 0).all() and (x[-5:] == 0).all()
    poisoned = tuple(t.clone() for t in case.leaves)
    for t in poisoned[1:]:
        t[:3] = float("nan")
        t[-5:] = float("inf")
    a = call(case, *poisoned, backend="kernel")
    b = call(case, *case.leaves, backend="kernel")
    for x, y in zip(a, b):
        torch.testing.assert_close(x, y, rtol=0, atol=0)


# --------------------------------------------------------------------------------------------
# kernel vs torch path, determinism
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", seeds(2))
@pytest.mark.parametrize("ratio", [1, 4], ids=["mha", "gqa4"])
@pytest.mark.parametrize("d", [64, 256])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", [THD, BSHD])
def test_kernel_matches_torch_path(dev, layout, dtype, d, ratio, seed):
    rng = Rng(seed, f"kvst{layout}{dtype}{d}{ratio}")
    if layout == THD:
        case = thd_case(rng, 1000, 2 * ratio, 2, d, 16, dtype, device=dev)
    else:
        case = bshd_case(rng, 1000, 2 * ratio, 2, d, 16, dtype, device=dev)
    kout, klse, kprobs, kg = run_kernel(case)
    tout, tlse, tprobs, tg = run_op(case, backend="torch")
    ctx = str(case)
    assert_rel("out kernel vs torch", kout, tout, low_tol(dtype), ctx)
    assert_lse(klse, tlse, TOL_KERNEL_F32, ctx)
    assert_rel("probs kernel vs torch", kprobs, tprobs, TOL_KERNEL_F32, ctx)
    for name, x, t in zip(("dq", "dk", "dv"), kg, tg):
        assert_rel(f"{name} kernel vs torch", x, t, low_tol(dtype), ctx)


@pytest.mark.parametrize("seed", seeds(2))
@pytest.mark.parametrize("d", [128, 512])
@pytest.mark.parametrize("layout", [THD, BSHD])
def test_kernel_deterministic(dev, layout, d, seed):
    """Two runs (GQA, so dk/dv sum over a group) give bitwise-identical outputs and grads."""
    rng = Rng(seed, f"kdet{layout}{d}")
    if layout == THD:
        case = thd_case(rng, 2000, 8, 2, d, 16, torch.bfloat16, device=dev)
    else:
        case = bshd_case(rng, 2000, 8, 2, d, 16, torch.bfloat16, device=dev)
    a = run_kernel(case)
    b = run_kernel(case)
    names = ("out", "lse", "probs", "dq", "dk", "dv")
    for name, x, y in zip(names, a[:3] + tuple(a[3]), b[:3] + tuple(b[3])):
        assert not torch.isnan(x).any(), f"{name} has NaN ({case})"
        assert torch.equal(x, y), f"{name} differs between two runs ({case})"


# --------------------------------------------------------------------------------------------
# contract violations on the device
# --------------------------------------------------------------------------------------------


def _assert_nan_only_at(case, out, lse, probs, bad):
    is_bad = torch.zeros(len(case.lens), dtype=torch.bool, device=out.device)
    is_bad[list(bad)] = True
    ctx = str(case)
    assert torch.isnan(out[is_bad]).all(), f"bad segments must be NaN ({ctx})"
    assert torch.isnan(lse[:, is_bad]).all() and torch.isnan(probs[is_bad]).all(), ctx
    good = ~is_bad
    rout, rlse, rprobs, _ = run_ref(case, grads=False)
    assert_rel("out (good segments)", out[good], rout[good], low_tol(case.dtype), ctx)
    assert_lse(lse[:, good], rlse[:, good], TOL_KERNEL_F32, ctx)
    assert_rel("probs (good segments)", probs[good], rprobs[good], TOL_KERNEL_F32, ctx)


@pytest.mark.parametrize("seed", seeds(2))
@pytest.mark.parametrize("d", [64, 512])
def test_kernel_contract_violation_thd(dev, d, seed, allow_contract_errors):
    rng = Rng(seed, f"kviol{d}")
    b, max_kv, bad = 333, 8, [200, 5, 17]
    lens = random_lens(rng, b, max_kv)
    for i in bad:
        lens[i] = max_kv + 1 + int(rng.randint(0, 3, (1,)))
    case = thd_case(rng, b, 8, 2, d, max_kv, torch.bfloat16, lens=lens, device=dev)
    out, lse, probs, _ = run_kernel(case, grads=False)
    _assert_nan_only_at(case, out, lse, probs, bad)
    with pytest.raises(SmallSeqContractError, match=r"3 segment\(s\).*first bad segment: 5\b"):
        check_errors()
    check_errors()  # reset by the first check
    assert read_errors() == (0, -1)
    # validate="sync" raises at the call
    q, k, v = case.qkv()
    with pytest.raises(SmallSeqContractError, match=r"first bad segment: 5\b"):
        call(case, q, k, v, backend="kernel", validate="sync")
    check_errors()


def test_kernel_contract_violation_out_of_bounds(dev, allow_contract_errors):
    """cu_seqlens_kv past the end of k/v or decreasing: flagged, never read out of bounds, and
    the device stays usable."""
    rng = Rng(0, "koob")
    b = 64
    q = rng.randn(b, 4, 64, dtype=torch.bfloat16, device=dev)
    k = rng.randn(100, 2, 64, dtype=torch.bfloat16, device=dev)
    v = rng.randn(100, 2, 64, dtype=torch.bfloat16, device=dev)
    cu_q = torch.arange(b + 1, dtype=torch.int32, device=dev)
    cu_kv = torch.arange(b + 1, dtype=torch.int32, device=dev)
    cu_kv[-1] = 1000  # last segment: rows 63..999 of 100 (and longer than max_seqlen_kv)
    out = fused_attn_small_seq(q, k, v, cu_q, cu_kv, 1, 16, backend="kernel")
    assert torch.isnan(out[-1]).all() and torch.isfinite(out[:-1]).all()
    last = rf"1 segment\(s\).*first bad segment: {b - 1}\b"
    with pytest.raises(SmallSeqContractError, match=last):
        check_errors()
    cu_kv = torch.arange(b + 1, dtype=torch.int32, device=dev)
    cu_kv[11] = 9  # segment 10 has -1 keys
    out = fused_attn_small_seq(q, k, v, cu_q, cu_kv, 1, 4, backend="kernel")
    assert torch.isnan(out[10]).all()
    with pytest.raises(SmallSeqContractError, match=r"first bad segment: 10\b"):
        check_errors()
    torch.cuda.synchronize()  # no illegal memory access


def test_kernel_contract_violation_bshd(dev, allow_contract_errors):
    """BSHD: seqlens_kv > max_seqlen_kv, negative, or beyond the k/v s_kv dim are flagged."""
    rng = Rng(0, "kbshdviol")
    b, s_kv, max_kv = 50, 6, 8
    lens = random_lens(rng, b, 6)
    lens[31], lens[12], lens[40] = 9, -2, 7  # > max_kv, negative, s_kv < 7 <= max_kv
    case = bshd_case(rng, b, 4, 2, 64, max_kv, torch.bfloat16, s_kv=s_kv, lens=lens, device=dev)
    out, lse, probs, _ = run_kernel(case, grads=False)
    bad = torch.tensor([12, 31, 40], device=dev)
    assert torch.isnan(out[bad]).all() and torch.isnan(lse[:, bad]).all()
    good = torch.ones(b, dtype=torch.bool, device=dev)
    good[bad] = False
    assert torch.isfinite(out[good]).all()
    with pytest.raises(SmallSeqContractError, match=r"3 segment\(s\).*first bad segment: 12\b"):
        check_errors()


# --------------------------------------------------------------------------------------------
# dispatch: what the kernels serve, fallbacks, host-side errors on the device
# --------------------------------------------------------------------------------------------


def _aligned_case(dev, dtype=torch.bfloat16, d=64, seed=0):
    return thd_case(Rng(seed, f"disp{dtype}{d}"), 40, 4, 2, d, 8, dtype, device=dev)


@pytest.mark.parametrize("dtype,d,match", [
    (torch.float32, 64, "dtype"),
    (torch.bfloat16, 40, "head dim"),
    (torch.float16, 96, "head dim"),
])
def test_auto_falls_back_to_torch_path(dev, dtype, d, match, monkeypatch):
    """What the kernels do not serve runs on the torch path with backend='auto' (and is
    correct); backend='kernel' refuses it with a ValueError saying why."""
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)  # fp32 bound 1e-5
    case = _aligned_case(dev, dtype, d)
    q, k, v = case.qkv()
    with pytest.raises(ValueError, match=match):
        call(case, q, k, v, backend="kernel")
    out, lse, probs, g = run_op(case, backend="auto")
    rout, rlse, rprobs, rg = run_ref(case)
    tol = TOL_LOW.get(dtype, TOL_FP32)
    assert_rel("out", out, rout, tol, str(case))
    assert_lse(lse, rlse, TOL_FP32, str(case))
    for x, r in zip(g, rg):
        assert_rel("grad", x, r, tol, str(case))


def _misaligned_views(case, how):
    """Copies of q/k/v that the kernels cannot read with 16-byte vectors."""
    out = []
    for t in case.leaves:
        if how == "stride":  # token/head strides not a multiple of 8 elements
            wide = torch.zeros(t.shape[:-1] + (t.shape[-1] + 1,), dtype=t.dtype, device=t.device)
            wide[..., : t.shape[-1]] = t
            out.append(wide[..., : t.shape[-1]])
        else:  # data pointer 2 bytes past a 16-byte boundary
            flat = torch.zeros(t.numel() + 8, dtype=t.dtype, device=t.device)
            view = flat[1: 1 + t.numel()].view(t.shape)
            view.copy_(t)
            out.append(view)
    return out


@pytest.mark.parametrize("how,match", [("stride", "stride"), ("pointer", "16-byte aligned")])
def test_misaligned_inputs(dev, how, match):
    case = _aligned_case(dev)
    q, k, v = _misaligned_views(case, how)
    with pytest.raises(ValueError, match=match):
        call(case, q, k, v, backend="kernel")
    out, lse, probs = call(case, q, k, v, backend="auto")  # torch path
    rout, rlse, rprobs, _ = run_ref(case, grads=False)
    assert_rel("out", out, rout, low_tol(case.dtype), str(case))
    assert_rel("probs", probs, rprobs, TOL_FP32, str(case))


def test_index_tensors_on_another_device(dev):
    case = _aligned_case(dev)
    q, k, v = case.qkv()
    with pytest.raises(ValueError, match="cu_seqlens_q"):
        fused_attn_small_seq(q, k, v, case.cu_q.cpu(), case.cu_kv, 1, 8)
    with pytest.raises(ValueError, match="cu_seqlens_kv"):
        fused_attn_small_seq(q, k, v, case.cu_q, case.cu_kv.cpu(), 1, 8)
    with pytest.raises(ValueError, match="device"):
        fused_attn_small_seq(q, k.cpu(), v.cpu(), case.cu_q, case.cu_kv, 1, 8)


def test_noncontiguous_cu_seqlens(dev):
    """A strided int32 cu_seqlens_kv either works or is refused with a ValueError naming it
    (never a RuntimeError from the C++ check)."""
    case = _aligned_case(dev)
    q, k, v = case.qkv()
    wide = torch.zeros(2 * case.cu_kv.numel(), dtype=torch.int32, device=dev)
    wide[::2] = case.cu_kv
    cu_kv = wide[::2]
    assert not cu_kv.is_contiguous()
    try:
        out, lse, probs = fused_attn_small_seq(q, k, v, case.cu_q, cu_kv, 1, 8, return_lse=True,
                                               return_softmax=True)
    except ValueError as exc:  # acceptable: a clear host-side error
        assert "cu_seqlens_kv" in str(exc)
        return
    rout, _, rprobs, _ = run_ref(case, grads=False)
    assert_rel("out", out, rout, low_tol(case.dtype), str(case))


# --------------------------------------------------------------------------------------------
# torch.compile, CUDA graphs, opcheck
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("layout", [THD, BSHD])
def test_torch_compile_kernel(dev, layout):
    """torch.compile(fullgraph=True) through the custom op (fake impl + autograd): forward and
    backward bitwise equal to eager; a second batch size (dynamic shapes) too."""
    import torch._dynamo

    torch._dynamo.reset()

    def fn(q, k, v, cu_q, cu_kv, seqlens, max_kv):
        return fused_attn_small_seq(q, k, v, cu_q, cu_kv, 1, max_kv, qkv_layout=layout,
                                    seqlens_kv=seqlens, return_lse=True, return_softmax=True,
                                    backend="kernel")

    compiled = torch.compile(fn, fullgraph=True)
    for b in (301, 177):
        rng = Rng(b, f"kcompile{layout}")
        if layout == THD:
            case = thd_case(rng, b, 8, 2, 128, 16, torch.bfloat16, device=dev)
        else:
            case = bshd_case(rng, b, 8, 2, 128, 16, torch.bfloat16, device=dev)
        lc = tuple(t.detach().clone().requires_grad_() for t in case.leaves)
        le = tuple(t.detach().clone().requires_grad_() for t in case.leaves)
        rc = compiled(*lc, case.cu_q, case.cu_kv, case.seqlens, case.max_kv)
        re = fn(*le, case.cu_q, case.cu_kv, case.seqlens, case.max_kv)
        for name, x, y in zip(("out", "lse", "probs"), rc, re):
            torch.testing.assert_close(x, y, rtol=0, atol=0, msg=f"{name}: compiled != eager")
        rc[0].backward(case.dout)
        re[0].backward(case.dout)
        for name, x, y in zip(("dq", "dk", "dv"), lc, le):
            torch.testing.assert_close(x.grad, y.grad, rtol=0, atol=0,
                                       msg=f"{name}: compiled != eager")
        rout, _, _, rg = run_ref(case)
        assert_rel("out (compiled)", rc[0], rout, low_tol(case.dtype), str(case))
        for x, r in zip(lc, rg):
            assert_rel("grad (compiled)", x.grad, r, low_tol(case.dtype), str(case))


def test_torch_compile_auto_misaligned_strides(dev):
    """Under torch.compile, backend='auto' still sees static strides that the kernels cannot
    read (not multiples of 8 elements) and takes the torch path, like eager."""
    import torch._dynamo

    torch._dynamo.reset()
    case = _aligned_case(dev)
    q, k, v = _misaligned_views(case, "stride")

    def fn(q, k, v, cu_q, cu_kv):
        return fused_attn_small_seq(q, k, v, cu_q, cu_kv, 1, case.max_kv)

    out = torch.compile(fn, fullgraph=True)(q, k, v, case.cu_q, case.cu_kv)
    torch.testing.assert_close(out, fn(q, k, v, case.cu_q, case.cu_kv), rtol=1e-2, atol=1e-2)


def test_torch_compile_kernel_counts_contract_violations(dev, allow_contract_errors):
    """The device error counter works inside a compiled graph too."""
    import torch._dynamo

    torch._dynamo.reset()
    rng = Rng(0, "kcompileviol")
    lens = random_lens(rng, 64, 4)
    lens[9], lens[30] = 6, 5  # > max_seqlen_kv = 4
    case = thd_case(rng, 64, 4, 2, 64, 4, torch.bfloat16, lens=lens, device=dev)

    def fn(q, k, v, cu_q, cu_kv):
        return fused_attn_small_seq(q, k, v, cu_q, cu_kv, 1, 4, backend="kernel")

    out = torch.compile(fn, fullgraph=True)(*case.leaves, case.cu_q, case.cu_kv)
    assert torch.isnan(out[[9, 30]]).all()
    good = torch.ones(64, dtype=torch.bool, device=dev)
    good[[9, 30]] = False
    assert torch.isfinite(out[good]).all()
    with pytest.raises(SmallSeqContractError, match=r"2 segment\(s\).*first bad segment: 9\b"):
        check_errors()


@pytest.mark.parametrize("layout", [THD, BSHD])
def test_cuda_graph_capture(dev, layout):
    """Capture forward + backward in a CUDA graph with static inputs; replay with new values
    (including new device-side lengths) copied into them; bitwise equal to eager."""
    b, max_kv = 500, 16

    def make(seed):
        rng = Rng(seed, f"kgraph{layout}")
        lens = random_lens(rng, b, max_kv)
        if layout == THD:  # fixed k/v size: rows past cu_seqlens_kv[-1] belong to no segment
            return thd_case(rng, b, 8, 2, 128, max_kv, torch.bfloat16, lens=lens,
                            pad_after=b * max_kv - int(lens.sum()), device=dev)
        return bshd_case(rng, b, 8, 2, 128, max_kv, torch.bfloat16, lens=lens, device=dev)

    first, second = make(0), make(1)
    static = tuple(t.detach().clone().requires_grad_() for t in first.leaves)
    index = first.cu_kv.clone() if layout == THD else first.seqlens.clone()
    dout = first.dout.clone()

    def step():
        cu_kv, seqlens = (index, None) if layout == THD else (None, index)
        out, lse, probs = fused_attn_small_seq(
            *static, first.cu_q, cu_kv, 1, max_kv, qkv_layout=layout, seqlens_kv=seqlens,
            return_lse=True, return_softmax=True, backend="kernel", validate=False)
        return (out, lse, probs) + torch.autograd.grad(out, static, dout)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = step()

    for case in (second, first, second):
        with torch.no_grad():
            for s, t in zip(static, case.leaves):
                s.copy_(t)
            index.copy_(case.cu_kv if layout == THD else case.seqlens)
            dout.copy_(case.dout)
        poison_allocator(dev)
        graph.replay()
        torch.cuda.synchronize()
        eager = run_kernel(case, poison=False)
        eager = eager[:3] + tuple(eager[3])
        for name, x, y in zip(("out", "lse", "probs", "dq", "dk", "dv"), captured, eager):
            torch.testing.assert_close(x, y, rtol=0, atol=0, msg=f"{name}: graph != eager")
    del graph


def _plans(q, k, max_kv):
    """The op's plan and backward_plan for a call (as lists, the schema's int[])."""
    return tuple(list(p) for p in small_seq_plan.one_query_plans(q, k, max_kv))


def _opcheck_case(dev, layout, seed=0):
    rng = Rng(seed, f"opcheck{layout}")
    if layout == THD:
        return thd_case(rng, 17, 4, 2, 64, 5, torch.bfloat16, device=dev)
    return bshd_case(rng, 17, 4, 2, 64, 5, torch.bfloat16, device=dev)


@pytest.mark.parametrize("return_softmax", [False, True])
@pytest.mark.parametrize("layout", [THD, BSHD])
def test_opcheck_fwd(dev, layout, return_softmax):
    case = _opcheck_case(dev, layout)
    q, k, v = (t.detach().clone().requires_grad_() for t in case.leaves)
    args = (q, k, v, case.cu_q, case.cu_kv, case.seqlens, case.max_kv, 0.125, return_softmax,
            *_plans(q, k, case.max_kv))
    torch.library.opcheck(torch.ops.rocm_attn.small_seq_fwd.default, args)


@pytest.mark.parametrize("layout", [THD, BSHD])
def test_opcheck_bwd(dev, layout):
    case = _opcheck_case(dev, layout)
    q, k, v = case.leaves
    plan, backward_plan = _plans(q, k, case.max_kv)
    out, lse, _ = torch.ops.rocm_attn.small_seq_fwd(q, k, v, case.cu_q, case.cu_kv, case.seqlens,
                                                    case.max_kv, 0.125, False, plan, backward_plan)
    dlse = torch.randn_like(lse)
    args = (case.dout, q, k, v, out, lse, dlse, case.cu_q, case.cu_kv, case.seqlens, case.max_kv,
            0.125, backward_plan)
    torch.library.opcheck(torch.ops.rocm_attn.small_seq_bwd.default, args)


@pytest.mark.parametrize("loss_on", ["out", "lse", "both"])
@pytest.mark.parametrize("group", [1, 4])
def test_lse_gradient_matches_torch_path(dev, group, loss_on):
    """A loss on out, on lse, or on both (as when partial results are merged) backpropagates
    the same on the kernel and on the torch path (float64 reference). The kernels' autograd is
    C++ (the op's Autograd kernel): an output the loss does not use gets no zero-filled
    gradient, and the result is the same."""
    torch.manual_seed(1234 + group + 10 * len(loss_on))
    b, h_kv, d, max_kv = 257, 2, 128, 16
    h_q = h_kv * group
    lens = torch.randint(0, max_kv + 1, (b,), dtype=torch.int32)
    cu_kv = torch.nn.functional.pad(lens.cumsum(0, dtype=torch.int32), (1, 0)).to(dev)
    cu_q = torch.arange(b + 1, dtype=torch.int32, device=dev)
    total = int(cu_kv[-1])
    base = [torch.randn(b, h_q, d), torch.randn(total, h_kv, d), torch.randn(total, h_kv, d)]
    wo, wl = torch.randn(b, h_q, d), torch.randn(h_q, b)
    grads = {}
    for backend, dtype in (("kernel", torch.bfloat16), ("torch", torch.float64)):
        leaves = [t.to(dev, dtype).requires_grad_() for t in base]
        out, lse = fused_attn_small_seq(*leaves, cu_q, cu_kv, 1, max_kv, return_lse=True,
                                        backend=backend)
        finite = torch.isfinite(lse)
        loss = 0
        if loss_on in ("out", "both"):
            loss = loss + (out.double() * wo.to(dev).double()).sum()
        if loss_on in ("lse", "both"):
            loss = loss + torch.where(finite, lse.double() * wl.to(dev).double(),
                                      torch.zeros_like(lse, dtype=torch.float64)).sum()
        # allow_unused: the LSE does not depend on v (loss on lse only)
        grads[backend] = torch.autograd.grad(loss, leaves, allow_unused=True)
    for name, got, ref in zip("qkv", grads["kernel"], grads["torch"]):
        if ref is None:  # no dependence: the kernels' gradient is exactly zero
            assert got is None or torch.count_nonzero(got) == 0, f"d{name} should be zero"
            continue
        err = ((got.double() - ref).norm() / ref.norm()).item()
        assert err == err and err < 2e-2, f"d{name} rel err {err}"


def test_second_derivative_raises(dev):
    """The kernels' backward has no derivative: gradients taken with create_graph=True raise
    when differentiated, instead of treating the backward as constant."""
    rng = Rng(0, "second_derivative")
    case = thd_case(rng, 301, 8, 2, 128, 13, torch.bfloat16, device=dev)
    leaves = [t.detach().clone().requires_grad_() for t in case.leaves]
    out = fused_attn_small_seq(*leaves, case.cu_q, case.cu_kv, 1, case.max_kv)
    (dq,) = torch.autograd.grad(out.float().sum(), leaves[0], create_graph=True)
    with pytest.raises(RuntimeError, match="no second derivative"):
        torch.autograd.grad(dq.float().sum(), leaves[0])


def test_calls_without_gradients_skip_autograd_and_match(dev):
    """Inference calls (no input needs a gradient, or grad mode off) take the op below the
    autograd layer (ops.small_seq_forward): bit-identical results, no graph; a call whose
    inputs need gradients still builds one and backpropagates."""
    rng = Rng(0, "noautograd")
    case = thd_case(rng, 301, 8, 2, 128, 13, torch.bfloat16, device=dev)
    q, k, v = (t.detach() for t in case.leaves)
    args = (case.cu_q, case.cu_kv, 1, case.max_kv)
    plain = fused_attn_small_seq(q, k, v, *args, return_lse=True)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    with torch.no_grad():
        no_grad = fused_attn_small_seq(*leaves, *args, return_lse=True)
    graph = fused_attn_small_seq(*leaves, *args, return_lse=True)
    for a, b, c in zip(plain, no_grad, graph):
        assert torch.equal(a, b) and torch.equal(a, c.detach())
    assert not any(t.requires_grad for t in plain + no_grad)
    assert graph[0].requires_grad and graph[0].grad_fn is not None
    grads = torch.autograd.grad(graph[0].float().sum(), leaves)
    assert all(torch.isfinite(g).all() for g in grads)


def test_direct_entry_point_matches_op(dev):
    """rocm_attn._C.small_seq_fwd_direct (the no-autograd eager path) is the op's C++ function
    without the dispatcher: bit-identical outputs, the op's checks (RuntimeError), and None for
    arguments it does not take (tensor subclasses, non-float scale), which go to the op."""
    from rocm_attn import _C

    rng = Rng(0, "direct")
    case = thd_case(rng, 301, 8, 2, 128, 13, torch.bfloat16, device=dev)
    q, k, v = case.leaves
    plans = small_seq_plan.one_query_plans(q, k, case.max_kv)
    args = (q, k, v, case.cu_q, case.cu_kv, None, case.max_kv, 0.125, True, *plans)
    direct = _C.small_seq_fwd_direct(*args)
    with torch._C._AutoDispatchBelowAutograd():
        via_op = torch.ops.rocm_attn.small_seq_fwd.default(*args)
    for a, b in zip(direct, via_op):
        assert torch.equal(a, b)

    class Sub(torch.Tensor):
        pass

    assert _C.small_seq_fwd_direct(q.as_subclass(Sub), *args[1:]) is None
    assert _C.small_seq_fwd_direct(*args[:7], 1, True, *plans) is None  # int scale: the op's
    assert _C.small_seq_fwd_direct(*args[:9], iter(plans[0]), plans[1]) is None  # not a sequence
    assert _C.small_seq_fwd_direct(*args[:9], plans[0], (1.0,)) is None  # not ints
    lists = _C.small_seq_fwd_direct(*args[:9], *(list(p) for p in plans))
    assert all(torch.equal(a, b) for a, b in zip(lists, direct))
    with pytest.raises(RuntimeError, match="cu_seqlens_kv"):
        _C.small_seq_fwd_direct(q, k, v, case.cu_q, case.cu_kv.long(), None, case.max_kv, 0.125,
                                False, *plans)
    with pytest.raises(RuntimeError, match="no kernel for the plan"):
        _C.small_seq_fwd_direct(*args[:9], plans[1], plans[1])  # the backward's kernel


def _record(kernel, *params):
    """A one-launch plan of kernel (small_seq_plan.KERNEL_IDS), params in LAUNCH_PARAMS order."""
    ints = [small_seq_plan.KERNEL_IDS[kernel], *params]
    return [1, 0] + ints + [0] * (small_seq_plan.LAUNCH_INTS - len(ints))


@pytest.mark.parametrize("direction,h_q,d,max_kv,plan,word", [
    # (h_kv 2: h_q 2 is one q head per kv head, 8 a GQA group of 4)
    # a record of another direction's kernel, or a tiled kernel's
    ("fwd", 8, 128, 13, _record("bwd", 128, 16, 0, 4), "no kernel for the plan"),
    ("bwd", 8, 128, 13, _record("fwd_mma", 128, 16, 4), "no kernel for the plan"),
    ("fwd", 8, 128, 13, _record("tiled_fwd_wave", 128, 16, 4), "no kernel for the plan"),
    # records that do not fit the call
    ("fwd", 8, 128, 13, _record("fwd", 64, 16, 0, 4), "does not fit"),          # head dim
    ("fwd", 8, 128, 13, _record("fwd", 128, 8, 0, 4), "does not fit"),          # kv bucket < 13
    ("fwd", 8, 128, 13, _record("fwd", 128, 12, 0, 4), "does not fit"),         # no such bucket
    ("fwd", 8, 128, 13, _record("fwd", 128, 16, 1, 4), "does not fit"),         # PIPE, group 4
    ("fwd", 2, 512, 13, _record("fwd", 512, 16, 1, 4), "does not fit"),         # not pipelinable
    ("fwd", 2, 128, 13, _record("fwd", 128, 16, 2, 4), "does not fit"),         # PIPE not 0 / 1
    ("fwd", 2, 128, 13, _record("fwd_mma", 128, 16, 4), "does not fit"),        # group 1
    ("fwd", 2, 128, 13, _record("fwd", 128, 16, 0, -1), "does not fit"),        # grid factor
    ("bwd", 2, 128, 13, _record("bwd_mma", 128, 16, 4), "does not fit"),        # group 1
    ("bwd", 32, 128, 13, _record("bwd_mma", 128, 16, 4), "does not fit"),       # group 16 > 8
    ("bwd", 16, 128, 13, _record("bwd_mma_wide", 128, 16, 4), "does not fit"),  # group 8
    ("bwd", 8, 128, 13, _record("bwd", 128, 16, 1, 4), "does not fit"),         # PIPE, group 4
    ("fwd", 2, 128, 13, [1, 0, 40, 128], "plan must be the ints"),
    ("fwd", 2, 128, 13, [2, 0] + _record("fwd", 128, 16, 0, 4)[2:] * 2, "does not fit"),
])
def test_invalid_plans_raise(dev, direction, h_q, d, max_kv, plan, word):
    """A plan the launcher cannot run as given (another direction's kernel, another head dim, a
    kv bucket that does not hold the history, a kernel of another GQA group, PIPE where the
    variant has no pipelined loop) raises naming the plan and launches nothing."""
    rng = Rng(0, "badplan")
    case = thd_case(rng, 301, h_q, 2, d, max_kv, torch.bfloat16, device=dev)
    q, k, v = (t.detach() for t in case.leaves)
    good = small_seq_plan.one_query_plans(q, k, max_kv)
    args = (q, k, v, case.cu_q, case.cu_kv, None, max_kv, 0.125)
    torch.cuda.synchronize()
    with pytest.raises(RuntimeError, match=word) as info:
        if direction == "fwd":
            torch.ops.rocm_attn.small_seq_fwd(*args, False, plan, list(good[1]))
        else:
            out, lse, _ = torch.ops.rocm_attn.small_seq_fwd(*args, False, *map(list, good))
            torch.ops.rocm_attn.small_seq_bwd(case.dout, q, k, v, out, lse, None, case.cu_q,
                                              case.cu_kv, None, max_kv, 0.125, plan)
    assert str(plan).replace(" ", "")[:-1] in str(info.value).replace(" ", ""), str(info.value)
    torch.cuda.synchronize()  # nothing launched that faults


def test_autograd_runs_the_backward_plan(dev):
    """The op's C++ autograd runs the backward_plan its forward was given (saved at the
    forward): a backward_plan that does not fit raises at backward, naming that plan."""
    rng = Rng(0, "autogradplan")
    case = thd_case(rng, 301, 8, 2, 128, 13, torch.bfloat16, device=dev)
    leaves = [t.detach().clone().requires_grad_() for t in case.leaves]
    plan, _ = small_seq_plan.one_query_plans(leaves[0], leaves[1], case.max_kv)
    bad = _record("bwd", 128, 16, 1, 4)  # PIPE at group 4
    out, _, _ = torch.ops.rocm_attn.small_seq_fwd(*leaves, case.cu_q, case.cu_kv, None,
                                                  case.max_kv, 0.125, False, list(plan), bad)
    with pytest.raises(RuntimeError, match="does not fit"):
        out.float().sum().backward()


def test_modes_and_profiler_see_the_op(dev):
    """The direct entry point stands in for the op only when nothing could watch the dispatch:
    a TorchDispatchMode and the profiler both still see rocm_attn::small_seq_fwd."""
    from torch.utils._python_dispatch import TorchDispatchMode

    rng = Rng(0, "modes")
    case = thd_case(rng, 64, 4, 4, 64, 8, torch.bfloat16, device=dev)
    q, k, v = case.leaves
    call = lambda: fused_attn_small_seq(q, k, v, case.cu_q, case.cu_kv, 1, case.max_kv)  # noqa: E731
    expected = call()

    class Record(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.names = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.names.append(str(func))
            return func(*args, **(kwargs or {}))

    with Record() as mode:
        got = call()
    assert any("small_seq_fwd" in name for name in mode.names), mode.names
    assert torch.equal(got, expected)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        call()
    assert any("small_seq_fwd" in e.key for e in prof.key_averages())


def _on_gpu(value, dev):
    """A CPU bad-input case moved to the GPU: same strides (views stay non-contiguous), 16-bit
    kernel dtypes (float32 -> bf16, bf16 -> fp16, so dtype mismatches stay mismatches); meta
    tensors stay meta (dtype mapped alike), non-tensors as they are."""
    if not isinstance(value, torch.Tensor):
        return value
    dtype = {torch.float32: torch.bfloat16, torch.bfloat16: torch.float16}.get(value.dtype,
                                                                             value.dtype)
    if value.device.type == "meta":
        return value.to(dtype)
    out = torch.empty_strided(value.shape, value.stride(), dtype=dtype, device=dev)
    return out.copy_(value)


@pytest.mark.parametrize("base,change,match", [
    pytest.param("thd", c, m, id=f"thd-{i}") for i, c, m in test_small_seq.THD_BAD] + [
    pytest.param("bshd", c, m, id=f"bshd-{i}") for i, c, m in test_small_seq.BSHD_BAD])
def test_bad_input_after_kernel_calls(dev, base, change, match, monkeypatch):
    """Once the kernels have served a call shape, later calls of that shape go to the op first
    and only its C++ checks guard them (small_seq._kernels_unchecked). Every bad input of the
    CPU suite, moved to the GPU, still raises the ValueError naming the argument; and the
    good call does skip the checked path."""
    from rocm_attn import small_seq

    good = (test_small_seq._good_thd_args if base == "thd" else test_small_seq._good_bshd_args)()
    args = {name: _on_gpu(value, dev) for name, value in good.items()}
    pos, kw = test_small_seq._call_args(args)
    expected = fused_attn_small_seq(*pos, **kw)  # the checked path; serves this shape
    with monkeypatch.context() as m:
        m.setattr(small_seq, "_checked_call", None)  # a call that reaches it fails
        torch.testing.assert_close(fused_attn_small_seq(*pos, **kw), expected, rtol=0, atol=0)
    args.update({name: _on_gpu(value, dev) for name, value in change.items()})
    pos, kw = test_small_seq._call_args(args)
    with pytest.raises(ValueError, match=match):
        fused_attn_small_seq(*pos, **kw)


# ---------------------------------------------------------------- C++ checks of the raw ops

_RAW_OP_PROBE = """
import sys, torch, rocm_attn
q = torch.randn(4, 2, 64, device="cuda", dtype=torch.bfloat16)
k = torch.randn(8, 2, 64, device="cuda", dtype=torch.bfloat16)
cu = torch.arange(5, dtype=torch.int32, device="cuda")
q72 = torch.randn(4, 2, 72, device="cuda", dtype=torch.bfloat16)
k128 = torch.randn(8, 2, 128, device="cuda", dtype=torch.bfloat16)
fwd = torch.ops.rocm_attn.small_seq_fwd
P = [list(p) for p in rocm_attn.small_seq_plan.one_query_plans(q, k, 4)]
calls = {
    "max_seqlen_kv": lambda: fwd(q, k, k, cu, cu, None, 40, 1.0, False, *P),
    "k head dim": lambda: fwd(q, k128, k128, cu, cu, None, 4, 1.0, False, *P),
    "head dim": lambda: fwd(q72, q72, q72, cu, cu, None, 4, 1.0, False, *P),
    "cu_seqlens_kv": lambda: fwd(q, k, k, cu, cu.long(), None, 4, 1.0, False, *P),
    "plan": lambda: fwd(q, k, k, cu, cu, None, 4, 1.0, False, [1, 0, 40], P[1]),
}
word = sys.argv[1]
try:
    calls[word]()
    print("no error for", word)
    sys.exit(1)
except RuntimeError as e:
    assert word in str(e), (word, str(e))
print("RAISED")
"""


@pytest.mark.parametrize("word", ["max_seqlen_kv", "k head dim", "head dim", "cu_seqlens_kv",
                                  "plan"])
def test_raw_op_checks_raise_not_crash(word):
    """Direct torch.ops callers get a RuntimeError naming the argument; each in a subprocess so
    that a crash fails one case. (On the GPU image, checks whose message held a number
    segfaulted while the extension carried its own static libstdc++: setup.py
    loaded_libstdcxx.)"""
    import subprocess

    # the rocm_attn this process imported (the checkout, or an installed wheel), not the tree
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [os.path.dirname(os.path.dirname(os.path.abspath(rocm_attn.__file__)))] +
        [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    r = subprocess.run([sys.executable, "-c", _RAW_OP_PROBE, word], capture_output=True,
                       text=True, env=env, timeout=300)
    assert r.returncode == 0 and "RAISED" in r.stdout, (r.returncode, r.stdout, r.stderr[-2000:])
