// Small-seq attention forward for GQA groups (num_heads_q / num_heads_kv >= 2) on matrix units.
//
// One wave per (segment, kv head), as the general forward, but the group's q heads are served
// by two matrix products instead of per-head butterfly reductions:
//   S[h][j] = q_h . k_j            (ra_mma_dot: heads x kv rows, fp32 accumulators)
//   P       = softmax(scale * S)   (fp32, on the accumulator in registers, per head row)
//   O[h][:] = P[h][:] . V          (ra_mma_pv: P rounded to the input dtype, fp32 accumulators)
// K, V and q are read once, with 16-byte loads, straight into the operands (mma.h). The general
// kernel re-unpacked K/V and re-ran its reductions for every q head of the group and was
// issue-bound (docs/kernels.md#small-seq-forward); here a (segment, kv head) costs ~2 * D / 16 matrix instructions.
//
// Numerics (NOTE):
// - S is the exact-input product q . k accumulated in fp32, scaled afterwards in fp32: q is not
//   pre-multiplied by the softmax scale, because rounding q * scale back to 16 bits would put a
//   ~2^-9 relative error on every score (an LSE error far above the kernels' 1e-4 bound).
// - P is normalised in fp32 (LSE and returned probabilities come from these fp32 values) and
//   then rounded to the input dtype for the P.V product, as flash-attention does: a relative
//   error <= 2^-9 (bf16) / 2^-12 (fp16) per weight, unbiased, which adds about as much error to
//   O as rounding O itself to 16 bits does, well inside the bf16/fp16 output bounds.
// - Rows past the segment's length are never read: their K/V operand rows are exact zeros and
//   their scores are masked to -inf, so they contribute exactly 0 (never 0 * garbage).
#pragma once

#include "fwd_kernel.h"

