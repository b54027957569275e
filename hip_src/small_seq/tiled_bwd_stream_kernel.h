// Tiled small-seq backward, streaming variant: the dK / dV and dQ passes of tiled_bwd_kernel.h
// in one kernel for calls whose (segment, kv head) has at most kTiledBwdStreamMaxRows rows
// (one query per segment with a GQA group of at most 4, or a few queries without GQA), over
// any history the tiled kernels serve (docs/kernels.md#streaming-backward).
//
// Why: with so few rows the backward is a stream over the segment's keys. Each key's gradient
// rows depend only on that key and the segment's few (q, dO) rows, so K and V can be read once
// and dK and dV written once, at copy speed, if enough keys are in flight. The matrix-unit
// passes put these rows into 16-row tiles (at most a quarter used) and walk the key tiles one
// dependent chain per wave, nothing loaded ahead.
//
// Work item = (segment, kv head), taken by one wave, or by all waves of a block splitting its
// keys (per_block; the launcher picks one per wave when there are many more items than
// resident waves: short histories are latency chains, and more of them then run at once):
//   1. Every lane holds its share (kVpl 16-byte vectors per row, unpacked to fp32) of the
//      segment's q and dO rows, and each row's LSE (log2 domain) and Delta (pass 1).
//   2. The item's waves walk the keys a few steps at a time (kTiledBwdStreamUnroll, half as many
//      for four rows); a step gives each lane group (kLpr lanes over one key row) of each wave
//      its own key. The step's K / V loads are all issued before any of them is used. Per key
//      and row r:
//        s = scale log2e q_r . k, dp = dO_r . v       (lane-group sums of all 2 x rows values
//                                                        at once, tiled_bwd_scatter_sum)
//        p = exp2(s - lse2_r), ds = p (dp - Delta_r)   (once per row, by the lane holding s_r;
//                                                        then broadcast to the lane group)
//        dv = sum_r p dO_r, dk = scale sum_r ds q_r    (stored: complete, every row is here)
//        dq_r += ds k                                   (per lane, fp32)
//   3. dq is summed over the lane groups of a wave (fixed shuffles), then over a block-wide
//      item's waves through shared memory in wave order, scaled and stored once per row.
//
// Numerics: s, p, dp, ds and every sum are fp32 (no operand rounds to the input dtype, unlike
// the matrix-unit passes); each gradient element is rounded once. Every gradient element has
// one writer summing in a fixed order: deterministic, whatever the schedule, for a given call
// shape and device (the per-wave and per-block splits sum dq's terms in different orders, and
// the launcher picks by the number of items and the device's residency). Bad segments, K/V
// rows no segment covers (tiled_bwd_edges, by the item's first wave) and padding rows of q
// (pass 1) are handled as in the other passes; keys past the history are never read (their p
// is exactly 0). A segment without keys gets dq 0 exactly.
#pragma once

#include "tiled_bwd_kernel.h"

