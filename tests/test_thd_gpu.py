"""GPU tests of the THD kernels (hip_src/thd) behind rocm_attn.thd: backend="kernel" against
backend="torch" (the oracle, itself tested against Python loops in tests/test_thd.py).

Every test is marked ``gpu`` and skipped unless a CUDA/ROCm device is present and the compiled
extension has the THD ops. Copies (partition, reorders, read_half, copy_valid_tokens,
pad_for_cp) and grad_correction must match the torch path bitwise; merges (fp32 math) within
1e-6 (fp32 results) or one unit in the last place (16-bit results, rounded once from fp32
values that may differ in their last bit).

Kernel calls run with ``rocm_attn.thd._kernels.fallback`` patched to fail, so a test cannot
pass by silently taking the torch path. Ops that return fresh tensors run after the caching
allocator was poisoned (its free blocks filled with 0xFF bytes: NaN in every float dtype), so
any element a kernel forgets to write shows up as NaN and fails the bitwise checks.
"""

from __future__ import annotations

import random

import pytest
import torch

from rocm_attn import thd
from rocm_attn.thd import _dispatch, _kernels

from helpers.gpu import gpu_marks, poison_allocator, why_no_kernels

NEG_INF = float("-inf")
I32 = torch.int32


pytestmark = gpu_marks(thd_ops=True)

DTYPES = [pytest.param(torch.bfloat16, id="bf16"), pytest.param(torch.float16, id="fp16"),
          pytest.param(torch.float32, id="fp32")]
ULP = {torch.bfloat16: 2.0**-7, torch.float16: 2.0**-10, torch.float32: 1e-6}


@pytest.fixture
def dev():
    why = why_no_kernels(thd_ops=True)
    if why:
        pytest.skip(why)
    return torch.device("cuda", torch.cuda.current_device())


@pytest.fixture(autouse=True)
def _kernels_only(monkeypatch):
    """The kernel path must serve every call of these tests unless a test allows fallbacks."""
    calls = []

    def fail(name, why, *args):
        calls.append((name, why))
        raise AssertionError(f"rocm_attn.thd.{name} fell back to the torch path: {why}")

    monkeypatch.setattr(_kernels, "fallback", fail)
    monkeypatch.delenv("ROCM_ATTN_VALIDATE", raising=False)
    yield calls


def both(fn, *args, poison=True, **kw):
    """fn(..., backend="kernel") on a poisoned allocator, then fn(..., backend="torch")."""
    dev = next(a.device for a in args if isinstance(a, torch.Tensor))
    if poison:
        poison_allocator(dev)
    k = fn(*args, backend="kernel", validate=False, **kw)
    t = fn(*args, backend="torch", validate=False, **kw)
    return k, t


def assert_bitwise(name, k, t, ctx=""):
    assert k.shape == t.shape and k.dtype == t.dtype, \
        f"{name}: {k.shape}/{k.dtype} vs {t.shape}/{t.dtype} {ctx}"
    if not torch.equal(k, t):
        bad = (k != t) & ~(torch.isnan(k) & torch.isnan(t))
        idx = bad.nonzero()[:5].tolist()
        raise AssertionError(f"{name}: kernel != torch at {idx} (of {int(bad.sum())}) {ctx}")


def assert_merge_close(name, k, t, ctx=""):
    """fp32: rtol/atol 1e-6; 16-bit: one unit in the last place (both rounded once from fp32
    values that may differ in their last bit)."""
    assert k.shape == t.shape and k.dtype == t.dtype, \
        f"{name}: {k.shape}/{k.dtype} vs {t.shape}/{t.dtype}"
    tol = ULP[k.dtype]
    torch.testing.assert_close(k, t, rtol=tol, atol=tol, equal_nan=True,
                               msg=lambda m: f"{name} {ctx}: {m}")
    assert torch.equal(torch.isneginf(k), torch.isneginf(t)), f"{name}: -inf pattern differs {ctx}"


# --------------------------------------------------------------------------------------------
# case builders
# --------------------------------------------------------------------------------------------


