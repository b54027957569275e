// Row index math of the THD kernels: a token's sequence by a search over cu_seqlens in global
// memory (small and cache-resident, no shared-memory copy, so no cap on the number of
// sequences; a wave searches for all its lanes at once where it can), then the dual-chunk
// arithmetic. Each function mirrors one torch helper of rocm_attn/thd/_index.py term by term
// (int64, floor division, the same clamps), so that the kernels give bitwise the rows the torch
// path gives for valid cu_seqlens, slack rows included, and index nothing out of bounds whatever
// cu_seqlens hold (the rule below).
#pragma once

#include "../common/compat.h"
#include "params.h"

namespace thd {

RA_HOST_DEVICE int64_t floordiv(int64_t a, int64_t b) {
  const int64_t q = a / b;
  return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q;
}

// floordiv for b > 0, a shift for a power-of-two b (cp, 2 cp, 2: an arithmetic shift is floor
// division for negative a too). Same value as floordiv; a 64-bit division is a ~70-instruction
// subroutine on NVIDIA, and the row maps run once per wave in the wide-row kernels.
RA_HOST_DEVICE int64_t floordiv_pos(int64_t a, int64_t b) {
  if ((b & (b - 1)) == 0) {
#if defined(__CUDA_ARCH__) || defined(__HIP_DEVICE_COMPILE__)
    return a >> __popcll(static_cast<unsigned long long>(b - 1));
#else
    return a >> __builtin_popcountll(static_cast<unsigned long long>(b - 1));
#endif
  }
  return floordiv(a, b);
}

// floordiv_pos plus a 32-bit division where both operands fit: for the divisors that are
// rarely powers of two (a sequence's chunk length, the rows of a shard).
RA_HOST_DEVICE int64_t floordiv_pos32(int64_t a, int64_t b) {
  if ((b & (b - 1)) != 0 && a >= 0 && a <= INT32_MAX && b <= INT32_MAX)
    return static_cast<uint32_t>(a) / static_cast<uint32_t>(b);
  return floordiv_pos(a, b);
}

RA_HOST_DEVICE int64_t clamp_row(int64_t v, int64_t rows) {
  const int64_t hi = rows > 0 ? rows - 1 : 0;
  return v < 0 ? 0 : (v > hi ? hi : v);
}

RA_HOST_DEVICE int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }

// ---------------------------------------------------------------------------------------------
// What any cu_seqlens values give. The kernels read cu_seqlens from device memory without
// validation (validate=True checks them on the host side, with a sync), so no value may take
// an access outside a tensor, and no value may make a difference or a product overflow. The
// rule, applied here and nowhere else:
//  * every word of an array indexing T rows is read as c[i] = clamp(cu[i], 0, T) (T: the rows
//    it indexes): negative -> 0, past the end -> T, so no difference of two words can wrap
//    (copy_valid_tokens' valid counts index nothing: only their differences are used, in
//    int64, and a row's source must lie inside its clamped dst slot too);
//  * sequence s spans [c[s], max(c[s], c[s + 1])): a decreasing pair is an empty sequence;
//  * a row finds its sequence by a search over c (a word's clamp never changes a comparison
//    the searches make; seq_of); rows at or past c[b] are slack. Where c is not
//    non-decreasing, a row lands in some sequence of [0, b] (the binary and the wave searches
//    may pick different ones) and its offset may lie outside that sequence;
//  * every row a map returns is then clamped into the tensor it addresses (clamp_row). The
//    bounded words keep every intermediate within a few T, so no int64 product overflows.
// Valid cu_seqlens (non-decreasing, within [0, T]) are left as they are: the rows are the
// torch path's. Garbage gives rows of junk but never an out-of-bounds access, a hang (every
// loop is bounded by b or by host sizes) or a wrapped length. copy_valid_tokens writes its
// fill value (or leaves dst) where a row has no valid source; row indices of merge_rows_ /
// add_rows_ are clamped into their tensors alone.
// ---------------------------------------------------------------------------------------------

// The bound of the clamp of offsets into `total` rows: offsets are int32, so the clamp runs in
// 32 bits (two min / max per word) and a tensor of 2^31 rows or more bounds nothing more.
RA_HOST_DEVICE int32_t cu_bound(int64_t total) {
  return total < INT32_MAX ? static_cast<int32_t>(total > 0 ? total : 0) : INT32_MAX;
}

RA_HOST_DEVICE int32_t clamp_cu(int32_t v, int32_t lo, int32_t hi) {
  return v < lo ? lo : (v > hi ? hi : v);
}

