// ra_launch: the kernel launch of every launcher that opts into overlapped launches.
//
// On CUDA devices of compute capability 9.0 and up (ra_device_overlapped_launch) the kernel is
// launched with programmatic stream serialization: it may start while the kernel before it in
// the stream drains, which hides the launch and ramp-up of short kernels (the THD helpers of a
// context-parallel step run 5-20 us each). Kernels launched this way call
// ra_wait_for_prior_kernel() before touching global memory (compat.h). Elsewhere (HIP, older
// GPUs, ROCM_ATTN_PDL=0) it is a plain launch.
#pragma once

#include <utility>

#include "compat.h"

template <typename... Params, typename... Args>
hipError_t ra_launch(void (*kernel)(Params...), dim3 grid, dim3 block, hipStream_t stream,
                     Args&&... args) {
#if !defined(__HIP__)
  if (ra_device_overlapped_launch()) {
    cudaLaunchAttribute attribute[1];
    attribute[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attribute[0].val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t config = {};
    config.gridDim = grid;
    config.blockDim = block;
    config.dynamicSmemBytes = 0;
    config.stream = stream;
    config.attrs = attribute;
    config.numAttrs = 1;
    return cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);
  }
#endif
  hipLaunchKernelGGL(kernel, grid, block, 0, stream, std::forward<Args>(args)...);
  return hipGetLastError();
}

// Blocks of KERNEL (`threads` per block, no dynamic shared memory) resident at once on the
// current device: the first round of a launch. The per-multiprocessor count is computed once
// per kernel (2048 threads' worth if the occupancy query fails).
template <auto KERNEL>
int64_t ra_resident_blocks(int threads) {
  static const int per_multiprocessor = [threads] {
    int n = 0;
    if (hipOccupancyMaxActiveBlocksPerMultiprocessor(&n, KERNEL, threads, 0) != hipSuccess) {
      (void)hipGetLastError();  // not left for the next launch check to report
      n = 2048 / threads;
    }
    return n;
  }();
  return static_cast<int64_t>(per_multiprocessor) * ra_device_multiprocessors();
}
