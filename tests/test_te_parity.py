"""Transformer Engine parity of rocm_attn.attention (one device): TE's mask types and their
alignment, qkv_format bshd / sbhd, return_max_logit against the float64 oracle, and bitwise
reproducible backward passes under torch.use_deterministic_algorithms."""

import itertools
import warnings

import pytest
import torch

import rocm_attn
from rocm_attn.reference import reference_attention, reference_max_logit
from rocm_attn.varlen.max_logit import sharpened_error_bound

F64 = torch.float64


def _cu(lens):
    return torch.tensor([0] + list(itertools.accumulate(lens)), dtype=torch.int32)


def _problem(lens_q, lens_kv, h_q=4, h_kv=2, d=8, pad=0, seed=0, dtype=F64):
    """THD q / k / v with ``pad`` padding rows between sequences (cu_seqlens_*_padded)."""
    g = torch.Generator().manual_seed(seed)
    cu_q, cu_kv = _cu(lens_q), _cu(lens_kv)
    cu_qp = _cu([n + pad for n in lens_q])
    cu_kvp = _cu([n + pad for n in lens_kv])
    q = torch.randn(int(cu_qp[-1]), h_q, d, generator=g, dtype=F64).to(dtype)
    k = torch.randn(int(cu_kvp[-1]), h_kv, d, generator=g, dtype=F64).to(dtype)
    v = torch.randn(int(cu_kvp[-1]), h_kv, d, generator=g, dtype=F64).to(dtype)
    return q, k, v, cu_q, cu_kv, cu_qp, cu_kvp


MASKS = ["no_mask", "padding", "causal", "padding_causal", "causal_bottom_right",
         "padding_causal_bottom_right"]


@pytest.mark.parametrize("mask", MASKS)
@pytest.mark.parametrize("window,chunk", [((-1, -1), None), ((3, 0), None), ((2, 1), None),
                                          ((-1, -1), 4), ((5, 0), 3)])
@pytest.mark.parametrize("pad", [0, 3])
def test_mask_types_match_reference(mask, window, chunk, pad):
    """Every TE mask type, with windows, chunks and padding between sequences, on sequences
    with more queries than keys and fewer: output, LSE, gradients and max_logit."""
    lens_q, lens_kv = [5, 9, 3, 12, 0, 4], [9, 4, 3, 7, 2, 0]
    q, k, v, cu_q, cu_kv, cu_qp, cu_kvp = _problem(lens_q, lens_kv, pad=pad)
    q, k, v = (x.requires_grad_(True) for x in (q, k, v))
    kw = dict(attn_mask_type=mask, window_size=window, chunk_size=chunk)
    pads = dict(cu_seqlens_q_padded=cu_qp, cu_seqlens_kv_padded=cu_kvp) if pad else {}
    out, lse, ml = rocm_attn.attention(q, k, v, cu_q, cu_kv, 12, 9, return_lse=True,
                                       return_max_logit=True, **kw, **pads)
    ro, rl = reference_attention(q, k, v, cu_q, cu_kv, mask, window, chunk, **pads)
    rml = reference_max_logit(q, k, cu_q, cu_kv, mask, window, chunk, **pads)
    torch.testing.assert_close(out, ro, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(lse, rl, rtol=1e-10, atol=1e-10)
    assert ml.dtype == torch.float32 and ml.shape == (4,) and not ml.requires_grad
    torch.testing.assert_close(ml.double(), rml, rtol=1e-6, atol=1e-6)
    go = torch.randn_like(out)
    got = torch.autograd.grad((out * go).sum(), (q, k, v))
    want = torch.autograd.grad((ro * go).sum(), (q, k, v))
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)


