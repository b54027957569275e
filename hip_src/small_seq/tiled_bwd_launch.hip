// Launch of the tiled small-seq backward (tiled_bwd_kernel.h): Delta pass, dK/dV pass and, when
// max_seqlen_kv exceeds one key tile, the dQ pass, in stream order; on Hopper (sm_90a builds)
// the warpgroup-MMA kernels (tiled_bwd_warpgroup_kernel.h) replace passes 2 and 3 where they
// serve (and pass 1 too, by default: tiled_bwd_warpgroup_fuses_delta), for calls of at most a few
// rows per (segment, kv head) the streaming kernel (tiled_bwd_stream_kernel.h) does, on every
// target, and for calls of at most one row tile pass 2's one-row-tile instance alone (by
// default without pass 1: it computes Delta itself). Dispatch over dtype x head dim (one
// translation unit: no kv bucket, no generated files).
#include "../common/launch.h"
#include "../common/tuning.h"
#include "tiled_bwd_block_kernel.h"
#include "tiled_bwd_stream_kernel.h"
#include "tiled_bwd_warpgroup_kernel.h"
#include "tiled_bwd_warpgroup_tma_kernel.h"
#include "tiled_bwd_warpgroup_two_tile_kernel.h"
#include "tiled_launch_util.h"

namespace small_seq {
namespace {

// Blocks for `items` work items, items_per_block per block: at most kTiledBwdResidencyFactor x
// the blocks resident at once (the grid-stride loops then re-use them), at least one.
template <auto KERNEL>
dim3 tiled_bwd_grid(int64_t items, int64_t items_per_block, int threads) {
  int64_t blocks = (items + items_per_block - 1) / items_per_block;
  const int64_t cap = ra_resident_blocks<KERNEL>(threads) * kTiledBwdResidencyFactor;
  if (cap > 0 && blocks > cap) blocks = cap;
  return dim3(static_cast<unsigned>(blocks > 0 ? blocks : 1));
}

inline bool tiled_bwd_use_block(const SmallSeqTiledParams& p) {
  const int mode = ra_tuning().small_seq_tiled_bwd_block;
  if (mode <= 0) return false;
  if (mode >= 2) return true;
  return p.max_seqlen_kv > kTiledBwdKeys && tiled_bwd_row_tiles(p) >= kTiledBwdBlockMinRowTiles;
}

// The warpgroup-MMA kernels (Hopper, sm_90a builds) in place of passes 2 and 3 where every
// history has at most kTiledBwdWarpgroupMaxKeys keys and a (segment, kv head) may fill a 64-row
// tile (fewer rows leave most of each product empty), d 64 / 128, within a block's shared
// memory. Tuning small_seq_tiled_bwd_warpgroup 0 turns them off, 2 takes them wherever they
// can serve.
template <int D>
bool tiled_bwd_use_warpgroup(const SmallSeqTiledParams& p) {
  const int mode = ra_tuning().small_seq_tiled_bwd_warpgroup;
  if (mode <= 0 || (D != 64 && D != 128) || p.max_seqlen_kv > kTiledBwdWarpgroupMaxKeys ||
      !ra_device_warpgroup_mma())
    return false;
  const int64_t limit = ra_device_max_shared_per_block();
  if (tiled_bwd_warpgroup_smem_bytes<D>(kTiledBwdWarpgroupBlockKeys) > limit ||
      (p.max_seqlen_kv > kTiledBwdWarpgroupBlockKeys &&
       tiled_bwd_warpgroup_dq_smem_bytes<D>(p.max_seqlen_kv) > limit))
    return false;
  return mode >= 2 || tiled_max_rows(p) >= kTiledWarpgroupRows;
}

// The streaming kernel in place of passes 2 and 3 where a (segment, kv head) has at most
// kTiledBwdStreamMaxRows rows (host bound max_seqlen_q x group): the backward is then a stream
// over the keys, which the 16-row tiles of the matrix-unit passes leave mostly empty and
// latency-bound (docs/kernels.md#streaming-backward). Tuning small_seq_tiled_bwd_stream 0
// turns it off.
inline bool tiled_bwd_use_stream(const SmallSeqTiledParams& p) {
  return ra_tuning().small_seq_tiled_bwd_stream > 0 &&
         tiled_max_rows(p) <= kTiledBwdStreamMaxRows;
}

// Pass 2's one-row-tile instance (small_seq_tiled_bwd_dkv_kernel<T, D, true>) where every
// (segment, kv head) fits one 16-row tile (host bound max_seqlen_q x group): pass 3 then has no
// work. Tuning small_seq_tiled_bwd_row_tile 0 keeps the general instance.
inline bool tiled_bwd_use_row_tile(const SmallSeqTiledParams& p) {
  return ra_tuning().small_seq_tiled_bwd_row_tile > 0 && tiled_max_rows(p) <= kTiledBwdRows;
}

// Whether the one-row-tile instance computes Delta itself (FUSED_DELTA: rowsum(P dP) - dlse in
// each item, which holds every key of its rows; pass 1 not launched, the kernel zeroes the dq
// of q padding rows). Tuning small_seq_tiled_bwd_fused_delta 1 and 2 (default): histories of
// one key tile (from the tile's own products); 3: any (longer ones add a first sweep of the
// score products over the key tiles: measured 1.15-1.38x slower forward+backward than pass 1 on
// 16 candidates over 64-256 keys, the item being bound by its instruction stream); 0: never.
// Pass 1 reads dO and out once more and is one launch more (docs/kernels.md#one-row-tile-backward).
inline bool tiled_bwd_row_tile_fuses_delta(const SmallSeqTiledParams& p) {
  const int mode = ra_tuning().small_seq_tiled_bwd_fused_delta;
  return mode >= 3 || (mode >= 1 && p.max_seqlen_kv <= kTiledBwdKeys);
}

static_assert(kTiledBwdRowTileThreads <= kTiledBwdMaxThreadsPerBlock, "pass 2's thread bound");

// Launches KERNEL with `threads` threads and `smem` bytes of dynamic shared memory over `items`
// work items: one block per item up to kTiledBwdResidencyFactor x the blocks resident at once.
template <auto KERNEL, typename... Extra>
hipError_t run_tiled_bwd_staged(const SmallSeqTiledParams& p, int64_t items, int threads,
                                int64_t smem, hipStream_t stream, const Extra&... extra) {
  const hipError_t err = tiled_allow_shared<KERNEL>(smem);
  if (err != hipSuccess) return err;
  static TiledOccupancyCache occupancy;
  const int64_t resident =
      static_cast<int64_t>(tiled_blocks_per_mp(KERNEL, threads, smem, occupancy)) *
      ra_device_multiprocessors();
  hipLaunchKernelGGL(KERNEL, tiled_capped_grid(items, resident, kTiledBwdResidencyFactor),
                     dim3(threads), static_cast<size_t>(smem), stream, p, extra...);
  return hipGetLastError();
}

// Whether the warpgroup kernels compute Delta themselves, pass 1 not launched: where a dK / dV
// block holds every key of a history (with dQ, max_seqlen_kv <= one key block) from its own
// products (rowsum(P dP)); past one key block, the dQ kernel, run first, from each tile's dO
// (already in shared memory) and O, for the dK / dV kernel after it. Tuning
// small_seq_tiled_bwd_fused_delta: 1 = histories of one 16-key chunk; 2 = up to one key block
// any, past it where an item may hold more rows than a key-block walk takes (host bound
// max_seqlen_q x group; two tiles with the two-tile walk on, else one; the walks take Delta from
// pass 1): an item of one tile leaves the dQ kernel's second warpgroup idle, and computing
// Delta in it measured up to 6% slower forward+backward than pass 1 (4096 users x 16
// candidates x 256 keys, 2 kv heads, H100), 2.5-4% faster with 512 candidates; 3 = any;
// 0 = never. Pass 1 reads dO and out once more than the floor counts
// (docs/kernels.md#warpgroup-backward).
inline bool tiled_bwd_warpgroup_fuses_delta(const SmallSeqTiledParams& p) {
  const int mode = ra_tuning().small_seq_tiled_bwd_fused_delta;
  if (p.max_seqlen_kv <= kTiledBwdWarpgroupChunk) return mode >= 1;
  if (p.max_seqlen_kv <= kTiledBwdWarpgroupBlockKeys) return mode >= 2;
  const int64_t walked_rows = ra_tuning().small_seq_tiled_bwd_two_tile >= 1
                                  ? kTiledBwdTwoTileRows
                                  : kTiledWarpgroupRows;
  return mode >= 3 || (mode >= 2 && tiled_max_rows(p) > walked_rows);
}

#if RA_TMA_BUILD
// Tensor maps of q, dout and (with_dq) dq with the warpgroup kernels' Q box (tiled_tma_q_map),
// where tuning allows tile copies (small_seq_tiled_warpgroup_tma, as the forward's) and the GQA
// group divides a 64-row tile; false where a map cannot be made (a pointer or stride not a
// multiple of 16 bytes): the cp.async kernels serve.
template <int D>
bool tiled_bwd_tma_maps(const SmallSeqTiledParams& p, const bool with_dq, TiledBwdTmaMaps* maps) {
  const int group = p.num_heads_q / p.num_heads_kv;
  if (ra_tuning().small_seq_tiled_warpgroup_tma <= 0 || kTiledWarpgroupRows % group != 0)
    return false;
  const bool ok =
      tiled_tma_q_map(&maps->q, p, p.q, D, p.q_batch_stride, p.q_token_stride,
                      p.q_head_stride) &&
      tiled_tma_q_map(&maps->dout, p, p.dout, D, p.do_batch_stride, p.do_token_stride,
                      p.do_head_stride) &&
      (!with_dq || tiled_tma_q_map(&maps->dq, p, p.dq, D, p.dq_batch_stride, p.dq_token_stride,
                                   p.dq_head_stride));
  if (!with_dq) maps->dq = maps->q;  // never stored through
  return ok;
}
#endif

// The warpgroup dK / dV kernel over `items` items: its whole row tiles moved by tile copies
// (tiled_bwd_warpgroup_tma_kernel.h) where tiled_bwd_tma_maps makes maps, else by cp.async.
template <typename T, int D, int KEYS, bool WITH_DQ, bool FUSED_DELTA, bool TRANSPOSED = false>
hipError_t run_tiled_bwd_warpgroup_dkdv(const SmallSeqTiledParams& p, int64_t items,
                                        hipStream_t stream) {
  const int64_t smem = tiled_bwd_warpgroup_smem_bytes<D>(KEYS);
#if RA_TMA_BUILD
  TiledBwdTmaMaps maps;
  if (tiled_bwd_tma_maps<D>(p, WITH_DQ, &maps))
    return run_tiled_bwd_staged<
        small_seq_tiled_bwd_warpgroup_tma_kernel<T, D, KEYS, WITH_DQ, FUSED_DELTA, TRANSPOSED>>(
        p, items, 128, smem, stream, maps);
#endif
  return run_tiled_bwd_staged<
      small_seq_tiled_bwd_warpgroup_kernel<T, D, KEYS, WITH_DQ, FUSED_DELTA, TRANSPOSED>>(
      p, items, 128, smem, stream);
}

// Whether the warpgroup kernels of histories past one key block take their score products
// over whole 64-key blocks (the dK / dV kernel transposed, the dQ kernel m64n64) rather than
// in 16-key chunks: tuning small_seq_tiled_bwd_wide_scores.
inline bool tiled_bwd_warpgroup_wide_scores() {
  return ra_tuning().small_seq_tiled_bwd_wide_scores > 0;
}

// The dK / dV kernel of histories past one key block (no dQ, Delta from the workspace): the
// transposed score products where tiled_bwd_warpgroup_wide_scores.
template <typename T, int D>
hipError_t run_tiled_bwd_warpgroup_key_blocks(const SmallSeqTiledParams& p, int64_t items,
                                              hipStream_t stream) {
  constexpr int kBlockKeys = kTiledBwdWarpgroupBlockKeys;
  if (tiled_bwd_warpgroup_wide_scores())
    return run_tiled_bwd_warpgroup_dkdv<T, D, kBlockKeys, false, false, true>(p, items, stream);
  return run_tiled_bwd_warpgroup_dkdv<T, D, kBlockKeys, false, false>(p, items, stream);
}

// The warpgroup dQ kernel over (segment, kv head) items: tiles by tile copies where
// tiled_bwd_tma_maps makes maps and its three buffers fit a block's shared memory (and tuning
// small_seq_tiled_warpgroup_tma is not 2), else by cp.async. DELTA: it computes Delta (run
// ahead of the dK / dV kernel, pass 1 not launched). WIDE: m64n64 score products per key block
// (tiled_bwd_warpgroup_wide_scores), else 16-key chunks.
template <typename T, int D, bool DELTA, bool WIDE>
hipError_t run_tiled_bwd_warpgroup_dq_kernel(const SmallSeqTiledParams& p, int64_t items,
                                             hipStream_t stream) {
  constexpr int kThreads = kTiledBwdWarpgroupDqWarpgroups * 128;
#if RA_TMA_BUILD
  const int64_t tma_smem = tiled_bwd_warpgroup_dq_tma_smem_bytes<D>(p.max_seqlen_kv);
  TiledBwdTmaMaps maps;
  if (ra_tuning().small_seq_tiled_warpgroup_tma != 2 &&
      tma_smem <= ra_device_max_shared_per_block() && tiled_bwd_tma_maps<D>(p, false, &maps))
    return run_tiled_bwd_staged<small_seq_tiled_bwd_warpgroup_dq_tma_kernel<T, D, DELTA, WIDE>>(
        p, items, kThreads, tma_smem, stream, maps);
#endif
  return run_tiled_bwd_staged<small_seq_tiled_bwd_warpgroup_dq_kernel<T, D, DELTA, WIDE>>(
      p, items, kThreads, tiled_bwd_warpgroup_dq_smem_bytes<D>(p.max_seqlen_kv), stream);
}

template <typename T, int D, bool DELTA>
hipError_t run_tiled_bwd_warpgroup_dq(const SmallSeqTiledParams& p, int64_t items,
                                      hipStream_t stream) {
  return tiled_bwd_warpgroup_wide_scores()
             ? run_tiled_bwd_warpgroup_dq_kernel<T, D, DELTA, true>(p, items, stream)
             : run_tiled_bwd_warpgroup_dq_kernel<T, D, DELTA, false>(p, items, stream);
}

// Histories of one key block: the dK / dV kernel with dQ (16-key products where every history
// fits them), Delta fused or from pass 1. Longer ones: where every item holds at most one row
// tile and Delta comes from pass 1, the dK / dV kernel with dQ walking each item's key blocks
// (tuning small_seq_tiled_bwd_one_tile); where every item holds at most two, the two-tile walk
// (tuning small_seq_tiled_bwd_two_tile; Delta from pass 1, which tiled_bwd_warpgroup_fuses_delta
// leaves to it); else the dK / dV kernel over (segment, kv head, key
// block) items and the dQ kernel over (segment, kv head) items; with Delta fused the dQ kernel
// runs first and computes it, else the dK / dV kernel first (Delta from pass 1).
template <typename T, int D, int KEYS, bool FUSED_DELTA>
hipError_t run_tiled_bwd_warpgroup_with_dq(const SmallSeqTiledParams& p, hipStream_t stream) {
  return run_tiled_bwd_warpgroup_dkdv<T, D, KEYS, true, FUSED_DELTA>(
      p, static_cast<int64_t>(p.batch) * p.num_heads_kv, stream);
}

template <typename T, int D>
hipError_t run_tiled_bwd_warpgroup(const SmallSeqTiledParams& p, const bool fused_delta,
                                   hipStream_t stream) {
  constexpr int kBlockKeys = kTiledBwdWarpgroupBlockKeys;
  const int64_t pairs = static_cast<int64_t>(p.batch) * p.num_heads_kv;
  if (p.max_seqlen_kv <= 16)
    return fused_delta ? run_tiled_bwd_warpgroup_with_dq<T, D, 16, true>(p, stream)
                       : run_tiled_bwd_warpgroup_with_dq<T, D, 16, false>(p, stream);
  if (p.max_seqlen_kv <= kBlockKeys)
    return fused_delta ? run_tiled_bwd_warpgroup_with_dq<T, D, kBlockKeys, true>(p, stream)
                       : run_tiled_bwd_warpgroup_with_dq<T, D, kBlockKeys, false>(p, stream);
  if (!fused_delta && ra_tuning().small_seq_tiled_bwd_one_tile >= 1 &&
      tiled_max_rows(p) <= kTiledWarpgroupRows)
    return run_tiled_bwd_warpgroup_dkdv<T, D, kBlockKeys, true, false, true>(p, pairs, stream);
  if (!fused_delta && ra_tuning().small_seq_tiled_bwd_two_tile >= 1 &&
      tiled_max_rows(p) > kTiledWarpgroupRows && tiled_max_rows(p) <= kTiledBwdTwoTileRows)
    return run_tiled_bwd_staged<small_seq_tiled_bwd_warpgroup_two_tile_kernel<T, D>>(
        p, pairs, 2 * 128, tiled_bwd_two_tile_smem_bytes<D>(), stream);
  const int64_t dkdv_items = pairs * tiled_bwd_warpgroup_blocks(p.max_seqlen_kv);
  if (fused_delta) {
    const hipError_t err = run_tiled_bwd_warpgroup_dq<T, D, true>(p, pairs, stream);
    if (err != hipSuccess) return err;
    return run_tiled_bwd_warpgroup_key_blocks<T, D>(p, dkdv_items, stream);
  }
  const hipError_t err = run_tiled_bwd_warpgroup_key_blocks<T, D>(p, dkdv_items, stream);
  if (err != hipSuccess) return err;
  return run_tiled_bwd_warpgroup_dq<T, D, false>(p, pairs, stream);
}

template <auto KERNEL>
hipError_t run_tiled_bwd_stream_kernel(const SmallSeqTiledParams& p, hipStream_t stream) {
  static TiledOccupancyCache occupancy;
  const int threads = kTiledBwdStreamThreads;
  const int waves = threads / ra_device_wave_size();
  const int64_t items = static_cast<int64_t>(p.batch) * p.num_heads_kv;
  const int64_t resident =
      static_cast<int64_t>(tiled_blocks_per_mp(KERNEL, threads, 0, occupancy)) *
      ra_device_multiprocessors();
  const int mode = ra_tuning().small_seq_tiled_bwd_stream;
  const bool per_wave =
      mode == 2 || (mode != 3 && items >= kTiledBwdStreamWaveItems * resident * waves);
  const int64_t items_per_block = per_wave ? waves : 1;
  const int64_t blocks = (items + items_per_block - 1) / items_per_block;
  hipLaunchKernelGGL(KERNEL, tiled_capped_grid(blocks, resident, kTiledBwdResidencyFactor),
                     dim3(threads), 0, stream, p, !per_wave);
  return hipGetLastError();
}

// The kernel instance of the fewest rows that holds the host bound.
template <typename T, int D>
hipError_t run_tiled_bwd_stream(const SmallSeqTiledParams& p, hipStream_t stream) {
  const int64_t rows = tiled_max_rows(p);
  if (rows <= 1)
    return run_tiled_bwd_stream_kernel<small_seq_tiled_bwd_stream_kernel<T, D, 1>>(p, stream);
  if (rows <= 2)
    return run_tiled_bwd_stream_kernel<small_seq_tiled_bwd_stream_kernel<T, D, 2>>(p, stream);
  return run_tiled_bwd_stream_kernel<
      small_seq_tiled_bwd_stream_kernel<T, D, kTiledBwdStreamMaxRows>>(p, stream);
}

// Pass 2's one-row-tile instance (pass 3 has no work), Delta fused or from pass 1.
template <typename T, int D, bool FUSED_DELTA>
hipError_t run_tiled_bwd_row_tile(const SmallSeqTiledParams& p, const int slices,
                                  hipStream_t stream) {
  constexpr auto kernel = small_seq_tiled_bwd_dkv_kernel<T, D, true, FUSED_DELTA>;
  constexpr int kThreads = kTiledBwdRowTileThreads;
  const int wave = ra_device_wave_size();
  hipLaunchKernelGGL(kernel, (tiled_bwd_grid<kernel>(tiled_bwd_dkv_items(p, slices),
                                                     kThreads / wave, kThreads)),
                     dim3(kThreads), 0, stream, p);
  return hipGetLastError();
}

template <typename T, int D>
hipError_t run_tiled_bwd(const SmallSeqTiledParams& p, hipStream_t stream) {
  if (p.batch == 0 || p.num_heads_kv == 0) return hipSuccess;
  if (p.workspace == nullptr || p.workspace_elems < tiled_bwd_delta_pairs(p))
    return hipErrorInvalidValue;  // Delta lives there ([h_q, total_q] fp32)
  const int wave = ra_device_wave_size();
  const int threads = kTiledBwdWavesPerBlock * wave;
  const int slices = tiled_bwd_slices(wave, D);
  const dim3 block(threads);
  const int waves = threads / wave;  // one item per wave in the wave kernels
  const int64_t pairs = static_cast<int64_t>(p.batch) * p.num_heads_kv;
  bool warpgroup = false;
  if constexpr (D <= 128) warpgroup = tiled_bwd_use_warpgroup<D>(p);
  const bool use_stream = !warpgroup && tiled_bwd_use_stream(p);
  const bool row_tile = !warpgroup && !use_stream && tiled_bwd_use_row_tile(p);
  const bool fused_delta = (warpgroup && tiled_bwd_warpgroup_fuses_delta(p)) ||
                           (row_tile && tiled_bwd_row_tile_fuses_delta(p));
  if (!fused_delta) {
    const int per_wave = wave / (D / 8 < wave ? D / 8 : wave);  // (row, head) pairs per wave
    const int64_t items = (tiled_bwd_delta_pairs(p) + per_wave - 1) / per_wave;
    if (items > 0) {
      hipLaunchKernelGGL((small_seq_tiled_bwd_delta_kernel<T, D>),
                         (tiled_bwd_grid<small_seq_tiled_bwd_delta_kernel<T, D>>(items, waves,
                                                                                threads)),
                         block, 0, stream, p);
      const hipError_t err = hipGetLastError();
      if (err != hipSuccess) return err;
    }
  }
  if constexpr (D <= 128) {
    if (warpgroup) return run_tiled_bwd_warpgroup<T, D>(p, fused_delta, stream);
  }
  if (use_stream) return run_tiled_bwd_stream<T, D>(p, stream);
  if (row_tile)
    return fused_delta ? run_tiled_bwd_row_tile<T, D, true>(p, slices, stream)
                       : run_tiled_bwd_row_tile<T, D, false>(p, slices, stream);
  const bool use_block = tiled_bwd_use_block(p);
  if (use_block) {
    constexpr auto kernel = small_seq_tiled_bwd_dkv_block_kernel<T, D>;
    constexpr int kThreads = kTiledBwdBlockThreads;
    const int64_t items =
        pairs * tiled_bwd_dkv_block_groups(p, tiled_bwd_block_tiles(kThreads, wave, D));
    hipLaunchKernelGGL(kernel, (tiled_bwd_grid<kernel>(items, 1, kThreads)), dim3(kThreads), 0,
                       stream, p);
  } else {
    hipLaunchKernelGGL((small_seq_tiled_bwd_dkv_kernel<T, D>),
                       (tiled_bwd_grid<small_seq_tiled_bwd_dkv_kernel<T, D>>(
                           tiled_bwd_dkv_items(p, slices), waves, threads)),
                       block, 0, stream, p);
  }
  hipError_t err = hipGetLastError();
  if (err != hipSuccess || !tiled_bwd_needs_dq_pass(p)) return err;
  if (use_block) {
    constexpr auto kernel = small_seq_tiled_bwd_dq_block_kernel<T, D>;
    constexpr int kThreads = kTiledBwdDqBlockThreads;
    const int64_t items =
        pairs * tiled_bwd_dq_block_groups(p, tiled_bwd_block_tiles(kThreads, wave, D));
    hipLaunchKernelGGL(kernel, (tiled_bwd_grid<kernel>(items, 1, kThreads)), dim3(kThreads), 0,
                       stream, p);
  } else {
    hipLaunchKernelGGL((small_seq_tiled_bwd_dq_kernel<T, D>),
                       (tiled_bwd_grid<small_seq_tiled_bwd_dq_kernel<T, D>>(
                           tiled_bwd_dq_items(p, slices), waves, threads)),
                       block, 0, stream, p);
  }
  return hipGetLastError();
}

template <typename T>
hipError_t run_tiled_bwd_dim(const SmallSeqTiledParams& p, int head_dim, hipStream_t stream) {
  switch (head_dim) {
    case 64: return run_tiled_bwd<T, 64>(p, stream);
    case 128: return run_tiled_bwd<T, 128>(p, stream);
    case 256: return run_tiled_bwd<T, 256>(p, stream);
    default: return hipErrorInvalidValue;  // callers validate first (small_seq_tiled_supports)
  }
}

}  // namespace
}  // namespace small_seq

hipError_t small_seq_tiled_bwd_launch(const SmallSeqTiledParams& p, SmallSeqTiledDtype dtype,
                                      int head_dim, hipStream_t stream) {
  if (!small_seq_tiled_supports(head_dim) || p.max_seqlen_kv > kSmallSeqTiledMaxSeqlenKv ||
      p.max_seqlen_q < 1 || p.max_seqlen_kv < 1)
    return hipErrorInvalidValue;
  return dtype == SmallSeqTiledDtype::kBFloat16
             ? small_seq::run_tiled_bwd_dim<ra_bf16>(p, head_dim, stream)
             : small_seq::run_tiled_bwd_dim<ra_fp16>(p, head_dim, stream);
}
