// Merge / correction kernels of the THD helpers: merge_partial, lse_correction, out_correction
// (thd::merge_kernel) and grad_correction (thd::grad_kernel).
//
// Element dtypes (bf16 / fp16 / fp32) are run-time values, uniform over the grid, so one
// instantiation per vector width serves every combination (a float32 accumulator with bf16
// steps included); the arithmetic is fp32 and each output is rounded once. VEC = 8 elements
// per access (16 bytes of a 16-bit row, 2 x 16 bytes of an fp32 row) when rows allow it, else 1.
#pragma once

#include "index.h"

namespace thd {

constexpr int kMergeThreads = 256;

// exp(x) to ~1 ulp in fp32 (Cody-Waite reduction, degree-6 polynomial), independent of
// fast-math flags (nvcc --use_fast_math turns expf into the ~2 + 1.2|x| ulp __expf).
// exp(-inf) = 0, exp(NaN) = NaN, exp(x > 88.72) = inf.
RA_DEVICE float thd_exp(float x) {
  if (!(x > -104.f)) return x != x ? x : 0.f;
  if (x > 88.72283935546875f) return __int_as_float(0x7f800000);
  const float k = rintf(x * 1.44269502162933349609375f);
  float r = fmaf(k, -0.693359375f, x);  // ln2 split: hi (exact product) + lo
  r = fmaf(k, 2.12194440e-4f, r);
  const float r2 = r * r;
  float q = fmaf(1.9875691500e-4f, r, 1.3981999507e-3f);
  q = fmaf(q, r, 8.3334519073e-3f);
  q = fmaf(q, r, 4.1665795894e-2f);
  q = fmaf(q, r, 1.6666665459e-1f);
  q = fmaf(q, r, 5.0000001201e-1f);
  const float e = fmaf(q, r2, r) + 1.f;
  // 2^k in two steps so that k in [-151, 128] stays within normal exponents
  const int ki = static_cast<int>(k);
  const int k1 = ki / 2;
  const int k2 = ki - k1;
  return e * __int_as_float((k1 + 127) << 23) * __int_as_float((k2 + 127) << 23);
}

// The stable merge of two LSEs, exactly the torch path's _merge_math in fp32: new LSE and the
// weights of both sides. NaN propagates like torch.maximum / torch.minimum.
RA_DEVICE void merge_weights(float a, float b, float& lse, float& wa, float& wb) {
  const bool nan = (a != a) || (b != b);
  const float mx = nan ? a + b : fmaxf(a, b);
  const float mn = nan ? a + b : fminf(a, b);
  const bool empty = mx == -INFINITY;
  const float safe_mx = empty ? 0.f : mx;
  lse = empty ? mx : safe_mx + log1pf(thd_exp(mn - safe_mx));
  const float safe_new = empty ? 0.f : lse;
  wa = thd_exp(a - safe_new);
  wb = thd_exp(b - safe_new);
}

RA_DEVICE float to_f32(uint32_t bits, int dtype) {
  return dtype == kThdBFloat16 ? ra_bf16_bits_to_float(bits) : ra_fp16_bits_to_float(bits);
}
RA_DEVICE uint32_t from_f32(float f, int dtype) {
  return dtype == kThdBFloat16 ? ra_float_to_bf16_bits(f) : ra_float_to_fp16_bits(f);
}

// VEC elements at element offset off of a row of dtype `dtype`, as float.
template <int VEC>
RA_DEVICE void load_f32(const void* base, int64_t off, int dtype, float (&x)[VEC]) {
  if constexpr (VEC == 8) {
    if (dtype == kThdFloat32) {
      const float* p = static_cast<const float*>(base) + off;
      const ra_vec8 a = ra_load16(p);
      const ra_vec8 b = ra_load16(p + 4);
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        x[i] = __uint_as_float(a.w[i]);
        x[4 + i] = __uint_as_float(b.w[i]);
      }
    } else {
      const ra_vec8 v = ra_load16(static_cast<const uint16_t*>(base) + off);
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        x[2 * i] = to_f32(v.w[i] & 0xffffu, dtype);
        x[2 * i + 1] = to_f32(v.w[i] >> 16, dtype);
      }
    }
  } else {
    static_assert(VEC == 1, "VEC is 8 or 1");
    x[0] = dtype == kThdFloat32 ? static_cast<const float*>(base)[off]
                                : to_f32(static_cast<const uint16_t*>(base)[off], dtype);
  }
}

