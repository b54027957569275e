// Kernels that check the emulation runtime's own model (tests/test_emu_runtime.py).
#include <hip/hip_runtime.h>

namespace {

// Grid-stride over `n` items, one wave per item at a time; item i runs work[i] butterfly rounds,
// so waves run different numbers of shuffles, and lane 0 counts every item it finishes. Each
// item must be counted exactly once and hold the butterfly sum of its lanes.
__global__ void uneven_persistent_kernel(const int* work, int n, int* counts, int* sums) {
  const int lane = threadIdx.x % warpSize;
  const int waves = gridDim.x * (blockDim.x / warpSize);
  for (int item = blockIdx.x * (blockDim.x / warpSize) + threadIdx.x / warpSize; item < n;
       item += waves) {
    int v = lane + item;
    for (int r = 0; r < work[item]; ++r) v += __shfl_xor(v, 1 << (r % 5));
    if (lane == 0) {
      atomicAdd(counts + item, 1);
      sums[item] = v;
    }
  }
}

// Lanes >= `live` of every wave return at once; the rest exchange: __shfl from lane
// (lane + 1) % wave (the last live lane reads an exited lane when live < wave), a ballot, and
// __syncthreads_and with the block's exited threads left out.
__global__ void early_exit_kernel(int live, int* shfl, unsigned long long* ballot, int* sync_and) {
  const int lane = threadIdx.x % warpSize;
  const int tid = blockIdx.x * blockDim.x + threadIdx.x;
  if (lane >= live) return;
  shfl[tid] = __shfl(lane * 10 + 1, (lane + 1) % warpSize);
  ballot[tid] = __ballot(lane % 3 == 0);
  sync_and[tid] = __syncthreads_and(lane < live);
}

// Lane 0 of each wave goes to a block barrier while its wave-mates shuffle: divergent use of
// a cross-lane operation, which the runtime must report instead of computing something.
__global__ void divergent_kernel(int* out) {
  const int lane = threadIdx.x % warpSize;
  if (lane == 0) {
    __syncthreads();
    out[threadIdx.x] = -1;
  } else {
    out[threadIdx.x] = __shfl_xor(lane, 1);
    __syncthreads();
  }
}

}  // namespace

extern "C" {

int emu_model_uneven_persistent(const int* work, int n, int blocks, int* counts, int* sums) {
  hipLaunchKernelGGL(uneven_persistent_kernel, dim3(blocks), dim3(2 * warpSize), 0, nullptr,
                     work, n, counts, sums);
  return hipGetLastError();
}

int emu_model_early_exit(int live, int* shfl, unsigned long long* ballot, int* sync_and) {
  hipLaunchKernelGGL(early_exit_kernel, dim3(2), dim3(2 * warpSize), 0, nullptr, live, shfl,
                     ballot, sync_and);
  return hipGetLastError();
}

int emu_model_divergent(int* out) {
  hipLaunchKernelGGL(divergent_kernel, dim3(1), dim3(warpSize), 0, nullptr, out);
  return hipGetLastError();
}

}  // extern "C"
