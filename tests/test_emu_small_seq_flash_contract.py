"""The flash route's contract kernels (hip_src/small_seq/flash_contract_kernel.h) executed on the
CPU emulation (tests/helpers/emu.py) at 64 and 32 lanes.

Flash's outputs are stood in for by sentinels (out 7, lse 3, gradients 5: "flash wrote this
row"); each case lists what the tiled contract says every row holds after the kernel, on the
rows that contract determines (rows two segments claim, possible only with bad offsets, are
unspecified and not checked). Flash offsets come from rocm_attn.small_seq_flash.flash_offsets,
as on the route.
"""

from __future__ import annotations

import math
from typing import Dict, List, NamedTuple, Tuple

import pytest
import torch

from helpers import emu
from rocm_attn.small_seq_flash import flash_offsets

pytestmark = pytest.mark.usefixtures("one_torch_thread")

OUT, LSE, GRAD = 7.0, 3.0, 5.0
NAN, ZERO, KEEP, EMPTY = "nan", "zero", "keep", "empty"  # EMPTY: out 0, lse -inf


class Case(NamedTuple):
    cu_q: List[int]
    cu_kv: List[int]
    total_q: int
    total_kv: int
    max_q: int
    max_kv: int
    q_rows: Dict[int, str]  # forward: out / lse of each listed row
    dq_rows: Dict[int, str]
    kv_rows: Dict[int, str]  # dk / dv
    bad: Tuple[int, int]  # (count, lowest bad segment) or (0, -1)


def _rows(spec):
    """{row: what} from [(first, end, what), ...]."""
    return {r: what for a, b, what in spec for r in range(a, b)}


CASES = {
    # valid offsets: leading / trailing padding, a segment without queries, one without keys
    "valid": Case([2, 5, 5, 12, 15], [1, 4, 9, 9, 12], 20, 14, 7, 5,
                  _rows([(0, 2, EMPTY), (2, 5, KEEP), (5, 12, EMPTY), (12, 15, KEEP),
                         (15, 20, EMPTY)]),
                  _rows([(0, 2, ZERO), (2, 5, KEEP), (5, 12, ZERO), (12, 15, KEEP),
                         (15, 20, ZERO)]),
                  _rows([(0, 1, ZERO), (1, 4, KEEP), (4, 9, ZERO), (9, 12, KEEP),
                         (12, 14, ZERO)]),
                  (0, -1)),
    # bad segments: decreasing q offsets, too many queries, q past the end; ordered keys of a
    # bad segment get zero gradient
    "bad": Case([0, 4, 2, 9, 30], [0, 3, 6, 5, 8], 12, 10, 6, 4,
                _rows([(0, 2, KEEP), (4, 8, NAN), (9, 12, NAN)]),
                _rows([(0, 2, KEEP), (4, 8, NAN), (9, 12, NAN)]),
                _rows([(0, 3, KEEP), (3, 5, ZERO), (5, 8, ZERO), (8, 10, ZERO)]),
                (3, 1)),
    # a valid segment that overlaps an earlier one (segment 1 is bad): flash saw it on other
    # rows, so it is NaN rather than a silently wrong value
    "overlap": Case([0, 8, 2, 10], [0, 4, 2, 6], 10, 6, 8, 4,
                    _rows([(0, 2, KEEP), (8, 10, NAN)]),
                    _rows([(0, 2, KEEP), (8, 10, NAN)]),
                    _rows([(0, 2, KEEP), (4, 6, NAN)]),
                    (1, 1)),
    # one segment, int64 offsets past int32 (a wrapped value must not look valid)
    "one_segment_huge": Case([0, 2**32 + 3], [0, 2], 5, 2, 4, 2,
                             _rows([(0, 4, NAN)]), _rows([(0, 4, NAN)]),
                             _rows([(0, 2, ZERO)]), (1, 0)),
}


@pytest.fixture(scope="module", params=["tiled_w64", "tiled_w32"], ids=["wave64", "wave32"])
def lib(request):
    return emu.emu_or_skip(request.param)


def _offsets(case):
    dtype = torch.int64 if max(case.cu_q) >= 2**31 else torch.int32
    cu_q = torch.tensor(case.cu_q, dtype=dtype)
    cu_kv = torch.tensor(case.cu_kv, dtype=torch.int64)
    return cu_q, cu_kv, flash_offsets(cu_q, case.total_q), flash_offsets(cu_kv, case.total_kv)


def _check_row(name, x, r, what, sentinel):
    row = x[r].float()
    if what == NAN:
        assert torch.isnan(row).all(), f"{name} row {r}: want NaN, got {row.flatten()[:4]}"
    elif what in (ZERO, EMPTY):
        assert (row == 0).all(), f"{name} row {r}: want 0, got {row.flatten()[:4]}"
    else:
        assert (row == sentinel).all(), f"{name} row {r}: want flash's value, got {row.flatten()[:4]}"


