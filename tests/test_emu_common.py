"""The CPU emulation of the HIP kernels (tests/helpers/emu.py): its own wave model, then the
compat.h and mma.h self-test kernels at 64 lanes (gfx942 pass, MFMA) and 32 lanes.

Includes the tests that prove a broken kernel is caught: MFMA operands swapped, a 64-lane
wave run with kernels compiled for 32 lanes.
"""

from __future__ import annotations

import subprocess

import pytest
import torch

from helpers import emu
from helpers.emu import ptr



@pytest.fixture(scope="module")
def lib64():
    return emu.emu_or_skip("w64")


def test_build_pins_wave(lib):
    """The kernels' compile-time wave width is the emulated one."""
    assert lib.kernel_wave == lib.wave
    assert lib.has_mma == (lib.wave == 64)


# --------------------------------------------------------------------------------------------
# the runtime's model
# --------------------------------------------------------------------------------------------


def test_uneven_persistent_loop(lib):
    """Waves of one block run different numbers of shuffles in a grid-stride loop: each item is
    counted exactly once and gets its own lanes' butterfly sum (a barrier-wide exchange, or a
    restarted thread, counted items several times)."""
    g = torch.Generator().manual_seed(0)
    n = 37
    work = torch.randint(0, 9, (n,), generator=g, dtype=torch.int32)
    counts = torch.zeros(n, dtype=torch.int32)
    sums = torch.zeros(n, dtype=torch.int32)
    lib.check(lib.lib.emu_model_uneven_persistent(ptr(work), n, 3, ptr(counts), ptr(sums)),
              "uneven")
    assert counts.tolist() == [1] * n
    w = lib.wave
    for i in range(n):
        v = torch.arange(w, dtype=torch.int64) + i
        for r in range(int(work[i])):
            v = v + v[torch.arange(w) ^ (1 << (r % 5))]
        assert sums[i].item() == int(v[0]), i


@pytest.mark.parametrize("live", [64, 40, 7])
def test_exited_lanes_stay_exited(lib, live):
    w = lib.wave
    live = min(live, w)
    lib.stats(reset=True)
    shfl = torch.full((4 * w,), -7, dtype=torch.int32)
    ballot = torch.zeros(4 * w, dtype=torch.int64)
    sync_and = torch.full((4 * w,), -7, dtype=torch.int32)
    lib.check(lib.lib.emu_model_early_exit(live, ptr(shfl), ptr(ballot), ptr(sync_and)), "exit")
    lane = torch.arange(4 * w) % w
    alive = lane < live
    src = (lane + 1) % w
    want = torch.where(src < live, src * 10 + 1, torch.zeros_like(src)).to(torch.int32)
    assert torch.equal(shfl[alive], want[alive])
    assert (shfl[~alive] == -7).all(), "an exited lane ran again"
    mask = sum(1 << i for i in range(live) if i % 3 == 0)
    mask = mask - (1 << 64) if mask >= 1 << 63 else mask  # as int64
    assert (ballot[alive] == mask).all()
    assert (sync_and[alive] == 1).all() and (sync_and[~alive] == -7).all()
    assert lib.stats()["inactive_reads"] == (4 if live < w else 0)


def test_divergent_exchange_is_reported(lib):
    out = torch.zeros(lib.wave, dtype=torch.int32)
    rc = lib.lib.emu_model_divergent(ptr(out))
    assert rc != emu.HIP_SUCCESS
    assert "block barrier while others wait at a cross-lane" in lib.message()


# --------------------------------------------------------------------------------------------
# compat.h (same checks as tests/test_common_gpu.py::test_compat_building_blocks)
# --------------------------------------------------------------------------------------------


