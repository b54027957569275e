// Row copy kernel for wide rows of the copy helpers (partition, the reorders, read_half,
// copy_valid_tokens): rows of at least one wave of 16-byte vectors (512 bytes on 32-lane waves,
// 1 KB on 64).
//
// One wave moves kWideVecsPerLane x wave vectors of one row (o, row) and nothing else: it maps
// its row with one uniform search (seq_of_uniform: one coalesced load of cu_seqlens and a
// ballot), loads its vectors, stores them, and ends. The grid holds one wave per such piece, so
// the hardware's block scheduler, not a loop, spreads the work, and a resident thread spends
// most of its short life with loads in flight. The map kind is a template argument: its code
// alone is compiled in (the generic map cost these kernels ~40 registers and 267 instructions
// per wave of one vector per lane).
// NOTE: with the row map, two vectors per lane beat one on every benchmark row, and this kernel
// beats the row-group kernel (copy_kernel.h) on rows this wide (docs/kernels.md#thd-copy-kernels
// has the measurements, and the plain-copy ceiling of tools/diag/launch_ceiling.cu).
#pragma once

#include "../common/tuning.h"
#include "copy_kernel.h"

namespace thd {

// Source row of `row` (-1: none) where every lane of the wave maps the same row, for a map kind
// fixed at compile time (the kind's switch folds away, and with it the other kinds' code).
template <ThdRowMap KIND>
RA_DEVICE int64_t source_row_uniform(const ThdRowMapParams& params, int64_t row) {
  constexpr int kW = RA_WAVE_SIZE;
  ThdRowMapParams m = params;
  m.kind = KIND;
  const SeqQuery query = map_query(m, row);
  const int64_t end = m.cu[m.b];  // with the search's loads
  return map_row_given(m, row, seq_of_uniform<kW>(query.cu, m.b, query.div, query.pos), end);
}

// Rows of step token k in both halves, from one uniform search (every lane of the wave maps k).
RA_DEVICE void half_rows_uniform(const ThdRowMapParams& m, int64_t k, int64_t& first,
                                 int64_t& second) {
  constexpr int kW = RA_WAVE_SIZE;
  const int64_t end = m.cu[m.b];  // with the search's loads
  half_rows(m, m.cu, k, seq_of_uniform<kW>(m.cu, m.b, 2, k), end, first, second);
}

constexpr int kWideVecsPerLane = 2;

// Where a lane of a wide-row kernel works: its wave's slot (the row, or row and half) and piece
// of it (pieces fastest, 2^pieces_shift per slot), and its VPT vectors piece_vector(u).
template <int THREADS, int VPT>
struct WideLane {
  static constexpr int kW = RA_WAVE_SIZE;
  int lane;
  int piece;
  int64_t slot;

