"""tools/diag/dq_buffer_protocol.py: the tile-copy dQ kernel's buffer / barrier protocol, model
checked over every interleaving of its warpgroups and of the copies landing (the kernel itself
runs in tests/test_small_seq_tiled_bwd_gpu.py on a GPU)."""
from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools" / "diag"))

import dq_buffer_protocol as proto  # noqa: E402


def test_protocol_holds_over_item_sequences():
    """The kernel's protocol (full and released barriers per buffer): no early wait, no copy on a
    pending phase, no deadlock, parities in step, for every sequence of up to two items of 0..7
    tiles and some of three."""
    counts = range(8)
    for a in counts:
        assert not proto.explore([a]), a
        for b in counts:
            assert not proto.explore([a, b]), (a, b)
    for seq in ([7, 4, 5], [5, 7, 3], [4, 1, 7], [6, 6, 6]):
        assert not proto.explore(seq), seq


def test_without_the_released_barrier_a_wait_passes_early():
    """The first version (full barriers only) lets the warpgroup waiting for tile t pass while
    tile t - 3's copies are still in flight: any item of 4+ tiles."""
    for tiles in range(4):
        assert not proto.explore([tiles], release=False), tiles
    for tiles in (4, 5, 7):
        found = proto.explore([tiles], release=False)
        assert any(v[0] == "wait passed before the tile landed" for v in found), (tiles, found)
