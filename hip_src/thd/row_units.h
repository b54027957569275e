// What the THD merge and grad tile kernels share (merge_kernel.h, grad_kernel.h and their wide
// forms): the block size, the row units each lane keeps in flight, RowVec (VEC elements of a row
// kept as raw bits from load to use) and the per-wave half-row search. The grad kernels move
// their rows in the merge kernel's units, so both take these names from here.
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

  // NOTE: load and pack write every word of w once, after the dtype branch. Words written
  // inside the branches of a run-time dtype (kThdAnyDtype) get their stores merged into one
  // store through a pointer phi, and ROCm's LLVM then keeps w (both U-unit arrays) in scratch.
  RA_DEVICE void load(const void* base, int64_t off, int dt) {
    const int d = dtype(dt);
    if constexpr (VEC == 8) {
      ra_vec8 a{}, b{};  // b: the second 16 bytes of an fp32 row
      if (d != kThdFloat32) {
        a = ra_load16(static_cast<const uint16_t*>(base) + off);
      } else if constexpr (!kIs16) {
        const float* p = static_cast<const float*>(base) + off;
        a = ra_load16(p);
        b = ra_load16(p + 4);
      }
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        w[i] = a.w[i];
        if constexpr (!kIs16) w[4 + i] = b.w[i];
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
    if constexpr (VEC == 8) {  // every word written once (see load)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const uint32_t h2 = d == kThdBFloat16
                                ? ra_pack_bf16x2(x[2 * i], x[2 * i + 1])
                                : static_cast<uint32_t>(ra_float_to_fp16_bits(x[2 * i])) |
                                      (static_cast<uint32_t>(ra_float_to_fp16_bits(x[2 * i + 1]))
                                       << 16);
        w[i] = !kIs16 && d == kThdFloat32 ? __float_as_uint(x[i]) : h2;
        if constexpr (!kIs16) w[4 + i] = __float_as_uint(x[4 + i]);  // used by fp32 rows only
      }
    } else if (d == kThdFloat32) {
      if constexpr (!kIs16) w[0] = __float_as_uint(x[0]);
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

}  // namespace thd
