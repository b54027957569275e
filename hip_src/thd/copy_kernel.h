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
constexpr int kCopyResidentBlocks = 4;  // per SM (64 registers, 256 threads)
constexpr int kCopyOuterPerBlock = 8;  // outer slices per block: one search serves 8 LSE heads
constexpr int kCopyUnroll = 4;         // vectors in flight per lane
// Lanes per row ~ vectors per row / kCopyVecsPerLane (launcher).
// NOTE: 8 beat 4 on the reorders and tied elsewhere; 16, 2 and 1 lost
// (docs/kernels.md#thd-copy-kernels).
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

// One lane's share of a row: items lane, lane + lanes, ... of [o, o_end) x nvec (outer slice o,
// vector v), kCopyUnroll at a time: loaded (or filled) into buf, then stored.
struct CopyCursor {
  int64_t o;
  int v;
};

template <int V>
struct CopyBatch {
  typename VecOf<V>::type buf[kCopyUnroll];
  CopyCursor first;  // where the batch starts
  int count;         // items in it (< kCopyUnroll: the lane's last batch of the slice range)

  // Loads the batch starting at c (src_row < 0: the fill value) and returns the cursor after it.
  RA_DEVICE CopyCursor load(const ThdCopyParams& p, int64_t src_row, CopyCursor c, int64_t o_end,
                            int lanes, int nvec, int vph) {
    const char* __restrict__ src = static_cast<const char*>(p.src);
    first = c;
    count = 0;
#pragma unroll
    for (int u = 0; u < kCopyUnroll; ++u) {
      if (c.o < o_end) {
        if (src_row >= 0) {
          const int64_t off = c.o * p.src_outer_stride + src_row * p.src_row_stride +
                              vec_offset<V>(c.v, vph, p.heads, p.src_head_stride);
          buf[u] = *reinterpret_cast<const typename VecOf<V>::type*>(src + off);
        } else {
          buf[u] = VecOf<V>::fill(p.fill_bytes);
        }
        ++count;
        c = advance(c, lanes, nvec);
      }
    }
    return c;
  }

  RA_DEVICE void store(const ThdCopyParams& p, int64_t row, int lanes, int nvec, int vph) const {
    char* __restrict__ dst = static_cast<char*>(p.dst);
    CopyCursor c = first;
#pragma unroll
    for (int u = 0; u < kCopyUnroll; ++u) {
      if (u < count) {
        const int64_t off = c.o * p.dst_outer_stride + row * p.dst_row_stride +
                            vec_offset<V>(c.v, vph, p.heads, p.dst_head_stride);
        *reinterpret_cast<typename VecOf<V>::type*>(dst + off) = buf[u];
        c = advance(c, lanes, nvec);
      }
    }
  }

  static RA_DEVICE CopyCursor advance(CopyCursor c, int lanes, int nvec) {
    c.v += lanes;
    if (c.v >= nvec) {  // lanes <= nvec: at most one wrap per step
      c.v -= nvec;
      ++c.o;
    }
    return c;
  }
};

// Source row of `row` (-1: none), all lanes of the wave converged (seq_of_wave); lanes without
// a row (active false) search for wave_row and ignore the result.
RA_DEVICE int64_t source_row(const ThdRowMapParams& m, int64_t row, bool active,
                             int64_t wave_row) {
  constexpr int kW = RA_WAVE_SIZE;
  const SeqQuery query = map_query(m, active ? row : wave_row);
  const int64_t end = query.cu != nullptr ? m.cu[m.b] : 0;  // with the search's loads
  const int32_t seq =
      query.cu != nullptr ? seq_of_wave<kW>(query.cu, m.b, query.div, query.pos) : 0;
  return map_row_given(m, active ? row : wave_row, seq, end);
}

// Copies the lane's items of `row` from src_row; `batch` already holds the first batch of the
// block's first slice range when `loaded` (then `next` is the cursor after it).
template <int V>
RA_DEVICE void copy_row(const ThdCopyParams& p, int64_t row, int64_t src_row, CopyBatch<V>& batch,
                        bool loaded, CopyCursor next, int lanes, int lane, int nvec, int vph) {
  const int64_t o_first = static_cast<int64_t>(blockIdx.y) * kCopyOuterPerBlock;
  const int64_t outer_step = static_cast<int64_t>(gridDim.y) * kCopyOuterPerBlock;
  for (int64_t o_begin = o_first; o_begin < p.outer; o_begin += outer_step) {
    const int64_t o_end =
        o_begin + kCopyOuterPerBlock < p.outer ? o_begin + kCopyOuterPerBlock : p.outer;
    CopyCursor c{o_begin, lane};
    if (o_begin == o_first && loaded) {
      batch.store(p, row, lanes, nvec, vph);
      c = next;
    }
    while (c.o < o_end) {
      c = batch.load(p, src_row, c, o_end, lanes, nvec, vph);
      batch.store(p, row, lanes, nvec, vph);
    }
  }
}

