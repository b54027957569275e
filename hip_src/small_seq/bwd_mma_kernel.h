// Small-seq attention backward for GQA groups of 2..8 q heads per kv head, on matrix units.
//
// One wave per (segment, kv head), like the general backward, with the group's q heads as the
// 8/16-row side of tile products (mma.h). With P = exp(scale q K^T - lse) recomputed from the
// forward's float32 LSE and dP = dO V^T:
//   D_h   = sum_j P[h][j] dP[h][j]            (= rowsum(dO * O) for O = P V; O is not read)
//   dS    = scale * P * (dP - (D - dlse))      per head row
//   dQ    = dS K,   dK = dS^T q,   dV = P^T dO
// The products over kv rows (dQ) need dS with q heads as rows; those over q heads (dK, dV) need
// P and dS with kv rows as rows. Both orientations are computed from their own score products
// (S = q K^T and S^T = K q^T, dP and dP^T: four cheap tile products from the same registers)
// rather than transposed across lanes, so each becomes a P-operand in registers (mma.h).
// Every gradient sums its group inside the wave: deterministic, no atomics.
//
// Numerics (NOTE): scores, P, dP, D and dS are fp32; P^T, dS, dS^T are rounded to the input dtype
// only as operands of the three output products (as flash-attention does), ~2^-9 (bf16) per
// term, inside the 16-bit gradient bounds. D_h from P and dP rather than from the stored bf16
// O is the exact-arithmetic identity, evaluated on the values the gradient actually uses.
#pragma once

#include "bwd_kernel.h"
#include "fwd_mma_kernel.h"

