"""The per-segment contract of fused_attn_small_seq on the torch path (no GPU needed).

* Garbage offsets: random int32 cu_seqlens (negative, decreasing, past the end, pairs whose
  int32 difference wraps to a small length) are flagged exactly as the kernels' rule says
  (hip_src/small_seq/tiling.h resolve_segment, written out in plain Python below), never read
  out of range, and valid segments still match the float64 oracle, forward and backward.
* Masked rows (other segments' keys, BSHD padding) never reach a valid segment's gradient.
* softmax_scale must be finite in float32; validate="sync" reports only its own call.

tests/test_small_seq_garbage_gpu.py runs the same garbage on the kernels against this path.
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
from typing import List

import pytest
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from rocm_attn import SmallSeqContractError, check_errors, fused_attn_small_seq  # noqa: E402
from rocm_attn.errors import read_errors  # noqa: E402
from rocm_attn.nn import TargetAttention  # noqa: E402
from rocm_attn.reference import reference_small_seq  # noqa: E402
import test_small_seq  # noqa: E402
from test_small_seq import (  # noqa: E402  (helpers only: no test functions are imported)
    BSHD,
    THD,
    TOL_FP32,
    Rng,
    assert_lse,
    assert_rel,
    bshd_case,
    call,
    out_tol,
    run_op,
    run_ref,
    seeds,
    thd_case,
)

# The CPU module's fixtures: one intra-op thread, and a clean error counter before each test
# that must stay clean unless the test asks for allow_contract_errors.
_one_thread = test_small_seq._one_thread
_error_counter = test_small_seq._error_counter
allow_contract_errors = test_small_seq.allow_contract_errors

INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1


# --------------------------------------------------------------------------------------------
# garbage offsets and the kernels' rule
# --------------------------------------------------------------------------------------------


class Garbage:
    """THD index tensors full of int32 garbage, with the host-side (Python int) view of them."""

    def __init__(self, cu_q: List[int], cu_kv: List[int], total_kv: int, max_kv: int):
        self.cu_q_list, self.cu_kv_list = cu_q, cu_kv
        self.b, self.total_kv, self.max_kv = len(cu_q) - 1, total_kv, max_kv
        self.cu_q = torch.tensor(cu_q, dtype=torch.int32)
        self.cu_kv = torch.tensor(cu_kv, dtype=torch.int32)
        self.valid = rule_thd(cu_q, cu_kv, self.b, total_kv, max_kv)

    @property
    def bad(self) -> List[int]:
        return [i for i, ok in enumerate(self.valid) if not ok]

    def __str__(self):
        return f"cu_seqlens_q={self.cu_q_list} cu_seqlens_kv={self.cu_kv_list} " \
               f"total_kv={self.total_kv} max_kv={self.max_kv}"


def rule_thd(cu_q, cu_kv, total_q, total_kv, max_kv) -> List[bool]:
    """The kernels' contract, per segment, in exact integers: exactly one query row q0 with
    0 <= q0 < total_q; kv rows k0..k1 with 0 <= k0 <= k1 <= total_kv and k1 - k0 <= max_kv."""
    out = []
    for i in range(len(cu_q) - 1):
        q0, q1, k0, k1 = cu_q[i], cu_q[i + 1], cu_kv[i], cu_kv[i + 1]
        out.append(q1 - q0 == 1 and 0 <= q0 < total_q and 0 <= k0 <= k1 <= total_kv
                   and k1 - k0 <= max_kv)
    return out


def make_garbage(rng: Rng, b: int, max_kv: int) -> Garbage:
    """Valid offsets with about a third of the entries replaced by garbage: negative, past the
    end, decreasing, any int32, and (at least once) a pair k0 = INT32_MAX - a, k1 = INT32_MIN + c
    whose int32 difference wraps to 1 + a + c <= max_kv. A few isolated cu_seqlens_q entries
    are garbage too (isolated, so that a valid segment's query row is its own; the wrap segment
    keeps its query, so that only its int32 length can flag it)."""
    r = random.Random(rng.seed)
    lens = [r.randint(0, max_kv) for _ in range(b)]
    cu_kv = [0]
    for n in lens:
        cu_kv.append(cu_kv[-1] + n)
    total_kv = cu_kv[-1] + r.randint(0, 3)
    wrap_at = r.randrange(b)  # the guaranteed wrap pair: entries wrap_at, wrap_at + 1
    for j in range(b + 1):
        if j in (wrap_at, wrap_at + 1) or r.random() > 0.35:
            continue
        kind = r.choice(["negative", "past_end", "decrease", "int32", "too_long"])
        if kind == "negative":
            cu_kv[j] = -r.randint(1, 40)
        elif kind == "past_end":
            cu_kv[j] = total_kv + r.randint(1, 40)
        elif kind == "decrease" and j > 0:
            cu_kv[j] = cu_kv[j - 1] - r.randint(1, 5)
        elif kind == "int32":
            cu_kv[j] = r.randint(INT32_MIN, INT32_MAX)
        elif kind == "too_long" and j > 0:
            cu_kv[j] = cu_kv[j - 1] + max_kv + r.randint(1, 4)
    a = r.randint(0, max_kv - 1)
    c = r.randint(0, max_kv - 1 - a)
    cu_kv[wrap_at], cu_kv[wrap_at + 1] = INT32_MAX - a, INT32_MIN + c
    assert (cu_kv[wrap_at + 1] - cu_kv[wrap_at]) % 2**32 == 1 + a + c <= max_kv
    cu_q = list(range(b + 1))
    for j in range(1, b, 3):  # isolated entries, and none of the wrap segment's
        if j not in (wrap_at, wrap_at + 1) and r.random() < 0.3:
            cu_q[j] = r.choice([-1, b + 2, j + 2, r.randint(INT32_MIN, INT32_MAX)])
    return Garbage(cu_q, cu_kv, total_kv, max_kv)


def garbage_reference(g: Garbage, q, k, v, dout):
    """float64 oracle over the valid segments only: (out [n_valid, h, d], lse [h, n_valid],
    dq, dk, dv) where the gradients are of sum(out * dout[valid q rows])."""
    valid = [i for i, ok in enumerate(g.valid) if ok]
    qd, kd, vd = (t.detach().double().requires_grad_() for t in (q, k, v))
    q_rows = torch.tensor([g.cu_q_list[i] for i in valid], dtype=torch.long)
    starts = torch.tensor([g.cu_kv_list[i] for i in valid], dtype=torch.long)
    lens = torch.tensor([g.cu_kv_list[i + 1] - g.cu_kv_list[i] for i in valid], dtype=torch.long)
    rows = (starts.unsqueeze(1) + torch.arange(g.max_kv)).clamp(0, max(g.total_kv - 1, 0))
    out, lse, _ = reference_small_seq(qd[q_rows], kd[rows], vd[rows], lens)
    dq, dk, dv = torch.autograd.grad(out, (qd, kd, vd), dout.double()[q_rows],
                                     materialize_grads=True)
    return valid, q_rows, out, lse, (dq, dk, dv)


@pytest.mark.parametrize("seed", seeds(6))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_garbage_offsets_flagged_by_the_kernel_rule(dtype, seed, allow_contract_errors):
    rng = Rng(seed, f"garbage{dtype}")
    g = make_garbage(rng, 24, rng.randint(1, 17, ()).item())
    q = rng.randn(g.b, 4, 32, dtype=dtype).requires_grad_()
    k = rng.randn(g.total_kv, 2, 32, dtype=dtype).requires_grad_()
    v = rng.randn(g.total_kv, 2, 32, dtype=dtype).requires_grad_()
    dout = rng.randn(g.b, 4, 32, dtype=dtype)
    ctx = f"{g} {dtype} {rng}"
    out, lse, probs = fused_attn_small_seq(q, k, v, g.cu_q, g.cu_kv, 1, g.max_kv, return_lse=True,
                                           return_softmax=True)
    # flagged segments: exactly the rule's, counted, NaN
    nan_segs = [i for i in range(g.b) if torch.isnan(lse[:, i]).all()]
    assert nan_segs == g.bad, f"NaN segments {nan_segs} != the rule's {g.bad} ({ctx})"
    assert read_errors(reset=False) == (len(g.bad), min(g.bad, default=-1)), ctx
    assert torch.isnan(probs[g.bad]).all(), ctx
    # valid segments: the oracle, at their query rows; every other row is NaN
    valid, q_rows, rout, rlse, rgrads = garbage_reference(g, q, k, v, dout)
    assert_rel("out (valid segments)", out[q_rows], rout, out_tol(dtype), ctx)
    assert_lse(lse[:, valid], rlse, TOL_FP32, ctx)
    others = torch.ones(g.b, dtype=torch.bool)
    others[q_rows] = False
    assert torch.isnan(out[others]).all(), f"rows no valid segment writes must be NaN ({ctx})"
    # backward: finite everywhere, and the oracle's gradients of the valid segments
    grads = torch.autograd.grad(out, (q, k, v), dout)
    for name, x, r in zip(("dq", "dk", "dv"), grads, rgrads):
        assert_rel(name, x, r, out_tol(dtype), ctx)
    # validate="sync" raises for this call, naming its first bad segment
    read_errors(reset=True)
    if g.bad:
        with pytest.raises(SmallSeqContractError,
                           match=rf"{len(g.bad)} segment\(s\).*first bad segment: {g.bad[0]}\b"):
            fused_attn_small_seq(q, k, v, g.cu_q, g.cu_kv, 1, g.max_kv, validate="sync")
    else:
        fused_attn_small_seq(q, k, v, g.cu_q, g.cu_kv, 1, g.max_kv, validate="sync")


@pytest.mark.parametrize("seed", seeds(2))
def test_garbage_seqlens_bshd(seed, allow_contract_errors):
    """BSHD: valid iff 0 <= seqlens_kv[i] <= min(max_seqlen_kv, s_kv), for any int32."""
    rng = Rng(seed, "garbage_bshd")
    r = random.Random(rng.seed)
    b, s, max_kv = 20, 6, 5
    lens = [r.choice([r.randint(0, 6), -1, INT32_MIN, INT32_MAX, r.randint(INT32_MIN, INT32_MAX)])
            for _ in range(b)]
    bad = [i for i, n in enumerate(lens) if not 0 <= n <= min(max_kv, s)]
    q = rng.randn(b, 1, 4, 32).requires_grad_()
    k, v = (rng.randn(b, s, 2, 32).requires_grad_() for _ in range(2))
    out, lse = fused_attn_small_seq(q, k, v, max_seqlen_kv=max_kv, qkv_layout=BSHD,
                                    seqlens_kv=torch.tensor(lens, dtype=torch.int32),
                                    return_lse=True)
    assert [i for i in range(b) if torch.isnan(lse[:, i]).all()] == bad, (lens, str(rng))
    assert torch.isfinite(out[[i for i in range(b) if i not in bad]]).all(), (lens, str(rng))
    assert read_errors() == (len(bad), min(bad, default=-1)), (lens, str(rng))
    for x in torch.autograd.grad(out, (q, k, v), torch.ones_like(out)):
        assert torch.isfinite(x).all(), (lens, str(rng))


def test_int32_wrap_of_a_segment_length(allow_contract_errors):
    """cu_seqlens_kv = [0, 2^31-8, -(2^31-8), 9]: segment 1's int32 length wraps to 16. Every
    segment breaks the contract (0 past the end, 1 decreasing, 2 negative start)."""
    rng = Rng(0, "wrap")
    q = rng.randn(3, 2, 64, dtype=torch.bfloat16)
    k = rng.randn(9, 2, 64, dtype=torch.bfloat16)
    v = rng.randn(9, 2, 64, dtype=torch.bfloat16)
    cu_q = torch.arange(4, dtype=torch.int32)
    cu_kv = torch.tensor([0, 2147483640, -2147483640, 9], dtype=torch.int32)
    out = fused_attn_small_seq(q, k, v, cu_q, cu_kv, 1, 16)
    assert torch.isnan(out).all(), str(rng)
    with pytest.raises(SmallSeqContractError, match=r"3 segment\(s\).*first bad segment: 0\b"):
        check_errors()
    with pytest.raises(SmallSeqContractError, match=r"first bad segment: 0\b"):
        fused_attn_small_seq(q, k, v, cu_q, cu_kv, 1, 16, validate="sync")


def test_valid_segment_uses_the_query_row_it_names(allow_contract_errors):
    """cu_seqlens_q = [0, 2, 3, 4] (3 segments): segment 0 has two queries, segment 2's query
    row 3 is past q; segment 1 (query row 2) is valid and writes out[2], as on the kernels."""
    rng = Rng(0, "qrow")
    q, k, v = rng.randn(3, 2, 32), rng.randn(7, 2, 32), rng.randn(7, 2, 32)
    cu_q = torch.tensor([0, 2, 3, 4], dtype=torch.int32)
    cu_kv = torch.tensor([0, 2, 5, 7], dtype=torch.int32)
    out, lse = fused_attn_small_seq(q, k, v, cu_q, cu_kv, 1, 4, return_lse=True)
    ref, rlse, _ = reference_small_seq(q[2:3].double(), k[None, 2:5].double(),
                                       v[None, 2:5].double(), torch.tensor([3]))
    assert_rel("out[2]", out[2:3], ref, TOL_FP32, str(rng))
    assert_lse(lse[:, 1:2], rlse, TOL_FP32, str(rng))
    assert torch.isnan(out[:2]).all() and torch.isnan(lse[:, [0, 2]]).all()
    assert read_errors() == (2, 0)


# --------------------------------------------------------------------------------------------
# masked rows never reach a valid segment's gradient
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("poison", [float("nan"), float("inf")], ids=["nan", "inf"])
def test_thd_other_segments_keys_do_not_reach_gradients(poison):
    """A NaN/inf key or value in segment 1 leaves segment 0 (and its dq) untouched: the torch
    path gathers max_seqlen_kv rows per segment, some of them the next segment's."""
    rng = Rng(0, "leak_thd")
    case = thd_case(rng, 6, 4, 2, 32, 8, torch.float32, lens=torch.tensor([3, 4, 2, 5, 1, 6]))
    # the oracle on clean inputs: nothing of segments 0, 2..5 depends on segment 1's rows
    rout, _, _, (rdq, rdk, rdv) = run_ref(case)
    _, k, v = case.leaves
    k[3 + 1], v[3 + 2] = poison, poison  # rows of segment 1
    out, _, _, (dq, dk, dv) = run_op(case, backend="torch")
    ctx = str(case)
    assert_rel("out of segment 0", out[0], rout[0], TOL_FP32, ctx)
    assert_rel("dq of segment 0", dq[0], rdq[0], TOL_FP32, ctx)
    assert_rel("dq of segments 2..5", dq[2:], rdq[2:], TOL_FP32, ctx)
    assert_rel("dk of segment 0", dk[:3], rdk[:3], TOL_FP32, ctx)
    assert_rel("dv of segments 2..5", dv[7:], rdv[7:], TOL_FP32, ctx)