def test_causal_is_top_left_and_bottom_right_differs():
    """TE's "causal" with fewer queries than keys: query i sees keys 0..i (the regression: it
    used to be bottom-right)."""
    q, k, v, cu_q, cu_kv, _, _ = _problem([2], [4])
    tl = rocm_attn.attention(q, k, v, cu_q, cu_kv, 2, 4, attn_mask_type="causal")
    br = rocm_attn.attention(q, k, v, cu_q, cu_kv, 2, 4, attn_mask_type="causal_bottom_right")
    # query 0 top-left sees key 0 only: its output is v[0] (GQA: head h uses kv head h // 2)
    torch.testing.assert_close(tl[0], v[0].repeat_interleave(2, dim=0))
    assert not torch.allclose(tl, br)


def test_causal_alias_warns_and_keeps_bottom_right():
    q, k, v, cu_q, cu_kv, _, _ = _problem([2, 3], [4, 3])
    with pytest.warns(DeprecationWarning, match="bottom-right"):
        old = rocm_attn.attention(q, k, v, cu_q, cu_kv, 3, 4, causal=True)
    new = rocm_attn.attention(q, k, v, cu_q, cu_kv, 3, 4, attn_mask_type="causal_bottom_right")
    assert torch.equal(old, new)
    with pytest.raises(ValueError, match="disagree"), warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        rocm_attn.attention(q, k, v, cu_q, cu_kv, 3, 4, causal=True, attn_mask_type="causal")
    with pytest.raises(ValueError, match="attn_mask_type"):
        rocm_attn.attention(q, k, v, cu_q, cu_kv, 3, 4, attn_mask_type="top_left")


@pytest.mark.parametrize("fmt", ["bshd", "sbhd"])
@pytest.mark.parametrize("mask", ["causal", "padding_causal_bottom_right", "no_mask"])
@pytest.mark.parametrize("lengths", [False, True])
def test_bshd_sbhd_match_thd(fmt, mask, lengths):
    """bshd / sbhd give the THD result of the same sequences (valid lengths: a prefix of
    every row, the padding mask types), LSE as [b, h, s]."""
    g = torch.Generator().manual_seed(3)
    b, s_q, s_kv = 3, 6, 8
    q = torch.randn(b, s_q, 4, 8, generator=g, dtype=F64, requires_grad=True)
    k = torch.randn(b, s_kv, 2, 8, generator=g, dtype=F64, requires_grad=True)
    v = torch.randn(b, s_kv, 2, 8, generator=g, dtype=F64, requires_grad=True)
    lq, lk = ([6, 3, 5], [8, 2, 7]) if lengths else ([s_q] * b, [s_kv] * b)
    cu = dict(cu_seqlens_q=_cu(lq), cu_seqlens_kv=_cu(lk)) if lengths else {}
    args = [x if fmt == "bshd" else x.transpose(0, 1) for x in (q, k, v)]
    out, lse, ml = rocm_attn.attention(*args, **cu, attn_mask_type=mask, qkv_format=fmt,
                                       return_lse=True, return_max_logit=True)
    assert out.shape == args[0].shape and lse.shape == (b, 4, s_q)
    ref_o, ref_l = reference_attention(
        q.reshape(b * s_q, 4, 8), k.reshape(b * s_kv, 2, 8), v.reshape(b * s_kv, 2, 8),
        _cu(lq), _cu(lk), mask, cu_seqlens_q_padded=_cu([s_q] * b),
        cu_seqlens_kv_padded=_cu([s_kv] * b))
    ref_ml = reference_max_logit(q.reshape(b * s_q, 4, 8), k.reshape(b * s_kv, 2, 8), _cu(lq),
                                 _cu(lk), mask, cu_seqlens_q_padded=_cu([s_q] * b),
                                 cu_seqlens_kv_padded=_cu([s_kv] * b))
    got = out if fmt == "bshd" else out.transpose(0, 1)
    torch.testing.assert_close(got.reshape(b * s_q, 4, 8), ref_o)
    torch.testing.assert_close(lse.transpose(0, 1).reshape(4, b * s_q), ref_l)
    torch.testing.assert_close(ml.double(), ref_ml, rtol=1e-6, atol=1e-6)
    go = torch.randn_like(got)
    g1 = torch.autograd.grad((got * go).sum(), (q, k, v))
    g2 = torch.autograd.grad((ref_o * go.reshape(b * s_q, 4, 8)).sum(), (q, k, v))
    for a, c in zip(g1, g2):
        torch.testing.assert_close(a, c)