namespace small_seq {

// Rows per (segment, kv head) the streaming kernel serves: each row costs every lane two
// fp32 vectors held over the key loop (q, dO) plus one accumulated (dq), and two lane-group
// sums per key.
constexpr int kTiledBwdStreamMaxRows = 4;
constexpr int kTiledBwdStreamThreads = 128;
// Key steps whose loads are issued together (keys in flight per wave: unroll x keys per step);
// four-row items take half as many, so that three blocks fit a multiprocessor.
constexpr int kTiledBwdStreamUnroll = 4;
// Blocks per multiprocessor the register cap is set for: 168 registers on sm_90. Four rows
// then run 8-20% faster than at two blocks (210 registers; 20 bytes spill at d = 256); one row
// fits under it (docs/kernels.md#streaming-backward).
constexpr int kTiledBwdStreamMinBlocks = 3;

// Lane-group sums of N values at once (N a power of two, at most LPR): each halving step sends
// the half of the values a lane does not keep to its partner (masks LPR / 2 .. LPR / N), then the
// lanes that hold the same value finish with a butterfly. Lane c of the group ends with the
// whole sum of value c / (LPR / N): N - 1 + log2(LPR / N) shuffles instead of N log2(LPR).
template <int LPR, int N>
RA_DEVICE float tiled_bwd_scatter_sum(const float (&v)[N], const int col_lane) {
  static_assert((N & (N - 1)) == 0 && N <= LPR, "N must be a power of two <= LPR");
  float x[N];
#pragma unroll
  for (int i = 0; i < N; ++i) x[i] = v[i];
#pragma unroll
  for (int step = 0; (N >> step) > 1; ++step) {
    const int half = (N >> step) / 2;
    const int mask = LPR >> (step + 1);
    const bool upper = (col_lane & mask) != 0;
#pragma unroll
    for (int i = 0; i < half; ++i) {
      const float keep = upper ? x[i + half] : x[i];
      const float send = upper ? x[i] : x[i + half];
      x[i] = keep + ra_shfl_xor(send, mask);
    }
  }
  float sum = x[0];
#pragma unroll
  for (int mask = LPR / (2 * N); mask >= 1; mask >>= 1) sum += ra_shfl_xor(sum, mask);
  return sum;
}

template <typename T, int D, int ROWS>
__global__ void RA_LAUNCH_BOUNDS_MIN_BLOCKS(kTiledBwdStreamThreads, kTiledBwdStreamMinBlocks)
    small_seq_tiled_bwd_stream_kernel(const SmallSeqTiledParams p, const bool per_block) {
  using Sh = TiledBwdScalarShape<D>;
  constexpr int WAVE = RA_WAVE_SIZE;
  constexpr int VPL = Sh::kVpl;
  constexpr int LPR = Sh::kLpr;
  constexpr int RPP = Sh::kRpp;  // keys per wave step
  constexpr int WAVES = kTiledBwdStreamThreads / WAVE;
  constexpr int U = ROWS >= 4 ? 2 : kTiledBwdStreamUnroll;
  // dq partials of every wave of a block-wide item, summed in wave order.
  __shared__ float dq_parts[WAVES][ROWS][D];
  const int wave = threadIdx.x / WAVE;
  const int lane = threadIdx.x % WAVE;
  const int sub = lane / LPR;
  const int col_lane = lane % LPR;
  // Every wave its own item (no barrier), or one item per block: then the loop below runs the
  // same iterations in every wave, so its barriers are block-uniform.
  const int item_waves = per_block ? WAVES : 1;
  const int items_per_block = WAVES / item_waves;
  const int part = wave % item_waves;  // this wave's share of the item's keys
  const int key_step = item_waves * RPP * U;
  const int group = p.num_heads_q / p.num_heads_kv;
  const float qscale = p.softmax_scale * kTiledBwdLog2e;
  const int64_t items = static_cast<int64_t>(p.batch) * p.num_heads_kv;
  for (int64_t item = static_cast<int64_t>(blockIdx.x) * items_per_block + wave / item_waves;
       item < items; item += static_cast<int64_t>(gridDim.x) * items_per_block) {
    const int seg = static_cast<int>(item / p.num_heads_kv);
    const int hk = static_cast<int>(item - static_cast<int64_t>(seg) * p.num_heads_kv);
    const TiledBounds b = tiled_fetch_bounds(p, seg);
    const TiledSegment s = tiled_resolve_segment(p, seg, b);
    if (part == 0) tiled_bwd_edges<T, D>(p, seg, hk, b, s, lane);
    if (!s.valid) continue;  // the same for every wave of the item
    const int hq0 = hk * group;
    const int nrows = s.nq * group;  // <= ROWS (the launcher checks the host bound)
    const TiledBwdRows rw = tiled_bwd_rows(p, hk, s);
    // Element offset of row r (query r / group, q head hq0 + r % group) in a q-shaped tensor.
    auto row_at = [&](int r, int64_t token_stride, int64_t head_stride) {
      const int j = r / group;
      return (s.q_token0 + j) * token_stride + (hq0 + r - j * group) * head_stride;
    };

    float qf[ROWS][VPL][8], gf[ROWS][VPL][8], dq[ROWS][VPL][8];
    TiledBwdRowTerms terms[ROWS];
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
      const bool live = r < nrows;
      const int rr = live ? r : 0;
      tiled_bwd_load_vecs<T, VPL>(qf[r], rw.q + row_at(rr, p.q_token_stride, p.q_head_stride),
                                  col_lane, LPR, live);
      tiled_bwd_load_vecs<T, VPL>(gf[r], rw.dout + row_at(rr, p.do_token_stride, p.do_head_stride),
                                  col_lane, LPR, live);
      terms[r] = live ? tiled_bwd_row_terms(p, s, hq0, group, r) : TiledBwdRowTerms{0.f, 0.f};
#pragma unroll
      for (int vi = 0; vi < VPL; ++vi)
#pragma unroll
        for (int e = 0; e < 8; ++e) dq[r][vi][e] = 0.f;
    }
    // The score (even value) or dp (odd) of row `mine` / 2 that this lane's sums end with, and
    // that row's LSE and Delta.
    const int mine = col_lane / (LPR / (2 * ROWS));
    const int my_row = mine / 2;
    TiledBwdRowTerms my_terms = terms[0];
#pragma unroll
    for (int r = 1; r < ROWS; ++r)
      if (my_row == r) my_terms = terms[r];
    const bool my_row_live = my_row < nrows;

    // The loop bound is the same for the whole wave (its lanes shuffle together); keys past
    // the history are masked per lane group.
    for (int k0 = part * RPP; k0 < s.nk; k0 += key_step) {
      ra_vec8 kraw[U][VPL], vraw[U][VPL];
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int key = k0 + u * item_waves * RPP + sub;
        const bool ok = key < s.nk;
        const int64_t at = ok ? key : 0;
#pragma unroll
        for (int vi = 0; vi < VPL; ++vi) {
          const int c = 8 * (col_lane + vi * LPR);
          const ra_vec8 zero{{0u, 0u, 0u, 0u}};
          kraw[u][vi] = ok ? ra_load16(rw.k + at * p.k_token_stride + c) : zero;
          vraw[u][vi] = ok ? ra_load16(rw.v + at * p.v_token_stride + c) : zero;
        }
      }
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int key = k0 + u * item_waves * RPP + sub;
        const bool ok = key < s.nk;
        float kf[VPL][8], vf[VPL][8];
#pragma unroll
        for (int vi = 0; vi < VPL; ++vi) {
          ra_unpack8<T>(kraw[u][vi], kf[vi]);
          ra_unpack8<T>(vraw[u][vi], vf[vi]);
        }
        // Each lane ends with one of the 2 ROWS sums; its partner (mask LPR / (2 ROWS)) holds
        // the other of the same row. p and ds are formed once per row, then broadcast from the
        // group's lane that holds the row's score.
        float sums[2 * ROWS];
#pragma unroll
        for (int r = 0; r < ROWS; ++r) {
          sums[2 * r] = tiled_bwd_dot<VPL>(qf[r], kf);
          sums[2 * r + 1] = tiled_bwd_dot<VPL>(gf[r], vf);
        }
        const float held = tiled_bwd_scatter_sum<LPR, 2 * ROWS>(sums, col_lane);
        const float other = ra_shfl_xor(held, LPR / (2 * ROWS));
        const bool holds_dp = (mine & 1) != 0;
        const float sc = (holds_dp ? other : held) * qscale;
        const float my_p = ok && my_row_live ? exp2f(sc - my_terms.lse2) : 0.f;
        // (exactly 0 where p is: a non-finite dp of a masked row or key must not reach dk)
        const float my_ds =
            ok && my_row_live ? my_p * ((holds_dp ? held : other) - my_terms.delta) : 0.f;
        float pr[ROWS], ds[ROWS];
#pragma unroll
        for (int r = 0; r < ROWS; ++r) {
          const int src = sub * LPR + 2 * r * (LPR / (2 * ROWS));
          pr[r] = ra_shfl(my_p, src);
          ds[r] = ra_shfl(my_ds, src);
        }
        float dk[VPL][8], dv[VPL][8];
#pragma unroll
        for (int vi = 0; vi < VPL; ++vi)
#pragma unroll
          for (int e = 0; e < 8; ++e) {
            float a = 0.f, g = 0.f;
#pragma unroll
            for (int r = 0; r < ROWS; ++r) {
              g = fmaf(pr[r], gf[r][vi][e], g);
              a = fmaf(ds[r], qf[r][vi][e], a);
              dq[r][vi][e] = fmaf(ds[r], kf[vi][e], dq[r][vi][e]);
            }
            dv[vi][e] = g;
            dk[vi][e] = a;
          }
        if (ok) {
          tiled_bwd_store_vecs<T, VPL>(rw.dk + static_cast<int64_t>(key) * p.dk_token_stride, dk,
                                       p.softmax_scale, col_lane, LPR);
          tiled_bwd_store_vecs<T, VPL>(rw.dv + static_cast<int64_t>(key) * p.dv_token_stride, dv,
                                       1.f, col_lane, LPR);
        }
      }
    }

    // dq: the lane groups of a wave by shuffles; a block-wide item's waves then in wave order
    // through shared memory.
