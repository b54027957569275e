"""Every small-seq kernel variant of the one table (tests/helpers/small_seq_variants.py) that the
plan picks on the emulated device, executed on the CPU emulation (tests/helpers/emu.py) at 64-lane
waves with MFMA (the gfx942 code path) and at 32-lane waves, against the float64 oracles
(tests/helpers/small_seq_tiled_cases.py, small_seq_tiled_bwd_cases.py; the one-query kernels:
tests/test_small_seq.py's). The variant is forced only by the entry's call shape through the
plan; the test checks that the plan picks it (required at 64 lanes for the entries the table
lists on gfx942, whose shared memory the emulation has) and that the emulator ran its kernels.
Entries another emulated device's plan sends elsewhere are skipped with the plan's choice.

The GPU twin is tests/test_small_seq_variants_gpu.py.
"""

from __future__ import annotations

import pytest

from helpers import emu
from helpers import small_seq_tiled_bwd_cases as G
from helpers import small_seq_tiled_cases as C
from helpers import small_seq_variants as V

pytestmark = pytest.mark.usefixtures("one_torch_thread")

CASES = V.kernel_cases()


@pytest.fixture(scope="module", params=[64, 32], ids=["wave64", "wave32"])
def wave(request):
    return request.param


def _lib(case, wave):
    one_query = set(case.kernels) <= set(V.ONE_QUERY_KERNELS)
    return emu.emu_or_skip(("w" if one_query else "tiled_w") + str(wave))


def _planned(lib, case):
    """Skip unless the emulated device's plan picks the entry (required at 64 lanes for
    the entries listed on gfx942)."""
    plan = case.plan(emu.plan_device(lib), emu.plan_tuning(lib))
    if case.picked_by(plan):
        return
    problem = V.mismatch(plan, case.launches)
    assert not (lib.wave == 64 and "gfx942" in case.archs), \
        f"{case}: the 64-lane emulation's plan differs from gfx942's: {problem}"
    pytest.skip(f"the plan picks {plan} at {lib.wave} lanes")


def _ran(lib, case):
    names = "\n".join(lib.kernels_run(since_mark=True))
    for kernel in case.kernels:
        assert V.template(kernel) in names, f"{case}: {V.template(kernel)} did not run: {names}"


@pytest.mark.parametrize("case", CASES, ids=str)
def test_variant(wave, case):
    import test_emu_small_seq as E

    lib = _lib(case, wave)
    with emu.tuning(**dict(case.tuning)):
        _planned(lib, case)
        lib.mark_kernels()
        if set(case.kernels) <= set(V.ONE_QUERY_KERNELS):
            inputs = V.one_query_case(case, 3)
            E.check_emu(lib, inputs, grads=case.direction == "backward")
        elif case.direction == "forward":
            inputs = V.tiled_case(case, 5)
            lib.stats(reset=True)
            lib.errors(reset=True)
            out, lse, probs = emu.small_seq_tiled_fwd(lib, *inputs.args(),
                                                      return_softmax=case.call.return_softmax)
            assert lib.stats()["inactive_reads"] == 0, "a lane read a value from an exited lane"
            C.check(inputs, out, lse, probs if case.call.return_softmax else None,
                    f"wave {wave}", expect_bad=[])
            assert lib.errors() == (0, 0), "valid inputs tripped the device error counter"
        else:
            inputs = V.tiled_case(case, 7)
            dout, out, lse, dlse = G.inputs(inputs, 7, with_dlse=True)
            lib.stats(reset=True)
            lib.errors(reset=True)
            dq, dk, dv = emu.small_seq_tiled_bwd(lib, dout, inputs.q, inputs.k, inputs.v, out,
                                                 lse, dlse, inputs.cu_q, inputs.cu_kv,
                                                 inputs.seqlens, inputs.max_q, inputs.max_kv,
                                                 inputs.scale)
            assert lib.stats()["inactive_reads"] == 0, "a lane read a value from an exited lane"
            assert lib.errors() == (0, 0), "the backward touched the error counter"
            G.check_grads(inputs, dout, dlse, dq, dk, dv, f"wave {wave}")
        _ran(lib, case)
