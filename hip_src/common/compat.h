// rocm_attn: the one place for hardware- and toolchain-specific code.
//
// Kernels are written in HIP. tools/hipify.py turns this tree into CUDA sources for nvcc;
// everything below that differs between AMD and NVIDIA is selected here, so the rest of the
// kernels read the same on both. No torch include anywhere under hip_src/ except
// hip_src/bindings/.
#pragma once

#include <hip/hip_runtime.h>
#include <stdint.h>

#define RA_DEVICE __device__ __forceinline__
#define RA_HOST_DEVICE __host__ __device__ __forceinline__

// ---------------------------------------------------------------------------------------------
// Wave (AMD) / warp (NVIDIA) width, a compile-time constant of each device pass.
// gfx9 CDNA parts (MI200 gfx90a, MI300 gfx942) run 64-lane wavefronts; RDNA and NVIDIA run 32.
// NOTE: in the host pass the value is meaningless; launchers take the width from the device
// properties at run time (ra_device_wave_size) and never from this macro.
// ---------------------------------------------------------------------------------------------
#if defined(__GFX9__)
#define RA_WAVE_SIZE 64
#elif defined(__AMDGCN_WAVEFRONT_SIZE)
#define RA_WAVE_SIZE __AMDGCN_WAVEFRONT_SIZE
#else
#define RA_WAVE_SIZE 32
#endif

// ---------------------------------------------------------------------------------------------
// Cross-lane exchange. HIP's __shfl_xor takes no mask; hipify adds the full-warp mask CUDA
// needs (__shfl_xor_sync(0xffffffff, ...)). All lanes of a wave call these together.
// ---------------------------------------------------------------------------------------------
RA_DEVICE float ra_shfl_xor(float v, int lane_mask) { return __shfl_xor(v, lane_mask); }

// Value of `v` in lane src_lane (0 <= src_lane < wave width) of this wave.
RA_DEVICE float ra_shfl(float v, int src_lane) { return __shfl(v, src_lane); }
RA_DEVICE int ra_shfl(int v, int src_lane) { return __shfl(v, src_lane); }
RA_DEVICE int64_t ra_shfl(int64_t v, int src_lane) {
  const uint32_t lo = static_cast<uint32_t>(ra_shfl(static_cast<int>(v), src_lane));
  const int hi = ra_shfl(static_cast<int>(v >> 32), src_lane);
  return static_cast<int64_t>((static_cast<uint64_t>(static_cast<uint32_t>(hi)) << 32) | lo);
}

// __launch_bounds__ with a minimum of resident blocks per multiprocessor, which CUDA compilers
// turn into a register cap that fits them. HIP reads a second argument as waves per execution
// unit, a different budget, so there only the thread bound is given (caps tuned on NVIDIA).
#if defined(__HIP__)
#define RA_LAUNCH_BOUNDS_MIN_BLOCKS(threads, blocks) __launch_bounds__(threads)
#else
#define RA_LAUNCH_BOUNDS_MIN_BLOCKS(threads, blocks) __launch_bounds__(threads, blocks)
#endif

// A kernel's dynamic shared memory (its size given at launch) as an array `name` of `type`.
// The CPU emulation (tests/emu) defines its own before including this header.
#if !defined(RA_DYNAMIC_SHARED)
#define RA_DYNAMIC_SHARED(type, name) extern __shared__ type name[]
#endif

// Number of lanes of this wave whose `pred` is true (every lane calls it, converged). HIP's
// ballot is 64-bit on every target; CUDA's (after hipify: __ballot_sync) is 32-bit.
RA_DEVICE int ra_count_lanes(bool pred) {
#if defined(__HIP__)
  return __popcll(__ballot(pred));
#else
  return __popc(__ballot(pred));
#endif
}

// Butterfly sum over aligned groups of GROUP lanes (GROUP a power of two <= wave width): every
// lane of a group ends with the group's total.
template <int GROUP>
RA_DEVICE float ra_group_sum(float v) {
  static_assert((GROUP & (GROUP - 1)) == 0, "GROUP must be a power of two");
#pragma unroll
  for (int m = GROUP / 2; m >= 1; m >>= 1) v += ra_shfl_xor(v, m);
  return v;
}

template <int GROUP>
RA_DEVICE float ra_group_max(float v) {
  static_assert((GROUP & (GROUP - 1)) == 0, "GROUP must be a power of two");
#pragma unroll
  for (int m = GROUP / 2; m >= 1; m >>= 1) v = fmaxf(v, ra_shfl_xor(v, m));
  return v;
}

