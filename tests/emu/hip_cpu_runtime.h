// CPU execution of the project's HIP kernels with AMD wave semantics (tests only, never
// installed). Included as <hip/hip_runtime.h> (tests/emu/include/hip/hip_runtime.h) by a
// translation unit compiled for the host with RA_EMU_WAVE=64 or 32.
//
// Model (runtime.cpp has the scheduler):
//  * A launch runs its blocks one after the other on each of a few worker threads; a block's
//    threads are fibers, grouped by linear thread index into waves of RA_EMU_WAVE lanes.
//  * A cross-lane operation (shuffles, ballot, any/all, MFMA) is a wave-scoped exchange: every
//    lane of the wave that has not exited must reach an exchange before it resolves; lanes that
//    exited stay exited and take no part. Mixed operations at one exchange, or some lanes at
//    an exchange while others wait at a block barrier, abort the launch with an error.
//  * Reading a value from an exited lane (ds_bpermute with a disabled source lane) returns 0,
//    as on CDNA, and is counted (ra_emu_stats): the kernels here always exchange converged.
//  * __syncthreads / __syncthreads_and wait for every thread of the block that has not exited.
//  * __shared__ is per block (one block runs at a time per worker thread).
//  * v_mfma_f32_16x16x16{bf16_1k,f16} are computed from the CDNA ISA's lane layout of A, B and
//    C/D (tests/test_mma_layouts.py cdna_mfma_16x16x16), in fp32 with fma in k order.
//
// The device pass it stands in for is selected here, before compat.h tests the same macros:
// RA_EMU_WAVE=64 is a gfx942 device pass (wave64, MFMA), RA_EMU_WAVE=32 a wave32 HIP pass
// without matrix units. A driver checks RA_WAVE_SIZE == RA_EMU_WAVE after including compat.h.
#pragma once

#include <math.h>
#include <stdint.h>
#include <string.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <tuple>
#include <type_traits>

#if !defined(RA_EMU_WAVE)
#error "define RA_EMU_WAVE (64 or 32): the wave width of the emulated device pass"
#endif
#if RA_EMU_WAVE != 64 && RA_EMU_WAVE != 32
#error "RA_EMU_WAVE must be 64 or 32"
#endif

#define __HIP__ 1
#define __HIP_DEVICE_COMPILE__ 1
#if !defined(RA_EMU_KERNEL_WAVE)
#define RA_EMU_KERNEL_WAVE RA_EMU_WAVE
#endif
// The kernels' compile-time wave width. Only the deliberate-mismatch build (tests: a 64-lane
// runtime with a 32-lane constant) sets RA_EMU_KERNEL_WAVE apart from RA_EMU_WAVE.
#if RA_EMU_KERNEL_WAVE == 64
#define __GFX9__ 1
#define __gfx942__ 1
#define __AMDGCN_WAVEFRONT_SIZE 64
#else
#define __AMDGCN_WAVEFRONT_SIZE 32
#endif

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static thread_local
#define RA_DYNAMIC_SHARED(type, name) type* name = static_cast<type*>(ra_emu::dynamic_shared())

// ---------------------------------------------------------------------------------------------
// Runtime types and host API subset.
// ---------------------------------------------------------------------------------------------
struct dim3 {
  uint32_t x, y, z;
  constexpr dim3(uint32_t x_ = 1, uint32_t y_ = 1, uint32_t z_ = 1) : x(x_), y(y_), z(z_) {}
};
struct ra_emu_uint3 {
  uint32_t x, y, z;
};

inline thread_local ra_emu_uint3 threadIdx;
inline thread_local ra_emu_uint3 blockIdx;
inline thread_local ra_emu_uint3 blockDim;
inline thread_local ra_emu_uint3 gridDim;
constexpr int warpSize = RA_EMU_WAVE;

enum hipError_t {
  hipSuccess = 0,
  hipErrorInvalidValue = 1,
  hipErrorNotSupported = 801,
  hipErrorLaunchFailure = 719,
  hipErrorInvalidDeviceFunction = 98,
};
enum hipDeviceAttribute_t {
  hipDeviceAttributeWarpSize,
  hipDeviceAttributeMultiprocessorCount,
  hipDeviceAttributeComputeCapabilityMajor,
  hipDeviceAttributeMaxSharedMemoryPerBlock,
  hipDeviceAttributeMaxSharedMemoryPerMultiprocessor,
};
enum hipFuncAttribute { hipFuncAttributeMaxDynamicSharedMemorySize };
enum hipMemcpyKind {
  hipMemcpyHostToHost,
  hipMemcpyHostToDevice,
  hipMemcpyDeviceToHost,
  hipMemcpyDeviceToDevice,
  hipMemcpyDefault
};
typedef struct ra_emu_stream* hipStream_t;

