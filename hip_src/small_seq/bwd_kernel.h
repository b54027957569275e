// Small-seq attention backward: one wave per (segment, kv head). P is recomputed from q, k and
// the saved float32 LSE; rowsum(dO * O) comes from the saved output. Deterministic: dk/dv of a
// GQA group are summed over its q heads inside the wave, never with atomics.
#pragma once

#include "fwd_kernel.h"

namespace small_seq {

template <int VPL>
RA_DEVICE void fill(float (&x)[VPL][8], float value) {
#pragma unroll
  for (int vi = 0; vi < VPL; ++vi)
#pragma unroll
    for (int e = 0; e < 8; ++e) x[vi][e] = value;
}

// Writes `value` into rows [row_begin, row_end) of one kv head of dk and dv, the whole wave
// striding over rows. Used for padding rows and for kv tokens no segment covers.
template <typename T, int VPL, int LPR, int RPP>
RA_DEVICE void fill_kv_rows(const SmallSeqParams& p, int64_t base, int hk, int64_t row_begin,
                            int64_t row_end, int row_group, int col_lane, float value) {
  float row[VPL][8];
  fill<VPL>(row, value);
  uint16_t* dk = static_cast<uint16_t*>(p.dk) + base + hk * p.dkv_head_stride;
  uint16_t* dv = static_cast<uint16_t*>(p.dv) + base + hk * p.dkv_head_stride;
  for (int64_t r = row_begin + row_group; r < row_end; r += RPP) {
    store_row_f32<T, VPL>(dk + r * p.dkv_token_stride, row, col_lane, LPR);
    store_row_f32<T, VPL>(dv + r * p.dkv_token_stride, row, col_lane, LPR);
  }
}

RA_DEVICE float head_dlse(const SmallSeqParams& p, int hq, int seg) {
  return p.dlse != nullptr ? p.dlse[static_cast<int64_t>(hq) * p.batch + seg] : 0.f;
}

// rowsum(dO * O) for one q head: the softmax-gradient term, from the saved forward output.
template <typename T, int VPL, int LPR>
RA_DEVICE float row_dot_out(const float (&dof)[VPL][8], const uint16_t* out_row, int col_lane) {
  float of[VPL][8];
  load_row_f32<T, VPL>(of, out_row, col_lane, LPR, 1.f);
  float d = 0.f;
#pragma unroll
  for (int vi = 0; vi < VPL; ++vi)
#pragma unroll
    for (int e = 0; e < 8; ++e) d = fmaf(dof[vi][e], of[vi][e], d);
  return ra_group_sum<LPR>(d);
}

// Everything of a (segment, kv head) item that is not the gradient of its valid rows: zeros for
// THD kv tokens outside [cu_seqlens_kv[0], cu_seqlens_kv[b]) (written by the first and last
// segments' waves) and for BSHD padding rows; NaN dq / dk / dv for a segment that breaks the
// contract. Returns whether the segment is valid (its gradients still to compute).
template <typename T, int D, int KV>
RA_DEVICE bool bwd_edges(const SmallSeqParams& p, const int seg, const int hk, const Segment& s,
                         const int lane) {
  using Tl = Tiling<D, KV, RA_WAVE_SIZE>;
  constexpr int VPL = Tl::kVecsPerLane;
  constexpr int LPR = Tl::kLanesPerRow;
  constexpr int RPP = Tl::kRowsPerPass;
  const int group = p.num_heads_q / p.num_heads_kv;
  const int row_group = lane / LPR;
  const int col_lane = lane % LPR;
  uint16_t* dq = static_cast<uint16_t*>(p.dq);

  // kv tokens of a THD batch outside [cu_seqlens_kv[0], cu_seqlens_kv[b]) belong to no segment:
  // their gradient is zero. The first and last segments' waves write those zeros.
  if (p.cu_seqlens_kv != nullptr) {
    if (seg == 0) {
      const int64_t first = min(max(p.cu_seqlens_kv[0], 0), p.total_kv);
      fill_kv_rows<T, VPL, LPR, RPP>(p, 0, hk, 0, first, row_group, col_lane, 0.f);
    }
    if (seg == p.batch - 1) {
      const int64_t last = min(max(p.cu_seqlens_kv[p.batch], 0), p.total_kv);
      fill_kv_rows<T, VPL, LPR, RPP>(p, 0, hk, last, p.total_kv, row_group, col_lane, 0.f);
    }
  } else {
    // BSHD: rows past this segment's length are padding.
    const int first_pad = s.valid ? s.len : 0;
    fill_kv_rows<T, VPL, LPR, RPP>(p, s.dkv_base, hk, first_pad, p.kv_rows_per_batch, row_group,
                                   col_lane, s.valid ? 0.f : ra_nan());
  }
  if (!s.valid) {
    // The forward pass already counted this segment; make its gradients loudly wrong. Its THD
    // kv rows [k0, k1) (when ordered, clamped to the tensor) belong to no valid segment, so
    // they get NaN too rather than whatever the allocator left there.
    if (p.cu_seqlens_kv != nullptr) {
      const int64_t k0 = min(max(p.cu_seqlens_kv[seg], 0), p.total_kv);
      const int64_t k1 = min(max(p.cu_seqlens_kv[seg + 1], 0), p.total_kv);
      fill_kv_rows<T, VPL, LPR, RPP>(p, 0, hk, k0, k1, row_group, col_lane, ra_nan());
    }
    if (s.q_row >= 0 && row_group == 0) {
      float nan_row[VPL][8];
      fill<VPL>(nan_row, ra_nan());
      for (int g = 0; g < group; ++g)
        store_row_f32<T, VPL>(dq + s.q_row * p.dq_token_stride + (hk * group + g) * p.dq_head_stride,
                              nan_row, col_lane, LPR);
    }
    return false;
  }
  return true;
}

// One (segment, kv head) work item for one wave.
template <typename T, int D, int KV>
RA_DEVICE void bwd_item(const SmallSeqParams& p, const int seg, const int hk, const Segment& s,
                        const int lane) {
  constexpr int WAVE = RA_WAVE_SIZE;
  using Tl = Tiling<D, KV, WAVE>;
  constexpr int VPL = Tl::kVecsPerLane;
  constexpr int LPR = Tl::kLanesPerRow;
  constexpr int RPP = Tl::kRowsPerPass;
  constexpr int SLOTS = Tl::kSlots;
  // Pass 1 holds K and V of a chunk in registers (<= 8 vectors each); pass 2 (GQA only) holds
  // K, V and fp32 dK, dV accumulators for SB slots (<= 2 vectors per row) at a time.
  constexpr int CH = SLOTS < 8 / VPL ? SLOTS : 8 / VPL;
  constexpr int NCH = (SLOTS + CH - 1) / CH;
  constexpr int SB = 2 / VPL > 0 ? 2 / VPL : 1;

  const int group = p.num_heads_q / p.num_heads_kv;
  const int row_group = lane / LPR;
  const int col_lane = lane % LPR;

  uint16_t* dq = static_cast<uint16_t*>(p.dq);
  uint16_t* dk = static_cast<uint16_t*>(p.dk) + s.dkv_base + hk * p.dkv_head_stride;
  uint16_t* dv = static_cast<uint16_t*>(p.dv) + s.dkv_base + hk * p.dkv_head_stride;
  if (!bwd_edges<T, D, KV>(p, seg, hk, s, lane)) return;

  const uint16_t* kbase = static_cast<const uint16_t*>(p.k) + s.k_base + hk * p.k_head_stride;
  const uint16_t* vbase = static_cast<const uint16_t*>(p.v) + s.v_base + hk * p.v_head_stride;
  const float log2_scale = p.softmax_scale * kLog2e;
  const uint16_t* q = static_cast<const uint16_t*>(p.q);
  const uint16_t* dout = static_cast<const uint16_t*>(p.dout);
  const uint16_t* out = static_cast<const uint16_t*>(p.out);

  ra_vec8 kr[CH][VPL];
  ra_vec8 vr[CH][VPL];
  if constexpr (NCH == 1) {
    load_rows<CH, VPL, LPR, RPP>(kr, kbase, p.k_token_stride, 0, row_group, col_lane, s.len);
    load_rows<CH, VPL, LPR, RPP>(vr, vbase, p.v_token_stride, 0, row_group, col_lane, s.len);
  }

  // Pass 1: dq of every q head of the group (and, without GQA, dk/dv directly).
  for (int g = 0; g < group; ++g) {
    const int hq = hk * group + g;
    float qf[VPL][8], dof[VPL][8];
    load_row_f32<T, VPL>(qf, q + s.q_row * p.q_token_stride + hq * p.q_head_stride, col_lane, LPR, 1.f);
    load_row_f32<T, VPL>(dof, dout + s.q_row * p.do_token_stride + hq * p.do_head_stride, col_lane,
                         LPR, 1.f);
    const float rowdot = row_dot_out<T, VPL, LPR>(dof, out + s.q_row * p.o_token_stride +
                                                           hq * p.o_head_stride, col_lane);
    const float lse2 = p.lse[static_cast<int64_t>(hq) * p.batch + seg] * kLog2e;
    // d lse / d s_j = p_j, so an LSE gradient enters as a shift of dP's row term.
    const float rowterm = rowdot - head_dlse(p, hq, seg);

    float dq_acc[VPL][8] = {};
#pragma unroll
    for (int c = 0; c < NCH; ++c) {
      if constexpr (NCH > 1) {
        load_rows<CH, VPL, LPR, RPP>(kr, kbase, p.k_token_stride, c * CH, row_group, col_lane, s.len);
        load_rows<CH, VPL, LPR, RPP>(vr, vbase, p.v_token_stride, c * CH, row_group, col_lane, s.len);
      }
#pragma unroll
      for (int i = 0; i < CH; ++i) {
        const int slot = c * CH + i;
        if (slot >= SLOTS) break;
        const int row = slot * RPP + row_group;
        const float sc = ra_group_sum<LPR>(dot_part<T, VPL>(qf, kr[i])) * log2_scale;
        const float dp = ra_group_sum<LPR>(dot_part<T, VPL>(dof, vr[i]));
        const float pr = row < s.len ? exp2f(sc - lse2) : 0.f;
        const float ds = pr * (dp - rowterm);
        float kf[8];
#pragma unroll
        for (int vi = 0; vi < VPL; ++vi) {
          ra_unpack8<T>(kr[i][vi], kf);
#pragma unroll
          for (int e = 0; e < 8; ++e) dq_acc[vi][e] = fmaf(ds, kf[e], dq_acc[vi][e]);
        }
        if (group == 1 && row < s.len) {
          float dkr[VPL][8], dvr[VPL][8];
          const float ds_scaled = ds * p.softmax_scale;
#pragma unroll
          for (int vi = 0; vi < VPL; ++vi)
#pragma unroll
            for (int e = 0; e < 8; ++e) {
              dkr[vi][e] = ds_scaled * qf[vi][e];
              dvr[vi][e] = pr * dof[vi][e];
            }
          store_row_f32<T, VPL>(dk + row * p.dkv_token_stride, dkr, col_lane, LPR);
          store_row_f32<T, VPL>(dv + row * p.dkv_token_stride, dvr, col_lane, LPR);
        }
      }
    }
#pragma unroll
    for (int vi = 0; vi < VPL; ++vi)
#pragma unroll
      for (int e = 0; e < 8; ++e)
        dq_acc[vi][e] = ra_strided_sum<LPR, WAVE>(dq_acc[vi][e]) * p.softmax_scale;
    if (row_group == 0)
      store_row_f32<T, VPL>(dq + s.q_row * p.dq_token_stride + hq * p.dq_head_stride, dq_acc,
                            col_lane, LPR);
  }
  if (group == 1) return;

  // Pass 2 (GQA): dk, dv summed over the group's q heads, SB slots at a time. K/V rows are
  // re-read (cache hits: this wave just read them); q, dO and O rows are tiny and cached too, so
  // rowsum(dO * O) is recomputed rather than kept in a run-time indexed (local-memory) array.
#pragma unroll
  for (int b0 = 0; b0 < SLOTS; b0 += SB) {
    if (b0 * RPP >= s.len) break;  // wave-uniform: no row of this block is valid
    constexpr int N = SB;
    ra_vec8 kb[N][VPL], vb[N][VPL];
    load_rows<N, VPL, LPR, RPP>(kb, kbase, p.k_token_stride, b0, row_group, col_lane, s.len);
    load_rows<N, VPL, LPR, RPP>(vb, vbase, p.v_token_stride, b0, row_group, col_lane, s.len);
    float dk_acc[N][VPL][8] = {};
    float dv_acc[N][VPL][8] = {};
    for (int g = 0; g < group; ++g) {
      const int hq = hk * group + g;
      float qf[VPL][8], dof[VPL][8];
      load_row_f32<T, VPL>(qf, q + s.q_row * p.q_token_stride + hq * p.q_head_stride, col_lane, LPR, 1.f);
      load_row_f32<T, VPL>(dof, dout + s.q_row * p.do_token_stride + hq * p.do_head_stride, col_lane,
                           LPR, 1.f);
      const float rowdot = row_dot_out<T, VPL, LPR>(dof, out + s.q_row * p.o_token_stride +
                                                             hq * p.o_head_stride, col_lane);
      const float lse2 = p.lse[static_cast<int64_t>(hq) * p.batch + seg] * kLog2e;
      const float rowterm = rowdot - head_dlse(p, hq, seg);
#pragma unroll
      for (int i = 0; i < N; ++i) {
        const int row = (b0 + i) * RPP + row_group;
        const float sc = ra_group_sum<LPR>(dot_part<T, VPL>(qf, kb[i])) * log2_scale;
        const float dp = ra_group_sum<LPR>(dot_part<T, VPL>(dof, vb[i]));
        const float pr = row < s.len ? exp2f(sc - lse2) : 0.f;
        const float ds = pr * (dp - rowterm) * p.softmax_scale;
#pragma unroll
        for (int vi = 0; vi < VPL; ++vi)
#pragma unroll
          for (int e = 0; e < 8; ++e) {
            dk_acc[i][vi][e] = fmaf(ds, qf[vi][e], dk_acc[i][vi][e]);
            dv_acc[i][vi][e] = fmaf(pr, dof[vi][e], dv_acc[i][vi][e]);
          }
      }
    }
#pragma unroll
    for (int i = 0; i < N; ++i) {
      const int row = (b0 + i) * RPP + row_group;
      if (row < s.len) {
        store_row_f32<T, VPL>(dk + row * p.dkv_token_stride, dk_acc[i], col_lane, LPR);
        store_row_f32<T, VPL>(dv + row * p.dkv_token_stride, dv_acc[i], col_lane, LPR);
      }
    }
  }
}

// Grid-stride over (segment, kv head) items, `item_fn(seg, hk, segment)` per item: the launcher
// sizes the grid to what stays resident, so waves are not re-launched per item and block
// scheduling drops out of the loop. READ_AHEAD: the next item's segment bounds are read before
// this item is computed, so only its K/V/q latency is exposed per item (as in the forward).
// NOTE: the general backward's plain loop does not read ahead: the bounds held across the item
// raised d=512 kv=16 from 167 to 195 registers on sm_90 (12 -> 10 warps per SM).
template <bool READ_AHEAD, typename ItemFn>
RA_DEVICE void bwd_grid_stride(const SmallSeqParams& p, ItemFn&& item_fn) {
  constexpr int WAVE = RA_WAVE_SIZE;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * (blockDim.x / WAVE);
  const int64_t items = static_cast<int64_t>(p.batch) * p.num_heads_kv;
  int64_t item = static_cast<int64_t>(blockIdx.x) * (blockDim.x / WAVE) + threadIdx.x / WAVE;
  SegmentBounds bounds = item < items && READ_AHEAD
                             ? fetch_bounds(p, static_cast<int>(item / p.num_heads_kv))
                             : SegmentBounds{};
  for (; item < items; item += stride) {
    const int seg = static_cast<int>(item / p.num_heads_kv);
    if constexpr (!READ_AHEAD) bounds = fetch_bounds(p, seg);
    const Segment s = resolve_segment(p, seg, bounds);
    if (READ_AHEAD && item + stride < items)
      bounds = fetch_bounds(p, static_cast<int>((item + stride) / p.num_heads_kv));
    item_fn(seg, static_cast<int>(item % p.num_heads_kv), s);
  }
}

template <typename T, int D, int KV>
RA_DEVICE void bwd_persistent(const SmallSeqParams& p) {
  const int lane = threadIdx.x % RA_WAVE_SIZE;
  bwd_grid_stride<false>(
      p, [&](int seg, int hk, const Segment& s) { bwd_item<T, D, KV>(p, seg, hk, s, lane); });
}

// Software-pipelined grid-stride backward for one q head per kv head with K/V in one chunk (the
// forward's fwd_pipelined, applied to the backward's order of use): V is dead once dP = dO V^T is
// reduced, K once dQ = dS K is accumulated, so the next item's V, q, dO, O and LSE loads go out
// after this item's dP and its K loads after this item's dQ; they stay in flight through the
// softmax gradient, the dK/dV row stores and the dQ reduction, with one stage of registers.
// The arithmetic is bwd_item's, in the same order.
template <typename T, int D, int KV>
RA_DEVICE void bwd_pipelined(const SmallSeqParams& p) {
  constexpr int WAVE = RA_WAVE_SIZE;
  using Tl = Tiling<D, KV, WAVE>;
  constexpr int VPL = Tl::kVecsPerLane;
  constexpr int LPR = Tl::kLanesPerRow;
  constexpr int RPP = Tl::kRowsPerPass;
  constexpr int SLOTS = Tl::kSlots;
  static_assert(SLOTS * VPL <= 8, "the pipelined backward holds all of an item's K/V at once");
  const int lane = threadIdx.x % WAVE;
  const int row_group = lane / LPR;
  const int col_lane = lane % LPR;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * (blockDim.x / WAVE);
  const int64_t items = static_cast<int64_t>(p.batch) * p.num_heads_kv;
  int64_t item = static_cast<int64_t>(blockIdx.x) * (blockDim.x / WAVE) + threadIdx.x / WAVE;
  if (item >= items) return;
  const float log2_scale = p.softmax_scale * kLog2e;
  const uint16_t* k = static_cast<const uint16_t*>(p.k);
  const uint16_t* v = static_cast<const uint16_t*>(p.v);
  const uint16_t* q = static_cast<const uint16_t*>(p.q);
  const uint16_t* dout = static_cast<const uint16_t*>(p.dout);
  const uint16_t* out = static_cast<const uint16_t*>(p.out);

  // Raw per-item loads besides K and V: q, dO and O rows of the item's head, its LSE.
  struct Rows {
    ra_vec8 q[VPL], dout[VPL], out[VPL];
    float lse;
  };
  auto load_k = [&](ra_vec8 (&dst)[SLOTS][VPL], const Segment& sg, int hk) {
    load_rows<SLOTS, VPL, LPR, RPP>(dst, k + sg.k_base + hk * p.k_head_stride, p.k_token_stride,
                                    0, row_group, col_lane, sg.len);
  };
  auto load_v = [&](ra_vec8 (&dst)[SLOTS][VPL], const Segment& sg, int hk) {
    load_rows<SLOTS, VPL, LPR, RPP>(dst, v + sg.v_base + hk * p.v_head_stride, p.v_token_stride,
                                    0, row_group, col_lane, sg.len);
  };
  // An invalid segment's rows are not read (its q row may be out of bounds).
  auto load_q_rows = [&](Rows& r, const Segment& sg, int seg, int hq) {
    if (!sg.valid) return;
#pragma unroll
    for (int vi = 0; vi < VPL; ++vi) {
      const int64_t col = (col_lane + vi * LPR) * 8;
      r.q[vi] = ra_load16(q + sg.q_row * p.q_token_stride + hq * p.q_head_stride + col);
      r.dout[vi] = ra_load16(dout + sg.q_row * p.do_token_stride + hq * p.do_head_stride + col);
      r.out[vi] = ra_load16(out + sg.q_row * p.o_token_stride + hq * p.o_head_stride + col);
    }
    r.lse = p.lse[static_cast<int64_t>(hq) * p.batch + seg];
  };

  int seg = static_cast<int>(item / p.num_heads_kv);
  int hk = static_cast<int>(item % p.num_heads_kv);
  Segment s = resolve_segment(p, seg, fetch_bounds(p, seg));
  ra_vec8 kr[SLOTS][VPL], vr[SLOTS][VPL];
  Rows rows;
  load_k(kr, s, hk);
  load_v(vr, s, hk);
  load_q_rows(rows, s, seg, hk);
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

    if (!bwd_edges<T, D, KV>(p, seg, hk, s, lane)) {
      if (has_next) {
        load_k(kr, ns, nhk);
        load_v(vr, ns, nhk);
        load_q_rows(rows, ns, nseg, nhk);
      }
    } else {
      float qf[VPL][8], dof[VPL][8];
      float rowdot = 0.f;
#pragma unroll
      for (int vi = 0; vi < VPL; ++vi) {
        float of[8];
        ra_unpack8<T>(rows.q[vi], qf[vi]);
        ra_unpack8<T>(rows.dout[vi], dof[vi]);
        ra_unpack8<T>(rows.out[vi], of);
#pragma unroll
        for (int e = 0; e < 8; ++e) rowdot = fmaf(dof[vi][e], of[e], rowdot);
      }
      rowdot = ra_group_sum<LPR>(rowdot);
      const float lse2 = rows.lse * kLog2e;
      const float rowterm = rowdot - head_dlse(p, hk, seg);
      float sc[SLOTS], dp[SLOTS];
#pragma unroll
      for (int slot = 0; slot < SLOTS; ++slot) {
        sc[slot] = ra_group_sum<LPR>(dot_part<T, VPL>(qf, kr[slot])) * log2_scale;
        dp[slot] = ra_group_sum<LPR>(dot_part<T, VPL>(dof, vr[slot]));
      }
      // V, and the q / dO / O rows (now in qf, dof), are consumed: the next item's go out.
      if (has_next) {
        load_v(vr, ns, nhk);
        load_q_rows(rows, ns, nseg, nhk);
      }
      float pr[SLOTS], ds[SLOTS];
      float dq_acc[VPL][8] = {};
#pragma unroll
      for (int slot = 0; slot < SLOTS; ++slot) {
        const int row = slot * RPP + row_group;
        pr[slot] = row < s.len ? exp2f(sc[slot] - lse2) : 0.f;
        ds[slot] = pr[slot] * (dp[slot] - rowterm);
        float kf[8];
#pragma unroll
        for (int vi = 0; vi < VPL; ++vi) {
          ra_unpack8<T>(kr[slot][vi], kf);
#pragma unroll
          for (int e = 0; e < 8; ++e) dq_acc[vi][e] = fmaf(ds[slot], kf[e], dq_acc[vi][e]);
        }
      }
      if (has_next) load_k(kr, ns, nhk);  // K consumed
      uint16_t* dk = static_cast<uint16_t*>(p.dk) + s.dkv_base + hk * p.dkv_head_stride;
      uint16_t* dv = static_cast<uint16_t*>(p.dv) + s.dkv_base + hk * p.dkv_head_stride;
#pragma unroll
      for (int slot = 0; slot < SLOTS; ++slot) {
        const int row = slot * RPP + row_group;
        if (row < s.len) {
          float dkr[VPL][8], dvr[VPL][8];
          const float ds_scaled = ds[slot] * p.softmax_scale;
#pragma unroll
          for (int vi = 0; vi < VPL; ++vi)
#pragma unroll
            for (int e = 0; e < 8; ++e) {
              dkr[vi][e] = ds_scaled * qf[vi][e];
              dvr[vi][e] = pr[slot] * dof[vi][e];
            }
          store_row_f32<T, VPL>(dk + row * p.dkv_token_stride, dkr, col_lane, LPR);
          store_row_f32<T, VPL>(dv + row * p.dkv_token_stride, dvr, col_lane, LPR);
        }
      }
#pragma unroll
      for (int vi = 0; vi < VPL; ++vi)
#pragma unroll
        for (int e = 0; e < 8; ++e)
          dq_acc[vi][e] = ra_strided_sum<LPR, WAVE>(dq_acc[vi][e]) * p.softmax_scale;
      if (row_group == 0)
        store_row_f32<T, VPL>(static_cast<uint16_t*>(p.dq) + s.q_row * p.dq_token_stride +
                                  hk * p.dq_head_stride,
                              dq_acc, col_lane, LPR);
    }
    if (!has_next) break;
    item = next;
    seg = nseg;
    hk = nhk;
    s = ns;
  }
}

// Whether a shape can take the pipelined backward (all of an item's K/V in one chunk); the plan
// also requires one q head per kv head and the backward bit of tuning small_seq_pipe, and the
// launcher refuses a PIPE record where either fails.
template <int D, int KV>
constexpr bool kBwdPipelinable =
    Tiling<D, KV, RA_WAVE_SIZE>::kSlots * Tiling<D, KV, RA_WAVE_SIZE>::kVecsPerLane <= 8;

template <typename T, int D, int KV, bool PIPE>
__global__ void __launch_bounds__(kMaxThreadsPerBlock) small_seq_bwd_kernel(const SmallSeqParams p) {
  if constexpr (PIPE && kBwdPipelinable<D, KV>) {
    bwd_pipelined<T, D, KV>(p);
  } else {
    bwd_persistent<T, D, KV>(p);
  }
}

}  // namespace small_seq