def test_bshd_rejects_padded_cu_seqlens():
    x = torch.zeros(2, 4, 2, 8)
    with pytest.raises(ValueError, match="cu_seqlens_q_padded"):
        rocm_attn.attention(x, x, x, qkv_format="bshd", cu_seqlens_q_padded=_cu([4, 4]))
    with pytest.raises(ValueError, match="qkv_format"):
        rocm_attn.attention(x, x, x, qkv_format="bhsd")
    with pytest.raises(ValueError, match="cu_seqlens_q is required"):
        rocm_attn.attention(x[0], x[0], x[0])


def test_max_logit_negative_scale_and_empty_heads():
    q, k, v, cu_q, cu_kv, _, _ = _problem([3, 0], [0, 5])
    _, ml = rocm_attn.attention(q, k, v, cu_q, cu_kv, 3, 5, return_max_logit=True)
    assert torch.isneginf(ml).all()  # no sequence has both queries and keys
    q, k, v, cu_q, cu_kv, _, _ = _problem([3, 4], [5, 2], seed=2)
    _, ml = rocm_attn.attention(q, k, v, cu_q, cu_kv, 4, 5, softmax_scale=-0.7,
                                return_max_logit=True)
    ref = reference_max_logit(q, k, cu_q, cu_kv, "no_mask", softmax_scale=-0.7)
    torch.testing.assert_close(ml.double(), ref, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("mask,window", [("causal", (-1, -1)), ("causal_bottom_right", (3, 0)),
                                         ("no_mask", (2, 2))])
def test_backward_bitwise_reproducible_under_deterministic_mode(mask, window):
    q, k, v, cu_q, cu_kv, cu_qp, cu_kvp = _problem([5, 9, 3], [9, 4, 3], pad=2,
                                                   dtype=torch.float32)
    grads = []
    prev = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        for _ in range(2):
            leaves = [x.detach().clone().requires_grad_(True) for x in (q, k, v)]
            out = rocm_attn.attention(*leaves, cu_q, cu_kv, 9, 9, attn_mask_type=mask,
                                      window_size=window, cu_seqlens_q_padded=cu_qp,
                                      cu_seqlens_kv_padded=cu_kvp)
            out.square().sum().backward()
            grads.append([x.grad for x in leaves])
    finally:
        torch.use_deterministic_algorithms(prev)
    for a, b in zip(*grads):
        assert torch.equal(a, b)


@pytest.mark.parametrize("layout", ["thd", "one_query", "bshd"])
def test_small_seq_max_logit(layout):
    g = torch.Generator().manual_seed(5)
    ck = torch.tensor([0, 7, 9, 9], dtype=torch.int32)
    if layout == "bshd":
        q = torch.randn(3, 2, 4, 32, generator=g)
        k, v = (torch.randn(3, 7, 2, 32, generator=g) for _ in range(2))
        lens = torch.tensor([7, 2, 0], dtype=torch.int32)
        out, ml = rocm_attn.fused_attn_small_seq(q, k, v, None, None, 2, 7,
                                                 qkv_layout="bshd_bshd_bshd", seqlens_kv=lens,
                                                 return_max_logit=True)
        ref = reference_max_logit(q.reshape(6, 4, 32), k.reshape(21, 2, 32),
                                  _cu([2, 2, 2]), torch.tensor([0, 7, 9, 9], dtype=torch.int32),
                                  "no_mask", cu_seqlens_kv_padded=_cu([7, 7, 7]))
    else:
        cq = (torch.tensor([0, 2, 2, 5], dtype=torch.int32) if layout == "thd"
              else torch.arange(4, dtype=torch.int32))
        q = torch.randn(int(cq[-1]), 4, 32, generator=g)
        k, v = (torch.randn(9, 2, 32, generator=g) for _ in range(2))
        out, ml = rocm_attn.fused_attn_small_seq(q, k, v, cq, ck, 3 if layout == "thd" else 1,
                                                 7, return_max_logit=True)
        ref = reference_max_logit(q, k, cq, ck, "no_mask")
    assert ml.dtype == torch.float32 and ml.shape == (4,)
    torch.testing.assert_close(ml.double(), ref, rtol=1e-5, atol=1e-5)


@pytest.mark.gpu
@pytest.mark.parametrize("mask,window", [("causal", (512, 0)), ("causal_bottom_right", (-1, -1)),
                                         ("no_mask", (64, 64))])
def test_gpu_max_logit_torch_flash(mask, window):
    """torch_flash (the sharpened-LSE pass: aten's flash once more) against the float64 oracle,
    with padding between sequences; and its backward bitwise reproducible under deterministic
    mode."""
    if not torch.cuda.is_available():
        pytest.skip("no CUDA/ROCm GPU")
    lens_q, lens_kv = [1000, 17, 513], [1200, 17, 300]
    q, k, v, cu_q, cu_kv, cu_qp, cu_kvp = _problem(lens_q, lens_kv, h_q=12, h_kv=2, d=128,
                                                   pad=5, dtype=torch.bfloat16)
    q, k, v, cu_q, cu_kv, cu_qp, cu_kvp = (x.cuda() for x in (q, k, v, cu_q, cu_kv, cu_qp,
                                                               cu_kvp))
    pads = dict(cu_seqlens_q_padded=cu_qp, cu_seqlens_kv_padded=cu_kvp)
    _, ml = rocm_attn.attention(q, k, v, cu_q, cu_kv, 1000, 1200, attn_mask_type=mask,
                                window_size=window, return_max_logit=True,
                                backend="torch_flash", **pads)
    ref = reference_max_logit(q.cpu(), k.cpu(), cu_q.cpu(), cu_kv.cpu(), mask, window,
                              cu_seqlens_q_padded=cu_qp.cpu(), cu_seqlens_kv_padded=cu_kvp.cpu())
    # the sharpened-LSE pass: over by at most ln(max_seqlen_kv) / T, plus float32 rounding
    tol = sharpened_error_bound(1200, ref.abs().max().item())
    assert not ml.isnan().any()
    torch.testing.assert_close(ml.cpu().double(), ref, rtol=1e-5, atol=1e-5 + tol)
    prev = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        grads = []
        for _ in range(2):
            leaves = [x.detach().clone().requires_grad_(True) for x in (q, k, v)]
            out = rocm_attn.attention(*leaves, cu_q, cu_kv, 1000, 1200, attn_mask_type=mask,
                                      window_size=window, backend="torch_flash", **pads)
            out.float().square().sum().backward()
            grads.append([x.grad for x in leaves])
    finally:
        torch.use_deterministic_algorithms(prev)
    for a, b in zip(*grads):
        assert torch.equal(a, b)


# --------------------------------------------------------------------------------------------
# torch.compile and host syncs of the max_logit path
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["thd", "bshd"])
def test_max_logit_compiles_fullgraph(fmt):
    """torch.compile(fullgraph=True) of attention with return_max_logit (top-left causal
    between different lengths: several calls; window, padding between sequences) traces
    without a graph break and gives the eager output, max_logit and gradients."""
    torch._dynamo.reset()
    if fmt == "thd":
        q, k, v, cu_q, cu_kv, cu_qp, cu_kvp = _problem([5, 9, 3], [9, 4, 3], pad=2, seed=11)
        kw = dict(cu_seqlens_q=cu_q, cu_seqlens_kv=cu_kv, max_seqlen_q=9, max_seqlen_kv=9,
                  cu_seqlens_q_padded=cu_qp, cu_seqlens_kv_padded=cu_kvp)
        mask, window = "causal", (3, 0)
    else:
        g = torch.Generator().manual_seed(11)
        q = torch.randn(2, 6, 4, 8, generator=g, dtype=F64)
        k, v = (torch.randn(2, 8, 2, 8, generator=g, dtype=F64) for _ in range(2))
        kw = dict(cu_seqlens_q=_cu([6, 4]), cu_seqlens_kv=_cu([8, 3]))
        mask, window = "padding_causal", (-1, -1)

    def fn(q, k, v):
        return rocm_attn.attention(q, k, v, **kw, attn_mask_type=mask, window_size=window,
                                   qkv_format=fmt, return_lse=True, return_max_logit=True)

    results = []
    for f in (torch.compile(fn, fullgraph=True, backend="aot_eager"), fn):
        leaves = [x.clone().requires_grad_(True) for x in (q, k, v)]
        out, lse, ml = f(*leaves)
        assert ml.dtype == torch.float32 and ml.shape == (4,) and not ml.requires_grad
        grads = torch.autograd.grad(out.square().sum(), leaves)
        results.append((out, ml) + grads)
    for got, want in zip(*results):
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    assert torch.isfinite(results[0][1]).all()


