// Launch of one small-seq kernel variant. Included only by the generated instantiation files
// (tools/generate_kernels.py), one (direction, dtype, head dim, kv bucket) per file.
#pragma once

#include "bwd_kernel.h"
#include "dispatch.h"
#include "fwd_kernel.h"

namespace small_seq {

// 256 threads: 8 warps on NVIDIA, 4 wavefronts on CDNA; one (segment, kv head) per wave.
constexpr int kThreadsPerBlock = 256;

inline dim3 grid_for(const SmallSeqParams& p) {
  const int64_t waves_per_block = kThreadsPerBlock / ra_device_wave_size();
  const int64_t waves = static_cast<int64_t>(p.batch) * p.num_heads_kv;
  return dim3(static_cast<unsigned>((waves + waves_per_block - 1) / waves_per_block));
}

template <typename T, int D, int KV>
hipError_t run_fwd(const SmallSeqParams& p, hipStream_t stream) {
  if (p.batch == 0) return hipSuccess;
  hipLaunchKernelGGL((small_seq_fwd_kernel<T, D, KV>), grid_for(p), dim3(kThreadsPerBlock), 0,
                     stream, p);
  return hipGetLastError();
}

template <typename T, int D, int KV>
hipError_t run_bwd(const SmallSeqParams& p, hipStream_t stream) {
  if (p.batch == 0) return hipSuccess;
  hipLaunchKernelGGL((small_seq_bwd_kernel<T, D, KV>), grid_for(p), dim3(kThreadsPerBlock), 0,
                     stream, p);
  return hipGetLastError();
}

}  // namespace small_seq
