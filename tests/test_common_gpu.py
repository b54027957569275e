"""The compat.h building blocks on the device, through a one-wave test kernel.

Checks raw-bit bf16/fp16 conversions (round to nearest even, NaN), wave/warp reductions for the
device's own wave width (64 on CDNA, 32 on NVIDIA), and 16-byte vector load/pack/store.
"""

from __future__ import annotations

import pytest
import torch

import rocm_attn._ext as ext

pytestmark = pytest.mark.gpu


@pytest.fixture
def wave():
    if not (torch.cuda.is_available() and ext.HAS_EXTENSION):
        pytest.skip("needs a GPU and the compiled extension")
    return torch.cuda.get_device_properties(0).warp_size


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_compat_building_blocks(wave, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(wave, generator=g) * 100
    x[0], x[1] = float("nan"), float("inf")
    x[2] = 1.0 + 2.0**-8  # a bf16 tie: rounds to even (1.0)
    bf16 = torch.randn(max(wave, 32), generator=g).to(torch.bfloat16)[:wave]
    fp16 = torch.randn(wave, generator=g).to(torch.float16)
    bf16_bits, fp16_bits = bf16.view(torch.int16), fp16.view(torch.int16)
    xs = torch.where(torch.isfinite(x), x, torch.zeros_like(x))  # reductions on finite values
    out, vec = torch.ops.rocm_attn.compat_selftest(bf16_bits.cuda(), fp16_bits.cuda(), xs.cuda())
    # conversions use the NaN/inf lanes through a second launch on the raw x
    out_x, _ = torch.ops.rocm_attn.compat_selftest(bf16_bits.cuda(), fp16_bits.cuda(), x.cuda())
    out, out_x, vec = out.cpu(), out_x.cpu(), vec.cpu()
    assert torch.equal(out[:, 0], bf16.float())
    assert torch.equal(out[:, 2], fp16.float())
    want_bf16 = x.to(torch.bfloat16).view(torch.int16).to(torch.int32) & 0xFFFF
    got_bf16 = out_x[:, 1].to(torch.int32)
    finite = torch.isfinite(x)
    assert torch.equal(got_bf16[finite], want_bf16[finite])
    assert torch.isnan(torch.tensor(got_bf16[0].item(), dtype=torch.int32).to(torch.int16).view(torch.bfloat16).float())
    want_fp16 = x.to(torch.float16).view(torch.int16).to(torch.int32) & 0xFFFF
    assert torch.equal(out_x[:, 3].to(torch.int32)[finite], want_fp16[finite])
    groups = xs.view(-1, 8)
    torch.testing.assert_close(out[:, 4], groups.sum(1).repeat_interleave(8), rtol=1e-5, atol=1e-3)
    assert torch.equal(out[:, 5], groups.amax(1).repeat_interleave(8))
    strided = xs.view(-1, 8)  # lanes sharing lane % 8
    torch.testing.assert_close(out[:, 6], strided.sum(0).repeat(wave // 8), rtol=1e-5, atol=1e-3)
    assert torch.equal(out[:, 7], strided.amax(0).repeat(wave // 8))
    torch.testing.assert_close(out[:, 8], xs.sum().expand(wave), rtol=1e-5, atol=1e-3)
    assert torch.all(out[:, 9] == wave)
    rows = torch.arange(wave) % 4
    want_vec = bf16.float()[: 32].view(4, 8)[rows]
    assert torch.equal(out[:, 10:18], want_vec)
    assert torch.equal(vec, bf16_bits[:32].view(4, 8)[rows])
