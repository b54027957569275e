"""GPU tests of the THD kernels on garbage offsets: every helper with a kernel, validate off,
on cu_seqlens of random int32 words, negative, decreasing, past the end, int32 wrap and
int32 max / min, and on garbage row indices (merge_rows_, add_rows_). hip_src/thd/index.h
states what such values give; here each call must raise nothing, write nothing outside its
outputs and read nothing outside its inputs:

* inputs are views into buffers whose rows around the view hold NaN, and outputs must be
  finite (every output row comes from an in-bounds input row, or is a fill / left alone), so a
  read just outside a view shows up as NaN;
* in-place outputs are views into larger buffers whose rows around the view must keep their
  bits;
* under compute-sanitizer memcheck, any access outside an allocation fails the run. Run it with
  the caching allocator off, so that every tensor is its own allocation:
  ``PYTORCH_NO_CUDA_MEMORY_CACHING=1 compute-sanitizer --tool memcheck --error-exitcode 1
  python3 -m pytest -q -m gpu tests/test_thd_garbage_gpu.py``.

Small sizes, 7 cases of 14 helper calls: under memcheck (~50x slower) it stays short. Row
shapes alternate between those of the row-group / tile kernels and the wide-row kernels; the
cases with many sequences take the binary search instead of the wave searches and snapshots.
"""

from __future__ import annotations

import random

import pytest
import torch

from rocm_attn import thd
from rocm_attn.thd import _kernels

from helpers.gpu import gpu_marks

I32_MIN, I32_MAX = -(2**31), 2**31 - 1
I64_MIN, I64_MAX = -(2**63), 2**63 - 1
GUARD = 3  # rows of guard before and after every view


pytestmark = gpu_marks(thd_ops=True)


@pytest.fixture(autouse=True)
def _kernels_only(monkeypatch):
    """Every call must be served by a kernel: a fallback to the torch path fails the test."""

    def fail(name, why, *args):
        raise AssertionError(f"rocm_attn.thd.{name} fell back to the torch path: {why}")

    monkeypatch.setattr(_kernels, "fallback", fail)
    monkeypatch.delenv("ROCM_ATTN_VALIDATE", raising=False)


def garbage_cu(kind, b, total, rng):
    """int32 [b + 1] offsets of one garbage kind (host list)."""
    if kind == "random":
        return [rng.randint(I32_MIN, I32_MAX) for _ in range(b + 1)]
    if kind == "negative":
        return [-rng.randint(0, 3 * total) for _ in range(b + 1)]
    if kind == "decreasing":
        return sorted((rng.randint(-total, 2 * total) for _ in range(b + 1)), reverse=True)
    if kind == "past_end":
        return [0] + [total + rng.randint(0, total) * i for i in range(1, b + 1)]
    if kind == "wrap":  # differences wrap in 32 bits (the small-seq case, repeated)
        return ([0, 2147483640, -2147483640, 9] * (b + 1))[:b + 1]
    if kind == "minmax":
        return [rng.choice([I32_MIN, I32_MAX, I32_MIN + 1, I32_MAX - 1, 0, total])
                for _ in range(b + 1)]
    raise ValueError(kind)


def garbage_rows(n, rows, rng):
    """int64 [n] row indices: negative, past the end, int64 extremes, a few valid."""
    pool = [I64_MIN, I64_MAX, -1, rows, rows + 1, 2**31, -(2**31) - 1, 2**40]
    return [rng.choice(pool) if rng.random() < 0.7 else rng.randrange(rows) for _ in range(n)]


def guarded(shape, dtype, dev, gen, dim=0, fill=float("nan")):
    """(buffer, view): random values in a view of `shape` along `dim`, `fill` in GUARD rows
    before and after it."""
    full = list(shape)
    full[dim] += 2 * GUARD
    buf = torch.full(full, fill, dtype=torch.float32)
    view = buf.narrow(dim, GUARD, shape[dim])
    view.copy_(torch.randn(tuple(shape), generator=gen))
    buf = buf.to(dev, dtype)
    return buf, buf.narrow(dim, GUARD, shape[dim])