// Sequence s (<= b) of cu by the rule above, bound = cu_bound(total): its start c[s]
// (seq_start) and length max(c[s + 1] - c[s], 0) (seq_len), both in [0, bound]: no wrap,
// never negative; s == b (slack, past the last sequence): empty at c[b].
RA_HOST_DEVICE int32_t seq_start(const int32_t* cu, int32_t s, int32_t bound) {
  return clamp_cu(cu[s], 0, bound);
}

RA_HOST_DEVICE int32_t seq_len(const int32_t* cu, int32_t b, int32_t s, int32_t start,
                               int32_t bound) {
  return s < b ? max(min(cu[s + 1], bound) - start, 0) : 0;
}

// _seq_of(floor(cu / div), pos): the number of i in [1, b] with floor(cu[i] / div) <= pos, i.e.
// the sequence of position pos (b for pos >= the end). div > 0.
// NOTE: floor(c / div) <= pos <=> c < (pos + 1) * div, so the loop has no division. Callers'
// limits (pos + 1) * div lie in (0, total] (or pos is a slack row, past the clamped end), so a
// word compares as its clamp into [0, total] would: the search needs no clamp of its own. For
// any cu it returns s in [0, b] with cu[s] < limit (or s = 0) and cu[s + 1] >= limit (or s = b).
RA_HOST_DEVICE int32_t seq_of(const int32_t* cu, int32_t b, int64_t div, int64_t pos) {
  const int64_t lim = (pos + 1) * div;
  int32_t lo = 0, hi = b;
  while (lo < hi) {
    const int32_t mid = (lo + hi) >> 1;
    if (static_cast<int64_t>(cu[mid + 1]) < lim) {
      lo = mid + 1;
    } else {
      hi = mid;
    }
  }
  return lo;
}

// Every row map below first finds the sequence of a position (seq_of: one binary search), then
// does arithmetic. The search is split out (map_query) so that a wave can run the searches of
// all its lanes at once (seq_of_wave); map_row_given finishes with its result. `end` is
// cu[b], which callers load before the search so that it travels in the same memory round trip
// (the finishing step then waits only for cu[s], cu[s + 1]).
struct SeqQuery {
  const int32_t* cu;  // nullptr: the map needs no search
  int64_t div;
  int64_t pos;
};

// _local_to_global: global row of local row l of `rank` (cu: global padded cu_seqlens);
// s = seq_of(cu, b, cp, l).
// end: cu[b] as loaded (clamped here, as are cu[s], cu[s + 1]: the global rows cp * local_rows).
RA_HOST_DEVICE int64_t local_to_global(const ThdRowMapParams& m, int64_t rank, int64_t l,
                                       int32_t s, int64_t end) {
  const int64_t cp = m.cp;
  const int64_t total = cp * m.local_rows;
  const int32_t bound = cu_bound(total);
  end = clamp_cu(static_cast<int32_t>(end), 0, bound);
  const int64_t loc_end = floordiv_pos(end, cp);
  int64_t g;
  if (l >= loc_end) {  // slack: rank r owns [end + r*slack_loc, end + (r+1)*slack_loc)
    g = end + rank * (m.local_rows - loc_end) + (l - loc_end);
  } else {
    const int32_t start = seq_start(m.cu, s, bound);
    const int32_t slen = seq_len(m.cu, m.b, s, start, bound);
    const int64_t lstart = floordiv_pos(start, cp);
    const int64_t len = floordiv_pos(start + slen, cp) - lstart;
    const int64_t half = floordiv_pos(len, 2);
    const int64_t lo = l - lstart;
    g = start + (lo < half ? rank * half + lo : (2 * cp - 1 - rank) * half + lo - half);
  }
  return clamp_row(g, total);
}

