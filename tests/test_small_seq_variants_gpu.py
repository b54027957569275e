"""Every small-seq kernel variant of the one table (tests/helpers/small_seq_variants.py) that the
plan picks on this GPU, run through its op against the float64 oracles: the tiled forward and
backward ops (torch.ops.rocm_attn.small_seq_tiled_fwd / _bwd with the plan of
rocm_attn.small_seq_plan, as the package calls them; the oracles of
tests/helpers/small_seq_tiled_cases.py and small_seq_tiled_bwd_cases.py) and the one-query
kernels through fused_attn_small_seq (tests/test_small_seq_gpu.py's check). The variant is forced
only by the entry's call shape through the plan. Where this device is an arch the entry lists
(gfx90a / gfx942 / gfx950, sm_90a with an sm_90a build, sm_100), the plan must pick the entry;
elsewhere an entry the plan sends to other kernels is skipped with the plan's choice.

Every test is marked ``gpu`` and skipped unless a CUDA/ROCm device is present and the compiled
extension is loaded. Outputs are allocated by the ops, so they are poisoned through the caching
allocator (NaN) before each call: an element a kernel forgets to write fails.

The CPU twin is tests/test_emu_small_seq_variants.py.
"""

from __future__ import annotations

import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import rocm_attn  # noqa: E402
from rocm_attn import small_seq_plan as sp  # noqa: E402
from rocm_attn.errors import read_errors  # noqa: E402
from helpers.gpu import gpu_marks, poison_allocator  # noqa: E402
from helpers.small_seq_tiled_gpu import tiled_device  # noqa: E402
from helpers import small_seq_tiled_bwd_cases as G  # noqa: E402
from helpers import small_seq_tiled_cases as C  # noqa: E402
from helpers import small_seq_variants as V  # noqa: E402

# every test starts and ends with a clean device error counter (tests/conftest.py)
pytestmark = [*gpu_marks(thd_ops=False), pytest.mark.usefixtures("clean_error_counter")]

CASES = V.kernel_cases()


@pytest.fixture(scope="module")
def dev():
    return tiled_device("small_seq_tiled_bwd")


def table_arch(device: sp.Device) -> str:
    """The arch name the table uses for a device: sm_90a for Hopper with the warpgroup kernels
    (an sm_90a build), else the device's own."""
    return "sm_90a" if device.arch == "sm_90" and device.warpgroup_mma else device.arch


def planned(case: V.VariantCase) -> None:
    """Skip unless this device's plan (this process's tuning) picks the entry; fail where the
    device is an arch the entry lists and the plan does not pick it."""
    device = sp.device_of()
    plan = case.plan(device, sp.current_tuning())
    if case.picked_by(plan):
        return
    assert table_arch(device) not in case.archs, \
        f"{case} on {table_arch(device)}: {V.mismatch(plan, case.launches)}"
    pytest.skip(f"the plan picks {plan} on {device.arch}")


@pytest.mark.parametrize("case", CASES, ids=str)
def test_variant(dev, case):
    import test_small_seq_gpu as SG

    with rocm_attn.tuning.override(**dict(case.tuning)):
        planned(case)
        if set(case.kernels) <= set(V.ONE_QUERY_KERNELS):
            SG.check_kernel(V.one_query_case(case, 3, device=dev),
                            grads=case.direction == "backward")
        elif case.direction == "forward":
            inputs = V.tiled_case(case, 5, device=dev)
            softmax = case.call.return_softmax
            poison_allocator(dev)
            out, lse, probs = torch.ops.rocm_attn.small_seq_tiled_fwd(
                inputs.q, inputs.k, inputs.v, inputs.cu_q, inputs.cu_kv, inputs.seqlens,
                inputs.max_q, inputs.max_kv, inputs.scale, softmax,
                sp.tiled_fwd_plan(inputs.q, inputs.k, inputs.max_q, inputs.max_kv, softmax))
            C.check(inputs, out, lse, probs if softmax else None, expect_bad=[])
            assert read_errors(reset=True) == (0, -1), "valid inputs tripped the error counter"
        else:
            inputs = V.tiled_case(case, 7, device=dev)
            dout, out, lse, dlse = G.inputs(inputs, 7, with_dlse=True)
            poison_allocator(dev)
            dq, dk, dv = torch.ops.rocm_attn.small_seq_tiled_bwd(
                dout, inputs.q, inputs.k, inputs.v, out, lse, dlse, inputs.cu_q, inputs.cu_kv,
                inputs.seqlens, inputs.max_q, inputs.max_kv, inputs.scale,
                sp.tiled_bwd_plan(inputs.q, inputs.k, inputs.max_q, inputs.max_kv))
            torch.cuda.synchronize()
            G.check_grads(inputs, dout, dlse, dq, dk, dv)
            assert read_errors(reset=True) == (0, -1), "the backward touched the error counter"