def assert_finite(name, t):
    assert bool(torch.isfinite(t).all()), f"{name}: non-finite values (a read outside its input)"


def _bits(t):
    return t.view(torch.int16 if t.element_size() == 2 else torch.int32)


def assert_guard(name, buf, before, dim=0):
    """The GUARD rows around the view of `buf` hold the bits they held before the call."""
    n = buf.shape[dim]
    for lo in (0, n - GUARD):
        got, want = buf.narrow(dim, lo, GUARD), before.narrow(dim, lo, GUARD)
        assert torch.equal(_bits(got), _bits(want)), \
            f"{name}: guard rows [{lo}, {lo + GUARD}) changed (a write outside its output)"


# (garbage kind, row shape, sequences): narrow rows take the row-group copy kernel, the tile
# merge / grad kernels; wide rows (8 x 40: 640 bytes in bf16, 40 vectors of 8 elements) the
# wide-row kernels; 200 sequences are past the wave searches' and the snapshot's reach
CASES = [
    pytest.param("random", (5, 24), 200, id="random-narrow-b200"),
    pytest.param("negative", (8, 40), 5, id="negative-wide"),
    pytest.param("decreasing", (5, 24), 7, id="decreasing-narrow"),
    pytest.param("past_end", (8, 40), 6, id="past_end-wide"),
    pytest.param("wrap", (5, 24), 3, id="wrap-narrow"),
    pytest.param("wrap", (8, 40), 200, id="wrap-wide-b200"),
    pytest.param("minmax", (8, 40), 9, id="minmax-wide"),
]


