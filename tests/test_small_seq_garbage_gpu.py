"""Garbage index tensors on the compiled small-seq kernels, against the torch path.

The same int32 garbage as tests/test_small_seq_contract.py (negative, decreasing, past the end,
pairs whose int32 difference wraps to a small length, any int32; a few garbage cu_seqlens_q
entries): the kernels must flag exactly the segments the torch path flags (the rule of
hip_src/small_seq/tiling.h resolve_segment, computed without int32 wrap), count the same
number with the same first bad segment, raise the same under validate="sync", and give the
valid segments the torch path's values, forward and backward.

Small on purpose (a few launches per test, inputs fixed by the seed: ROCM_ATTN_TEST_SEED
reproduces a run), so that it can run under compute-sanitizer:

    compute-sanitizer --tool memcheck python3 -m pytest -q tests/test_small_seq_garbage_gpu.py

Every test is marked ``gpu`` and skipped without a GPU and the compiled extension.
"""

from __future__ import annotations

import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import rocm_attn  # noqa: E402
from rocm_attn import SmallSeqContractError, check_errors, fused_attn_small_seq  # noqa: E402
from rocm_attn.errors import read_errors  # noqa: E402
from helpers.gpu import gpu_marks  # noqa: E402
import test_small_seq  # noqa: E402
from test_small_seq import BSHD, Rng, rel_err, seeds, thd_case  # noqa: E402
from test_small_seq_contract import INT32_MAX, INT32_MIN, Garbage, make_garbage  # noqa: E402


pytestmark = gpu_marks(thd_ops=False)

_error_counter = test_small_seq._error_counter
allow_contract_errors = test_small_seq.allow_contract_errors

TOL = 2e-2  # bf16 kernel vs the torch path (fp32 compute, rounded once), relative


@pytest.fixture
def dev():
    return torch.device("cuda", torch.cuda.current_device())


def _run(g: Garbage, q, k, v, dout, backend):
    """(out, lse, (dq, dk, dv), (count, first bad segment)) of one path; resets the counter."""
    leaves = tuple(t.detach().clone().requires_grad_() for t in (q, k, v))
    out, lse = fused_attn_small_seq(*leaves, g.cu_q.to(q.device), g.cu_kv.to(q.device), 1,
                                    g.max_kv, return_lse=True, backend=backend)
    grads = torch.autograd.grad(out, leaves, dout)
    torch.cuda.synchronize()
    return out.detach(), lse, grads, read_errors(reset=True)


def _lse_close(x: torch.Tensor, ref: torch.Tensor) -> bool:
    """Same -inf entries (empty segments), no NaN, finite entries within 1e-3."""
    empty = torch.isneginf(ref)
    if not torch.equal(torch.isneginf(x), empty) or torch.isnan(x).any():
        return False
    return not (~empty).any() or rel_err(x[~empty], ref[~empty]) < 1e-3


def _clean_kv_rows(g: Garbage) -> torch.Tensor:
    """kv rows covered by exactly one valid segment and by no bad segment's (ordered, clamped)
    range: the rows whose dk/dv both paths define the same way."""
    cover = torch.zeros(g.total_kv, dtype=torch.long)
    dirty = torch.zeros(g.total_kv, dtype=torch.bool)
    for i, ok in enumerate(g.valid):
        k0, k1 = g.cu_kv_list[i], g.cu_kv_list[i + 1]
        if ok:
            cover[k0:k1] += 1
        else:
            lo, hi = min(max(k0, 0), g.total_kv), min(max(k1, 0), g.total_kv)
            dirty[lo:hi] = True
    return (cover == 1) & ~dirty


