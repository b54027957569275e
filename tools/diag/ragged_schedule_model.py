"""How evenly the tiled kernels' work items spread over the grid, per ragged-request row.

Usage: python3 tools/diag/ragged_schedule_model.py [--mps N] [--blocks-per-mp N]
           [--rows-per-item N] [--grid-factor N] [--backward] [--cases ROW,ROW...]

No GPU: it replays each ragged-request row's items (its users drawn as the benchmark draws them,
seed 0) onto a grid as the tiled forward kernels walk them, and prints when the busiest block
ends, over the mean block's work (1.00: perfectly even; the row's time grows with it):

- ``segment order``: the kernels' grid-stride walk in segment order. The grid is grid-factor x
  the resident blocks; block b takes items b, b + grid, b + 2 grid, ... and the blocks start in
  index order as resident slots free up.
- ``longest first``: the same walk over the segments sorted longest history first (the plan's
  segment order, hip_src/small_seq/tiled_order_kernel.h).
- ``longest first, queue``: that order taken item by item from a shared queue by whichever
  block is free (a work counter instead of the fixed grid-stride share).

An item is (segment, kv head, rows-per-item rows of candidates x q heads) and costs one 64-key
step per 64 keys of its history plus one step for its Q, first scores and epilogue. The model
ignores what blocks on one multiprocessor do to each other; it measures only the spread. The
defaults are an H200's 132 multiprocessors with one block each and items of 128 rows (the
warp-specialized kernel's pairs of 64-row tiles); MI300X has 304 compute units.

``--backward``: the backward's block passes instead (tiled_bwd_block_kernel.h at d 128 on 64
lanes). A dK / dV item is (segment, kv head, 32 keys) and walks the segment's rows, one step
per 16-row tile plus one; a dQ item is (segment, kv head, 16 rows) and walks the keys, one step
per 16-key tile plus one. Their orders: most rows first and most keys first.
"""
import argparse
import heapq
import math
import sys
from pathlib import Path
from typing import List, Sequence

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # this source tree's package
from rocm_attn.bench import ragged_rows  # noqa: E402

STEP_KEYS = 64


def item_costs(cands: Sequence[int], keys: Sequence[int], group: int, heads_kv: int,
               rows_per_item: int) -> List[List[int]]:
    """Per segment, the costs of its items in the kernels' order (kv head, then row tiles)."""
    out = []
    for c, k in zip(cands, keys):
        items = math.ceil(c * group / rows_per_item) if c > 0 else 0
        out.append([1 + max(1, math.ceil(k / STEP_KEYS))] * (items * heads_kv))
    return out


def block_pass_costs(cands: Sequence[int], keys: Sequence[int], group: int, heads_kv: int,
                     by_rows: bool) -> List[List[int]]:
    """Per segment, the costs of its items in the backward's dK / dV block pass (``by_rows``:
    items of 32 keys, each walking the rows) or dQ block pass (items of 16 rows, each walking
    the keys); a segment without rows or keys, or with one key tile for dQ, has none."""
    out = []
    for c, k in zip(cands, keys):
        rows = c * group
        if by_rows:
            items, cost = (math.ceil(k / 32), 1 + math.ceil(rows / 16)) if rows and k else (0, 0)
        else:
            items, cost = (math.ceil(rows / 16), 1 + math.ceil(k / 16)) if rows and k > 16 else \
                (0, 0)
        out.append([cost] * (items * heads_kv))
    return out


def list_schedule(jobs: Sequence[float], slots: int) -> float:
    """When the last of `jobs`, started in order on whichever of `slots` frees first, ends."""
    free = [0.0] * slots
    for w in jobs:
        heapq.heappush(free, heapq.heappop(free) + w)
    return max(free)


def grid_stride(items: Sequence[float], slots: int, grid_factor: int) -> float:
    """End of a grid of grid_factor x slots blocks walking `items` grid-stride."""
    blocks = grid_factor * slots
    shares = [0.0] * blocks
    for i, w in enumerate(items):
        shares[i % blocks] += w
    return list_schedule(shares, slots)


def spread(segments: List[List[int]], keys: Sequence[int], slots: int,
           grid_factor: int) -> dict:
    """Busiest block over the mean for the three walks of the module docstring (``keys``: what
    the order sorts by, per segment)."""
    in_order = [w for seg in segments for w in seg]
    if not in_order:
        return dict.fromkeys(("segment order", "longest first", "longest first, queue"), 1.0)
    mean = sum(in_order) / slots
    longest = sorted(range(len(segments)), key=lambda s: -keys[s])
    sorted_items = [w for s in longest for w in segments[s]]
    return {"segment order": grid_stride(in_order, slots, grid_factor) / mean,
            "longest first": grid_stride(sorted_items, slots, grid_factor) / mean,
            "longest first, queue": list_schedule(sorted_items, slots) / mean}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mps", type=int, default=132)
    ap.add_argument("--blocks-per-mp", type=int, default=1)
    ap.add_argument("--rows-per-item", type=int, default=128)
    ap.add_argument("--grid-factor", type=int, default=4)
    ap.add_argument("--backward", action="store_true")
    ap.add_argument("--cases", default="")
    args = ap.parse_args(argv)
    rows = ([ragged_rows.parse_row(n) for n in args.cases.split(",")] if args.cases
            else ragged_rows.ROWS)
    slots = args.mps * args.blocks_per_mp
    if args.backward:
        print(f"{slots} resident blocks, grid {args.grid_factor} x that, the backward's block "
              f"passes; busiest block / mean block, in segment order -> ordered")
        print(f"{'row':60s} {'dK / dV':>12s} {'dQ':>12s}")
    else:
        print(f"{slots} resident blocks, grid {args.grid_factor} x that, items of "
              f"{args.rows_per_item} rows; busiest block / mean block")
        print(f"{'row':60s} {'items':>7s} {'segment order':>14s} {'longest first':>14s} "
              f"{'+ queue':>8s}")
    for row in rows:
        n = ragged_rows.draw_lengths(row, 0)
        keys = n.keys.tolist()
        if args.backward:
            cands, group = n.cands.tolist(), row.h_q // row.h_kv
            cols = []
            for by_rows, rank in ((True, cands), (False, keys)):
                segs = block_pass_costs(cands, keys, group, row.h_kv, by_rows)
                s = spread(segs, rank, slots, args.grid_factor)
                cols.append(f"{s['segment order']:.2f} -> {s['longest first']:.2f}")
            print(f"{row.name:60s} {cols[0]:>12s} {cols[1]:>12s}")
            continue
        segments = item_costs(n.cands.tolist(), keys, row.h_q // row.h_kv, row.h_kv,
                              args.rows_per_item)
        s = spread(segments, keys, slots, args.grid_factor)
        print(f"{row.name:60s} {sum(map(len, segments)):7d} {s['segment order']:14.2f} "
              f"{s['longest first']:14.2f} {s['longest first, queue']:8.2f}")


if __name__ == "__main__":
    main()
