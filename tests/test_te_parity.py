"""Transformer Engine parity of rocm_attn.attention (one device): TE's mask types and their
alignment, qkv_format bshd / sbhd, return_max_logit against the float64 oracle, and bitwise
reproducible backward passes under torch.use_deterministic_algorithms."""

import itertools
import warnings

import pytest
import torch

import rocm_attn
from rocm_attn.reference import reference_attention, reference_max_logit

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
    """torch_flash (the extra blocked pass beside aten's flash) against the float64 oracle, with
    padding between sequences; and its backward bitwise reproducible under deterministic mode."""
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
    torch.testing.assert_close(ml.cpu().double(), ref, rtol=1e-5, atol=1e-4)
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