// runtime.cpp
hipError_t hipGetLastError();
hipError_t hipPeekAtLastError();
const char* hipGetErrorString(hipError_t err);
hipError_t hipGetDevice(int* device);
hipError_t hipSetDevice(int device);
hipError_t hipDeviceGetAttribute(int* value, hipDeviceAttribute_t attribute, int device);
hipError_t hipMemcpy(void* dst, const void* src, size_t bytes, hipMemcpyKind kind);
hipError_t hipMemset(void* dst, int value, size_t bytes);
hipError_t hipDeviceSynchronize();
// Inside a kernel: aborts the launch with this message; on the host: fails the next launch.
void ra_emu_fail(const char* what);
inline hipError_t hipGetSymbolAddress(void** ptr, const void* symbol) {
  *ptr = const_cast<void*>(symbol);
  return hipSuccess;
}

namespace ra_emu {

// Shared memory of one block, as gfx942 has it: the limit of static plus dynamic shared memory.
constexpr int kSharedBytesPerBlock = 64 * 1024;

// This block's dynamic shared memory (the launch's size; 16-byte aligned). Every launch fills
// it with 0xff bytes (a NaN in every 16-bit float format) before its first block, so a kernel
// that reads what it never staged produces NaN instead of a plausible value.
void* dynamic_shared();

// Blocks resident per multiprocessor that the occupancy query reports (any kernel).
constexpr int kResidentBlocksPerMultiprocessor = 2;

// Runs body() as every thread of every block of the grid; returns hipSuccess or the launch
// error (also left for hipGetLastError).
// `expr` is the kernel expression at the launch site and `fn` the kernel, for the record of
// the kernels run (ra_emu_kernels_run).
hipError_t launch(dim3 grid, dim3 block, const std::function<void()>& body, const char* expr,
                  const void* fn, size_t dynamic_shared_bytes = 0);

// Exchange kinds (runtime.cpp resolves them).
enum Op : int { kBpermute = 1, kBallot, kMfmaBf16, kMfmaF16 };

struct Exchange {
  int op;
  int32_t src;  // kBpermute: source lane
  uint32_t val;
  uint16_t a[4], b[4];
  float c[4];
  // results
  uint32_t out;
  uint64_t mask;
  float d[4];
};

// This lane's exchange slot, filled before exchange() and read after it.
Exchange& slot();
void exchange();
int block_barrier(int pred);  // returns the AND over the block's live threads (or 1)
int lane_id();

template <typename To, typename From>
inline To bits(From f) {
  static_assert(sizeof(To) == sizeof(From), "bit cast of unequal sizes");
  To t;
  memcpy(&t, &f, sizeof(t));
  return t;
}

inline uint32_t bpermute(int src_lane, uint32_t v) {
  Exchange& x = slot();
  x.op = kBpermute;
  x.src = src_lane;
  x.val = v;
  exchange();
  return x.out;
}

inline uint64_t ballot(bool pred) {
  Exchange& x = slot();
  x.op = kBallot;
  x.val = pred ? 1u : 0u;
  exchange();
  return x.mask;
}

}  // namespace ra_emu

// ---------------------------------------------------------------------------------------------
// Device intrinsics. The index arithmetic of the shuffles is HIP's (amd_warp_functions.h):
// widths partition the wave, an out-of-partition xor reads the lane itself, bpermute wraps
// its lane index modulo the wave.
// ---------------------------------------------------------------------------------------------
inline int __lane_id() { return ra_emu::lane_id(); }

