"""The segment order (hip_src/small_seq/tiled_order_kernel.h: the segments most keys or most rows
first, read by the tiled forward's item walks and the backward's block passes) on the CPU
emulation at 64 lanes (the gfx942 code paths) and 32 lanes.

- The order's buffer is a permutation of the segments with their steps (64 keys or 64 rows, a
  bad segment's 0) never rising, whatever the offsets hold (garbage offsets included).
- Ordered and in segment order, every forward kernel the emulated device has (wave, block,
  resident; auto) writes bitwise the same out, lse and row maxima, on ragged batches whose
  histories span 0..1000 keys (empty segments, a bad segment and THD padding rows among them)
  and on BSHD: only the order of the items changes. The backward's block passes (dK / dV by
  rows, dQ by keys) write bitwise the same dq, dk, dv, and a plan whose order launch comes
  after a pass leaves that pass in index order (the launcher never lets a kernel read an
  unwritten order).
- A bad segment is reported once either way (the device error counter's count and lowest bad
  segment).
The GPU run of the same order ahead of the Hopper kernels: tests/test_small_seq_variants_gpu.py's
segment_order entries and tests/test_small_seq_segment_order_gpu.py.
"""

from __future__ import annotations

import pytest
import torch
from helpers import emu
from helpers import small_seq_tiled_bwd_cases as G
from helpers import small_seq_tiled_cases as C
from helpers import small_seq_variants as V

from rocm_attn import small_seq_plan as sp

pytestmark = pytest.mark.usefixtures("one_torch_thread")

STEP = 64  # tiled_order_kernel.h kTiledOrderStep: keys or rows per bucket


@pytest.fixture(scope="module", params=[64, 32], ids=["wave64", "wave32"])
def lib(request):
    return emu.emu_or_skip(f"tiled_w{request.param}")


def _ragged(seed: int, bad: bool = False) -> C.TiledCase:
    """A THD batch of 10 users with ragged candidate counts and histories 0..1000 keys (a long
    one last, so that the order moves it), padding rows before and after; ``bad``: the offset
    between segments 3 and 4 moved past total_kv (both break the contract)."""
    gen = torch.Generator().manual_seed(seed)
    q_lens = torch.randint(0, 9, (10,), generator=gen).tolist()
    kv_lens = torch.randint(0, 400, (10,), generator=gen).tolist()
    q_lens[-1], kv_lens[-1], kv_lens[2] = 5, 1000, 0
    case = C.thd_case(seed, q_lens, kv_lens, 4, 2, 64, torch.bfloat16, pad_before=2,
                      pad_after=3, max_q=8 if max(q_lens) <= 8 else max(q_lens), max_kv=1000)
    if bad:
        case.cu_kv[4] = case.k.shape[0] + 7
    return case


