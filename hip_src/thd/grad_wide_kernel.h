// Gradient correction kernel for wide rows (grad_correction over halves or whole rows): rows
// of at least one wave of 8-element vectors, 16-bit or fp32 rows of one dtype each.
//
// The copy kernels' wide-row scheme (copy_wide_kernel.h): one wave moves kGradWideVecsPerLane x
// wave vectors of one row of one half of step token k, maps that row itself (one uniform
// search, half_rows), and ends; the grid holds one wave per piece. Rows of the first resident
// round of blocks come from a cu_seqlens snapshot before the wait.
// NOTE: H200, grad_correction_ ("none", "add", bf16 rows of 2 KB, bench_thd): 92 / 86 / 74 / 97%
// of floor at b16 cp2 / cp4 / cp8 and var64, against the tile kernel's 85 / 79 / 73 / 84%.
#pragma once

#include "copy_wide_kernel.h"
#include "grad_kernel.h"

namespace thd {

// Vectors per lane: two, as the copies. With the L2 prefetch of the first round's rows before
// the wait, two beat one on every row; without it one was ahead (two loads per lane either way).
// NOTE: the margins are small either way (docs/kernels.md#thd-grad-kernels); re-measure this
// constant when the prefetch or the row map changes.
constexpr int kGradWideVecsPerLane = 2;

// Waves: (k, half, piece), pieces fastest; hshift 1: both halves move (bit pieces_shift of the
// wave picks the half), 0: only `only_half` (kIdentity: half 0, the row k itself).
template <int GDT, int SDT>
__global__ void __launch_bounds__(kMergeThreads) grad_wide_kernel(const ThdGradParams p,
                                                                  const int pieces_shift,
                                                                  const int hshift,
                                                                  const int only_half,
                                                                  const int64_t guess_blocks,
                                                                  const int prefetch) {
  constexpr int VPT = kGradWideVecsPerLane;
  __shared__ int32_t snapshot[kSnapshotWords];
  const WideLane<kMergeThreads, VPT> w(pieces_shift);
  const int half = hshift ? static_cast<int>(w.slot & 1) : only_half;
  const int64_t k = w.slot >> hshift;
  const bool in_range = k < p.n;  // false: the last block's surplus waves
  const bool halves = p.map.kind == ThdRowMap::kHalf;
  const int op = half == 0 ? p.op0 : p.op1;
  const int vph = p.head_dim / 8;
  const int nvec = p.heads * vph;
  RowVec<GDT, 8> g[VPT];
  RowVec<SDT, 8> s[VPT];
  auto load = [&](int64_t r) {
    const int64_t sr = p.step_is_half ? k : r;
#pragma unroll
    for (int u = 0; u < VPT; ++u) {
      const int v = w.piece_vector(u);
      if (in_range && v < nvec) {
        if (op != kThdGradCopy)
          g[u].load(p.grad, r * p.grad_tok + row_offset<8>(v, vph, p.heads, p.grad_head),
                    p.grad_dtype);
        if (op != kThdGradNone)
          s[u].load(p.step, sr * p.step_tok + row_offset<8>(v, vph, p.heads, p.step_head),
                    p.step_dtype);
      }
    }
  };
  // the guessed rows into L2 before the wait (map_and_load_from_snapshot)
  // (a small gain on every benchmark row: docs/kernels.md#thd-grad-kernels)
  auto prefetch_rows = [&](int64_t r) {
    const int64_t sr = p.step_is_half ? k : r;
#pragma unroll
    for (int u = 0; u < VPT; ++u) {
      const int v = w.piece_vector(u);
      if (v < nvec) {
        if (op != kThdGradCopy)
          RowVec<GDT, 8>::prefetch(
              p.grad, r * p.grad_tok + row_offset<8>(v, vph, p.heads, p.grad_head), p.grad_dtype);
        if (op != kThdGradNone)
          RowVec<SDT, 8>::prefetch(
              p.step, sr * p.step_tok + row_offset<8>(v, vph, p.heads, p.step_head), p.step_dtype);
      }
    }
  };
  auto row_of = [&](const ThdRowMapParams& m) {
    if (!halves) return k;
    int64_t first, second;
    half_rows_uniform(m, k, first, second);
    return half == 0 ? first : second;
  };
  int64_t r = k;
  if (halves && blockIdx.x < guess_blocks && maps_from_snapshot<1>(p.map)) {  // uniform
    r = map_and_load_from_snapshot<1, kMergeThreads>(p.map, snapshot, in_range, r, row_of, load,
                                                      prefetch != 0, prefetch_rows);
  } else {
    ra_wait_for_prior_kernel();  // launched by ra_launch: nothing is read before this
    ra_let_next_kernel_start();
    if (!in_range) return;
    r = row_of(p.map);
    load(r);
  }
  if (!in_range) return;
#pragma unroll
  for (int u = 0; u < VPT; ++u) {
    const int v = w.piece_vector(u);
    if (v >= nvec) continue;
    const int64_t off = r * p.dst_tok + row_offset<8>(v, vph, p.heads, p.dst_head);
    if (op == kThdGradNone) {  // copy_none: grad -> dst, bitwise
      g[u].store(p.dst, off, p.grad_dtype);
      continue;
    }
    float gf[8];
    if (op == kThdGradAdd) {
      float sf[8];
      g[u].unpack(gf, p.grad_dtype);
      s[u].unpack(sf, p.step_dtype);
#pragma unroll
      for (int e = 0; e < 8; ++e) gf[e] += sf[e];
    } else {
      s[u].unpack(gf, p.step_dtype);
    }
    g[u].pack(gf, p.grad_dtype);
    g[u].store(p.dst, off, p.grad_dtype);
  }
}

}  // namespace thd