template <typename T>
inline T ra_emu_shfl_index(T var, int index) {
  static_assert(sizeof(T) == 4, "32-bit shuffles only");
  return ra_emu::bits<T>(ra_emu::bpermute(index, ra_emu::bits<uint32_t>(var)));
}
template <typename T>
inline T __shfl(T var, int src_lane, int width = warpSize) {
  const int self = __lane_id();
  const int index = (src_lane & (width - 1)) + (self & ~(width - 1));
  return ra_emu_shfl_index(var, index);
}
template <typename T>
inline T __shfl_xor(T var, int lane_mask, int width = warpSize) {
  const int self = __lane_id();
  int index = self ^ lane_mask;
  index = index >= ((self + width) & ~(width - 1)) ? self : index;
  return ra_emu_shfl_index(var, index);
}
template <typename T>
inline T __shfl_up(T var, unsigned int delta, int width = warpSize) {
  const int self = __lane_id();
  int index = self - static_cast<int>(delta);
  index = (index < (self & ~(width - 1))) ? self : index;
  return ra_emu_shfl_index(var, index);
}
template <typename T>
inline T __shfl_down(T var, unsigned int delta, int width = warpSize) {
  const int self = __lane_id();
  int index = self + static_cast<int>(delta);
  index = ((self & (width - 1)) + static_cast<int>(delta)) >= width ? self : index;
  return ra_emu_shfl_index(var, index);
}
inline unsigned long long __ballot(int pred) { return ra_emu::ballot(pred != 0); }
inline int __any(int pred) { return ra_emu::ballot(pred != 0) != 0; }
inline int __all(int pred) {
  // every live lane: the lanes that answered false are none
  return ra_emu::ballot(pred == 0) == 0;
}

inline void __syncthreads() { (void)ra_emu::block_barrier(1); }
inline int __syncthreads_and(int pred) { return ra_emu::block_barrier(pred != 0 ? 1 : 0); }
inline void __threadfence() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
inline void __threadfence_block() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }

inline int __popc(unsigned int x) { return __builtin_popcount(x); }
inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
inline int __ffs(int x) { return __builtin_ffs(x); }
inline int __ffsll(long long x) { return __builtin_ffsll(x); }
inline int __clz(int x) { return x == 0 ? 32 : __builtin_clz(static_cast<unsigned>(x)); }
inline int __clzll(long long x) {
  return x == 0 ? 64 : __builtin_clzll(static_cast<unsigned long long>(x));
}

inline float __int_as_float(int x) { return ra_emu::bits<float>(x); }
inline float __uint_as_float(unsigned int x) { return ra_emu::bits<float>(x); }
inline int __float_as_int(float x) { return ra_emu::bits<int>(x); }
inline unsigned int __float_as_uint(float x) { return ra_emu::bits<unsigned int>(x); }

// Device min / max (HIP declares them for every arithmetic pair; mixed pairs promote).
template <typename A, typename B>
inline typename std::common_type<A, B>::type min(A a, B b) {
  using C = typename std::common_type<A, B>::type;
  return static_cast<C>(a) < static_cast<C>(b) ? static_cast<C>(a) : static_cast<C>(b);
}
template <typename A, typename B>
inline typename std::common_type<A, B>::type max(A a, B b) {
  using C = typename std::common_type<A, B>::type;
  return static_cast<C>(a) > static_cast<C>(b) ? static_cast<C>(a) : static_cast<C>(b);
}