@pytest.mark.parametrize("kind,row,b", CASES)
def test_thd_helpers_on_garbage_offsets(kind, row, b):
    dev = torch.device("cuda", torch.cuda.current_device())
    seed = f"{kind}{row}{b}"
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(len(seed) * 7919 + b)
    cp, rank, total, h, d = 2, 1, 48, row[0], row[1]
    bf16, f32 = torch.bfloat16, torch.float32
    kw = dict(validate=False, backend="kernel")

    def cu_tensor(n_rows):
        return torch.tensor(garbage_cu(kind, b, n_rows, rng), dtype=torch.int32, device=dev)

    cu_g = cu_tensor(total)  # global (partition, reorders)
    _, x = guarded((total, h, d), bf16, dev, gen)

    # copies: every output row is a copy of an input row
    out = thd.partition(x, cu_g, cp, rank, **kw)
    assert out.shape[0] == total // cp
    assert_finite("partition", out)
    assert_finite("reorder_to_contiguous", thd.reorder_to_contiguous(x, cu_g, cp, **kw))
    assert_finite("reorder_to_rank_sharded", thd.reorder_to_rank_sharded(x, cu_g, cp, **kw))
    t = total // cp  # rank-local rows
    cu_l = cu_tensor(t)
    _, x_loc = guarded((t, h, d), bf16, dev, gen)
    assert_finite("read_half", thd.read_half(x_loc, cu_l, "second", **kw))

    # copy_valid_tokens: three garbage arrays; rows without a valid source keep dst's bits
    n_dst, n_src = t + 5, t - 3
    dst_buf, dst = guarded((n_dst, h, d), bf16, dev, gen, fill=-7.0)
    before = dst_buf.clone()
    _, src = guarded((n_src, h, d), bf16, dev, gen)
    thd.copy_valid_tokens(dst, src, cu_tensor(n_src), cu_tensor(n_dst), cu_tensor(n_src), **kw)
    assert_guard("copy_valid_tokens", dst_buf, before)
    assert_finite("copy_valid_tokens", dst)
    xp, cu_p = thd.pad_for_cp(x, cu_tensor(total), cp, 4 * total, **kw)  # fill 0 at padding
    assert_finite("pad_for_cp", xp)
    assert cu_p.dtype == torch.int32 and cu_p.shape == (b + 1,)

    # merges and corrections by halves (rank-local cu_seqlens), into guarded out / lse
    out_dtype = f32 if row[1] == 40 else bf16  # fp32 rows of 8 x 40: the wide merge kernel
    _, out_in = guarded((t, h, d), out_dtype, dev, gen)
    _, lse_in = guarded((h, t), f32, dev, gen, dim=1)
    _, step = guarded((t // 2, h, d), bf16, dev, gen)
    _, lse_step = guarded((h, t // 2), f32, dev, gen, dim=1)
    o, lo = thd.merge_partial(out_in, lse_in, step, lse_step, cu_l, True, **kw)
    assert_finite("merge_partial out", o)
    assert_finite("merge_partial lse", lo)
    out_buf, out_v = guarded((t, h, d), out_dtype, dev, gen)
    lse_buf, lse_v = guarded((h, t), f32, dev, gen, dim=1)
    o_before, l_before = out_buf.clone(), lse_buf.clone()
    thd.merge_partial(out_v, lse_v, step, lse_step, cu_l, True, inplace=True, **kw)
    assert_guard("merge_partial_ out", out_buf, o_before)
    assert_guard("merge_partial_ lse", lse_buf, l_before, dim=1)
    assert_finite("merge_partial_ out", out_v)
    assert_finite("merge_partial_ lse", lse_v)
    o_before, l_before = out_buf.clone(), lse_buf.clone()
    thd.lse_correction(lse_v, lse_step, cu_l, True, inplace=True, **kw)
    assert_guard("lse_correction_", lse_buf, l_before, dim=1)
    assert_finite("lse_correction_", lse_v)
    thd.out_correction(out_v, step, lse_v, lse_step, cu_l, True, inplace=True, **kw)
    assert_guard("out_correction_", out_buf, o_before)
    assert_finite("out_correction_", out_v)

    # grad_correction by halves (both ops: the halves' maps), new tensor and in place
    grad_dtype = bf16  # one dtype with the step: the wide grad kernel takes 8 x 40 rows
    _, grad_in = guarded((t, h, d), grad_dtype, dev, gen)
    assert_finite("grad_correction",
                  thd.grad_correction(grad_in, step, cu_l, "none", "add", **kw))
    g_buf, g_v = guarded((t, h, d), grad_dtype, dev, gen)
    g_before = g_buf.clone()
    _, step_full = guarded((t, h, d), grad_dtype, dev, gen)
    thd.grad_correction(g_v, step_full, cu_l, "copy", "add", inplace=True, **kw)
    assert_guard("grad_correction_", g_buf, g_before)
    assert_finite("grad_correction_", g_v)

    # row indices: garbage int64 rows (and step rows) are clamped into their tensors
    n = 11
    rows = torch.tensor(garbage_rows(n, t, rng), dtype=torch.int64, device=dev)
    step_rows = torch.tensor(garbage_rows(n, t // 2, rng), dtype=torch.int64, device=dev)
    o_before, l_before = out_buf.clone(), lse_buf.clone()
    thd.merge_rows_(out_v, lse_v, step, lse_step, rows, step_rows, backend="kernel")
    assert_guard("merge_rows_ out", out_buf, o_before)
    assert_guard("merge_rows_ lse", lse_buf, l_before, dim=1)
    assert_finite("merge_rows_ out", out_v)
    assert_finite("merge_rows_ lse", lse_v)
    g_before = g_buf.clone()
    thd.add_rows_(g_v, step_full[:n], rows, backend="kernel")
    assert_guard("add_rows_", g_buf, g_before)
    assert_finite("add_rows_", g_v)
    torch.cuda.synchronize()  # a kernel fault surfaces here at the latest