def _check_errors(lib, case):
    count, lowest = lib.errors()
    want_count, want_lowest = case.bad
    assert count == want_count, f"bad segments counted {count}, want {want_count}"
    if want_count:
        assert 0x7FFFFFFF - lowest == want_lowest


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("name", list(CASES))
def test_forward_contract(lib, name, dtype):
    case = CASES[name]
    h_q, h_kv, d = 4, 2, 64
    cu_q, cu_kv, fq, fk = _offsets(case)
    out = torch.full((case.total_q, h_q, d), OUT, dtype=dtype)
    lse = torch.full((h_q, case.total_q), LSE)
    k = torch.zeros(case.total_kv, h_kv, d, dtype=dtype)
    lib.errors(reset=True)
    emu.small_seq_flash_contract_fwd(lib, out, lse, k, cu_q, cu_kv, fq, fk, case.max_q,
                                     case.max_kv)
    _check_errors(lib, case)
    for r, what in case.q_rows.items():
        _check_row("out", out, r, what, OUT)
        col = lse[:, r]
        if what == NAN:
            assert torch.isnan(col).all(), f"lse row {r}: want NaN, got {col}"
        elif what == EMPTY:
            assert (col == -math.inf).all(), f"lse row {r}: want -inf, got {col}"
        else:
            assert (col == LSE).all(), f"lse row {r}: want flash's value, got {col}"


@pytest.mark.parametrize("name", list(CASES))
def test_backward_contract(lib, name):
    case = CASES[name]
    h_q, h_kv, d = 4, 1, 128
    cu_q, cu_kv, fq, fk = _offsets(case)
    # strided views, as flash's outputs are not (the kernel follows the strides)
    dq_base = torch.full((case.total_q, h_q, d + 8), GRAD, dtype=torch.bfloat16)
    dq = dq_base[..., :d]
    dk = torch.full((case.total_kv, h_kv, d), GRAD, dtype=torch.bfloat16)
    dv = torch.full((case.total_kv, h_kv, d), GRAD, dtype=torch.bfloat16)
    lib.errors(reset=True)
    emu.small_seq_flash_contract_bwd(lib, dq, dk, dv, cu_q, cu_kv, fq, fk, case.max_q,
                                     case.max_kv)
    assert lib.errors() == (0, 0), "the backward counts nothing (the forward did)"
    for r, what in case.dq_rows.items():
        _check_row("dq", dq, r, what, GRAD)
    for r, what in case.kv_rows.items():
        _check_row("dk", dk, r, what, GRAD)
        _check_row("dv", dv, r, what, GRAD)
    assert (dq_base[..., d:] == GRAD).all(), "a write outside dq's view"


def _garbage_offsets(gen: torch.Generator, entries: int, total: int, dtype) -> torch.Tensor:
    """Offsets as a caller may pass them: mostly a valid run, with negative, past-the-end,
    decreasing and (int64) past-int32 values sprinkled in."""
    cu = torch.sort(torch.randint(0, total + 1, (entries,), generator=gen)).values
    wild = torch.randint(0, 6, (entries,), generator=gen)
    noise = torch.randint(-3 * total - 5, 3 * total + 5, (entries,), generator=gen)
    cu = torch.where(wild == 0, noise, cu)
    if dtype == torch.int64:
        cu = torch.where(wild == 1, cu + 2**32, cu)
    return cu.to(dtype)


@pytest.mark.parametrize("dtypes", [(torch.int32, torch.int32), (torch.int64, torch.int32),
                                    (torch.int32, torch.int64)], ids=["i32", "i64q", "i64kv"])
@pytest.mark.parametrize("entries", [1, 2, 37, 257, 1000])
def test_flash_offsets_kernel(lib, entries, dtypes):
    """The route's one-launch offsets kernel equals flash_offsets (clamp into the tensor, running
    maximum) on both sides, for runs shorter and longer than its block, valid or not."""
    gen = torch.Generator().manual_seed(entries)
    total_q, total_kv = 3 * entries + 1, 5 * entries + 2
    for trial in range(3):
        if trial == 0:  # valid offsets: the kernel returns them unchanged
            cu_q = torch.sort(torch.randint(0, total_q + 1, (entries,), generator=gen)).values
            cu_kv = torch.sort(torch.randint(0, total_kv + 1, (entries,), generator=gen)).values
            cu_q, cu_kv = cu_q.to(dtypes[0]), cu_kv.to(dtypes[1])
        else:
            cu_q = _garbage_offsets(gen, entries, total_q, dtypes[0])
            cu_kv = _garbage_offsets(gen, entries, total_kv, dtypes[1])
        got = emu.small_seq_flash_offsets(lib, total_q, total_kv, cu_q, cu_kv)
        assert torch.equal(got[0], flash_offsets(cu_q, total_q)), (trial, cu_q.tolist()[:8])
        assert torch.equal(got[1], flash_offsets(cu_kv, total_kv)), (trial, cu_kv.tolist()[:8])
        if trial == 0:
            assert torch.equal(got[0].long(), cu_q.long())
            assert torch.equal(got[1].long(), cu_kv.long())
