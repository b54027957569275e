"""Model check of the warp-specialized forward's barrier protocol (no GPU needed).

small_seq_tiled_fwd_warpgroup_ws_kernel (hip_src/small_seq/tiled_fwd_warpgroup_ws_kernel.h) runs
four actors per block: a decode warp that writes each work item into a ring of four entries, a
copy warp that takes every entry and copies the item's Q tiles and K / V steps (step st into
slot st % 4, once every computing warp has released the slot's previous step: items of more
than four steps reuse slots, and have at most one row tile per warpgroup; the V of a tail step, where the history ends inside it, by cp.async whose lanes arrive
when their copies land), and two computing warpgroups that take every entry, compute their row
tiles (tile0 + wg, + 2, ...) and release the slots and Q buffers. mbarriers pair them: full /
free per slot, q_full / q_free per warpgroup and Q buffer, item_full / item_free per ring entry.
Every actor derives the parity of each of its waits from the phases it waited for before; a
parity wait passes while the phase in progress has the other parity, so it cannot tell a phase
from the one two phases later.

This script builds each actor's barrier operations for a sequence of items, as the kernel's
loops run them, and runs the actors and the copies landing in every order (`explore`, small
sequences) or in many random orders (`simulate`), reporting: a read of a slot, Q buffer or
entry that does not hold what the reader expects (its wait passed at the wrong phase), a copy
into a region a reader still holds, more arrivals on a barrier phase than its count (the GPU
faults), and a deadlock.

`--unlanded` lets a warpgroup without a tile in an item release the item's slots without
waiting for them to land: it can then arrive for the next item's phase while the current one
is still open.

`--queue-ahead A` models the work queue's decode warp: before it takes item n from the queue
it waits for entry n - A to be taken by every warp (kTiledWsQueueAhead = 2); with A of the
ring's four entries or more that wait could name a phase two phases early.

`--tail-warp` models a version that was tried and dropped: a third warp copies the tail steps'
V and waits only on the free barriers of those slots. Its waits skip the phases of the other
steps, so after two uses of a slot it can pass at a phase two phases early and copy into a slot
that is still being read.

The reads' windows are the programs' own: a region is read from the wait that admits it to the
arrival that lets it go, so this checks the barriers against those windows, not the windows
against the products that read the regions.

Usage: python3 tools/diag/ws_ring_protocol.py [--tail-warp | --unlanded] [--queue-ahead A]
       [--items 3]
       [--sequences 300] [--runs 200]
"""
from __future__ import annotations

import argparse
import itertools
import random
import sys

SLOTS = 4        # K / V slots: step st of an item in slot st % SLOTS
ENTRIES = 4      # item ring entries
WARPGROUPS = 2   # computing warpgroups
WARPS = 4        # warps per computing warpgroup (one arrival each on free / item_free)


class Item:
    """A published entry: whether it has rows to compute, its K / V steps (any number; past
    SLOTS the launcher's items hold at most one row tile per warpgroup), its row tiles, whether
    its last step is a tail step."""

    def __init__(self, rows, steps, tiles, tail):
        if steps > SLOTS and tiles > WARPGROUPS:
            raise ValueError("an item streamed through the ring has one tile per warpgroup")
        self.rows, self.steps, self.tiles, self.tail = rows, steps, tiles, tail and steps > 0

    def __repr__(self):
        return f"Item({self.rows}, {self.steps}, {self.tiles}, {self.tail})"


def barrier_counts(tail_warp):
    """Barrier name -> arrivals per phase."""
    counts = {}
    for s in range(SLOTS):
        counts[("full", s)] = 1 + 32
        counts[("free", s)] = WARPGROUPS * WARPS
    for w in range(WARPGROUPS):
        for b in range(2):
            counts[("q_full", w, b)] = 1
            counts[("q_free", w, b)] = 1
    for e in range(ENTRIES):
        counts[("item_full", e)] = 1
        counts[("item_free", e)] = WARPGROUPS * WARPS + 1 + (1 if tail_warp else 0)
    return counts


