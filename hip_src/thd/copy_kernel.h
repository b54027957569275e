// Row gather/scatter kernel of the copy-type THD helpers: partition, reorder_to_contiguous,
// reorder_to_rank_sharded, read_half, copy_valid_tokens (and pad_for_cp through it).
//
// A group of 2^lpr_shift lanes owns one destination row: it finds the row's source (map_query,
// one wave search for the rows of all the wave's groups, then map_row_given), then copies the
// row (every outer slice of this block, e.g. the LSE heads) with V-byte vectors, kCopyUnroll
// loads in flight per lane before the stores. The grid covers the rows
// (it scales with tokens), blockIdx.y covers outer slices kCopyOuterPerBlock at a time.
// NOTE: a variant that capped the grid and prefetched each group's next row mapping while
// the current row's loads were in flight measured slower on an H200 (more registers, fewer
// resident blocks): one row per group, as here, is the faster of the two.
#pragma once

#include "../common/launch.h"
#include "index.h"

namespace thd {

constexpr int kCopyThreads = 256;
constexpr int kCopyOuterPerBlock = 8;  // outer slices per block: one search serves 8 LSE heads
constexpr int kCopyUnroll = 4;         // vectors in flight per lane
// Lanes per row ~ vectors per row / kCopyVecsPerLane (launcher; env override for experiments).
// NOTE: H200, bf16 rows of 2 KB (bench_thd, session 6): 8 vectors per lane against 4 gave
// reorder_to_rank_sharded 87 -> 92% of floor (b16 cases) and 88 -> 98% (var64), the other copy
// helpers within +-3 points; 16 lost 1-9 points, 2 and 1 lost 25-55.
constexpr int kCopyVecsPerLane = 8;

struct alignas(8) Vec8B {
  uint32_t w[2];
};

template <int V>
struct VecOf;
template <>
struct VecOf<16> {
  using type = ra_vec8;
  static RA_DEVICE type fill(const uint32_t (&f)[4]) {
    type v;
    v.w[0] = f[0];
    v.w[1] = f[1];
    v.w[2] = f[2];
    v.w[3] = f[3];
    return v;
  }
};
template <>
struct VecOf<8> {
  using type = Vec8B;
  static RA_DEVICE type fill(const uint32_t (&f)[4]) {
    type v;
    v.w[0] = f[0];
    v.w[1] = f[1];
    return v;
  }
};
template <>
struct VecOf<4> {
  using type = uint32_t;
  static RA_DEVICE type fill(const uint32_t (&f)[4]) { return f[0]; }
};
template <>
struct VecOf<2> {
  using type = uint16_t;
  static RA_DEVICE type fill(const uint32_t (&f)[4]) { return static_cast<uint16_t>(f[0]); }
};

// Byte offset of vector v of a row: heads segments of vph vectors each.
template <int V>
RA_DEVICE int64_t vec_offset(int v, int vph, int heads, int64_t head_stride) {
  if (heads == 1) return static_cast<int64_t>(v) * V;
  const int hh = v / vph;
  return hh * head_stride + static_cast<int64_t>(v - hh * vph) * V;
}

template <int V>
__global__ void __launch_bounds__(kCopyThreads) copy_rows_kernel(const ThdCopyParams p,
                                                                 const int lpr_shift) {
  ra_wait_for_prior_kernel();  // launched by ra_launch: nothing is read before this
  ra_let_next_kernel_start();
  using Vec = typename VecOf<V>::type;
  const int lanes = 1 << lpr_shift;
  const int lane = threadIdx.x & (lanes - 1);
  const int vph = p.head_bytes / V;
  const int nvec = p.heads * vph;  // >= lanes (launcher)
  const char* __restrict__ src = static_cast<const char*>(p.src);
  char* __restrict__ dst = static_cast<char*>(p.dst);
  const int64_t slots = (static_cast<int64_t>(gridDim.x) * kCopyThreads) >> lpr_shift;
  const int64_t outer_step = static_cast<int64_t>(gridDim.y) * kCopyOuterPerBlock;
  constexpr int kW = RA_WAVE_SIZE;
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * kCopyThreads + threadIdx.x;
  // rows of this lane and of the wave's first lane: the loop runs while the wave has a row, so
  // every lane reaches the wave search (seq_of_wave) together
  const int64_t lane_row = tid >> lpr_shift;
  const int64_t wave_row = (tid & ~static_cast<int64_t>(kW - 1)) >> lpr_shift;

  for (int64_t step = 0; wave_row + step < p.rows; step += slots) {
    const int64_t row = lane_row + step;
    const bool active = row < p.rows;
    const SeqQuery query = map_query(p.map, active ? row : wave_row + step);
    const int64_t end = query.cu != nullptr ? p.map.cu[p.map.b] : 0;  // with the search's loads
    const int32_t seq =
        query.cu != nullptr ? seq_of_wave<kW>(query.cu, p.map.b, query.div, query.pos) : 0;
    if (!active) continue;
    const int64_t src_row = map_row_given(p.map, row, seq, end);
    if (src_row < 0 && !p.fill) continue;
    const Vec fill = VecOf<V>::fill(p.fill_bytes);
    for (int64_t o_begin = static_cast<int64_t>(blockIdx.y) * kCopyOuterPerBlock; o_begin < p.outer;
         o_begin += outer_step) {
      const int64_t o_end = o_begin + kCopyOuterPerBlock < p.outer ? o_begin + kCopyOuterPerBlock
                                                                   : p.outer;
      // This lane's items are the flat indices lane, lane + lanes, ... of [o_begin, o_end) x nvec.
      int64_t o = o_begin;
      int v = lane;
      while (o < o_end) {
        Vec buf[kCopyUnroll];
        char* dptr[kCopyUnroll];
#pragma unroll
        for (int u = 0; u < kCopyUnroll; ++u) {
          dptr[u] = nullptr;
          if (o < o_end) {
            dptr[u] = dst + o * p.dst_outer_stride + row * p.dst_row_stride +
                      vec_offset<V>(v, vph, p.heads, p.dst_head_stride);
            if (src_row >= 0) {
              const int64_t off = o * p.src_outer_stride + src_row * p.src_row_stride +
                                  vec_offset<V>(v, vph, p.heads, p.src_head_stride);
              buf[u] = *reinterpret_cast<const Vec*>(src + off);
            } else {
              buf[u] = fill;
            }
            v += lanes;
            if (v >= nvec) {  // lanes <= nvec: at most one wrap per step
              v -= nvec;
              ++o;
            }
          }
        }
#pragma unroll
        for (int u = 0; u < kCopyUnroll; ++u)
          if (dptr[u] != nullptr) *reinterpret_cast<Vec*>(dptr[u]) = buf[u];
      }
    }
  }
}

}  // namespace thd
