"""tools/diag/ws_ring_protocol.py: the warp-specialized forward's barrier protocol (decode warp,
item ring, copy warp, two computing warpgroups, and the ping-pong instance's turns), model
checked over the orders of its actors and of the copies landing (the kernel itself runs in
tests/test_small_seq_tiled_gpu.py on a GPU)."""
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
    steps with and without a tail step, one to four tiles; five and nine steps streamed through
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


# The ping-pong instance (PINGPONG): the computing warpgroups take turns issuing products on two
# named barriers; only pairs of tiles (a warpgroup's i-th tile of an item beside the other's)
# take turns.


def test_turns_hold_in_every_order_of_small_sequences():
    """Every order, turns included: no deadlock, no warpgroup reaching one phase of a turn
    barrier twice, no arrival left pending at the end, never both warpgroups inside a turn, and
    the ring's own rules. Items where warpgroup 1 has no tile (one tile), an odd last tile, two
    pairs, no keys, an entry with no rows, the last item unpaired, and streamed histories."""
    for seq in ([Item(True, 2, 2, True)], [Item(True, 2, 3, True)], [Item(True, 1, 1, False)],
                [Item(False, 0, 0, False), Item(True, 1, 2, True)],
                [Item(True, 1, 1, False), Item(True, 1, 2, True)],
                [Item(True, 0, 2, False), Item(True, 1, 3, False)],
                [Item(True, 1, 3, False), Item(True, 1, 1, True)],
                [Item(True, 2, 4, True)], [Item(True, 6, 2, True)],
                [Item(True, 9, 1, True), Item(True, 5, 2, False)],
                [Item(True, 2, 3, False), Item(True, 5, 2, True)]):
        assert not proto.explore(seq, pingpong=True), seq


def test_turns_hold_in_random_orders_of_longer_sequences():
    """As above over random sequences of three and five items of every kind; the seed is fresh
    per run and printed on failure."""
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    kinds = proto.item_kinds()
    for i in range(60):
        seq = [rng.choice(kinds) for _ in range(3 if i % 2 else 5)]
        found = proto.simulate(seq, runs=25, seed=rng.randrange(1 << 30), pingpong=True)
        assert not found, (seed, seq, sorted(found, key=repr)[:3])


def test_turns_of_an_unpaired_tile_deadlock():
    """A tile without a partner taking turns pairs them with the other warpgroup's turns of the
    next item: warpgroup 1 waits for the next item's first step, the copy warp for the slot the
    unpaired tile holds, and warpgroup 0 for a turn that only warpgroup 1 can pass. Alone, the
    last such tile waits for a turn that never comes."""
    seq = [Item(True, 2, 3, False), Item(True, 2, 2, False)]
    assert not proto.explore(seq, pingpong=True)
    cycle = ("deadlock", (("copy", ("wait", ("free", 0))), ("wg0", ("nblock", ("turn", 0))),
                          ("wg1", ("wait", ("full", 0)))))
    assert proto.explore(seq, pingpong=True, order_unpaired=True) == {cycle}
    last = proto.explore([Item(True, 1, 1, False)], pingpong=True, order_unpaired=True)
    assert last and all(v[0] == "deadlock" for v in last), last


def test_turns_without_the_last_wait_leave_an_arrival_pending():
    """Warpgroup 1's last turn passes the turn to warpgroup 0, which must take it once more
    after its last item: without that wait the barrier ends with an arrival pending."""
    seq = [Item(True, 1, 2, False)]
    assert proto.explore(seq, pingpong=True, drain=False) == {
        ("arrivals left pending on a named barrier", ("turn", 0))}


def test_an_unpaired_tile_passing_turns_reaches_a_phase_twice():
    """A tile without a partner that passes each turn on without waiting for it arrives on the
    other warpgroup's barrier twice before that warpgroup waits once: on a GPU the second
    arrival would complete a phase meant for the other's next turn."""
    seq = [Item(True, 1, 3, False), Item(True, 1, 2, False)]
    assert not proto.explore(seq, pingpong=True)
    found = proto.explore(seq, pingpong=True, pass_unpaired=True)
    assert ("a warpgroup reaches one phase of a named barrier twice", "wg0", ("turn", 1)) \
        in found, found