// Sum across the lanes that share lane % STRIDE inside a wave of WAVE lanes (STRIDE a power of
// two < WAVE): reduces over "row groups" when each row occupies STRIDE consecutive lanes.
template <int STRIDE, int WAVE>
RA_DEVICE float ra_strided_sum(float v) {
#pragma unroll
  for (int m = WAVE / 2; m >= STRIDE; m >>= 1) v += ra_shfl_xor(v, m);
  return v;
}

template <int STRIDE, int WAVE>
RA_DEVICE float ra_strided_max(float v) {
#pragma unroll
  for (int m = WAVE / 2; m >= STRIDE; m >>= 1) v = fmaxf(v, ra_shfl_xor(v, m));
  return v;
}

// ---------------------------------------------------------------------------------------------
// 16-bit floats as raw storage. Debian's ROCm 5.2 headers have no hip_bf16.h and the bf16
// types differ between ROCm 5, ROCm 6 and CUDA, so bf16 is converted with bit shifts and fp16
// with the compiler's native half type. Arithmetic is always fp32.
// ---------------------------------------------------------------------------------------------
struct ra_bf16 {
  uint16_t bits;
};
struct ra_fp16 {
  uint16_t bits;
};

RA_HOST_DEVICE float ra_bf16_bits_to_float(uint32_t bits) {
  union {
    uint32_t u;
    float f;
  } c;
  c.u = bits << 16;
  return c.f;
}

// Round to nearest even; NaN stays a (quiet) NaN.
RA_HOST_DEVICE uint16_t ra_float_to_bf16_bits(float f) {
  union {
    uint32_t u;
    float f;
  } c;
  c.f = f;
  if ((c.u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((c.u >> 16) | 0x0040u);
  const uint32_t rounding_bias = 0x7fffu + ((c.u >> 16) & 1u);
  return static_cast<uint16_t>((c.u + rounding_bias) >> 16);
}

#if defined(__HIP__)
// clang HIP: _Float16 is a native type on both host and device.
RA_HOST_DEVICE float ra_fp16_bits_to_float(uint32_t bits) {
  union {
    uint16_t u;
    _Float16 h;
  } c;
  c.u = static_cast<uint16_t>(bits);
  return static_cast<float>(c.h);
}
RA_HOST_DEVICE uint16_t ra_float_to_fp16_bits(float f) {
  union {
    uint16_t u;
    _Float16 h;
  } c;
  c.h = static_cast<_Float16>(f);
  return c.u;
}
#else
// nvcc: the hardware conversions through cuda_fp16.h.
#include <cuda_fp16.h>
RA_HOST_DEVICE float ra_fp16_bits_to_float(uint32_t bits) {
  return __half2float(__ushort_as_half(static_cast<unsigned short>(bits)));
}
RA_HOST_DEVICE uint16_t ra_float_to_fp16_bits(float f) {
  return __half_as_ushort(__float2half_rn(f));
}
#endif

// Two floats rounded to bf16 (nearest even) and packed: lo in bits 0-15, hi in bits 16-31.
// sm_90 converts a pair in one instruction (cvt.rn.bf16x2.f32; a NaN becomes the canonical
// 0x7fff); elsewhere the bit arithmetic of ra_float_to_bf16_bits, twice.
#if !defined(__HIP__)
#include <cuda_bf16.h>
#endif
RA_DEVICE uint32_t ra_pack_bf16x2(float lo, float hi) {
#if !defined(__HIP__) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
#else
  return static_cast<uint32_t>(ra_float_to_bf16_bits(lo)) |
         (static_cast<uint32_t>(ra_float_to_bf16_bits(hi)) << 16);
#endif
}

// Type traits used by kernels templated on the storage type.
template <typename T>
struct ra_dtype;
template <>
struct ra_dtype<ra_bf16> {
  static RA_HOST_DEVICE float to_float(uint32_t bits) { return ra_bf16_bits_to_float(bits); }
  static RA_HOST_DEVICE uint16_t from_float(float f) { return ra_float_to_bf16_bits(f); }
};
template <>
struct ra_dtype<ra_fp16> {
  static RA_HOST_DEVICE float to_float(uint32_t bits) { return ra_fp16_bits_to_float(bits); }
  static RA_HOST_DEVICE uint16_t from_float(float f) { return ra_float_to_fp16_bits(f); }
};

// ---------------------------------------------------------------------------------------------
// 16-byte vectors: 8 x 16-bit values. One load/store instruction per lane (global_load_dwordx4
// on CDNA, LDG.E.128 on Hopper). Callers guarantee 16-byte alignment.
// ---------------------------------------------------------------------------------------------
struct alignas(16) ra_vec8 {
  uint32_t w[4];
};

RA_DEVICE ra_vec8 ra_load16(const void* p) { return *reinterpret_cast<const ra_vec8*>(p); }
RA_DEVICE void ra_store16(void* p, const ra_vec8& v) { *reinterpret_cast<ra_vec8*>(p) = v; }

// 8-byte vectors (4 x 16-bit), for the few places where a lane's share of a row is 8 bytes
// (mma.h, head dim 64 on 64-lane waves). Callers guarantee 8-byte alignment.
struct alignas(8) ra_vec4 {
  uint32_t w[2];
};

RA_DEVICE ra_vec4 ra_load8(const void* p) { return *reinterpret_cast<const ra_vec4*>(p); }
RA_DEVICE void ra_store8(void* p, const ra_vec4& v) { *reinterpret_cast<ra_vec4*>(p) = v; }

template <typename T>
RA_DEVICE void ra_unpack8(const ra_vec8& v, float (&out)[8]) {
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    out[2 * i] = ra_dtype<T>::to_float(v.w[i] & 0xffffu);
    out[2 * i + 1] = ra_dtype<T>::to_float(v.w[i] >> 16);
  }
}

template <typename T>
RA_DEVICE ra_vec8 ra_pack8(const float (&in)[8]) {
  ra_vec8 v;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    v.w[i] = static_cast<uint32_t>(ra_dtype<T>::from_float(in[2 * i])) |
             (static_cast<uint32_t>(ra_dtype<T>::from_float(in[2 * i + 1])) << 16);
  }
  return v;
}

