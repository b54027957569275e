"""Tests of rocm_attn.fused_attn_small_seq that run without a GPU (the torch path).

Every numerical check compares against the float64 oracle ``reference_small_seq`` (for THD, on
a padded copy built by index-gathering the k/v rows, so reference gradients flow back to the
original k/v) with the relative error ||x - ref|| / ||ref||.

Inputs are fresh random values on every run: each test takes a seed index as a parameter and
derives its seed from a per-run base seed, printed in every failure message. Re-run a failure
with ``ROCM_ATTN_TEST_SEED=<base seed>``.

GPU (kernel) tests live in tests/test_small_seq_gpu.py.
"""

from __future__ import annotations

import inspect
import math
import os
import time
from typing import Callable, Optional, Sequence, Tuple

import pytest
import torch

import rocm_attn
from rocm_attn import SmallSeqContractError, check_errors, fused_attn_small_seq
from rocm_attn import small_seq_torch
from rocm_attn.errors import read_errors
from rocm_attn.reference import reference_small_seq

BASE_SEED = int(os.environ.get("ROCM_ATTN_TEST_SEED", str(time.time_ns() % (2**31 - 1))))

THD = "thd_thd_thd"
BSHD = "bshd_bshd_bshd"

# Relative-error bounds against the float64 oracle.
TOL_FP32 = 1e-5  # fp32 torch path: out, lse, probs, grads; also lse/probs of every dtype
TOL_LOW = {torch.bfloat16: 1e-2, torch.float16: 5e-3}  # rounding of a 16-bit output / grad

GQA = [
    pytest.param(2, 2, id="mha"),
    pytest.param(4, 2, id="gqa2"),
    pytest.param(8, 2, id="gqa4"),
    pytest.param(4, 1, id="mqa"),
]


def seeds(n: int):
    return [pytest.param(i, id=f"seed{i}") for i in range(n)]