def test_small_seq_max_logit_compiles_fullgraph():
    """fused_attn_small_seq(return_max_logit=True) on the CPU torch path under
    torch.compile(fullgraph=True): the eager values, and the float64 oracle's max_logit."""
    torch._dynamo.reset()
    g = torch.Generator().manual_seed(6)
    cq = torch.tensor([0, 2, 2, 5], dtype=torch.int32)
    ck = torch.tensor([0, 7, 9, 9], dtype=torch.int32)
    q = torch.randn(5, 4, 32, generator=g)
    k, v = (torch.randn(9, 2, 32, generator=g) for _ in range(2))

    def fn(q, k, v):
        return rocm_attn.fused_attn_small_seq(q, k, v, cq, ck, 3, 7, return_lse=True,
                                              return_max_logit=True)

    got = torch.compile(fn, fullgraph=True, backend="aot_eager")(q, k, v)
    want = fn(q, k, v)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(got[-1].double(), reference_max_logit(q, k, cq, ck, "no_mask"),
                               rtol=1e-5, atol=1e-5)


def _meta(*xs):
    return [x.to("meta") for x in xs]


@pytest.mark.parametrize("top_left", [False, True])
@pytest.mark.parametrize("window,chunk", [((-1, -1), None), ((3, 0), 4)])
def test_max_logit_path_reads_nothing_on_the_host(top_left, window, chunk):
    """The max_logit pass (and the call metadata it shares with the attention) runs on meta
    tensors: any .item() / .tolist() / int() / nonzero() of a device value would raise, so it
    has no host sync on a GPU either."""
    from rocm_attn.varlen import api
    from rocm_attn.varlen.max_logit import step_max_logit

    q, k, _, cu_q, cu_kv, cu_qp, cu_kvp = _problem([5, 9, 3], [9, 4, 3], pad=2)
    q, k, cu_q, cu_kv, cu_qp, cu_kvp = _meta(q, k, cu_q, cu_kv, cu_qp, cu_kvp)
    with pytest.raises((RuntimeError, NotImplementedError)):
        cu_q[1:].max().item()  # the detector works: a host read of a meta value raises
    metas = api._metas(q, k, cu_q, cu_kv, cu_qp, cu_kvp, 9, 9, True, top_left, *window, chunk)
    assert (len(metas) > 1) == top_left
    for meta in metas:
        ml = step_max_logit(q, k, meta, 0.3)
        assert ml.device.type == "meta" and ml.shape == (4,)


