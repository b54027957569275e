// Merge / correction kernel for wide fp32 rows (merge_partial, out_correction into an fp32
// accumulator, with or without halves): rows of at least one wave of 8-element vectors.
//
// The copy kernels' wide-row scheme (copy_wide_kernel.h): one wave moves kWideVecsPerLane x
// wave vectors of one row of step token k, maps that row itself (one uniform search,
// half_rows), and ends; the grid holds one wave per piece. Lane i owns the piece's i-th head:
// it reads the head's two LSEs, computes the weights once (one exp / log1p pass per wave, not
// one per vector) and writes the new LSE; the lanes take their vectors' weights by shuffles.
// Rows of the first resident round come from a cu_seqlens snapshot before the wait.
// NOTE: this kernel beats the tile kernel on fp32 rows and loses to it on 16-bit merges, so
// the launcher takes it for fp32 rows only (docs/kernels.md#thd-merge-kernels).
#pragma once

#include "copy_wide_kernel.h"
#include "merge_kernel.h"

namespace thd {

template <int ODT, int SDT>
__global__ void __launch_bounds__(kMergeThreads) merge_wide_kernel(const ThdMergeParams p,
                                                                   const int pieces_shift,
                                                                   const int64_t guess_blocks) {
  constexpr int kW = RA_WAVE_SIZE;
  constexpr int VPT = kWideVecsPerLane;
  __shared__ int32_t snapshot[kSnapshotWords];
  const WideLane<kMergeThreads, VPT> w(pieces_shift);
  const int64_t k = w.slot;
  const bool in_range = k < p.n;  // false: the last block's surplus waves
  const bool halves = p.map.kind == ThdRowMap::kHalf;
  const int nv = p.dim / 8;  // vectors per head
  const int nvec = p.heads * nv;
  // the piece's heads: h_lo + lane for owner lanes (the launcher: at most a wave of them)
  const int h_lo = w.piece * VPT * kW / nv;
  const int h_own = h_lo + w.lane;
  const bool owner = in_range && h_own < p.heads && h_own * nv < (w.piece + 1) * VPT * kW;
  RowVec<ODT, 8> x[VPT];
  RowVec<SDT, 8> y[VPT];
  float a = 0.f, b = 0.f;  // owner lanes: the LSEs of head h_own, out's and the step's
  // the LSEs first: the weights' exp / log1p chain then runs while the rows are in flight
  auto load = [&](int64_t r) {
    if (owner) {
      a = p.lse[h_own * p.lse_head + r * p.lse_tok];
      b = p.lse_step[h_own * p.lse_step_head + k * p.lse_step_tok];
    }
#pragma unroll
    for (int u = 0; u < VPT; ++u) {
      const int v = w.piece_vector(u);
      if (in_range && v < nvec) {
        const int h = v / nv;
        const int64_t e = static_cast<int64_t>(v - h * nv) * 8;
        x[u].load(p.out, r * p.out_tok + h * p.out_head + e, p.out_dtype);
        y[u].load(p.out_step, k * p.step_tok + h * p.step_head + e, p.step_dtype);
      }
    }
  };
  int64_t first = -1, r = k;  // first: the first half's row (kHalf), r: the row merged into
  auto map_rows = [&](const ThdRowMapParams& m) {  // r, and `first` where it has one
    int64_t merged = k;
    if (halves) half_rows_uniform(m, k, first, merged);
    return merged;
  };
  if (halves && blockIdx.x < guess_blocks && maps_from_snapshot<1>(p.map)) {  // uniform
    // no L2 prefetch of the guessed rows here: not measured for these rows (bench_thd has no
    // fp32 accumulator merged by halves)
    r = map_and_load_from_snapshot<1, kMergeThreads>(p.map, snapshot, in_range, r, map_rows,
                                                      load, false, [](int64_t) {});
  } else {
    ra_wait_for_prior_kernel();  // launched by ra_launch: nothing is read before this
    ra_let_next_kernel_start();
    if (!in_range) return;
    r = map_rows(p.map);
    load(r);
  }
  if (!in_range) return;
  // owner lanes: the head's weights, once, and its LSE writes
  float wa = 1.f, wb = 0.f;
  if (owner) {
    float new_lse;
    step_weights(p.correction, a, b, new_lse, wa, wb);
    if (p.lse_dst != nullptr) {
      p.lse_dst[h_own * p.lse_dst_head + r * p.lse_dst_tok] = new_lse;
      if (halves && p.copy_first_half)
        p.lse_dst[h_own * p.lse_dst_head + first * p.lse_dst_tok] =
            p.lse[h_own * p.lse_head + first * p.lse_tok];
    }
  }
#pragma unroll
  for (int u = 0; u < VPT; ++u) {
    const int v = w.piece_vector(u);
    const int h = v / nv;
    const int src = (h - h_lo) & (kW - 1);  // all lanes shuffle; past nvec: any lane
    const float ua = ra_shfl(wa, src);
    const float ub = ra_shfl(wb, src);
    if (v >= nvec) continue;
    const int64_t e = static_cast<int64_t>(v - h * nv) * 8;
    // correction: wa = 1 keeps out as is; merge drops a side whose weight is 0 (junk in an
    // empty accumulator, a step row with no keys): selected away, never times 0
    const bool use_a = ua > 0.f;
    const bool use_b = ub > 0.f;
    float xf[8], yf[8];
    x[u].unpack(xf, p.out_dtype);
    y[u].unpack(yf, p.step_dtype);
#pragma unroll
    for (int i = 0; i < 8; ++i) xf[i] = (use_a ? xf[i] * ua : 0.f) + (use_b ? yf[i] * ub : 0.f);
    x[u].pack(xf, p.out_dtype);
    x[u].store(p.out_dst, r * p.dst_tok + h * p.dst_head + e, p.out_dtype);
    if (halves && p.copy_first_half) {  // into new tensors: the first half, bitwise
      x[u].load(p.out, first * p.out_tok + h * p.out_head + e, p.out_dtype);
      x[u].store(p.out_dst, first * p.dst_tok + h * p.dst_head + e, p.out_dtype);
    }
  }
}

}  // namespace thd
