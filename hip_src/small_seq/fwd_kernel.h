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

// Compile-time shape of the forward pass for one (D, KV, wave width).
template <int D, int KV>
struct FwdShape {
  using Tl = Tiling<D, KV, RA_WAVE_SIZE>;
  static constexpr int kVPL = Tl::kVecsPerLane;
  static constexpr int kLPR = Tl::kLanesPerRow;
  static constexpr int kRPP = Tl::kRowsPerPass;
  static constexpr int kSlots = Tl::kSlots;
  // NOTE: K and V of a chunk stay in registers across the q heads of the GQA group; 8 vectors
  // of each (64 registers) is the most we hold, which keeps d <= 128 in one chunk on every
  // wave width and d=256/512 on a 32-lane warp in a few chunks without spilling.
  static constexpr int kChunk = kSlots < 8 / kVPL ? kSlots : 8 / kVPL;
  static constexpr int kChunks = (kSlots + kChunk - 1) / kChunk;
  // Small items (K+V of a segment <= 8 vectors per lane) are double buffered in the plain loop:
  // the next item's loads are in flight while this one computes, which hides the per-item
  // latency chain (cu_seqlens -> K/V) that dominates short segments. One q head per kv head
  // takes fwd_pipelined instead (same overlap, one stage of registers).
  static constexpr bool kDoubleBuffer = kChunks == 1 && 2 * kChunk * kVPL <= 8;
};

// What a wave has loaded for one work item: its segment and (single-chunk shapes) K and V.
template <int D, int KV>
struct FwdStage {
  using S = FwdShape<D, KV>;
  Segment s;
  int seg;
  int hk;
  ra_vec8 kr[S::kChunk][S::kVPL];
  ra_vec8 vr[S::kChunk][S::kVPL];
};

// Issues every load of one item (K/V rows when they fit one chunk), given its segment bounds.
template <int D, int KV>
RA_DEVICE void fwd_load(const SmallSeqParams& p, const int64_t item, const SegmentBounds& bounds,
                        const int lane, FwdStage<D, KV>& st) {
  using S = FwdShape<D, KV>;
  st.seg = static_cast<int>(item / p.num_heads_kv);
  st.hk = static_cast<int>(item % p.num_heads_kv);
  st.s = resolve_segment(p, st.seg, bounds);
  if constexpr (S::kChunks == 1) {
    const int row_group = lane / S::kLPR;
    const int col_lane = lane % S::kLPR;
    const uint16_t* kbase =
        static_cast<const uint16_t*>(p.k) + st.s.k_base + st.hk * p.k_head_stride;
    const uint16_t* vbase =
        static_cast<const uint16_t*>(p.v) + st.s.v_base + st.hk * p.v_head_stride;
    load_rows<S::kChunk, S::kVPL, S::kLPR, S::kRPP>(st.kr, kbase, p.k_token_stride, 0, row_group,
                                                    col_lane, st.s.len);
    load_rows<S::kChunk, S::kVPL, S::kLPR, S::kRPP>(st.vr, vbase, p.v_token_stride, 0, row_group,
                                                    col_lane, st.s.len);
  }
}

