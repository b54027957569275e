// A tiny kernel that exercises every building block of compat.h on the device, so tests can
// check them against torch on any GPU (wave64 and warp32 alike).
#include "compat.h"
#include "selftest_kernel.h"

namespace {

// One wave per block. Per lane, out[lane * kSelftestOutputs + i] for:
//  0: bf16 bits -> float           1: float -> bf16 bits (as float)
//  2: fp16 bits -> float           3: float -> fp16 bits (as float)
//  4: ra_group_sum<8> of x         5: ra_group_max<8> of x
//  6: ra_strided_sum<8, WAVE> of x 7: ra_strided_max<8, WAVE> of x
//  8: ra_group_sum<WAVE> of x      9: wave width
//  10..17: pack8/unpack8 round trip of 8 bf16 values through a 16-byte load/store
__global__ void compat_selftest_kernel(const uint16_t* bf16_in, const uint16_t* fp16_in,
                                       const float* x, float* out, uint16_t* vec_out) {
  constexpr int WAVE = RA_WAVE_SIZE;
  const int lane = threadIdx.x;
  float* o = out + lane * kSelftestOutputs;
  const float v = x[lane];
  o[0] = ra_bf16_bits_to_float(bf16_in[lane]);
  o[1] = static_cast<float>(ra_float_to_bf16_bits(v));
  o[2] = ra_fp16_bits_to_float(fp16_in[lane]);
  o[3] = static_cast<float>(ra_float_to_fp16_bits(v));
  o[4] = ra_group_sum<8>(v);
  o[5] = ra_group_max<8>(v);
  o[6] = ra_strided_sum<8, WAVE>(v);
  o[7] = ra_strided_max<8, WAVE>(v);
  o[8] = ra_group_sum<WAVE>(v);
  o[9] = static_cast<float>(WAVE);
  float vals[8];
  ra_unpack8<ra_bf16>(ra_load16(bf16_in + (lane % 4) * 8), vals);
  ra_store16(vec_out + lane * 8, ra_pack8<ra_bf16>(vals));
#pragma unroll
  for (int i = 0; i < 8; ++i) o[10 + i] = vals[i];
}

}  // namespace

hipError_t compat_selftest_launch(const uint16_t* bf16_in, const uint16_t* fp16_in,
                                  const float* x, float* out, uint16_t* vec_out,
                                  hipStream_t stream) {
  hipLaunchKernelGGL(compat_selftest_kernel, dim3(1), dim3(ra_device_wave_size()), 0, stream,
                     bf16_in, fp16_in, x, out, vec_out);
  return hipGetLastError();
}
