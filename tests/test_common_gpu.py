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


# --------------------------------------------------------------------------------------------
# Matrix units (hip_src/common/mma.h) through the mma_selftest op
# --------------------------------------------------------------------------------------------


def _expects_matrix_units() -> bool:
    """Devices on which the build must have compiled the matrix-unit path (RA_HAS_MMA)."""
    props = torch.cuda.get_device_properties(0)
    if torch.version.hip:
        arch = getattr(props, "gcnArchName", "").split(":")[0]
        return arch in ("gfx90a", "gfx940", "gfx941", "gfx942")
    return torch.cuda.get_device_capability(0) >= (8, 0)


def _mma_inputs(d, dtype, values, seed):
    g = torch.Generator().manual_seed(seed)
    if values == "int":
        # Small integers: every product, score and output below is exact in fp32, and the
        # 16-bit roundings match torch's bit for bit, so the comparison is exact.
        x, y, v = (torch.randint(-2, 3, (16, d), generator=g).to(dtype) for _ in range(3))
    else:
        x, y, v = (torch.randn(16, d, generator=g).to(dtype) for _ in range(3))
    return x, y, v


def test_matrix_units_present(wave):
    """The device pass of this build has the matrix-unit path where the device has the units
    (a silent fallback would leave the GQA forward on the general kernel)."""
    x = torch.zeros(16, 64, dtype=torch.int16, device="cuda")
    *_, info = torch.ops.rocm_attn.mma_selftest(x, x, x, 16, 16, 16, 16, 16, False)
    info = info.cpu().tolist()
    assert info[3] == wave
    if _expects_matrix_units():
        assert info[0] == 1, f"built without matrix units for this device: info={info}"
    else:
        pytest.skip(f"no matrix-unit path for this device (info={info})")


@pytest.mark.parametrize("values,rows", [("int", "all"), ("int", "some"), ("randn", "some")])
@pytest.mark.parametrize("heads", [8, 16])
@pytest.mark.parametrize("kv", [4, 8, 16])
@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_mma_tiles(wave, dtype, d, kv, heads, values, rows):
    """S = X Y^T (fp32), its row max / sum and column sums, and O = round(S) V against scalar math, in the
    operand shapes of the small-seq forward. Every accumulator element must be held by exactly
    one lane (coverage), every output element written once, nothing outside the rows asked for.
    A fragment-layout mistake shows up here as a wrong element, not as a wrong attention row."""
    info = torch.ops.rocm_attn.mma_selftest(
        *(torch.zeros(16, 64, dtype=torch.int16, device="cuda"),) * 3, 16, 16, 16, 16, 16, False
    )[-1].cpu()
    if info[0] != 1:
        assert not _expects_matrix_units(), f"built without matrix units: info={info.tolist()}"
        pytest.skip("no matrix units on this device")
    seed = d * 1000 + kv * 10 + heads + (values == "int")
    x, y, v = _mma_inputs(d, dtype, values, seed)
    ny, nv, no = (16, 16, 16) if rows == "all" else (max(1, kv - 1), max(1, kv - 2), 3)
    s, cover, o, rowstat, info = torch.ops.rocm_attn.mma_selftest(
        *(t.view(torch.int16).cuda() for t in (x, y, v)), kv, heads, ny, nv, no,
        dtype == torch.float16)
    s, cover, o, rowstat = s.cpu(), cover.cpu(), o.cpu(), rowstat.cpu()
    _, ns, hb, _ = info.cpu().tolist()
    assert ns == (8 if kv <= 8 else 16) or (ns == 16 and wave == 64), info
    assert hb >= heads, info
    ctx = f"{dtype} d={d} kv={kv} heads={heads} {values} rows={rows} info={info.tolist()}"

    # reference: rows of X past the tile's rows, of Y / V past min(kv, n) are zeros
    xm, ym, vm = x.double(), y.double(), v.double()
    xm[hb:] = 0
    ym[min(kv, ny):] = 0
    vm[min(kv, nv):] = 0
    s_ref = xm @ ym.T  # [16, 16]
    want_cover = torch.zeros(16, 16, dtype=torch.int32)
    want_cover[:, :ns] = 1
    assert torch.equal(cover, want_cover), f"accumulator coverage\n{cover}\n({ctx})"
    assert torch.isnan(s[:, ns:]).all(), ctx
    tol = dict(rtol=0, atol=0) if values == "int" else dict(rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(s[:, :ns], s_ref[:, :ns].float(), **tol, msg=lambda m: f"S: {m} ({ctx})")
    torch.testing.assert_close(rowstat[:, 0], s_ref[:, :ns].amax(1).float(), **tol,
                               msg=lambda m: f"row max: {m} ({ctx})")
    torch.testing.assert_close(rowstat[:, 1], s_ref[:, :ns].sum(1).float(), **tol,
                               msg=lambda m: f"row sum: {m} ({ctx})")
    torch.testing.assert_close(rowstat[:ns, 2], s_ref[:, :ns].sum(0).float(), **tol,
                               msg=lambda m: f"column sum: {m} ({ctx})")
    assert torch.isnan(rowstat[ns:, 2]).all(), ctx

    p = torch.zeros(16, 16, dtype=torch.float64)
    p[:hb, :ns] = s[:hb, :ns].to(dtype).double()  # the kernel's own S, rounded like the kernel
    o_ref = (p @ vm).to(dtype)  # [16, d]
    nrows = min(no, hb)
    got = o.view(dtype)
    assert (o[nrows:] == -1).all(), f"O rows past {nrows} were written ({ctx})"
    if values == "int":
        assert torch.equal(got[:nrows], o_ref[:nrows]), f"O\n{got[:nrows]}\n{o_ref[:nrows]} ({ctx})"
    else:
        err = ((got[:nrows].double() - o_ref[:nrows].double()).norm()
               / o_ref[:nrows].double().norm()).item()
        assert err < (4e-3 if dtype == torch.bfloat16 else 1e-3), f"O rel err {err} ({ctx})"