// _global_to_gathered: row of the all-gathered shards holding global row r;
// s = seq_of(cu, b, 1, r). end: cu[b] as loaded. The offset into the sequence is clamped into
// it (a no-op for valid cu_seqlens), which keeps the chunk number k, and so rk * local_rows,
// within a few cp for any cu.
RA_HOST_DEVICE int64_t global_to_gathered(const ThdRowMapParams& m, int64_t r, int32_t s,
                                          int64_t end) {
  const int64_t cp = m.cp;
  const int32_t bound = cu_bound(cp * m.local_rows);
  end = clamp_cu(static_cast<int32_t>(end), 0, bound);
  int64_t src;
  if (r >= end) {
    const int64_t loc_end = floordiv_pos(end, cp);
    const int64_t slack = max64(m.local_rows - loc_end, 1);
    const int64_t e = r - end;
    const int64_t er = floordiv_pos(e, slack);
    src = er * m.local_rows + loc_end + (e - er * slack);
  } else {
    const int32_t start = seq_start(m.cu, s, bound);
    const int32_t len = seq_len(m.cu, m.b, s, start, bound);
    const int64_t h = max64(floordiv_pos(len, 2 * cp), 1);
    const int64_t o = clamp_row(r - start, len);
    const int64_t k = floordiv_pos32(o, h);
    const bool first = k < cp;
    const int64_t rk = first ? k : 2 * cp - 1 - k;
    const int64_t lo = first ? o - k * h : h + o - k * h;
    src = rk * m.local_rows + floordiv_pos(start, cp) + lo;
  }
  return clamp_row(src, cp * m.local_rows);
}

// _half_index: local rows of row k of the first and of the second half (cu: local padded
// cu_seqlens, even lengths: m.cu or a snapshot of it); s = seq_of(cu, b, 2, k) serves both.
// end: cu[b] as loaded (clamped here, as are cu[s], cu[s + 1]: the local rows).
RA_HOST_DEVICE void half_rows(const ThdRowMapParams& m, const int32_t* cu, int64_t k, int32_t s,
                              int64_t end, int64_t& first, int64_t& second) {
  const int32_t bound = cu_bound(m.local_rows);
  end = clamp_cu(static_cast<int32_t>(end), 0, bound);
  const int64_t hb_end = floordiv_pos(end, 2);
  int64_t base, half_len;
  if (k >= hb_end) {
    base = end + (k - hb_end);
    half_len = floordiv_pos(m.local_rows - end, 2);
  } else {
    // seq_start and seq_len written out: through the helpers (same arithmetic) nvcc spilled
    // 12 bytes in the 16-bit merge kernels (sm_90)
    const int32_t start = clamp_cu(cu[s], 0, bound);
    const int32_t len = s < m.b ? max(min(cu[s + 1], bound) - start, 0) : 0;
    base = start + (k - (start >> 1));
    half_len = len >> 1;
  }
  first = clamp_row(base, m.local_rows);
  second = clamp_row(base + half_len, m.local_rows);
}

// _copy_rows: source row of dst row d, or -1 when d holds no valid token (padding, slack);
// s = seq_of(cu_dst, b, 1, d). cu_dst is clamped into dst's rows (local_rows), cu_src into
// src's; the valid count cu[s + 1] - cu[s] (int64) into [0, the slot]: a row of a garbage
// sequence has a source only inside both its dst slot and src.
RA_HOST_DEVICE int64_t valid_src_row(const ThdRowMapParams& m, int64_t d, int32_t s) {
  const int32_t bound = cu_bound(m.local_rows);
  const int32_t start = seq_start(m.cu_dst, s, bound);
  const int32_t slot = seq_len(m.cu_dst, m.b, s, start, bound);
  const int64_t off = d - start;
  const int64_t n = s < m.b ? static_cast<int64_t>(m.cu[s + 1]) - m.cu[s] : 0;
  if (off < 0 || off >= (n < slot ? n : slot) || m.src_rows <= 0) return -1;
  return clamp_row(clamp_cu(m.cu_src[s], 0, cu_bound(m.src_rows)) + off, m.src_rows);
}

// The search map_row_given(m, row, .) needs.
RA_HOST_DEVICE SeqQuery map_query(const ThdRowMapParams& m, int64_t row) {
  switch (m.kind) {
    case ThdRowMap::kPartition:
      return {m.cu, m.cp, row};
    case ThdRowMap::kToContiguous:
      return {m.cu, 1, row};
    case ThdRowMap::kToRankSharded:
      return {m.cu, m.cp, row - floordiv_pos32(row, max64(m.local_rows, 1)) * m.local_rows};
    case ThdRowMap::kHalf:
      return {m.cu, 2, row};
    case ThdRowMap::kCopyValid:
      return {m.cu_dst, 1, row};
    default:
      return {nullptr, 1, 0};
  }
}

