"""The tiled forward's segment order (hip_src/small_seq/tiled_order_kernel.h: the segments longest
history first, read by every forward kernel's item walk) on the CPU emulation at 64 lanes (the
gfx942 code paths) and 32 lanes.

- The order's buffer is a permutation of the segments with their key steps (64 keys, a bad
  segment's 0) never rising, whatever the offsets hold (garbage offsets included).
- Ordered and in segment order, every forward kernel the emulated device has (wave, block,
  resident; auto) writes bitwise the same out, lse and row maxima, on ragged batches whose
  histories span 0..1000 keys (empty segments, a bad segment and THD padding rows among them)
  and on BSHD: only the order of the items changes.
- A bad segment is reported once either way (the device error counter's count and lowest bad
  segment).
The GPU run of the same order ahead of the Hopper kernels: tests/test_small_seq_variants_gpu.py's
segment_order entries.
"""

from __future__ import annotations

import pytest
import torch
from helpers import emu
from helpers import small_seq_tiled_cases as C
from helpers import small_seq_variants as V

pytestmark = pytest.mark.usefixtures("one_torch_thread")

STEP_KEYS = 64  # tiled_order_kernel.h kTiledOrderStepKeys


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


def _contract_steps(case: C.TiledCase):
    """Per THD segment its key steps under the contract (0 for a bad segment)."""
    bad = set(C.contract_segments(case).bad)
    cu = case.cu_kv.tolist()
    return [0 if i in bad else -(-(cu[i + 1] - cu[i]) // STEP_KEYS) for i in range(case.batch)]


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