// ---------------------------------------------------------------------------------------------
// Programmatic dependent launch (CUDA, sm_90+; no HIP equivalent, so no-ops there). A kernel
// launched by ra_launch (launch.h) may be started while the kernel before it in the stream is
// still draining, so it must call ra_wait_for_prior_kernel() before its first global memory
// access (inputs, cu_seqlens and outputs alike: the kernel before may write any of them), in
// every block. The wait returns once the prior kernel has completed and its writes are visible;
// in a kernel launched without the attribute it returns at once.
// ra_let_next_kernel_start() lets the next such kernel launch now (its blocks take free slots
// and wait); called after the wait, so at most one kernel waits on another.
// ---------------------------------------------------------------------------------------------
#if !defined(__HIP__) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define RA_OVERLAPPED_LAUNCH 1  // device code that ra_launch may start early
#else
#define RA_OVERLAPPED_LAUNCH 0
#endif

RA_DEVICE void ra_wait_for_prior_kernel() {
#if RA_OVERLAPPED_LAUNCH
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

RA_DEVICE void ra_let_next_kernel_start() {
#if RA_OVERLAPPED_LAUNCH
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// A 4-byte load served by L2 (never by, nor into, L1) and never merged with another load: for
// what a kernel reads before ra_wait_for_prior_kernel() only to guess with (the kernel ahead
// may be writing it), so that the plain loads after the wait cannot meet a line it brought in.
RA_DEVICE int32_t ra_load_from_l2(const int32_t* p) {
#if RA_OVERLAPPED_LAUNCH
  int32_t v;
  asm volatile("ld.global.cg.s32 %0, [%1];" : "=r"(v) : "l"(p));
  return v;
#else
  return *p;
#endif
}

// An L2 prefetch of the line holding p: a hint that brings nothing into registers or L1, so it
// may be issued before ra_wait_for_prior_kernel() (a line the kernel ahead writes afterwards is
// updated in L2, which every load after the wait reads through). NVIDIA sm_90+ only.
RA_DEVICE void ra_prefetch_l2(const void* p) {
#if RA_OVERLAPPED_LAUNCH
  asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
#else
  (void)p;
#endif
}

// Matrix units (mma.sync on NVIDIA, MFMA on CDNA): tiles for attention-sized products.
#include "mma.h"

// Host helpers shared by launchers; their own header, so that the bindings (which cannot
// include this one) see the same declarations.
#include "device_info.h"
