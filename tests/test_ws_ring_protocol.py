"""tools/diag/ws_ring_protocol.py: the warp-specialized forward's barrier protocol (decode warp,
item ring, copy warp, two computing warpgroups), model checked over the orders of its actors and
of the copies landing (the kernel itself runs in tests/test_small_seq_tiled_gpu.py on a GPU)."""
from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools" / "diag"))

import ws_ring_protocol as proto  # noqa: E402

Item = proto.Item


def test_protocol_holds_in_every_order_of_small_sequences():
    """Every order of the actors and copies: no read of a region before it holds what the
    reader expects, no copy into a region still read, no surplus arrival, no deadlock."""
    for seq in ([Item(True, 2, 2, True)], [Item(True, 2, 3, True)],
                [Item(False, 0, 0, False), Item(True, 1, 2, True)],
                [Item(True, 1, 1, False), Item(True, 1, 1, True)],
                [Item(True, 0, 1, False), Item(True, 1, 2, False)]):
        assert not proto.explore(seq), seq


def test_streamed_histories_reuse_slots_in_every_order():
    """Histories past the ring (five, six and nine 64-key steps: slots refilled within the item,
    items of one tile per warpgroup) alone and beside an item of several tiles per warpgroup:
    every order holds."""
    for seq in ([Item(True, 6, 2, True)], [Item(True, 9, 1, True)],
                [Item(True, 5, 1, False), Item(True, 2, 3, True)],
                [Item(True, 2, 3, False), Item(True, 5, 2, True)]):
        assert not proto.explore(seq), seq


def test_a_streamed_item_has_one_tile_per_warpgroup():
    """A warpgroup's second tile would read steps the ring has since refilled: the model (like
    the launcher, tiled_ws_tiles_per_item) refuses such an item."""
    with pytest.raises(ValueError):
        Item(True, 5, 3, False)


def test_protocol_holds_in_random_orders_of_longer_sequences():
    """Random sequences of three and five items of every kind (no rows, no keys, one to four
    steps with and without a tail step, one to three tiles; five and nine steps streamed through
    the ring with one or two tiles), random orders each; the seed is
    fresh per run and printed on failure."""
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    kinds = proto.item_kinds()
    for i in range(60):
        seq = [rng.choice(kinds) for _ in range(3 if i % 2 else 5)]
        found = proto.simulate(seq, runs=25, seed=rng.randrange(1 << 30))
        assert not found, (seed, seq, sorted(found, key=repr)[:3])


def test_a_separate_tail_warp_copies_into_a_slot_still_read():
    """The dropped version: a warp that waits only on its tail slots' free barriers passes a
    phase two phases early after two uses of the slot by steps without a tail."""
    seq = [Item(True, 4, 1, False), Item(True, 4, 2, False), Item(True, 1, 1, True)]
    assert not proto.simulate(seq, runs=50, seed=0)
    found = proto.simulate(seq, tail_warp=True, runs=50, seed=0)
    assert ("copy into a region a reader holds", "tail", ("v", 0), (2, 0)) in found, found


def test_releasing_steps_that_have_not_landed_breaks_the_phases():
    """A warpgroup without a tile in an item must wait for each step before it releases it."""
    seq = [Item(True, 4, 1, False), Item(True, 2, 1, False), Item(True, 4, 2, True)]
    assert not proto.simulate(seq, runs=50, seed=0)
    assert proto.simulate(seq, unlanded=True, runs=50, seed=0)


def test_the_work_queue_holds_in_every_order():
    """The work queue's decode warp (kTiledWsQueueAhead = 2: item n taken once entry n - 2 has
    been taken by every warp), every order of small sequences and random orders of longer ones:
    no violation and no deadlock, also one item ahead."""
    for ahead in (1, 2):
        for seq in ([Item(True, 2, 3, True), Item(False, 0, 0, False), Item(True, 1, 1, False)],
                    [Item(True, 5, 2, True), Item(True, 1, 1, True)]):
            assert not proto.explore(seq, queue_ahead=ahead), (ahead, seq)
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    kinds = proto.item_kinds()
    for _ in range(20):
        seq = [rng.choice(kinds) for _ in range(6)]
        found = proto.simulate(seq, runs=20, seed=rng.randrange(1 << 30), queue_ahead=2)
        assert not found, (seed, seq, sorted(found, key=repr)[:3])


def test_a_queue_wait_more_than_a_ring_ahead_names_a_later_phase():
    """Waiting for the entry more than a ring (four items) before: the wait's parity is that
    of a phase two phases later, so the decode warp stalls for good. A whole ring before is the
    publish's own wait (the kernel's static_assert keeps kTiledWsQueueAhead below the ring, where
    the wait bounds how many items a block holds)."""
    seq = [Item(False, 0, 0, False)] * 8  # rows to write only: the readers keep up
    assert not proto.simulate(seq, runs=50, seed=0, queue_ahead=4)
    found = proto.simulate(seq, runs=50, seed=0, queue_ahead=5)
    assert any(v[0] == "deadlock" for v in found), found
