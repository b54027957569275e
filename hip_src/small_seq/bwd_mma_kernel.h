// Small-seq attention backward for GQA groups (num_heads_q / num_heads_kv >= 2) on matrix units.
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
// Two kernels, picked per call by the group size (launch_impl.h):
// - small_seq_bwd_mma_kernel, groups of 2..kBwdMmaMaxGroup (8): one tile of q heads (8 rows on
//   NVIDIA's m16n8 tiles, 16 on CDNA) holds the group, so the scores are computed once and
//   dQ, dV, dK follow per head-dim slice, each tile stored as soon as it is complete.
// - small_seq_bwd_mma_wide_kernel, wider groups (12, 16, 32, ...): the group is walked in blocks
//   of one tile of q heads (MmaShape::kHeads; the last block may be partial). Each block's dQ is
//   stored when computed; dK and dV are sums over the blocks, accumulated in fp32 tiles inside
//   the wave (block order fixed: deterministic, no atomics) and written once. Holding both
//   tiles (2 x kv rows x D fp32) beside a block's operands is cheap only for small D, so:
//     D <= kBwdMmaOnePassMaxD (64): one pass per block, scores once, dQ stored, dV and dK
//       accumulated together;
//     larger D: three passes over the blocks, each holding at most one tile of 16 x 128 fp32
//       (64 registers per lane on NVIDIA): dQ (S and dP), then per 128-wide head-dim slice
//       dV (from S^T alone) and dK (S^T and dP^T). Scores are recomputed per pass (and per
//       slice for D > 128) from rows the wave has just read (cache hits): tile products are
//       cheap next to the bytes, and registers set the occupancy that hides those bytes' latency.
//   A separate kernel rather than a branch in the first: the blocked passes' loop-carried
//   tiles and addresses raised the one-tile kernel's registers (e.g. sm_90 d64 88 -> 116,
//   gfx90a d64 occupancy 3 -> 2), i.e. the occupancy of groups 2..8, whose code and registers
//   stay as they were.
//
// Numerics (NOTE): scores, P, dP, D and dS are fp32; P^T, dS, dS^T are rounded to the input dtype
// only as operands of the three output products (as flash-attention does), ~2^-9 (bf16) per
// term, inside the 16-bit gradient bounds. D_h from P and dP rather than from the stored bf16
// O is the exact-arithmetic identity, evaluated on the values the gradient actually uses. The
// blocked kernel sums dK / dV over blocks in fp32 before the one rounding to the output dtype.
#pragma once

#include "bwd_kernel.h"
#include "fwd_mma_kernel.h"

