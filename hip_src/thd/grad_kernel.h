// Gradient correction kernel of the THD helpers: grad_correction and add_rows
// (thd::grad_kernel), in the merge kernel's row units (row_units.h).
#pragma once

#include "row_units.h"

namespace thd {

// Offset (elements) of vector v of a [heads, head_dim] row, vph vectors per head.
template <int VEC>
RA_DEVICE int64_t row_offset(int v, int vph, int heads, int64_t head_stride) {
  if (heads == 1) return static_cast<int64_t>(v) * VEC;
  const int hh = v / vph;
  return hh * head_stride + static_cast<int64_t>(v - hh * vph) * VEC;
}

// How the grad kernel finds its rows (a template argument, so that each kernel carries only its
// own registers and shuffles): kGradRowsDirect (identity, or halves mapped after the wait),
// kGradRowsIndexed (the kIndex map of add_rows), kGradRowsSnapshot (halves mapped from a
// cu_seqlens snapshot before the wait, index.h). The launcher picks kGradRowsSnapshot only for
// grids of one resident wave: it costs the kernel registers (5 -> 4 blocks per SM), which loses
// more on large grids than the first wave gains (docs/kernels.md#thd-grad-kernels).
enum GradRows : int { kGradRowsDirect = 0, kGradRowsIndexed = 1, kGradRowsSnapshot = 2 };
constexpr int kGradSnapshotBlocksPerSM = 4;

// Grad kernel: one wave per tile of 2^tile_shift step tokens k. Owner lanes (lane j: k =
// tile_base + j) do the row search once per k (both halves' rows); the rows, [heads, head_dim]
// as VEC-element vectors over the whole wave, are moved in units (one vector per lane of one
// half of one k; U units in flight per lane, kept packed) whose row comes from the owner by a
// shuffle. Every unit is warp-uniform in (k, half), so the shuffle is a broadcast.
// NOTE: hoisting both halves' loads as floats before any store (99 registers) lost badly;
// packed raw vectors keep U loads in flight at fewer registers (docs/kernels.md#thd-grad-kernels).
template <int VEC, int GDT, int SDT, int ROWS>
__global__ void __launch_bounds__(kMergeThreads) grad_kernel(const ThdGradParams p,
                                                             const int tile_shift) {
  __shared__ int32_t snapshot[kSnapshotWords];
  constexpr bool kFromSnapshot = ROWS == kGradRowsSnapshot && VEC == 8;  // scalar rows: direct
  // the other kernels wait first thing: below the setup, the wait cost them 6 registers
  if (!kFromSnapshot) {
    ra_wait_for_prior_kernel();  // launched by ra_launch: nothing is read before this
    ra_let_next_kernel_start();
  }
  constexpr int U = kMergeUnits;
  constexpr int kW = RA_WAVE_SIZE;
  constexpr int kWShift = kW == 64 ? 6 : 5;
  const int lane = threadIdx.x & (kW - 1);
  const int tshift = tile_shift < kWShift ? tile_shift : kWShift;
  const int vph = p.head_dim / VEC;
  const int nvec = p.heads * vph;
  int cshift = 0;  // units per row and lane: 1 << cshift
  while ((kW << cshift) < nvec) ++cshift;
  constexpr bool indexed = ROWS == kGradRowsIndexed;  // the launcher picks ROWS from p.map
  const bool halves = !indexed && p.map.kind == ThdRowMap::kHalf;  // no half maps in add_rows
  // the halves that move data: both (hshift 1: bit cshift of a unit picks the half) or one
  const bool move0 = p.op0 != kThdGradNone || p.copy_none;
  const bool move1 = halves && (p.op1 != kThdGradNone || p.copy_none);
  // rows from a cu_seqlens snapshot before the wait (index.h), checked after the first loads
  const bool guess = kFromSnapshot && halves && (move0 || move1) &&
                     maps_from_snapshot<1>(p.map);  // uniform
  if (guess) take_cu_snapshot<1>(p.map, snapshot, kMergeThreads);
  bool waited = !guess, checked = !guess;
  if (kFromSnapshot && !guess) {
    ra_wait_for_prior_kernel();
    ra_let_next_kernel_start();
  }
  if (!move0 && !move1) return;
  const int hshift = move0 && move1 ? 1 : 0;
  const int only_half = move0 ? 0 : 1;
  const uint32_t nn = static_cast<uint32_t>(p.n);  // host-checked: rows < 2^31
  const uint32_t warp = (blockIdx.x * kMergeThreads + threadIdx.x) >> kWShift;
  const uint32_t warps = (gridDim.x * kMergeThreads) >> kWShift;
  for (uint32_t base = warp << tshift; base < nn; base += warps << tshift) {
    const uint32_t left = nn - base;
    const int in_tile = left < (1u << tshift) ? static_cast<int>(left) : (1 << tshift);
    const int k = static_cast<int>(base) + (lane < in_tile ? lane : 0);
    int r_first = k, r_second = k, s_index = k;
    if (halves) {
      if (checked)  // two calls, not one through a pointer select: cu stays a global pointer
        half_rows_wave<kW>(p.map, p.map.cu, k, r_first, r_second);
      else
        half_rows_wave<kW>(p.map, snapshot, k, r_first, r_second);
      if (!waited) {
        ra_wait_for_prior_kernel();
        ra_let_next_kernel_start();
        waited = true;
      }
    } else if (indexed) {  // add_rows: grad row index[k] gets step row step_index[k] (or k)
      r_first = static_cast<int>(clamp_row(p.map.index[k], p.map.local_rows));
      if (p.map.step_index != nullptr)
        s_index = static_cast<int>(clamp_row(p.map.step_index[k], p.map.step_count));
    }
    const int units = in_tile << (cshift + hshift);
    for (int u0 = 0; u0 < units; u0 += U) {
      RowVec<GDT, VEC> g[U];
      RowVec<SDT, VEC> s[U];
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int unit = u0 + u;
        const int it = unit >> (cshift + hshift);
        const int hf = hshift ? (unit >> cshift) & 1 : only_half;
        const int op = hf == 0 ? p.op0 : p.op1;
        const int r = ra_shfl(hf == 0 ? r_first : r_second, it & (kW - 1));
        const int si = indexed ? ra_shfl(s_index, it & (kW - 1)) : 0;  // uniform branch
        const int v = ((unit & ((1 << cshift) - 1)) << kWShift) + lane;
        if (unit < units && v < nvec) {
          const int sr = indexed ? si : (p.step_is_half ? static_cast<int>(base) + it : r);
          if (op != kThdGradCopy)
            g[u].load(p.grad, r * p.grad_tok + row_offset<VEC>(v, vph, p.heads, p.grad_head),
                      p.grad_dtype);
          if (op != kThdGradNone)
            s[u].load(p.step, sr * p.step_tok + row_offset<VEC>(v, vph, p.heads, p.step_head),
                      p.step_dtype);
        }
      }
      if (!checked) {  // the rows came from the snapshot: if stale, map again and reload
        checked = true;
        if (!wave_snapshot_current<1, kW>(p.map, snapshot)) {
          half_rows_wave<kW>(p.map, p.map.cu, k, r_first, r_second);
          u0 -= U;
          continue;
        }
      }
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int unit = u0 + u;
        const int it = unit >> (cshift + hshift);
        const int hf = hshift ? (unit >> cshift) & 1 : only_half;
        const int op = hf == 0 ? p.op0 : p.op1;
        const int r = ra_shfl(hf == 0 ? r_first : r_second, it & (kW - 1));
        const int v = ((unit & ((1 << cshift) - 1)) << kWShift) + lane;
        if (unit < units && v < nvec) {
          float gf[VEC];
          if (op == kThdGradNone) {  // copy_none: grad -> dst, bitwise
            g[u].store(p.dst, r * p.dst_tok + row_offset<VEC>(v, vph, p.heads, p.dst_head),
                       p.grad_dtype);
            continue;
          }
          if (op == kThdGradAdd) {
            float sf[VEC];
            g[u].unpack(gf, p.grad_dtype);
            s[u].unpack(sf, p.step_dtype);
#pragma unroll
            for (int e = 0; e < VEC; ++e) gf[e] += sf[e];
          } else if (op == kThdGradCopy) {
            s[u].unpack(gf, p.step_dtype);
          }
          g[u].pack(gf, p.grad_dtype);
          g[u].store(p.dst, r * p.dst_tok + row_offset<VEC>(v, vph, p.heads, p.dst_head),
                     p.grad_dtype);
        }
      }
    }
  }
  if (!waited) {  // no tile reached this wave: still wait, so no kernel ends before the one ahead
    ra_wait_for_prior_kernel();
    ra_let_next_kernel_start();
  }
}

}  // namespace thd