template <int VEC>
RA_DEVICE void store_f32(void* base, int64_t off, int dtype, const float (&x)[VEC]) {
  if constexpr (VEC == 8) {
    if (dtype == kThdFloat32) {
      float* p = static_cast<float*>(base) + off;
      ra_vec8 a, b;
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        a.w[i] = __float_as_uint(x[i]);
        b.w[i] = __float_as_uint(x[4 + i]);
      }
      ra_store16(p, a);
      ra_store16(p + 4, b);
    } else {
      ra_vec8 v;
#pragma unroll
      for (int i = 0; i < 4; ++i)
        v.w[i] = from_f32(x[2 * i], dtype) | (from_f32(x[2 * i + 1], dtype) << 16);
      ra_store16(static_cast<uint16_t*>(base) + off, v);
    }
  } else {
    static_assert(VEC == 1, "VEC is 8 or 1");
    if (dtype == kThdFloat32) {
      static_cast<float*>(base)[off] = x[0];
    } else {
      static_cast<uint16_t*>(base)[off] = static_cast<uint16_t>(from_f32(x[0], dtype));
    }
  }
}

// grad_kernel: VEC-element vectors per lane and tensor (lanes per row ~ vectors per row / this).
// NOTE: a variant with 4 vectors per lane, all row loads issued before the weights, measured
// slower on an H200 (122 registers, half the resident threads, 2-lane rows coalescing worse).
constexpr int kMergeVecsPerLane = 2;

// One group of 2^lpr_shift lanes per (step token k, head h), heads fastest: the groups of a
// wave share k, so the row search reads the same cu_seqlens words (one transaction) and the
// rows they stream are adjacent heads of one token (whole cache lines). Every load of an item
// (both LSE words and both rows) is issued before any of them is used: the weights only select
// afterwards, so the item costs one memory round trip, not two.
// NOTE: the previous mapping (blockIdx.y = head, lanes over tokens) ran the row search once per
// head and waited for the LSEs before loading rows: 28-47% of the byte floor on an H200, L2-
// and latency-bound (docs/NOTES.md).
// NOTE: one vector per lane and tensor (kMergeRowVecsPerLane): 2 measured 74 registers on sm_90
// and a latency-bound 43-51% of floor (docs/NOTES.md); fewer registers, more resident items.
constexpr int kMergeRowVecsPerLane = 1;

template <int VEC>
__global__ void __launch_bounds__(kMergeThreads) merge_kernel(const ThdMergeParams p,
                                                              const int lpr_shift) {
  const int lanes = 1 << lpr_shift;
  const int lane = threadIdx.x & (lanes - 1);
  const int nv = p.out_dst != nullptr ? p.dim / VEC : 0;
  const bool halves = p.map.kind == ThdRowMap::kHalf;
  const int64_t groups = (static_cast<int64_t>(gridDim.x) * kMergeThreads) >> lpr_shift;
  const int64_t items = p.n * p.heads;
  // LSE-only launches (no rows) go tokens fastest instead: the LSE [H, t] reads coalesce.
  const bool heads_fastest = nv > 0;
  for (int64_t item = (static_cast<int64_t>(blockIdx.x) * kMergeThreads + threadIdx.x) >> lpr_shift;
       item < items; item += groups) {
    const int64_t major = item / (heads_fastest ? p.heads : p.n);
    const int64_t minor = item - major * (heads_fastest ? p.heads : p.n);
    const int64_t k = heads_fastest ? major : minor;
    const int64_t h = heads_fastest ? minor : major;
    int64_t r = k, r0 = -1;  // running row; first-half row (copied when writing new tensors)
    int64_t sk = k;          // step row
    if (halves) {
      half_rows(p.map, k, r0, r);  // one search for both halves
      if (!p.copy_first_half) r0 = -1;
    } else if (p.map.kind == ThdRowMap::kIndex) {
      r = clamp_row(p.map.index[k], p.map.local_rows);
      if (p.map.step_index != nullptr) sk = clamp_row(p.map.step_index[k], p.map.step_count);
    }
    const float a = p.lse[h * p.lse_head + r * p.lse_tok];
    const float b = p.lse_step[h * p.lse_step_head + sk * p.lse_step_tok];
    const int64_t out_row = r * p.out_tok + h * p.out_head;
    const int64_t step_row = sk * p.step_tok + h * p.step_head;
    const int64_t dst_row = r * p.dst_tok + h * p.dst_head;
    float x[kMergeRowVecsPerLane][VEC], y[kMergeRowVecsPerLane][VEC];
    auto load_pass = [&](int v0) {
#pragma unroll
      for (int u = 0; u < kMergeRowVecsPerLane; ++u) {
        const int v = v0 + u * lanes;
        if (v < nv) {
          load_f32<VEC>(p.out, out_row + v * VEC, p.out_dtype, x[u]);
          load_f32<VEC>(p.out_step, step_row + v * VEC, p.step_dtype, y[u]);
        }
      }
    };
    load_pass(lane);  // the first (usually only) pass of the row, alongside the LSE loads
    float new_lse = 0.f, wa = 1.f, wb;
    if (p.correction) {
      wb = thd_exp(b != -INFINITY ? b - a : -INFINITY);
    } else {
      merge_weights(a, b, new_lse, wa, wb);
    }
    // correction keeps out as is; merge drops a side whose weight is 0 (junk in an empty
    // accumulator, a step row with no keys): selected away, never multiplied by 0
    const bool use_a = p.correction || wa > 0.f;
    const bool use_b = wb > 0.f;
    if (lane == 0 && p.lse_dst != nullptr) {
      p.lse_dst[h * p.lse_dst_head + r * p.lse_dst_tok] = new_lse;
      if (r0 >= 0)
        p.lse_dst[h * p.lse_dst_head + r0 * p.lse_dst_tok] = p.lse[h * p.lse_head + r0 * p.lse_tok];
    }
    for (int v0 = lane; v0 < nv; v0 += kMergeRowVecsPerLane * lanes) {
      if (v0 != lane) load_pass(v0);  // rows wider than the group: later passes load here
#pragma unroll
      for (int u = 0; u < kMergeRowVecsPerLane; ++u) {
        const int v = v0 + u * lanes;
        if (v < nv) {
          float o[VEC];
#pragma unroll
          for (int e = 0; e < VEC; ++e) {
            const float xa = use_a ? x[u][e] * wa : 0.f;
            const float yb = use_b ? y[u][e] * wb : 0.f;
            o[e] = xa + yb;
          }
          store_f32<VEC>(p.out_dst, dst_row + v * VEC, p.out_dtype, o);
        }
      }
    }
    if (r0 >= 0) {
      const int64_t src0 = r0 * p.out_tok + h * p.out_head;
      const int64_t dst0 = r0 * p.dst_tok + h * p.dst_head;
      for (int v = lane; v < nv; v += lanes) {
        float c[VEC];
        load_f32<VEC>(p.out, src0 + v * VEC, p.out_dtype, c);
        store_f32<VEC>(p.out_dst, dst0 + v * VEC, p.out_dtype, c);
      }
    }
  }
}