namespace small_seq {

// Largest group the one-tile backward (bwd_mma_item) serves on every vendor: NVIDIA tiles hold
// 8 q heads (CDNA tiles 16). Wider groups take the blocked backward (bwd_mma_wide_item).
constexpr int kBwdMmaMaxGroup = 8;

// Head dims up to this take the blocked backward in one pass per block (both dK / dV tiles
// live); larger ones in three (bwd_mma_wide_item).
constexpr int kBwdMmaOnePassMaxD = 64;

#if RA_HAS_MMA

// Which step-1 products bwd_mma_scores computes (a bit mask): q heads as rows (S = q K^T, and
// dP = dO V^T with kBwdDp), kv rows as rows (S^T = K q^T, and dP^T = V dO^T with kBwdDp).
constexpr int kBwdRows = 1;
constexpr int kBwdCols = 2;
constexpr int kBwdDp = 4;
constexpr int kBwdAll = kBwdRows | kBwdCols | kBwdDp;

// Step 1 for the q heads of one block (qb, dob: rows of its first head, nh heads) over one
// W-wide head-dim slice, added to the accumulators WHAT names (the others are left alone).
template <typename T, int W, int WHAT, int KV, int NS, int HB>
RA_DEVICE void bwd_mma_score_slice(const SmallSeqParams& p, const uint16_t* qb,
                                   const uint16_t* dob, const uint16_t* kb, const uint16_t* vb,
                                   const int nh, const int len, const int lane,
                                   ra_mma_acc<NS>& sc, ra_mma_acc<NS>& dp, ra_mma_acc<HB>& sct,
                                   ra_mma_acc<HB>& dpt) {
  constexpr bool kRows = (WHAT & kBwdRows) != 0;
  constexpr bool kCols = (WHAT & kBwdCols) != 0;
  ra_mma_rows<W, HB> qr;
  ra_mma_rows<W, KV> kr;
  ra_mma_load_rows(kr, kb, p.k_token_stride, len, lane);
  ra_mma_load_rows(qr, qb, p.q_head_stride, nh, lane);
  if constexpr ((WHAT & kBwdDp) != 0) {
    ra_mma_rows<W, HB> dor;
    ra_mma_rows<W, KV> vr;
    ra_mma_load_rows(vr, vb, p.v_token_stride, len, lane);
    ra_mma_load_rows(dor, dob, p.do_head_stride, nh, lane);
    if constexpr (kRows) ra_mma_dot<T>(sc, qr, kr);
    if constexpr (kCols) ra_mma_dot<T>(sct, kr, qr);
    if constexpr (kRows) ra_mma_dot<T>(dp, dor, vr);
    if constexpr (kCols) ra_mma_dot<T>(dpt, vr, dor);
  } else {
    if constexpr (kRows) ra_mma_dot<T>(sc, qr, kr);
    if constexpr (kCols) ra_mma_dot<T>(sct, kr, qr);
  }
}

// Step 1 over the whole head dim in W-wide slices (the accumulators WHAT names start at zero).
// UNROLL: slices unrolled, so their loads can be in flight together; otherwise a loop, one
// slice's operands live at a time (fewer registers).
template <typename T, int D, int W, int WHAT, bool UNROLL, int KV, int NS, int HB>
RA_DEVICE void bwd_mma_scores(const SmallSeqParams& p, const uint16_t* qb, const uint16_t* dob,
                              const uint16_t* kbase, const uint16_t* vbase, const int nh,
                              const int len, const int lane, ra_mma_acc<NS>& sc,
                              ra_mma_acc<NS>& dp, ra_mma_acc<HB>& sct, ra_mma_acc<HB>& dpt) {
  ra_mma_zero(sc);
  ra_mma_zero(dp);
  ra_mma_zero(sct);
  ra_mma_zero(dpt);
  if constexpr (UNROLL) {
#pragma unroll
    for (int c = 0; c < D / W; ++c)
      bwd_mma_score_slice<T, W, WHAT, KV>(p, qb + c * W, dob + c * W, kbase + c * W,
                                          vbase + c * W, nh, len, lane, sc, dp, sct, dpt);
  } else {
#pragma unroll 1
    for (int c = 0; c < D / W; ++c)
      bwd_mma_score_slice<T, W, WHAT, KV>(p, qb + c * W, dob + c * W, kbase + c * W,
                                          vbase + c * W, nh, len, lane, sc, dp, sct, dpt);
  }
}

// Step 2a, q heads as rows: sc (scores) -> dS times scale, for dQ = dS K. hq0: the block's first
// q head, nh its heads. Rows past the block and columns past the segment are exact zeros
// (never exp of garbage).
template <int NS>
RA_DEVICE void bwd_mma_ds_rows(const SmallSeqParams& p, ra_mma_acc<NS>& sc,
                               const ra_mma_acc<NS>& dp, const int seg, const int hq0,
                               const int nh, const int len, const int lane) {
  constexpr int E = ra_mma_acc<NS>::kElems;
  const float scale = p.softmax_scale;
  const float log2_scale = scale * kLog2e;
  float lse2[kRaMmaAccSlots], dlse[kRaMmaAccSlots], dsum[kRaMmaAccSlots];
#pragma unroll
  for (int i = 0; i < E; ++i) {
    const int row = ra_mma_acc_row(lane, i);
    const int hq = hq0 + row;
    lse2[ra_mma_acc_slot(i)] =
        row < nh ? p.lse[static_cast<int64_t>(hq) * p.batch + seg] * kLog2e : 0.f;
    dlse[ra_mma_acc_slot(i)] = row < nh ? head_dlse(p, hq, seg) : 0.f;
    dsum[ra_mma_acc_slot(i)] = 0.f;
  }
#pragma unroll
  for (int i = 0; i < E; ++i) {
    const bool live = ra_mma_acc_row(lane, i) < nh && ra_mma_acc_col(lane, i) < len;
    const float pr = live ? exp2f(sc.x[i] * log2_scale - lse2[ra_mma_acc_slot(i)]) : 0.f;
    sc.x[i] = pr;
    dsum[ra_mma_acc_slot(i)] += pr * dp.x[i];
  }
#pragma unroll
  for (int r = 0; r < kRaMmaAccSlots; ++r) dsum[r] = ra_mma_row_sum(dsum[r]) - dlse[r];
#pragma unroll
  for (int i = 0; i < E; ++i) sc.x[i] = sc.x[i] * (dp.x[i] - dsum[ra_mma_acc_slot(i)]) * scale;
}

// Step 2b, kv rows as rows: sct (scores^T) -> P^T, for dV = P^T dO.
template <int HB>
RA_DEVICE void bwd_mma_pt(const SmallSeqParams& p, ra_mma_acc<HB>& sct, const int seg,
                          const int hq0, const int nh, const int len, const int lane) {
  constexpr int E = ra_mma_acc<HB>::kElems;
  const float log2_scale = p.softmax_scale * kLog2e;
#pragma unroll
  for (int i = 0; i < E; ++i) {
    const int col = ra_mma_acc_col(lane, i);  // q head
    const bool live = col < nh && ra_mma_acc_row(lane, i) < len;
    const float lse2 =
        col < nh ? p.lse[static_cast<int64_t>(hq0 + col) * p.batch + seg] * kLog2e : 0.f;
    sct.x[i] = live ? exp2f(sct.x[i] * log2_scale - lse2) : 0.f;
  }
}

// Step 2b continued: dpt (dP^T) -> dS^T times scale, for dK = dS^T q, from pt = P^T.
template <int HB>
RA_DEVICE void bwd_mma_dst(const SmallSeqParams& p, const ra_mma_acc<HB>& pt,
                           ra_mma_acc<HB>& dpt, const int seg, const int hq0, const int nh,
                           const int lane) {
  constexpr int E = ra_mma_acc<HB>::kElems;
  ra_mma_acc<HB> prod;
#pragma unroll
  for (int i = 0; i < E; ++i) prod.x[i] = pt.x[i] * dpt.x[i];
  const ra_mma_acc<HB> dsum = ra_mma_col_sum(prod);
#pragma unroll
  for (int i = 0; i < E; ++i) {
    const int col = ra_mma_acc_col(lane, i);
    const float term = dsum.x[i] - (col < nh ? head_dlse(p, hq0 + col, seg) : 0.f);
    dpt.x[i] = pt.x[i] * (dpt.x[i] - term) * p.softmax_scale;
  }
}

// Rows of one (segment, kv head) item: the group's first q head in q / dO / dQ, the segment's
// first kv row in K / V / dK / dV.
struct BwdMmaRows {
  const uint16_t* q;
  const uint16_t* dout;
  const uint16_t* k;
  const uint16_t* v;
  uint16_t* dq;
  uint16_t* dk;
  uint16_t* dv;
};

RA_DEVICE BwdMmaRows bwd_mma_rows(const SmallSeqParams& p, const int hk, const int hq0,
                                  const Segment& s) {
  BwdMmaRows r;
  r.q = static_cast<const uint16_t*>(p.q) + s.q_row * p.q_token_stride +
        static_cast<int64_t>(hq0) * p.q_head_stride;
  r.dout = static_cast<const uint16_t*>(p.dout) + s.q_row * p.do_token_stride +
           static_cast<int64_t>(hq0) * p.do_head_stride;
  r.k = static_cast<const uint16_t*>(p.k) + s.k_base + hk * p.k_head_stride;
  r.v = static_cast<const uint16_t*>(p.v) + s.v_base + hk * p.v_head_stride;
  r.dq = static_cast<uint16_t*>(p.dq) + s.q_row * p.dq_token_stride +
         static_cast<int64_t>(hq0) * p.dq_head_stride;
  r.dk = static_cast<uint16_t*>(p.dk) + s.dkv_base + hk * p.dkv_head_stride;
  r.dv = static_cast<uint16_t*>(p.dv) + s.dkv_base + hk * p.dkv_head_stride;
  return r;
}

// Groups of 2 .. kBwdMmaMaxGroup q heads: one tile of q heads holds the group, so the scores
// are computed once and the three output products follow per head-dim slice.
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
  const BwdMmaRows r = bwd_mma_rows(p, hk, hq0, s);