#pragma unroll
    for (int r = 0; r < ROWS; ++r)
#pragma unroll
      for (int vi = 0; vi < VPL; ++vi)
#pragma unroll
        for (int e = 0; e < 8; ++e) dq[r][vi][e] = ra_strided_sum<LPR, WAVE>(dq[r][vi][e]);
    auto dq_row = [&](int r) { return rw.dq + row_at(r, p.dq_token_stride, p.dq_head_stride); };
    if (!per_block) {
#pragma unroll
      for (int r = 0; r < ROWS; ++r)
        if (sub == 0 && r < nrows)
          tiled_bwd_store_vecs<T, VPL>(dq_row(r), dq[r], p.softmax_scale, col_lane, LPR);
      continue;
    }
#pragma unroll
    for (int r = 0; r < ROWS; ++r)
#pragma unroll
      for (int vi = 0; vi < VPL; ++vi)
#pragma unroll
        for (int e = 0; e < 8; ++e)
          if (sub == 0 && r < nrows)
            dq_parts[wave][r][8 * (col_lane + vi * LPR) + e] = dq[r][vi][e];
    __syncthreads();
    for (int idx = threadIdx.x; idx < nrows * (D / 8); idx += kTiledBwdStreamThreads) {
      const int r = idx / (D / 8);
      const int c = 8 * (idx - r * (D / 8));
      float sum[1][8];
#pragma unroll
      for (int e = 0; e < 8; ++e) sum[0][e] = dq_parts[0][r][c + e];
#pragma unroll
      for (int w = 1; w < WAVES; ++w)
#pragma unroll
        for (int e = 0; e < 8; ++e) sum[0][e] += dq_parts[w][r][c + e];
      tiled_bwd_store_vecs<T, 1>(dq_row(r) + c, sum, p.softmax_scale, 0, 1);
    }
    __syncthreads();  // the next item's partials overwrite these
  }
}

}  // namespace small_seq
