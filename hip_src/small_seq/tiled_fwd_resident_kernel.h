// Tiled small-seq forward, resident variant: a block stages one segment's whole K and V in
// shared memory once and runs all of the segment's row tiles (or a share of them) against it
// (docs/kernels.md#tiled-small-seq-kernels).
//
// Why: with many candidates per user the wave kernel re-walks a segment's keys once per row
// tile from L2 (K/V bytes x row tiles), and the staged block kernel pays a block barrier and a
// global-memory round trip per key tile of 16. Here a (segment, kv head) costs one pass over
// its K/V from global memory per work item and one barrier; after it every wave runs its row
// tiles free of the others, reading key tiles from shared memory. Rows are 16 per tile on both
// vendors (on NVIDIA: m16n8k16 with two n8 tiles of rows, which the wave kernel cannot afford
// in registers while it streams K/V ahead; here nothing is streamed).
//
// Work item = (segment, kv head, split): a (segment, kv head) whose rows make many tiles may be
// cut into `splits` contiguous runs of tiles, each its own item (and its own K/V staging), so
// that few segments still fill the machine; the host picks `splits` (tiled_launch.hip). The
// waves of a block take the item's tiles round robin.
//
// Shared memory: K then V, each round_up(max_seqlen_kv, 16) rows (TiledSmemStride's padded
// strides), sized by the launch (dynamic shared memory). A valid segment has at most
// max_seqlen_kv keys (tiled_segment.h), so staging never writes past the buffer; a bad segment
// stages nothing.
#pragma once

#include "tiled_fwd_kernel.h"

