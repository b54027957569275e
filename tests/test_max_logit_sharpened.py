"""The sharpened-LSE max_logit pass (rocm_attn.varlen.max_logit): the bound it rests on,
``m <= LSE_T / T <= m + ln(n) / T``, checked on float64 LSEs of the reference attention; its
row masking; and the torch_flash path of ``attention`` / ``fused_attn_small_seq`` that uses it
(on CPU through tests/helpers/flash_emulator.py; on a GPU, marked ``gpu``)."""

import itertools
import math

import pytest
import torch

import rocm_attn
from rocm_attn.reference import reference_attention, reference_max_logit
from rocm_attn.varlen import max_logit as ml_mod
from rocm_attn.varlen.max_logit import (TEMPERATURE, max_logit_from_sharpened_lse,
                                        rows_with_keys, sharpened_error_bound)

F64 = torch.float64


def _cu(lens):
    return torch.tensor([0] + list(itertools.accumulate(lens)), dtype=torch.int32)


def _problem(lens_q, lens_kv, h_q=4, h_kv=2, d=8, seed=0, dtype=F64, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(sum(lens_q), h_q, d, generator=g, dtype=F64) * scale
    k = torch.randn(sum(lens_kv), h_kv, d, generator=g, dtype=F64) * scale
    v = torch.randn(sum(lens_kv), h_kv, d, generator=g, dtype=F64)
    return q.to(dtype), k.to(dtype), v.to(dtype), _cu(lens_q), _cu(lens_kv)


def _sharpened_reference(q, k, v, cu_q, cu_kv, mask, window, scale, temperature):
    """The sharpened estimate from the float64 reference attention's LSE at scale * T."""
    _, lse = reference_attention(q, k, v, cu_q, cu_kv, mask, window,
                                 softmax_scale=scale * temperature)
    return max_logit_from_sharpened_lse(lse.double(), torch.isfinite(lse[0]),
                                        temperature).double()


@pytest.mark.parametrize("mask,window", [("no_mask", (-1, -1)), ("causal", (-1, -1)),
                                         ("causal_bottom_right", (3, 0)), ("no_mask", (2, 5))])
@pytest.mark.parametrize("temperature", [2.0 ** 4, 2.0 ** 10, TEMPERATURE])
def test_bound_holds_on_float64_lse(mask, window, temperature):
    """0 <= LSE_T / T - max <= ln(max_seqlen_kv) / T on random float64 problems (the float32
    LSE itself goes through max_logit_from_sharpened_lse, so float32 rounding is allowed)."""
    lens_q, lens_kv = [5, 17, 1, 9], [7, 17, 4, 30]
    q, k, v, cu_q, cu_kv = _problem(lens_q, lens_kv, seed=3, scale=2.0)
    scale = 0.35
    got = _sharpened_reference(q, k, v, cu_q, cu_kv, mask, window, scale, temperature)
    want = reference_max_logit(q, k, cu_q, cu_kv, mask, window, softmax_scale=scale)
    err = got - want
    rounding = 4 * want.abs() * 2.0 ** -24
    assert torch.isfinite(got).all()
    assert (err >= -rounding).all(), err
    assert (err <= math.log(max(lens_kv)) / temperature + rounding).all(), err


def test_bound_is_attained_with_equal_maxima():
    """n keys with the same logit: LSE_T / T = m + ln(n) / T exactly, so the documented bound
    cannot be tightened (half of it fails on this case)."""
    n, temperature = 64, 2.0 ** 10
    q, k, v, cu_q, cu_kv = _problem([3], [n], h_q=2, h_kv=1, seed=4)
    k = k[:1].expand(n, -1, -1).contiguous()  # every key the same: n equal maxima per row
    got = _sharpened_reference(q, k, v, cu_q, cu_kv, "no_mask", (-1, -1), 0.5, temperature)
    want = reference_max_logit(q, k, cu_q, cu_kv, "no_mask", softmax_scale=0.5)
    err = got - want
    bound = math.log(n) / temperature
    rounding = 4 * want.abs() * 2.0 ** -24
    assert ((err - bound).abs() <= rounding).all(), (err, bound)
    assert (err > 0.5 * bound).all()


def test_large_temperature_does_not_overflow_the_lse():
    """Logits up to ~1000 at T = 2^16: the float64 reference and torch.logsumexp subtract the
    row max first, as flash does, so the LSE stays finite."""
    q, k, v, cu_q, cu_kv = _problem([4, 6], [9, 6], seed=5, scale=12.0)
    got = _sharpened_reference(q, k, v, cu_q, cu_kv, "causal_bottom_right", (-1, -1), 1.0,
                               TEMPERATURE)
    want = reference_max_logit(q, k, cu_q, cu_kv, "causal_bottom_right", softmax_scale=1.0)
    assert want.abs().max() > 100
    assert ((got - want).abs() <= sharpened_error_bound(9, want.abs().max().item())).all()


def test_from_sharpened_lse_masks_rows_and_propagates_overflow():
    t = 4.0
    lse = torch.tensor([[8.0, float("nan"), float("-inf"), 4.0],
                        [float("inf"), 2.0, 1.0, float("-inf")]])
    keys = torch.tensor([True, False, True, True])
    got = max_logit_from_sharpened_lse(lse, keys, t)
    assert got.dtype == torch.float32
    assert got[0] == 2.0  # NaN garbage at a row without keys ignored
    assert got[1] == float("inf")  # overflow at a row with keys: loud
    nan_row = max_logit_from_sharpened_lse(lse, torch.tensor([False, True, False, False]), t)
    assert nan_row[0].isnan()  # NaN at a row with keys is never hidden
    empty = max_logit_from_sharpened_lse(lse[:, :0], keys[:0], t)
    assert empty.shape == (2,) and torch.isneginf(empty).all()
    with pytest.raises(ValueError, match="has_keys"):
        max_logit_from_sharpened_lse(lse, lse != float("-inf"), t)  # a per-head mask


@pytest.mark.parametrize("causal,window", [(False, (-1, -1)), (True, (-1, -1)), (True, (2, 0)),
                                           (False, (1, 1)), (False, (0, -1)), (False, (-1, 0))])
def test_rows_with_keys_matches_the_mask(causal, window):
    lens_q, lens_kv = [4, 0, 6, 3, 5], [2, 3, 6, 0, 9]
    cu_q, cu_kv = _cu(lens_q), _cu(lens_kv)
    rows = sum(lens_q) + 3  # slack rows past cu_q[-1]
    got = rows_with_keys(cu_q, cu_kv, rows, causal, window)
    want = []
    for nq, nk in zip(lens_q, lens_kv):
        for r in range(nq):
            p = r + nk - nq
            lo = 0 if window[0] < 0 else max(0, p - window[0])
            right = 0 if causal else window[1]
            hi = nk - 1 if right < 0 else min(nk - 1, p + right)
            want.append(hi >= lo)
    want += [False] * 3
    assert got.tolist() == want


def _emulated_flash(monkeypatch):
    from helpers import flash_emulator

    from rocm_attn.varlen import backends

    monkeypatch.setattr(backends, "_aten_flash",
                        lambda: (flash_emulator.flash_forward, flash_emulator.flash_backward))
    monkeypatch.setattr(backends, "_flash_problem", lambda q: None)


def _exact_pass_forbidden(*a, **kw):
    raise AssertionError("the exact blocked pass ran on a torch_flash call")


@pytest.mark.parametrize("mask,window,chunk,pad", [
    ("causal", (-1, -1), None, 0), ("causal_bottom_right", (4, 0), None, 2),
    ("no_mask", (3, 2), None, 1), ("causal", (-1, -1), 4, 2), ("padding", (-1, -1), None, 3),
    ("causal", (5, 0), 3, 0)])
def test_attention_torch_flash_uses_the_sharpened_pass(mask, window, chunk, pad, monkeypatch):
    """attention(backend='torch_flash', return_max_logit=True) on the flash emulator: the
    sharpened pass alone (the exact pass is made to fail), within the documented bound of the
    float64 oracle, with padding between sequences, windows, chunks and top-left pieces."""
    _emulated_flash(monkeypatch)
    monkeypatch.setattr(ml_mod, "step_max_logit", _exact_pass_forbidden)
    lens_q, lens_kv = [13, 0, 37, 6, 1], [20, 3, 37, 4, 1]
    g = torch.Generator().manual_seed(11)
    cu_q, cu_kv = _cu(lens_q), _cu(lens_kv)
    cu_qp, cu_kvp = _cu([n + pad for n in lens_q]), _cu([n + pad for n in lens_kv])
    q = torch.randn(int(cu_qp[-1]), 4, 16, generator=g, dtype=F64) * 3
    k, v = (torch.randn(int(cu_kvp[-1]), 2, 16, generator=g, dtype=F64) for _ in range(2))
    pads = dict(cu_seqlens_q_padded=cu_qp, cu_seqlens_kv_padded=cu_kvp)
    if pad:  # garbage in the padding rows must not reach the max
        for cu, cup, x in ((cu_q, cu_qp, q), (cu_kv, cu_kvp, k)):
            for i in range(len(cu) - 1):
                x[int(cup[i]) + int(cu[i + 1] - cu[i]):int(cup[i + 1])] = 1e4
    _, ml = rocm_attn.attention(q, k, v, cu_q, cu_kv, 37, 37, attn_mask_type=mask,
                                window_size=window, chunk_size=chunk, backend="torch_flash",
                                return_max_logit=True, **pads)
    ref = reference_max_logit(q, k, cu_q, cu_kv, mask, window, chunk, **pads)
    assert ml.dtype == torch.float32 and not ml.isnan().any()
    # emulator scores in float32 from float64 inputs: relative 1e-6 on top of the bound
    tol = sharpened_error_bound(37, ref.abs().max().item()) + 1e-6 * (1 + ref.abs())
    err = ml.double() - ref
    assert (err.abs() <= tol).all(), (err, tol)


def test_attention_reference_backend_keeps_the_exact_pass(monkeypatch):
    """The reference backend (CPU) stays on the exact pass: equal to the oracle to 1e-6, far
    inside what the sharpened bound would allow."""
    calls = []
    real = ml_mod.sharpened_step_max_logit
    monkeypatch.setattr(ml_mod, "sharpened_step_max_logit",
                        lambda *a, **kw: calls.append(1) or real(*a, **kw))
    q, k, v, cu_q, cu_kv = _problem([9, 4], [9, 4], seed=6)
    _, ml = rocm_attn.attention(q, k, v, cu_q, cu_kv, 9, 9, attn_mask_type="causal",
                                return_max_logit=True)
    ref = reference_max_logit(q, k, cu_q, cu_kv, "causal")
    torch.testing.assert_close(ml.double(), ref, rtol=1e-6, atol=1e-6)
    assert not calls


# --------------------------------------------------------------------------------------------
# GPU: aten's flash and the small-seq kernels at softmax_scale * T
# --------------------------------------------------------------------------------------------
def _gpu():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA/ROCm GPU")
    return torch.device("cuda")


@pytest.mark.gpu
@pytest.mark.parametrize("scale", [1.0, 1000.0])
def test_gpu_attention_torch_flash_large_logits(scale):
    """bf16 causal, logits of order 1 and (scale 1000: q and k 31.6 times larger) up to about
    5,000, inside the documented range (~11,000 at T = 2^16): no overflow, within the bound of
    the float64 oracle."""
    dev = _gpu()
    q, k, v, cu_q, cu_kv = _problem([700, 5, 300], [700, 5, 300], h_q=8, h_kv=2, d=128,
                                    seed=7, dtype=torch.bfloat16, scale=scale ** 0.5)
    _, ml = rocm_attn.attention(q.to(dev), k.to(dev), v.to(dev), cu_q.to(dev), cu_kv.to(dev),
                                700, 700, attn_mask_type="causal", backend="torch_flash",
                                return_max_logit=True)
    ref = reference_max_logit(q, k, cu_q, cu_kv, "causal")
    assert ref.abs().max() > (1000 if scale > 1 else 0)
    assert not ml.isnan().any()
    tol = sharpened_error_bound(700, ref.abs().max().item()) + 1e-5 * (1 + ref.abs())
    assert ((ml.cpu().double() - ref).abs() <= tol).all(), (ml, ref)


@pytest.mark.gpu
@pytest.mark.parametrize("lens_q,lens_kv,max_kv,d", [
    ([1, 1, 1, 1], [16, 3, 0, 9], 16, 128),  # one-query kernels
    ([3, 0, 5, 2], [40, 7, 200, 0], 200, 64),  # tiled kernels (or the flash route)
    ([2, 4], [3000, 700], 3000, 128)])  # past the tiled kernels: flash route / varlen attention
def test_gpu_small_seq_max_logit_sharpened(lens_q, lens_kv, max_kv, d):
    """fused_attn_small_seq(return_max_logit=True) on a GPU (the kernels' row maxima, or on the
    flash route / varlen path its own path at scale * T), against the float64 oracle within the
    sharpened bound; rows without keys never enter; never NaN."""
    dev = _gpu()
    q, k, v, cu_q, cu_kv = _problem(lens_q, lens_kv, h_q=8, h_kv=2, d=d, seed=8,
                                    dtype=torch.bfloat16, scale=2.0)
    res = rocm_attn.fused_attn_small_seq(q.to(dev), k.to(dev), v.to(dev), cu_q.to(dev),
                                         cu_kv.to(dev),
                                         max(lens_q), max_kv, return_max_logit=True)
    ml = res[-1]
    ref = reference_max_logit(q, k, cu_q, cu_kv, "no_mask")
    assert ml.dtype == torch.float32 and ml.shape == (8,) and not ml.isnan().any()
    tol = sharpened_error_bound(max_kv, ref.abs().max().item()) + 1e-5 * (1 + ref.abs())
    assert ((ml.cpu().double() - ref).abs() <= tol).all(), (ml, ref)


@pytest.mark.parametrize("one_query", [False, True])
def test_small_seq_sharpened_glue_on_the_torch_path(one_query):
    """fused_attn_small_seq's GPU max_logit (the call's path again at scale * T, its LSE read
    with -inf rows dropped), run here through the CPU torch path: THD padding rows past the
    last segment and a segment without keys drop out; within the bound of the float64 oracle."""
    from rocm_attn.small_seq import _sharpened_max_logit

    g = torch.Generator().manual_seed(9)
    cq = (torch.arange(4, dtype=torch.int32) if one_query
          else torch.tensor([0, 2, 2, 5], dtype=torch.int32))
    ck = torch.tensor([0, 7, 9, 9], dtype=torch.int32)
    pad = 0 if one_query else 2  # THD padding rows after the last segment
    q = torch.randn(int(cq[-1]) + pad, 4, 32, generator=g) * 3
    k, v = (torch.randn(9, 2, 32, generator=g) for _ in range(2))
    ml = _sharpened_max_logit(v, "torch", q, k, cq, ck, None, 1 if one_query else 3, 7, None,
                              "thd_thd_thd")
    ref = reference_max_logit(q.double(), k.double(), cq, ck, "no_mask")
    assert ml.dtype == torch.float32 and ml.shape == (4,) and not ml.isnan().any()
    tol = sharpened_error_bound(7, ref.abs().max().item()) + 1e-6 * (1 + ref.abs())
    assert ((ml.double() - ref).abs() <= tol).all(), (ml, ref)