  RA_DEVICE explicit WideLane(int pieces_shift) {
    lane = threadIdx.x & (kW - 1);
    const int64_t wave = static_cast<int64_t>(blockIdx.x) * (THREADS / kW) + threadIdx.x / kW;
    piece = static_cast<int>(wave & ((1 << pieces_shift) - 1));
    slot = wave >> pieces_shift;
  }
  // vector u of the lane's VPT: coalesced across the wave
  RA_DEVICE int piece_vector(int u) const { return (piece * VPT + u) * kW + lane; }
};

// Grid of a wide-row launch over `slots` rows (or row halves) of nvec vectors: log2 of the
// pieces per slot (rounded up to a power of two: surplus waves find no vector and end) and the
// blocks of `threads` holding one wave per piece; blocks = -1 where the grid would not fit.
struct WideGrid {
  int pieces_shift = 0;
  int64_t blocks = -1;
};

inline WideGrid wide_grid(int64_t slots, int64_t nvec, int wave, int threads, int vpt) {
  WideGrid g;
  // vector indices are int in the kernels, up to twice nvec in the last piece
  if (nvec > (int64_t{1} << 30)) return g;
  const int64_t per_wave = static_cast<int64_t>(wave) * vpt;
  while ((per_wave << g.pieces_shift) < nvec) ++g.pieces_shift;
  if (slots > (INT64_MAX >> g.pieces_shift) / 2) return g;
  const int64_t waves = slots << g.pieces_shift;
  const int64_t blocks = (waves + threads / wave - 1) / (threads / wave);
  // HIP launches at most 2^32 - 1 threads per grid dimension; CUDA 2^31 - 1 blocks
  if (blocks <= INT32_MAX && blocks <= UINT32_MAX / threads) g.blocks = blocks;
  return g;
}

// The L2 prefetch of the guessed rows before the wait (kernels below and merge_kernel.h): the
// tuning value thd_prefetch (common/tuning.h), or `dflt` where it is -1.
inline int thd_prefetch_setting(int dflt) {
  const int tuned = ra_tuning().thd_prefetch;
  return tuned >= 0 ? tuned : dflt;
}

// The wide kernels' first resident round (every thread of the block calls it): the rows of
// this wave mapped by map_rows(m) from a snapshot of cu_seqlens (ARRAYS arrays) taken before
// the wait, their loads issued by load_rows(row) right after it, and, only if the kernel ahead
// changed cu_seqlens, mapped again from them and reloaded, before anything is stored. Returns
// the row; lanes out of range keep `row` and their load_rows must load nothing. With
// `prefetch`, prefetch_rows(row) puts the guessed rows in L2 before the wait.
template <int ARRAYS, int THREADS, class Row, class MapRows, class LoadRows, class PrefetchRows>
RA_DEVICE Row map_and_load_from_snapshot(const ThdRowMapParams& m, int32_t* snapshot,
                                         bool in_range, Row row, MapRows map_rows,
                                         LoadRows load_rows, bool prefetch,
                                         PrefetchRows prefetch_rows) {
  const ThdRowMapParams guess_map = take_cu_snapshot<ARRAYS>(m, snapshot, THREADS);
  if (in_range) row = map_rows(guess_map);
  if (prefetch && in_range) prefetch_rows(row);  // into L2 only: safe before the wait
  ra_wait_for_prior_kernel();
  ra_let_next_kernel_start();
  load_rows(row);
  const bool current = snapshot_share_current<ARRAYS>(m, snapshot, threadIdx.x, THREADS);
  if (!__syncthreads_and(current)) {  // the kernel ahead changed cu_seqlens: map again
    if (in_range) row = map_rows(m);
    load_rows(row);
  }
  return row;
}

// Blocks per multiprocessor each kind's kernel is compiled for on NVIDIA (ptxas caps its
// registers to fit them; 0: no cap): the most that spill nothing on the executed paths
// (partition's cap spills 20 bytes on sm_90, 16 of them measured around the 64-bit division of
// a non-power-of-two cp in the stale-snapshot remap only; the reorders spill at 8).
constexpr int wide_copy_min_blocks(ThdRowMap kind) {
  return kind == ThdRowMap::kPartition                               ? 6
         : kind == ThdRowMap::kHalf || kind == ThdRowMap::kCopyValid ? 8
                                                                     : 0;
}

// pieces_shift: wide_grid's, over the outer x rows slots (rows fastest).
// guess_blocks: blocks below it map their rows from a cu_seqlens snapshot before the wait
// (index.h: the one-array maps, and copy_valid_tokens' three), so that a block resident while
// the kernel ahead drains issues its loads right after the wait.
// prefetch: non-zero, those blocks also put their guessed rows in L2 before the wait.
template <ThdRowMap KIND>
__global__ void RA_LAUNCH_BOUNDS_MIN_BLOCKS(kCopyThreads, wide_copy_min_blocks(KIND))
    copy_wide_rows_kernel(const ThdCopyParams p, const int pieces_shift,
                          const int64_t guess_blocks, const int prefetch) {
  constexpr int VPT = kWideVecsPerLane;
  constexpr int kArrays = KIND == ThdRowMap::kCopyValid ? 3 : 1;
  __shared__ int32_t snapshot[kArrays * kSnapshotWords];
  const WideLane<kCopyThreads, VPT> w(pieces_shift);
  const int64_t slot = w.slot;  // (o, row), rows fastest
  const bool in_range = slot < p.outer * p.rows;  // false: the last block's surplus waves
  int64_t o = 0, row = slot;
  if (p.outer > 1) {  // uniform
    o = slot / p.rows;
    row = slot - o * p.rows;
  }
  const int vph = p.head_bytes / 16;
  const int nvec = p.heads * vph;
  ra_vec8 buf[VPT];
  auto load = [&](int64_t src_row) {
    const char* __restrict__ src = static_cast<const char*>(p.src);
    const int64_t base = o * p.src_outer_stride + src_row * p.src_row_stride;
#pragma unroll
    for (int u = 0; u < VPT; ++u) {
      const int v = w.piece_vector(u);
      if (in_range && v < nvec && src_row >= 0)
        buf[u] = *reinterpret_cast<const ra_vec8*>(
            src + base + vec_offset<16>(v, vph, p.heads, p.src_head_stride));
      else if (p.fill)
        buf[u] = VecOf<16>::fill(p.fill_bytes);
    }
  };
  auto prefetch_rows = [&](int64_t src_row) {
    const char* src = static_cast<const char*>(p.src);
    const int64_t base = o * p.src_outer_stride + src_row * p.src_row_stride;
#pragma unroll
    for (int u = 0; u < VPT; ++u) {
      const int v = w.piece_vector(u);
      if (v < nvec && src_row >= 0)
        ra_prefetch_l2(src + base + vec_offset<16>(v, vph, p.heads, p.src_head_stride));
    }
  };
  int64_t src_row = -1;
  // the reorders map without a snapshot: its second copy of their maps took them from 36-39 to
  // 47-60 registers and cost 5-10% (H200), more than mapping before the wait saves them
  constexpr bool kMayGuess =
      KIND != ThdRowMap::kToContiguous && KIND != ThdRowMap::kToRankSharded;
  // NOTE: the L2 prefetch of the guessed rows gains a little on every launch of several resident
  // rounds and loses where the whole grid is one round, hence the launcher's rule
  // (docs/kernels.md#rows-mapped-before-the-wait).
  if (kMayGuess && blockIdx.x < guess_blocks && maps_from_snapshot<kArrays>(p.map)) {  // uniform
    src_row = map_and_load_from_snapshot<kArrays, kCopyThreads>(
        p.map, snapshot, in_range, src_row,
        [&](const ThdRowMapParams& m) { return source_row_uniform<KIND>(m, row); }, load,
        prefetch != 0, prefetch_rows);
  } else {
    ra_wait_for_prior_kernel();  // launched by ra_launch: nothing is read before this
    ra_let_next_kernel_start();
    if (!in_range) return;
    src_row = source_row_uniform<KIND>(p.map, row);
    load(src_row);
  }
  if (!in_range || (src_row < 0 && !p.fill)) return;
  char* __restrict__ dst = static_cast<char*>(p.dst);
  const int64_t dst_base = o * p.dst_outer_stride + row * p.dst_row_stride;
#pragma unroll
  for (int u = 0; u < VPT; ++u) {
    const int v = w.piece_vector(u);
    if (v < nvec)
      *reinterpret_cast<ra_vec8*>(dst + dst_base +
                                  vec_offset<16>(v, vph, p.heads, p.dst_head_stride)) = buf[u];
  }
}

}  // namespace thd
