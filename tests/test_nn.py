"""rocm_attn.nn.TargetAttention against a hand-written float64 computation."""

from __future__ import annotations

import pytest
import torch

from rocm_attn.nn import TargetAttention
from rocm_attn.reference import reference_small_seq


def _manual(module, candidate, history, seqlens):
    """Projections + float64 oracle + output projection, written out."""
    b, s, _ = history.shape
    h, hk, d = module.num_heads, module.num_kv_heads, module.head_dim
    q = module.q_proj(candidate).view(b, h, d)
    kv = module.kv_proj(history).view(b, s, 2, hk, d)
    out, _, _ = reference_small_seq(q, kv[:, :, 0], kv[:, :, 1], seqlens)
    return module.out_proj(out.reshape(b, h * d).to(candidate.dtype))


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("num_kv_heads", [4, 2, 1])
def test_padded_and_packed_histories_match_manual(seed, num_kv_heads):
    torch.manual_seed(seed)
    b, s, e = 37, 16, 64
    module = TargetAttention(e, num_heads=4, num_kv_heads=num_kv_heads, dtype=torch.float64)
    candidate = torch.randn(b, e, dtype=torch.float64)
    history = torch.randn(b, s, e, dtype=torch.float64)
    seqlens = torch.randint(0, s + 1, (b,), dtype=torch.int32)
    want = _manual(module, candidate, history, seqlens)
    got = module(candidate, history, seqlens=seqlens)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)
    # the same histories packed: only the valid rows, back to back
    packed = torch.cat([history[i, : int(seqlens[i])] for i in range(b)])
    cu = torch.nn.functional.pad(seqlens.cumsum(0, dtype=torch.int32), (1, 0))
    torch.testing.assert_close(module(candidate, packed, cu_seqlens=cu), want, rtol=1e-10, atol=1e-10)


def test_gradients_reach_every_parameter():
    torch.manual_seed(3)
    module = TargetAttention(32, num_heads=2, head_dim=16)
    candidate, history = torch.randn(9, 32), torch.randn(9, 5, 32)
    seqlens = torch.tensor([0, 1, 2, 3, 4, 5, 5, 1, 2], dtype=torch.int32)
    module(candidate, history, seqlens=seqlens).square().sum().backward()
    for name, p in module.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name
        assert p.grad.abs().sum() > 0, name


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="num_kv_heads"):
        TargetAttention(64, num_heads=4, num_kv_heads=3)
    with pytest.raises(ValueError, match="max_seqlen_kv"):
        TargetAttention(64, num_heads=4, max_seqlen_kv=17)
    module = TargetAttention(16, num_heads=2)
    with pytest.raises(ValueError, match="exactly one of seqlens"):
        module(torch.randn(2, 16), torch.randn(2, 3, 16))


@pytest.mark.gpu
def test_kernel_path_matches_torch_path_on_gpu():
    import rocm_attn._ext as ext

    if not (torch.cuda.is_available() and ext.HAS_EXTENSION):
        pytest.skip("needs a GPU and the compiled extension")
    torch.manual_seed(4)
    module = TargetAttention(256, num_heads=4, num_kv_heads=2, device="cuda", dtype=torch.bfloat16)
    candidate = torch.randn(1000, 256, device="cuda", dtype=torch.bfloat16)
    history = torch.randn(1000, 16, 256, device="cuda", dtype=torch.bfloat16)
    seqlens = torch.randint(0, 17, (1000,), dtype=torch.int32, device="cuda")
    module.backend = "kernel"  # k/v are strided views of the fused projection: no copy
    got = module(candidate, history, seqlens=seqlens)
    module.backend = "torch"
    want = module(candidate, history, seqlens=seqlens)
    err = ((got.double() - want.double()).norm() / want.double().norm()).item()
    assert err < 2e-2, err


def _bad(match, ident, **kwargs):
    return pytest.param({"embed_dim": 64, "num_heads": 4, **kwargs}, match, id=ident)


