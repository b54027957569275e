// Launch of the tiled small-seq forward (tiled_fwd_kernel.h, tiled_fwd_resident_kernel.h,
// tiled_fwd_warpgroup_kernel.h): dispatch over dtype x head dim, the choice between the
// warpgroup-MMA (Hopper), resident, block and wave kernels, grid sized from occupancy. Per
// dtype: three wave kernels (d 64, 128, 256), block kernels of 64, 128 and 256 threads for d 64
// and 128 (twice in CUDA builds: staged through registers and by cp.async), resident kernels of
// 128 and 256 threads and key steps of 16 and 64 for d 64 and 128, and warpgroup kernels of
// one and two warpgroups and key steps of 16 and 64 for d 64 and 128 (CUDA sm_90a builds add
// their tile-copy instances, and at d 128 the streaming instance and the warp-specialized
// kernel, tiled_fwd_warpgroup_ws_kernel.h); one translation unit: the
// kernels have no kv bucket, so the variant count stays small and needs no generated
// instantiation files.
#include "../common/tuning.h"
#include "tiled_fwd_warpgroup_kernel.h"
#include "tiled_fwd_warpgroup_tma_kernel.h"
#include "tiled_fwd_warpgroup_ws_kernel.h"
#include "tiled_launch_util.h"