// Atomics: real atomics, since blocks run on several worker threads.
template <typename T>
inline T atomicAdd(T* p, T v) {
  if constexpr (std::is_floating_point<T>::value) {
    T old = __atomic_load_n(p, __ATOMIC_RELAXED);
    T sum = old + v;
    while (!__atomic_compare_exchange(p, &old, &sum, false, __ATOMIC_SEQ_CST, __ATOMIC_RELAXED))
      sum = old + v;
    return old;
  } else {
    return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST);
  }
}
template <typename T>
inline T atomicSub(T* p, T v) {
  return __atomic_fetch_sub(p, v, __ATOMIC_SEQ_CST);
}
template <typename T>
inline T atomicMax(T* p, T v) {
  T old = __atomic_load_n(p, __ATOMIC_RELAXED);
  while (old < v &&
         !__atomic_compare_exchange_n(p, &old, v, false, __ATOMIC_SEQ_CST, __ATOMIC_RELAXED)) {
  }
  return old;
}
template <typename T>
inline T atomicMin(T* p, T v) {
  T old = __atomic_load_n(p, __ATOMIC_RELAXED);
  while (old > v &&
         !__atomic_compare_exchange_n(p, &old, v, false, __ATOMIC_SEQ_CST, __ATOMIC_RELAXED)) {
  }
  return old;
}
template <typename T>
inline T atomicExch(T* p, T v) {
  return __atomic_exchange_n(p, v, __ATOMIC_SEQ_CST);
}
template <typename T>
inline T atomicCAS(T* p, T expected, T desired) {
  __atomic_compare_exchange_n(p, &expected, desired, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
  return expected;
}

// ---------------------------------------------------------------------------------------------
// MFMA 16x16x16 (wave64): a wave-wide exchange. Operands are the lane's 4 x 16-bit values of A
// and B and 4 fp32 of C; cbsz / abid / blgp (broadcast controls) must be 0.
// ---------------------------------------------------------------------------------------------
#if RA_EMU_WAVE == 64
typedef short ra_emu_v4i16 __attribute__((ext_vector_type(4)));
typedef _Float16 ra_emu_v4f16 __attribute__((ext_vector_type(4)));
typedef float ra_emu_v4f32 __attribute__((ext_vector_type(4)));

template <typename V16>
inline ra_emu_v4f32 ra_emu_mfma_16x16x16(int op, V16 a, V16 b, ra_emu_v4f32 c, int cbsz,
                                         int abid, int blgp) {
  if (cbsz != 0 || abid != 0 || blgp != 0) ra_emu_fail("MFMA broadcast controls are not emulated");
  ra_emu::Exchange& x = ra_emu::slot();
  x.op = op;
  const auto a16 = __builtin_bit_cast(ra_emu_v4i16, a);
  const auto b16 = __builtin_bit_cast(ra_emu_v4i16, b);
  for (int i = 0; i < 4; ++i) {
    x.a[i] = static_cast<uint16_t>(a16[i]);
    x.b[i] = static_cast<uint16_t>(b16[i]);
    x.c[i] = c[i];
  }
  ra_emu::exchange();
  ra_emu_v4f32 d = {x.d[0], x.d[1], x.d[2], x.d[3]};
  return d;
}
#define __builtin_amdgcn_mfma_f32_16x16x16bf16_1k(a, b, c, cbsz, abid, blgp) \
  ra_emu_mfma_16x16x16(ra_emu::kMfmaBf16, a, b, c, cbsz, abid, blgp)
#define __builtin_amdgcn_mfma_f32_16x16x16f16(a, b, c, cbsz, abid, blgp) \
  ra_emu_mfma_16x16x16(ra_emu::kMfmaF16, a, b, c, cbsz, abid, blgp)
#endif

// ---------------------------------------------------------------------------------------------
// Launches: hipLaunchKernelGGL and hipOccupancyMaxActiveBlocksPerMultiprocessor.
// ---------------------------------------------------------------------------------------------
template <typename... Params, typename... Args>
inline void ra_emu_launch_kernel(const char* expr, void (*kernel)(Params...), dim3 grid,
                                 dim3 block, size_t shmem, hipStream_t, Args&&... args) {
  // arguments converted to the kernel's parameter types once, as a launch copies them
  std::tuple<std::decay_t<Params>...> copies(std::forward<Args>(args)...);
  ra_emu::launch(grid, block, [&] { std::apply(kernel, copies); }, expr,
                 reinterpret_cast<const void*>(kernel), shmem);
}
#define hipLaunchKernelGGL(kernel, grid, block, shmem, stream, ...) \
  ra_emu_launch_kernel(#kernel, kernel, dim3(grid), dim3(block), shmem, stream, ##__VA_ARGS__)

// Raising a kernel's dynamic shared memory limit: accepted up to the block's shared memory.
template <typename F>
inline hipError_t hipFuncSetAttribute(F, hipFuncAttribute, int value) {
  return value >= 0 && value <= ra_emu::kSharedBytesPerBlock ? hipSuccess : hipErrorInvalidValue;
}

// A kernel's attributes: only its static shared memory is read (the limit above counts it); the
// emulation's kernels keep theirs outside the block's budget, so 0.
struct hipFuncAttributes {
  size_t sharedSizeBytes = 0;
};
template <typename F>
inline hipError_t hipFuncGetAttributes(hipFuncAttributes* attr, F) {
  *attr = hipFuncAttributes{};
  return hipSuccess;
}

template <typename F>
inline hipError_t hipOccupancyMaxActiveBlocksPerMultiprocessor(int* n, F, int, size_t) {
  *n = ra_emu::kResidentBlocksPerMultiprocessor;
  return hipSuccess;
}