// Source row of destination row `row` (-1: none), given s = the result of map_query's search
// and end = cu[b] (any value where map_query asks for no search).
RA_HOST_DEVICE int64_t map_row_given(const ThdRowMapParams& m, int64_t row, int32_t s,
                                     int64_t end) {
  switch (m.kind) {
    case ThdRowMap::kPartition:
      return local_to_global(m, m.rank, row, s, end);
    case ThdRowMap::kToContiguous:
      return global_to_gathered(m, row, s, end);
    case ThdRowMap::kToRankSharded: {
      const int64_t rank = floordiv_pos32(row, max64(m.local_rows, 1));
      return local_to_global(m, rank, row - rank * m.local_rows, s, end);
    }
    case ThdRowMap::kHalf: {
      int64_t first, second;
      half_rows(m, m.cu, row, s, end, first, second);
      return m.half ? second : first;
    }
    case ThdRowMap::kCopyValid:
      return valid_src_row(m, row, s);
    default:
      return row;
  }
}

// The wave searches' loads: val[c] = cu[1 + c * W + lane] (0 past b), every chunk at once.
template <int W, int CHUNKS>
RA_DEVICE void load_cu_chunks(const int32_t* cu, int32_t b, int (&val)[CHUNKS]) {
  const int lane = threadIdx.x & (W - 1);
#pragma unroll
  for (int c = 0; c < CHUNKS; ++c) {
    const int i = 1 + c * W + lane;
    val[c] = i <= b ? cu[i] : 0;
  }
}

// seq_of for every lane of a wave at once, each lane with its own query on the same cu (all
// lanes call it, converged): the cu_seqlens words are read in coalesced chunks of one per lane,
// all chunks at once, and each lane counts the entries below its limit by binary lifting over
// the chunks held in registers (shuffles): one memory round trip instead of log2(b) dependent
// ones. Same counts as seq_of for monotonic cu; more than kWaveSearchChunks x wave sequences:
// the per-lane search.
constexpr int kWaveSearchChunks = 2;

template <int W>
RA_DEVICE int32_t seq_of_wave(const int32_t* cu, int32_t b, int64_t div, int64_t pos) {
  if (b > kWaveSearchChunks * W) return seq_of(cu, b, div, pos);  // uniform
  int val[kWaveSearchChunks];
  load_cu_chunks<W>(cu, b, val);
  const int64_t lim = (pos + 1) * div;  // count i in [1, b] with cu[i] < lim
  int s = 0;
#pragma unroll
  for (int c = 0; c < kWaveSearchChunks; ++c) {
    if (c * W >= b) break;  // uniform
    int cnt = 0;            // entries of chunk c below lim
#pragma unroll
    for (int st = W / 2; st >= 1; st >>= 1) {
      const int v = ra_shfl(val[c], cnt + st - 1);
      if (c * W + cnt + st <= b && v < lim) cnt += st;
    }
    const int v = ra_shfl(val[c], cnt);
    if (c * W + cnt + 1 <= b && v < lim) cnt += 1;
    s += cnt;
  }
  return s;
}

// seq_of for one query that every lane of the wave shares (all lanes call it, converged):
// cu[1..b] read in coalesced chunks of one word per lane, all chunks at once, and counted with
// one ballot per chunk: one memory round trip, no shuffles. Same counts as seq_of for monotonic
// cu, and within [0, b] for any cu. More than kUniformSearchChunks x wave sequences: the binary
// search (seq_of).
constexpr int kUniformSearchChunks = 4;

template <int W>
RA_DEVICE int32_t seq_of_uniform(const int32_t* cu, int32_t b, int64_t div, int64_t pos) {
  if (b > kUniformSearchChunks * W) return seq_of(cu, b, div, pos);  // uniform
  const int lane = threadIdx.x & (W - 1);
  int val[kUniformSearchChunks];
  load_cu_chunks<W>(cu, b, val);
  const int64_t lim = (pos + 1) * div;
  int32_t s = 0;
#pragma unroll
  for (int c = 0; c < kUniformSearchChunks; ++c) {
    if (c * W >= b) break;  // uniform
    s += ra_count_lanes(1 + c * W + lane <= b && val[c] < lim);
  }
  return s;
}

// ---------------------------------------------------------------------------------------------
// Mapping rows before the wait. Where a kernel can start while the kernel ahead drains
// (RA_OVERLAPPED_LAUNCH), mapping its rows only after ra_wait_for_prior_kernel() put the
// search on the critical path, a sizeable share of these short launches
// (docs/kernels.md#rows-mapped-before-the-wait). So a block snapshots cu_seqlens into shared memory before the wait and maps its
// first rows from the snapshot; after the wait it issues its first loads from those rows at
// once, checks the snapshot against cu_seqlens (the kernel ahead may have written them) and,
// only where they differ, maps again and reloads, before anything is stored. A guessed row is
// always clamped into its tensor, so a stale snapshot costs a reload, never a wrong access.
// ---------------------------------------------------------------------------------------------
constexpr int kSnapshotWords = kWaveSearchChunks * RA_WAVE_SIZE + 1;  // the wave search's range