namespace small_seq {

// Largest group the matrix-unit backward serves in one pass on every vendor (NVIDIA tiles of
// 8 q heads; CDNA tiles hold 16). Wider groups take the general backward (launch_impl.h).
constexpr int kBwdMmaMaxGroup = 8;

#if RA_HAS_MMA

template <typename T, int D, int KV>
RA_DEVICE void bwd_mma_item(const SmallSeqParams& p, const int seg, const int hk,
                            const Segment& s, const int lane) {
  using M = MmaShape<D, KV>;
  constexpr int DS = M::kSliceD;
  constexpr int NSL = M::kSlices;
  constexpr int NS = M::kScoreN;
  constexpr int HB = M::kHeads;
  static_assert(HB >= kBwdMmaMaxGroup, "one tile of q heads must hold the group");

  if (!bwd_edges<T, D, KV>(p, seg, hk, s, lane)) return;

  const int group = p.num_heads_q / p.num_heads_kv;  // 2 .. kBwdMmaMaxGroup (launcher)
  const int len = s.len;
  const int hq0 = hk * group;
  const float scale = p.softmax_scale;
  const float log2_scale = scale * kLog2e;
  const uint16_t* qbase = static_cast<const uint16_t*>(p.q) + s.q_row * p.q_token_stride +
                          static_cast<int64_t>(hq0) * p.q_head_stride;
  const uint16_t* dobase = static_cast<const uint16_t*>(p.dout) + s.q_row * p.do_token_stride +
                           static_cast<int64_t>(hq0) * p.do_head_stride;
  const uint16_t* kbase = static_cast<const uint16_t*>(p.k) + s.k_base + hk * p.k_head_stride;
  const uint16_t* vbase = static_cast<const uint16_t*>(p.v) + s.v_base + hk * p.v_head_stride;
  uint16_t* dqbase = static_cast<uint16_t*>(p.dq) + s.q_row * p.dq_token_stride +
                     static_cast<int64_t>(hq0) * p.dq_head_stride;
  uint16_t* dkbase = static_cast<uint16_t*>(p.dk) + s.dkv_base + hk * p.dkv_head_stride;
  uint16_t* dvbase = static_cast<uint16_t*>(p.dv) + s.dkv_base + hk * p.dkv_head_stride;

  // 1. Scores and dP, both orientations, accumulated over head-dim slices.
  ra_mma_acc<NS> sc, dp;    // [q head][kv row]
  ra_mma_acc<HB> sct, dpt;  // [kv row][q head]
  ra_mma_zero(sc);
  ra_mma_zero(dp);
  ra_mma_zero(sct);
  ra_mma_zero(dpt);
#pragma unroll
  for (int c = 0; c < NSL; ++c) {
    ra_mma_rows<DS, HB> qr, dor;
    ra_mma_rows<DS, KV> kr, vr;
    ra_mma_load_rows(kr, kbase + c * DS, p.k_token_stride, len, lane);
    ra_mma_load_rows(qr, qbase + c * DS, p.q_head_stride, group, lane);
    ra_mma_load_rows(vr, vbase + c * DS, p.v_token_stride, len, lane);
    ra_mma_load_rows(dor, dobase + c * DS, p.do_head_stride, group, lane);
    ra_mma_dot<T>(sc, qr, kr);
    ra_mma_dot<T>(sct, kr, qr);
    ra_mma_dot<T>(dp, dor, vr);
    ra_mma_dot<T>(dpt, vr, dor);
  }

  // 2a. q heads as rows: dS (times scale) for dQ = dS K. Rows past the group and columns past
  // the segment are exact zeros (never exp of garbage).
  {
    constexpr int E = ra_mma_acc<NS>::kElems;
    float lse2[kRaMmaAccSlots], dlse[kRaMmaAccSlots], dsum[kRaMmaAccSlots];
#pragma unroll
    for (int i = 0; i < E; ++i) {
      const int row = ra_mma_acc_row(lane, i);
      const int hq = hq0 + row;
      lse2[ra_mma_acc_slot(i)] =
          row < group ? p.lse[static_cast<int64_t>(hq) * p.batch + seg] * kLog2e : 0.f;
      dlse[ra_mma_acc_slot(i)] = row < group ? head_dlse(p, hq, seg) : 0.f;
      dsum[ra_mma_acc_slot(i)] = 0.f;
    }
#pragma unroll
    for (int i = 0; i < E; ++i) {
      const bool live = ra_mma_acc_row(lane, i) < group && ra_mma_acc_col(lane, i) < len;
      const float pr = live ? exp2f(sc.x[i] * log2_scale - lse2[ra_mma_acc_slot(i)]) : 0.f;
      sc.x[i] = pr;
      dsum[ra_mma_acc_slot(i)] += pr * dp.x[i];
    }
#pragma unroll
    for (int r = 0; r < kRaMmaAccSlots; ++r) dsum[r] = ra_mma_row_sum(dsum[r]) - dlse[r];
#pragma unroll
    for (int i = 0; i < E; ++i)
      sc.x[i] = sc.x[i] * (dp.x[i] - dsum[ra_mma_acc_slot(i)]) * scale;
  }
  const ra_mma_pfrag<HB> ds_f = ra_mma_to_pfrag<T, HB>(sc);

  // 2b. kv rows as rows: P^T for dV = P^T dO and dS^T (times scale) for dK = dS^T q.
  {
    constexpr int E = ra_mma_acc<HB>::kElems;
    ra_mma_acc<HB> prod;
#pragma unroll
    for (int i = 0; i < E; ++i) {
      const int col = ra_mma_acc_col(lane, i);  // q head
      const bool live = col < group && ra_mma_acc_row(lane, i) < len;
      const float lse2 =
          col < group ? p.lse[static_cast<int64_t>(hq0 + col) * p.batch + seg] * kLog2e : 0.f;
      const float pr = live ? exp2f(sct.x[i] * log2_scale - lse2) : 0.f;
      sct.x[i] = pr;
      prod.x[i] = pr * dpt.x[i];
    }
    const ra_mma_acc<HB> dsum = ra_mma_col_sum(prod);
#pragma unroll
    for (int i = 0; i < E; ++i) {
      const int col = ra_mma_acc_col(lane, i);
      const float term = dsum.x[i] - (col < group ? head_dlse(p, hq0 + col, seg) : 0.f);
      dpt.x[i] = sct.x[i] * (dpt.x[i] - term) * scale;  // dS^T
    }
  }
  const ra_mma_pfrag<16> pt_f = ra_mma_to_pfrag<T, 16>(sct);
  const ra_mma_pfrag<16> dst_f = ra_mma_to_pfrag<T, 16>(dpt);

  // 3. The three output products, per head-dim slice. Their operands are K, dO and q again in
  // the P.V operand layout: second reads of what step 1 just read (cache hits).
#pragma unroll
  for (int c = 0; c < NSL; ++c) {
    {
      ra_mma_vrows<DS, KV> kv;
      ra_mma_load_vrows(kv, kbase + c * DS, p.k_token_stride, len, lane);
      ra_mma_out<DS, HB> dq;
      ra_mma_zero(dq);
      ra_mma_pv<T>(dq, ds_f, kv);
      ra_mma_store_rows<T>(dq, dqbase + c * DS, p.dq_head_stride, group, lane);
    }
    {
      ra_mma_vrows<DS, HB> dov;
      ra_mma_load_vrows(dov, dobase + c * DS, p.do_head_stride, group, lane);
      ra_mma_out<DS, 16> dv;
      ra_mma_zero(dv);
      ra_mma_pv<T>(dv, pt_f, dov);
      ra_mma_store_rows<T>(dv, dvbase + c * DS, p.dkv_token_stride, len, lane);
    }
    {
      ra_mma_vrows<DS, HB> qv;
      ra_mma_load_vrows(qv, qbase + c * DS, p.q_head_stride, group, lane);
      ra_mma_out<DS, 16> dk;
      ra_mma_zero(dk);
      ra_mma_pv<T>(dk, dst_f, qv);
      ra_mma_store_rows<T>(dk, dkbase + c * DS, p.dkv_token_stride, len, lane);
    }
  }
}

#endif  // RA_HAS_MMA

// Grid-stride over (segment, kv head) items, like the general backward (launch_impl.h picks
// this kernel for groups of 2..kBwdMmaMaxGroup). Targets without matrix units compile the general
// body here.
template <typename T, int D, int KV>
__global__ void __launch_bounds__(kMaxThreadsPerBlock) small_seq_bwd_mma_kernel(const SmallSeqParams p) {
#if RA_HAS_MMA
  const int lane = threadIdx.x % RA_WAVE_SIZE;
  bwd_grid_stride<true>(
      p, [&](int seg, int hk, const Segment& s) { bwd_mma_item<T, D, KV>(p, seg, hk, s, lane); });
#else
  bwd_persistent<T, D, KV>(p);
#endif
}

}  // namespace small_seq