@pytest.mark.parametrize("layout", ["thd", "one_query", "bshd"])
def test_small_seq_max_logit_reads_nothing_on_the_host(layout):
    from rocm_attn import small_seq

    if layout == "bshd":
        q, k = torch.empty(3, 2, 4, 32), torch.empty(3, 7, 2, 32)
        args = (None, None, torch.tensor([7, 2, 0], dtype=torch.int32), 2, 7, None,
                "bshd_bshd_bshd")
    else:
        q, k = torch.empty(5 if layout == "thd" else 3, 4, 32), torch.empty(9, 2, 32)
        cq = torch.tensor([0, 2, 2, 5], dtype=torch.int32) if layout == "thd" else None
        ck = torch.tensor([0, 7, 9, 9], dtype=torch.int32)
        args = (cq, ck, None, 3 if layout == "thd" else 1, 7, None, "thd_thd_thd")
    q, k = _meta(q, k)
    args = tuple(a.to("meta") if isinstance(a, torch.Tensor) else a for a in args)
    ml = small_seq._max_logit(q, k, *args)
    assert ml.device.type == "meta" and ml.shape == (4,)


def _sync_warnings(fn):
    """The host-device synchronisations ``fn()`` makes (torch.cuda.set_sync_debug_mode("warn")
    warns at each)."""
    prev = torch.cuda.get_sync_debug_mode()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            fn()
        finally:
            torch.cuda.set_sync_debug_mode(prev)
    return [str(w.message) for w in caught if "synchroniz" in str(w.message)]


