// Launch of one small-seq kernel variant. Included only by the generated instantiation files
// (tools/generate_kernels.py), one (direction, dtype, head dim, kv bucket) per file.
#pragma once

#include "bwd_kernel.h"
#include "dispatch.h"
#include "fwd_kernel.h"

namespace small_seq {

// One (segment, kv head) per wave, kWavesPerBlock waves per block.
inline dim3 block_for() { return dim3(kWavesPerBlock * ra_device_wave_size()); }

inline dim3 grid_for(const SmallSeqParams& p) {
  const int64_t waves = static_cast<int64_t>(p.batch) * p.num_heads_kv;
  return dim3(static_cast<unsigned>((waves + kWavesPerBlock - 1) / kWavesPerBlock));
}

template <typename T, int D, int KV>
hipError_t run_fwd(const SmallSeqParams& p, hipStream_t stream) {
  if (p.batch == 0) return hipSuccess;
  hipLaunchKernelGGL((small_seq_fwd_kernel<T, D, KV>), grid_for(p), block_for(), 0,
                     stream, p);
  return hipGetLastError();
}

template <typename T, int D, int KV>
hipError_t run_bwd(const SmallSeqParams& p, hipStream_t stream) {
  if (p.batch == 0) return hipSuccess;
  hipLaunchKernelGGL((small_seq_bwd_kernel<T, D, KV>), grid_for(p), block_for(), 0,
                     stream, p);
  return hipGetLastError();
}

}  // namespace small_seq