def _contract_steps(case: C.TiledCase, by_rows: bool = False):
    """Per THD segment its steps of keys or of rows (queries x GQA group) under the contract (0
    for a bad segment)."""
    bad = set(C.contract_segments(case).bad)
    cu = (case.cu_q if by_rows else case.cu_kv).tolist()
    per = case.q.shape[-2] // case.k.shape[-2] if by_rows else 1
    return [0 if i in bad else -(-(cu[i + 1] - cu[i]) * per // STEP)
            for i in range(case.batch)]


def _errors_of(case: C.TiledCase):
    """The device error counter a call leaves: (bad segments, INT32_MAX - the lowest)."""
    bad = C.contract_segments(case).bad
    return (len(bad), 2**31 - 1 - min(bad)) if bad else (0, 0)


def _run(lib, case, order_mode, forcing, order_out=None, row_max=True):
    with emu.tuning(small_seq_tiled_segment_order=order_mode, **forcing):
        lib.errors(reset=True)
        out = emu.small_seq_tiled_fwd(lib, *case.args(), return_softmax=False, row_max=row_max,
                                      order=order_out)
        return out, lib.errors()


def _assert_bitwise(a: torch.Tensor, b: torch.Tensor, what: str) -> None:
    same = torch.equal(a.view(torch.int16 if a.element_size() == 2 else torch.int32),
                       b.view(torch.int16 if b.element_size() == 2 else torch.int32))
    assert same, f"{what}: ordered and segment-order results differ"


@pytest.mark.parametrize("forcing", ["auto", "wave", "block", "resident"])
@pytest.mark.parametrize("bad", [False, True], ids=["valid", "bad_segment"])
def test_order_changes_nothing_an_item_writes(lib, forcing, bad):
    case = _ragged(11 if bad else 7, bad)
    orders = []
    (ordered, errs_ordered) = _run(lib, case, 2, V.FWD_FORCINGS[forcing], orders)
    (plain, errs_plain) = _run(lib, case, 0, V.FWD_FORCINGS[forcing])
    [order] = orders
    assert order.numel() == case.batch, "the plan with the order allocated no buffer"
    for got, want, name in zip(ordered, plain, ("out", "lse", "probs", "row_max")):
        if name != "probs":
            _assert_bitwise(got, want, f"{forcing} {name}")
    assert errs_ordered == errs_plain == _errors_of(case)
    assert (errs_plain[0] > 0) == bad
    if not bad:
        C.check(case, ordered[0], ordered[1], None, f"{forcing} ordered", expect_bad=[])


def test_order_is_longest_history_first(lib):
    case = _ragged(5, bad=True)
    orders = []
    _run(lib, case, 2, {}, orders, row_max=False)
    order = orders[0].tolist()
    assert sorted(order) == list(range(case.batch)), order
    steps = _contract_steps(case)
    ranked = [steps[s] for s in order]
    assert ranked == sorted(ranked, reverse=True), (order, steps)


def test_order_of_garbage_offsets_is_a_permutation(lib):
    """Offsets that hold anything (negative, past the tensors, falling): the order still names
    every segment once (each bucket in range), and the error counter reports them as in segment
    order."""
    gen = torch.Generator().manual_seed(3)
    case = _ragged(3)
    b = case.batch
    case.cu_q.copy_(torch.randint(-50, 200, (b + 1,), generator=gen, dtype=torch.int32))
    case.cu_kv.copy_(torch.randint(-3000, 6000, (b + 1,), generator=gen, dtype=torch.int32))
    orders = []
    _, errs_ordered = _run(lib, case, 2, {}, orders, row_max=False)
    _, errs_plain = _run(lib, case, 0, {}, row_max=False)
    assert sorted(orders[0].tolist()) == list(range(b)), orders[0]
    assert errs_ordered == errs_plain and errs_plain[0] > 0


def test_bshd_order(lib):
    case = C.bshd_case(9, 6, [0, 700, 3, 1000, 65, 64], 1000, 4, 1, 64, torch.float16)
    orders = []
    ordered, _ = _run(lib, case, 2, {}, orders)
    plain, _ = _run(lib, case, 0, {})
    assert orders[0].tolist()[:2] == [3, 1] and orders[0].tolist()[-1] == 0, orders[0]
    for got, want, name in zip(ordered, plain, ("out", "lse", "probs", "row_max")):
        if name != "probs":
            _assert_bitwise(got, want, f"bshd {name}")


# -- backward: the block passes, dK / dV ordered by rows and dQ by keys -------------------------

def _ragged_bwd(seed: int, bad: bool = False) -> C.TiledCase:
    """10 users of 0..40 candidates (GQA group 2: up to 80 rows per kv head, past one 16-row
    tile, so the block passes run) over 0..1000 keys, padding rows around; ``bad`` as _ragged."""
    gen = torch.Generator().manual_seed(seed)
    q_lens = torch.randint(0, 41, (10,), generator=gen).tolist()
    kv_lens = torch.randint(0, 400, (10,), generator=gen).tolist()
    q_lens[-1], q_lens[0], kv_lens[-1], kv_lens[2] = 40, 3, 1000, 0
    case = C.thd_case(seed, q_lens, kv_lens, 4, 2, 64, torch.bfloat16, pad_before=2,
                      pad_after=3, max_q=40, max_kv=1000)
    if bad:
        case.cu_kv[4] = case.k.shape[0] + 7
    return case


def _bwd(lib, case, order_mode, plan=None, order_out=None):
    dout, out, lse, dlse = G.inputs(case, 1, True)
    with emu.tuning(small_seq_tiled_segment_order=order_mode, **G.BWD_PASSES["passes"]):
        lib.errors(reset=True)
        grads = emu.small_seq_tiled_bwd(lib, dout, case.q, case.k, case.v, out, lse, dlse,
                                        case.cu_q, case.cu_kv, case.seqlens, case.max_q,
                                        case.max_kv, case.scale, order=order_out, plan=plan)
        return grads, (dout, dlse)


def _bwd_plan(lib, case, order_mode):
    with emu.tuning(small_seq_tiled_segment_order=order_mode, **G.BWD_PASSES["passes"]):
        return emu.tiled_bwd_plan(lib, case.q, case.k, case.max_q, case.max_kv)


def _plan_of(records: list) -> list:
    return [len(records), 0] + [v for r in records for v in r]


ORDER = sp.KERNEL_IDS["tiled_segment_order"]
BY_ROWS = 1  # an order record's BY_ROWS when it orders by rows


@pytest.mark.parametrize("bad", [False, True], ids=["valid", "bad_segment"])
def test_backward_order_changes_no_gradient(lib, bad):
    case = _ragged_bwd(13 if bad else 17, bad)
    plan = _bwd_plan(lib, case, 2)
    want = [sp.KERNEL_IDS[k] for k in ("tiled_bwd_delta", "tiled_segment_order",
                                       "tiled_bwd_dkv_block", "tiled_segment_order",
                                       "tiled_bwd_dq_block")]
    assert [r[0] for r in emu.plan_records(plan)] == want, plan
    orders = []
    ordered, (dout, dlse) = _bwd(lib, case, 2, order_out=orders)
    plain, _ = _bwd(lib, case, 0)
    G.assert_same_bits(ordered, plain, case)
    steps = _contract_steps(case)  # the last order launch's: by keys
    ranked = [steps[s] for s in orders[0].tolist()]
    assert sorted(orders[0].tolist()) == list(range(case.batch))
    assert ranked == sorted(ranked, reverse=True), (orders[0], steps)
    if not bad:
        G.check_grads(case, dout, dlse, *ordered, f"wave {lib.wave} ordered")


def test_backward_order_by_rows(lib):
    """The plan without its order by keys: the buffer ranks the segments by row steps (queries
    x GQA group), and the gradients are those of segment order."""
    case = _ragged_bwd(19)
    records = [r for r in emu.plan_records(_bwd_plan(lib, case, 2))
               if r[0] != ORDER or r[1] == BY_ROWS]
    orders = []
    ordered, _ = _bwd(lib, case, 0, plan=_plan_of(records), order_out=orders)
    plain, _ = _bwd(lib, case, 0)
    G.assert_same_bits(ordered, plain, case)
    steps = _contract_steps(case, by_rows=True)
    ranked = [steps[s] for s in orders[0].tolist()]
    assert sorted(orders[0].tolist()) == list(range(case.batch))
    assert ranked == sorted(ranked, reverse=True), (orders[0], steps)
    assert len(set(steps)) >= 3, "rows that hardly differ test no order"


def test_backward_pass_before_any_order_reads_none(lib):
    """An order launch after the dK / dV pass (its buffer still the -1 poison when that pass
    runs): the pass walks index order, and the gradients are those of segment order."""
    case = _ragged_bwd(23)
    records = [r for r in emu.plan_records(_bwd_plan(lib, case, 2)) if r[0] != ORDER or r[1] != BY_ROWS]
    assert [r[0] for r in records].index(ORDER) > 1
    ordered, _ = _bwd(lib, case, 0, plan=_plan_of(records))
    plain, _ = _bwd(lib, case, 0)
    G.assert_same_bits(ordered, plain, case)