def test_bshd_padding_rows_are_never_read():
    """NaN in the BSHD rows at or past seqlens_kv changes nothing: out and every gradient are
    those of clean padding, and the padding rows' gradients are zero."""
    rng = Rng(0, "leak_bshd")
    lens = torch.tensor([3, 0, 5, 1])
    case = bshd_case(rng, 4, 4, 2, 32, 5, torch.float32, s_kv=6, lens=lens)
    clean = tuple(t.clone() for t in case.leaves)
    pad = torch.arange(6).unsqueeze(0) >= lens.unsqueeze(1)  # [b, s]
    for t in case.leaves[1:]:
        t[pad] = float("nan")
    out, _, _, grads = run_op(case, backend="torch")
    case.leaves = clean
    rout, _, _, rgrads = run_ref(case)
    assert_rel("out", out, rout, TOL_FP32, str(case))
    for name, x, r in zip(("dq", "dk", "dv"), grads, rgrads):
        assert_rel(name, x, r, TOL_FP32, str(case))
        if name != "dq":
            assert (x[pad] == 0).all(), name


def test_target_attention_padding_rows_do_not_reach_gradients():
    """Through TargetAttention: NaN history padding rows leave the output, the candidate's
    gradient and the query projection's gradients finite and equal to those of clean padding
    (the key/value projection itself multiplies the padding rows: its weight gradient sees
    them, as in any nn.Linear)."""
    torch.manual_seed(Rng(0, "leak_nn").seed)
    module = TargetAttention(32, num_heads=4, num_kv_heads=2, backend="torch")
    seqlens = torch.tensor([2, 5, 0, 3], dtype=torch.int32)
    candidate = torch.randn(4, 32, requires_grad=True)
    clean = torch.randn(4, 6, 32)
    pad = torch.arange(6).unsqueeze(0) >= seqlens.unsqueeze(1)
    results = []
    for history in (clean, clean.masked_fill(pad.unsqueeze(-1), float("nan"))):
        module.zero_grad()
        candidate.grad = None
        out = module(candidate, history, seqlens=seqlens)
        out.square().sum().backward()
        results.append((out.detach(), candidate.grad.clone(), module.q_proj.weight.grad.clone()))
    for name, x, r in zip(("out", "d candidate", "d q_proj.weight"), results[1], results[0]):
        assert torch.isfinite(x).all(), name
        torch.testing.assert_close(x, r, rtol=1e-5, atol=1e-6, msg=name)