@pytest.mark.gpu
@pytest.mark.parametrize("mask,window,chunk", [("causal", (-1, -1), None),
                                               ("causal_bottom_right", (64, 0), None),
                                               ("no_mask", (-1, -1), 128)])
def test_gpu_max_logit_adds_no_host_sync(mask, window, chunk):
    """On a GPU the max_logit pass synchronises nowhere: the pass alone runs under
    set_sync_debug_mode("error"), and attention / fused_attn_small_seq with return_max_logit
    synchronise exactly as often as without it."""
    if not torch.cuda.is_available():
        pytest.skip("no CUDA/ROCm GPU")
    from rocm_attn import small_seq
    from rocm_attn.varlen import api
    from rocm_attn.varlen.max_logit import step_max_logit

    lens_q, lens_kv = [300, 17, 513], [700, 17, 300]
    q, k, v, cu_q, cu_kv, cu_qp, cu_kvp = (
        x.cuda() for x in _problem(lens_q, lens_kv, h_q=8, h_kv=2, d=64, pad=5,
                                   dtype=torch.bfloat16))
    pads = dict(cu_seqlens_q_padded=cu_qp, cu_seqlens_kv_padded=cu_kvp)
    prev = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for meta in api._metas(q, k, cu_q, cu_kv, cu_qp, cu_kvp, 513, 700,
                               mask != "no_mask", mask == "causal", *window, chunk):
            step_max_logit(q, k, meta, 0.125)
        small_seq._max_logit(q, k, cu_q, cu_kv, None, 513, 700, None, "thd_thd_thd")
    finally:
        torch.cuda.set_sync_debug_mode(prev)

    def call(ml):
        return lambda: rocm_attn.attention(q, k, v, cu_q, cu_kv, 513, 700, attn_mask_type=mask,
                                           window_size=window, chunk_size=chunk, validate=False,
                                           return_max_logit=ml, **pads)

    def small(ml):
        return lambda: rocm_attn.fused_attn_small_seq(q, k, v, cu_q, cu_kv, 513, 700,
                                                      return_max_logit=ml)

    for make in (call, small):
        make(True)(), make(False)()  # warm-up: first calls may initialise
        assert len(_sync_warnings(make(True))) == len(_sync_warnings(make(False)))
    torch.cuda.synchronize()


# --------------------------------------------------------------------------------------------
# the max_logit pass's tiles: causal blocks of self-attention stop at the diagonal
# --------------------------------------------------------------------------------------------