namespace small_seq {

// Rows of a row tile in the resident kernel (both vendors), and its block's threads (four waves
// on AMD, eight warps on NVIDIA).
constexpr int kTiledResidentRows = 16;
constexpr int kTiledResidentThreads = 256;

// Keys the resident buffers hold for max_seqlen_kv (whole key tiles).
RA_HOST_DEVICE constexpr int64_t tiled_resident_keys(int max_seqlen_kv) {
  return (static_cast<int64_t>(max_seqlen_kv) + kTiledKeys - 1) / kTiledKeys * kTiledKeys;
}

// Shared-memory bytes the resident kernel needs for keys up to max_seqlen_kv (K then V).
template <int D>
RA_HOST_DEVICE constexpr int64_t tiled_resident_smem_bytes(int max_seqlen_kv) {
  return tiled_resident_keys(max_seqlen_kv) * (TiledSmemStride<D>::kK + TiledSmemStride<D>::kV) *
         2;
}

// The kernels that stage a (segment, kv head)'s K/V once per work item (this one and the
// warpgroup kernel) share one decomposition: item = (segment, kv head, split), each split a
// run of row tiles of `rows` rows, counted from the host bound max_seqlen_q (the host picks
// `splits`: tiled_splits in tiled_launch.hip).
RA_HOST_DEVICE int64_t tiled_tiles_per_split(const SmallSeqTiledParams& p, int splits,
                                             int rows) {
  const int64_t tiles = tiled_row_tiles(p, rows);
  return (tiles + splits - 1) / splits;
}

// One work item of a staged kernel: its kv head and segment, the split's row tiles
// [tile0, tile1) clipped to the segment's rows, and (valid segments) where the kv head's keys
// and values start.
struct TiledStagedItem {
  int hk;
  TiledSegment s;
  int64_t seg_rows;
  int64_t tile0;
  int64_t tile1;
  const uint16_t* kbase;
  const uint16_t* vbase;
};

// Work item `item` (of tiles of ROWS rows) decoded, nothing written: its kv head, segment
// (returned), split and row tiles, and for a valid segment where its keys and values start. A
// kernel's copy warp decodes the items it copies for this way (the warp-specialized warpgroup
// kernel); tiled_staged_item decodes each item a block serves.
template <int ROWS>
RA_DEVICE int tiled_decode_item(const SmallSeqTiledParams& p, const int64_t item,
                                const int splits, TiledStagedItem* it, int64_t* split) {
  const int group = p.num_heads_q / p.num_heads_kv;
  const int64_t per_seg = static_cast<int64_t>(splits) * p.num_heads_kv;
  const int seg = static_cast<int>(item / per_seg);
  const int64_t rest = item - seg * per_seg;
  it->hk = static_cast<int>(rest / splits);
  *split = rest - static_cast<int64_t>(it->hk) * splits;
  it->s = tiled_resolve_segment(p, seg, tiled_fetch_bounds(p, seg));
  it->seg_rows = static_cast<int64_t>(it->s.nq) * group;
  const int64_t seg_tiles = (it->seg_rows + ROWS - 1) / ROWS;
  const int64_t per_split = tiled_tiles_per_split(p, splits, ROWS);
  it->tile0 = *split * per_split;
  it->tile1 = it->tile0 + per_split < seg_tiles ? it->tile0 + per_split : seg_tiles;
  if (it->s.valid) {
    const TiledSegment& sg = it->s;
    it->kbase = static_cast<const uint16_t*>(p.k) + sg.kv_batch * p.k_batch_stride +
                sg.kv_token0 * p.k_token_stride + it->hk * p.k_head_stride;
    it->vbase = static_cast<const uint16_t*>(p.v) + sg.kv_batch * p.v_batch_stride +
                sg.kv_token0 * p.v_token_stride + it->hk * p.v_head_stride;
  }
  return seg;
}

// Whether decoded item `it` (split `split`) may write rows besides its attention
// (tiled_item_writes): a segment that breaks the contract, or a first split, which writes the
// THD padding rows where its segment is the first or the last.
RA_DEVICE bool tiled_item_may_write(const int64_t split, const TiledStagedItem& it) {
  return !it.s.valid || split == 0;
}

// The part of decoded item `it` (segment seg, split `split`) that needs no staged K/V: the
// padding rows (first split, wave 0) and, for a segment that breaks the contract, NaN rows over
// the split's tiles (16-row pieces spread over the THREADS threads' waves) and one report.
// Returns whether the threads have rows to compute for the item.
template <typename T, int D, int ROWS, int THREADS>
RA_DEVICE bool tiled_item_writes(const SmallSeqTiledParams& p, const int group, const int seg,
                                 const int64_t split, const int tid, const TiledStagedItem* it) {
  constexpr int WAVE = RA_WAVE_SIZE;
  constexpr int WAVES = THREADS / WAVE;
  constexpr int kFillRows = 16;
  const int lane = tid % WAVE;
  const int w = tid / WAVE;
  if (split == 0 && w == 0) tiled_fwd_padding<T, D>(p, seg, it->hk, lane);
  if (it->s.valid) return it->tile0 < it->tile1;
  if (split == 0 && it->hk == 0 && tid == 0) tiled_report_bad_segment(p, seg);
  const float nan = tiled_nan();
  const int64_t row_end = it->tile1 * ROWS < it->seg_rows ? it->tile1 * ROWS : it->seg_rows;
  for (int64_t r0 = it->tile0 * ROWS + w * kFillRows; r0 < row_end; r0 += WAVES * kFillRows) {
    const int64_t r1 = r0 + kFillRows < row_end ? r0 + kFillRows : row_end;
    tiled_fill_rows<T, D>(p, it->s.q_batch, it->s.q_token0, it->s.q_row0, r0, r1,
                          it->hk * group, group, nan, nan, nan, lane);
  }
  return false;
}

// Decodes work item `item` (tiled_decode_item) and does its writes (tiled_item_writes) with a
// block of THREADS threads. Returns whether the block has rows to compute for the item
// (block-uniform).
template <typename T, int D, int ROWS, int THREADS>
RA_DEVICE bool tiled_staged_item(const SmallSeqTiledParams& p, const int64_t item,
                                 const int splits, const int tid, TiledStagedItem* it) {
  const int group = p.num_heads_q / p.num_heads_kv;
  int64_t split;
  const int seg = tiled_decode_item<ROWS>(p, item, splits, it, &split);
  return tiled_item_writes<T, D, ROWS, THREADS>(p, group, seg, split, tid, it);
}

#if RA_HAS_MMA

// Copies keys [0, nk) of one kv head from global memory into the resident buffers and zeros the
// rows after them up to the end of the last key tile, so that key tiles load without row guards
// (all threads of the block; 16-byte pieces, several loads in flight per thread before their
// stores).
template <int D, int THREADS>
RA_DEVICE void tiled_resident_stage(uint16_t* sk, uint16_t* sv, const uint16_t* kbase,
                                    int64_t k_stride, const uint16_t* vbase, int64_t v_stride,
                                    const int nk, const int tid) {
  constexpr int kVecsPerRow = D / 8;
  constexpr int SK = TiledSmemStride<D>::kK;
  constexpr int SV = TiledSmemStride<D>::kV;
  constexpr int kBatch = 4;
  const int live = nk * kVecsPerRow;
  const int total = static_cast<int>(tiled_resident_keys(nk)) * kVecsPerRow;
  for (int base = 0; base < total; base += kBatch * THREADS) {
    ra_vec8 kb[kBatch], vb[kBatch];
#pragma unroll
    for (int i = 0; i < kBatch; ++i) {
      const int idx = base + i * THREADS + tid;
      kb[i] = vb[i] = ra_vec8{{0u, 0u, 0u, 0u}};
      if (idx < live) {
        const int row = idx / kVecsPerRow;
        const int vec = idx - row * kVecsPerRow;
        kb[i] = ra_load16(kbase + row * k_stride + 8 * vec);
        vb[i] = ra_load16(vbase + row * v_stride + 8 * vec);
      }
    }
#pragma unroll
    for (int i = 0; i < kBatch; ++i) {
      const int idx = base + i * THREADS + tid;
      if (idx < total) {
        const int row = idx / kVecsPerRow;
        const int vec = idx - row * kVecsPerRow;
        ra_store16(sk + row * SK + 8 * vec, kb[i]);
        ra_store16(sv + row * SV + 8 * vec, vb[i]);
      }
    }
  }
}

#endif  // RA_HAS_MMA

// KSTEP: key tiles per softmax step (1, or 4: the step's four chains of dependent matrix and
// softmax steps cover each other's latency).
// NOTE (registers): the explicit minimum of one resident block lets the compiler use the
// registers the tile needs (docs/kernels.md#tiled-small-seq-kernels). ROW_MAX: the instance for
// calls that ask for row_max (tiled_fwd_kernel.h's header NOTE).
template <typename T, int D, int KSTEP, bool ROW_MAX = false>
__global__ void RA_LAUNCH_BOUNDS_MIN_BLOCKS(kTiledResidentThreads, 1)
    small_seq_tiled_fwd_resident_kernel(const SmallSeqTiledParams p, const int splits) {
  static_assert(TiledSlices<D>::kCount == 1, "the resident kernel serves head dims up to 128");
  constexpr int THREADS = kTiledResidentThreads;
  constexpr int WAVE = RA_WAVE_SIZE;
  constexpr int WAVES = THREADS / WAVE;
  constexpr int ROWS = kTiledResidentRows;
  const int tid = threadIdx.x;
  const int lane = tid % WAVE;
  const int w = tid / WAVE;
  const int64_t items = static_cast<int64_t>(p.batch) * splits * p.num_heads_kv;
  for (int64_t item = blockIdx.x; item < items; item += gridDim.x) {
    TiledStagedItem it;
    if (!tiled_staged_item<T, D, ROWS, THREADS>(p, item, splits, tid, &it)) continue;
    const TiledSegment& s = it.s;
    const int hk = it.hk;
#if RA_HAS_MMA
    RA_DYNAMIC_SHARED(ra_vec8, tiled_resident_smem);
    uint16_t* sk = reinterpret_cast<uint16_t*>(tiled_resident_smem);
    uint16_t* sv = sk + tiled_resident_keys(p.max_seqlen_kv) * TiledSmemStride<D>::kK;
    tiled_resident_stage<D, THREADS>(sk, sv, it.kbase, p.k_token_stride, it.vbase,
                                     p.v_token_stride, s.nk, tid);
    __syncthreads();
    const TiledResidentKv resident{sk, sv};
    for (int64_t tile = it.tile0 + w; tile < it.tile1; tile += WAVES)
      tiled_fwd_tile_mma<T, D, ROWS, kTiledResident, THREADS, KSTEP, ROW_MAX>(
          p, hk, tile, s, lane, nullptr, nullptr, nullptr, tid, &resident);
    __syncthreads();  // every wave is done with this segment's K/V before the next staging
#else
    // Targets without matrix units: each wave its tiles, scalar, from global memory.
    for (int64_t tile = it.tile0 + w; tile < it.tile1; tile += WAVES)
      tiled_fwd_tile_scalar<T, D, ROWS>(p, hk, tile, s, lane);
#endif
  }
}

}  // namespace small_seq