// A segment that breaks the contract: counted once (by the wave of kv head 0), and every output
// of the group's q heads is NaN (o rows when the q row is in bounds, lse, probs).
template <typename T, int D, int KV, bool ROW_MAX = false>
RA_DEVICE void fwd_write_invalid(const SmallSeqParams& p, const int seg, const int hk,
                                 const Segment& s, const int lane, float* row_max = nullptr) {
  constexpr int WAVE = RA_WAVE_SIZE;
  using S = FwdShape<D, KV>;
  constexpr int VPL = S::kVPL;
  constexpr int LPR = S::kLPR;
  const int group = p.num_heads_q / p.num_heads_kv;
  const int row_group = lane / LPR;
  const int col_lane = lane % LPR;
  uint16_t* o = static_cast<uint16_t*>(p.o);
  if (hk == 0 && lane == 0) report_bad_segment(p, seg);
  for (int g = 0; g < group; ++g) {
    const int hq = hk * group + g;
    if (lane == 0) {
      p.lse[static_cast<int64_t>(hq) * p.batch + seg] = ra_nan();
      if constexpr (ROW_MAX) row_max[static_cast<int64_t>(hq) * p.batch + seg] = ra_nan();
    }
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
}

// Softmax(q K^T) V for every q head of the item's GQA group, from a loaded stage.
template <typename T, int D, int KV, bool ROW_MAX = false>
RA_DEVICE void fwd_compute(const SmallSeqParams& p, FwdStage<D, KV>& st, const int lane,
                           float* row_max = nullptr) {
  constexpr int WAVE = RA_WAVE_SIZE;
  using S = FwdShape<D, KV>;
  constexpr int VPL = S::kVPL;
  constexpr int LPR = S::kLPR;
  constexpr int RPP = S::kRPP;
  constexpr int SLOTS = S::kSlots;
  constexpr int CH = S::kChunk;
  constexpr int NCH = S::kChunks;

  const int seg = st.seg;
  const int hk = st.hk;
  const Segment& s = st.s;
  const int group = p.num_heads_q / p.num_heads_kv;
  const int row_group = lane / LPR;
  const int col_lane = lane % LPR;

  uint16_t* o = static_cast<uint16_t*>(p.o);
  if (!s.valid) {
    fwd_write_invalid<T, D, KV, ROW_MAX>(p, seg, hk, s, lane, row_max);
    return;
  }

  const uint16_t* kbase = static_cast<const uint16_t*>(p.k) + s.k_base + hk * p.k_head_stride;
  const uint16_t* vbase = static_cast<const uint16_t*>(p.v) + s.v_base + hk * p.v_head_stride;
  auto& kr = st.kr;
  auto& vr = st.vr;
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
    if (lane == 0) {
      p.lse[static_cast<int64_t>(hq) * p.batch + seg] =
          l_total > 0.f ? (m + log2f(l_total)) * kLn2 : -INFINITY;
      // m is the exact maximum of the row's scores (log2 domain)
      if constexpr (ROW_MAX)
        row_max[static_cast<int64_t>(hq) * p.batch + seg] = l_total > 0.f ? m * kLn2 : -INFINITY;
    }
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

// Grid-stride over (segment, kv head) items: the launcher sizes the grid to what stays
// resident, so waves are not re-launched per item and block scheduling drops out of the loop.
template <typename T, int D, int KV, bool ROW_MAX = false>
RA_DEVICE void fwd_persistent(const SmallSeqParams& p, float* row_max = nullptr) {
  constexpr int WAVE = RA_WAVE_SIZE;
  const int lane = threadIdx.x % WAVE;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * (blockDim.x / WAVE);
  const int64_t items = static_cast<int64_t>(p.batch) * p.num_heads_kv;
  int64_t item = static_cast<int64_t>(blockIdx.x) * (blockDim.x / WAVE) + threadIdx.x / WAVE;
  auto bounds_of = [&](int64_t it) { return fetch_bounds(p, static_cast<int>(it / p.num_heads_kv)); };
  if constexpr (FwdShape<D, KV>::kDoubleBuffer) {
    // Alternate between two stages (double buffering); written out twice so both stay in registers.
    FwdStage<D, KV> a, b;
    if (item < items) fwd_load<D, KV>(p, item, bounds_of(item), lane, a);
    while (item < items) {
      int64_t next = item + stride;
      if (next < items) fwd_load<D, KV>(p, next, bounds_of(next), lane, b);
      fwd_compute<T, D, KV, ROW_MAX>(p, a, lane, row_max);
      item = next;
      if (item >= items) break;
      next = item + stride;
      if (next < items) fwd_load<D, KV>(p, next, bounds_of(next), lane, a);
      fwd_compute<T, D, KV, ROW_MAX>(p, b, lane, row_max);
      item = next;
    }
  } else {
    // Single stage (K/V too large to double): still read the next item's segment bounds
    // before computing this one, so only the K/V latency is exposed per item.
    SegmentBounds bounds = item < items ? bounds_of(item) : SegmentBounds{};
    for (; item < items; item += stride) {
      FwdStage<D, KV> st;
      fwd_load<D, KV>(p, item, bounds, lane, st);
      if (item + stride < items) bounds = bounds_of(item + stride);
      fwd_compute<T, D, KV, ROW_MAX>(p, st, lane, row_max);
    }
  }
}

// Software-pipelined grid-stride loop for one q head per kv head and K/V in one chunk: a lane's
// K registers are dead once the scores are reduced and its V registers once P.V is summed, so the
// next item's K and q loads are issued right after this item's scores and its V loads right
// after this item's P.V. Loads stay in flight through the softmax, the output reductions and the
// stores, with the registers of one stage (the double buffer needs two, and at d=128 kv=16 it
// lost more warps per SM than it gained: docs/kernels.md#small-seq-forward). The arithmetic is fwd_compute's, in the
// same order, so both loops give bitwise equal results.
template <typename T, int D, int KV, bool ROW_MAX = false>
RA_DEVICE void fwd_pipelined(const SmallSeqParams& p, float* row_max = nullptr) {
  constexpr int WAVE = RA_WAVE_SIZE;
  using S = FwdShape<D, KV>;
  static_assert(S::kChunks == 1, "the pipelined loop holds all of an item's K/V at once");
  constexpr int VPL = S::kVPL;
  constexpr int LPR = S::kLPR;
  constexpr int RPP = S::kRPP;
  constexpr int SLOTS = S::kSlots;
  const int lane = threadIdx.x % WAVE;
  const int row_group = lane / LPR;
  const int col_lane = lane % LPR;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * (blockDim.x / WAVE);
  const int64_t items = static_cast<int64_t>(p.batch) * p.num_heads_kv;
  int64_t item = static_cast<int64_t>(blockIdx.x) * (blockDim.x / WAVE) + threadIdx.x / WAVE;
  if (item >= items) return;
  const float qscale = p.softmax_scale * kLog2e;
  const uint16_t* k = static_cast<const uint16_t*>(p.k);
  const uint16_t* v = static_cast<const uint16_t*>(p.v);
  const uint16_t* q = static_cast<const uint16_t*>(p.q);
  uint16_t* o = static_cast<uint16_t*>(p.o);

  auto k_of = [&](const Segment& sg, int hk) { return k + sg.k_base + hk * p.k_head_stride; };
  auto v_of = [&](const Segment& sg, int hk) { return v + sg.v_base + hk * p.v_head_stride; };
  // q row of an item (group == 1: q head == kv head); an invalid segment's q row may be -1.
  auto load_q = [&](const Segment& sg, int hq, ra_vec8 (&dst)[VPL]) {
    const int64_t row = sg.q_row < 0 ? 0 : sg.q_row;
#pragma unroll
    for (int vi = 0; vi < VPL; ++vi)
      dst[vi] = ra_load16(q + row * p.q_token_stride + hq * p.q_head_stride +
                          (col_lane + vi * LPR) * 8);
  };

  // Stage of the current item: its segment, K, V and raw q.
  int seg = static_cast<int>(item / p.num_heads_kv);
  int hk = static_cast<int>(item % p.num_heads_kv);
  Segment s = resolve_segment(p, seg, fetch_bounds(p, seg));
  ra_vec8 kr[SLOTS][VPL], vr[SLOTS][VPL], qr[VPL];
  load_rows<SLOTS, VPL, LPR, RPP>(kr, k_of(s, hk), p.k_token_stride, 0, row_group, col_lane, s.len);
  load_q(s, hk, qr);
  load_rows<SLOTS, VPL, LPR, RPP>(vr, v_of(s, hk), p.v_token_stride, 0, row_group, col_lane, s.len);
  SegmentBounds nb = item + stride < items
                         ? fetch_bounds(p, static_cast<int>((item + stride) / p.num_heads_kv))
                         : SegmentBounds{};
  for (;;) {
    const int64_t next = item + stride;
    const bool has_next = next < items;
    const int nseg = static_cast<int>(next / p.num_heads_kv);
    const int nhk = static_cast<int>(next % p.num_heads_kv);
    const Segment ns = has_next ? resolve_segment(p, nseg, nb) : Segment{};
    if (next + stride < items)
      nb = fetch_bounds(p, static_cast<int>((next + stride) / p.num_heads_kv));

    if (!s.valid) {
      fwd_write_invalid<T, D, KV, ROW_MAX>(p, seg, hk, s, lane, row_max);
      if (has_next) {
        load_rows<SLOTS, VPL, LPR, RPP>(kr, k_of(ns, nhk), p.k_token_stride, 0, row_group,
                                        col_lane, ns.len);
        load_q(ns, nhk, qr);
        load_rows<SLOTS, VPL, LPR, RPP>(vr, v_of(ns, nhk), p.v_token_stride, 0, row_group,
                                        col_lane, ns.len);
      }
    } else {
      float qf[VPL][8];
#pragma unroll
      for (int vi = 0; vi < VPL; ++vi) {
        ra_unpack8<T>(qr[vi], qf[vi]);
#pragma unroll
        for (int e = 0; e < 8; ++e) qf[vi][e] *= qscale;
      }
      float scores[SLOTS];
      float m = -INFINITY;
#pragma unroll
      for (int slot = 0; slot < SLOTS; ++slot) {
        const float d = ra_group_sum<LPR>(dot_part<T, VPL>(qf, kr[slot]));
        const int row = slot * RPP + row_group;
        scores[slot] = row < s.len ? d : -INFINITY;
        m = fmaxf(m, scores[slot]);
      }
      // K and q are consumed: the next item's loads go out now.
      if (has_next) {
        load_rows<SLOTS, VPL, LPR, RPP>(kr, k_of(ns, nhk), p.k_token_stride, 0, row_group,
                                        col_lane, ns.len);
        load_q(ns, nhk, qr);
      }
      m = ra_strided_max<LPR, WAVE>(m);
      float l = 0.f;
      float acc[VPL][8] = {};
      if (m != -INFINITY) {
#pragma unroll
        for (int slot = 0; slot < SLOTS; ++slot) {
          const float pr = exp2f(scores[slot] - m);
          l += pr;
#pragma unroll
          for (int vi = 0; vi < VPL; ++vi) {
            float vf[8];
            ra_unpack8<T>(vr[slot][vi], vf);
#pragma unroll
            for (int e = 0; e < 8; ++e) acc[vi][e] = fmaf(pr, vf[e], acc[vi][e]);
          }
        }
      }
      if (has_next)
        load_rows<SLOTS, VPL, LPR, RPP>(vr, v_of(ns, nhk), p.v_token_stride, 0, row_group,
                                        col_lane, ns.len);
      const float l_total = ra_strided_sum<LPR, WAVE>(l);
      const float inv = l_total > 0.f ? 1.f / l_total : 0.f;
#pragma unroll
      for (int vi = 0; vi < VPL; ++vi)
#pragma unroll
        for (int e = 0; e < 8; ++e) acc[vi][e] = ra_strided_sum<LPR, WAVE>(acc[vi][e]) * inv;
      if (row_group == 0)
        store_row_f32<T, VPL>(o + s.q_row * p.o_token_stride + hk * p.o_head_stride, acc,
                              col_lane, LPR);
      if (lane == 0) {
        p.lse[static_cast<int64_t>(hk) * p.batch + seg] =
            l_total > 0.f ? (m + log2f(l_total)) * kLn2 : -INFINITY;
        // m is the exact maximum of the row's scores (log2 domain)
        if constexpr (ROW_MAX)
          row_max[static_cast<int64_t>(hk) * p.batch + seg] =
              l_total > 0.f ? m * kLn2 : -INFINITY;
      }
      if (p.probs != nullptr && col_lane == 0) {
        float* prow = p.probs + (static_cast<int64_t>(seg) * p.num_heads_q + hk) * p.max_seqlen_kv;
#pragma unroll
        for (int slot = 0; slot < SLOTS; ++slot) {
          const int row = slot * RPP + row_group;
          if (row < p.max_seqlen_kv) prow[row] = row < s.len ? exp2f(scores[slot] - m) * inv : 0.f;
        }
      }
    }
    if (!has_next) break;
    item = next;
    seg = nseg;
    hk = nhk;
    s = ns;
  }
}

// Whether a shape can take the pipelined loop (all of an item's K/V in one chunk); the plan
// also requires one q head per kv head and the forward bit of tuning small_seq_pipe, and the
// launcher refuses a PIPE record where either fails.
template <int D, int KV>
constexpr bool kFwdPipelinable = FwdShape<D, KV>::kChunks == 1;

template <typename T, int D, int KV, bool PIPE>
__global__ void __launch_bounds__(kMaxThreadsPerBlock) small_seq_fwd_kernel(const SmallSeqParams p) {
  if constexpr (PIPE && kFwdPipelinable<D, KV>) {
    fwd_pipelined<T, D, KV>(p);
  } else {
    fwd_persistent<T, D, KV>(p);
  }
}

// The same forward that also writes each row's maximum scaled logit to row_max ([h_q, b],
// indexed as the LSE: return_max_logit). A kernel of its own with row_max beside the params, so
// that the default kernel and SmallSeqParams carry nothing of it.
template <typename T, int D, int KV, bool PIPE>
__global__ void __launch_bounds__(kMaxThreadsPerBlock)
    small_seq_fwd_row_max_kernel(const SmallSeqParams p, float* row_max) {
  if constexpr (PIPE && kFwdPipelinable<D, KV>) {
    fwd_pipelined<T, D, KV, true>(p, row_max);
  } else {
    fwd_persistent<T, D, KV, true>(p, row_max);
  }
}

}  // namespace small_seq
