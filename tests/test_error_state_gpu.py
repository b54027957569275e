"""The error counters on a GPU: a first call under inference mode (an evaluation pass before
training) on the compiled kernels, the flash route or the varlen path leaves every later call
working, and a bad segment counted under inference mode is reported outside it.

The compiled kernels count into a module-scope device array (hip_src/common/error_state.h), the
flash route and the varlen path into the torch path's counter on the GPU (rocm_attn/errors.py);
both are exercised. Every test is marked ``gpu`` and skipped without a GPU and the extension.
"""

from __future__ import annotations

import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import rocm_attn  # noqa: E402
from rocm_attn import errors, fused_attn_small_seq  # noqa: E402
from rocm_attn.errors import SmallSeqContractError  # noqa: E402
from rocm_attn.nn import TargetAttention  # noqa: E402
from helpers.gpu import gpu_marks  # noqa: E402
import test_error_state  # noqa: E402

fresh_counters = test_error_state.fresh_counters

pytestmark = gpu_marks()

# (max_seqlen_q, max_seqlen_kv): the one-query kernels, the tiled kernels, longer histories
# (the flash route on CUDA builds, else the varlen attention)
FORMS = {"one_query": (1, 16), "tiled": (4, 64), "long": (4, 5000)}


def _call(form: str, bad: bool, grad: bool = False):
    max_q, max_kv = FORMS[form]
    dev = torch.device("cuda", torch.cuda.current_device())
    g = torch.Generator().manual_seed(3)
    b, n_kv = 3, min(max_kv, 40)
    rows_q = b * max_q
    q = torch.randn(rows_q, 4, 64, generator=g).to(dev, torch.bfloat16).requires_grad_(grad)
    k = torch.randn(b * n_kv, 4, 64, generator=g).to(dev, torch.bfloat16)
    v = torch.randn(b * n_kv, 4, 64, generator=g).to(dev, torch.bfloat16)
    cu_q = torch.arange(0, rows_q + 1, max_q, dtype=torch.int32, device=dev)
    cu_kv = torch.arange(0, b * n_kv + 1, n_kv, dtype=torch.int32, device=dev)
    if bad:
        cu_kv[-1] = b * n_kv + 7  # the last segment's keys run past k
    return fused_attn_small_seq(q, k, v, cu_q, cu_kv, max_seqlen_q=max_q, max_seqlen_kv=max_kv)


@pytest.mark.parametrize("form", sorted(FORMS))
def test_inference_mode_first_then_training(fresh_counters, form):
    with torch.inference_mode():
        out = _call(form, bad=True)
    torch.cuda.synchronize()
    assert torch.isnan(out[-1].float()).all()
    out = _call(form, bad=False, grad=True)
    out.float().sum().backward()
    with pytest.raises(SmallSeqContractError, match="1 segment"):
        rocm_attn.check_errors()
    rocm_attn.check_errors()


@pytest.mark.parametrize("form", sorted(FORMS))
def test_training_then_inference_mode_counts(fresh_counters, form):
    _call(form, bad=False, grad=True).float().sum().backward()
    with torch.inference_mode():
        _call(form, bad=True)
        _call(form, bad=True)
    with pytest.raises(SmallSeqContractError, match="2 segment"):
        rocm_attn.check_errors()


def test_module_inference_then_training(fresh_counters):
    dev = torch.device("cuda", torch.cuda.current_device())
    m = TargetAttention(256, 4, max_seqlen_kv=16, device=dev, dtype=torch.bfloat16)
    x = torch.randn(8, 256, device=dev, dtype=torch.bfloat16)
    hist = torch.randn(8, 16, 256, device=dev, dtype=torch.bfloat16)
    lens = torch.full((8,), 16, dtype=torch.int32, device=dev)
    with torch.inference_mode():
        m(x, hist, seqlens=lens)
    m(x, hist, seqlens=lens).float().sum().backward()
    assert all(not s.is_inference() for s in errors._torch_path_state.values())
    rocm_attn.check_errors()


@pytest.mark.skipif(torch.cuda.is_available() and torch.cuda.device_count() < 2,
                    reason="needs two GPUs")
def test_kernel_errors_on_another_device_are_reported(fresh_counters):
    """check_errors reads the kernels' counter of every device a kernel counted on, not only
    the current device's (hip_src/common/error_state.hip)."""
    torch.cuda.set_device(0)
    other = torch.device("cuda", 1)
    q = torch.randn(3, 4, 64, device=other, dtype=torch.bfloat16)
    k = torch.randn(12, 4, 64, device=other, dtype=torch.bfloat16)
    cu_q = torch.arange(4, dtype=torch.int32, device=other)
    cu_kv = torch.tensor([0, 4, 8, 30], dtype=torch.int32, device=other)  # last past k
    fused_attn_small_seq(q, k, k, cu_q, cu_kv, 1, 16, backend="kernel")
    torch.cuda.synchronize(other)
    assert torch.cuda.current_device() == 0
    with pytest.raises(SmallSeqContractError, match="1 segment"):
        rocm_attn.check_errors()
    assert torch.cuda.current_device() == 0