  // 1. Scores and dP, both orientations, accumulated over head-dim slices.
  ra_mma_acc<NS> sc, dp;    // [q head][kv row]
  ra_mma_acc<HB> sct, dpt;  // [kv row][q head]
  bwd_mma_scores<T, D, DS, kBwdAll, true, KV>(p, r.q, r.dout, r.k, r.v, group, len, lane, sc,
                                              dp, sct, dpt);
  // 2. dS (times scale) with q heads as rows; P^T and dS^T with kv rows as rows.
  bwd_mma_ds_rows(p, sc, dp, seg, hq0, group, len, lane);
  const ra_mma_pfrag<HB> ds_f = ra_mma_to_pfrag<T, HB>(sc);
  bwd_mma_pt(p, sct, seg, hq0, group, len, lane);
  bwd_mma_dst(p, sct, dpt, seg, hq0, group, lane);
  const ra_mma_pfrag<16> pt_f = ra_mma_to_pfrag<T, 16>(sct);
  const ra_mma_pfrag<16> dst_f = ra_mma_to_pfrag<T, 16>(dpt);

  // 3. The three output products, per head-dim slice. Their operands are K, dO and q again in
  // the P.V operand layout: second reads of what step 1 just read (cache hits).
#pragma unroll
  for (int c = 0; c < NSL; ++c) {
    {
      ra_mma_vrows<DS, KV> kv;
      ra_mma_load_vrows(kv, r.k + c * DS, p.k_token_stride, len, lane);
      ra_mma_out<DS, HB> dq;
      ra_mma_zero(dq);
      ra_mma_pv<T>(dq, ds_f, kv);
      ra_mma_store_rows<T>(dq, r.dq + c * DS, p.dq_head_stride, group, lane);
    }
    {
      ra_mma_vrows<DS, HB> dov;
      ra_mma_load_vrows(dov, r.dout + c * DS, p.do_head_stride, group, lane);
      ra_mma_out<DS, 16> dv;
      ra_mma_zero(dv);
      ra_mma_pv<T>(dv, pt_f, dov);
      ra_mma_store_rows<T>(dv, r.dv + c * DS, p.dkv_token_stride, len, lane);
    }
    {
      ra_mma_vrows<DS, HB> qv;
      ra_mma_load_vrows(qv, r.q + c * DS, p.q_head_stride, group, lane);
      ra_mma_out<DS, 16> dk;
      ra_mma_zero(dk);
      ra_mma_pv<T>(dk, dst_f, qv);
      ra_mma_store_rows<T>(dk, r.dk + c * DS, p.dkv_token_stride, len, lane);
    }
  }
}

