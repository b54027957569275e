"""fused_attn_small_seq's backward under torch.use_deterministic_algorithms(True): two identical
backward passes agree bit for bit on every path that serves a call (the torch path on CPU; on
a GPU the one-query kernels, the tiled kernels, and the flash route, where torch then runs
flash's deterministic backward), and with an LSE cotangent. GPU cases are marked gpu and skip
where the path cannot run here."""

from __future__ import annotations

import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from rocm_attn import fused_attn_small_seq, small_seq, small_seq_flash, tuning  # noqa: E402


def _segments(lens_q, lens_kv, h_q, h_kv, d, dtype, device, seed=0):
    g = torch.Generator().manual_seed(seed)
    cu_q = torch.tensor([0] + torch.tensor(lens_q).cumsum(0).tolist(), dtype=torch.int32)
    cu_kv = torch.tensor([0] + torch.tensor(lens_kv).cumsum(0).tolist(), dtype=torch.int32)
    q = torch.randn(int(cu_q[-1]), h_q, d, generator=g)
    k, v = (torch.randn(int(cu_kv[-1]), h_kv, d, generator=g) for _ in range(2))
    dout = torch.randn(q.shape, generator=g)
    dlse = torch.randn(h_q, q.shape[0], generator=g)
    return ([x.to(device, dtype) for x in (q, k, v)], cu_q.to(device), cu_kv.to(device),
            dout.to(device, dtype), dlse.to(device))


def _two_backward_passes(leaves, cu_q, cu_kv, max_q, max_kv, dout, dlse, **kw):
    """(out, dq, dk, dv) of two identical forward + backward passes in deterministic mode; with
    ``dlse`` the loss reads the LSE too."""
    runs = []
    prev = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        for _ in range(2):
            xs = [x.detach().clone().requires_grad_(True) for x in leaves]
            res = fused_attn_small_seq(*xs, cu_q, cu_kv, max_q, max_kv,
                                       return_lse=dlse is not None, **kw)
            out, lse = res if dlse is not None else (res, None)
            loss = (out.float() * dout.float()).sum()
            if lse is not None:
                loss = loss + (torch.nan_to_num(lse, neginf=0.0) * dlse).sum()
            grads = torch.autograd.grad(loss, xs)
            runs.append((out.detach(),) + tuple(grads))
    finally:
        torch.use_deterministic_algorithms(prev)
    return runs


def _assert_bitwise(runs, what):
    for name, a, b in zip(("out", "dq", "dk", "dv"), *runs):
        assert torch.isfinite(a).all(), f"{what}: {name} not finite"
        assert torch.equal(a, b), f"{what}: {name} differs between two identical passes"


@pytest.mark.parametrize("dlse", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_torch_path_backward_bitwise_reproducible(dtype, dlse):
    leaves, cu_q, cu_kv, dout, gl = _segments([3, 0, 17, 5], [40, 9, 0, 33], 4, 2, 32, dtype,
                                              "cpu")
    runs = _two_backward_passes(leaves, cu_q, cu_kv, 17, 40, dout, gl if dlse else None,
                                backend="torch")
    _assert_bitwise(runs, "torch path")


def _gpu_device():
    from helpers.small_seq_tiled_gpu import tiled_device

    return tiled_device("small_seq_tiled_fwd")


def _path_of(leaves, cu_q, cu_kv, max_q, max_kv, return_lse):
    q, k, v = leaves
    one_query = small_seq._one_query_call(cu_q, cu_kv, None, max_q, max_kv)
    return small_seq._pick_path(q, k, v, one_query, max_q, max_kv, True, False, return_lse,
                                "auto")


@pytest.mark.gpu
@pytest.mark.parametrize("dlse", [False, True])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_gpu_tiled_backward_bitwise_reproducible(dtype, dlse):
    """The tiled kernels (flash route off): 700 candidates over 3000 keys in one segment (many
    key tiles per row tile), GQA 8 / 2, head dim 128."""
    dev = _gpu_device()
    leaves, cu_q, cu_kv, dout, gl = _segments([700, 5, 0, 64], [3000, 17, 9, 300], 8, 2, 128,
                                              dtype, dev, seed=1)
    with tuning.override(small_seq_flash_route=0):
        assert _path_of(leaves, cu_q, cu_kv, 700, 3000, dlse) == "tiled"
        runs = _two_backward_passes(leaves, cu_q, cu_kv, 700, 3000, dout, gl if dlse else None)
    _assert_bitwise(runs, "tiled kernels")


@pytest.mark.gpu
def test_gpu_one_query_kernel_backward_bitwise_reproducible():
    dev = _gpu_device()
    leaves, cu_q, cu_kv, dout, _ = _segments([1] * 64, [(i * 7) % 17 for i in range(64)], 8, 2,
                                             128, torch.bfloat16, dev, seed=2)
    assert _path_of(leaves, cu_q, cu_kv, 1, 16, False) == "kernel"
    runs = _two_backward_passes(leaves, cu_q, cu_kv, 1, 16, dout, None)
    _assert_bitwise(runs, "one-query kernels")


@pytest.mark.gpu
@pytest.mark.parametrize("dlse", [False, True])
def test_gpu_flash_route_backward_bitwise_reproducible(dlse):
    """The flash route (tuning small_seq_flash_route=2): segments whose keys span many of
    flash's key blocks, where its default dQ sums them with atomics; under deterministic mode
    torch runs flash's deterministic backward (with an LSE cotangent the tiled backward runs,
    deterministic too)."""
    dev = _gpu_device()
    why = small_seq_flash.route_problem(ignore_tuning=True)
    if why:
        pytest.skip(f"no flash route here: {why}")
    leaves, cu_q, cu_kv, dout, gl = _segments([512, 300, 0, 77], [2048, 1500, 64, 900], 8, 8,
                                              128, torch.bfloat16, dev, seed=3)
    with tuning.override(small_seq_flash_route=2):
        assert _path_of(leaves, cu_q, cu_kv, 512, 2048, dlse) == "flash"
        runs = _two_backward_passes(leaves, cu_q, cu_kv, 512, 2048, dout, gl if dlse else None)
    _assert_bitwise(runs, "flash route")
