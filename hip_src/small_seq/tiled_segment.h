// Segment lookup and contract check of the tiled small-seq kernels (forward and backward).
//
// Offsets come from device memory and may hold anything, as int32 or int64. Every value is
// widened to int64 and checked in an order that never forms a difference of two unchecked
// values (an int64 end - start can overflow, an int32 one can wrap into the valid range), so
// a bad segment is recognised whatever its offsets hold, and it reads no K/V row.
//
// Contract (docs/kernels.md#tiled-small-seq-kernels, the same as the torch path's):
//   valid iff 0 <= q0 <= q1 <= total_q, q1 - q0 <= max_seqlen_q (BSHD q: always, s_q rows)
//         and 0 <= k0 <= k1 <= total_kv, k1 - k0 <= max_seqlen_kv
//             (BSHD kv: 0 <= seqlens_kv[i] <= min(s_kv, max_seqlen_kv)).
//   A bad segment is counted once (tiled_report_bad_segment), reads no K/V, writes NaN to out
//   and lse of rows max(q0, 0) .. min(q1, q0 + max_seqlen_q, total_q) - 1 (an empty range writes
//   nothing) and gives its keys zero gradient.
//   Rows of a THD q outside every segment (before cu_seqlens_q[0], from cu_seqlens_q[b] on,
//   clamped into q) are padding: out 0, lse -inf, dq 0, written by the work of the first /
//   last segment (tiled_padding_rows). With non-monotone offsets padding and segment rows can
//   overlap; such a call is flagged and what the overlapping rows hold is unspecified.
#pragma once

#include "../common/compat.h"
#include "tiled_params.h"

