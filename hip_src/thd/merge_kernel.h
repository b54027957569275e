// Merge / correction kernel of the THD helpers: merge_partial, lse_correction, out_correction
// (thd::merge_kernel), and the LSE merge arithmetic the wide merge shares. Row units, RowVec
// and the block size: row_units.h.
#pragma once

#include "row_units.h"

namespace thd {

// exp(x) to ~1 ulp in fp32 (Cody-Waite reduction, degree-6 polynomial), independent of
// fast-math flags (nvcc --use_fast_math turns expf into the ~2 + 1.2|x| ulp __expf).
// exp(-inf) = 0, exp(NaN) = NaN, exp(x > 88.72) = inf.
RA_DEVICE float thd_exp(float x) {
  if (!(x > -104.f)) return x != x ? x : 0.f;
  if (x > 88.72283935546875f) return __int_as_float(0x7f800000);
  const float k = rintf(x * 1.44269502162933349609375f);
  float r = fmaf(k, -0.693359375f, x);  // ln2 split: hi (exact product) + lo
  r = fmaf(k, 2.12194440e-4f, r);
  const float r2 = r * r;
  float q = fmaf(1.9875691500e-4f, r, 1.3981999507e-3f);
  q = fmaf(q, r, 8.3334519073e-3f);
  q = fmaf(q, r, 4.1665795894e-2f);
  q = fmaf(q, r, 1.6666665459e-1f);
  q = fmaf(q, r, 5.0000001201e-1f);
  const float e = fmaf(q, r2, r) + 1.f;
  // 2^k in two steps so that k in [-151, 128] stays within normal exponents
  const int ki = static_cast<int>(k);
  const int k1 = ki / 2;
  const int k2 = ki - k1;
  return e * __int_as_float((k1 + 127) << 23) * __int_as_float((k2 + 127) << 23);
}

// The stable merge of two LSEs, exactly the torch path's _merge_math in fp32: new LSE and the
// weights of both sides. NaN propagates like torch.maximum / torch.minimum.
RA_DEVICE void merge_weights(float a, float b, float& lse, float& wa, float& wb) {
  const bool nan = (a != a) || (b != b);
  const float mx = nan ? a + b : fmaxf(a, b);
  const float mn = nan ? a + b : fminf(a, b);
  const bool empty = mx == -INFINITY;
  const float safe_mx = empty ? 0.f : mx;
  lse = empty ? mx : safe_mx + log1pf(thd_exp(mn - safe_mx));
  const float safe_new = empty ? 0.f : lse;
  wa = thd_exp(a - safe_new);
  wb = thd_exp(b - safe_new);
}

// The weights of out (wa) and of the step (wb): a merge's (new_lse: the merged LSE), or a
// correction's (wa = 1, wb = exp(b - a) with a the final LSE; new_lse = 0, never written).
RA_DEVICE void step_weights(bool correction, float a, float b, float& new_lse, float& wa,
                            float& wb) {
  new_lse = 0.f;
  if (correction) {
    wa = 1.f;
    wb = thd_exp(b != -INFINITY ? b - a : -INFINITY);
  } else {
    merge_weights(a, b, new_lse, wa, wb);
  }
}

// Batches of kMergeUnits units per lane whose rows the snapshot waves put in L2 before the wait
// (with the owners' LSEs); the launcher's default.
// NOTE: the LSEs and one batch beat no prefetch, the LSEs alone, two batches and the whole tile
// on every benchmark row (docs/kernels.md#thd-merge-kernels).
constexpr int kMergePrefetchBatches = 1;

// Merge kernel: one wave per tile of 2^tile_shift (step token k, head h) items, heads fastest
// (tokens fastest in LSE-only launches, where the LSE [H, t] accesses then coalesce).
//  1. Owner lanes (lane j < tile: item tile_base + j) do the per-item work once: the row search,
//     both LSE loads, the merge weights (exp/log1p) and the LSE writes.
//  2. The rows are streamed in units: one unit = VEC elements of one item per lane, groups of
//     2^lpr_shift lanes per item (a pass moves wave >> lpr_shift items); the lanes fetch the
//     item's rows and weights from its owner by shuffles. U units per lane are loaded before
//     any is used (U x 32 bytes in flight per lane for 16-bit rows), kept packed until then.
// The first units' row loads are issued before the weights are computed (they need only the
// row indices), so the LSE round trip overlaps them.
// NOTE: a kernel where every lane of a group recomputed the item division, the weights and
// exp/log1p, with one 16-byte vector per lane and item, kept too few bytes in flight per SM
// (docs/kernels.md#thd-merge-kernels).
template <int VEC, int ODT, int SDT>
__global__ void __launch_bounds__(kMergeThreads) merge_kernel(const ThdMergeParams p,
                                                              const int lpr_shift,
                                                              const int tile_shift,
                                                              const int prefetch_batches) {
  __shared__ int32_t snapshot[kSnapshotWords];
  constexpr int U = kMergeUnits;
  constexpr int kW = RA_WAVE_SIZE;
  constexpr int kWShift = kW == 64 ? 6 : 5;
  const int lane = threadIdx.x & (kW - 1);
  const int nv = p.out_dst != nullptr ? p.dim / VEC : 0;
  const int shift = lpr_shift < kWShift ? lpr_shift : kWShift;  // lanes per item: 1 << shift
  const int tshift = tile_shift < kWShift ? tile_shift : kWShift;
  const int sub = lane & ((1 << shift) - 1);
  const int grp = lane >> shift;
  const int ipp_shift = kWShift - shift;  // items per pass: 1 << ipp_shift
  int cshift = 0;                         // units per item and pass (rows wider than the group)
  while ((1 << (shift + cshift)) < nv) ++cshift;
  const int cmask = (1 << cshift) - 1;
  const bool halves = p.map.kind == ThdRowMap::kHalf;
  const bool heads_fastest = nv > 0;
  // host-checked: n * heads < 2^31 and every row index < 2^31; 64-bit only in pointer offsets
  const uint32_t heads = static_cast<uint32_t>(p.heads);
  const uint32_t nn = static_cast<uint32_t>(p.n);
  const uint32_t items = nn * heads;
  const uint32_t minor_n = heads_fastest ? heads : nn;
  const uint32_t warp = (blockIdx.x * kMergeThreads + threadIdx.x) >> kWShift;
  const uint32_t warps = (gridDim.x * kMergeThreads) >> kWShift;
  // rows from a cu_seqlens snapshot before the wait (index.h), checked before the first store;
  // not in the run-time-dtype kernels (rare rows), where the extra registers made nvcc spill
  constexpr bool kMayGuess = VEC == 8 && ODT != kThdAnyDtype;
  const bool guess = kMayGuess && halves && maps_from_snapshot<1>(p.map);  // uniform
  if (guess) take_cu_snapshot<1>(p.map, snapshot, kMergeThreads);
  bool waited = !guess, checked = !guess;
  if (!guess) {
    ra_wait_for_prior_kernel();  // launched by ra_launch: nothing is read before this
    ra_let_next_kernel_start();
  }
  for (uint32_t base = warp << tshift; base < items; base += warps << tshift) {
    const uint32_t left = items - base;
    const int in_tile = left < (1u << tshift) ? static_cast<int>(left) : (1 << tshift);
    // 1. owner lanes: rows and LSE loads
    const uint32_t item = base + (lane < in_tile ? lane : 0);
    const uint32_t major = item / minor_n;
    const uint32_t minor = item - major * minor_n;
    const int k = static_cast<int>(heads_fastest ? major : minor);
    int h = static_cast<int>(heads_fastest ? minor : major);
    int r = k, r0 = -1, sk = k;  // running row, first-half row, step row
    float a = 0.f, b = 0.f;
    // Before the wait, rows guessed from the snapshot: the owners' LSEs and the first
    // prefetch_batches x U units of rows into L2 (a hint: what the loads after the wait read
    // is L2's current line either way), so that the first loads after it find them there.
    auto prefetch_guessed_rows = [&]() {
      if (lane < in_tile) {
        ra_prefetch_l2(p.lse + h * p.lse_head + r * p.lse_tok);
        ra_prefetch_l2(p.lse_step + h * p.lse_step_head + sk * p.lse_step_tok);
      }
      const int passes = (in_tile + (1 << ipp_shift) - 1) >> ipp_shift;
      const int units = min(passes << cshift, prefetch_batches * U);
#pragma unroll 1
      for (int unit = 0; unit < units; ++unit) {  // warp-uniform: the shuffles need every lane
        const int it = ((unit >> cshift) << ipp_shift) + grp;
        const int src = it & (kW - 1);
        const int ur = ra_shfl(r, src);
        const int uk = ra_shfl(sk, src);
        const int uh = ra_shfl(h, src);
        const int v = ((unit & cmask) << shift) + sub;
        if (it < in_tile && v < nv) {
          RowVec<ODT, VEC>::prefetch(p.out, ur * p.out_tok + uh * p.out_head + v * VEC,
                                     p.out_dtype);
          RowVec<SDT, VEC>::prefetch(p.out_step, uk * p.step_tok + uh * p.step_head + v * VEC,
                                     p.step_dtype);
        }
      }
    };
    auto map_rows = [&](const int32_t* cu) {
      if (halves) {  // one search for both halves
        int rf, rs;
        half_rows_wave<kW>(p.map, cu, k, rf, rs);
        r = rs;
        r0 = p.copy_first_half ? rf : -1;
      }
      if (!waited && prefetch_batches > 0) prefetch_guessed_rows();
      if (!waited) {
        ra_wait_for_prior_kernel();
        ra_let_next_kernel_start();
        waited = true;
      }
      if (lane >= in_tile) {
        h = -1;
        r0 = -1;
      } else {
        if (p.map.kind == ThdRowMap::kIndex) {
          r = static_cast<int>(clamp_row(p.map.index[k], p.map.local_rows));
          if (p.map.step_index != nullptr)  // step results laid out like out (direct CP calls)
            sk = static_cast<int>(clamp_row(p.map.step_index[k], p.map.step_count));
        }
        a = p.lse[h * p.lse_head + r * p.lse_tok];
        b = p.lse_step[h * p.lse_step_head + sk * p.lse_step_tok];
      }
    };
    map_rows(checked ? p.map.cu : snapshot);
    // whether the rows must be mapped again (the snapshot was stale): then every load is redone
    auto remapped = [&]() {
      if (checked) return false;
      checked = true;
      if (wave_snapshot_current<1, kW>(p.map, snapshot)) return false;
      h = static_cast<int>(heads_fastest ? minor : major);
      map_rows(p.map.cu);
      return true;
    };
    float wa = 1.f, wb = 0.f;
    auto weights = [&]() {
      if (lane < in_tile) {
        float new_lse;
        step_weights(p.correction, a, b, new_lse, wa, wb);
        if (p.lse_dst != nullptr) {
          p.lse_dst[h * p.lse_dst_head + r * p.lse_dst_tok] = new_lse;
          if (r0 >= 0)
            p.lse_dst[h * p.lse_dst_head + r0 * p.lse_dst_tok] =
                p.lse[h * p.lse_head + r0 * p.lse_tok];
        }
      }
    };
    if (nv == 0) {
      remapped();
      weights();
      continue;
    }
    // 2. row units (warp-uniform counts: shuffles need every lane)
    const int passes = (in_tile + (1 << ipp_shift) - 1) >> ipp_shift;
    const int units = passes << cshift;
    for (int u0 = 0; u0 < units; u0 += U) {
      RowVec<ODT, VEC> x[U];
      RowVec<SDT, VEC> y[U];
      bool act[U];
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int unit = u0 + u;
        const int it = ((unit >> cshift) << ipp_shift) + grp;  // item of this lane's group
        const int src = it & (kW - 1);
        const int ur = ra_shfl(r, src);
        const int uk = ra_shfl(sk, src);
        const int uh = ra_shfl(h, src);
        const int v = ((unit & cmask) << shift) + sub;
        act[u] = unit < units && it < in_tile && v < nv;
        if (act[u]) {
          x[u].load(p.out, ur * p.out_tok + uh * p.out_head + v * VEC, p.out_dtype);
          y[u].load(p.out_step, uk * p.step_tok + uh * p.step_head + v * VEC, p.step_dtype);
        }
      }
      if (u0 == 0) {
        if (remapped()) {  // load these units again from the new rows
          u0 -= U;
          continue;
        }
        weights();
      }
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int unit = u0 + u;
        const int it = ((unit >> cshift) << ipp_shift) + grp;
        const int src = it & (kW - 1);
        const float ua = ra_shfl(wa, src);
        const float ub = ra_shfl(wb, src);
        const int ur = ra_shfl(r, src);
        const int uh = ra_shfl(h, src);
        const int v = ((unit & cmask) << shift) + sub;
        if (act[u]) {
          // correction: wa = 1 keeps out as is; merge drops a side whose weight is 0 (junk in
          // an empty accumulator, a step row with no keys): selected away, never times 0
          const bool use_a = ua > 0.f;
          const bool use_b = ub > 0.f;
          float xf[VEC], yf[VEC];
          x[u].unpack(xf, p.out_dtype);
          y[u].unpack(yf, p.step_dtype);
#pragma unroll
          for (int e = 0; e < VEC; ++e) {
            const float xa = use_a ? xf[e] * ua : 0.f;
            const float yb = use_b ? yf[e] * ub : 0.f;
            xf[e] = xa + yb;
          }
          x[u].pack(xf, p.out_dtype);
          x[u].store(p.out_dst, ur * p.dst_tok + uh * p.dst_head + v * VEC, p.out_dtype);
        }
      }
    }
    // 3. kHalf into new tensors: the first halves' rows, copied bitwise
    if (halves && p.copy_first_half) {
      for (int u0 = 0; u0 < units; u0 += U) {
        RowVec<ODT, VEC> x[U];
#pragma unroll
        for (int u = 0; u < U; ++u) {
          const int unit = u0 + u;
          const int it = ((unit >> cshift) << ipp_shift) + grp;
          const int src = it & (kW - 1);
          const int ur = ra_shfl(r0, src);
          const int uh = ra_shfl(h, src);
          const int v = ((unit & cmask) << shift) + sub;
          if (unit < units && it < in_tile && v < nv && ur >= 0) {
            x[u].load(p.out, ur * p.out_tok + uh * p.out_head + v * VEC, p.out_dtype);
            x[u].store(p.out_dst, ur * p.dst_tok + uh * p.dst_head + v * VEC, p.out_dtype);
          }
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
