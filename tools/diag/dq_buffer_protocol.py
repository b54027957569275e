"""Model check of the tile-copy dQ kernel's buffer protocol (no GPU needed).

small_seq_tiled_bwd_warpgroup_dq_tma_kernel (hip_src/small_seq/tiled_bwd_warpgroup_tma_kernel.h)
has two warpgroups take the row tiles of each work item round robin (tile t: warpgroup t % 2)
through three Q / dO buffers (tile t in buffer t % 3). Each buffer has a `full` mbarrier (count
1, completed by a tile's copies landing) and a `released` one (count 1, arrived by the warpgroup
done with the buffer's tile). Per tile t a warpgroup: if t >= 3 waits for tile t - 3's release,
waits for tile t's copies, computes, then arrives on `released` and copies tile t + 3 (if any).
At an item's start one thread copies tiles 0..2 into the empty buffers. Every thread derives
the barriers' parities from the tile index and the tiles each buffer took in earlier items.

This script explores every interleaving of the two warpgroups and of the copies landing (any
delay) over sequences of items with the given tile counts, and reports any wait that passes
before its tile's copies landed, a copy issued on a barrier phase still pending (a second
expect_tx), a deadlock, or a parity out of step at an item's end. `--no-release` drops the
released barrier, the kernel's first version: a parity wait cannot tell its phase from the one
two phases earlier, and the warpgroup waiting for tile t did not wait for tile t - 3's copies,
which may still be in flight (items of 4+ tiles fail).

Usage: python3 tools/diag/dq_buffer_protocol.py [--no-release] [--items 2] [--tiles 0,1,2,3,4,5,7]
"""
import argparse
import itertools
import sys

BUFS = 3
WARPGROUPS = 2


def explore(items, release=True):
    """Violations (a set of tuples) over all interleavings of one sequence of items."""
    violations = set()
    seen = set()

    def start_item(idx, base, full_done, full_free, rel_done, content):
        if idx == len(items):
            return
        tiles = items[idx]
        full_free = list(full_free)
        in_flight = []
        for t in range(min(tiles, BUFS)):  # one thread copies the first tiles
            b = t % BUFS
            if not full_free[b]:
                violations.add(("copy on a pending phase", idx, t))
            full_free[b] = False
            in_flight.append((b, t))
        walk(idx, base, (tuple(in_flight), (0,) * WARPGROUPS, full_done, tuple(full_free),
                         rel_done, content))

    def walk(idx, base, state):
        tiles = items[idx]
        key = (idx, base, state)
        if key in seen:
            return
        seen.add(key)
        in_flight, pcs, full_done, full_free, rel_done, content = state
        moves = []
        finished = True
        for w in range(WARPGROUPS):
            mine = list(range(w, tiles, WARPGROUPS))
            k, stage = divmod(pcs[w], 3)
            if k >= len(mine):
                continue
            finished = False
            t = mine[k]
            b = t % BUFS
            n = ((base >> b) & 1) ^ ((t // BUFS) & 1)  # parity of this tile's copy and release
            if stage == 0:  # wait for tile t - 3's release
                if not release or t < BUFS or rel_done[b] % 2 != n ^ 1:
                    moves.append(("step", w, t, b))
            elif stage == 1:  # wait for tile t's copies: passes iff (completed % 2) != parity
                if full_done[b] % 2 != n:
                    moves.append(("consume", w, t, b))
            else:  # release, then copy tile t + 3
                moves.append(("release", w, t, b))
        for i, (b, t) in enumerate(in_flight):
            moves.append(("land", i, t, b))
        if finished and not in_flight:
            nb = base
            for b in range(BUFS):
                if tiles > b:
                    nb ^= (((tiles - 1 - b) // BUFS + 1) & 1) << b
            for b in range(BUFS):
                if (nb >> b) & 1 != full_done[b] % 2 or (release and (nb >> b) & 1 != rel_done[b] % 2):
                    violations.add(("parity out of step at the item's end", idx, b))
            start_item(idx + 1, nb, full_done, full_free, rel_done, content)
            return
        if finished:
            violations.add(("copies in flight at the item's end", idx))
        if not moves:
            violations.add(("deadlock", idx, tiles, pcs))
            return
        for kind, w, t, b in moves:
            fl, pc, fd, ff, rd, ct = (list(in_flight), list(pcs), list(full_done),
                                      list(full_free), list(rel_done), list(content))
            if kind == "step":
                pc[w] += 1
            elif kind == "consume":
                if ct[b] != (idx, t) or (b, t) in fl:
                    violations.add(("wait passed before the tile landed", idx, tiles, t))
                pc[w] += 1
            elif kind == "release":
                rd[b] += 1
                if t + BUFS < tiles:
                    if not ff[b]:
                        violations.add(("copy on a pending phase", idx, tiles, t + BUFS))
                    ff[b] = False
                    fl.append((b, t + BUFS))
                pc[w] += 1
            else:  # a tile's copies land: the phase completes
                fl.pop(w)
                fd[b] += 1
                ff[b] = True
                ct[b] = (idx, t)
            walk(idx, base, (tuple(fl), tuple(pc), tuple(fd), tuple(ff), tuple(rd), tuple(ct)))

    start_item(0, 0, (0,) * BUFS, (True,) * BUFS, (0,) * BUFS, ((-1, -1),) * BUFS)
    return violations


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--no-release", action="store_true", help="the protocol without `released`")
    ap.add_argument("--items", type=int, default=2, help="items per sequence (all sequences)")
    ap.add_argument("--tiles", default="0,1,2,3,4,5,7", help="tile counts an item may have")
    args = ap.parse_args(argv)
    counts = [int(x) for x in args.tiles.split(",")]
    bad = 0
    total = 0
    for n in range(1, args.items + 1):
        for seq in itertools.product(counts, repeat=n):
            total += 1
            v = explore(list(seq), release=not args.no_release)
            if v:
                bad += 1
                print(seq, sorted(v)[:3])
    print(f"{bad} of {total} item sequences have violations")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