# --------------------------------------------------------------------------------------------
# softmax_scale
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("scale", [float("nan"), float("inf"), -float("inf"), 1e39, -1e39,
                                   10**40, True],
                         ids=["nan", "inf", "-inf", "1e39", "-1e39", "int_1e40", "bool"])
def test_non_finite_softmax_scale_rejected(scale):
    rng = Rng(0, "scale_bad")
    case = thd_case(rng, 3, 2, 2, 64, 4, torch.float32)
    with pytest.raises(ValueError, match="softmax_scale"):
        fused_attn_small_seq(*case.qkv(), case.cu_q, case.cu_kv, 1, 4, softmax_scale=scale)


@pytest.mark.parametrize("scale", [0.0, -0.3, 3e38], ids=["zero", "negative", "f32_max"])
def test_any_float32_finite_softmax_scale_accepted(scale):
    """Zero (uniform weights) and negative scales are computed like any other; the largest
    float32 values are accepted too (their scores may overflow to inf, as in any float32
    softmax)."""
    rng = Rng(0, f"scale{scale}")
    case = thd_case(rng, 9, 2, 2, 64, 4, torch.float32, scale=scale)
    out, lse, _, g = run_op(case, backend="torch")
    if scale == 3e38:
        return
    rout, rlse, _, rg = run_ref(case)
    assert_rel("out", out, rout, TOL_FP32, str(case))
    for name, x, r in zip(("dq", "dk", "dv"), g, rg):
        assert_rel(name, x, r, TOL_FP32, str(case))