# --------------------------------------------------------------------------------------------
# fixtures and helpers
# --------------------------------------------------------------------------------------------


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """The inputs here are tiny: intra-op threads only add synchronisation (tens of ms per op
    on a busy 2-core runner). Restored afterwards."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(autouse=True)
def _error_counter(request, monkeypatch):
    """Start every test with a clean error counter and no ROCM_ATTN_VALIDATE; afterwards, a
    test that did not ask for `allow_contract_errors` must not have tripped the counter (an
    empty segment, GQA, strides... are all inside the contract)."""
    monkeypatch.delenv("ROCM_ATTN_VALIDATE", raising=False)
    read_errors(reset=True)
    yield
    count, first = read_errors(reset=True)
    if "allow_contract_errors" not in request.fixturenames:
        assert count == 0, f"valid inputs tripped the error counter: {count} (first {first})"


@pytest.fixture
def allow_contract_errors():
    """Marks a test that breaks the contract on purpose."""
    return True


class Rng:
    """Seeded CPU generator; tensors are drawn on the CPU and moved, so a seed means the same
    inputs on every device."""

    def __init__(self, index: int, salt: str = ""):
        self.seed = (BASE_SEED + 1_000_003 * index + sum(map(ord, salt)) * 7919) % (2**31 - 1)
        self.gen = torch.Generator().manual_seed(self.seed)

    def randn(self, *shape, dtype=torch.float32, device="cpu"):
        return torch.randn(*shape, generator=self.gen).to(dtype).to(device)

    def randint(self, low, high, shape):
        return torch.randint(low, high, shape, generator=self.gen)

    def __str__(self):
        return f"seed={self.seed}, ROCM_ATTN_TEST_SEED={BASE_SEED}"


def random_lens(rng: Rng, b: int, max_kv: int, *, with_empty: bool = True) -> torch.Tensor:
    """int64 [b] lengths in 0..max_kv with (when b allows) one segment at exactly max_kv and one
    empty segment, at random positions."""
    lens = rng.randint(0, max_kv + 1, (b,))
    perm = torch.randperm(b, generator=rng.gen)
    lens[perm[0]] = max_kv
    if with_empty and b > 1:
        lens[perm[1]] = 0
    return lens


class Case:
    """One call of fused_attn_small_seq: leaf tensors (the q/k/v themselves or a fused qkv
    projection they are views of), how to build q/k/v from them, and the index tensors."""

    def __init__(self, layout, leaves, make, cu_q, cu_kv, seqlens, lens, max_kv, dout, rng,
                 scale=None):
        self.layout = layout
        self.leaves: Tuple[torch.Tensor, ...] = leaves
        self.make: Callable = make
        self.cu_q, self.cu_kv, self.seqlens = cu_q, cu_kv, seqlens
        self.lens = lens  # int64 [b], the reference's lengths
        self.max_kv = max_kv
        self.dout = dout
        self.rng = rng
        self.scale = scale

    @property
    def dtype(self):
        return self.leaves[0].dtype

    def qkv(self, leaves=None):
        return self.make(*(self.leaves if leaves is None else leaves))

    def __str__(self):
        q, k, _ = self.qkv()
        return (f"{self.layout} q{tuple(q.shape)} k{tuple(k.shape)} {self.dtype} "
                f"max_kv={self.max_kv} {self.rng}")


def thd_case(rng: Rng, b: int, h_q: int, h_kv: int, d: int, max_kv: int, dtype, *,
             lens: Optional[torch.Tensor] = None, strided: bool = False, pad_before: int = 0,
             pad_after: int = 0, device="cpu", scale=None) -> Case:
    """THD case; k/v have `pad_before` rows before cu_seqlens_kv[0] and `pad_after` after
    cu_seqlens_kv[-1] that belong to no segment. `strided`: q/k/v are views of one fused
    [rows, h_q + 2 h_kv, d] projection."""
    if lens is None:
        lens = random_lens(rng, b, max_kv)
    lens = lens.to(torch.int64)
    cu_kv = torch.zeros(b + 1, dtype=torch.int64)
    cu_kv[1:] = torch.cumsum(lens, 0)
    cu_kv += pad_before
    total = pad_before + int(lens.sum()) + pad_after
    if strided:
        rows = max(b, total)
        leaves = (rng.randn(rows, h_q + 2 * h_kv, d, dtype=dtype, device=device),)

        def make(qkv):
            return (qkv[:b, :h_q], qkv[:total, h_q:h_q + h_kv], qkv[:total, h_q + h_kv:])
    else:
        leaves = (rng.randn(b, h_q, d, dtype=dtype, device=device),
                  rng.randn(total, h_kv, d, dtype=dtype, device=device),
                  rng.randn(total, h_kv, d, dtype=dtype, device=device))

        def make(q, k, v):
            return q, k, v
    cu_q = torch.arange(b + 1, dtype=torch.int32, device=device)
    dout = rng.randn(b, h_q, d, dtype=dtype, device=device)
    return Case(THD, leaves, make, cu_q, cu_kv.to(torch.int32).to(device), None,
                lens.to(device), max_kv, dout, rng, scale)


def bshd_case(rng: Rng, b: int, h_q: int, h_kv: int, d: int, max_kv: int, dtype, *,
              s_kv: Optional[int] = None, lens: Optional[torch.Tensor] = None,
              strided: bool = False, device="cpu", scale=None) -> Case:
    """BSHD case: q [b,1,h_q,d], k/v [b,s_kv,h_kv,d] (s_kv defaults to max_kv)."""
    s_kv = max_kv if s_kv is None else s_kv
    if lens is None:
        lens = random_lens(rng, b, min(max_kv, s_kv))
    lens = lens.to(torch.int64)
    if strided:
        leaves = (rng.randn(b, s_kv, h_q + 2 * h_kv, d, dtype=dtype, device=device),)

        def make(qkv):
            return (qkv[:, :1, :h_q], qkv[:, :, h_q:h_q + h_kv], qkv[:, :, h_q + h_kv:])
    else:
        leaves = (rng.randn(b, 1, h_q, d, dtype=dtype, device=device),
                  rng.randn(b, s_kv, h_kv, d, dtype=dtype, device=device),
                  rng.randn(b, s_kv, h_kv, d, dtype=dtype, device=device))

        def make(q, k, v):
            return q, k, v
    dout = rng.randn(b, 1, h_q, d, dtype=dtype, device=device)
    return Case(BSHD, leaves, make, None, None, lens.to(torch.int32).to(device), lens.to(device),
                max_kv, dout, rng, scale)


def call(case: Case, q, k, v, **kw):
    kw.setdefault("return_lse", True)
    kw.setdefault("return_softmax", True)
    return fused_attn_small_seq(
        q, k, v, case.cu_q, case.cu_kv, max_seqlen_q=1, max_seqlen_kv=case.max_kv,
        softmax_scale=case.scale, qkv_layout=case.layout, seqlens_kv=case.seqlens, **kw)


def run_op(case: Case, backend="auto", grads=True, **kw):
    """(out, lse, probs, grads wrt the leaves or None) of the op under test."""
    leaves = tuple(t.detach().clone().requires_grad_(grads) for t in case.leaves)
    q, k, v = case.qkv(leaves)
    res = call(case, q, k, v, backend=backend, **kw)
    if isinstance(res, torch.Tensor):
        res = (res,)
    out, lse, probs = (tuple(res) + (None, None))[:3]
    g = None
    if grads:
        g = torch.autograd.grad(out, leaves, case.dout, allow_unused=True, materialize_grads=True)
    return out, lse, probs, g


def gather_padded(k, v, cu_kv, max_kv):
    """THD k/v -> [b, max_kv, h, d] by index-gathering rows (differentiable wrt k/v)."""
    b = cu_kv.numel() - 1
    if k.shape[0] == 0:
        shape = (b, max_kv) + tuple(k.shape[1:])
        return k.new_zeros(shape), v.new_zeros(shape)
    rows = cu_kv[:-1].long().unsqueeze(1) + torch.arange(max_kv, device=k.device).unsqueeze(0)
    rows = rows.clamp(0, k.shape[0] - 1)  # past a segment's length: masked by the reference
    return k[rows], v[rows]


def run_ref(case: Case, grads=True):
    """float64 oracle: (out, lse, probs [b, h_q, max_kv], grads wrt the leaves or None)."""
    leaves = tuple(t.detach().double().requires_grad_(grads) for t in case.leaves)
    q, k, v = case.qkv(leaves)
    if case.layout == THD:
        kp, vp = gather_padded(k, v, case.cu_kv, case.max_kv)
        q3 = q
    else:
        kp, vp, q3 = k, v, q[:, 0]
    out, lse, probs = reference_small_seq(q3, kp, vp, case.lens, case.scale)
    width = probs.shape[-1]
    if width < case.max_kv:
        probs = torch.nn.functional.pad(probs, (0, case.max_kv - width))
    probs = probs[..., :case.max_kv]
    if case.layout == BSHD:
        out = out.unsqueeze(1)
    g = None
    if grads:
        g = torch.autograd.grad(out, leaves, case.dout.double(), allow_unused=True,
                                materialize_grads=True)
    return out, lse, probs, g


def rel_err(x: torch.Tensor, ref: torch.Tensor) -> float:
    """||x - ref|| / ||ref||; the absolute ||x - ref|| when ref is exactly zero (e.g. dq when
    every segment has at most one key)."""
    x, ref = x.detach().double(), ref.detach().double()
    num = (x - ref).norm().item()
    den = ref.norm().item()
    return num / den if den > 0 else num


def assert_rel(name, x, ref, tol, ctx):
    assert x.shape == ref.shape, f"{name}: shape {tuple(x.shape)} != {tuple(ref.shape)} ({ctx})"
    bad = (~torch.isfinite(x)).sum().item()
    assert bad == 0, f"{name}: {bad} non-finite values ({ctx})"
    err = rel_err(x, ref)
    assert err < tol, f"{name}: rel. error {err:.3e} >= {tol:.1e} ({ctx})"
    return err


def assert_lse(lse, ref, tol, ctx):
    """LSE: float32 [h_q, b]; exactly -inf where the reference is (empty segments), finite and
    close elsewhere."""
    assert lse.dtype == torch.float32, f"lse dtype {lse.dtype} ({ctx})"
    assert lse.shape == ref.shape, f"lse shape {tuple(lse.shape)} != {tuple(ref.shape)} ({ctx})"
    empty = torch.isneginf(ref)
    assert torch.equal(torch.isneginf(lse), empty), f"lse: -inf pattern differs ({ctx})"
    assert not torch.isnan(lse).any(), f"lse has NaN ({ctx})"
    if (~empty).any():
        assert_rel("lse", lse[~empty], ref[~empty], tol, ctx)


def out_tol(dtype) -> float:
    return TOL_LOW.get(dtype, TOL_FP32)


def check_against_reference(case: Case, backend="auto", grads=True):
    """Run the op and the oracle on `case` and compare everything."""
    out, lse, probs, g = run_op(case, backend=backend, grads=grads)
    rout, rlse, rprobs, rg = run_ref(case, grads=grads)
    ctx = f"{case}, backend={backend}"
    q, k, _ = case.qkv()
    b, h_q = len(case.lens), q.shape[-2]
    assert out.shape == q.shape and out.dtype == q.dtype, ctx
    assert tuple(lse.shape) == (h_q, b), ctx
    assert tuple(probs.shape) == (b, h_q, case.max_kv) and probs.dtype == torch.float32, ctx
    tol = out_tol(case.dtype)
    assert_rel("out", out, rout, tol, ctx)
    assert_lse(lse, rlse, TOL_FP32, ctx)
    assert_rel("probs", probs, rprobs, TOL_FP32, ctx)
    # empty segments: exact zeros (never NaN), zero probabilities
    empty = case.lens == 0
    if empty.any():
        assert (out[empty.to(out.device)] == 0).all(), f"empty segment output not zero ({ctx})"
        assert (probs[empty.to(probs.device)] == 0).all(), ctx
    if grads:
        names = ("dq", "dk", "dv") if len(g) == 3 else ("dqkv",)
        for name, x, r in zip(names, g, rg):
            assert x.dtype == case.dtype
            assert_rel(name, x, r, tol, ctx)
    return out, lse, probs, g


# --------------------------------------------------------------------------------------------
# torch path: numerics
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", seeds(1))
@pytest.mark.parametrize("h_q,h_kv", GQA)
@pytest.mark.parametrize("max_kv", [1, 5, 16])
@pytest.mark.parametrize("d", [64, 128, 40])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_thd_torch_path(dtype, d, max_kv, h_q, h_kv, seed):
    rng = Rng(seed, f"thd{dtype}{d}{max_kv}{h_q}{h_kv}")
    case = thd_case(rng, 47, h_q, h_kv, d, max_kv, dtype)
    check_against_reference(case, backend="torch")


@pytest.mark.parametrize("seed", seeds(2))
@pytest.mark.parametrize("backend", ["auto", "torch"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16],
                         ids=["fp32", "bf16", "fp16"])
def test_thd_backends_on_cpu(dtype, backend, seed):
    """backend='auto' on the CPU serves the call with the torch path."""
    rng = Rng(seed, f"backend{dtype}{backend}")
    case = thd_case(rng, 33, 8, 2, 64, 16, dtype)
    check_against_reference(case, backend=backend)


def test_auto_equals_torch_on_cpu():
    rng = Rng(0, "auto=torch")
    case = thd_case(rng, 40, 4, 2, 64, 9, torch.bfloat16)
    a = run_op(case, backend="auto")
    t = run_op(case, backend="torch")
    for x, y in zip(a[:3] + tuple(a[3]), t[:3] + tuple(t[3])):
        torch.testing.assert_close(x, y, rtol=0, atol=0, equal_nan=False)


@pytest.mark.parametrize("seed", seeds(1))
@pytest.mark.parametrize("h_q,h_kv", GQA)
@pytest.mark.parametrize("max_kv,s_kv", [(5, 5), (16, 16), (5, 16), (16, 5), (1, 1)],
                         ids=["s5", "s16", "s16_max5", "s5_max16", "s1"])
@pytest.mark.parametrize("d", [64, 128, 40])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_bshd_torch_path(dtype, d, max_kv, s_kv, h_q, h_kv, seed):
    rng = Rng(seed, f"bshd{dtype}{d}{max_kv}{s_kv}{h_q}{h_kv}")
    case = bshd_case(rng, 39, h_q, h_kv, d, max_kv, dtype, s_kv=s_kv)
    _, _, _, (dq, dk, dv) = check_against_reference(case, backend="torch")
    # padding rows (j >= seqlens_kv[i]) get exactly zero gradient
    pad = torch.arange(s_kv).unsqueeze(0) >= case.lens.unsqueeze(1)
    assert (dk[pad] == 0).all() and (dv[pad] == 0).all(), str(case)


@pytest.mark.parametrize("seed", seeds(2))
@pytest.mark.parametrize("h_q,h_kv", [GQA[0], GQA[2], GQA[3]])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("layout", [THD, BSHD])
def test_strided_fused_qkv(layout, dtype, h_q, h_kv, seed):
    """q/k/v are views of one fused projection (no copy); gradients land in the fused tensor."""
    rng = Rng(seed, f"strided{layout}{dtype}{h_q}{h_kv}")
    if layout == THD:
        case = thd_case(rng, 45, h_q, h_kv, 64, 13, dtype, strided=True)
    else:
        case = bshd_case(rng, 45, h_q, h_kv, 64, 13, dtype, strided=True)
    q, k, v = case.qkv()
    assert not q.is_contiguous() and not k.is_contiguous() and not v.is_contiguous()
    _, _, _, (dqkv,) = check_against_reference(case, backend="torch")
    if layout == THD:
        # rows of the q slice past b, and kv slices past total_kv, are untouched
        assert (dqkv[q.shape[0]:, :h_q] == 0).all()
        assert (dqkv[k.shape[0]:, h_q:] == 0).all()


@pytest.mark.parametrize("seed", seeds(2))
def test_kv_tokens_outside_cu_seqlens(seed):
    """k/v rows before cu_seqlens_kv[0] and after cu_seqlens_kv[-1] belong to no segment: never
    read, zero gradient."""
    rng = Rng(seed, "outside")
    case = thd_case(rng, 30, 4, 2, 64, 8, torch.float32, pad_before=3, pad_after=5)
    _, _, _, (_, dk, dv) = check_against_reference(case, backend="torch")
    assert (dk[:3] == 0).all() and (dv[:3] == 0).all()
    assert (dk[-5:] == 0).all() and (dv[-5:] == 0).all()
    # junk (even NaN) in those rows never reaches the results
    leaves = tuple(t.clone() for t in case.leaves)
    for t in leaves[1:]:
        t[:3] = float("nan")
        t[-5:] = float("inf")
    out, lse, probs = call(case, *leaves, backend="torch")
    ref = call(case, *case.leaves, backend="torch")
    for x, r in zip((out, lse, probs), ref):
        torch.testing.assert_close(x, r, rtol=0, atol=0)


@pytest.mark.parametrize("seed", seeds(2))
@pytest.mark.parametrize("layout", [THD, BSHD])
def test_single_segment(layout, seed):
    rng = Rng(seed, f"one{layout}")
    lens = torch.tensor([7])
    if layout == THD:
        case = thd_case(rng, 1, 4, 2, 128, 7, torch.float32, lens=lens)
    else:
        case = bshd_case(rng, 1, 4, 2, 128, 7, torch.float32, lens=lens)
    check_against_reference(case, backend="torch")


@pytest.mark.parametrize("seed", seeds(2))
@pytest.mark.parametrize("h_q,h_kv", [(4, 4), (4, 2), (8, 1)], ids=["g1", "g2", "g8"])
@pytest.mark.parametrize("histories", ["full", "ragged", "strided", "pad", "bshd_gaps"])
def test_cpu_one_query_inference(histories, h_q, h_kv, seed, monkeypatch):
    """The CPU inference path of one query per segment against the float64 reference: fp32 and
    fp64, chunks of several segments (400 segments; 8 rows per chunk here, so chunks are cut
    inside runs of short and empty histories too), GQA, strided views. Full packed histories
    take the products on K / V views (_one_query_chunk), ragged packed ones (THD, with empty
    segments, with rows before / after the segments' keys) the row-wise products
    (_one_query_packed), BSHD histories with gaps the gather + SDPA. A non-finite V row and a
    NaN K row change only their own segments; empty segments give exactly 0."""
    packed_calls = []
    real_packed = small_seq_torch._one_query_packed

    def counting(*args):
        packed_calls.append(1)
        return real_packed(*args)

    monkeypatch.setattr(small_seq_torch, "_one_query_packed", counting)
    # small chunks: many of them over 400 segments, some holding only empty histories
    monkeypatch.setattr(small_seq_torch, "CPU_ONE_QUERY_CHUNK_BYTES", 8 * h_q * 64 * 8)
    monkeypatch.setattr(small_seq_torch, "CPU_CHUNK_MIN_SEGMENTS", 1)
    rng = Rng(seed, f"cpu1q{histories}{h_q}{h_kv}")
    b, max_kv = 400, 12
    lens = torch.full((b,), max_kv) if histories == "full" else random_lens(rng, b, max_kv)
    if histories != "full":
        lens[rng.randint(0, b, (40,))] = 0  # runs of empty histories
    for dtype in (torch.float32, torch.float64):
        if histories == "bshd_gaps":
            case = bshd_case(rng, b, h_q, h_kv, 64, max_kv, dtype, lens=lens)
        else:
            case = thd_case(rng, b, h_q, h_kv, 64, max_kv, dtype, lens=lens,
                            strided=histories == "strided",
                            pad_before=3 if histories == "pad" else 0,
                            pad_after=5 if histories == "pad" else 0)
        with torch.no_grad():
            out = call(case, *case.qkv(case.leaves), backend="torch", return_lse=False,
                       return_softmax=False)
        rout = run_ref(case, grads=False)[0]
        assert_rel("out", out, rout, out_tol(dtype), str(case))
    expect_packed = histories in ("ragged", "strided", "pad")
    assert bool(packed_calls) == expect_packed, (histories, len(packed_calls))
    empty = case.lens == 0
    assert (out[empty] == 0).all()
    _, k, v = case.qkv(case.leaves)
    nonempty = torch.nonzero(case.lens > 0).flatten()
    seg_v, seg_k = int(nonempty[0]), int(nonempty[-1])
    with torch.no_grad():
        if histories == "bshd_gaps":
            v[seg_v, 0, 0, 0] = float("inf")
            k[seg_k, int(case.lens[seg_k]) - 1, 0, 0] = float("nan")
            # rows past a history's length belong to no segment: NaN there reaches nothing
            k[empty, 0] = float("nan")
            v[empty, 0] = float("nan")
        else:
            v[int(case.cu_kv[seg_v]), 0, 0] = float("inf")
            k[int(case.cu_kv[seg_k + 1]) - 1, 0, 0] = float("nan")
            if histories == "pad":  # rows outside every segment
                k[0], v[0], k[-1], v[-1] = (float("nan"),) * 4
        out = call(case, *case.qkv(case.leaves), backend="torch", return_lse=False,
                   return_softmax=False)
    others = torch.ones(b, dtype=torch.bool)
    others[[seg_v, seg_k]] = False
    assert not torch.isfinite(out[seg_v]).all()
    assert torch.isnan(out[seg_k]).any()
    assert torch.isfinite(out[others]).all()
    assert (out[empty] == 0).all()


@pytest.mark.parametrize("seed", seeds(1))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_50k_segments(dtype, seed):
    rng = Rng(seed, f"50k{dtype}")
    case = thd_case(rng, 50_000, 2, 1, 16, 16, dtype)
    check_against_reference(case, backend="torch")


@pytest.mark.parametrize("seed", seeds(2))
@pytest.mark.parametrize("layout", [THD, BSHD])
def test_empty_segments(layout, seed):
    """Segments without keys: zero output and probabilities, LSE -inf, no NaN anywhere,
    zero gradient for their q."""
    rng = Rng(seed, f"empty{layout}")
    lens = torch.tensor([0, 3, 0, 0, 16, 1, 0])
    if layout == THD:
        case = thd_case(rng, 7, 4, 2, 64, 16, torch.float32, lens=lens)
    else:
        case = bshd_case(rng, 7, 4, 2, 64, 16, torch.float32, lens=lens)
    out, lse, probs, (dq, dk, dv) = check_against_reference(case, backend="torch")
    empty = lens == 0
    assert torch.isneginf(lse[:, empty]).all()
    assert (dq[empty] == 0).all()
    if layout == BSHD:
        assert (dk[empty] == 0).all() and (dv[empty] == 0).all()


@pytest.mark.parametrize("layout", [THD, BSHD])
def test_all_segments_empty(layout):
    """Every segment empty (THD: k/v with zero rows)."""
    rng = Rng(0, f"allempty{layout}")
    lens = torch.zeros(5, dtype=torch.int64)
    if layout == THD:
        case = thd_case(rng, 5, 4, 2, 64, 4, torch.float32, lens=lens)
        assert case.leaves[1].shape[0] == 0
    else:
        case = bshd_case(rng, 5, 4, 2, 64, 4, torch.float32, lens=lens)
    out, lse, probs, (dq, dk, dv) = run_op(case, backend="torch")
    assert (out == 0).all() and torch.isneginf(lse).all() and (probs == 0).all()
    assert (dq == 0).all() and (dk == 0).all() and (dv == 0).all()


def test_zero_batch():
    q = torch.randn(0, 4, 64)
    k = torch.randn(0, 2, 64)
    cu = torch.zeros(1, dtype=torch.int32)
    out, lse, probs = fused_attn_small_seq(q, k, k.clone(), cu, cu, 1, 8, return_lse=True,
                                           return_softmax=True)
    assert out.shape == (0, 4, 64) and lse.shape == (4, 0) and probs.shape == (0, 4, 8)


@pytest.mark.parametrize("seed", seeds(2))
def test_softmax_scale_and_return_arity(seed):
    rng = Rng(seed, "scale")
    case = thd_case(rng, 21, 4, 2, 64, 6, torch.float32, scale=0.37)
    check_against_reference(case, backend="torch")
    q, k, v = case.qkv()
    full = call(case, q, k, v, return_lse=True, return_softmax=True)
    only_out = call(case, q, k, v, return_lse=False, return_softmax=False)
    assert isinstance(only_out, torch.Tensor)
    out_lse = call(case, q, k, v, return_lse=True, return_softmax=False)
    out_probs = call(case, q, k, v, return_lse=False, return_softmax=True)
    assert len(out_lse) == 2 and len(out_probs) == 2
    # NOTE: equal up to float32 rounding, not bitwise: without a gradient the torch path
    # serves out alone with SDPA, out and lse with matmuls, and probs with the training
    # formulation
    assert_rel("out alone", only_out, full[0], TOL_FP32, str(case))
    assert_lse(out_lse[1], full[1], TOL_FP32, str(case))
    torch.testing.assert_close(out_probs[1], full[2], rtol=0, atol=0)
    # default scale is 1/sqrt(d)
    case.scale = None
    default = call(case, q, k, v)
    explicit = fused_attn_small_seq(q, k, v, case.cu_q, case.cu_kv, 1, case.max_kv,
                                    softmax_scale=1.0 / math.sqrt(64), return_lse=True,
                                    return_softmax=True)
    assert len(default) == 3
    for x, y in zip(default, explicit):
        torch.testing.assert_close(x, y, rtol=0, atol=0)


def test_positional_signature_matches_design():
    """fused_attn_small_seq(q, k, v, cu_seqlens_q, cu_seqlens_kv, max_seqlen_q, max_seqlen_kv,
    *, softmax_scale, qkv_layout, return_softmax, ...) as documented in README.md
    (fused_attn_small_seq): seven positional arguments, the rest by keyword."""
    rng = Rng(0, "positional")
    case = thd_case(rng, 9, 2, 2, 64, 4, torch.float32)
    q, k, v = case.qkv()
    out, probs = fused_attn_small_seq(q, k, v, case.cu_q, case.cu_kv, 1, 4, softmax_scale=None,
                                      qkv_layout=THD, return_softmax=True)
    ref, _, rprobs, _ = run_ref(case, grads=False)
    assert_rel("out", out, ref, TOL_FP32, str(case))
    assert_rel("probs", probs, rprobs, TOL_FP32, str(case))
    params = inspect.signature(fused_attn_small_seq).parameters
    assert [n for n, p in params.items() if p.kind is p.POSITIONAL_OR_KEYWORD] == [
        "q", "k", "v", "cu_seqlens_q", "cu_seqlens_kv", "max_seqlen_q", "max_seqlen_kv"]


@pytest.mark.parametrize("extra", [(0.0,), (0.0, None), (None, THD, True)],
                         ids=["dropout_p", "dropout_p-scale", "old-order"])
def test_flash_attn_positional_habit_raises(extra):
    """flash_attn_varlen_func(q, k, v, cu_q, cu_k, max_q, max_k, dropout_p, softmax_scale, ...):
    a flash-attn user's 8th positional argument is dropout_p. Here it would have been
    softmax_scale (0.0: uniform weights, silently); it raises a TypeError naming dropout_p."""
    case = thd_case(Rng(0, "flash_habit"), 9, 2, 2, 64, 4, torch.float32)
    with pytest.raises(TypeError, match="dropout_p.*keyword|keyword.*dropout_p"):
        fused_attn_small_seq(*case.qkv(), case.cu_q, case.cu_kv, 1, 4, *extra)


def test_keyword_only_call_compiles_fullgraph():
    case = thd_case(Rng(0, "kwonly_compile"), 9, 2, 2, 64, 4, torch.float32)
    args = (*case.qkv(), case.cu_q, case.cu_kv, 1, 4)

    def f(q, k, v, cu_q, cu_kv, mq, mkv):
        return fused_attn_small_seq(q, k, v, cu_q, cu_kv, mq, mkv, softmax_scale=0.25)

    torch.testing.assert_close(torch.compile(f, fullgraph=True)(*args), f(*args))


def test_float64_inputs_compute_in_float64():
    rng = Rng(0, "f64")
    case = thd_case(rng, 25, 4, 2, 64, 16, torch.float64)
    out, lse, probs, g = run_op(case, backend="torch")
    rout, rlse, rprobs, rg = run_ref(case)
    assert out.dtype == torch.float64
    assert_rel("out", out, rout, 1e-12, str(case))
    for x, r in zip(g, rg):
        assert_rel("grad", x, r, 1e-12, str(case))


def test_backward_with_lse_and_probs_returned():
    """Asking for lse/probs does not change the gradients of out."""
    rng = Rng(0, "lsegrad")
    case = thd_case(rng, 11, 2, 2, 64, 4, torch.float32)
    leaves = tuple(t.detach().clone().requires_grad_() for t in case.leaves)
    out, lse, probs = call(case, *case.qkv(leaves), backend="torch")
    (out.float() * case.dout).sum().backward()
    _, _, _, g = run_op(case, backend="torch", return_lse=False, return_softmax=False)
    for t, r in zip(leaves, g):
        torch.testing.assert_close(t.grad, r, rtol=0, atol=0)


# --------------------------------------------------------------------------------------------
# contract violations (device-side lengths)
# --------------------------------------------------------------------------------------------


def _thd_with_bad_segments(rng, bad: Sequence[int], b=20, max_kv=6, dtype=torch.float32):
    """THD case whose segments `bad` hold max_kv + 1..3 keys (> max_seqlen_kv)."""
    lens = random_lens(rng, b, max_kv)
    for i in bad:
        lens[i] = max_kv + 1 + int(rng.randint(0, 3, (1,)))
    return thd_case(rng, b, 4, 2, 64, max_kv, dtype, lens=lens)


def _assert_nan_only_at(case, out, lse, probs, bad, backend="torch"):
    b = len(case.lens)
    is_bad = torch.zeros(b, dtype=torch.bool)
    is_bad[list(bad)] = True
    ctx = str(case)
    assert torch.isnan(out[is_bad]).all(), f"bad segments must be NaN ({ctx})"
    assert torch.isnan(lse[:, is_bad]).all() and torch.isnan(probs[is_bad]).all(), ctx
    good = ~is_bad
    rout, rlse, rprobs, _ = run_ref(case, grads=False)
    assert_rel("out (good segments)", out[good], rout[good], out_tol(case.dtype), ctx)
    assert_lse(lse[:, good], rlse[:, good], TOL_FP32, ctx)
    assert_rel("probs (good segments)", probs[good], rprobs[good], TOL_FP32, ctx)


@pytest.mark.parametrize("seed", seeds(2))
def test_contract_violation_nan_and_check_errors(seed, allow_contract_errors):
    rng = Rng(seed, "violation")
    case = _thd_with_bad_segments(rng, [7])
    out, lse, probs, _ = run_op(case, backend="torch", grads=False)
    _assert_nan_only_at(case, out, lse, probs, [7])
    with pytest.raises(SmallSeqContractError, match=r"1 segment\(s\).*first bad segment: 7\b"):
        check_errors()
    check_errors()  # the first check reset the counter
    assert read_errors() == (0, -1)


@pytest.mark.parametrize("seed", seeds(2))
def test_contract_violation_counts_accumulate(seed, allow_contract_errors):
    """Counts add up across calls; the first bad segment is the lowest index seen."""
    rng = Rng(seed, "accumulate")
    a = _thd_with_bad_segments(rng, [11, 4, 15])
    out, lse, probs, _ = run_op(a, backend="torch", grads=False)
    _assert_nan_only_at(a, out, lse, probs, [11, 4, 15])
    b = _thd_with_bad_segments(rng, [9])
    run_op(b, backend="torch", grads=False)
    with pytest.raises(SmallSeqContractError, match=r"4 segment\(s\).*first bad segment: 4\b"):
        check_errors()
    check_errors()


def test_other_contract_violations(allow_contract_errors):
    """cu_seqlens_kv past the end of k/v, decreasing cu_seqlens_kv, and a segment with two query
    tokens are all flagged, never read out of bounds."""
    rng = Rng(0, "othercontract")
    b, max_kv = 8, 4
    q = rng.randn(b, 2, 64)
    k = rng.randn(20, 2, 64)
    v = rng.randn(20, 2, 64)
    cu_q = torch.arange(b + 1, dtype=torch.int32)
    # last segment runs past k/v (rows 18..21 of 20)
    cu_kv = torch.tensor([0, 2, 4, 6, 8, 10, 12, 16, 22], dtype=torch.int32)
    out = fused_attn_small_seq(q, k, v, cu_q, cu_kv, 1, 6)
    assert torch.isnan(out[7]).all() and torch.isfinite(out[:7]).all()
    with pytest.raises(SmallSeqContractError, match=r"1 segment\(s\).*first bad segment: 7\b"):
        check_errors()
    # negative length (segment 2)
    cu_kv = torch.tensor([0, 2, 4, 3, 6, 8, 10, 12, 14], dtype=torch.int32)
    out = fused_attn_small_seq(q, k, v, cu_q, cu_kv, 1, max_kv)
    assert torch.isnan(out[2]).all()
    assert torch.isfinite(out[[0, 1, 3, 4, 5, 6, 7]]).all()
    with pytest.raises(SmallSeqContractError, match=r"first bad segment: 2\b"):
        check_errors()
    # segment 5 has two query tokens
    cu_q_bad = torch.tensor([0, 1, 2, 3, 4, 5, 7, 8, 8], dtype=torch.int32)
    cu_kv = torch.tensor([0, 2, 4, 6, 8, 10, 12, 14, 16], dtype=torch.int32)
    out = fused_attn_small_seq(q, k, v, cu_q_bad, cu_kv, 1, max_kv)
    assert torch.isnan(out[5]).all() and torch.isfinite(out[:5]).all()
    with pytest.raises(SmallSeqContractError, match=r"first bad segment: 5\b"):
        check_errors()


@pytest.mark.parametrize("validate", ["sync", True])
def test_validate_sync_raises_at_call(validate, allow_contract_errors):
    rng = Rng(0, "sync")
    case = _thd_with_bad_segments(rng, [3, 12])
    q, k, v = case.qkv()
    with pytest.raises(SmallSeqContractError, match=r"2 segment\(s\).*first bad segment: 3\b"):
        call(case, q, k, v, validate=validate)
    check_errors()  # raising at the call reset the counter
    # valid input with validate="sync" passes
    good = thd_case(rng, 10, 4, 2, 64, 6, torch.float32)
    call(good, *good.qkv(), validate=validate)


def test_validate_env(monkeypatch, allow_contract_errors):
    rng = Rng(0, "env")
    case = _thd_with_bad_segments(rng, [5])
    q, k, v = case.qkv()
    monkeypatch.setenv("ROCM_ATTN_VALIDATE", "1")
    with pytest.raises(SmallSeqContractError, match=r"first bad segment: 5\b"):
        call(case, q, k, v)
    # an explicit validate=False wins over the environment; the error stays counted
    call(case, q, k, v, validate=False)
    with pytest.raises(SmallSeqContractError, match=r"first bad segment: 5\b"):
        check_errors()
    monkeypatch.setenv("ROCM_ATTN_VALIDATE", "0")
    call(case, q, k, v)  # no raise
    with pytest.raises(SmallSeqContractError):
        check_errors()


def test_bshd_contract_violation(allow_contract_errors):
    rng = Rng(0, "bshdviol")
    lens = torch.tensor([3, 9, 2, -1, 5, 0])
    case = bshd_case(rng, 6, 4, 2, 64, 5, torch.float32, s_kv=16, lens=lens)
    out, lse, probs, _ = run_op(case, backend="torch", grads=False)
    assert torch.isnan(out[[1, 3]]).all()
    assert torch.isfinite(out[[0, 2, 4, 5]]).all()
    with pytest.raises(SmallSeqContractError, match=r"2 segment\(s\).*first bad segment: 1\b"):
        check_errors()


def test_bshd_length_beyond_s_kv_is_counted(allow_contract_errors):
    """BSHD: k.shape[1] < seqlens_kv[i] <= max_seqlen_kv breaks the contract too (NaN and
    counted, as the kernel does), never a silent NaN."""
    rng = Rng(0, "bshd_s")
    lens = torch.tensor([3, 7, 2])  # s_kv = 5 < 7 <= max_seqlen_kv = 8
    case = bshd_case(rng, 3, 2, 2, 64, 8, torch.float32, s_kv=5, lens=lens)
    out, _, _, _ = run_op(case, backend="torch", grads=False)
    assert torch.isnan(out[1]).all() and torch.isfinite(out[[0, 2]]).all()
    assert read_errors() == (1, 1)
    q, k, v = case.qkv()
    with pytest.raises(SmallSeqContractError, match=r"first bad segment: 1\b"):
        call(case, q, k, v, backend="torch", validate="sync")


# --------------------------------------------------------------------------------------------
# host-side argument validation: ValueError naming the argument
# --------------------------------------------------------------------------------------------


def _good_thd_args():
    b, total = 4, 10
    return dict(
        q=torch.randn(b, 4, 64), k=torch.randn(total, 2, 64), v=torch.randn(total, 2, 64),
        cu_seqlens_q=torch.arange(b + 1, dtype=torch.int32),
        cu_seqlens_kv=torch.tensor([0, 2, 5, 9, 10], dtype=torch.int32),
        max_seqlen_q=1, max_seqlen_kv=4, qkv_layout=THD,
    )


def _good_bshd_args():
    b, s = 4, 6
    return dict(
        q=torch.randn(b, 1, 4, 64), k=torch.randn(b, s, 2, 64), v=torch.randn(b, s, 2, 64),
        seqlens_kv=torch.tensor([1, 6, 0, 3], dtype=torch.int32),
        max_seqlen_q=1, max_seqlen_kv=6, qkv_layout=BSHD,
    )


def _noncontig_last(t):
    return t.transpose(-1, -2).contiguous().transpose(-1, -2)


THD_BAD = [
    ("layout", dict(qkv_layout="sbhd_sbhd_sbhd"), "qkv_layout"),
    ("layout_none", dict(qkv_layout=None), "qkv_layout"),
    ("max_seqlen_q_float", dict(max_seqlen_q=2.0), "max_seqlen_q"),
    ("max_seqlen_q_bool", dict(max_seqlen_q=True), "max_seqlen_q"),
    ("max_seqlen_q_0", dict(max_seqlen_q=0), "max_seqlen_q"),
    ("max_seqlen_kv_0", dict(max_seqlen_kv=0), "max_seqlen_kv"),
    ("max_seqlen_kv_negative", dict(max_seqlen_kv=-3), "max_seqlen_kv"),
    ("max_seqlen_kv_float", dict(max_seqlen_kv=4.0), "max_seqlen_kv"),
    ("max_seqlen_kv_tensor", dict(max_seqlen_kv=torch.tensor(4)), "max_seqlen_kv"),
    ("max_seqlen_kv_bool", dict(max_seqlen_kv=True), "max_seqlen_kv"),
    ("max_seqlen_kv_str", dict(max_seqlen_kv="16"), "max_seqlen_kv"),
    ("softmax_scale_str", dict(softmax_scale="0.1"), "softmax_scale"),
    ("softmax_scale_tensor", dict(softmax_scale=torch.tensor(0.1)), "softmax_scale"),
    ("q_not_tensor", dict(q=[[0.0]]), r"\bq\b"),
    ("q_rank", dict(q=torch.randn(4, 1, 4, 64)), r"\bq\b"),
    ("k_rank", dict(k=torch.randn(10, 128)), r"\bk\b"),
    ("v_rank", dict(v=torch.randn(1, 10, 2, 64)), r"\bv\b"),
    ("q_int_dtype", dict(q=torch.ones(4, 4, 64, dtype=torch.int32)), r"\bq\b"),
    ("q_last_dim", dict(q=_noncontig_last(torch.randn(4, 4, 64))), r"\bq\b.*contiguous"),
    ("k_last_dim", dict(k=_noncontig_last(torch.randn(10, 2, 64))), r"\bk\b.*contiguous"),
    ("v_last_dim", dict(v=torch.randn(10, 2, 128)[..., ::2]), r"\bv\b.*contiguous"),
    ("cu_q_int16", dict(cu_seqlens_q=torch.arange(5, dtype=torch.int16)), "cu_seqlens_q"),
    ("cu_kv_uint8", dict(cu_seqlens_kv=torch.tensor([0, 2, 5, 9, 10], dtype=torch.uint8)),
     "cu_seqlens_kv"),
    ("cu_kv_float", dict(cu_seqlens_kv=torch.tensor([0.0, 2, 5, 9, 10])), "cu_seqlens_kv"),
    ("cu_q_short", dict(cu_seqlens_q=torch.arange(4, dtype=torch.int32)), "cu_seqlens_q"),
    ("cu_kv_long", dict(cu_seqlens_kv=torch.arange(6, dtype=torch.int32)), "cu_seqlens_kv"),
    ("cu_kv_2d", dict(cu_seqlens_kv=torch.zeros(1, 5, dtype=torch.int32)), "cu_seqlens_kv"),
    ("cu_kv_list", dict(cu_seqlens_kv=[0, 2, 5, 9, 10]), "cu_seqlens_kv"),
    ("cu_kv_noncontig", dict(cu_seqlens_kv=torch.tensor([0, 0, 2, 0, 5, 0, 9, 0, 10, 0],
                                                        dtype=torch.int32)[::2]), "cu_seqlens_kv"),
    ("cu_q_noncontig", dict(cu_seqlens_q=torch.tensor([0, 0, 1, 0, 2, 0, 3, 0, 4, 0],
                                                      dtype=torch.int32)[::2]), "cu_seqlens_q"),
    ("cu_kv_device", dict(cu_seqlens_kv=torch.zeros(5, dtype=torch.int32, device="meta")),
     "cu_seqlens_kv"),
    ("cu_q_missing", dict(cu_seqlens_q=None), "cu_seqlens_q"),
    ("cu_kv_missing", dict(cu_seqlens_kv=None), "cu_seqlens_kv"),
    ("seqlens_kv_with_thd", dict(seqlens_kv=torch.zeros(4, dtype=torch.int32)), "seqlens_kv"),
    ("kv_shape", dict(v=torch.randn(11, 2, 64)), r"\bk and v\b"),
    ("kv_heads_shape", dict(v=torch.randn(10, 1, 64)), r"\bk and v\b"),
    ("k_dtype", dict(k=torch.randn(10, 2, 64, dtype=torch.bfloat16)), "dtype"),
    ("v_dtype", dict(v=torch.randn(10, 2, 64, dtype=torch.float16)), "dtype"),
    ("k_device", dict(k=torch.randn(10, 2, 64, device="meta"),
                      v=torch.randn(10, 2, 64, device="meta")), "device"),
    ("gqa_ratio", dict(q=torch.randn(4, 3, 64)), r"heads of q.*heads of k/v"),
    ("zero_kv_heads", dict(k=torch.randn(10, 0, 64), v=torch.randn(10, 0, 64)),
     r"heads of k/v"),
    ("head_dim", dict(k=torch.randn(10, 2, 32), v=torch.randn(10, 2, 32)), "head dim"),
    ("backend", dict(backend="cuda"), "backend"),
    ("backend_none", dict(backend=None), "backend"),
    ("validate", dict(validate="yes"), "validate"),
    ("validate_int", dict(validate=2), "validate"),
]

BSHD_BAD = [
    ("cu_seqlens_with_bshd", dict(cu_seqlens_kv=torch.arange(5, dtype=torch.int32)),
     "seqlens_kv"),
    ("cu_q_with_bshd", dict(cu_seqlens_q=torch.arange(5, dtype=torch.int32)), "cu_seqlens"),
    ("q_two_tokens", dict(q=torch.randn(4, 2, 4, 64)), r"\bq\b"),
    ("q_rank", dict(q=torch.randn(4, 4, 64)), r"\bq\b"),
    ("k_rank", dict(k=torch.randn(4 * 6, 2, 64)), r"\bk\b"),
    ("k_batch", dict(k=torch.randn(5, 6, 2, 64), v=torch.randn(5, 6, 2, 64)), r"\bk batch\b"),
    ("max_seqlen_q_not_s_q", dict(max_seqlen_q=2), "max_seqlen_q"),
    ("seqlens_missing", dict(seqlens_kv=None), "seqlens_kv"),
    ("seqlens_int16", dict(seqlens_kv=torch.tensor([1, 6, 0, 3], dtype=torch.int16)),
     "seqlens_kv"),
    ("seqlens_len", dict(seqlens_kv=torch.tensor([1, 6, 0], dtype=torch.int32)), "seqlens_kv"),
    ("seqlens_noncontig", dict(seqlens_kv=torch.tensor([1, 0, 6, 0, 0, 0, 3, 0],
                                                       dtype=torch.int32)[::2]), "seqlens_kv"),
    ("kv_shape", dict(v=torch.randn(4, 5, 2, 64)), r"\bk and v\b"),
    ("dtype", dict(q=torch.randn(4, 1, 4, 64, dtype=torch.bfloat16)), "dtype"),
    ("gqa_ratio", dict(q=torch.randn(4, 1, 5, 64)), r"heads of q"),
    ("head_dim", dict(q=torch.randn(4, 1, 4, 128)), "head dim"),
    ("max_seqlen_kv_0", dict(max_seqlen_kv=0), "max_seqlen_kv"),
]


def _call_args(args):
    args = dict(args)
    q, k, v = args.pop("q"), args.pop("k"), args.pop("v")
    return (q, k, v), args


@pytest.mark.parametrize("good,change,match", [
    pytest.param(good, c, m, id=f"{layout}-{i}")
    for layout, good, bad in (("thd", _good_thd_args, THD_BAD), ("bshd", _good_bshd_args, BSHD_BAD))
    for i, c, m in bad])
def test_bad_host_input(good, change, match):
    """Each host-visible mistake raises a ValueError naming the argument; the base call it
    changes is valid."""
    args = good()
    fused_attn_small_seq(*_call_args(args)[0], **_call_args(args)[1])
    args.update(change)
    pos, kw = _call_args(args)
    with pytest.raises(ValueError, match=match):
        fused_attn_small_seq(*pos, **kw)


@pytest.mark.skipif(rocm_attn._ext.kernels_usable(torch.empty(0)), reason="CPU kernels exist")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
def test_backend_kernel_on_cpu_raises(dtype):
    args = _good_thd_args()
    for name in ("q", "k", "v"):
        args[name] = args[name].to(dtype)
    pos, kw = _call_args(args)
    with pytest.raises(ValueError, match="backend='kernel'.*no compiled kernels"):
        fused_attn_small_seq(*pos, backend="kernel", **kw)


# --------------------------------------------------------------------------------------------
# torch.compile on the CPU torch path
# --------------------------------------------------------------------------------------------


def _inductor_available():
    try:
        import torch._inductor  # noqa: F401
    except Exception as exc:  # pragma: no cover - depends on the platform
        return f"torch inductor unavailable: {exc}"
    return None


@pytest.mark.skipif(_inductor_available() is not None, reason=str(_inductor_available()))
@pytest.mark.parametrize("backend", ["torch", "auto"])
def test_torch_compile_fullgraph_cpu(backend):
    import torch._dynamo

    torch._dynamo.reset()
    rng = Rng(0, "compile")
    case = thd_case(rng, 37, 4, 2, 64, 8, torch.float32)

    def fn(q, k, v, cu_q, cu_kv):
        return fused_attn_small_seq(q, k, v, cu_q, cu_kv, 1, case.max_kv, return_lse=True,
                                    return_softmax=True, backend=backend)

    compiled = torch.compile(fn, fullgraph=True)
    leaves_c = tuple(t.detach().clone().requires_grad_() for t in case.leaves)
    leaves_e = tuple(t.detach().clone().requires_grad_() for t in case.leaves)
    res_c = compiled(*leaves_c, case.cu_q, case.cu_kv)
    res_e = fn(*leaves_e, case.cu_q, case.cu_kv)
    for name, x, y in zip(("out", "lse", "probs"), res_c, res_e):
        torch.testing.assert_close(x, y, rtol=1e-5, atol=1e-6, msg=f"{name} compiled != eager")
    res_c[0].backward(case.dout)
    res_e[0].backward(case.dout)
    for name, x, y in zip(("dq", "dk", "dv"), leaves_c, leaves_e):
        torch.testing.assert_close(x.grad, y.grad, rtol=1e-5, atol=1e-6,
                                   msg=f"{name} compiled != eager")
    # and both match the oracle
    rout, _, _, rg = run_ref(case)
    assert_rel("out (compiled)", res_c[0], rout, TOL_FP32, str(case))
    for x, r in zip(leaves_c, rg):
        assert_rel("grad (compiled)", x.grad, r, TOL_FP32, str(case))


@pytest.mark.skipif(_inductor_available() is not None, reason=str(_inductor_available()))
def test_torch_compile_counts_contract_violations(allow_contract_errors):
    import torch._dynamo

    torch._dynamo.reset()
    rng = Rng(0, "compileviol")
    lens = torch.tensor([2, 7, 1, 0, 3])  # segment 1 > max_seqlen_kv = 4
    case = thd_case(rng, 5, 2, 2, 64, 4, torch.float32, lens=lens)

    def fn(q, k, v, cu_q, cu_kv):
        return fused_attn_small_seq(q, k, v, cu_q, cu_kv, 1, 4, backend="torch")

    out = torch.compile(fn, fullgraph=True)(*case.leaves, case.cu_q, case.cu_kv)
    assert torch.isnan(out[1]).all() and torch.isfinite(out[[0, 2, 3, 4]]).all()
    with pytest.raises(SmallSeqContractError, match=r"first bad segment: 1\b"):
        check_errors()