// Element offset of vector v of a [heads, head_dim] row.
template <int VEC>
RA_DEVICE int64_t row_offset(int v, int vph, int heads, int64_t head_stride) {
  if (heads == 1) return static_cast<int64_t>(v) * VEC;
  const int hh = v / vph;
  return hh * head_stride + static_cast<int64_t>(v - hh * vph) * VEC;
}

// One group of 2^lpr_shift lanes per k: the row k (kIdentity) or both halves' rows of k (kHalf,
// one search for both).
template <int VEC>
__global__ void __launch_bounds__(kMergeThreads) grad_kernel(const ThdGradParams p,
                                                             const int lpr_shift) {
  const int lanes = 1 << lpr_shift;
  const int lane = threadIdx.x & (lanes - 1);
  const int vph = p.head_dim / VEC;
  const int nvec = p.heads * vph;
  const bool halves = p.map.kind == ThdRowMap::kHalf;
  const int64_t groups = (static_cast<int64_t>(gridDim.x) * kMergeThreads) >> lpr_shift;
  for (int64_t k = (static_cast<int64_t>(blockIdx.x) * kMergeThreads + threadIdx.x) >> lpr_shift;
       k < p.n; k += groups) {
    int64_t r_first = k, r_second = k, s_index = k;
    if (halves) {
      half_rows(p.map, k, r_first, r_second);
    } else if (p.map.kind == ThdRowMap::kIndex) {
      r_first = clamp_row(p.map.index[k], p.map.local_rows);
      if (p.map.step_index != nullptr) s_index = clamp_row(p.map.step_index[k], p.map.step_count);
    }
    for (int hf = 0; hf < (halves ? 2 : 1); ++hf) {
      const int op = hf == 0 ? p.op0 : p.op1;
      if (op == kThdGradNone && !p.copy_none) continue;
      const int64_t r = hf == 0 ? r_first : r_second;
      const int64_t sr = p.map.kind == ThdRowMap::kIndex ? s_index : (p.step_is_half ? k : r);
      const bool use_g = op != kThdGradCopy;
      const bool use_s = op != kThdGradNone;
      for (int v0 = lane; v0 < nvec; v0 += 2 * lanes) {
        float g[2][VEC], s[2][VEC];
#pragma unroll
        for (int u = 0; u < 2; ++u) {
          const int v = v0 + u * lanes;
          if (v < nvec) {
            if (use_g)
              load_f32<VEC>(p.grad, r * p.grad_tok + row_offset<VEC>(v, vph, p.heads, p.grad_head),
                            p.grad_dtype, g[u]);
            if (use_s)
              load_f32<VEC>(p.step, sr * p.step_tok + row_offset<VEC>(v, vph, p.heads, p.step_head),
                            p.step_dtype, s[u]);
          }
        }
#pragma unroll
        for (int u = 0; u < 2; ++u) {
          const int v = v0 + u * lanes;
          if (v < nvec) {
            float o[VEC];
#pragma unroll
            for (int e = 0; e < VEC; ++e)
              o[e] = use_g && use_s ? g[u][e] + s[u][e] : (use_g ? g[u][e] : s[u][e]);
            store_f32<VEC>(p.dst, r * p.dst_tok + row_offset<VEC>(v, vph, p.heads, p.dst_head),
                           p.grad_dtype, o);
          }
        }
      }
    }
  }
}

}  // namespace thd
