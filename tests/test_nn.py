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
