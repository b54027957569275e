// Launch of the tiled small-seq forward (tiled_fwd_kernel.h): dispatch over dtype x head dim,
// grid sized from occupancy. Six variants, one translation unit: the kernel has no kv bucket,
// so the variant count stays small and needs no generated instantiation files.
#include "../common/tuning.h"
#include "tiled_fwd_kernel.h"

namespace small_seq {
namespace {

// Blocks for the forward's items: at most `factor` x the blocks resident at once (occupancy
// API, cached per device and kernel), at least one; factor 0 = one wave per item.
template <typename T, int D>
dim3 tiled_fwd_grid(const SmallSeqTiledParams& p, int threads) {
  static int resident_per_mp[64] = {};
  const int64_t items = tiled_fwd_items(p, tiled_rows_for_wave(ra_device_wave_size()));
  int64_t blocks = (items + kTiledWavesPerBlock - 1) / kTiledWavesPerBlock;
  const int tuned = ra_tuning().small_seq_tiled_fwd_grid;
  const int factor = tuned >= 0 ? tuned : kTiledFwdResidencyFactor;
  if (factor > 0) {
    const int device = ra_device_index();
    if (device >= 0 && device < 64 && resident_per_mp[device] == 0) {
      int n = 0;
      if (hipOccupancyMaxActiveBlocksPerMultiprocessor(&n, small_seq_tiled_fwd_kernel<T, D>,
                                                       threads, 0) != hipSuccess ||
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

template <typename T, int D>
hipError_t run_tiled_fwd(const SmallSeqTiledParams& p, hipStream_t stream) {
  if (p.batch == 0 || p.num_heads_kv == 0) return hipSuccess;
  const dim3 block(kTiledWavesPerBlock * ra_device_wave_size());
  const dim3 grid = tiled_fwd_grid<T, D>(p, static_cast<int>(block.x));
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
