"""rocm_attn.attention: varlen attention (causal, sliding window, chunked, padding between
sequences) against reference_attention on the same sequences, forward and backward."""

from __future__ import annotations

import itertools

import pytest
import torch

import rocm_attn
from rocm_attn import attention
from rocm_attn.reference import reference_attention

from helpers.cp import why_no_flash  # noqa: E402

F64 = torch.float64
I32 = torch.int32


def _cu(lens):
    out = [0]
    for n in lens:
        out.append(out[-1] + n)
    return torch.tensor(out, dtype=I32)


def _problem(lens_q, lens_kv, h_q, h_kv, d, pad, seed, dtype=F64, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    extra = [(i % 3) * 2 if pad else 0 for i in range(len(lens_q))]
    cu_q, cu_kv = _cu(lens_q), _cu(lens_kv)
    cu_qp, cu_kvp = _cu([n + e for n, e in zip(lens_q, extra)]), _cu(
        [n + e for n, e in zip(lens_kv, extra)])
    valid_q = torch.zeros(int(cu_qp[-1]), dtype=torch.bool)
    valid_kv = torch.zeros(int(cu_kvp[-1]), dtype=torch.bool)
    for i, (nq, nk) in enumerate(zip(lens_q, lens_kv)):
        valid_q[int(cu_qp[i]): int(cu_qp[i]) + nq] = True
        valid_kv[int(cu_kvp[i]): int(cu_kvp[i]) + nk] = True

    def rnd(rows, h, valid):
        x = torch.randn(rows, h, d, generator=g, dtype=F64)
        x[~valid] = float("nan")  # padding must never be read
        return x

    q, k, v = rnd(len(valid_q), h_q, valid_q), rnd(len(valid_kv), h_kv, valid_kv), rnd(
        len(valid_kv), h_kv, valid_kv)
    go = torch.randn(q.shape, generator=g, dtype=F64)
    gl = torch.randn(h_q, q.shape[0], generator=g, dtype=F64)
    dev = torch.device(device)
    return dict(q=q.to(dev, dtype), k=k.to(dev, dtype), v=v.to(dev, dtype),
                cu=[x.to(dev) for x in (cu_q, cu_kv, cu_qp, cu_kvp)], go=go.to(dev), gl=gl.to(dev),
                valid_q=valid_q.to(dev), valid_kv=valid_kv.to(dev))


def _loss(out, lse, go, gl):
    lse = lse.to(F64)
    return (out.to(F64) * go).sum() + (torch.where(torch.isfinite(lse), lse,
                                                   torch.zeros_like(lse)) * gl).sum()


def _run(p, causal, window, chunk, pad, backend="reference", max_q=None, max_kv=None):
    q, k, v = (p[n].detach().clone().requires_grad_(True) for n in "qkv")
    cu_q, cu_kv, cu_qp, cu_kvp = p["cu"]
    lens_q, lens_kv = (cu_q[1:] - cu_q[:-1]), (cu_kv[1:] - cu_kv[:-1])
    out, lse = attention(q, k, v, cu_q, cu_kv, max_q or int(lens_q.max()),
                         max_kv or int(lens_kv.max()),
                         attn_mask_type="causal_bottom_right" if causal else "no_mask",
                         window_size=window,
                         chunk_size=chunk, return_lse=True, backend=backend,
                         cu_seqlens_q_padded=cu_qp if pad else None,
                         cu_seqlens_kv_padded=cu_kvp if pad else None)
    _loss(out, lse, p["go"], p["gl"]).backward()
    got = {"out": out, "lse": lse, "dq": q.grad, "dk": k.grad, "dv": v.grad}
    qr, kr, vr = (p[n].detach().cpu().to(F64).requires_grad_(True) for n in "qkv")
    ro, rl = reference_attention(qr, kr, vr, cu_q.cpu(), cu_kv.cpu(),
                                 "causal_bottom_right" if causal else "no_mask", window, chunk,
                                 cu_seqlens_q_padded=cu_qp.cpu() if pad else None,
                                 cu_seqlens_kv_padded=cu_kvp.cpu() if pad else None)
    _loss(ro, rl, p["go"].cpu(), p["gl"].cpu()).backward()
    want = {"out": ro, "lse": rl}
    for n, x in (("dq", qr), ("dk", kr), ("dv", vr)):
        want[n] = torch.zeros_like(x) if x.grad is None else x.grad
    return got, want


def _check(got, want, tol, p, pad):
    for n in got:
        a, b = got[n].detach().cpu().to(F64), want[n].detach().to(F64)
        assert not torch.isnan(a).any(), f"{n}: NaN"
        inf_a, inf_b = torch.isinf(a), torch.isinf(b)
        assert torch.equal(inf_a, inf_b), f"{n}: infinite entries differ"
        err = (a[~inf_b] - b[~inf_b]).abs().max().item() if (~inf_b).any() else 0.0
        scale = max(1.0, b[~inf_b].abs().max().item()) if (~inf_b).any() else 1.0
        assert err <= tol * scale, f"{n}: max abs error {err:.3e}"
    if pad:
        vq, vkv = p["valid_q"].cpu(), p["valid_kv"].cpu()
        for n, valid in (("out", vq), ("dq", vq), ("dk", vkv), ("dv", vkv)):
            assert torch.equal(got[n].detach().cpu()[~valid],
                               torch.zeros_like(got[n].detach().cpu()[~valid])), n
        assert bool((got["lse"].detach().cpu()[:, ~vq] == float("-inf")).all())


CASES = list(itertools.product([True, False], [(-1, -1), (5, 0), (3, 4), (0, -1), (-1, 2)],
                               [None, 4], [False, True]))


@pytest.mark.parametrize("causal,window,chunk,pad", CASES)
def test_attention_matches_reference(causal, window, chunk, pad):
    p = _problem([13, 0, 37, 6, 1], [13, 0, 37, 6, 1], 4, 2, 8, pad, seed=len(window) + 7)
    got, want = _run(p, causal, window, chunk, pad)
    _check(got, want, 1e-10, p, pad)


@pytest.mark.parametrize("causal,window,chunk", [(True, (6, 0), 4), (False, (3, 5), None),
                                                 (True, (-1, -1), 3), (False, (-1, 1), 5)])
def test_attention_cross_lengths(causal, window, chunk):
    # bottom-right alignment: more queries than keys and fewer
    p = _problem([9, 20, 3, 0], [17, 6, 3, 5], 2, 1, 8, True, seed=3)
    got, want = _run(p, causal, window, chunk, True)
    _check(got, want, 1e-10, p, True)


def test_attention_bf16_reference_backend():
    p = _problem([30, 70], [30, 70], 2, 2, 16, True, seed=4, dtype=torch.bfloat16)
    got, want = _run(p, True, (16, 0), 32, True)
    assert got["out"].dtype == torch.bfloat16 and got["lse"].dtype == torch.float32
    _check(got, want, 2e-2, p, True)


def test_attention_without_lse_and_exported():
    p = _problem([8, 5], [8, 5], 2, 1, 8, False, seed=5)
    cu_q, cu_kv = p["cu"][:2]
    out = rocm_attn.attention(p["q"], p["k"], p["v"], cu_q, cu_kv, 8, 8,
                              attn_mask_type="causal_bottom_right")
    ref, _ = reference_attention(p["q"], p["k"], p["v"], cu_q, cu_kv, "causal_bottom_right")
    torch.testing.assert_close(out, ref, atol=1e-12, rtol=1e-12)
    assert "attention" in rocm_attn.__all__


@pytest.mark.parametrize("causal,window,chunk,pad", [
    (True, (5, 0), 4, True), (False, (3, 4), None, True), (False, (0, -1), None, False),
    (True, (-1, -1), None, False), (False, (-1, 2), 4, True), (True, (-1, -1), 3, False)])
def test_attention_torch_flash_backend_on_cpu_emulator(causal, window, chunk, pad, monkeypatch):
    """backend='torch_flash' with tests/helpers/flash_emulator.py standing in for the aten ops."""
    from helpers import flash_emulator

    from rocm_attn.varlen import backends

    monkeypatch.setattr(backends, "_aten_flash",
                        lambda: (flash_emulator.flash_forward, flash_emulator.flash_backward))
    monkeypatch.setattr(backends, "_flash_problem", lambda q: None)
    p = _problem([13, 0, 37, 6, 1], [13, 0, 37, 6, 1], 4, 2, 8, pad, seed=21)
    got, want = _run(p, causal, window, chunk, pad, backend="torch_flash")
    _check(got, want, 1e-5, p, pad)


def _good():
    cu = _cu([8, 4])
    g = torch.Generator().manual_seed(0)
    return dict(q=torch.randn(12, 4, 8, generator=g, dtype=F64),
                k=torch.randn(12, 2, 8, generator=g, dtype=F64),
                v=torch.randn(12, 2, 8, generator=g, dtype=F64), cu_seqlens_q=cu,
                cu_seqlens_kv=cu, max_seqlen_q=8, max_seqlen_kv=8)


@pytest.mark.parametrize("change,match", [
    (dict(window_size=(-2, 0)), "window_size"),
    (dict(window_size=(3,)), "window_size"),
    (dict(chunk_size=0), "chunk_size"),
    (dict(chunk_size=2.0), "chunk_size"),
    (dict(causal="yes"), "causal must be a bool"),
    (dict(max_seqlen_q=4), "max_seqlen_q = 4"),
    (dict(max_seqlen_kv=-1), "max_seqlen_kv"),
    (dict(cu_seqlens_q=torch.tensor([0, 8, 12])), "int32"),
    (dict(cu_seqlens_kv=_cu([12])), "b\\+1 = 3"),
    (dict(cu_seqlens_q_padded=_cu([6, 6])), "sequence 0 has 8 valid tokens but a padded slot"),
    (dict(cu_seqlens_kv=_cu([8, 8])), "cu_seqlens_kv ends at 16"),
    (dict(q=torch.randn(12, 3, 8, dtype=F64)), "multiple of h_kv"),
    (dict(q=torch.randn(12, 4, 8)), "share a dtype"),
    (dict(backend="flash"), "backend must be one of"),
    (dict(backend="torch_flash"), "torch_flash needs a CUDA or ROCm GPU"),
    (dict(softmax_scale="x"), "softmax_scale"),
])
def test_attention_argument_errors(change, match):
    args = _good()
    args.update(change)
    with pytest.raises(ValueError, match=match):
        attention(**args)


# --------------------------------------------------------------------------
# GPU: torch_flash (bf16) against the float64 reference
# --------------------------------------------------------------------------




GPU_CASES = [(c, w, ch, pad) for c, w, ch, pad in itertools.product(
    [True, False], [(-1, -1), (128, 0), (64, 64), (0, -1), (200, 10)], [None, 256],
    [False, True])]


@pytest.mark.gpu
@pytest.mark.skipif(why_no_flash() is not None, reason=str(why_no_flash()))
@pytest.mark.parametrize("causal,window,chunk,pad", GPU_CASES)
def test_gpu_attention_torch_flash(causal, window, chunk, pad):
    p = _problem([300, 1100, 1, 0, 77], [300, 1100, 1, 0, 77], 4, 2, 64, pad, seed=11,
                 dtype=torch.bfloat16, device="cuda")
    got, want = _run(p, causal, window, chunk, pad, backend="torch_flash")
    _check(got, want, 3e-2, p, pad)


@pytest.mark.gpu
@pytest.mark.skipif(why_no_flash() is not None, reason=str(why_no_flash()))
@pytest.mark.parametrize("causal,window,chunk", [(True, (40, 0), 64), (False, (30, 20), None),
                                                 (False, (0, -1), None)])
def test_gpu_attention_torch_flash_cross(causal, window, chunk):
    p = _problem([90, 200, 3], [170, 60, 3], 4, 1, 128, True, seed=12, dtype=torch.bfloat16,
                 device="cuda")
    got, want = _run(p, causal, window, chunk, True, backend="torch_flash")
    _check(got, want, 3e-2, p, True)


def test_attention_second_derivative_raises():
    """create_graph=True gives gradients that require grad (they depend on q, k, v) and
    differentiating them raises, instead of a silent zero second derivative."""
    p = _problem([5, 3], [5, 3], 2, 1, 8, False, seed=11)
    q, k, v = (p[n].clone().requires_grad_() for n in ("q", "k", "v"))
    out = attention(q, k, v, p["cu"][0], p["cu"][1], 5, 5, attn_mask_type="causal_bottom_right")
    dq, dk, dv = torch.autograd.grad((out.to(F64) * p["go"]).sum(), (q, k, v), create_graph=True)
    assert dq.requires_grad and dk.requires_grad and dv.requires_grad
    with pytest.raises(RuntimeError, match="attention has no second derivative"):
        torch.autograd.grad(dq.square().sum(), q)
    # without create_graph the gradients stay plain tensors
    out = attention(q, k, v, p["cu"][0], p["cu"][1], 5, 5, attn_mask_type="causal_bottom_right")
    dq, = torch.autograd.grad((out.to(F64) * p["go"]).sum(), q)
    assert not dq.requires_grad and torch.isfinite(dq).all()


def test_attention_compiles_fullgraph():
    """torch.compile(fullgraph=True) of attention (padding, window, LSE) traces without a
    data-dependent guard and gives the eager forward and gradients."""
    torch._dynamo.reset()
    p = _problem([7, 0, 12], [9, 3, 12], 2, 1, 8, True, seed=21)
    cu_q, cu_kv, cu_qp, cu_kvp = p["cu"]

    def fn(q, k, v):
        out, lse = attention(q, k, v, cu_q, cu_kv, 12, 12, attn_mask_type="causal_bottom_right",
                             window_size=(4, 0),
                             cu_seqlens_q_padded=cu_qp, cu_seqlens_kv_padded=cu_kvp,
                             return_lse=True)
        return out, lse

    results = []
    for f in (torch.compile(fn, fullgraph=True, backend="aot_eager"), fn):
        q, k, v = (p[n].clone().requires_grad_() for n in ("q", "k", "v"))
        out, lse = f(q, k, v)
        grads = torch.autograd.grad(_loss(out, lse, p["go"], p["gl"]), (q, k, v))
        results.append((out, lse) + grads)
    for got, want in zip(*results):
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12, equal_nan=True)
    out = results[0][0]
    assert not torch.isnan(out[p["valid_q"]]).any()
