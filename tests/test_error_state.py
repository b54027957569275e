"""The torch path's error counter cannot poison the process: whatever mode or tensor kind the
first call uses (inference mode, no_grad, meta tensors, fake tensors, torch.compile,
torch.export), later calls in every mode work and every bad segment counted is reported.

Each test starts from a process without counters (the ``fresh_counters`` fixture empties
rocm_attn.errors' table and restores it after), which is what a new process sees.
"""

from __future__ import annotations

import pytest
import torch

import rocm_attn
from rocm_attn import errors, fused_attn_small_seq
from rocm_attn.errors import SmallSeqContractError
from rocm_attn.nn import TargetAttention


@pytest.fixture
def fresh_counters():
    saved = dict(errors._torch_path_state)
    errors.read_errors(reset=True)
    errors._torch_path_state.clear()
    torch._dynamo.reset()
    yield
    errors._torch_path_state.clear()
    errors._torch_path_state.update(saved)
    for state in saved.values():
        if not state.is_inference():
            state.zero_()
    torch._dynamo.reset()


def _call(bad=False, grad=False, device="cpu", compiled=None):
    """Three one-query segments; with ``bad`` the last has 14 keys past k's 10 rows."""
    g = torch.Generator().manual_seed(5)
    q = torch.randn(3, 2, 8, generator=g).to(device).requires_grad_(grad)
    k = torch.randn(10, 2, 8, generator=g).to(device)
    v = torch.randn(10, 2, 8, generator=g).to(device)
    cu_q = torch.tensor([0, 1, 2, 3], dtype=torch.int32, device=device)
    cu_kv = torch.tensor([0, 3, 6, 20 if bad else 10], dtype=torch.int32, device=device)
    fn = compiled or _op
    return fn(q, k, v, cu_q, cu_kv)


def _op(q, k, v, cu_q, cu_kv):
    return fused_attn_small_seq(q, k, v, cu_q, cu_kv, max_seqlen_kv=16)


def _train_step(compiled=None):
    out = _call(grad=True, compiled=compiled)
    out.sum().backward()
    assert torch.isfinite(out).all()


def _expect_count(n):
    if n == 0:
        rocm_attn.check_errors()
        return
    with pytest.raises(SmallSeqContractError, match=f"{n} segment"):
        rocm_attn.check_errors()


def _module_step():
    torch.manual_seed(0)
    m = TargetAttention(16, 2, max_seqlen_kv=8)
    out = m(torch.randn(2, 16), torch.randn(2, 8, 16),
            seqlens=torch.tensor([3, 8], dtype=torch.int32))
    out.sum().backward()


def test_inference_mode_first_then_training(fresh_counters):
    with torch.inference_mode():
        out = _call(bad=True)
    assert torch.isnan(out[2]).all()
    _train_step()
    _module_step()
    _call(bad=False, compiled=torch.compile(_op, fullgraph=True))
    # the bad segment counted under inference mode is still reported, outside it
    _expect_count(1)
    _expect_count(0)


def test_inference_mode_first_then_validate_sync(fresh_counters):
    with torch.inference_mode():
        _call(bad=True)
    q = torch.randn(3, 2, 8, requires_grad=True)
    k, v = torch.randn(10, 2, 8), torch.randn(10, 2, 8)
    cu = torch.tensor([0, 1, 2, 3], dtype=torch.int32)
    bad_kv = torch.tensor([0, 3, 6, 20], dtype=torch.int32)
    with pytest.raises(SmallSeqContractError, match="1 segment"):
        fused_attn_small_seq(q, k, v, cu, bad_kv, max_seqlen_kv=16, validate="sync")
    _expect_count(1)  # the inference-mode call's error, set aside by the sync call


def test_training_first_then_inference_mode(fresh_counters):
    _train_step()
    with torch.inference_mode():
        _call(bad=True)
        _expect_count(1)  # check_errors inside inference mode too
        _call(bad=True)
    _expect_count(1)
    _train_step()


def test_no_grad_first_then_training(fresh_counters):
    with torch.no_grad():
        _call(bad=True)
    _train_step()
    _expect_count(1)


def test_meta_first_creates_no_counter(fresh_counters):
    out = _call(bad=True, device="meta")
    assert out.device.type == "meta"
    assert not any(s.device.type == "meta" for s in errors._torch_path_state.values())
    _expect_count(0)  # a meta call holds no values: nothing to count, and reading works
    _call(bad=True)
    _expect_count(1)


def test_meta_module_first(fresh_counters):
    """Shape probing a module on the meta device (deferred init) leaves the process clean."""
    m = TargetAttention(16, 2, max_seqlen_kv=8, device="meta")
    out = m(torch.empty(2, 16, device="meta"), torch.empty(2, 8, 16, device="meta"),
            seqlens=torch.empty(2, dtype=torch.int32, device="meta"))
    assert out.shape == (2, 16)
    _expect_count(0)
    _module_step()


def test_fake_tensor_first_creates_no_counter(fresh_counters):
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        _call(bad=True)
    assert all(type(s) is torch.Tensor for s in errors._torch_path_state.values())
    _expect_count(0)
    _train_step()


def test_compile_under_inference_mode_first(fresh_counters):
    compiled = torch.compile(_op, fullgraph=True)
    with torch.inference_mode():
        _call(bad=True, compiled=compiled)
    _train_step()
    _train_step(compiled=compiled)
    _expect_count(1)
    _call(bad=True, compiled=compiled)
    _expect_count(1)


def test_compile_first_then_inference_mode(fresh_counters):
    compiled = torch.compile(_op, fullgraph=True)
    _train_step(compiled=compiled)
    with torch.inference_mode():
        _call(bad=True, compiled=compiled)
        _call(bad=True)
    _expect_count(2)


def test_export_first_then_eager(fresh_counters):
    class M(torch.nn.Module):
        def forward(self, q, k, v, cu_q, cu_kv):
            return _op(q, k, v, cu_q, cu_kv)

    g = torch.Generator().manual_seed(1)
    args = (torch.randn(3, 2, 8, generator=g), torch.randn(10, 2, 8, generator=g),
            torch.randn(10, 2, 8, generator=g), torch.tensor([0, 1, 2, 3], dtype=torch.int32),
            torch.tensor([0, 3, 6, 10], dtype=torch.int32))
    with torch.inference_mode():
        program = torch.export.export(M(), args)
    assert all(type(s) is torch.Tensor for s in errors._torch_path_state.values())
    _train_step()
    _call(bad=True)
    _expect_count(1)
    program.module()(*args)
