// Launch of the tiled small-seq forward (tiled_fwd_kernel.h): dispatch over dtype x head dim,
// the choice between the wave kernel and the block kernel, grid sized from occupancy. Six
// variants (plus four block kernels), one translation unit: the kernels have no kv bucket, so
// the variant count stays small and needs no generated instantiation files.
#include "../common/tuning.h"
#include "tiled_fwd_kernel.h"

namespace small_seq {
namespace {

// Blocks for `items` work items of `items_per_block` each: at most `factor` x the blocks
// resident at once (occupancy API, cached per device in the caller's `resident_per_mp`, one
// cache per kernel), at least one; factor 0 = one block per items_per_block items.
template <typename Kernel>
dim3 tiled_grid(Kernel kernel, int64_t items, int items_per_block, int threads,
                int (&resident_per_mp)[64]) {
  int64_t blocks = (items + items_per_block - 1) / items_per_block;
  const int tuned = ra_tuning().small_seq_tiled_fwd_grid;
  const int factor = tuned >= 0 ? tuned : kTiledFwdResidencyFactor;
  if (factor > 0) {
    const int device = ra_device_index();
    if (device >= 0 && device < 64 && resident_per_mp[device] == 0) {
      int n = 0;
      if (hipOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, threads, 0) != hipSuccess ||
          n <= 0) {
        (void)hipGetLastError();  // not left for the launch check to report
        n = 1;
      }
      resident_per_mp[device] = n;
    }
    const int per_mp = device >= 0 && device < 64 ? resident_per_mp[device] : 1;
    const int64_t cap = static_cast<int64_t>(per_mp) * ra_device_multiprocessors() * factor;
    blocks = blocks < cap ? blocks : cap;
  }
  return dim3(static_cast<unsigned>(blocks > 0 ? blocks : 1));
}

// The block kernel (K/V staged in shared memory for the block's row tiles) where a (segment,
// kv head) may have more than one key tile and at least half a block of rows: below that its
// waves would mostly idle at the barriers, and one key tile is served from registers anyway.
inline bool tiled_use_block(const SmallSeqTiledParams& p, int head_dim, int wave, int threads) {
  const int mode = ra_tuning().small_seq_tiled_block;
  if (mode <= 0 || head_dim > 128) return false;
  if (mode >= 2) return true;
  const int64_t rows = static_cast<int64_t>(p.max_seqlen_q) * (p.num_heads_q / p.num_heads_kv);
  const int block_rows = (threads / wave) * tiled_rows_for_wave(wave);
  return p.max_seqlen_kv > kTiledKeys && 2 * rows >= block_rows;
}

template <typename T, int D, int THREADS>
hipError_t run_tiled_fwd_block(const SmallSeqTiledParams& p, int wave, hipStream_t stream) {
  static int resident_block[64] = {};
  const int waves = THREADS / wave;
  const int64_t items = static_cast<int64_t>(p.batch) * p.num_heads_kv *
                        ((tiled_row_tiles(p, tiled_rows_for_wave(wave)) + waves - 1) / waves);
  const dim3 grid =
      tiled_grid(small_seq_tiled_fwd_block_kernel<T, D, THREADS>, items, 1, THREADS,
                 resident_block);
  hipLaunchKernelGGL((small_seq_tiled_fwd_block_kernel<T, D, THREADS>), grid, dim3(THREADS), 0,
                     stream, p);
  return hipGetLastError();
}

template <typename T, int D>
hipError_t run_tiled_fwd(const SmallSeqTiledParams& p, hipStream_t stream) {
  if (p.batch == 0 || p.num_heads_kv == 0) return hipSuccess;
  const int wave = ra_device_wave_size();
  const int rows = tiled_rows_for_wave(wave);
  if constexpr (D <= 128) {
    const int threads = ra_tuning().small_seq_tiled_block_threads == 128 ? 128 : 256;
    if (tiled_use_block(p, D, wave, threads))
      return threads == 128 ? run_tiled_fwd_block<T, D, 128>(p, wave, stream)
                            : run_tiled_fwd_block<T, D, 256>(p, wave, stream);
  }
  static int resident[64] = {};
  const dim3 block(kTiledWavesPerBlock * wave);
  const dim3 grid = tiled_grid(small_seq_tiled_fwd_kernel<T, D>, tiled_fwd_items(p, rows),
                               kTiledWavesPerBlock, static_cast<int>(block.x), resident);
  hipLaunchKernelGGL((small_seq_tiled_fwd_kernel<T, D>), grid, block, 0, stream, p);
  return hipGetLastError();
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