// Rows are mapped from a cu_seqlens snapshot before the wait where they can be (index.h,
// maps_from_snapshot: partition, the reorders, read_half, and copy_valid_tokens' three arrays
// in the 16-byte kernel); the block checks the snapshot after issuing its first loads.
// first_wave_blocks: the blocks of the first resident wave (the launcher; 0 where launches do
// not overlap). Only they map copy_valid_tokens' rows from a snapshot: its three arrays cost
// every block more reads and checks, which cost more than they saved beyond the first wave. The
// one-array maps snapshot in every block: a block of a later wave still starts while a long
// kernel ahead drains (docs/kernels.md#rows-mapped-before-the-wait).
template <int V>
__global__ void __launch_bounds__(kCopyThreads) copy_rows_kernel(const ThdCopyParams p,
                                                                 const int lpr_shift,
                                                                 const int first_wave_blocks) {
  __shared__ int32_t snapshot[3 * kSnapshotWords];  // cu (and cu_dst, cu_src: kCopyValid)
  const int lanes = 1 << lpr_shift;
  const int lane = threadIdx.x & (lanes - 1);
  const int vph = p.head_bytes / V;
  const int nvec = p.heads * vph;  // >= lanes (launcher)
  const int64_t slots = (static_cast<int64_t>(gridDim.x) * kCopyThreads) >> lpr_shift;
  constexpr int kW = RA_WAVE_SIZE;
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * kCopyThreads + threadIdx.x;
  // rows of this lane and of the wave's first lane: the loop runs while the wave has a row, so
  // every lane reaches the wave search (seq_of_wave) together
  const int64_t lane_row = tid >> lpr_shift;
  const int64_t wave_row = (tid & ~static_cast<int64_t>(kW - 1)) >> lpr_shift;
  int64_t step = 0;
  // copy_valid_tokens' three arrays only in the 16-byte kernel: the others' registers are
  // tighter (nvcc spilled the 8-byte one)
  constexpr int kArrays = V == 16 ? 3 : 1;
  const bool first_wave =
      static_cast<int64_t>(blockIdx.y) * gridDim.x + blockIdx.x < first_wave_blocks;
  const bool guess = (first_wave || cu_arrays_read(p.map) == 1) &&
                     maps_from_snapshot<kArrays>(p.map);
  if (guess) {  // uniform: every thread reaches the barriers
    const ThdRowMapParams guess_map = take_cu_snapshot<kArrays>(p.map, snapshot, kCopyThreads);
    const bool wave_has_row = wave_row < p.rows;
    const bool active = lane_row < p.rows;
    int64_t src_row = wave_has_row ? source_row(guess_map, lane_row, active, wave_row) : -1;
    ra_wait_for_prior_kernel();
    ra_let_next_kernel_start();
    CopyBatch<V> batch;
    const int64_t o_first = static_cast<int64_t>(blockIdx.y) * kCopyOuterPerBlock;
    const int64_t o_first_end =
        o_first + kCopyOuterPerBlock < p.outer ? o_first + kCopyOuterPerBlock : p.outer;
    CopyCursor next{o_first, lane};
    bool loaded = false;
    if (active && (src_row >= 0 || p.fill)) {
      next = batch.load(p, src_row, next, o_first_end, lanes, nvec, vph);
      loaded = true;
    }
    const bool current =
        snapshot_share_current<kArrays>(p.map, snapshot, threadIdx.x, kCopyThreads);
    if (!__syncthreads_and(current)) {
      if (wave_has_row) src_row = source_row(p.map, lane_row, active, wave_row);
      loaded = false;
      next = CopyCursor{o_first, lane};
    }
    if (active && (src_row >= 0 || p.fill))
      copy_row<V>(p, lane_row, src_row, batch, loaded, next, lanes, lane, nvec, vph);
    step = slots;
  } else {
    ra_wait_for_prior_kernel();  // launched by ra_launch: nothing is read before this
    ra_let_next_kernel_start();
  }
  for (; wave_row + step < p.rows; step += slots) {
    const int64_t row = lane_row + step;
    const bool active = row < p.rows;
    const int64_t src_row = source_row(p.map, row, active, wave_row + step);
    if (!active || (src_row < 0 && !p.fill)) continue;
    CopyBatch<V> batch;
    copy_row<V>(p, row, src_row, batch, false, CopyCursor{0, 0}, lanes, lane, nvec, vph);
  }
}

}  // namespace thd