// Groups wider than kBwdMmaMaxGroup: the group is walked in blocks of HB q heads (one tile; the
// last block may be partial). See the header comment for the passes.
template <typename T, int D, int KV>
RA_DEVICE void bwd_mma_wide_item(const SmallSeqParams& p, const int seg, const int hk,
                                 const Segment& s, const int lane) {
  using M = MmaShape<D, KV>;
  constexpr int DS = M::kSliceD;
  constexpr int NS = M::kScoreN;
  constexpr int HB = M::kHeads;
  constexpr int NKV = NS;  // kv rows of the dK / dV tiles (8 covers the kv <= 8 buckets)
  constexpr bool kOnePass = D <= kBwdMmaOnePassMaxD;
  // Head-dim slice of the score products, a loop (one slice's operands live at a time). Chosen
  // on sm_90 registers: 64 at d=128 (136 bf16, 14 warps/SM), 32 elsewhere (<= 168, 12 warps;
  // 64 spilled at d=256 kv16 fp16).
  constexpr int W = D == 128 ? 64 : 32;

  if (!bwd_edges<T, D, KV>(p, seg, hk, s, lane)) return;

  const int group = p.num_heads_q / p.num_heads_kv;  // > kBwdMmaMaxGroup (launcher)
  const int len = s.len;
  const int hq0 = hk * group;
  const BwdMmaRows r = bwd_mma_rows(p, hk, hq0, s);

  if constexpr (kOnePass) {
    // One pass per block: dQ stored, dV += P^T dO and dK += dS^T q in fp32 tiles.
    ra_mma_out<D, NKV> dv, dk;
    ra_mma_zero(dv);
    ra_mma_zero(dk);
#pragma unroll 1
    for (int h0 = 0; h0 < group; h0 += HB) {
      const int nh = min(HB, group - h0);
      const uint16_t* qb = r.q + h0 * p.q_head_stride;
      const uint16_t* dob = r.dout + h0 * p.do_head_stride;
      ra_mma_acc<NS> sc, dp;
      ra_mma_acc<HB> sct, dpt;
      bwd_mma_scores<T, D, W, kBwdAll, false, KV>(p, qb, dob, r.k, r.v, nh, len, lane, sc, dp,
                                                  sct, dpt);
      bwd_mma_ds_rows(p, sc, dp, seg, hq0 + h0, nh, len, lane);
      const ra_mma_pfrag<HB> ds_f = ra_mma_to_pfrag<T, HB>(sc);
      bwd_mma_pt(p, sct, seg, hq0 + h0, nh, len, lane);
      bwd_mma_dst(p, sct, dpt, seg, hq0 + h0, nh, lane);
      const ra_mma_pfrag<NKV> pt_f = ra_mma_to_pfrag<T, NKV>(sct);
      const ra_mma_pfrag<NKV> dst_f = ra_mma_to_pfrag<T, NKV>(dpt);
      {
        ra_mma_vrows<D, KV> kv;
        ra_mma_load_vrows(kv, r.k, p.k_token_stride, len, lane);
        ra_mma_out<D, HB> dq;
        ra_mma_zero(dq);
        ra_mma_pv<T>(dq, ds_f, kv);
        ra_mma_store_rows<T>(dq, r.dq + h0 * p.dq_head_stride, p.dq_head_stride, nh, lane);
      }
      {
        ra_mma_vrows<D, HB> dov;
        ra_mma_load_vrows(dov, dob, p.do_head_stride, nh, lane);
        ra_mma_pv<T>(dv, pt_f, dov);
      }
      {
        ra_mma_vrows<D, HB> qv;
        ra_mma_load_vrows(qv, qb, p.q_head_stride, nh, lane);
        ra_mma_pv<T>(dk, dst_f, qv);
      }
    }
    ra_mma_store_rows<T>(dv, r.dv, p.dkv_token_stride, len, lane);
    ra_mma_store_rows<T>(dk, r.dk, p.dkv_token_stride, len, lane);
  } else {
    // Pass 1, dQ: per block S, dP -> dS; dQ = dS K per head-dim slice, stored.
#pragma unroll 1
    for (int h0 = 0; h0 < group; h0 += HB) {
      const int nh = min(HB, group - h0);
      ra_mma_acc<NS> sc, dp;
      ra_mma_acc<HB> sct, dpt;  // not computed in this pass
      bwd_mma_scores<T, D, W, kBwdRows | kBwdDp, false, KV>(
          p, r.q + h0 * p.q_head_stride, r.dout + h0 * p.do_head_stride, r.k, r.v, nh, len, lane,
          sc, dp, sct, dpt);
      bwd_mma_ds_rows(p, sc, dp, seg, hq0 + h0, nh, len, lane);
      const ra_mma_pfrag<HB> ds_f = ra_mma_to_pfrag<T, HB>(sc);
#pragma unroll 1
      for (int c = 0; c < D / DS; ++c) {
        ra_mma_vrows<DS, KV> kv;
        ra_mma_load_vrows(kv, r.k + c * DS, p.k_token_stride, len, lane);
        ra_mma_out<DS, HB> dq;
        ra_mma_zero(dq);
        ra_mma_pv<T>(dq, ds_f, kv);
        ra_mma_store_rows<T>(dq, r.dq + h0 * p.dq_head_stride + c * DS, p.dq_head_stride, nh,
                             lane);
      }
    }
    // Passes 2 and 3 per head-dim slice: dV += P^T dO (from S^T alone), then dK += dS^T q (from
    // S^T and dP^T), one fp32 tile live across the blocks, stored once.
#pragma unroll 1
    for (int c = 0; c < D / DS; ++c) {
      const int col0 = c * DS;
      {
        ra_mma_out<DS, NKV> dv;
        ra_mma_zero(dv);
#pragma unroll 1
        for (int h0 = 0; h0 < group; h0 += HB) {
          const int nh = min(HB, group - h0);
          ra_mma_acc<NS> sc, dp;  // not computed in this pass
          ra_mma_acc<HB> sct, dpt;
          bwd_mma_scores<T, D, W, kBwdCols, false, KV>(p, r.q + h0 * p.q_head_stride, r.dout,
                                                      r.k, r.v, nh, len, lane, sc, dp, sct,
                                                      dpt);
          bwd_mma_pt(p, sct, seg, hq0 + h0, nh, len, lane);
          const ra_mma_pfrag<NKV> pt_f = ra_mma_to_pfrag<T, NKV>(sct);
          ra_mma_vrows<DS, HB> dov;
          ra_mma_load_vrows(dov, r.dout + h0 * p.do_head_stride + col0, p.do_head_stride, nh,
                            lane);
          ra_mma_pv<T>(dv, pt_f, dov);
        }
        ra_mma_store_rows<T>(dv, r.dv + col0, p.dkv_token_stride, len, lane);
      }
      {
        ra_mma_out<DS, NKV> dk;
        ra_mma_zero(dk);
#pragma unroll 1
        for (int h0 = 0; h0 < group; h0 += HB) {
          const int nh = min(HB, group - h0);
          ra_mma_acc<NS> sc, dp;  // not computed in this pass
          ra_mma_acc<HB> sct, dpt;
          bwd_mma_scores<T, D, W, kBwdCols | kBwdDp, false, KV>(
              p, r.q + h0 * p.q_head_stride, r.dout + h0 * p.do_head_stride, r.k, r.v, nh, len,
              lane, sc, dp, sct, dpt);
          bwd_mma_pt(p, sct, seg, hq0 + h0, nh, len, lane);
          bwd_mma_dst(p, sct, dpt, seg, hq0 + h0, nh, lane);
          const ra_mma_pfrag<NKV> dst_f = ra_mma_to_pfrag<T, NKV>(dpt);
          ra_mma_vrows<DS, HB> qv;
          ra_mma_load_vrows(qv, r.q + h0 * p.q_head_stride + col0, p.q_head_stride, nh, lane);
          ra_mma_pv<T>(dk, dst_f, qv);
        }
        ra_mma_store_rows<T>(dk, r.dk + col0, p.dkv_token_stride, len, lane);
      }
    }
  }
}

#endif  // RA_HAS_MMA

// Grid-stride over (segment, kv head) items, like the general backward: launch_impl.h picks this
// kernel for groups of 2..kBwdMmaMaxGroup, small_seq_bwd_mma_wide_kernel for wider ones. Targets
// without matrix units compile the general body in both.
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

template <typename T, int D, int KV>
__global__ void __launch_bounds__(kMaxThreadsPerBlock) small_seq_bwd_mma_wide_kernel(const SmallSeqParams p) {
#if RA_HAS_MMA
  const int lane = threadIdx.x % RA_WAVE_SIZE;
  bwd_grid_stride<true>(p, [&](int seg, int hk, const Segment& s) {
    bwd_mma_wide_item<T, D, KV>(p, seg, hk, s, lane);
  });
#else
  bwd_persistent<T, D, KV>(p);
#endif
}

}  // namespace small_seq
