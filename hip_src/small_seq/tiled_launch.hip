// Launch of the tiled small-seq forward (tiled_fwd_kernel.h, tiled_fwd_resident_kernel.h):
// dispatch over dtype x head dim, the choice between the resident, block and wave kernels, grid
// sized from occupancy. Per dtype: three wave kernels (d 64, 128, 256), and block and resident
// kernels of 128 and 256 threads for d 64 and 128; one translation unit: the kernels have no kv
// bucket, so the variant count stays small and needs no generated instantiation files.
#include "../common/tuning.h"
#include "tiled_fwd_resident_kernel.h"

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

// The resident kernel where a (segment, kv head) has at least this many row tiles of 16 (fewer
// leave most of a block's waves idle: the wave kernel serves those) ...
constexpr int kTiledResidentMinTiles = 4;
// ... with blocks of four waves (64 rows on NVIDIA), several per multiprocessor, so that one
// stages its next segment while the others compute; where one block's K/V fill a
// multiprocessor's shared memory (long histories), eight warps on NVIDIA instead, so that the
// multiprocessor is not left with four (docs/kernels.md#tiled-small-seq-kernels) ...
constexpr int kTiledResidentWaves = 4;
// ... and its grid gives each resident block about this many work items, splitting the row
// tiles of a (segment, kv head) over several items when there are few segments.
constexpr int kTiledResidentItemsPerBlock = 4;
// Shared memory a block holds beyond its own (the runtime's reserve on NVIDIA), for the count
// of blocks that fit a multiprocessor.
constexpr int64_t kTiledSharedReserve = 1024;

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

template <typename T, int D, int THREADS>
hipError_t run_tiled_fwd_resident(const SmallSeqTiledParams& p, int wave, int64_t smem,
                                  hipStream_t stream) {
  const auto kernel = small_seq_tiled_fwd_resident_kernel<T, D, THREADS>;
  const int device = ra_device_index();
  const bool cached = device >= 0 && device < 64;
  // Above 48 KiB a kernel's dynamic shared memory must be allowed first (NVIDIA): once per
  // device, to the device's limit.
  static int raised[64] = {};
  if (smem > 48 * 1024 && !(cached && raised[device])) {
    const hipError_t err =
        hipFuncSetAttribute(reinterpret_cast<const void*>(kernel),
                            hipFuncAttributeMaxDynamicSharedMemorySize,
                            ra_device_max_shared_per_block());
    if (err != hipSuccess) return err;
    if (cached) raised[device] = 1;
  }
  // Resident blocks per multiprocessor at this shared-memory size (recomputed when it changes:
  // serving repeats one shape).
  static int64_t last_smem[64] = {};
  static int last_blocks[64] = {};
  int per_mp = cached && last_smem[device] == smem ? last_blocks[device] : 0;
  if (per_mp == 0) {
    if (hipOccupancyMaxActiveBlocksPerMultiprocessor(&per_mp, kernel, THREADS,
                                                     static_cast<size_t>(smem)) != hipSuccess ||
        per_mp <= 0) {
      (void)hipGetLastError();  // not left for the launch check to report
      per_mp = 1;
    }
    if (cached) {
      last_smem[device] = smem;
      last_blocks[device] = per_mp;
    }
  }
  const int64_t resident = static_cast<int64_t>(per_mp) * ra_device_multiprocessors();
  const int64_t pairs = static_cast<int64_t>(p.batch) * p.num_heads_kv;
  const int64_t tiles = tiled_row_tiles(p, kTiledResidentRows);
  const int waves = THREADS / wave;
  // Every split keeps each wave busy with at least one tile.
  const int64_t max_splits = tiles / waves > 1 ? tiles / waves : 1;
  int64_t splits = (kTiledResidentItemsPerBlock * resident + pairs - 1) / pairs;
  splits = splits < 1 ? 1 : (splits > max_splits ? max_splits : splits);
  const int64_t items = pairs * splits;
  const int tuned = ra_tuning().small_seq_tiled_fwd_grid;
  const int factor = tuned >= 0 ? tuned : kTiledFwdResidencyFactor;
  int64_t blocks = items;
  if (factor > 0 && blocks > resident * factor) blocks = resident * factor;
  hipLaunchKernelGGL((small_seq_tiled_fwd_resident_kernel<T, D, THREADS>),
                     dim3(static_cast<unsigned>(blocks > 0 ? blocks : 1)), dim3(THREADS),
                     static_cast<size_t>(smem), stream, p, static_cast<int>(splits));
  return hipGetLastError();
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
  return threads == 128 ? run_tiled_fwd_resident<T, D, 128>(p, wave, kv_smem, stream)
                        : run_tiled_fwd_resident<T, D, 256>(p, wave, kv_smem, stream);
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
    int64_t kv_smem = 0;
    if (tiled_use_resident<D>(p, &kv_smem))
      return run_tiled_fwd_resident_for<T, D>(p, wave, kv_smem, stream);
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