namespace small_seq {

// Entry i of an int32 or int64 offset array, widened.
RA_DEVICE int64_t tiled_read_offset(const void* base, bool is_int64, int64_t i) {
  return is_int64 ? static_cast<const int64_t*>(base)[i]
                  : static_cast<int64_t>(static_cast<const int32_t*>(base)[i]);
}

// The raw per-segment values, split from their interpretation so that a wave can issue the
// next item's reads before it works on the current one.
struct TiledBounds {
  int64_t q0, q1;  // THD q: cu_seqlens_q[seg], [seg + 1]; BSHD q: unused
  int64_t k0, k1;  // THD kv: cu_seqlens_kv[seg], [seg + 1]; BSHD kv: 0, seqlens_kv[seg]
};

RA_DEVICE TiledBounds tiled_fetch_bounds(const SmallSeqTiledParams& p, int seg) {
  TiledBounds b{0, 0, 0, 0};
  if (p.cu_seqlens_q != nullptr) {
    b.q0 = tiled_read_offset(p.cu_seqlens_q, p.cu_seqlens_q_int64, seg);
    b.q1 = tiled_read_offset(p.cu_seqlens_q, p.cu_seqlens_q_int64, seg + 1);
  }
  if (p.cu_seqlens_kv != nullptr) {
    b.k0 = tiled_read_offset(p.cu_seqlens_kv, p.cu_seqlens_kv_int64, seg);
    b.k1 = tiled_read_offset(p.cu_seqlens_kv, p.cu_seqlens_kv_int64, seg + 1);
  } else {
    b.k1 = tiled_read_offset(p.seqlens_kv, p.seqlens_kv_int64, seg);
  }
  return b;
}

// A segment resolved against the contract. Query row j (0 <= j < nq) is token q_token0 + j of
// batch q_batch of q / o / dout / out / dq (strides of each tensor), and row q_row0 + j of lse,
// probs and dlse; key j (0 <= j < nk) is token kv_token0 + j of batch kv_batch of k / v / dk / dv.
struct TiledSegment {
  int64_t q_row0;
  int64_t q_batch, q_token0;
  int64_t kv_batch, kv_token0;
  int nq;      // valid: the segment's queries; invalid: the rows to write NaN to (maybe 0)
  int nk;      // valid: the segment's keys; invalid: 0 (no key is ever read)
  bool valid;
};

// Where query row j of segment s sits for q head hq in lse and in the backward's Delta
// workspace (both [h_q, total_q], heads lse_head_stride apart; dlse has its own stride).
RA_DEVICE int64_t tiled_row_term_at(const SmallSeqTiledParams& p, const TiledSegment& s,
                                    const int64_t hq, const int64_t j) {
  return hq * p.lse_head_stride + (s.q_row0 + j);
}

RA_DEVICE TiledSegment tiled_resolve_segment(const SmallSeqTiledParams& p, int seg,
                                             const TiledBounds& b) {
  TiledSegment s;
  bool ok;
  if (p.cu_seqlens_q != nullptr) {
    const int64_t total_q = p.total_q;
    ok = b.q0 >= 0 && b.q0 <= b.q1 && b.q1 <= total_q && b.q1 - b.q0 <= p.max_seqlen_q;
    // Rows to write (NaN when the segment is bad): max(q0, 0) .. min(q1, q0 + max_q, total_q).
    // q0 + max_seqlen_q is only formed once q0 <= total_q (< 2^31), so it cannot overflow.
    const int64_t lo = b.q0 > 0 ? b.q0 : 0;
    int64_t hi = b.q1 < total_q ? b.q1 : total_q;
    if (b.q0 <= total_q && b.q0 + p.max_seqlen_q < hi) hi = b.q0 + p.max_seqlen_q;
    s.q_row0 = lo;
    s.q_batch = 0;
    s.q_token0 = lo;
    s.nq = hi > lo ? static_cast<int>(hi - lo) : 0;
  } else {
    ok = true;
    s.q_row0 = static_cast<int64_t>(seg) * p.s_q;
    s.q_batch = seg;
    s.q_token0 = 0;
    s.nq = p.s_q;
  }
  int64_t nk;
  if (p.cu_seqlens_kv != nullptr) {
    ok = ok && b.k0 >= 0 && b.k0 <= b.k1 && b.k1 <= p.total_kv &&
         b.k1 - b.k0 <= p.max_seqlen_kv;
    s.kv_batch = 0;
    s.kv_token0 = b.k0;
    nk = ok ? b.k1 - b.k0 : 0;
  } else {
    const int64_t cap = p.s_kv < p.max_seqlen_kv ? p.s_kv : p.max_seqlen_kv;
    ok = ok && b.k1 >= 0 && b.k1 <= cap;
    s.kv_batch = seg;
    s.kv_token0 = 0;
    nk = ok ? b.k1 : 0;
  }
  s.nk = static_cast<int>(nk);
  if (!ok) s.kv_token0 = 0;
  s.valid = ok;
  return s;
}

// Counts a bad segment once (the caller picks one work item per segment).
RA_DEVICE void tiled_report_bad_segment(const SmallSeqTiledParams& p, int seg) {
  atomicAdd(p.error_state, 1);
  // Largest (INT32_MAX - seg) wins: the lowest bad segment index, whatever the launch order.
  atomicMax(p.error_state + 1, 0x7fffffff - seg);
}

// Padding query rows of a THD q: [0, lead_end) and [tail_begin, total_q) (both empty for BSHD
// q). The work of segment 0 writes the first range, that of segment b - 1 the second.
struct TiledPadding {
  int64_t lead_end;
  int64_t tail_begin;
};

RA_DEVICE int64_t tiled_clamp_row(int64_t r, int64_t total) {
  return r < 0 ? 0 : (r > total ? total : r);
}

// THD kv: entry i of cu_seqlens_kv clamped into k's rows (where the k / v rows outside every
// segment begin or end: entries 0 and b).
RA_DEVICE int64_t tiled_kv_offset_clamped(const SmallSeqTiledParams& p, int64_t i) {
  return tiled_clamp_row(tiled_read_offset(p.cu_seqlens_kv, p.cu_seqlens_kv_int64, i),
                         p.total_kv);
}

// (b == 0: no work items run; the binding fills every row itself.)
RA_DEVICE TiledPadding tiled_padding_rows(const SmallSeqTiledParams& p) {
  if (p.cu_seqlens_q == nullptr || p.batch == 0) return TiledPadding{0, p.total_q};
  const int64_t first = tiled_read_offset(p.cu_seqlens_q, p.cu_seqlens_q_int64, 0);
  const int64_t last = tiled_read_offset(p.cu_seqlens_q, p.cu_seqlens_q_int64, p.batch);
  return TiledPadding{tiled_clamp_row(first, p.total_q), tiled_clamp_row(last, p.total_q)};
}

RA_DEVICE float tiled_nan() { return __int_as_float(0x7fc00000); }

// The most rows a (segment, kv head) can have, from the host bound: max_seqlen_q queries x the
// q heads of a kv head's GQA group (rows r = j * group + h). Launch sizes and kernel choices
// come from it, so they need no device data.
RA_HOST_DEVICE int64_t tiled_max_rows(const SmallSeqTiledParams& p) {
  const int64_t group = p.num_heads_q / p.num_heads_kv;
  return static_cast<int64_t>(p.max_seqlen_q) * group;
}

// A compile-time flag passed to generic lambdas (decltype(flag)::value).
template <bool V>
struct TiledFlag {
  static constexpr bool value = V;
};

// Query j and q-head offset h of row r0 + i of a tile (rows r = j * group + h): r0 is split
// once per tile, a row's offset with 32-bit arithmetic (a 64-bit division per row costs more
// than a short-history tile's softmax). group == 1 (no GQA) takes no division at all.
struct TiledRowMap {
  int64_t j0;
  int h0;
  int group;
  RA_DEVICE TiledRowMap(int64_t r0, int group_) : j0(r0 / group_), h0(0), group(group_) {
    h0 = static_cast<int>(r0 - j0 * group_);
  }
  RA_DEVICE void at(int i, int64_t& j, int& h) const {
    if (group == 1) {
      j = j0 + i;
      h = 0;
      return;
    }
    const unsigned t = static_cast<unsigned>(h0 + i);
    const unsigned dj = t / static_cast<unsigned>(group);
    j = j0 + dj;
    h = static_cast<int>(t - dj * static_cast<unsigned>(group));
  }
};

// Query of row r of a (segment, kv head) with few rows (r x group <= 2^16): the quotient
// r / group as a multiply by ceil(2^16 / group) and a shift. Exact there: with magic x group =
// 2^16 + e (0 <= e < group), r x magic / 2^16 exceeds r / group by r e / (group 2^16), less than
// the 1 / group that separates r / group from the next integer. One multiply instead of a
// 32-bit division (a ~20-instruction sequence on NVIDIA) per row address inside key loops.
struct TiledSmallRowSplit {
  uint32_t magic;
  RA_DEVICE explicit TiledSmallRowSplit(int group)
      : magic((65536u + static_cast<uint32_t>(group) - 1u) / static_cast<uint32_t>(group)) {}
  RA_DEVICE int query(int r) const {
    return static_cast<int>((static_cast<uint32_t>(r) * magic) >> 16);
  }
};

// Rows i0, i0 + stride, i0 + 2 * stride, ... of a tile, for a thread that walks a tile's rows
// at a fixed stride, as element offsets j * token_stride + h * head_stride of row (j, h) in one
// tensor: one division at the start (TiledRowMap::at) and one for the stride, then adds per
// row. No multiply per row: a row's address math was otherwise most of a warpgroup tile's
// instructions (docs/kernels.md#warpgroup-kernel).
struct TiledRowWalk {
  int64_t offset;
  int h;
  int group;
  int dh;         // heads per stride past whole queries
  int64_t step;   // offset of one stride: whole queries and dh heads
  int64_t carry;  // offset of a wrap of h: one query, minus `group` heads
  RA_DEVICE TiledRowWalk(const TiledRowMap& map, int i0, int stride, int64_t token_stride,
                         int64_t head_stride)
      : group(map.group) {
    int64_t j;
    map.at(i0, j, h);
    const int dj = stride / group;
    dh = stride - dj * group;
    offset = j * token_stride + h * head_stride;
    step = dj * token_stride + dh * head_stride;
    carry = token_stride - group * head_stride;
  }
  RA_DEVICE void next() {
    h += dh;
    offset += step;
    if (h >= group) {
      h -= group;
      offset += carry;
    }
  }
};

}  // namespace small_seq