def test_max_logit_causal_self_attention_forms_about_half_the_tiles():
    """16 x 8192-token causal self-attention: the pass forms the tiles of 16 triangles (51.6%
    of every block times every key tile), unmasked or windowed on the right it stays dense."""
    from rocm_attn.varlen.max_logit import _tile_bound

    dense = 2048 * 32
    tri = _tile_bound(2048, 128, 32, 0, True)
    assert tri == 16 * sum(-(-(a + 1) // 4) for a in range(128)) and tri / dense < 0.52
    assert _tile_bound(2048, 128, 32, 0, False) == dense  # lengths not known equal
    assert _tile_bound(2048, 128, 32, 1 << 40, True) == dense  # no right edge


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("mask,window", [("causal", (-1, -1)), ("causal", (70, 0)),
                                         ("no_mask", (-1, 100)), ("no_mask", (300, 5))])
def test_max_logit_square_bound_covers_every_tile(seed, mask, window):
    """With equal q and kv lengths (the bound of fewer tiles) the pass still reads every key a
    row may see: random lengths around the block sizes (64 rows, 256 keys), sequences at the
    longest length (the bound's worst case) and empty ones, against the float64 oracle. The
    largest logit is planted at a random allowed pair of the longest sequence's last row."""
    from rocm_attn.varlen.max_logit import segments_max_logit

    g = torch.Generator().manual_seed(seed)
    longest = [64, 65, 300, 513, 700, 1024][seed]
    lens = [longest] * (1 + seed % 3) + torch.randint(0, longest + 1, (4,), generator=g).tolist()
    lens = [n for pair in zip(lens, [0] * len(lens)) for n in pair]  # empty ones between
    q, k, _, cu, _, _, _ = _problem(lens, lens, h_q=2, h_kv=1, d=4, seed=seed,
                                    dtype=torch.float32)
    i = lens.index(longest)
    row = int(cu[i]) + longest - 1
    hi = longest - 1
    lo = 0 if window[0] < 0 else max(0, longest - 1 - window[0])
    key = int(cu[i]) + int(torch.randint(lo, hi + 1, (1,), generator=g))
    q[row, 0] = 3.0
    k[key, 0] = 3.0
    n = torch.tensor(lens)
    start = cu[:-1].long()
    got = segments_max_logit(q, k, start, n, start, n, causal=mask == "causal", window=window,
                             max_q=longest, max_kv=longest, q_rows=q.shape[0], scale=0.5,
                             square=True)
    ref = reference_max_logit(q, k, cu, cu, mask, window, softmax_scale=0.5)
    torch.testing.assert_close(got.double(), ref, rtol=1e-6, atol=1e-6)
    assert float(got[0]) >= 0.5 * 3.0 * 3.0 * 4  # the planted pair (d 4) is found


@pytest.mark.parametrize("longest,count", [(512, 3), (64, 5), (1024, 1), (320, 2)])
def test_max_logit_square_bound_is_tight_and_enough(longest, count):
    """Sequences all at the longest length, a multiple of the 64-row block: the tiles formed
    equal the bound exactly, and the last tile of the last block (the diagonal of the last
    sequence's last rows) holds the largest logit."""
    from rocm_attn.varlen.max_logit import segments_max_logit

    lens = [longest] * count
    q, k, _, cu, _, _, _ = _problem(lens, lens, h_q=2, h_kv=1, d=4, seed=count,
                                    dtype=torch.float32)
    last = q.shape[0] - 1
    q[last, 1], k[last, 0] = 3.0, 3.0  # the last row with its own key (j = p)
    n = torch.tensor(lens)
    got = segments_max_logit(q, k, cu[:-1].long(), n, cu[:-1].long(), n, causal=True,
                             window=(-1, -1), max_q=longest, max_kv=longest,
                             q_rows=q.shape[0], scale=0.5, square=True)
    ref = reference_max_logit(q, k, cu, cu, "causal", softmax_scale=0.5)
    torch.testing.assert_close(got.double(), ref, rtol=1e-6, atol=1e-6)
    assert float(got[1]) >= 18.0
