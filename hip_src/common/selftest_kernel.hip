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

// See mma_selftest_launch (selftest_kernel.h).
template <typename T, int D, int KV, int HEADS>
__global__ void mma_selftest_kernel(const uint16_t* x,  // [16, D]
                                    const uint16_t* y,  // [16, D]
                                    const uint16_t* v,  // [16, D]
                                    int ny, int nv, int no,
                                    float* s_out,        // [16, 16]
                                    int32_t* cover,      // [16, 16]
                                    uint16_t* o_out,     // [16, D]
                                    float* rowstat,      // [16, 3]
                                    int32_t* info) {     // [4]
  const int lane = threadIdx.x;
#if RA_HAS_MMA
  constexpr int HB = HEADS < kRaMmaMinN ? kRaMmaMinN : HEADS;
  constexpr int NS = KV <= 8 ? 8 : 16;
  using Acc = ra_mma_acc<NS>;
  ra_mma_rows<D, HB> xr;
  ra_mma_rows<D, KV> yr;
  ra_mma_vrows<D, KV> vr;
  ra_mma_load_rows(xr, x, D, 16, lane);
  ra_mma_load_rows(yr, y, D, ny, lane);
  ra_mma_load_vrows(vr, v, D, nv, lane);
  Acc acc;
  ra_mma_zero(acc);
  ra_mma_dot<T>(acc, xr, yr);
  float mx[kRaMmaAccSlots], sum[kRaMmaAccSlots];
#pragma unroll
  for (int r = 0; r < kRaMmaAccSlots; ++r) {
    mx[r] = -INFINITY;
    sum[r] = 0.f;
  }
#pragma unroll
  for (int i = 0; i < Acc::kElems; ++i) {
    const int row = ra_mma_acc_row(lane, i);
    const int col = ra_mma_acc_col(lane, i);
    s_out[row * 16 + col] = acc.x[i];
    atomicAdd(cover + row * 16 + col, 1);
    mx[ra_mma_acc_slot(i)] = fmaxf(mx[ra_mma_acc_slot(i)], acc.x[i]);
    sum[ra_mma_acc_slot(i)] += acc.x[i];
  }
#pragma unroll
  for (int r = 0; r < kRaMmaAccSlots; ++r) {
    mx[r] = ra_mma_row_max(mx[r]);
    sum[r] = ra_mma_row_sum(sum[r]);
  }
  const Acc colsum = ra_mma_col_sum(acc);
#pragma unroll
  for (int i = 0; i < Acc::kElems; ++i) {
    const int row = ra_mma_acc_row(lane, i);
    const int col = ra_mma_acc_col(lane, i);
    if (col == 0) {
      rowstat[3 * row] = mx[ra_mma_acc_slot(i)];
      rowstat[3 * row + 1] = sum[ra_mma_acc_slot(i)];
    }
    if (row == 0) rowstat[3 * col + 2] = colsum.x[i];
  }
  const ra_mma_pfrag<HB> pf = ra_mma_to_pfrag<T, HB>(acc);
  ra_mma_out<D, HB> out;
  ra_mma_zero(out);
  ra_mma_pv<T>(out, pf, vr);
  ra_mma_store_rows<T>(out, o_out, D, no, lane);
  if (lane == 0) {
    info[0] = 1;
    info[1] = Acc::kElems * RA_WAVE_SIZE / 16;  // columns the accumulator holds (>= NS)
    info[2] = HB;
  }
#else
  // No matrix units in this device pass: report it, compute nothing.
  (void)x;
  (void)y;
  (void)v;
  (void)ny;
  (void)nv;
  (void)no;
  (void)s_out;
  (void)cover;
  (void)o_out;
  (void)rowstat;
  if (lane == 0) info[0] = 0;
#endif
  if (lane == 0) info[3] = RA_WAVE_SIZE;
}

template <typename T, int D, int KV, int HEADS>
hipError_t mma_selftest_run(const uint16_t* x, const uint16_t* y, const uint16_t* v, int ny,
                            int nv, int no, float* s, int32_t* cover, uint16_t* o,
                            float* rowstat, int32_t* info, hipStream_t stream) {
  hipLaunchKernelGGL((mma_selftest_kernel<T, D, KV, HEADS>), dim3(1), dim3(ra_device_wave_size()),
                     0, stream, x, y, v, ny, nv, no, s, cover, o, rowstat, info);
  return hipGetLastError();
}

template <typename T, int D>
hipError_t mma_selftest_kv(const uint16_t* x, const uint16_t* y, const uint16_t* v, int kv,
                           int heads, int ny, int nv, int no, float* s, int32_t* cover,
                           uint16_t* o, float* rowstat, int32_t* info, hipStream_t stream) {
#define RA_MMA_SELFTEST_CASE(KV_, H_)                                                      \
  if (kv == KV_ && heads == H_)                                                           \
    return mma_selftest_run<T, D, KV_, H_>(x, y, v, ny, nv, no, s, cover, o, rowstat, info, \
                                           stream);
  RA_MMA_SELFTEST_CASE(4, 8)
  RA_MMA_SELFTEST_CASE(8, 8)
  RA_MMA_SELFTEST_CASE(16, 8)
  RA_MMA_SELFTEST_CASE(4, 16)
  RA_MMA_SELFTEST_CASE(8, 16)
  RA_MMA_SELFTEST_CASE(16, 16)
#undef RA_MMA_SELFTEST_CASE
  return hipErrorInvalidValue;
}

template <typename T>
hipError_t mma_selftest_d(const uint16_t* x, const uint16_t* y, const uint16_t* v, int d, int kv,
                          int heads, int ny, int nv, int no, float* s, int32_t* cover,
                          uint16_t* o, float* rowstat, int32_t* info, hipStream_t stream) {
  switch (d) {
    case 64:
      return mma_selftest_kv<T, 64>(x, y, v, kv, heads, ny, nv, no, s, cover, o, rowstat, info, stream);
    case 128:
      return mma_selftest_kv<T, 128>(x, y, v, kv, heads, ny, nv, no, s, cover, o, rowstat, info, stream);
    case 256:
      return mma_selftest_kv<T, 256>(x, y, v, kv, heads, ny, nv, no, s, cover, o, rowstat, info, stream);
    default:
      return hipErrorInvalidValue;
  }
}

}  // namespace

hipError_t mma_selftest_launch(const uint16_t* x, const uint16_t* y, const uint16_t* v, int d,
                               int kv, int heads, int ny, int nv, int no, bool fp16, float* s,
                               int32_t* cover, uint16_t* o, float* rowstat, int32_t* info,
                               hipStream_t stream) {
  return fp16 ? mma_selftest_d<ra_fp16>(x, y, v, d, kv, heads, ny, nv, no, s, cover, o, rowstat,
                                        info, stream)
              : mma_selftest_d<ra_bf16>(x, y, v, d, kv, heads, ny, nv, no, s, cover, o, rowstat,
                                        info, stream);
}

hipError_t compat_selftest_launch(const uint16_t* bf16_in, const uint16_t* fp16_in,
                                  const float* x, float* out, uint16_t* vec_out,
                                  hipStream_t stream) {
  hipLaunchKernelGGL(compat_selftest_kernel, dim3(1), dim3(ra_device_wave_size()), 0, stream,
                     bf16_in, fp16_in, x, out, vec_out);
  return hipGetLastError();
}