namespace small_seq {

#if RA_HAS_MMA

template <int D, int KV>
struct MmaShape {
  // Head-dim slice per step: D <= 128 is one slice (K, V and q of an item all in flight at
  // once); larger dims stream 128-wide slices, the next slice's loads in flight while the
  // current one computes, so registers stay near the D = 128 case.
  static constexpr int kSliceD = D < 128 ? D : 128;
  static constexpr int kSlices = D / kSliceD;
  // Score tile columns: kv rows of the bucket (one m16n8 tile on NVIDIA for kv <= 8).
  static constexpr int kScoreN = KV <= 8 ? 8 : 16;
  // q heads per pass: the narrowest accumulator tile (8 on NVIDIA, 16 on CDNA); larger groups
  // loop over passes with K/V kept in registers when they fit one slice.
  static constexpr int kHeads = kRaMmaMinN;
};

// Softmax of one pass's score tile in place (S -> normalised P, fp32), LSE and probabilities
// of its q heads hq0 .. hq0 + nh - 1. `len`: kv rows of the segment (columns >= len masked).
template <int NS, int HB, bool ROW_MAX = false>
RA_DEVICE void mma_softmax(const SmallSeqParams& p, ra_mma_acc<NS>& s, const int seg,
                           const int hq0, const int nh, const int len, const int lane,
                           float* row_max = nullptr) {
  constexpr int E = ra_mma_acc<NS>::kElems;
  // Scores are kept in the log2 domain: exp2 is one instruction on both vendors.
  const float qscale = p.softmax_scale * kLog2e;
  float mx[kRaMmaAccSlots], sum[kRaMmaAccSlots];
#pragma unroll
  for (int r = 0; r < kRaMmaAccSlots; ++r) {
    mx[r] = -INFINITY;
    sum[r] = 0.f;
  }
#pragma unroll
  for (int i = 0; i < E; ++i) {
    if (ra_mma_slot_row0(ra_mma_acc_slot(i)) >= HB) continue;  // rows no pass ever uses
    const bool live = ra_mma_acc_col(lane, i) < len;
    s.x[i] = live ? s.x[i] * qscale : -INFINITY;
    mx[ra_mma_acc_slot(i)] = fmaxf(mx[ra_mma_acc_slot(i)], s.x[i]);
  }
#pragma unroll
  for (int r = 0; r < kRaMmaAccSlots; ++r)
    if (ra_mma_slot_row0(r) < HB) mx[r] = ra_mma_row_max(mx[r]);
#pragma unroll
  for (int i = 0; i < E; ++i) {
    if (ra_mma_slot_row0(ra_mma_acc_slot(i)) >= HB) continue;
    // Masked columns: exactly 0, and no exp2(-inf - -inf) = NaN when the row is empty.
    const float pr = ra_mma_acc_col(lane, i) < len ? exp2f(s.x[i] - mx[ra_mma_acc_slot(i)]) : 0.f;
    s.x[i] = pr;
    sum[ra_mma_acc_slot(i)] += pr;
  }
#pragma unroll
  for (int r = 0; r < kRaMmaAccSlots; ++r)
    if (ra_mma_slot_row0(r) < HB) sum[r] = ra_mma_row_sum(sum[r]);
#pragma unroll
  for (int i = 0; i < E; ++i) {
    const int slot = ra_mma_acc_slot(i);
    if (ra_mma_slot_row0(slot) >= HB) {
      s.x[i] = 0.f;  // never a P row of this pass (and never stored)
      continue;
    }
    const float inv = sum[slot] > 0.f ? 1.f / sum[slot] : 0.f;
    s.x[i] *= inv;
    const int row = ra_mma_acc_row(lane, i);
    const int col = ra_mma_acc_col(lane, i);
    if (row < nh) {
      const int hq = hq0 + row;
      // One lane per row holds column 0: it writes the row's LSE (and its maximum: mx is exact).
      if (col == 0) {
        p.lse[static_cast<int64_t>(hq) * p.batch + seg] =
            sum[slot] > 0.f ? (mx[slot] + log2f(sum[slot])) * kLn2 : -INFINITY;
        if constexpr (ROW_MAX)
          row_max[static_cast<int64_t>(hq) * p.batch + seg] =
              sum[slot] > 0.f ? mx[slot] * kLn2 : -INFINITY;
      }
      if (p.probs != nullptr && col < p.max_seqlen_kv)
        p.probs[(static_cast<int64_t>(seg) * p.num_heads_q + hq) * p.max_seqlen_kv + col] = s.x[i];
    }
  }
}

// One (segment, kv head) work item.
template <typename T, int D, int KV, bool ROW_MAX = false>
RA_DEVICE void fwd_mma_item(const SmallSeqParams& p, const int seg, const int hk,
                            const Segment& s, const int lane, float* row_max = nullptr) {
  using M = MmaShape<D, KV>;
  constexpr int DS = M::kSliceD;
  constexpr int NSL = M::kSlices;
  constexpr int NS = M::kScoreN;
  constexpr int HB = M::kHeads;

  if (!s.valid) {
    fwd_write_invalid<T, D, KV, ROW_MAX>(p, seg, hk, s, lane, row_max);
    return;
  }
  const int group = p.num_heads_q / p.num_heads_kv;
  const int len = s.len;
  const uint16_t* kbase = static_cast<const uint16_t*>(p.k) + s.k_base + hk * p.k_head_stride;
  const uint16_t* vbase = static_cast<const uint16_t*>(p.v) + s.v_base + hk * p.v_head_stride;
  // q heads hk * group .. of this token, one row per head ([h_q, d] rows of q / o).
  const uint16_t* qbase = static_cast<const uint16_t*>(p.q) + s.q_row * p.q_token_stride +
                          static_cast<int64_t>(hk) * group * p.q_head_stride;
  uint16_t* obase = static_cast<uint16_t*>(p.o) + s.q_row * p.o_token_stride +
                    static_cast<int64_t>(hk) * group * p.o_head_stride;

  // Passes of HB q heads (one pass unless the group is wider than a tile). Every pass loads its
  // own operands: a second pass re-reads K/V (from cache), which keeps registers at the one-pass
  // count instead of holding K, V and their derived fragments live across passes.
  if constexpr (NSL == 1) {
    for (int h0 = 0; h0 < group; h0 += HB) {
      const int nh = min(HB, group - h0);
      // Everything of the pass in flight at once: K, q rows, V (V is first needed after the
      // softmax, so its latency overlaps the score product).
      ra_mma_rows<DS, KV> kr;
      ra_mma_rows<DS, HB> qr;
      ra_mma_vrows<DS, KV> vr;
      ra_mma_load_rows(kr, kbase, p.k_token_stride, len, lane);
      ra_mma_load_rows(qr, qbase + h0 * p.q_head_stride, p.q_head_stride, nh, lane);
      ra_mma_load_vrows(vr, vbase, p.v_token_stride, len, lane);
      ra_mma_acc<NS> sc;
      ra_mma_zero(sc);
      ra_mma_dot<T>(sc, qr, kr);
      mma_softmax<NS, HB, ROW_MAX>(p, sc, seg, hk * group + h0, nh, len, lane, row_max);
      const ra_mma_pfrag<HB> pf = ra_mma_to_pfrag<T, HB>(sc);
      ra_mma_out<DS, HB> out;
      ra_mma_zero(out);
      ra_mma_pv<T>(out, pf, vr);
      ra_mma_store_rows<T>(out, obase + h0 * p.o_head_stride, p.o_head_stride, nh, lane);
    }
  } else {
    // Head-dim slices, double buffered: slice c + 1's loads are issued before slice c's
    // products; V's first slice is issued with the last K slice, ahead of the softmax.
    for (int h0 = 0; h0 < group; h0 += HB) {
      const int nh = min(HB, group - h0);
      const uint16_t* qb = qbase + h0 * p.q_head_stride;
      ra_mma_rows<DS, KV> kr[2];
      ra_mma_rows<DS, HB> qr[2];
      ra_mma_vrows<DS, KV> vr[2];
      ra_mma_acc<NS> sc;
      ra_mma_zero(sc);
      ra_mma_load_rows(kr[0], kbase, p.k_token_stride, len, lane);
      ra_mma_load_rows(qr[0], qb, p.q_head_stride, nh, lane);
#pragma unroll
      for (int c = 0; c < NSL; ++c) {
        if (c + 1 < NSL) {
          ra_mma_load_rows(kr[(c + 1) & 1], kbase + (c + 1) * DS, p.k_token_stride, len, lane);
          ra_mma_load_rows(qr[(c + 1) & 1], qb + (c + 1) * DS, p.q_head_stride, nh, lane);
        } else {
          ra_mma_load_vrows(vr[0], vbase, p.v_token_stride, len, lane);
        }
        ra_mma_dot<T>(sc, qr[c & 1], kr[c & 1]);
      }
      mma_softmax<NS, HB, ROW_MAX>(p, sc, seg, hk * group + h0, nh, len, lane, row_max);
      const ra_mma_pfrag<HB> pf = ra_mma_to_pfrag<T, HB>(sc);
#pragma unroll
      for (int c = 0; c < NSL; ++c) {
        if (c + 1 < NSL)
          ra_mma_load_vrows(vr[(c + 1) & 1], vbase + (c + 1) * DS, p.v_token_stride, len, lane);
        ra_mma_out<DS, HB> out;
        ra_mma_zero(out);
        ra_mma_pv<T>(out, pf, vr[c & 1]);
        ra_mma_store_rows<T>(out, obase + h0 * p.o_head_stride + c * DS, p.o_head_stride, nh,
                             lane);
      }
    }
  }
}

#endif  // RA_HAS_MMA

// Grid-stride over (segment, kv head) items like the general forward (launch_impl.h picks this
// kernel for GQA groups). Targets without matrix units compile the general forward's body here.
// ROW_MAX: also each row's maximum scaled logit (small_seq_fwd_mma_row_max_kernel).
template <typename T, int D, int KV, bool ROW_MAX>
RA_DEVICE void fwd_mma_persistent(const SmallSeqParams& p, float* row_max) {
#if RA_HAS_MMA
  constexpr int WAVE = RA_WAVE_SIZE;
  const int lane = threadIdx.x % WAVE;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * (blockDim.x / WAVE);
  const int64_t items = static_cast<int64_t>(p.batch) * p.num_heads_kv;
  int64_t item = static_cast<int64_t>(blockIdx.x) * (blockDim.x / WAVE) + threadIdx.x / WAVE;
  // The next item's segment bounds are read before this item computes, so only the K/V
  // latency is exposed per item (as in the general forward's single-stage loop).
  SegmentBounds bounds =
      item < items ? fetch_bounds(p, static_cast<int>(item / p.num_heads_kv)) : SegmentBounds{};
  for (; item < items; item += stride) {
    const int seg = static_cast<int>(item / p.num_heads_kv);
    const int hk = static_cast<int>(item % p.num_heads_kv);
    const Segment s = resolve_segment(p, seg, bounds);
    if (item + stride < items)
      bounds = fetch_bounds(p, static_cast<int>((item + stride) / p.num_heads_kv));
    fwd_mma_item<T, D, KV, ROW_MAX>(p, seg, hk, s, lane, row_max);
  }
#else
  fwd_persistent<T, D, KV, ROW_MAX>(p, row_max);
#endif
}

template <typename T, int D, int KV>
__global__ void __launch_bounds__(kMaxThreadsPerBlock) small_seq_fwd_mma_kernel(const SmallSeqParams p) {
  fwd_mma_persistent<T, D, KV, false>(p, nullptr);
}

// The same forward that also writes each row's maximum scaled logit to row_max (as
// small_seq_fwd_row_max_kernel).
template <typename T, int D, int KV>
__global__ void __launch_bounds__(kMaxThreadsPerBlock)
    small_seq_fwd_mma_row_max_kernel(const SmallSeqParams p, float* row_max) {
  fwd_mma_persistent<T, D, KV, true>(p, row_max);
}

}  // namespace small_seq
