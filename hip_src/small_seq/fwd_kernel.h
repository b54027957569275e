// Small-seq attention forward: one wave per (segment, kv head), serving every q head of the GQA
// group. The op is memory bound (~1 FLOP/byte), so the kernel's job is to have all K/V loads of
// a segment in flight before the first reduction and to touch every byte once.
#pragma once

#include "tiling.h"

namespace small_seq {

// Loads rows [slot0, slot0 + N) of this lane's slots; rows at or past `len` read as zeros so
// that masked rows contribute exact zeros (never garbage times zero).
template <int N, int VPL, int LPR, int RPP>
RA_DEVICE void load_rows(ra_vec8 (&dst)[N][VPL], const uint16_t* base, int64_t token_stride,
                         int slot0, int row_group, int col_lane, int len) {
#pragma unroll
  for (int i = 0; i < N; ++i) {
    const int row = (slot0 + i) * RPP + row_group;
#pragma unroll
    for (int vi = 0; vi < VPL; ++vi) {
      if (row < len) {
        dst[i][vi] = ra_load16(base + row * token_stride + (col_lane + vi * LPR) * 8);
      } else {
        dst[i][vi] = ra_vec8{{0u, 0u, 0u, 0u}};
      }
    }
  }
}

template <typename T, int VPL>
RA_DEVICE float dot_part(const float (&a)[VPL][8], const ra_vec8 (&b)[VPL]) {
  float s = 0.f;
#pragma unroll
  for (int vi = 0; vi < VPL; ++vi) {
    float bf[8];
    ra_unpack8<T>(b[vi], bf);
#pragma unroll
    for (int e = 0; e < 8; ++e) s = fmaf(a[vi][e], bf[e], s);
  }
  return s;
}

template <typename T, int VPL>
RA_DEVICE void load_row_f32(float (&dst)[VPL][8], const uint16_t* row, int col_lane, int lpr,
                            float scale) {
#pragma unroll
  for (int vi = 0; vi < VPL; ++vi) {
    ra_unpack8<T>(ra_load16(row + (col_lane + vi * lpr) * 8), dst[vi]);
#pragma unroll
    for (int e = 0; e < 8; ++e) dst[vi][e] *= scale;
  }
}

template <typename T, int VPL>
RA_DEVICE void store_row_f32(uint16_t* row, const float (&src)[VPL][8], int col_lane, int lpr) {
#pragma unroll
  for (int vi = 0; vi < VPL; ++vi) ra_store16(row + (col_lane + vi * lpr) * 8, ra_pack8<T>(src[vi]));
}

template <typename T, int D, int KV>
__global__ void __launch_bounds__(kMaxThreadsPerBlock) small_seq_fwd_kernel(const SmallSeqParams p) {
  constexpr int WAVE = RA_WAVE_SIZE;
  using Tl = Tiling<D, KV, WAVE>;
  constexpr int VPL = Tl::kVecsPerLane;
  constexpr int LPR = Tl::kLanesPerRow;
  constexpr int RPP = Tl::kRowsPerPass;
  constexpr int SLOTS = Tl::kSlots;
  // NOTE: K and V of a chunk stay in registers across the q heads of the GQA group; 8 vectors
  // of each (64 registers) is the most we hold, which keeps d <= 128 in one chunk on every
  // wave width and d=256/512 on a 32-lane warp in a few chunks without spilling.
  constexpr int CH = SLOTS < 8 / VPL ? SLOTS : 8 / VPL;
  constexpr int NCH = (SLOTS + CH - 1) / CH;

  const int lane = threadIdx.x % WAVE;
  const int64_t wave_id = static_cast<int64_t>(blockIdx.x) * (blockDim.x / WAVE) + threadIdx.x / WAVE;
  if (wave_id >= static_cast<int64_t>(p.batch) * p.num_heads_kv) return;
  const int seg = static_cast<int>(wave_id / p.num_heads_kv);
  const int hk = static_cast<int>(wave_id % p.num_heads_kv);
  const int group = p.num_heads_q / p.num_heads_kv;
  const int row_group = lane / LPR;
  const int col_lane = lane % LPR;

  const Segment s = load_segment(p, seg);
  uint16_t* o = static_cast<uint16_t*>(p.o);
  if (!s.valid) {
    if (hk == 0 && lane == 0) report_bad_segment(p, seg);
    for (int g = 0; g < group; ++g) {
      const int hq = hk * group + g;
      if (lane == 0) p.lse[static_cast<int64_t>(hq) * p.batch + seg] = ra_nan();
      if (s.q_row >= 0 && row_group == 0) {
        float nan_row[VPL][8];
#pragma unroll
        for (int vi = 0; vi < VPL; ++vi)
#pragma unroll
          for (int e = 0; e < 8; ++e) nan_row[vi][e] = ra_nan();
        store_row_f32<T, VPL>(o + s.q_row * p.o_token_stride + hq * p.o_head_stride, nan_row,
                              col_lane, LPR);
      }
      if (p.probs != nullptr)
        for (int j = lane; j < p.max_seqlen_kv; j += WAVE)
          p.probs[(static_cast<int64_t>(seg) * p.num_heads_q + hq) * p.max_seqlen_kv + j] = ra_nan();
    }
    return;
  }

  const uint16_t* kbase = static_cast<const uint16_t*>(p.k) + s.k_base + hk * p.k_head_stride;
  const uint16_t* vbase = static_cast<const uint16_t*>(p.v) + s.v_base + hk * p.v_head_stride;
  ra_vec8 kr[CH][VPL];
  ra_vec8 vr[CH][VPL];
  if constexpr (NCH == 1) {
    load_rows<CH, VPL, LPR, RPP>(kr, kbase, p.k_token_stride, 0, row_group, col_lane, s.len);
    load_rows<CH, VPL, LPR, RPP>(vr, vbase, p.v_token_stride, 0, row_group, col_lane, s.len);
  }
  // Scores are kept in the log2 domain: exp2 is one instruction on both vendors.
  const float qscale = p.softmax_scale * kLog2e;

  for (int g = 0; g < group; ++g) {
    const int hq = hk * group + g;
    float qf[VPL][8];
    load_row_f32<T, VPL>(qf, static_cast<const uint16_t*>(p.q) + s.q_row * p.q_token_stride +
                                 hq * p.q_head_stride,
                         col_lane, LPR, qscale);
    float m = -INFINITY;
    float l = 0.f;
    float acc[VPL][8] = {};
    float scores[SLOTS];
#pragma unroll
    for (int c = 0; c < NCH; ++c) {
      if constexpr (NCH > 1) {
        load_rows<CH, VPL, LPR, RPP>(kr, kbase, p.k_token_stride, c * CH, row_group, col_lane, s.len);
        load_rows<CH, VPL, LPR, RPP>(vr, vbase, p.v_token_stride, c * CH, row_group, col_lane, s.len);
      }
      float cmax = -INFINITY;
#pragma unroll
      for (int i = 0; i < CH; ++i) {
        const int slot = c * CH + i;
        if (slot >= SLOTS) break;
        const float d = ra_group_sum<LPR>(dot_part<T, VPL>(qf, kr[i]));
        const int row = slot * RPP + row_group;
        scores[slot] = row < s.len ? d : -INFINITY;
        cmax = fmaxf(cmax, scores[slot]);
      }
      cmax = ra_strided_max<LPR, WAVE>(cmax);
      const float m_new = fmaxf(m, cmax);
      if (m_new == -INFINITY) continue;  // every row so far is masked
      const float alpha = exp2f(m - m_new);  // 0 on the first visible chunk
      l *= alpha;
#pragma unroll
      for (int vi = 0; vi < VPL; ++vi)
#pragma unroll
        for (int e = 0; e < 8; ++e) acc[vi][e] *= alpha;
#pragma unroll
      for (int i = 0; i < CH; ++i) {
        const int slot = c * CH + i;
        if (slot >= SLOTS) break;
        const float pr = exp2f(scores[slot] - m_new);
        l += pr;
#pragma unroll
        for (int vi = 0; vi < VPL; ++vi) {
          float vf[8];
          ra_unpack8<T>(vr[i][vi], vf);
#pragma unroll
          for (int e = 0; e < 8; ++e) acc[vi][e] = fmaf(pr, vf[e], acc[vi][e]);
        }
      }
      m = m_new;
    }
    // Each row group summed its own rows; lanes of one row group hold identical l.
    const float l_total = ra_strided_sum<LPR, WAVE>(l);
    const float inv = l_total > 0.f ? 1.f / l_total : 0.f;
#pragma unroll
    for (int vi = 0; vi < VPL; ++vi)
#pragma unroll
      for (int e = 0; e < 8; ++e) acc[vi][e] = ra_strided_sum<LPR, WAVE>(acc[vi][e]) * inv;
    if (row_group == 0)
      store_row_f32<T, VPL>(o + s.q_row * p.o_token_stride + hq * p.o_head_stride, acc, col_lane,
                            LPR);
    if (lane == 0)
      p.lse[static_cast<int64_t>(hq) * p.batch + seg] =
          l_total > 0.f ? (m + log2f(l_total)) * kLn2 : -INFINITY;
    if (p.probs != nullptr && col_lane == 0) {
      float* prow = p.probs + (static_cast<int64_t>(seg) * p.num_heads_q + hq) * p.max_seqlen_kv;
#pragma unroll
      for (int slot = 0; slot < SLOTS; ++slot) {
        const int row = slot * RPP + row_group;
        if (row < p.max_seqlen_kv) prow[row] = row < s.len ? exp2f(scores[slot] - m) * inv : 0.f;
      }
    }
  }
}

}  // namespace small_seq
