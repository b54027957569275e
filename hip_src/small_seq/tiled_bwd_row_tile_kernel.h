// Tiled small-seq backward, one-row-tile variant: the dK / dV and dQ passes of
// tiled_bwd_kernel.h in one kernel for calls whose every (segment, kv head) fits one 16-row
// tile (host bound max_seqlen_q x group <= kTiledBwdRows: 16 candidates without GQA, one query
// with a GQA group of 5-16), over any history the tiled kernels serve
// (docs/kernels.md#one-row-tile-backward).
//
// Work item = (segment, kv head, head-dim slice), one per wave, slices of one (segment, kv
// head) on neighbouring waves of a block (they read the same Q, dO, K and V rows). The item is
// pass 2's one-row-tile item (tiled_bwd_row_tile_mma): per key tile of 16 keys, S^T and dP^T
// over the whole head dim (keys as rows), P^T and dS^T from them, dS by a transpose across
// lanes; then the slice of dV and dK of those keys (complete: every row is in the tile, stored
// at once) and the slice of dQ accumulated in fp32 over the key tiles, stored at the end. K / V
// are read once for all three gradients.
//
// Why a kernel of its own: pass 2's kernel serves every segment shape and takes the registers
// of its general item (246 on sm_90); this one holds only what the one-row-tile item needs.
//
// Determinism, contract and numerics are pass 2's (tiled_bwd_kernel.h): one writer per
// gradient element in a fixed order; the item of slice 0 writes the edges (tiled_bwd_edges).
#pragma once

#include "tiled_bwd_kernel.h"

namespace small_seq {

constexpr int kTiledBwdRowTileThreads = 128;
// Blocks per multiprocessor the register cap is set for: two (222 registers on sm_90, no spill;
// pass 2's kernel takes 246 for its general item). Measured forward+backward on 16 candidates
// with 8 kv heads (H100): 1-5% faster than pass 2's kernel; a 168-register cap (three blocks,
// 56 bytes spilled) 1-22% slower, 200 registers over blocks of one or two warps (10 warps per
// multiprocessor, 8 bytes spilled) 10-17% slower (docs/kernels.md#one-row-tile-backward).
constexpr int kTiledBwdRowTileMinBlocks = 2;

template <typename T, int D>
__global__ void RA_LAUNCH_BOUNDS_MIN_BLOCKS(kTiledBwdRowTileThreads, kTiledBwdRowTileMinBlocks)
    small_seq_tiled_bwd_row_tile_kernel(const SmallSeqTiledParams p) {
  constexpr int WAVE = RA_WAVE_SIZE;
  constexpr int SLICES = tiled_bwd_slices(WAVE, D);
  const int lane = threadIdx.x % WAVE;
  const int waves = blockDim.x / WAVE;
  const int64_t per_seg = static_cast<int64_t>(p.num_heads_kv) * SLICES;
  const int64_t items = static_cast<int64_t>(p.batch) * per_seg;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * waves;
  for (int64_t item = static_cast<int64_t>(blockIdx.x) * waves + threadIdx.x / WAVE; item < items;
       item += stride) {
    const int seg = static_cast<int>(item / per_seg);
    const int rest = static_cast<int>(item - seg * per_seg);
    const int hk = rest / SLICES;
    const int slice = rest - hk * SLICES;
    const TiledBounds b = tiled_fetch_bounds(p, seg);
    const TiledSegment s = tiled_resolve_segment(p, seg, b);
    if (slice == 0) {
      if (!tiled_bwd_edges<T, D>(p, seg, hk, b, s, lane)) continue;
    } else if (!s.valid) {
      continue;
    }
    tiled_bwd_row_tile_item<T, D>(p, hk, slice, s, lane);
  }
}

}  // namespace small_seq