@pytest.mark.parametrize("seed", seeds(3))
@pytest.mark.parametrize("d", [64, 128])
def test_kernel_flags_garbage_like_the_torch_path(dev, d, seed, allow_contract_errors):
    rng = Rng(seed, f"garbage_gpu{d}")
    g = make_garbage(rng, 24, int(rng.randint(1, 17, ())))
    q = rng.randn(g.b, 4, d, dtype=torch.bfloat16, device=dev)
    k = rng.randn(g.total_kv, 2, d, dtype=torch.bfloat16, device=dev)
    v = rng.randn(g.total_kv, 2, d, dtype=torch.bfloat16, device=dev)
    dout = rng.randn(g.b, 4, d, dtype=torch.bfloat16, device=dev)
    ctx = f"{g} d={d} {rng}"
    kout, klse, kgrads, kerr = _run(g, q, k, v, dout, "kernel")
    tout, tlse, tgrads, terr = _run(g, q, k, v, dout, "torch")
    knan = torch.isnan(klse).all(0).cpu().tolist()
    tnan = torch.isnan(tlse).all(0).cpu().tolist()
    assert knan == tnan == [not ok for ok in g.valid], f"NaN segments differ ({ctx})"
    assert kerr == terr == (len(g.bad), min(g.bad, default=-1)), f"counters {kerr} {terr} ({ctx})"
    # valid segments' q rows, less those a bad segment names too (the kernels write NaN there
    # from the bad segment's wave, racing the valid one; the torch path keeps the valid value)
    named_by_bad = {g.cu_q_list[i] for i in g.bad if 0 <= g.cu_q_list[i] < g.b}
    valid = [i for i, ok in enumerate(g.valid) if ok and g.cu_q_list[i] not in named_by_bad]
    rows = torch.tensor([g.cu_q_list[i] for i in valid], dtype=torch.long, device=dev)
    if valid:
        assert torch.isfinite(kout[rows]).all(), ctx
        assert rel_err(kout[rows], tout[rows]) < TOL, ctx
        assert _lse_close(klse[:, valid], tlse[:, valid]), ctx
        assert torch.isfinite(kgrads[0][rows]).all(), ctx
        assert rel_err(kgrads[0][rows], tgrads[0][rows]) < TOL, f"dq ({ctx})"
    clean = _clean_kv_rows(g).to(dev)
    for name, x, r in (("dk", kgrads[1], tgrads[1]), ("dv", kgrads[2], tgrads[2])):
        assert torch.isfinite(x[clean]).all(), f"{name} ({ctx})"
        assert rel_err(x[clean], r[clean]) < TOL, f"{name} ({ctx})"
    # validate="sync" on the kernels: raises for this call, naming its first bad segment
    if g.bad:
        with pytest.raises(SmallSeqContractError,
                           match=rf"{len(g.bad)} segment\(s\).*first bad segment: {g.bad[0]}\b"):
            fused_attn_small_seq(q, k, v, g.cu_q.to(dev), g.cu_kv.to(dev), 1, g.max_kv,
                                 backend="kernel", validate="sync")


def test_kernel_int32_wrap_of_a_segment_length(dev, allow_contract_errors):
    """cu_seqlens_kv = [0, 2^31-8, -(2^31-8), 9]: segment 1's int32 length wraps to 16; all
    three segments break the contract, on the kernels as on the torch path."""
    g = Garbage([0, 1, 2, 3], [0, 2147483640, -2147483640, 9], 9, 16)
    rng = Rng(0, "wrap_gpu")
    q = rng.randn(3, 2, 64, dtype=torch.bfloat16, device=dev)
    k, v = (rng.randn(9, 2, 64, dtype=torch.bfloat16, device=dev) for _ in range(2))
    dout = rng.randn(3, 2, 64, dtype=torch.bfloat16, device=dev)
    kout, klse, _, kerr = _run(g, q, k, v, dout, "kernel")
    _, tlse, _, terr = _run(g, q, k, v, dout, "torch")
    assert kerr == terr == (3, 0)
    assert torch.isnan(klse).all() and torch.isnan(tlse).all() and torch.isnan(kout).all()