# --------------------------------------------------------------------------------------------
# validate="sync" reports its own call only
# --------------------------------------------------------------------------------------------


def test_validate_sync_reports_only_its_own_call(allow_contract_errors):
    rng = Rng(0, "own")
    bad = test_small_seq._thd_with_bad_segments(rng, [6, 2])
    good = thd_case(rng, 10, 4, 2, 64, 6, torch.float32)
    call(bad, *bad.qkv())  # not validated: counted
    call(good, *good.qkv(), validate="sync")  # valid: must not raise for the earlier call
    other = test_small_seq._thd_with_bad_segments(rng, [9])
    with pytest.raises(SmallSeqContractError, match=r"1 segment\(s\).*first bad segment: 9\b"):
        call(other, *other.qkv(), validate="sync")
    # the earlier, unvalidated call's errors are still reported, once
    with pytest.raises(SmallSeqContractError, match=r"2 segment\(s\).*first bad segment: 2\b"):
        check_errors()
    assert read_errors() == (0, -1)


def test_validate_sync_keeps_earlier_errors_for_read_errors(allow_contract_errors):
    rng = Rng(0, "own2")
    bad = test_small_seq._thd_with_bad_segments(rng, [4])
    good = thd_case(rng, 8, 2, 2, 64, 6, torch.float32)
    call(bad, *bad.qkv())
    call(good, *good.qkv(), validate=True)
    call(bad, *bad.qkv())
    assert read_errors(reset=False) == (2, 4)
    assert read_errors() == (2, 4)
    assert read_errors() == (0, -1)