namespace small_seq {
namespace {

// Grid of the tiled forward kernels: this many times the blocks resident at once (tuning
// small_seq_tiled_fwd_grid; 0 = one block per block of work).
inline int tiled_grid_factor() {
  const int tuned = ra_tuning().small_seq_tiled_fwd_grid;
  return tuned >= 0 ? tuned : kTiledFwdResidencyFactor;
}

// Blocks for `items` work items of `items_per_block` each (no dynamic shared memory).
template <typename Kernel>
dim3 tiled_grid(Kernel kernel, int64_t items, int items_per_block, int threads,
                TiledOccupancyCache& cache) {
  const int64_t blocks = (items + items_per_block - 1) / items_per_block;
  const int factor = tiled_grid_factor();
  if (factor <= 0) return tiled_capped_grid(blocks, 0, 0);
  const int64_t resident =
      static_cast<int64_t>(tiled_blocks_per_mp(kernel, threads, 0, cache)) *
      ra_device_multiprocessors();
  return tiled_capped_grid(blocks, resident, factor);
}

// The block kernel (K/V staged in shared memory for the block's row tiles) where a (segment,
// kv head) may have more than one key tile and at least half a block of rows: below that its
// waves would mostly idle at the barriers, and one key tile is served from registers anyway.
// Blocks of `threads` (tuning small_seq_tiled_block_threads, 256 by default).
inline bool tiled_use_block(const SmallSeqTiledParams& p, int head_dim, int wave, int threads) {
  const int mode = ra_tuning().small_seq_tiled_block;
  if (mode <= 0 || head_dim > 128) return false;
  if (mode >= 2) return true;
  const int block_rows = (threads / wave) * tiled_rows_for_wave(wave);
  return p.max_seqlen_kv > kTiledKeys && 2 * tiled_max_rows(p) >= block_rows;
}

// Whether the block kernel copies its key tiles by cp.async (CUDA builds, tuning
// small_seq_tiled_block_cp_async; HIP builds stage through registers).
inline bool tiled_block_stages_by_cp_async() {
#if RA_CP_ASYNC_BUILD
  return ra_tuning().small_seq_tiled_block_cp_async > 0;
#else
  return false;
#endif
}

inline int tiled_small_block_min_keys() {
  const int tuned = ra_tuning().small_seq_tiled_small_block_keys;
  if (tuned > 0) return tuned;
  return tiled_block_stages_by_cp_async() ? kTiledKeys : kTiledSmallBlockMinKeys;
}

// Threads of a block kernel block whose waves together hold the rows of a (segment, kv head)
// (max_seqlen_q x group): the fewest waves, at least two, below 256 threads; 0 where the call
// does not take such a block (few keys; rows that one wave's tile holds, which reads the
// history once anyway; or rows for a default block).
inline int tiled_small_block_threads(const SmallSeqTiledParams& p, int wave) {
  if (ra_tuning().small_seq_tiled_block != 1 || p.max_seqlen_kv <= tiled_small_block_min_keys())
    return 0;
  const int64_t rows = tiled_max_rows(p);
  if (rows <= tiled_rows_for_wave(wave)) return 0;
  for (int threads = 2 * wave; threads < 256; threads *= 2)
    if (static_cast<int64_t>(threads / wave) * tiled_rows_for_wave(wave) >= rows) return threads;
  return 0;
}

// Threads per block of the block kernel for this call (d <= 128), 0 where it does not take the
// block kernel: the default blocks (tuning small_seq_tiled_block_threads: 64, 128 or 256)
// where tiled_use_block says so, else the small blocks of tiled_small_block_threads.
inline int tiled_block_threads(const SmallSeqTiledParams& p, int head_dim, int wave) {
  const int tuned = ra_tuning().small_seq_tiled_block_threads;
  const int threads = tuned == 64 || tuned == 128 ? tuned : 256;
  return tiled_use_block(p, head_dim, wave, threads) ? threads
                                                     : tiled_small_block_threads(p, wave);
}

// Whether the resident kernel serves the call: d <= 128, enough rows per (segment, kv head),
// and K/V of max_seqlen_kv keys within the device's shared memory per block (their bytes in
// *kv_smem).
template <int D>
bool tiled_use_resident(const SmallSeqTiledParams& p, int64_t* kv_smem) {
  const int mode = ra_tuning().small_seq_tiled_resident;
  if (mode <= 0 || D > 128) return false;
  *kv_smem = tiled_resident_smem_bytes<D>(p.max_seqlen_kv);
  if (*kv_smem > ra_device_max_shared_per_block()) return false;
  return mode >= 2 || tiled_row_tiles(p, kTiledResidentRows) >= kTiledResidentMinTiles;
}

// Splits per (segment, kv head) of the kernels that stage a segment's K/V per work item
// (resident, warpgroup): enough for about kTiledResidentItemsPerBlock items per resident block
// when there are few segments, while every split keeps each of a block's `workers` (waves or
// warpgroups) busy with at least one of the segment's `tiles` row tiles.
inline int64_t tiled_splits(const SmallSeqTiledParams& p, int64_t tiles, int workers,
                            int64_t resident) {
  const int64_t pairs = static_cast<int64_t>(p.batch) * p.num_heads_kv;
  const int64_t max_splits = tiles / workers > 1 ? tiles / workers : 1;
  const int64_t splits = (kTiledResidentItemsPerBlock * resident + pairs - 1) / pairs;
  return splits < 1 ? 1 : (splits > max_splits ? max_splits : splits);
}

// Launches a kernel that stages a (segment, kv head)'s K/V per work item (resident, warpgroup)
// with `smem` bytes of shared memory (arguments p, splits, then `extra`): as many blocks as stay
// resident (capped by tiled_capped_grid), each (segment, kv head) split over tiled_splits items
// of row tiles of `tile_rows` among the block's `workers` (waves or warpgroups), or with
// TILE_ITEMS into one item per row tile (the warpgroup kernel's streaming instance).
template <auto KERNEL, int THREADS, bool TILE_ITEMS = false, typename... Extra>
hipError_t run_tiled_fwd_staged(const SmallSeqTiledParams& p, int64_t smem, int tile_rows,
                                int workers, hipStream_t stream, const Extra&... extra) {
  const hipError_t err = tiled_allow_shared<KERNEL>(smem);
  if (err != hipSuccess) return err;
  static TiledOccupancyCache occupancy;
  const int64_t resident =
      static_cast<int64_t>(tiled_blocks_per_mp(KERNEL, THREADS, smem, occupancy)) *
      ra_device_multiprocessors();
  const int64_t pairs = static_cast<int64_t>(p.batch) * p.num_heads_kv;
  const int64_t tiles = tiled_row_tiles(p, tile_rows);
  const int64_t splits = TILE_ITEMS ? tiles : tiled_splits(p, tiles, workers, resident);
  const dim3 grid = tiled_capped_grid(pairs * splits, resident, tiled_grid_factor());
  hipLaunchKernelGGL(KERNEL, grid, dim3(THREADS), static_cast<size_t>(smem), stream, p,
                     static_cast<int>(splits), extra...);
  return hipGetLastError();
}

template <typename T, int D, int THREADS, int KSTEP>
hipError_t run_tiled_fwd_resident(const SmallSeqTiledParams& p, int wave, int64_t smem,
                                  hipStream_t stream) {
  return run_tiled_fwd_staged<small_seq_tiled_fwd_resident_kernel<T, D, THREADS, KSTEP>,
                              THREADS>(p, smem, kTiledResidentRows, THREADS / wave, stream);
}

// Keys per online-softmax step of the resident kernel: four key tiles (64 keys) where histories
// may reach that many, so that a step keeps four independent matrix chains in flight; one tile
// for shorter ones, whose extra tiles would be skipped work holding registers (two blocks per
// multiprocessor instead of three at d = 128; docs/kernels.md#tiled-small-seq-kernels). Tuning
// small_seq_tiled_resident_key_step (16 or 64) overrides.
inline int tiled_resident_key_step(const SmallSeqTiledParams& p) {
  const int tuned = ra_tuning().small_seq_tiled_resident_key_step;
  if (tuned == kTiledKeys || tuned == 4 * kTiledKeys) return tuned;
  return p.max_seqlen_kv >= 4 * kTiledKeys ? 4 * kTiledKeys : kTiledKeys;
}

// Block size of the resident kernel for K/V of kv_smem bytes (see kTiledResidentWaves; tuning
// small_seq_tiled_resident_threads overrides).
template <typename T, int D>
hipError_t run_tiled_fwd_resident_for(const SmallSeqTiledParams& p, int wave, int64_t kv_smem,
                                      hipStream_t stream) {
  const int tuned = ra_tuning().small_seq_tiled_resident_threads;
  int threads = kTiledResidentWaves * wave;
  if (wave == 32 && 2 * (kv_smem + kTiledSharedReserve) > ra_device_shared_per_multiprocessor())
    threads = 256;
  if (tuned == 128 || tuned == 256) threads = tuned;
  if (tiled_resident_key_step(p) == kTiledKeys)
    return threads == 128 ? run_tiled_fwd_resident<T, D, 128, 1>(p, wave, kv_smem, stream)
                          : run_tiled_fwd_resident<T, D, 256, 1>(p, wave, kv_smem, stream);
  return threads == 128 ? run_tiled_fwd_resident<T, D, 128, 4>(p, wave, kv_smem, stream)
                        : run_tiled_fwd_resident<T, D, 256, 4>(p, wave, kv_smem, stream);
}

// The warpgroup-MMA kernel (Hopper, sm_90a builds) where a (segment, kv head) may fill at least
// one 64-row tile (fewer rows leave most of each product empty: the resident and wave kernels
// serve those), d 64 / 128, no probabilities asked for, and K / V of max_seqlen_kv keys plus
// the Q buffers within a block's shared memory. Histories of at most 16 keys take its 16-key
// softmax steps (tiled_warpgroup_step_keys). Tuning small_seq_tiled_warpgroup 0 turns it off,
// 2 takes it wherever it can serve (any rows per kv head).
template <int D>
bool tiled_use_warpgroup(const SmallSeqTiledParams& p) {
  const int mode = ra_tuning().small_seq_tiled_warpgroup;
  if (mode <= 0 || (D != 64 && D != 128) || p.probs != nullptr || !ra_device_warpgroup_mma())
    return false;
  if (tiled_warpgroup_smem_bytes<D>(p.max_seqlen_kv, 1) > ra_device_max_shared_per_block())
    return false;
  return mode >= 2 || tiled_max_rows(p) >= kTiledWarpgroupRows;
}

// Shared memory of a one-warpgroup block of the warpgroup-MMA kernel staging the whole history
// (with the per-block reserve), and whether such a block would be alone on its multiprocessor.
template <int D>
int64_t tiled_warpgroup_one_block_smem(const SmallSeqTiledParams& p) {
  return tiled_warpgroup_smem_bytes<D>(p.max_seqlen_kv, 1) + kTiledSharedReserve;
}
template <int D>
bool tiled_warpgroup_staged_alone(const SmallSeqTiledParams& p) {
  return 2 * tiled_warpgroup_one_block_smem<D>(p) > ra_device_shared_per_multiprocessor();
}

// Warpgroups per block of the warpgroup-MMA kernel: one where at least two such blocks fit a
// multiprocessor's shared memory (histories up to 64 keys at d = 128: three blocks, whose
// loads and products overlap each other's softmax and staging), else two sharing one copy of
// K / V (one block per multiprocessor; one warpgroup alone there leaves the matrix unit idle
// through every softmax: 1.4-1.6x slower on 256-key rows). Tuning small_seq_tiled_warpgroups
// (1 or 2) overrides where the shared memory allows.
template <int D>
int tiled_warpgroups(const SmallSeqTiledParams& p) {
  const int64_t two = tiled_warpgroup_smem_bytes<D>(p.max_seqlen_kv, 2);
  const bool two_fit = two <= ra_device_max_shared_per_block();
  const int tuned = ra_tuning().small_seq_tiled_warpgroups;
  if (tuned == 1 || !two_fit) return 1;
  if (tuned == 2) return 2;
  return tiled_warpgroup_staged_alone<D>(p) ? 2 : 1;
}

template <typename T, int D, int WARPGROUPS, int KEYS, bool CAPPED = true>
hipError_t run_tiled_fwd_warpgroup(const SmallSeqTiledParams& p, hipStream_t stream) {
  return run_tiled_fwd_staged<
      small_seq_tiled_fwd_warpgroup_kernel<T, D, WARPGROUPS, KEYS, CAPPED>, WARPGROUPS * 128>(
      p, tiled_warpgroup_smem_bytes<D>(p.max_seqlen_kv, WARPGROUPS), kTiledWarpgroupRows,
      WARPGROUPS, stream);
}

#if RA_TMA_BUILD
// Tensor maps of a call for the tile-copy kernels (q / out: tiled_tma_q_map; k / v boxes of one
// step's KEYS keys); false where TMA cannot describe one of them.
template <int D, int KEYS>
bool tiled_tma_maps(const SmallSeqTiledParams& p, TiledTmaMaps* maps) {
  // THD k / v are one batch of all rows, BSHD ones [b, s_kv, h_kv, d].
  const int64_t kv_batch = p.cu_seqlens_kv != nullptr ? 1 : p.batch;
  return tiled_tma_q_map(&maps->q, p, p.q, D, p.q_batch_stride, p.q_token_stride,
                         p.q_head_stride) &&
         tiled_tma_q_map(&maps->o, p, p.o, D, p.o_batch_stride, p.o_token_stride,
                         p.o_head_stride) &&
         ra_tma_map_16bit(&maps->k, p.k, kv_batch, p.total_kv, p.num_heads_kv, D,
                          p.k_batch_stride, p.k_token_stride, p.k_head_stride, 1, KEYS) &&
         ra_tma_map_16bit(&maps->v, p.v, kv_batch, p.total_kv, p.num_heads_kv, D,
                          p.v_batch_stride, p.v_token_stride, p.v_head_stride, 1, KEYS);
}

// The warpgroup kernel staged by tile copies (tiled_fwd_warpgroup_tma_kernel.h), where tuning
// allows, the GQA group divides a 64-row tile (a Q box holds whole tokens) and q, k, v and out
// have tensor maps (16-byte aligned addresses and strides); false (nothing launched) where not.
// STREAM: the kernel's streaming instance (one warpgroup, 64-key steps, one row tile per item).
template <typename T, int D, int WARPGROUPS, int KEYS, bool CAPPED, bool STREAM = false>
bool run_tiled_fwd_warpgroup_tma(const SmallSeqTiledParams& p, hipStream_t stream,
                                 hipError_t* err) {
  const int group = p.num_heads_q / p.num_heads_kv;
  if (ra_tuning().small_seq_tiled_warpgroup_tma <= 0 || kTiledWarpgroupRows % group != 0)
    return false;
  const int64_t smem = STREAM ? tiled_stream_smem_bytes<D>()
                              : tiled_warpgroup_smem_bytes<D>(p.max_seqlen_kv, WARPGROUPS);
  if ((!STREAM && tiled_warpgroup_keys(p.max_seqlen_kv) / KEYS > kTiledTmaMaxSteps) ||
      smem + tiled_tma_static_bytes(WARPGROUPS) > ra_device_max_shared_per_block())
    return false;
  TiledTmaMaps maps;
  if (!tiled_tma_maps<D, KEYS>(p, &maps)) return false;
  if constexpr (STREAM) {
    *err = run_tiled_fwd_staged<
        small_seq_tiled_fwd_warpgroup_tma_kernel<T, D, 1, KEYS, false, false, true>, 128, true>(
        p, smem, kTiledWarpgroupRows, 1, stream, maps);
    return true;
  }
  // tiles in pairs where a warpgroup may hold two tiles of an item (kTiledWarpgroupPair)
  if constexpr (kTiledWarpgroupPair<WARPGROUPS, KEYS>) {
    if (tiled_max_rows(p) > static_cast<int64_t>(WARPGROUPS) * kTiledWarpgroupRows) {
      *err = run_tiled_fwd_staged<
          small_seq_tiled_fwd_warpgroup_tma_kernel<T, D, WARPGROUPS, KEYS, CAPPED, true>,
          WARPGROUPS * 128>(p, smem, kTiledWarpgroupRows, WARPGROUPS, stream, maps);
      return true;
    }
  }
  *err = run_tiled_fwd_staged<
      small_seq_tiled_fwd_warpgroup_tma_kernel<T, D, WARPGROUPS, KEYS, CAPPED>, WARPGROUPS * 128>(
      p, smem, kTiledWarpgroupRows, WARPGROUPS, stream, maps);
  return true;
}
#endif

#if RA_TMA_BUILD
// Whether a call of 64-key steps at d 128 takes the tile-copy kernel's streaming instance
// (tuning small_seq_tiled_warpgroup_stream): by default for one row tile per (segment, kv head)
// where a block staging the whole history would be alone on its multiprocessor
// (tiled_warpgroup_staged_alone: past 128 keys, up to the 384 a block can stage; two warpgroups
// would split the history, or from 321 keys one would hold it). Two row tiles stay with the
// staged history (both warpgroups read one copy of it; streamed, each tile's block reads it
// again: 0.80x on 4096 x 128 x 256 with 8 kv heads), as do more
// (docs/kernels.md#warpgroup-kernel).
template <int D>
bool tiled_warpgroup_streams(const SmallSeqTiledParams& p) {
  const int mode = ra_tuning().small_seq_tiled_warpgroup_stream;
  if (mode <= 0) return false;
  return mode >= 2 ||
         (tiled_warpgroup_staged_alone<D>(p) && tiled_max_rows(p) <= kTiledWarpgroupRows);
}

// Whether a call of 64-key steps at d 128 takes the warp-specialized kernel
// (tiled_fwd_warpgroup_ws_kernel.h; tuning small_seq_tiled_warpgroup_ws): by default where the
// tile-copy kernel would run blocks of two warpgroups staging the whole history (`two`:
// tiled_warpgroups, which the caller has) and a (segment, kv head) may hold more than one row
// tile, over at most 256 keys (its ring); 2 takes every call of at most 256 keys (tests, A/B
// runs).
inline bool tiled_warpgroup_ws(const SmallSeqTiledParams& p, bool two) {
  const int mode = ra_tuning().small_seq_tiled_warpgroup_ws;
  if (mode <= 0 || p.max_seqlen_kv > kTiledWsRingKeys) return false;
  return mode >= 2 || (two && tiled_max_rows(p) > kTiledWarpgroupRows);
}

// The warp-specialized kernel where tuning allows the tile copies, the GQA group divides a
// 64-row tile and the tensors have tile-copy layouts; false (nothing launched) where not.
template <typename T, int D>
bool run_tiled_fwd_warpgroup_ws(const SmallSeqTiledParams& p, hipStream_t stream,
                                hipError_t* err) {
  const int group = p.num_heads_q / p.num_heads_kv;
  if (ra_tuning().small_seq_tiled_warpgroup_tma <= 0 || kTiledWarpgroupRows % group != 0)
    return false;
  const int64_t smem = tiled_ws_smem_bytes<D>();
  if (smem + kTiledSharedReserve > ra_device_max_shared_per_block()) return false;
  TiledTmaMaps maps;
  if (!tiled_tma_maps<D, kTiledWarpgroupKeys>(p, &maps)) return false;
  *err = run_tiled_fwd_staged<small_seq_tiled_fwd_warpgroup_ws_kernel<T, D>, kTiledWsThreads>(
      p, smem, kTiledWarpgroupRows, kTiledWsComputeWarpgroups, stream, maps);
  return true;
}
#endif

// The warpgroup kernel: staged by tile copies where it can be (CUDA sm_90a builds), else by
// cp.async. 16-key steps take tile copies only where a (segment, kv head) has one row tile:
// there they are 1.05-1.07x faster (an item is then one short chain of copy, step and store),
// over more tiles 0.98-0.99x (H100, docs/kernels.md#warpgroup-kernel).
template <typename T, int D, int WARPGROUPS, int KEYS, bool CAPPED = true>
hipError_t run_tiled_fwd_warpgroup_any(const SmallSeqTiledParams& p, hipStream_t stream) {
#if RA_TMA_BUILD
  hipError_t err = hipSuccess;
  if ((KEYS == kTiledWarpgroupKeys || tiled_max_rows(p) <= kTiledWarpgroupRows) &&
      run_tiled_fwd_warpgroup_tma<T, D, WARPGROUPS, KEYS, CAPPED>(p, stream, &err))
    return err;
#endif
  return run_tiled_fwd_warpgroup<T, D, WARPGROUPS, KEYS, CAPPED>(p, stream);
}

template <typename T, int D, int THREADS, bool CP_ASYNC>
hipError_t run_tiled_fwd_block(const SmallSeqTiledParams& p, int wave, hipStream_t stream) {
  static TiledOccupancyCache occupancy;
  const int waves = THREADS / wave;
  const int64_t items = static_cast<int64_t>(p.batch) * p.num_heads_kv *
                        ((tiled_row_tiles(p, tiled_rows_for_wave(wave)) + waves - 1) / waves);
  const dim3 grid =
      tiled_grid(small_seq_tiled_fwd_block_kernel<T, D, THREADS, CP_ASYNC>, items, 1, THREADS,
                 occupancy);
  hipLaunchKernelGGL((small_seq_tiled_fwd_block_kernel<T, D, THREADS, CP_ASYNC>), grid,
                     dim3(THREADS), 0, stream, p);
  return hipGetLastError();
}

// The block kernel with its key tiles staged by cp.async (a ring of several tiles in flight,
// none in registers) in CUDA builds unless tuning small_seq_tiled_block_cp_async is 0; HIP
// builds stage them through registers.
template <typename T, int D, int THREADS>
hipError_t run_tiled_fwd_block_any(const SmallSeqTiledParams& p, int wave, hipStream_t stream) {
#if RA_CP_ASYNC_BUILD
  if (tiled_block_stages_by_cp_async())
    return run_tiled_fwd_block<T, D, THREADS, true>(p, wave, stream);
#endif
  return run_tiled_fwd_block<T, D, THREADS, false>(p, wave, stream);
}

// The wave kernel; ONE_TILE: its instance for histories of one key tile (the caller checks
// max_seqlen_kv <= kTiledKeys).
template <typename T, int D, bool ONE_TILE>
hipError_t run_tiled_fwd_wave(const SmallSeqTiledParams& p, int wave, hipStream_t stream) {
  static TiledOccupancyCache occupancy;
  const dim3 block(kTiledWavesPerBlock * wave);
  const dim3 grid = tiled_grid(small_seq_tiled_fwd_kernel<T, D, ONE_TILE>,
                               tiled_fwd_items(p, tiled_rows_for_wave(wave)), kTiledWavesPerBlock,
                               static_cast<int>(block.x), occupancy);
  hipLaunchKernelGGL((small_seq_tiled_fwd_kernel<T, D, ONE_TILE>), grid, block, 0, stream, p);
  return hipGetLastError();
}

template <typename T, int D>
hipError_t run_tiled_fwd(const SmallSeqTiledParams& p, hipStream_t stream) {
  if (p.batch == 0 || p.num_heads_kv == 0) return hipSuccess;
  const int wave = ra_device_wave_size();
  if constexpr (D <= 128) {
    if (tiled_use_warpgroup<D>(p)) {
      const bool one = tiled_warpgroups<D>(p) == 1;
      if (tiled_warpgroup_step_keys(p.max_seqlen_kv) == 16)
        return one ? run_tiled_fwd_warpgroup_any<T, D, 1, 16>(p, stream)
                   : run_tiled_fwd_warpgroup_any<T, D, 2, 16>(p, stream);
#if RA_TMA_BUILD
      if constexpr (D == 128) {
        hipError_t err = hipSuccess;
        if (tiled_warpgroup_streams<D>(p) &&
            run_tiled_fwd_warpgroup_tma<T, D, 1, 64, false, true>(p, stream, &err))
          return err;
        if (tiled_warpgroup_ws(p, !one) && run_tiled_fwd_warpgroup_ws<T, D>(p, stream, &err))
          return err;
      }
#endif
      if (!one) return run_tiled_fwd_warpgroup_any<T, D, 2, 64>(p, stream);
      // One-warpgroup blocks of 64-key steps: the register cap for three blocks only where
      // three fit the shared memory (the kernel's NOTE).
      return 3 * tiled_warpgroup_one_block_smem<D>(p) <= ra_device_shared_per_multiprocessor()
                 ? run_tiled_fwd_warpgroup_any<T, D, 1, 64, true>(p, stream)
                 : run_tiled_fwd_warpgroup_any<T, D, 1, 64, false>(p, stream);
    }
    int64_t kv_smem = 0;
    if (tiled_use_resident<D>(p, &kv_smem))
      return run_tiled_fwd_resident_for<T, D>(p, wave, kv_smem, stream);
    switch (tiled_block_threads(p, D, wave)) {
      case 64: return run_tiled_fwd_block_any<T, D, 64>(p, wave, stream);
      case 128: return run_tiled_fwd_block_any<T, D, 128>(p, wave, stream);
      case 256: return run_tiled_fwd_block_any<T, D, 256>(p, wave, stream);
      default: break;  // the wave kernel
    }
    if (p.max_seqlen_kv <= kTiledKeys && ra_tuning().small_seq_tiled_one_tile != 0)
      return run_tiled_fwd_wave<T, D, true>(p, wave, stream);
  }
  return run_tiled_fwd_wave<T, D, false>(p, wave, stream);
}

template <typename T>
hipError_t run_tiled_fwd_dim(const SmallSeqTiledParams& p, int head_dim, hipStream_t stream) {
  switch (head_dim) {
    case 64: return run_tiled_fwd<T, 64>(p, stream);
    case 128: return run_tiled_fwd<T, 128>(p, stream);
    case 256: return run_tiled_fwd<T, 256>(p, stream);
    default: return hipErrorInvalidValue;  // callers validate first (small_seq_tiled_supports)
  }
}

}  // namespace
}  // namespace small_seq

hipError_t small_seq_tiled_fwd_launch(const SmallSeqTiledParams& p, SmallSeqTiledDtype dtype,
                                      int head_dim, hipStream_t stream) {
  if (!small_seq_tiled_supports(head_dim) || p.max_seqlen_kv > kSmallSeqTiledMaxSeqlenKv ||
      p.max_seqlen_q < 1 || p.max_seqlen_kv < 1)
    return hipErrorInvalidValue;
  return dtype == SmallSeqTiledDtype::kBFloat16
             ? small_seq::run_tiled_fwd_dim<ra_bf16>(p, head_dim, stream)
             : small_seq::run_tiled_fwd_dim<ra_fp16>(p, head_dim, stream);
}
