// Row index math of the THD kernels: a token's sequence by binary search over cu_seqlens in
// global memory (small and cache-resident, no shared-memory copy, so no cap on the number of
// sequences), then the dual-chunk arithmetic. Each function mirrors one torch helper of
// rocm_attn/thd.py term by term (int64, floor division, the same clamps), so that the kernels
// give bitwise the rows the torch path gives, slack rows included, and never index out of
// bounds whatever cu_seqlens holds.
#pragma once

#include "../common/compat.h"
#include "params.h"

namespace thd {

RA_HOST_DEVICE int64_t floordiv(int64_t a, int64_t b) {
  const int64_t q = a / b;
  return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q;
}

RA_HOST_DEVICE int64_t clamp_row(int64_t v, int64_t rows) {
  const int64_t hi = rows > 0 ? rows - 1 : 0;
  return v < 0 ? 0 : (v > hi ? hi : v);
}

RA_HOST_DEVICE int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }

// _seq_of(floor(cu / div), pos): the number of i in [1, b] with floor(cu[i] / div) <= pos, i.e.
// the sequence of position pos (b for pos >= the end). div > 0.
// NOTE: floor(c / div) <= pos <=> c < (pos + 1) * div, so the loop has no division.
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

// _local_to_global: global row of local row l of `rank` (cu: global padded cu_seqlens).
RA_HOST_DEVICE int64_t local_to_global(const ThdRowMapParams& m, int64_t rank, int64_t l) {
  const int64_t cp = m.cp;
  const int64_t loc_end = floordiv(m.cu[m.b], cp);
  int64_t g;
  if (l >= loc_end) {  // slack: rank r owns [end + r*slack_loc, end + (r+1)*slack_loc)
    g = m.cu[m.b] + rank * (m.local_rows - loc_end) + (l - loc_end);
  } else {
    const int32_t s = seq_of(m.cu, m.b, cp, l);
    const int64_t lstart = floordiv(m.cu[s], cp);
    const int64_t len = s < m.b ? floordiv(m.cu[s + 1], cp) - lstart : 0;
    const int64_t half = floordiv(len, 2);
    const int64_t lo = l - lstart;
    g = m.cu[s] + (lo < half ? rank * half + lo : (2 * cp - 1 - rank) * half + lo - half);
  }
  return clamp_row(g, cp * m.local_rows);
}

// _global_to_gathered: row of the all-gathered shards holding global row r.
RA_HOST_DEVICE int64_t global_to_gathered(const ThdRowMapParams& m, int64_t r) {
  const int64_t cp = m.cp;
  const int64_t end = m.cu[m.b];
  int64_t src;
  if (r >= end) {
    const int64_t loc_end = floordiv(end, cp);
    const int64_t slack = max64(m.local_rows - loc_end, 1);
    const int64_t e = r - end;
    const int64_t er = floordiv(e, slack);
    src = er * m.local_rows + loc_end + (e - er * slack);
  } else {
    const int32_t s = seq_of(m.cu, m.b, 1, r);
    const int64_t start = m.cu[s];
    const int64_t len = s < m.b ? m.cu[s + 1] - start : 0;
    const int64_t h = max64(floordiv(len, 2 * cp), 1);
    const int64_t o = r - start;
    const int64_t k = floordiv(o, h);
    const bool first = k < cp;
    const int64_t rk = first ? k : 2 * cp - 1 - k;
    const int64_t lo = first ? o - k * h : h + o - k * h;
    src = rk * m.local_rows + floordiv(start, cp) + lo;
  }
  return clamp_row(src, cp * m.local_rows);
}

// _half_index: local rows of row k of the first and of the second half (cu: local padded
// cu_seqlens, even lengths); one search serves both.
RA_HOST_DEVICE void half_rows(const ThdRowMapParams& m, int64_t k, int64_t& first,
                              int64_t& second) {
  const int64_t end = m.cu[m.b];
  const int64_t hb_end = floordiv(end, 2);
  int64_t base, half_len;
  if (k >= hb_end) {
    base = end + (k - hb_end);
    half_len = floordiv(m.local_rows - end, 2);
  } else {
    const int32_t s = seq_of(m.cu, m.b, 2, k);
    const int64_t start = m.cu[s];
    const int64_t len = s < m.b ? m.cu[s + 1] - start : 0;
    base = start + (k - floordiv(start, 2));
    half_len = floordiv(len, 2);
  }
  first = clamp_row(base, m.local_rows);
  second = clamp_row(base + half_len, m.local_rows);
}

RA_HOST_DEVICE int64_t half_row(const ThdRowMapParams& m, int64_t k, int half) {
  int64_t first, second;
  half_rows(m, k, first, second);
  return half ? second : first;
}

// _copy_rows: source row of dst row d, or -1 when d holds no valid token (padding, slack).
RA_HOST_DEVICE int64_t valid_src_row(const ThdRowMapParams& m, int64_t d) {
  const int32_t s = seq_of(m.cu_dst, m.b, 1, d);
  const int64_t off = d - m.cu_dst[s];
  const int64_t n = s < m.b ? static_cast<int64_t>(m.cu[s + 1]) - m.cu[s] : 0;
  const int64_t slot = s < m.b ? static_cast<int64_t>(m.cu_dst[s + 1]) - m.cu_dst[s] : 0;
  if (off < 0 || off >= (n < slot ? n : slot) || m.src_rows <= 0) return -1;
  return clamp_row(m.cu_src[s] + off, m.src_rows);
}

// Source row of destination row `row` (-1: none).
RA_HOST_DEVICE int64_t map_row(const ThdRowMapParams& m, int64_t row) {
  switch (m.kind) {
    case ThdRowMap::kPartition:
      return local_to_global(m, m.rank, row);
    case ThdRowMap::kToContiguous:
      return global_to_gathered(m, row);
    case ThdRowMap::kToRankSharded: {
      const int64_t rank = row / max64(m.local_rows, 1);
      return local_to_global(m, rank, row - rank * m.local_rows);
    }
    case ThdRowMap::kHalf:
      return half_row(m, row, m.half);
    case ThdRowMap::kCopyValid:
      return valid_src_row(m, row);
    default:
      return row;
  }
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