# --------------------------------------------------------------------------------------------
# head dim 0
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("layout", [THD, BSHD])
def test_head_dim_zero_is_a_value_error(layout):
    if layout == THD:
        args = (torch.randn(2, 2, 0), torch.randn(3, 2, 0), torch.randn(3, 2, 0),
                torch.arange(3, dtype=torch.int32), torch.tensor([0, 1, 3], dtype=torch.int32))
        kw = {}
    else:
        args = (torch.randn(2, 1, 2, 0), torch.randn(2, 3, 2, 0), torch.randn(2, 3, 2, 0))
        kw = dict(qkv_layout=BSHD, seqlens_kv=torch.tensor([1, 3], dtype=torch.int32))
    for scale in (None, 0.5):
        with pytest.raises(ValueError, match="head dim"):
            fused_attn_small_seq(*args, max_seqlen_kv=4, softmax_scale=scale, **kw)


def test_counter_first_made_under_inference_mode_serves_later_calls():
    """A process whose first torch-path call runs under torch.inference_mode (a server's first
    request) keeps counting in calls outside it, and check_errors still reads the count."""
    code = """
import torch, rocm_attn
q, k = torch.randn(2, 1, 8), torch.randn(3, 1, 8)
cu_q, cu_kv = torch.tensor([0, 1, 2]), torch.tensor([0, 1, 3])
with torch.inference_mode():
    rocm_attn.fused_attn_small_seq(q, k, k, cu_q, cu_kv, max_seqlen_kv=2)
out = rocm_attn.fused_attn_small_seq(q, k, k, cu_q, cu_kv, max_seqlen_kv=1)  # user 1 has 2 keys
assert torch.isnan(out[1]).all() and torch.isfinite(out[0]).all()
try:
    rocm_attn.check_errors()
except rocm_attn.SmallSeqContractError:
    pass
else:
    raise AssertionError("the contract error was not counted")
"""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    subprocess.run([sys.executable, "-c", code], check=True, cwd=root)
