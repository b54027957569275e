"""The variant table of the small-seq tests (tests/helpers/small_seq_variants.py) against the plan
(rocm_attn/small_seq_plan.py), on the CPU: every entry's call gets the entry's launches on every
arch it lists, and every kernel the plan can return has an entry, so that the GPU and emulation
tests that iterate the table (tests/test_small_seq_variants_gpu.py,
tests/test_emu_small_seq_variants.py) reach every variant.
"""

from __future__ import annotations

import pytest

from helpers import small_seq_variants as V
from rocm_attn import small_seq_plan as sp


@pytest.mark.parametrize("case", V.VARIANT_CASES, ids=str)
def test_plan_picks_the_entry_on_its_archs(case):
    assert case.archs and set(case.archs) <= set(sp.ARCHS), case
    for arch in case.archs:
        problem = V.mismatch(case.plan(sp.ARCHS[arch]), case.launches)
        assert problem is None, f"{case} on {arch}: {problem}"


def test_every_kernel_of_the_plan_has_an_entry():
    """Each kernel of VARIANTS (what the plan can return) is launched by some entry, and no
    entry names a kernel the plan no longer has."""
    named = {k for case in V.VARIANT_CASES for k in case.kernels}
    assert named <= set(sp.VARIANTS), sorted(named - set(sp.VARIANTS))
    assert set(sp.VARIANTS) <= named, f"no table entry for {sorted(set(sp.VARIANTS) - named)}"


def test_entries_have_unique_names():
    names = [case.name for case in V.VARIANT_CASES]
    assert len(names) == len(set(names))


def test_every_kernel_runs_on_some_harness():
    """The kernels of hip_src/small_seq are all in the entries the GPU and emulation harnesses
    run; the AMD ones have an entry the 64-lane emulation (the gfx942 code path) picks."""
    run = {k for case in V.kernel_cases() for k in case.kernels}
    assert run == set(sp.VARIANTS) - set(V.NOT_KERNELS)
    emu64 = sp.Device("emu", "amd", 64, 16, 64 * 1024, 64 * 1024)
    on_amd = {k for case in V.VARIANT_CASES if set(case.archs) & set(V.AMD)
              for k in case.kernels} - set(V.NOT_KERNELS)
    emulated = {k for case in V.kernel_cases() if case.picked_by(case.plan(emu64))
                for k in case.kernels}
    assert on_amd <= emulated, sorted(on_amd - emulated)


def test_lengths_reach_the_host_bounds():
    for case in V.kernel_cases():
        q_lens, kv_lens = V.lengths(case.call)
        assert max(q_lens) == case.call.max_seqlen_q and max(kv_lens) == case.call.max_seqlen_kv