def run_compat(lib, wave, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(wave, generator=g) * 100
    x[0], x[1] = float("nan"), float("inf")
    x[2] = 1.0 + 2.0**-8
    bf16 = torch.randn(max(wave, 32), generator=g).to(torch.bfloat16)
    fp16 = torch.randn(wave, generator=g).to(torch.float16)
    xs = torch.where(torch.isfinite(x), x, torch.zeros_like(x))

    def launch(values):
        out = torch.full((wave, 18), float("nan"))
        vec = torch.zeros(wave, 8, dtype=torch.int16)
        lib.check(lib.lib.emu_compat_selftest(ptr(bf16), ptr(fp16), ptr(values), ptr(out),
                                              ptr(vec)), "compat_selftest")
        return out, vec

    out, vec = launch(xs)
    out_x, _ = launch(x)
    bf16, bf16_bits = bf16[:wave], bf16.view(torch.int16)
    assert torch.equal(out[:, 0], bf16.float())
    assert torch.equal(out[:, 2], fp16.float())
    finite = torch.isfinite(x)
    want_bf16 = x.to(torch.bfloat16).view(torch.int16).to(torch.int32) & 0xFFFF
    assert torch.equal(out_x[:, 1].to(torch.int32)[finite], want_bf16[finite])
    want_fp16 = x.to(torch.float16).view(torch.int16).to(torch.int32) & 0xFFFF
    assert torch.equal(out_x[:, 3].to(torch.int32)[finite], want_fp16[finite])
    groups = xs.view(-1, 8)
    torch.testing.assert_close(out[:, 4], groups.sum(1).repeat_interleave(8), rtol=1e-5, atol=1e-3)
    assert torch.equal(out[:, 5], groups.amax(1).repeat_interleave(8))
    torch.testing.assert_close(out[:, 6], groups.sum(0).repeat(wave // 8), rtol=1e-5, atol=1e-3)
    assert torch.equal(out[:, 7], groups.amax(0).repeat(wave // 8))
    torch.testing.assert_close(out[:, 8], xs.sum().expand(wave), rtol=1e-5, atol=1e-3)
    assert torch.all(out[:, 9] == wave), "wave width reported by the kernel"
    rows = torch.arange(wave) % 4
    assert torch.equal(out[:, 10:18], bf16_bits[:32].view(4, 8)[rows].view(torch.bfloat16).float())
    assert torch.equal(vec, bf16_bits[:32].view(4, 8)[rows])


@pytest.mark.parametrize("seed", [0, 1])
def test_compat_building_blocks(lib, seed):
    lib.stats(reset=True)
    run_compat(lib, lib.wave, seed)
    assert lib.stats()["inactive_reads"] == 0


def test_wrong_wave_constant_fails():
    """Kernels compiled with a 32-lane RA_WAVE_SIZE, run in 64-lane waves (what compat.h picked
    silently for a host build without __GFX9__): the reductions must come out wrong."""
    bad = emu.emu_or_skip("w64_k32")
    assert bad.wave == 64 and bad.kernel_wave == 32
    with pytest.raises(AssertionError):
        run_compat(bad, 64, 0)


def test_wave_mismatch_does_not_compile():
    """Without the explicit opt-in of the deliberately broken build, a wave mismatch between the
    kernels and the emulated device is a compile error, not a silent 32-lane build."""
    cxx = emu.compiler() if _has_compiler() else pytest.skip("no clang++")
    cfg = dict(emu.CONFIGS["w64_k32"])
    flags = [f for f in emu._flags(cfg) if f != "-DRA_EMU_ALLOW_WAVE_MISMATCH"]
    res = subprocess.run([cxx, *flags, "-fsyntax-only", str(emu.EMU / "driver.cpp")],
                         capture_output=True, text=True)
    assert res.returncode != 0
    assert "another wave width than emulated" in res.stderr


def _has_compiler():
    try:
        emu.compiler()
        return True
    except emu.EmulationUnavailable:
        return False


# --------------------------------------------------------------------------------------------
# mma.h (same checks as tests/test_common_gpu.py::test_mma_tiles), 64 lanes
# --------------------------------------------------------------------------------------------


def run_mma(lib, dtype, d, kv, heads, values, rows):
    g = torch.Generator().manual_seed(d * 1000 + kv * 10 + heads + (values == "int"))
    if values == "int":
        x, y, v = (torch.randint(-2, 3, (16, d), generator=g).to(dtype) for _ in range(3))
    else:
        x, y, v = (torch.randn(16, d, generator=g).to(dtype) for _ in range(3))
    ny, nv, no = (16, 16, 16) if rows == "all" else (max(1, kv - 1), max(1, kv - 2), 3)
    s = torch.full((16, 16), float("nan"))
    cover = torch.zeros(16, 16, dtype=torch.int32)
    o = torch.full((16, d), -1, dtype=torch.int16)
    rowstat = torch.full((16, 3), float("nan"))
    info = torch.zeros(4, dtype=torch.int32)
    xb, yb, vb = (t.view(torch.int16).contiguous() for t in (x, y, v))
    lib.check(lib.lib.emu_mma_selftest(ptr(xb), ptr(yb), ptr(vb), d, kv, heads, ny, nv, no,
                                       int(dtype == torch.float16), ptr(s), ptr(cover), ptr(o),
                                       ptr(rowstat), ptr(info)), "mma_selftest")
    assert info[0] == 1, f"no matrix units: {info.tolist()}"
    _, ns, hb, wave = info.tolist()
    assert wave == 64 and ns == 16 and hb >= heads, info
    ctx = f"{dtype} d={d} kv={kv} heads={heads} {values} rows={rows}"
    xm, ym, vm = x.double(), y.double(), v.double()
    xm[hb:] = 0
    ym[min(kv, ny):] = 0
    vm[min(kv, nv):] = 0
    s_ref = xm @ ym.T
    want_cover = torch.zeros(16, 16, dtype=torch.int32)
    want_cover[:, :ns] = 1
    assert torch.equal(cover, want_cover), f"accumulator coverage ({ctx})"
    tol = dict(rtol=0, atol=0) if values == "int" else dict(rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(s[:, :ns], s_ref[:, :ns].float(), **tol)
    torch.testing.assert_close(rowstat[:, 0], s_ref[:, :ns].amax(1).float(), **tol)
    torch.testing.assert_close(rowstat[:, 1], s_ref[:, :ns].sum(1).float(), **tol)
    torch.testing.assert_close(rowstat[:ns, 2], s_ref[:, :ns].sum(0).float(), **tol)
    p = torch.zeros(16, 16, dtype=torch.float64)
    p[:hb, :ns] = s[:hb, :ns].to(dtype).double()
    o_ref = (p @ vm).to(dtype)
    nrows = min(no, hb)
    got = o.view(dtype)
    assert (o[nrows:] == -1).all(), f"O rows past {nrows} were written ({ctx})"
    if values == "int":
        assert torch.equal(got[:nrows], o_ref[:nrows]), f"O ({ctx})"
    else:
        err = ((got[:nrows].double() - o_ref[:nrows].double()).norm()
               / o_ref[:nrows].double().norm()).item()
        assert err < (4e-3 if dtype == torch.bfloat16 else 1e-3), f"O rel err {err} ({ctx})"


@pytest.mark.parametrize("values,rows", [("int", "all"), ("int", "some"), ("randn", "some")])
@pytest.mark.parametrize("heads", [8, 16])
@pytest.mark.parametrize("kv", [4, 8, 16])
@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_mma_tiles(lib64, dtype, d, kv, heads, values, rows):
    run_mma(lib64, dtype, d, kv, heads, values, rows)


def test_mma_selftest_without_matrix_units():
    """The 32-lane pass has no matrix units: the self-test says so and computes nothing."""
    lib32 = emu.emu_or_skip("w32")
    x = torch.zeros(16, 64, dtype=torch.int16)
    s = torch.zeros(16, 16)
    cover = torch.zeros(16, 16, dtype=torch.int32)
    rowstat = torch.zeros(16, 3)
    info = torch.full((4,), -1, dtype=torch.int32)
    lib32.check(lib32.lib.emu_mma_selftest(ptr(x), ptr(x), ptr(x), 64, 16, 16, 16, 16, 16, 0,
                                           ptr(s), ptr(cover), ptr(x), ptr(rowstat), ptr(info)),
                "mma_selftest")
    assert info[0] == 0 and info[3] == 32, info


@pytest.fixture
def swapped_mfma(lib64):
    lib64.lib.ra_emu_set_faults(1)
    yield lib64
    lib64.lib.ra_emu_set_faults(0)


@pytest.mark.parametrize("d", [64, 128])
def test_swapped_mfma_operands_fail(swapped_mfma, d):
    """MFMA issued with A and B exchanged (a layout slip in mma.h): the tile check must fail."""
    with pytest.raises(AssertionError):
        run_mma(swapped_mfma, torch.bfloat16, d, 16, 16, "int", "all")