// The cu_seqlens arrays a map reads: cu alone, or cu, cu_dst, cu_src (kCopyValid).
RA_HOST_DEVICE int cu_arrays_read(const ThdRowMapParams& m) {
  return m.kind == ThdRowMap::kCopyValid ? 3 : 1;
}

RA_DEVICE const int32_t* cu_array(const ThdRowMapParams& m, int a) {
  return a == 0 ? m.cu : (a == 1 ? m.cu_dst : m.cu_src);
}

// Whether m's rows can be mapped from a snapshot of at most ARRAYS arrays: the maps that read
// cu_seqlens arrays alone, with b + 1 words each that fit, and only where the kernel can start
// early at all.
template <int ARRAYS>
RA_DEVICE bool maps_from_snapshot(const ThdRowMapParams& m) {
  const bool cu_only = m.kind == ThdRowMap::kPartition || m.kind == ThdRowMap::kToContiguous ||
                       m.kind == ThdRowMap::kToRankSharded || m.kind == ThdRowMap::kHalf ||
                       (ARRAYS >= 3 && m.kind == ThdRowMap::kCopyValid);
  return RA_OVERLAPPED_LAUNCH && cu_only && m.b >= 0 && m.b < kSnapshotWords;
}

// Block-wide, before the wait (every thread calls it): words 0..b of each array m reads into
// `snapshot` (kSnapshotWords per array), read through L2 (ra_load_from_l2: once per block; the
// same line read past L1 by every wave of a grid queues on one L2 slice, measured 2x slower),
// then a barrier. Returns m reading the snapshot. ARRAYS: as in maps_from_snapshot.
template <int ARRAYS>
RA_DEVICE ThdRowMapParams take_cu_snapshot(const ThdRowMapParams& m, int32_t* snapshot,
                                           int threads) {
  const int arrays = ARRAYS == 1 ? 1 : cu_arrays_read(m);
  for (int a = 0; a < arrays; ++a) {
    const int32_t* cu = cu_array(m, a);
    for (int i = threadIdx.x; i <= m.b; i += threads)
      snapshot[a * kSnapshotWords + i] = ra_load_from_l2(cu + i);
  }
  __syncthreads();
  ThdRowMapParams from_snapshot = m;
  from_snapshot.cu = snapshot;
  if (arrays == 3) {
    from_snapshot.cu_dst = snapshot + kSnapshotWords;
    from_snapshot.cu_src = snapshot + 2 * kSnapshotWords;
  }
  return from_snapshot;
}

// After the wait: whether the words first, first + stride, ... of the arrays m reads (at most
// ARRAYS, as in maps_from_snapshot) still hold their snapshot (the caller combines its threads'
// answers: a block or a wave).
template <int ARRAYS>
RA_DEVICE bool snapshot_share_current(const ThdRowMapParams& m, const int32_t* snapshot, int first,
                                      int stride) {
  bool same = true;
  const int arrays = ARRAYS == 1 ? 1 : cu_arrays_read(m);
  for (int a = 0; a < arrays; ++a) {
    const int32_t* cu = cu_array(m, a);
    for (int i = first; i <= m.b; i += stride)
      same = same && cu[i] == snapshot[a * kSnapshotWords + i];
  }
  return same;
}

// The same for a whole wave: every lane calls it (converged) and gets the same answer.
template <int ARRAYS, int W>
RA_DEVICE bool wave_snapshot_current(const ThdRowMapParams& m, const int32_t* snapshot) {
  return __all(snapshot_share_current<ARRAYS>(m, snapshot, threadIdx.x & (W - 1), W));
}

// Lanes per row: a power of two <= 256 and <= nvec, about nvec / per_lane, returned as a shift.
inline int lanes_shift(int64_t nvec, int per_lane, int max_lanes) {
  const int64_t want = (nvec + per_lane - 1) / per_lane;
  int shift = 0;
  while ((int64_t{1} << shift) < want && (1 << (shift + 1)) <= max_lanes) ++shift;
  while (shift > 0 && (int64_t{1} << shift) > nvec) --shift;
  return shift;
}

}  // namespace thd
