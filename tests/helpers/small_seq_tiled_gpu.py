"""What the tiled small-seq GPU test files share (tests/test_small_seq_tiled_gpu.py: the forward
op; tests/test_small_seq_tiled_bwd_gpu.py: the backward op): the device or the reason to skip,
the dtype and head-group grids, random segment lengths. The files' error-counter fixture is
``clean_error_counter`` in tests/conftest.py."""

from __future__ import annotations

from typing import List

import pytest
import torch

from .gpu import why_no_kernels

# Both ops take bf16 and fp16; the ids name the test rows in reports.
DTYPES = [pytest.param(torch.bfloat16, id="bf16"), pytest.param(torch.float16, id="fp16")]
# (h_q, h_kv): one q head per k head, GQA with 4 q heads per k head, and a single k head (MQA).
GROUPS = [pytest.param(8, 8, id="g1"), pytest.param(8, 2, id="g4"), pytest.param(4, 1, id="g4mqa")]


def tiled_device(op_name: str) -> torch.device:
    """The current GPU for the tests of ``torch.ops.rocm_attn.<op_name>``; skips where the kernels
    cannot run, or where the compiled extension predates the op."""
    why = why_no_kernels(thd_ops=False)
    if why:
        pytest.skip(why)
    if not hasattr(torch.ops.rocm_attn, op_name):
        pytest.skip(f"the compiled extension has no {op_name} op (rebuild)")
    return torch.device("cuda", torch.cuda.current_device())


def lens(gen: torch.Generator, n: int, lo: int, hi: int) -> List[int]:
    """n segment lengths drawn uniformly from lo..hi (both included) with the CPU generator gen."""
    return torch.randint(lo, hi + 1, (n,), generator=gen).tolist()
