// rocm_attn: asynchronous copies from global to shared memory (cp.async: 16-byte pieces, and
// 4-byte ones for per-row scalars), for kernels that stage operand tiles without a round trip
// through registers: the copies in flight hold no registers, so a block can keep several tiles
// in flight at the register cost of none.
//
// Device (RA_HAS_CP_ASYNC): NVIDIA sm_80+ only. Everywhere else (HIP / CDNA, older NVIDIA, the
// CPU emulation) RA_HAS_CP_ASYNC is 0 and none of this exists; callers keep their staging
// through registers.
// Host (RA_CP_ASYNC_BUILD): a CUDA build (hipify + nvcc, never hipcc), where launchers may
// instantiate kernels that use the copies; their device passes below sm_80 compile the
// register staging instead.
//
// Ordering: ra_cp_async16 / ra_cp_async4 calls issued by a thread since its last
// ra_cp_async_commit form one group; ra_cp_async_wait<N>() waits until at most N of this
// thread's groups are pending. The data is visible to other threads only after the writer's
// wait and a barrier between them.
#pragma once

#include "compat.h"

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
#define RA_HAS_CP_ASYNC 1
#else
#define RA_HAS_CP_ASYNC 0
#endif

#if !defined(__HIP__)
#define RA_CP_ASYNC_BUILD 1
#else
#define RA_CP_ASYNC_BUILD 0
#endif

#if RA_HAS_CP_ASYNC

// The 32-bit shared-memory address of a generic pointer into shared memory.
RA_DEVICE uint32_t ra_smem_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16 bytes global -> shared, asynchronous; `bytes` 0 writes zeros and reads nothing.
RA_DEVICE void ra_cp_async16(uint32_t dst, const void* src, int bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
               "r"(bytes)
               : "memory");
}
// 4 bytes global -> shared, asynchronous (through L1: cp.async.cg takes 16 bytes only), for
// per-row scalars staged beside a tile; `bytes` 0 writes zeros and reads nothing.
RA_DEVICE void ra_cp_async4(uint32_t dst, const void* src, int bytes) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src),
               "r"(bytes)
               : "memory");
}
RA_DEVICE void ra_cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
RA_DEVICE void ra_cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

#endif  // RA_HAS_CP_ASYNC
