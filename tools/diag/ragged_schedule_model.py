"""How evenly the tiled forward's work items spread over the grid, per ragged-request row.

Usage: python3 tools/diag/ragged_schedule_model.py [--mps N] [--blocks-per-mp N]
           [--rows-per-item N] [--grid-factor N] [--cases ROW,ROW...]

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
    """Busiest block over the mean for the three walks of the module docstring."""
    in_order = [w for seg in segments for w in seg]
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
    ap.add_argument("--cases", default="")
    args = ap.parse_args(argv)
    rows = ([ragged_rows.parse_row(n) for n in args.cases.split(",")] if args.cases
            else ragged_rows.ROWS)
    slots = args.mps * args.blocks_per_mp
    print(f"{slots} resident blocks, grid {args.grid_factor} x that, items of "
          f"{args.rows_per_item} rows; busiest block / mean block")
    print(f"{'row':60s} {'items':>7s} {'segment order':>14s} {'longest first':>14s} "
          f"{'+ queue':>8s}")
    for row in rows:
        n = ragged_rows.draw_lengths(row, 0)
        keys = n.keys.tolist()
        segments = item_costs(n.cands.tolist(), keys, row.h_q // row.h_kv, row.h_kv,
                              args.rows_per_item)
        s = spread(segments, keys, slots, args.grid_factor)
        print(f"{row.name:60s} {sum(map(len, segments)):7d} {s['segment order']:14.2f} "
              f"{s['longest first']:14.2f} {s['longest first, queue']:8.2f}")


if __name__ == "__main__":
    main()