_BAD_CONSTRUCTOR = [
    _bad("num_heads", "heads0", num_heads=0),
    _bad("num_heads", "heads-2", num_heads=-2),
    _bad("num_heads", "heads_float", num_heads=4.0),
    _bad("embed_dim", "embed0", embed_dim=0),
    _bad("head_dim", "head_dim0", head_dim=0),
    _bad("head_dim", "head_dim-16", head_dim=-16),
    _bad("head_dim", "default_head_dim0", embed_dim=2),  # 2 // 4 = 0
    _bad("num_kv_heads", "kv_heads0", num_kv_heads=0),
    _bad("num_kv_heads", "kv_heads-2", num_kv_heads=-2),
    _bad("kv_embed_dim", "kv_embed0", kv_embed_dim=0),
    _bad("max_seqlen_kv", "max_seqlen_kv0", max_seqlen_kv=0),
    _bad("backend", "backend_cuda", backend="cuda"),
]


@pytest.mark.parametrize("kwargs,match", _BAD_CONSTRUCTOR)
def test_bad_constructor_arguments_are_value_errors(kwargs, match):
    """Zero or negative sizes are errors naming the argument (0 is not "unset")."""
    with pytest.raises(ValueError, match=match):
        TargetAttention(**kwargs)


def _bad_inputs():
    b, s, e = 3, 4, 16
    seqlens = torch.tensor([1, 4, 0], dtype=torch.int32)
    cu = torch.tensor([0, 1, 5, 5], dtype=torch.int32)
    return [
        ("candidate_width", (torch.randn(b, e + 1), torch.randn(b, s, e)), dict(seqlens=seqlens),
         "candidate"),
        ("candidate_rank", (torch.randn(b, 1, e), torch.randn(b, s, e)), dict(seqlens=seqlens),
         "candidate"),
        ("history_width", (torch.randn(b, e), torch.randn(b, s, e - 1)), dict(seqlens=seqlens),
         "history"),
        ("batch_mismatch", (torch.randn(b, e), torch.randn(b + 1, s, e)),
         dict(seqlens=seqlens), "history batch"),
        ("padded_rank", (torch.randn(b, e), torch.randn(b * s, e)), dict(seqlens=seqlens),
         "history"),
        ("packed_rank", (torch.randn(b, e), torch.randn(b, s, e)), dict(cu_seqlens=cu), "history"),
        ("packed_width", (torch.randn(b, e), torch.randn(5, e + 3)), dict(cu_seqlens=cu),
         "history"),
        ("cu_seqlens_len", (torch.randn(b, e), torch.randn(5, e)), dict(cu_seqlens=cu[:-1]),
         "cu_seqlens"),
        ("seqlens_len", (torch.randn(b, e), torch.randn(b, s, e)), dict(seqlens=seqlens[:2]),
         "seqlens"),
        ("seqlens_int64", (torch.randn(b, e), torch.randn(b, s, e)),
         dict(seqlens=seqlens.long()), "seqlens"),
        ("candidate_dtype", (torch.randn(b, e, dtype=torch.float64), torch.randn(b, s, e)),
         dict(seqlens=seqlens), "candidate dtype"),
        ("history_dtype", (torch.randn(b, e), torch.randn(b, s, e, dtype=torch.bfloat16)),
         dict(seqlens=seqlens), "history dtype"),
    ]


@pytest.mark.parametrize("args,kwargs,match", [pytest.param(a, k, m, id=i)
                                               for i, a, k, m in _bad_inputs()])
def test_bad_forward_inputs_are_value_errors(args, kwargs, match):
    module = TargetAttention(16, num_heads=2, num_kv_heads=1)
    with pytest.raises(ValueError, match=match):
        module(*args, **kwargs)


def test_inputs_of_another_dtype_under_autocast():
    """Under autocast the projections choose the dtype: a float32 module takes bfloat16 inputs."""
    module = TargetAttention(16, num_heads=2, backend="torch")
    seqlens = torch.tensor([1, 4, 0], dtype=torch.int32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = module(torch.randn(3, 16, dtype=torch.bfloat16),
                     torch.randn(3, 4, 16, dtype=torch.bfloat16), seqlens=seqlens)
    assert torch.isfinite(out).all()