def test_kernel_query_rows_like_the_torch_path(dev, allow_contract_errors):
    """cu_seqlens_q = [0, 2, 3, 4]: only segment 1 is valid, and it writes q row 2."""
    g = Garbage([0, 2, 3, 4], [0, 2, 5, 7], 7, 4)
    rng = Rng(0, "qrow_gpu")
    q = rng.randn(3, 2, 64, dtype=torch.bfloat16, device=dev)
    k, v = (rng.randn(7, 2, 64, dtype=torch.bfloat16, device=dev) for _ in range(2))
    dout = rng.randn(3, 2, 64, dtype=torch.bfloat16, device=dev)
    kout, klse, kgrads, kerr = _run(g, q, k, v, dout, "kernel")
    tout, tlse, tgrads, terr = _run(g, q, k, v, dout, "torch")
    assert kerr == terr == (2, 0)
    assert torch.isnan(klse[:, [0, 2]]).all() and torch.isfinite(klse[:, 1]).all()
    assert rel_err(kout[2], tout[2]) < TOL and rel_err(kgrads[0][2], tgrads[0][2]) < TOL


def test_kernel_garbage_seqlens_bshd(dev, allow_contract_errors):
    lens = [3, -1, 6, INT32_MAX, 0, INT32_MIN, 5, 7, 2, -7]  # s_kv 6, max_seqlen_kv 5
    rng = Rng(0, "bshd_gpu")
    q = rng.randn(10, 1, 4, 64, dtype=torch.bfloat16, device=dev)
    k, v = (rng.randn(10, 6, 2, 64, dtype=torch.bfloat16, device=dev) for _ in range(2))
    seqlens = torch.tensor(lens, dtype=torch.int32, device=dev)
    results = []
    for backend in ("kernel", "torch"):
        _, lse = fused_attn_small_seq(q, k, v, max_seqlen_kv=5, qkv_layout=BSHD,
                                      seqlens_kv=seqlens, return_lse=True, backend=backend)
        results.append((torch.isnan(lse).all(0).cpu().tolist(), read_errors(reset=True)))
    bad = [i for i, n in enumerate(lens) if not 0 <= n <= 5]
    assert results[0] == results[1] == ([i in bad for i in range(10)], (len(bad), bad[0]))


def test_validate_sync_on_kernels_reports_only_its_own_call(dev, allow_contract_errors):
    rng = Rng(0, "own_gpu")
    lens = torch.tensor([2, 9, 1, 0, 4, 20])  # segments 1 and 5 > max_seqlen_kv = 8
    bad = thd_case(rng, 6, 4, 2, 64, 8, torch.bfloat16, lens=lens, device=dev)
    good = thd_case(rng, 6, 4, 2, 64, 8, torch.bfloat16, device=dev)
    fused_attn_small_seq(*bad.qkv(), bad.cu_q, bad.cu_kv, 1, 8, backend="kernel")
    fused_attn_small_seq(*good.qkv(), good.cu_q, good.cu_kv, 1, 8, backend="kernel",
                         validate="sync")  # must not raise for the earlier call
    with pytest.raises(SmallSeqContractError, match=r"2 segment\(s\).*first bad segment: 1\b"):
        check_errors()


@pytest.mark.parametrize("scale", [float("nan"), float("inf"), 1e39])
def test_non_finite_scale_rejected_after_kernel_calls(dev, scale):
    """The fast path of calls like earlier served ones still refuses a non-finite scale."""
    case = thd_case(Rng(0, "scale_gpu"), 8, 4, 2, 64, 8, torch.bfloat16, device=dev)
    args = (*case.qkv(), case.cu_q, case.cu_kv, 1, 8)
    fused_attn_small_seq(*args, softmax_scale=0.125, backend="kernel")
    with pytest.raises(ValueError, match="softmax_scale"):
        fused_attn_small_seq(*args, softmax_scale=scale)


@pytest.mark.parametrize("scale", [0.0, -0.3])
def test_kernel_zero_and_negative_scale_match_torch_path(dev, scale):
    case = thd_case(Rng(0, f"scale_gpu{scale}"), 40, 4, 2, 64, 8, torch.bfloat16, device=dev)
    args = (*case.qkv(), case.cu_q, case.cu_kv, 1, 8)
    kout = fused_attn_small_seq(*args, softmax_scale=scale, backend="kernel")
    tout = fused_attn_small_seq(*args, softmax_scale=scale, backend="torch")
    assert torch.isfinite(kout).all() and rel_err(kout, tout) < TOL