def capture_graph(fn):
    """fn run once on a side stream (as capture requires), then captured: (graph, its outputs)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static = fn()
    return graph, static


def cu_of(lens, device):
    out = [0]
    for n in lens:
        out.append(out[-1] + n)
    return torch.tensor(out, dtype=I32, device=device)


def rand_lens(rng, b, max_len, lo=0):
    """Random lengths with empty and single-token sequences mixed in."""
    lens = [rng.randint(lo, max_len) for _ in range(b)]
    for i in range(0, b, 7):
        lens[i] = lo
    for i in range(3, b, 11):
        lens[i] = max(lo, 1)
    rng.shuffle(lens)
    return lens


def padded(lens, cp):
    return [-(-n // (2 * cp)) * (2 * cp) for n in lens]


def randn(shape, dtype, device, gen, layout="contiguous"):
    """Random tensor of `shape` [t, ...]; layout "strided": a slice of a wider fused tensor
    (token stride != row size), "sliced": last dim cut from a wider one (head stride != d,
    3 elements in: narrower vectors), "sliced8": the same 8 elements in (16-byte aligned for
    16-bit dtypes: the 16-byte vector kernels with a head stride)."""
    if layout == "strided":
        base = torch.randn((shape[0], 3) + tuple(shape[1:]), generator=gen).to(device, dtype)
        return base[:, 1]
    if layout in ("sliced", "sliced8"):
        at = 3 if layout == "sliced" else 8
        base = torch.randn(tuple(shape[:-1]) + (shape[-1] + 16,), generator=gen).to(device, dtype)
        return base[..., at:at + shape[-1]]
    return torch.randn(tuple(shape), generator=gen).to(device, dtype)


def global_case(seed, b, max_len, cp, dev, slack=0, lo=0):
    rng = random.Random(seed)
    lens = rand_lens(rng, b, max_len, lo)
    plens = padded(lens, cp)
    total = sum(plens) + slack * 2 * cp
    return lens, plens, cu_of(plens, dev), total


# --------------------------------------------------------------------------------------------
# copies: partition, reorders, read_half
# --------------------------------------------------------------------------------------------


# rows of 5 x 24 elements take the row-group kernel; 8 x 40 (640 / 1280 bytes, 40 / 80 vectors
# of 16 bytes) the wide-row kernel, whose last piece of a row is partly empty
ROWS = [pytest.param((5, 24), id="narrow"), pytest.param((8, 40), id="wide")]
# grad rows of 4 x 24 elements take the tile kernel; 8 x 40 (40 vectors of 8 elements) the
# wide-row kernel where grad and step share a dtype
GRAD_ROWS = [pytest.param((4, 24), id="narrow"), pytest.param((8, 40), id="wide")]


@pytest.mark.parametrize("row", ROWS)
@pytest.mark.parametrize("layout", ["contiguous", "strided", "sliced", "sliced8"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("cp", [1, 2, 4, 8])
def test_partition_reorder_read_half(dev, cp, dtype, layout, row):
    lens, plens, cu_p, total = global_case(cp * 7 + 1, 37, 13 * cp, cp, dev, slack=2)
    gen = torch.Generator().manual_seed(cp)
    x = randn((total,) + row, dtype, dev, gen, layout)
    ctx = f"cp={cp} {dtype} {layout} {row}"
    shards = []
    for r in range(cp):
        k, t = both(thd.partition, x, cu_p, cp, r)
        assert_bitwise(f"partition rank {r}", k, t, ctx)
        assert k.is_contiguous()
        shards.append(k)
        cu_loc = thd.local_cu_seqlens(cu_p, cp)
        for half in ("first", "second"):
            kh, th = both(thd.read_half, k, cu_loc, half)
            assert_bitwise(f"read_half {half} rank {r}", kh, th, ctx)
    gathered = torch.cat(shards)
    k, t = both(thd.reorder_to_contiguous, gathered, cu_p, cp)
    assert_bitwise("reorder_to_contiguous", k, t, ctx)
    assert torch.equal(k, x), f"partition + all-gather + reorder is not the identity ({ctx})"
    k, t = both(thd.reorder_to_rank_sharded, x, cu_p, cp)
    assert_bitwise("reorder_to_rank_sharded", k, t, ctx)
    assert torch.equal(k, gathered), ctx


@pytest.mark.parametrize("cp", [2, 4, 8])
def test_lse_layout_token_dim_last(dev, cp):
    """LSE [h, t] (token dim last), contiguous and as a strided view."""
    lens, plens, cu_p, total = global_case(cp, 29, 9 * cp, cp, dev, slack=1)
    gen = torch.Generator().manual_seed(cp)
    for lse in (torch.randn(6, total, generator=gen).to(dev),
                torch.randn(total, 6, generator=gen).to(dev).t(),          # token stride 6
                torch.randn(2, 3, total, generator=gen).to(dev)):           # heads [2, 3]
        shards = []
        for r in range(cp):
            k, t = both(thd.partition, lse, cu_p, cp, r, dim=-1)
            assert_bitwise(f"partition lse rank {r}", k, t)
            shards.append(k)
            cu_loc = thd.local_cu_seqlens(cu_p, cp)
            k2, t2 = both(thd.read_half, k, cu_loc, "second", dim=-1)
            assert_bitwise("read_half lse", k2, t2)
        gathered = torch.cat(shards, dim=-1)
        k, t = both(thd.reorder_to_contiguous, gathered, cu_p, cp, dim=-1)
        assert_bitwise("reorder_to_contiguous lse", k, t)
        assert torch.equal(k, lse)
        k, t = both(thd.reorder_to_rank_sharded, lse, cu_p, cp, dim=-1)
        assert_bitwise("reorder_to_rank_sharded lse", k, t)


@pytest.mark.parametrize("shape,dtype", [
    ((3, 7), torch.bfloat16),     # 14-byte rows: 2-byte vectors
    ((2, 2), torch.float16),      # 8-byte rows
    ((5,), torch.float32),        # 20-byte rows: 4-byte vectors
    ((1, 4, 1), torch.float64),   # size-1 dims, 8-byte elements
    ((), torch.float32),          # [t] vectors
    ((16, 128), torch.bfloat16),  # 4 KB rows
])
def test_odd_row_sizes(dev, shape, dtype):
    cp = 2
    lens, plens, cu_p, total = global_case(11, 23, 20, cp, dev)
    gen = torch.Generator().manual_seed(1)
    x = torch.randn((total,) + shape, generator=gen).to(dev, dtype)
    for r in range(cp):
        k, t = both(thd.partition, x, cu_p, cp, r)
        assert_bitwise(f"partition {shape}", k, t)
    k, t = both(thd.reorder_to_contiguous, x, cu_p, cp)
    assert_bitwise(f"reorder {shape}", k, t)


def test_misaligned_base_pointer(dev):
    """A view 2 bytes past a 16-byte boundary: narrower vectors, same bytes."""
    cp = 2
    lens, plens, cu_p, total = global_case(3, 19, 16, cp, dev)
    flat = torch.randn(total * 64 + 1).to(dev, torch.bfloat16)
    x = flat[1:].view(total, 4, 16)
    assert x.data_ptr() % 16 == 2
    k, t = both(thd.partition, x, cu_p, cp, 1)
    assert_bitwise("partition misaligned", k, t)
    src = flat[1:1 + total * 64].view(total, 4, 16)
    cu = cu_of(lens, dev)
    kd = torch.zeros(total, 4, 16, device=dev, dtype=torch.bfloat16)
    td = kd.clone()
    thd.copy_valid_tokens(kd, src, cu, cu_p, None, fill=-1.0, backend="kernel")
    thd.copy_valid_tokens(td, src, cu, cu_p, None, fill=-1.0, backend="torch")
    assert_bitwise("copy_valid_tokens misaligned", kd, td)


# --------------------------------------------------------------------------------------------
# copy_valid_tokens / pad_for_cp
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("row", [pytest.param((3, 40), id="narrow"), ROWS[1]])
@pytest.mark.parametrize("layout", ["contiguous", "strided"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("pads", ["both", "dst", "src", "packed"])
@pytest.mark.parametrize("fill", [None, 0.0, NEG_INF])
def test_copy_valid_tokens(dev, fill, pads, dtype, layout, row):
    rng = random.Random(f"copy{pads}{dtype}{layout}")
    b = 41
    lens = rand_lens(rng, b, 9)
    src_slots = [n + rng.randint(0, 3) if pads in ("both", "src") else n for n in lens]
    dst_slots = [n + rng.randint(0, 3) if pads in ("both", "dst") else n for n in lens]
    cu = cu_of(lens, dev)
    cu_s = cu_of(src_slots, dev) if pads in ("both", "src") else None
    cu_d = cu_of(dst_slots, dev) if pads in ("both", "dst") else None
    gen = torch.Generator().manual_seed(5)
    src = randn((sum(src_slots) + 2,) + row, dtype, dev, gen, layout)
    dst0 = randn((sum(dst_slots) + 3,) + row, dtype, dev, gen)
    kd, td = dst0.clone(), dst0.clone()
    r = thd.copy_valid_tokens(kd, src, cu, cu_d, cu_s, fill=fill, backend="kernel")
    assert r is kd
    thd.copy_valid_tokens(td, src, cu, cu_d, cu_s, fill=fill, backend="torch")
    assert_bitwise("copy_valid_tokens", kd, td, f"{pads} fill={fill} {dtype} {layout}")
    # LSE [h, t]: token dim last, into a strided destination
    lse_src = torch.randn(4, src.shape[0], generator=gen).to(dev)
    base = torch.randn(dst0.shape[0], 8, generator=gen).to(dev)
    kl, tl = base.clone().t()[:4], base.clone().t()[:4]
    thd.copy_valid_tokens(kl, lse_src, cu, cu_d, cu_s, dim=-1, fill=fill, backend="kernel")
    thd.copy_valid_tokens(tl, lse_src, cu, cu_d, cu_s, dim=-1, fill=fill, backend="torch")
    assert_bitwise("copy_valid_tokens lse", kl, tl)


@pytest.mark.parametrize("row", [pytest.param((3, 40), id="narrow"), ROWS[1],
                                 pytest.param((16, 64), id="wide2k")])
@pytest.mark.parametrize("fill", [None, 0.0])
def test_copy_writes_stay_inside_dst(dev, fill, row):
    """dst is a window of a larger buffer: the rows around it keep their bits (row counts that
    leave the kernels' last block partly empty)."""
    rng = random.Random(f"guard{row}{fill}")
    lens = rand_lens(rng, 13, 11)
    slots = [n + rng.randint(0, 2) for n in lens]
    slots[-1] += (1 - sum(slots)) % 4  # t % 4 == 1: the last block has rows to spare
    cu, cu_d = cu_of(lens, dev), cu_of(slots, dev)
    gen = torch.Generator().manual_seed(7)
    src = torch.randn((sum(lens),) + row, generator=gen).to(dev, torch.bfloat16)
    t = sum(slots)
    for before, after in ((0, 5), (3, 1), (1, 8)):
        buf = torch.randn((before + t + after,) + row, generator=gen).to(dev, torch.bfloat16)
        ref = buf.clone()
        thd.copy_valid_tokens(buf[before:before + t], src, cu, cu_d, fill=fill, backend="kernel")
        thd.copy_valid_tokens(ref[before:before + t], src, cu, cu_d, fill=fill, backend="torch")
        assert_bitwise(f"copy_valid_tokens window [{before}, +{t}, {after}]", buf, ref)


@pytest.mark.parametrize("dtype", DTYPES)
def test_outer_dims_before_the_token_dim(dev, dtype):
    """[2, t, h, d] with the token dim 1 (outer slices: K and V stacked): every copy helper,
    including the wide-row kernels' (o, row) slots."""
    cp = 2
    lens, plens, cu_p, total = global_case(5, 19, 24, cp, dev, slack=1)
    gen = torch.Generator().manual_seed(9)
    x = torch.randn(2, total, 8, 40, generator=gen).to(dev, dtype)
    cu_loc = thd.local_cu_seqlens(cu_p, cp)
    for r in range(cp):
        k, t = both(thd.partition, x, cu_p, cp, r, dim=1)
        assert_bitwise(f"partition outer rank {r}", k, t)
        kh, th = both(thd.read_half, k, cu_loc, "second", dim=1)
        assert_bitwise(f"read_half outer rank {r}", kh, th)
    k, t = both(thd.reorder_to_contiguous, x, cu_p, cp, dim=1)
    assert_bitwise("reorder_to_contiguous outer", k, t)
    k, t = both(thd.reorder_to_rank_sharded, x, cu_p, cp, dim=1)
    assert_bitwise("reorder_to_rank_sharded outer", k, t)


@pytest.mark.parametrize("row", [GRAD_ROWS[0], GRAD_ROWS[1], pytest.param((16, 64), id="wide2k")])
@pytest.mark.parametrize("ops", [("none", "add"), ("add", "add")], ids=lambda o: "-".join(o))
def test_grad_writes_stay_inside_grad(dev, ops, row):
    """In-place grad_correction on a window of a larger buffer: the rows around it keep their
    bits (row counts that leave the kernels' last block partly empty)."""
    cu, t = local_case(13, 9, 5, dev)
    if t % 4 == 0:  # the last block has rows to spare
        cu, t = local_case(14, 9, 5, dev)
    gen = torch.Generator().manual_seed(3)
    gs = torch.randn((t // 2 if ops[0] == "none" else t,) + row, generator=gen).to(
        dev, torch.bfloat16)
    for before, after in ((0, 3), (2, 1)):
        buf = torch.randn((before + t + after,) + row, generator=gen).to(dev, torch.bfloat16)
        ref = buf.clone()
        thd.grad_correction(buf[before:before + t], gs, cu, *ops, inplace=True, backend="kernel")
        thd.grad_correction(ref[before:before + t], gs, cu, *ops, inplace=True, backend="torch")
        assert_bitwise(f"grad_correction {ops} window [{before}, +{t}, {after}]", buf, ref)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
@pytest.mark.parametrize("h", [3, 16])
@pytest.mark.parametrize("half", [False, True], ids=["full", "second_half"])
def test_merge_writes_stay_inside_out(dev, half, h, dtype):
    """In-place merge_partial on windows of larger out / lse buffers: the rows around them keep
    their bits (row counts that leave the kernels' last block partly empty)."""
    cu, t = local_case(15, 9, 5, dev)
    ts = t // 2 if half else t
    d = 64
    gen = torch.Generator().manual_seed(4)
    step = torch.randn(ts, h, d, generator=gen).to(dev, torch.bfloat16)
    lse_step = torch.randn(h, ts, generator=gen).to(dev)
    for before, after in ((0, 3), (2, 1)):
        out = torch.randn(before + t + after, h, d, generator=gen).to(dev, dtype)
        lse = torch.randn(h, before + t + after, generator=gen).to(dev)
        ko, kl, to, tl = out.clone(), lse.clone(), out.clone(), lse.clone()
        win = slice(before, before + t)
        thd.merge_partial(ko[win], kl[:, win], step, lse_step, cu if half else None, half,
                          inplace=True, backend="kernel")
        thd.merge_partial(to[win], tl[:, win], step, lse_step, cu if half else None, half,
                          inplace=True, backend="torch")
        ctx = f"window [{before}, +{t}, {after}]"
        assert torch.equal(ko[:before], out[:before]) and torch.equal(ko[before + t:],
                                                                      out[before + t:]), ctx
        assert torch.equal(kl[:, :before], lse[:, :before]), ctx
        assert torch.equal(kl[:, before + t:], lse[:, before + t:]), ctx
        assert_merge_close("merge_partial", ko, to, ctx)
        assert_merge_close("merge_partial lse", kl, tl, ctx)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("cp", [1, 2, 4, 8])
def test_pad_for_cp(dev, cp, dtype):
    rng = random.Random(cp)
    lens = rand_lens(rng, 53, 23)
    cu = cu_of(lens, dev)
    gen = torch.Generator().manual_seed(cp)
    x = randn((sum(lens), 2, 32), dtype, dev, gen, "strided")
    (kx, kc), (tx, tc) = both(thd.pad_for_cp, x, cu, cp)
    assert_bitwise("pad_for_cp x", kx, tx)
    assert_bitwise("pad_for_cp cu", kc, tc)


# --------------------------------------------------------------------------------------------
# merges
# --------------------------------------------------------------------------------------------


def local_case(seed, b, max_half, dev, slack=0):
    """Rank-local padded cu_seqlens (even lengths, with 0- and 2-token sequences)."""
    rng = random.Random(seed)
    lens = [2 * n for n in rand_lens(rng, b, max_half)]
    t = sum(lens) + 2 * slack
    return cu_of(lens, dev), t


def lse_pair(h, t, t_step, dev, gen, scale=4.0):
    lse = torch.randn(h, t, generator=gen) * scale
    lse_step = torch.randn(h, t_step, generator=gen) * scale
    lse[:, ::5] = NEG_INF          # empty running rows (their out is junk: NaN below)
    lse_step[:, 1::4] = NEG_INF    # step rows with no keys
    lse_step[0, 2::9] = 1e4        # huge gaps
    return lse.to(dev), lse_step.to(dev)


MERGE_DTYPES = [  # (out, out_step)
    pytest.param(torch.bfloat16, torch.bfloat16, id="bf16"),
    pytest.param(torch.float16, torch.float16, id="fp16"),
    pytest.param(torch.float32, torch.float32, id="fp32"),
    pytest.param(torch.float32, torch.bfloat16, id="fp32acc_bf16"),
    pytest.param(torch.float32, torch.float16, id="fp32acc_fp16"),
]


# 3 heads: the tile kernel; 8 heads (64 / 40 vectors of 8 elements a row): the wide-row kernel
@pytest.mark.parametrize("h", [3, 8])
@pytest.mark.parametrize("inplace", [False, True], ids=["new", "inplace"])
@pytest.mark.parametrize("half", [False, True], ids=["full", "second_half"])
@pytest.mark.parametrize("out_dtype,step_dtype", MERGE_DTYPES)
# d=96 with 8 heads: 12 vectors a head, so a head straddles the wide kernel's 64-vector pieces
@pytest.mark.parametrize("d,layout", [(64, "contiguous"), (64, "strided"), (40, "sliced"),
                                      (64, "sliced8"), (96, "contiguous"), (13, "contiguous")])
def test_merge_partial(dev, d, layout, out_dtype, step_dtype, half, inplace, h):
    cu, t = local_case(d, 57, 9, dev, slack=1)
    ts = t // 2 if half else t
    gen = torch.Generator().manual_seed(d)
    out = randn((t, h, d), out_dtype, dev, gen, layout)
    out_step = randn((ts, h, d), step_dtype, dev, gen, layout)
    lse, lse_step = lse_pair(h, t, ts, dev, gen)
    out[torch.isneginf(lse).t()] = float("nan")  # junk in empty accumulator rows is dropped
    ctx = f"d={d} h={h} {layout} {out_dtype}/{step_dtype} half={half} inplace={inplace}"
    args = (out_step, lse_step, cu if half else None, half)
    if inplace:
        ko, kl = out.clone(), lse.clone()
        r = thd.merge_partial(ko, kl, *args, inplace=True, backend="kernel")
        assert r[0] is ko and r[1] is kl
        to, tl = thd.merge_partial(out.clone(), lse.clone(), *args, inplace=True, backend="torch")
    else:
        (ko, kl), (to, tl) = both(thd.merge_partial, out, lse, *args)
    assert not torch.isnan(kl).any()
    assert_merge_close("out", ko, to, ctx)
    assert_merge_close("lse", kl, tl, ctx)
    if half:  # first halves untouched (copied bitwise into new tensors)
        first = thd.read_half(torch.arange(t, device=dev), cu, "first", backend="torch")
        assert torch.equal(ko[first].nan_to_num(7.0), out[first].nan_to_num(7.0)), ctx
        assert torch.equal(kl[:, first], lse[:, first]), ctx


@pytest.mark.parametrize("out_dtype,step_dtype", MERGE_DTYPES)
@pytest.mark.parametrize("d", [64, 13])
def test_merge_rows(dev, d, out_dtype, step_dtype):
    """Packed step rows merged by index (attn_with_cp's windowed steps): kernel vs torch path;
    rows not named stay bitwise, the dummy row named many times is not compared."""
    gen = torch.Generator().manual_seed(d)
    t, n, h = 97, 61, 3
    out = randn((t + 1, h, d), out_dtype, dev, gen, "contiguous")
    lse, _ = lse_pair(h, t + 1, t + 1, dev, gen)
    out_step = randn((n, h, d), step_dtype, dev, gen, "contiguous")
    _, lse_step = lse_pair(h, n, n, dev, gen)
    rows = torch.randperm(t, generator=gen)[:n].to(dev)
    rows[::7] = t  # the dummy row, several times
    ko, kl = thd.merge_rows_(out.clone(), lse.clone(), out_step, lse_step, rows,
                             backend="kernel")
    to, tl = thd.merge_rows_(out.clone(), lse.clone(), out_step, lse_step, rows,
                             backend="torch")
    ctx = f"d={d} {out_dtype}/{step_dtype}"
    assert_merge_close("out", ko[:t], to[:t], ctx)
    assert_merge_close("lse", kl[:, :t], tl[:, :t], ctx)
    untouched = torch.ones(t + 1, dtype=torch.bool, device=dev)
    untouched[rows] = False
    assert torch.equal(ko[untouched].nan_to_num(7.0), out[untouched].nan_to_num(7.0)), ctx


@pytest.mark.parametrize("out_dtype,step_dtype", MERGE_DTYPES)
@pytest.mark.parametrize("d", [64, 13])
def test_merge_rows_with_step_rows(dev, d, out_dtype, step_dtype):
    """Step results laid out like out (attn_with_cp's direct flash calls): entry k reads step
    row step_rows[k]; kernel vs torch path, junk in unnamed step rows never read."""
    gen = torch.Generator().manual_seed(d + 1)
    t, n, h = 97, 61, 3
    out = randn((t + 1, h, d), out_dtype, dev, gen, "contiguous")
    lse, _ = lse_pair(h, t + 1, t + 1, dev, gen)
    out_step = randn((t, h, d), step_dtype, dev, gen, "contiguous")
    _, lse_step = lse_pair(h, t, t, dev, gen)
    src = torch.randperm(t, generator=gen)[:n].to(dev)
    rows = src.clone()
    rows[::7] = t  # dropped entries go to the dummy row
    junk = torch.ones(t, dtype=torch.bool, device=dev)
    junk[src] = False
    out_step[junk] = float("nan")
    lse_step[:, junk] = float("nan")
    ko, kl = thd.merge_rows_(out.clone(), lse.clone(), out_step, lse_step, rows, src,
                             backend="kernel")
    to, tl = thd.merge_rows_(out.clone(), lse.clone(), out_step, lse_step, rows, src,
                             backend="torch")
    ctx = f"d={d} {out_dtype}/{step_dtype}"
    assert not torch.isnan(kl[:, :t]).any(), ctx
    assert_merge_close("out", ko[:t], to[:t], ctx)
    assert_merge_close("lse", kl[:, :t], tl[:, :t], ctx)


@pytest.mark.parametrize("grad_dtype,step_dtype", MERGE_DTYPES)
@pytest.mark.parametrize("d", [64, 13])
def test_add_rows(dev, d, grad_dtype, step_dtype):
    gen = torch.Generator().manual_seed(d + 2)
    t, n, h = 97, 61, 3
    grad = randn((t + 1, h, d), grad_dtype, dev, gen, "contiguous")
    step = randn((t, h, d), step_dtype, dev, gen, "contiguous")
    src = torch.randperm(t, generator=gen)[:n].to(dev)
    rows = src.clone()
    rows[::7] = t
    junk = torch.ones(t, dtype=torch.bool, device=dev)
    junk[src] = False
    step[junk] = float("nan")
    kg = thd.add_rows_(grad.clone(), step, rows, src, backend="kernel")
    tg = thd.add_rows_(grad.clone(), step, rows, src, backend="torch")
    ctx = f"d={d} {grad_dtype}/{step_dtype}"
    assert not torch.isnan(kg[:t].float()).any(), ctx
    torch.testing.assert_close(kg[:t].float(), tg[:t].float(), rtol=1e-2, atol=1e-2, msg=ctx)
    untouched = torch.ones(t + 1, dtype=torch.bool, device=dev)
    untouched[rows] = False
    assert torch.equal(kg[untouched], grad[untouched]), ctx
    kp = thd.add_rows_(grad.clone(), step[src], rows, backend="kernel")  # packed: row k
    assert torch.equal(kp[:t], kg[:t]), ctx


@pytest.mark.parametrize("h", [4, 12])  # 24 / 72 vectors a row: tile / wide-row kernel
@pytest.mark.parametrize("inplace", [False, True], ids=["new", "inplace"])
@pytest.mark.parametrize("half", [False, True], ids=["full", "second_half"])
def test_lse_and_out_correction(dev, half, inplace, h):
    cu, t = local_case(3, 45, 11, dev, slack=2)
    ts = t // 2 if half else t
    d = 48
    gen = torch.Generator().manual_seed(3)
    lse, lse_step = lse_pair(h, t, ts, dev, gen)
    out = torch.randn(t, h, d, generator=gen).to(dev)  # fp32 accumulator
    out_step = torch.randn(ts, h, d, generator=gen).to(dev, torch.bfloat16)
    cu_arg = cu if half else None
    if inplace:
        kl = lse.clone()
        assert thd.lse_correction(kl, lse_step, cu_arg, half, inplace=True, backend="kernel") is kl
        tl = thd.lse_correction(lse.clone(), lse_step, cu_arg, half, inplace=True, backend="torch")
    else:
        kl, tl = both(thd.lse_correction, lse, lse_step, cu_arg, half)
    assert_merge_close("lse_correction", kl, tl)
    # the same LSE as merge_partial's, bitwise
    _, ml = thd.merge_partial(out, lse, out_step, lse_step, cu_arg, half, backend="kernel")
    assert torch.equal(kl, ml)
    if inplace:
        ko = out.clone()
        assert thd.out_correction(ko, out_step, tl, lse_step, cu_arg, half, inplace=True,
                                  backend="kernel") is ko
        to = thd.out_correction(out.clone(), out_step, tl, lse_step, cu_arg, half, inplace=True,
                                backend="torch")
    else:
        ko, to = both(thd.out_correction, out, out_step, tl, lse_step, cu_arg, half)
    assert_merge_close("out_correction", ko, to)


def test_merge_identity_and_two_pass(dev):
    """(empty, -inf) is the identity of the merge; lse_correction + out_correction over steps
    equals merging them one by one."""
    t, h, d = 300, 2, 64
    gen = torch.Generator().manual_seed(9)
    steps = [(torch.randn(t, h, d, generator=gen).to(dev, torch.bfloat16),
              (torch.randn(h, t, generator=gen) * 3).to(dev)) for _ in range(3)]
    steps[1][1][:, ::3] = NEG_INF
    acc = torch.full((t, h, d), float("nan"), device=dev)
    lse = torch.full((h, t), NEG_INF, device=dev)
    for o_s, l_s in steps:
        thd.merge_partial(acc, lse, o_s, l_s, inplace=True, backend="kernel")
    fin = torch.full((h, t), NEG_INF, device=dev)
    for _, l_s in steps:
        fin = thd.lse_correction(fin, l_s, backend="kernel")
    two = torch.zeros(t, h, d, device=dev)
    for o_s, l_s in steps:
        two = thd.out_correction(two, o_s, fin, l_s, backend="kernel")
    torch.testing.assert_close(lse, fin, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(acc, two, rtol=1e-5, atol=1e-5)


# --------------------------------------------------------------------------------------------
# grad_correction
# --------------------------------------------------------------------------------------------

GRAD_OPS = [("none", "add"), ("add", "none"), ("copy", "none"), ("none", "copy"), ("add", "add"),
            ("copy", "copy"), ("copy", "add"), ("add", "copy")]


@pytest.mark.parametrize("row", GRAD_ROWS)
@pytest.mark.parametrize("inplace", [False, True], ids=["new", "inplace"])
@pytest.mark.parametrize("step", ["full", "half"])
@pytest.mark.parametrize("ops", GRAD_OPS, ids=lambda o: "-".join(o))
@pytest.mark.parametrize("gdtype,sdtype", [(torch.bfloat16, torch.bfloat16),
                                           (torch.float16, torch.float16),
                                           (torch.float32, torch.float32),
                                           (torch.float32, torch.bfloat16),
                                           (torch.bfloat16, torch.float32)])
def test_grad_correction(dev, gdtype, sdtype, ops, step, inplace, row):
    if step == "half" and (ops[0] == "none") == (ops[1] == "none"):
        pytest.skip("a half step needs exactly one op 'none'")
    cu, t = local_case(7, 61, 10, dev, slack=1)
    gen = torch.Generator().manual_seed(7)
    grad = randn((t,) + row, gdtype, dev, gen, "strided")
    gs = randn((t if step == "full" else t // 2,) + row, sdtype, dev, gen)
    ctx = f"{gdtype}/{sdtype} {ops} {step} inplace={inplace} {row}"
    if inplace:
        kg = grad.clone()
        assert thd.grad_correction(kg, gs, cu, *ops, inplace=True, backend="kernel") is kg
        tg = thd.grad_correction(grad.clone(), gs, cu, *ops, inplace=True, backend="torch")
    else:
        kg, tg = both(thd.grad_correction, grad, gs, cu, *ops)
    assert_bitwise("grad_correction", kg, tg, ctx)


# --------------------------------------------------------------------------------------------
# scale: 50k sequences
# --------------------------------------------------------------------------------------------


def test_50k_sequences(dev):
    """50k sequences (0..8 tokens, padded): no cap on the number of sequences anywhere."""
    cp, b = 2, 50_000
    g = torch.Generator().manual_seed(0)
    lens = torch.randint(0, 9, (b,), generator=g)
    cu = torch.cat([torch.zeros(1, dtype=torch.long), lens.cumsum(0)]).to(dev, I32)
    x = torch.randn(int(lens.sum()), 2, 16, generator=g).to(dev, torch.bfloat16)
    (xp, cu_p), (txp, tcu) = both(thd.pad_for_cp, x, cu, cp)
    assert_bitwise("pad_for_cp 50k", xp, txp)
    assert torch.equal(cu_p, tcu)
    shards = []
    for r in range(cp):
        k, t = both(thd.partition, xp, cu_p, cp, r)
        assert_bitwise("partition 50k", k, t)
        shards.append(k)
    k, t = both(thd.reorder_to_contiguous, torch.cat(shards), cu_p, cp)
    assert_bitwise("reorder 50k", k, t)
    assert torch.equal(k, xp)
    cu_loc = thd.local_cu_seqlens(cu_p, cp)
    k, t = both(thd.read_half, shards[1], cu_loc, "second")
    assert_bitwise("read_half 50k", k, t)
    tl = shards[1].shape[0]
    lse, lse_step = lse_pair(2, tl, tl // 2, dev, g)
    out = shards[1].float()
    step = torch.randn(tl // 2, 2, 16, generator=g).to(dev, torch.bfloat16)
    (ko, kl), (to, tll) = both(thd.merge_partial, out, lse, step, lse_step, cu_loc, True)
    assert_merge_close("merge 50k out", ko, to)
    assert_merge_close("merge 50k lse", kl, tll)
    kg, tg = both(thd.grad_correction, shards[1], step.to(torch.bfloat16), cu_loc, "none", "add")
    assert_bitwise("grad 50k", kg, tg)
    dst = torch.zeros_like(xp)
    tdst = dst.clone()
    thd.copy_valid_tokens(dst, x, cu, cu_p, None, fill=1.0, backend="kernel")
    thd.copy_valid_tokens(tdst, x, cu, cu_p, None, fill=1.0, backend="torch")
    assert_bitwise("copy_valid_tokens 50k", dst, tdst)


# b = 100: more sequences than a cu_seqlens snapshot holds on 32-lane waves (kSnapshotWords: the
# kernels map after the wait, with the chunked wave searches); b = 300: past every wave search on
# both wave sizes (binary search). Rows: 8 x 40 (one piece of a wide-row kernel's row, partly
# empty) and 144 x 64 (1152 16-byte vectors of bf16: 18 pieces on 32-lane waves, 9 on 64, rounded
# up to 32 / 16 waves a row, the surplus finding no vector; 8 heads a piece of the fp32 merge).
@pytest.mark.parametrize("row", [pytest.param((8, 40), id="1piece"),
                                 pytest.param((144, 64), id="18pieces")])
@pytest.mark.parametrize("b", [100, 300], ids=lambda b: f"b{b}")
@pytest.mark.parametrize("wide", [True, False], ids=["wide", "rowgroup"])
def test_wide_rows_many_sequences(dev, wide, b, row, tuning):
    """Also with the wide-row kernels turned off (tuning thd_*_wide = 0): the row-group and tile
    kernels on the same rows."""
    if not wide:
        tuning(thd_copy_wide=0, thd_merge_wide=0, thd_grad_wide=0)
    cp, rank = 4, 1
    lens, plens, cu_p, total = global_case(b, b, 2 * 2 * cp, cp, dev, slack=1)
    gen = torch.Generator().manual_seed(b)
    bf16 = torch.bfloat16
    x = randn((total,) + row, bf16, dev, gen)
    ctx = f"b={b} row={row}"
    shards = []
    for r in range(cp):
        k, t = both(thd.partition, x, cu_p, cp, r)
        assert_bitwise(f"partition rank {r}", k, t, ctx)
        shards.append(k)
    k, t = both(thd.reorder_to_contiguous, torch.cat(shards), cu_p, cp)
    assert_bitwise("reorder_to_contiguous", k, t, ctx)
    assert torch.equal(k, x), ctx
    k, t = both(thd.reorder_to_rank_sharded, x, cu_p, cp)
    assert_bitwise("reorder_to_rank_sharded", k, t, ctx)
    cu_loc = thd.local_cu_seqlens(cu_p, cp)
    shard = shards[rank]
    for half in ("first", "second"):
        k, t = both(thd.read_half, shard, cu_loc, half)
        assert_bitwise(f"read_half {half}", k, t, ctx)
    # valid tokens: packed -> padded (fill), padded -> packed
    cu_valid = cu_of(lens, dev)
    packed = randn((sum(lens),) + row, bf16, dev, gen)
    dst = randn((total,) + row, bf16, dev, gen)
    kd, td = dst.clone(), dst.clone()
    thd.copy_valid_tokens(kd, packed, cu_valid, cu_p, None, fill=0.0, backend="kernel")
    thd.copy_valid_tokens(td, packed, cu_valid, cu_p, None, fill=0.0, backend="torch")
    assert_bitwise("copy_valid_tokens packed -> padded", kd, td, ctx)
    k, t = both(thd.copy_valid_tokens, torch.empty_like(packed), x, cu_valid, None, cu_p)
    assert_bitwise("copy_valid_tokens padded -> packed", k, t, ctx)
    # the rank's second halves: fp32 accumulator, bf16 step (and a bf16 accumulator)
    h, t_loc = row[0], shard.shape[0]
    lse, lse_step = lse_pair(h, t_loc, t_loc // 2, dev, gen)
    step = randn((t_loc // 2,) + row, bf16, dev, gen)
    for acc in (shard.float(), shard):
        (ko, kl), (to, tl) = both(thd.merge_partial, acc, lse, step, lse_step, cu_loc, True)
        assert_merge_close(f"merge {acc.dtype} out", ko, to, ctx)
        assert_merge_close(f"merge {acc.dtype} lse", kl, tl, ctx)
        ko, kl = acc.clone(), lse.clone()
        thd.merge_partial(ko, kl, step, lse_step, cu_loc, True, inplace=True, backend="kernel")
        assert_merge_close(f"merge_ {acc.dtype} out", ko, to, ctx)
        assert_merge_close(f"merge_ {acc.dtype} lse", kl, tl, ctx)
    k, t = both(thd.out_correction, shard.float(), step, tl, lse_step, cu_loc, True)
    assert_merge_close("out_correction", k, t, ctx)
    for ops in (("none", "add"), ("copy", "none")):
        k, t = both(thd.grad_correction, shard, step, cu_loc, *ops)
        assert_bitwise(f"grad_correction {ops}", k, t, ctx)
    k, t = both(thd.grad_correction, shard, x[:t_loc], cu_loc, "add", "add")
    assert_bitwise("grad_correction add-add", k, t, ctx)


# --------------------------------------------------------------------------------------------
# dispatch: auto picks the kernels; what they do not serve falls back (correctly)
# --------------------------------------------------------------------------------------------


def test_auto_uses_kernels(dev):
    cp = 2
    _, _, cu_p, total = global_case(1, 9, 12, cp, dev)
    x = torch.randn(total, 2, 8, device=dev)
    assert _dispatch.impl("partition", x, "auto") is _kernels.kernel_partition
    assert torch.equal(thd.partition(x, cu_p, cp, 1),
                       thd.partition(x, cu_p, cp, 1, backend="torch"))


def test_fallbacks_are_correct(dev, monkeypatch, _kernels_only):
    """Calls the kernels do not serve run on the torch path with backend='kernel' too."""
    seen = []

    def record(name, why, *args):
        seen.append((name, why))
        return _dispatch.TORCH[name](*args)

    monkeypatch.setattr(_kernels, "fallback", record)
    cp = 2
    _, _, cu_p, total = global_case(2, 9, 12, cp, dev)
    x = torch.randn(total, 3, 8, device=dev, dtype=torch.float64)
    cu_loc = thd.local_cu_seqlens(cu_p, cp)
    # mixed-dtype copy: converted on the torch path
    dst = torch.zeros(total, 3, 8, device=dev, dtype=torch.bfloat16)
    src = torch.randn(total, 3, 8, device=dev)
    thd.copy_valid_tokens(dst, src, cu_p, backend="kernel")
    assert torch.equal(dst, src.bfloat16())
    # fp64 merge
    lse = torch.randn(3, total, device=dev, dtype=torch.float64)
    o, l_ = thd.merge_partial(x, lse, x, lse, backend="kernel")
    assert torch.allclose(o, x) and torch.allclose(l_, lse + 0.6931471805599453)
    # inputs that require grad: the torch path keeps the graph
    xr = torch.randn(total, 3, 8, device=dev, requires_grad=True)
    shard = thd.partition(xr, cu_p, cp, 0, backend="kernel")
    shard.sum().backward()
    assert xr.grad is not None and float(xr.grad.sum()) == shard.numel()
    # non-mergeable layout: [t, 4, 6] with a permuted head/elem order
    y = torch.randn(total, 6, 4, device=dev).transpose(1, 2)[:, :, :5]
    k = thd.read_half(y[: total // cp], cu_loc, "first", backend="kernel")
    assert torch.equal(k, thd.read_half(y[: total // cp], cu_loc, "first", backend="torch"))
    # in place with aliasing inputs
    g = torch.randn(total // cp, 3, 8, device=dev)
    ref = thd.grad_correction(g.clone(), g.clone(), cu_loc, "add", "copy", backend="torch")
    thd.grad_correction(g, g, cu_loc, "add", "copy", inplace=True, backend="kernel")
    assert torch.equal(g, ref)
    names = [n for n, _ in seen]
    assert names == ["copy_valid_tokens", "merge_partial", "partition", "read_half",
                     "grad_correction"], seen


# --------------------------------------------------------------------------------------------
# CUDA graphs, torch.compile, opcheck
# --------------------------------------------------------------------------------------------


def test_cuda_graph_partition_merge(dev):
    """partition + read_half + merge (second halves, in place) + grad_correction captured once,
    replayed on new data and new device-side sequence lengths; equal to eager."""
    cp, rank, b, h, d = 4, 1, 33, 4, 64
    total = 8 * cp * 40
    gen = torch.Generator().manual_seed(0)

    def lens_cu(seed):
        rng = random.Random(seed)
        plens = padded(rand_lens(rng, b, 30), cp)
        plens[-1] += total - sum(plens) - 2 * cp * 3  # keep 3 blocks of slack, fixed total
        assert plens[-1] >= 0 and sum(plens) <= total
        return cu_of(plens, dev)

    x = torch.randn(total, h, d, generator=gen).to(dev, torch.bfloat16)
    cu_p = lens_cu(0)
    t_loc = total // cp
    out = torch.randn(t_loc, h, d, generator=gen).to(dev)
    lse = torch.randn(h, t_loc, generator=gen).to(dev)
    out_step = torch.randn(t_loc // 2, h, d, generator=gen).to(dev, torch.bfloat16)
    lse_step = torch.randn(h, t_loc // 2, generator=gen).to(dev)
    cu_loc = torch.empty_like(cu_p)

    def step():
        cu_loc.copy_(torch.div(cu_p, cp, rounding_mode="floor"))
        shard = thd.partition(x, cu_p, cp, rank, backend="kernel", validate=False)
        q2 = thd.read_half(shard, cu_loc, "second", backend="kernel", validate=False)
        thd.merge_partial(out, lse, out_step, lse_step, cu_loc, True, inplace=True,
                          backend="kernel", validate=False)
        dq = thd.grad_correction(shard.float(), q2, cu_loc, "none", "add", backend="kernel",
                                 validate=False)
        return shard, q2, dq

    def snapshot():
        return [t.clone() for t in (x, cu_p, out, lse, out_step, lse_step)]

    def restore(s):
        for t, v in zip((x, cu_p, out, lse, out_step, lse_step), s):
            t.copy_(v)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        s0 = snapshot()
        step()
        restore(s0)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static = step()
    # new data, new lengths
    restore(s0)
    x.copy_(torch.randn(total, h, d, generator=gen).to(dev, torch.bfloat16))
    cu_p.copy_(lens_cu(1))
    out_step.copy_(torch.randn(t_loc // 2, h, d, generator=gen).to(dev, torch.bfloat16))
    before = snapshot()
    graph.replay()
    replayed = [t.clone() for t in static] + [out.clone(), lse.clone()]
    restore(before)
    eager = list(step()) + [out.clone(), lse.clone()]
    for name, a, e in zip(("shard", "q2", "dq", "out", "lse"), replayed, eager):
        assert torch.equal(a, e), f"{name}: graph replay != eager"


@pytest.mark.parametrize("prefetch", ["default", "0"])
def test_dependent_calls_back_to_back(dev, prefetch, tuning):
    """A chain of THD kernels, each reading what the one before it wrote, launched back to back
    (on sm_90 each may start while the one before drains: common/launch.h): equal to the torch
    path, eagerly on a poisoned allocator and under graph replay. The first kernel (a 100+ MB
    reorder, several waves of blocks) is still writing when the next one's blocks start, so a
    kernel that touched memory before its wait would read poison or the last round's data.
    With and without the L2 prefetch of guessed rows before the wait (copy_wide_kernel.h)."""
    if prefetch != "default":
        tuning(thd_prefetch=int(prefetch))
    cp, rank, b, h, d = 4, 1, 64, 16, 64
    rng = random.Random(7)
    plens = padded(rand_lens(rng, b, 2048, lo=1), cp)
    cu_p = cu_of(plens, dev)
    cu_loc = torch.div(cu_p, cp, rounding_mode="floor")
    total, t_loc = sum(plens), sum(plens) // cp
    gen = torch.Generator().manual_seed(7)
    x = torch.randn(total, h, d, generator=gen).to(dev, torch.bfloat16)
    lse = torch.randn(h, t_loc, generator=gen).to(dev)
    lse_step = torch.randn(h, t_loc // 2, generator=gen).to(dev)

    def chain(backend):
        kw = dict(backend=backend, validate=False)
        y = thd.reorder_to_contiguous(x, cu_p, cp, **kw)
        shard = thd.partition(y, cu_p, cp, rank, **kw)
        q2 = thd.read_half(shard, cu_loc, "second", **kw)
        g = thd.grad_correction(shard, q2, cu_loc, "none", "add", **kw)
        out, new_lse = thd.merge_partial(g, lse, thd.read_half(g, cu_loc, "first", **kw),
                                         lse_step, cu_loc, True, **kw)
        back = thd.reorder_to_rank_sharded(thd.reorder_to_contiguous(y, cu_p, cp, **kw),
                                           cu_p, cp, **kw)
        return [y, shard, q2, g, out, new_lse, back]

    def check(got, want, ctx):
        for name, k, t in zip(("y", "shard", "q2", "g", "out", "lse", "back"), got, want):
            if name in ("out", "lse"):
                assert_merge_close(name, k, t, ctx)
            else:
                assert_bitwise(name, k, t, ctx)

    for round_ in range(3):
        x.copy_(torch.randn(total, h, d, generator=gen).to(dev, torch.bfloat16))
        poison_allocator(dev)
        got = chain("kernel")
        check(got, chain("torch"), f"round {round_}")

    graph, static = capture_graph(lambda: chain("kernel"))
    for round_ in range(2):
        x.copy_(torch.randn(total, h, d, generator=gen).to(dev, torch.bfloat16))
        graph.replay()
        check(static, chain("torch"), f"replay {round_}")


@pytest.mark.parametrize("prefetch", ["default", "0"])
def test_cu_seqlens_written_by_the_kernel_ahead(dev, prefetch, tuning):
    """The copy, merge and grad kernels map their first rows from a snapshot of cu_seqlens
    taken before they wait for the kernel ahead (index.h), and put those rows in L2 (unless
    tuning thd_prefetch=0); here that kernel is the one writing cu_seqlens (a THD copy into
    the same buffer, so on sm_90 the two overlap), turning a stale layout into this round's:
    every output must follow this round's layout, eagerly on a poisoned allocator and under
    graph replay."""
    if prefetch != "default":
        tuning(thd_prefetch=int(prefetch))
    # b + 1 <= the snapshot's words on every wave size; few enough tokens that grad_correction
    # takes its snapshot kernel too (one resident wave of blocks)
    cp, rank, b, h, d = 2, 1, 48, 4, 64
    rng = random.Random(11)
    lens = padded(rand_lens(rng, b, 256, lo=1), cp)
    orders = [lens, lens[::-1], sorted(lens)]
    layouts = [cu_of(o, dev) for o in orders]
    local = [cu_of([n // cp for n in o], dev) for o in orders]
    total, t_loc = sum(lens), sum(lens) // cp
    gen = torch.Generator().manual_seed(11)
    x = torch.randn(total, h, d, generator=gen).to(dev, torch.bfloat16)
    lse = torch.randn(h, t_loc, generator=gen).to(dev)
    lse_step = torch.randn(h, t_loc // 2, generator=gen).to(dev)
    one_seq = torch.tensor([0, b + 1], dtype=torch.int32, device=dev)
    cu, cu_loc = (torch.zeros(b + 1, dtype=torch.int32, device=dev) for _ in range(2))
    # this round's and a stale layout, copied in by the kernel right before each helper
    src, src_loc, stale, stale_loc = (torch.empty_like(cu) for _ in range(4))

    def write(dst, values):  # a bitwise row copy kernel (int32 seen as float32 rows)
        thd.copy_valid_tokens(dst.view(torch.float32).view(b + 1, 1),
                              values.view(torch.float32).view(b + 1, 1), one_seq,
                              backend="kernel", validate=False)

    def helpers(g_cu, g_loc, backend, before=lambda *_: None):
        kw = dict(validate=False, backend=backend)
        before(cu, src, stale)
        shard = thd.partition(x, g_cu, cp, rank, **kw)
        before(cu_loc, src_loc, stale_loc)
        q2 = thd.read_half(shard, g_loc, "second", **kw)
        before(cu_loc, src_loc, stale_loc)
        g = thd.grad_correction(shard, q2, g_loc, "none", "add", **kw)
        before(cu_loc, src_loc, stale_loc)
        out, new_lse = thd.merge_partial(g, lse, q2, lse_step, g_loc, True, **kw)
        before(cu_loc, src_loc, stale_loc)
        # three cu arrays (valid counts, dst and src starts): the same buffer here
        packed = thd.copy_valid_tokens(torch.zeros_like(shard), shard, g_loc, g_loc, g_loc, **kw)
        before(cu, src, stale)
        return [shard, q2, g, out, new_lse, packed, thd.reorder_to_contiguous(x, g_cu, cp, **kw)]

    def step():
        return helpers(cu, cu_loc, "kernel",
                       lambda buf, new, old: (write(buf, old), write(buf, new)))

    def set_round(i):
        for buf, v in ((src, layouts[i % 3]), (src_loc, local[i % 3]),
                       (stale, layouts[(i + 1) % 3]), (stale_loc, local[(i + 1) % 3])):
            buf.copy_(v)

    def check(got, i, ctx):
        want = helpers(layouts[i % 3], local[i % 3], "torch")
        for name, k, t in zip(("partition", "read_half", "grad_correction", "out", "lse",
                               "copy_valid_tokens", "reorder_to_contiguous"), got, want):
            if name in ("out", "lse"):
                assert_merge_close(name, k, t, ctx)
            else:
                assert_bitwise(name, k, t, ctx)

    for round_ in range(6):
        set_round(round_)
        poison_allocator(dev)
        check(step(), round_, f"eager round {round_}")
    graph, static = capture_graph(step)
    for round_ in range(6):
        set_round(round_)
        graph.replay()
        check(static, round_, f"replay round {round_}")


def test_torch_compile_fullgraph(dev):
    """Every kernel-backed helper under torch.compile(fullgraph=True): equal to eager."""
    import torch._dynamo

    torch._dynamo.reset()
    cp = 2
    _, _, cu_p, total = global_case(4, 21, 16, cp, dev, slack=1)
    gen = torch.Generator().manual_seed(4)
    x = torch.randn(total, 3, 32, generator=gen).to(dev, torch.bfloat16)
    cu_loc = thd.local_cu_seqlens(cu_p, cp)
    t_loc = total // cp
    lse_full = torch.randn(3, total, generator=gen).to(dev)
    acc0 = torch.randn(t_loc, 3, 32, generator=gen).to(dev)
    step = torch.randn(t_loc // 2, 3, 32, generator=gen).to(dev, torch.bfloat16)
    lse_s = torch.randn(3, t_loc // 2, generator=gen).to(dev)
    cu_valid = cu_of([max(int(n) // cp - 1, 0) for n in (cu_p[1:] - cu_p[:-1]).tolist()], dev)

    def fn(x, lse_full, acc, step, lse_s, dst):
        kw = dict(backend="kernel", validate=False)
        shard = thd.partition(x, cu_p, cp, 1, **kw)
        lse = thd.partition(lse_full, cu_p, cp, 1, dim=-1, **kw)
        q2 = thd.read_half(shard, cu_loc, "second", **kw)
        o, l_ = thd.merge_partial(acc, lse, step, lse_s, cu_loc, True, **kw)
        thd.merge_partial(acc, lse, step, lse_s, cu_loc, True, inplace=True, **kw)
        l2 = thd.lse_correction(l_, lse_s, cu_loc, True, **kw)
        o2 = thd.out_correction(o, step, l2, lse_s, cu_loc, True, **kw)
        g = thd.grad_correction(shard, q2, cu_loc, "none", "add", **kw)
        thd.copy_valid_tokens(dst, shard, cu_valid, cu_loc, cu_loc, fill=0.0, **kw)
        full = thd.reorder_to_contiguous(torch.cat([shard, shard]), cu_p, cp, **kw)
        sharded = thd.reorder_to_rank_sharded(x, cu_p, cp, **kw)
        padded_x, _ = thd.pad_for_cp(shard, cu_valid, cp, **kw)
        return shard, lse, q2, o, l_, acc, l2, o2, g, dst, full, sharded, padded_x

    def run(f):
        args = (x, lse_full, acc0.clone(), step, lse_s, torch.zeros_like(x[:t_loc]))
        return f(*args)

    eager = run(fn)
    compiled = run(torch.compile(fn, fullgraph=True))
    for i, (a, e) in enumerate(zip(compiled, eager)):
        assert torch.equal(a, e), f"output {i}: compiled != eager"


def test_opcheck(dev):
    """torch.library.opcheck on every THD op (schema, fake impl, aot dispatch)."""
    cp = 2
    _, _, cu_p, total = global_case(6, 7, 8, cp, dev)
    cu_loc = thd.local_cu_seqlens(cu_p, cp)
    t = total // cp
    x = torch.randn(total, 2, 8, device=dev, dtype=torch.bfloat16)
    out = torch.randn(t, 2, 8, device=dev)
    lse = torch.randn(2, t, device=dev)
    step = torch.randn(t // 2, 2, 8, device=dev, dtype=torch.bfloat16)
    lse_s = torch.randn(2, t // 2, device=dev)
    ops = torch.ops.rocm_attn
    cases = [
        (ops.thd_gather.default, (x, cu_p, 0, cp, 1, 0)),
        (ops.thd_gather.default, (x, cu_p, 1, cp, 0, 0)),
        (ops.thd_gather.default, (x[:t], cu_loc, 3, 1, 1, 0)),
        (ops.thd_copy_valid_tokens_.default, (x.clone(), x, cu_p, None, None, 0, 0.0)),
        (ops.thd_merge.default, (out, lse, step, lse_s, cu_loc, True, False)),
        (ops.thd_merge.default, (None, lse, None, lse_s, cu_loc, True, False)),
        (ops.thd_merge.default, (out, lse, step, lse_s, cu_loc, True, True)),
        (ops.thd_merge_.default, (out.clone(), lse.clone(), step, lse_s, cu_loc, True)),
        (ops.thd_out_correction_.default, (out.clone(), step, lse, lse_s, cu_loc, True)),
        (ops.thd_grad_correction.default, (out, step, cu_loc, 0, 2)),
        (ops.thd_grad_correction_.default, (out.clone(), step, cu_loc, 2, 0)),
    ]
    for op, args in cases:
        torch.library.opcheck(op, args)
