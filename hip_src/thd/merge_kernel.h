// Merge / correction kernels of the THD helpers: merge_partial, lse_correction, out_correction
// (thd::merge_kernel) and grad_correction (thd::grad_kernel).
//
// Element dtypes (bf16 / fp16 / fp32) are template arguments for the common combinations
// (kThdAnyDtype: read at run time, for the rest); the arithmetic is fp32 and each output is
// rounded once. VEC = 8 elements per access (16 bytes of a 16-bit row, 2 x 16 bytes of an fp32
// row) when rows allow it, else 1. Item and row indices are 32-bit (the launchers check that
// they fit); only pointer offsets are 64-bit.
#pragma once

#include "../common/launch.h"
#include "index.h"

namespace thd {

constexpr int kMergeThreads = 256;

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

// Storage dtype of a row tensor as a template argument: kThdBFloat16 / kThdFloat16 /
// kThdFloat32, or kThdAnyDtype (read at run time: the fallback instantiation).
constexpr int kThdAnyDtype = -1;

// VEC elements of a row kept as raw bits (packed 16-bit pairs stay packed) from load to use.
template <int DT, int VEC>
struct RowVec {
  static_assert(VEC == 8 || VEC == 1, "VEC is 8 or 1");
  static constexpr bool kIs16 = DT == kThdBFloat16 || DT == kThdFloat16;
  static constexpr int kWords = kIs16 ? (VEC + 1) / 2 : VEC;  // kThdAnyDtype: room for fp32
  uint32_t w[kWords];

  static RA_DEVICE int dtype(int dt) { return DT == kThdAnyDtype ? dt : DT; }

  RA_DEVICE void load(const void* base, int64_t off, int dt) {
    const int d = dtype(dt);
    if constexpr (VEC == 8) {
      if (d != kThdFloat32) {
        const ra_vec8 v = ra_load16(static_cast<const uint16_t*>(base) + off);
#pragma unroll
        for (int i = 0; i < 4; ++i) w[i] = v.w[i];
      } else if constexpr (!kIs16) {
        const float* p = static_cast<const float*>(base) + off;
        const ra_vec8 a = ra_load16(p);
        const ra_vec8 b = ra_load16(p + 4);
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          w[i] = a.w[i];
          w[4 + i] = b.w[i];
        }
      }
    } else {
      w[0] = d != kThdFloat32 ? static_cast<const uint16_t*>(base)[off]
                              : static_cast<const uint32_t*>(base)[off];
    }
  }

  // load's line into L2 only (ra_prefetch_l2): what load(base, off, dt) reads, fetched ahead
  static RA_DEVICE void prefetch(const void* base, int64_t off, int dt) {
    const int bytes = dtype(dt) == kThdFloat32 ? 4 : 2;
    ra_prefetch_l2(static_cast<const char*>(base) + off * bytes);
  }

  RA_DEVICE void store(void* base, int64_t off, int dt) const {
    const int d = dtype(dt);
    if constexpr (VEC == 8) {
      if (d != kThdFloat32) {
        ra_vec8 v;
#pragma unroll
        for (int i = 0; i < 4; ++i) v.w[i] = w[i];
        ra_store16(static_cast<uint16_t*>(base) + off, v);
      } else if constexpr (!kIs16) {
        float* p = static_cast<float*>(base) + off;
        ra_vec8 a, b;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          a.w[i] = w[i];
          b.w[i] = w[4 + i];
        }
        ra_store16(p, a);
        ra_store16(p + 4, b);
      }
    } else {
      if (d != kThdFloat32) {
        static_cast<uint16_t*>(base)[off] = static_cast<uint16_t>(w[0]);
      } else {
        static_cast<uint32_t*>(base)[off] = w[0];
      }
    }
  }

  static RA_DEVICE float half_to_f32(uint32_t bits, int d) {  // bits: 16 significant
    return d == kThdBFloat16 ? __uint_as_float(bits << 16) : ra_fp16_bits_to_float(bits);
  }

  RA_DEVICE void unpack(float (&x)[VEC], int dt) const {
    const int d = dtype(dt);
    if (d == kThdFloat32) {
      if constexpr (!kIs16) {
#pragma unroll
        for (int i = 0; i < VEC; ++i) x[i] = __uint_as_float(w[i]);
      }
    } else if constexpr (VEC == 8) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        if (d == kThdBFloat16) {
          x[2 * i] = __uint_as_float(w[i] << 16);
          x[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
        } else {
          x[2 * i] = ra_fp16_bits_to_float(w[i] & 0xffffu);
          x[2 * i + 1] = ra_fp16_bits_to_float(w[i] >> 16);
        }
      }
    } else {
      x[0] = half_to_f32(w[0] & 0xffffu, d);
    }
  }

  RA_DEVICE void pack(const float (&x)[VEC], int dt) {
    const int d = dtype(dt);
    if (d == kThdFloat32) {
      if constexpr (!kIs16) {
#pragma unroll
        for (int i = 0; i < VEC; ++i) w[i] = __float_as_uint(x[i]);
      }
    } else if constexpr (VEC == 8) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        w[i] = d == kThdBFloat16 ? ra_pack_bf16x2(x[2 * i], x[2 * i + 1])
                                 : static_cast<uint32_t>(ra_float_to_fp16_bits(x[2 * i])) |
                                       (static_cast<uint32_t>(ra_float_to_fp16_bits(x[2 * i + 1]))
                                        << 16);
      }
    } else {
      w[0] = d == kThdBFloat16 ? ra_float_to_bf16_bits(x[0]) : ra_float_to_fp16_bits(x[0]);
    }
  }
};

RA_HOST_DEVICE int log2_pow2(int x) {  // x a power of two
  int s = 0;
  while ((1 << s) < x) ++s;
  return s;
}

// half_rows for every lane of a wave at once (every lane calls it, converged; k >= 0 any row
// for lanes whose result is not used): one wave search (seq_of_wave), then the sequence's
// bounds: two memory round trips instead of log2(b) + 2 dependent ones. cu: m.cu or a
// snapshot of it (index.h).
template <int W>
RA_DEVICE void half_rows_wave(const ThdRowMapParams& m, const int32_t* cu, int k, int& first,
                              int& second) {
  const int64_t end = cu[m.b];  // issued with the search's loads
  int64_t f, sc;
  half_rows(m, cu, k, seq_of_wave<W>(cu, m.b, 2, k), end, f, sc);
  first = static_cast<int>(f);
  second = static_cast<int>(sc);
}

// Row units in flight per lane (U x 16 bytes per tensor, kept packed until used).
// NOTE: more units per lane cost registers (U = 4: 80, U = 8: 127) and gained nothing on bf16
// rows (docs/kernels.md#thd-merge-kernels).
constexpr int kMergeUnits = 2;

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

// Grad kernel: one wave per tile of 2^tile_shift step tokens k. Owner lanes (lane j: k =
// tile_base + j) do the row search once per k (both halves' rows); the rows, [heads, head_dim]
// as VEC-element vectors over the whole wave, are moved in units (one vector per lane of one
// half of one k; U units in flight per lane, kept packed) whose row comes from the owner by a
// shuffle. Every unit is warp-uniform in (k, half), so the shuffle is a broadcast.
// NOTE: hoisting both halves' loads as floats before any store (99 registers) lost badly;
// packed raw vectors keep U loads in flight at fewer registers (docs/kernels.md#thd-grad-kernels).
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