def programs(items, tail_warp=False, unlanded=False, queue_ahead=0):
    """Each actor's operations, as tuples:
    ("wait", bar, parity, reads)  passes while the barrier's phase in progress has the other
                                  parity (bar None: no wait); then checks that each region in
                                  reads holds its tag, and holds it
    ("arrive", bar, n, unholds)   lets go of the regions in unholds, then n arrivals
    ("tma", bar, regions, tag)    one arrival announcing the copy's bytes; the copy lands later
                                  (writes tag into the regions, completes the bytes)
    ("cp", bar, region, tag)      32 lanes' cp.async; each lane arrives when its copy lands
    ("publish", entry, tag)       the decode warp writes an entry
    """
    seq = list(items) + [None]
    decode = []
    for n in range(len(seq)):
        e = n % ENTRIES
        if queue_ahead and n >= queue_ahead:  # the queue's next item (the end's too)
            m = n - queue_ahead
            decode.append(("wait", ("item_free", m % ENTRIES), (m // ENTRIES) & 1, ()))
        decode += [("wait", ("item_free", e), ((n // ENTRIES) & 1) ^ 1, ()),
                   ("publish", e, n), ("arrive", ("item_full", e), 1, ())]

    def take(ops, n, arrivals):
        e = n % ENTRIES
        ops.append(("wait", ("item_full", e), (n // ENTRIES) & 1, ((("entry", e), n),)))
        ops.append(("arrive", ("item_free", e), arrivals, (("entry", e),)))

    copy = []
    free_par = q_free_par = q_next = 0

    def copy_q(n, t):  # Q of tile t into the next buffer of the warpgroup that computes it
        nonlocal q_free_par, q_next
        w = t % WARPGROUPS
        b = (q_next >> w) & 1
        bit = 2 * w + b
        copy.append(("wait", ("q_free", w, b), ((q_free_par >> bit) & 1) ^ 1, ()))
        copy.append(("tma", ("q_full", w, b), (("q", w, b),), (n, t)))
        q_free_par ^= 1 << bit
        q_next ^= 1 << w

    def copy_step(n, it, st):  # step st's K and V into slot st % SLOTS
        nonlocal free_par
        slot = st % SLOTS
        copy.append(("wait", ("free", slot), ((free_par >> slot) & 1) ^ 1, ()))
        free_par ^= 1 << slot
        if it.tail and st == it.steps - 1:
            copy.append(("tma", ("full", slot), (("k", slot),), (n, st)))
            if not tail_warp:
                copy.append(("cp", ("full", slot), ("v", slot), (n, st)))
        else:
            copy.append(("tma", ("full", slot), (("k", slot), ("v", slot)), (n, st)))
            copy.append(("arrive", ("full", slot), 32, ()))

    for n, it in enumerate(seq):
        take(copy, n, 1)
        if it is None or not it.rows:
            continue
        for t in range(min(it.tiles, WARPGROUPS)):
            copy_q(n, t)
        for st in range(it.steps):
            copy_step(n, it, st)
        for t in range(WARPGROUPS, it.tiles):
            copy_q(n, t)
    actors = {"decode": decode, "copy": copy}

    if tail_warp:
        tail = []
        free_par = 0
        for n, it in enumerate(seq):
            take(tail, n, 1)
            if it is None or not it.rows:
                continue
            for st in range(it.steps):
                slot = st % SLOTS
                if it.tail and st == it.steps - 1:
                    tail.append(("wait", ("free", slot), ((free_par >> slot) & 1) ^ 1, ()))
                    tail.append(("cp", ("full", slot), ("v", slot), (n, st)))
                free_par ^= 1 << slot
        actors["tail"] = tail

    for w in range(WARPGROUPS):
        ops = []
        full_par = q_par = tiles_done = 0
        for n, it in enumerate(seq):
            take(ops, n, WARPS)
            if it is None or not it.rows:
                continue
            first = True
            for tile in range(w, it.tiles, WARPGROUPS):
                last = tile + WARPGROUPS >= it.tiles
                b = tiles_done & 1
                if tiles_done > 0:  # the previous tile's Q buffer goes back
                    ops.append(("arrive", ("q_free", w, b ^ 1), 1, (("q", w, b ^ 1),)))
                ops.append(("wait", ("q_full", w, b), (q_par >> b) & 1,
                            ((("q", w, b), (n, tile)),)))
                q_par ^= 1 << b
                for st in range(it.steps):
                    slot = st % SLOTS
                    reads = ((("k", slot), (n, st)), (("v", slot), (n, st)))
                    # a tile after the first reads what the first one waited for; each wait
                    # flips its slot's parity
                    ops.append(("wait", ("full", slot) if first else None,
                                (full_par >> slot) & 1, reads))
                    if first:
                        full_par ^= 1 << slot
                    # the last tile releases step st - 1 once step st's scores and step
                    # st - 1's P . V are waited for, and its last step after its last P . V
                    if last and st >= 1:
                        prev = (st - 1) % SLOTS
                        ops.append(("arrive", ("free", prev), WARPS, (("k", prev), ("v", prev))))
                if last and it.steps > 0:
                    prev = (it.steps - 1) % SLOTS
                    ops.append(("arrive", ("free", prev), WARPS, (("k", prev), ("v", prev))))
                first = False
                tiles_done += 1
            # with no tile here, every step, each once it has landed (a last tile released its
            # steps)
            if first:
                for st in range(it.steps):
                    slot = st % SLOTS
                    if not unlanded:
                        ops.append(("wait", ("full", slot), (full_par >> slot) & 1, ()))
                    full_par ^= 1 << slot
                    ops.append(("arrive", ("free", slot), WARPS, (("k", slot), ("v", slot))))
        actors[f"wg{w}"] = ops
    return actors


class Model:
    """The actors' programs and barrier counts of one item sequence, and the rules of a step."""

    def __init__(self, items, tail_warp=False, unlanded=False, queue_ahead=0):
        self.actors = programs(items, tail_warp, unlanded, queue_ahead)
        self.names = sorted(self.actors)
        self.counts = barrier_counts(tail_warp)
        self.bar_index = {b: i for i, b in enumerate(sorted(self.counts, key=repr))}

    def start(self):
        """pcs, barriers (phases, arrivals, copies pending), contents, holds, copies in flight"""
        return (tuple(0 for _ in self.names), tuple((0, 0, 0) for _ in self.bar_index), (),
                frozenset(), ())

    def moves(self, state, violations):
        """The enabled moves: ("op", actor index) or ("land", copy index); None when the run is
        over: every actor done and every copy landed, or nothing can move (a deadlock, added to
        violations)."""
        pcs, bst, _, _, pending = state
        moves = []
        done = True
        for ai, name in enumerate(self.names):
            ops = self.actors[name]
            if pcs[ai] >= len(ops):
                continue
            done = False
            op = ops[pcs[ai]]
            if op[0] == "wait" and op[1] is not None and \
                    (bst[self.bar_index[op[1]]][0] & 1) == op[2]:
                continue  # the phase in progress has the awaited parity
            moves.append(("op", ai))
        moves += [("land", i) for i in range(len(pending))]
        if done and not pending:
            return None
        if not moves:
            violations.add(("deadlock", pcs))
            return None
        return moves

    def _arrive(self, bs, bar, n, violations):
        i = self.bar_index[bar]
        k, a, tx = bs[i]
        a += n
        if a > self.counts[bar]:
            violations.add(("surplus arrivals", bar))
            a = self.counts[bar]
        if a == self.counts[bar] and tx == 0:
            k, a = k + 1, 0
        bs[i] = (k, a, tx)

    def apply(self, state, move, violations):
        pcs, bst, content, holds, pending = state
        pc, bs, ct, hd, pe = list(pcs), list(bst), dict(content), set(holds), list(pending)
        kind, x = move
        if kind == "land":
            ev = pe.pop(x)
            if ev[0] == "tma":
                for r in ev[2]:
                    ct[r] = ev[3]
                i = self.bar_index[ev[1]]
                k, a, tx = bs[i]
                bs[i] = (k, a, tx - 1)
                self._arrive(bs, ev[1], 0, violations)
            else:
                ct[ev[2]] = ev[3]
                self._arrive(bs, ev[1], 32, violations)
        else:
            name = self.names[x]
            op = self.actors[name][pc[x]]
            pc[x] += 1
            if op[0] == "wait":
                for region, tag in op[3]:
                    if ct.get(region) != tag:
                        violations.add(("read of a region that does not hold its tag", name,
                                        region, tag, ct.get(region)))
                    if region[0] != "entry":
                        hd.add((region, name))
            elif op[0] == "arrive":
                for region in op[3]:
                    hd.discard((region, name))
                self._arrive(bs, op[1], op[2], violations)
            elif op[0] in ("tma", "cp"):
                regions = op[2] if op[0] == "tma" else (op[2],)
                for r in regions:
                    if any(h[0] == r for h in hd):
                        violations.add(("copy into a region a reader holds", name, r, op[3]))
                    ct[r] = None  # being written
                if op[0] == "tma":
                    i = self.bar_index[op[1]]
                    k, a, tx = bs[i]
                    bs[i] = (k, a, tx + 1)
                    self._arrive(bs, op[1], 1, violations)
                pe.append(op)
            else:  # publish
                ct[("entry", op[1])] = op[2]
        return (tuple(pc), tuple(bs), tuple(sorted(ct.items(), key=repr)), frozenset(hd),
                tuple(sorted(pe, key=repr)))


def explore(items, tail_warp=False, unlanded=False, limit=300_000, queue_ahead=0):
    """Violations over every order of one item sequence (small sequences: the orders grow fast)."""
    m = Model(items, tail_warp, unlanded, queue_ahead)
    violations = set()
    seen = set()
    stack = [m.start()]
    while stack:
        state = stack.pop()
        if state in seen:
            continue
        seen.add(state)
        if len(seen) > limit:
            violations.add(("state limit reached",))
            break
        moves = m.moves(state, violations)
        if moves is not None:
            stack += [m.apply(state, mv, violations) for mv in moves]
    return violations


def simulate(items, tail_warp=False, unlanded=False, runs=200, seed=0, queue_ahead=0):
    """Violations over `runs` random orders of one item sequence."""
    m = Model(items, tail_warp, unlanded, queue_ahead)
    rng = random.Random(seed)
    violations = set()
    for _ in range(runs):
        state = m.start()
        moves = m.moves(state, violations)
        while moves is not None:
            state = m.apply(state, rng.choice(moves), violations)
            moves = m.moves(state, violations)
    return violations


def item_kinds():
    """Items covering the protocol's cases: rows to write only, no keys, one to four steps with
    and without a tail step, zero to three row tiles; histories streamed through the ring (five
    and nine steps, slots reused within the item) with one and two row tiles."""
    kinds = [Item(False, 0, 0, False), Item(True, 0, 1, False)]
    for steps in (1, 2, 4):
        for tiles in (1, 2, 3):
            kinds += [Item(True, steps, tiles, False), Item(True, steps, tiles, True)]
    for steps in (5, 9):
        for tiles in (1, 2):
            kinds += [Item(True, steps, tiles, False), Item(True, steps, tiles, True)]
    return kinds


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tail-warp", action="store_true", help="the dropped separate tail warp")
    ap.add_argument("--unlanded", action="store_true",
                    help="a warpgroup without a tile releases steps that have not landed")
    ap.add_argument("--queue-ahead", type=int, default=0,
                    help="the work queue's decode warp, this many items ahead")
    ap.add_argument("--items", type=int, default=3, help="items per random sequence")
    ap.add_argument("--sequences", type=int, default=300, help="random item sequences")
    ap.add_argument("--runs", type=int, default=200, help="random orders per sequence")
    args = ap.parse_args(argv)
    kinds = item_kinds()
    rng = random.Random(1)
    bad = 0
    for i in range(args.sequences):
        seq = [rng.choice(kinds) for _ in range(args.items)]
        v = simulate(seq, args.tail_warp, args.unlanded, runs=args.runs, seed=i,
                     queue_ahead=args.queue_ahead)
        if v:
            bad += 1
            print(seq, sorted(v, key=repr)[:3])
    print(f"{bad} of {args.sequences} item sequences have violations")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
