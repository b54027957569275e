// How a wave of the small-seq kernels maps onto one (segment, kv head): shared by fwd and bwd.
#pragma once

#include "../common/compat.h"
#include "params.h"

namespace small_seq {

// A K or V row of D 16-bit values is D/8 16-byte vectors. A wave of WAVE lanes covers
// ROWS_PER_PASS rows at once with LANES_PER_ROW lanes per row; when a row is wider than the wave
// (d=512 on a 32-lane warp) each lane holds VECS_PER_LANE vectors of it. Row r lives in lanes
// (r % ROWS_PER_PASS) * LANES_PER_ROW ...; a lane owns rows row_group, row_group + ROWS_PER_PASS, ...
// i.e. SLOTS rows in total.
template <int D, int KV, int WAVE>
struct Tiling {
  static_assert(D % 8 == 0 && ((D / 8) & (D / 8 - 1)) == 0, "head dim must be 8 * 2^k");
  static constexpr int kVecsPerRow = D / 8;
  static constexpr int kLanesPerRow = kVecsPerRow < WAVE ? kVecsPerRow : WAVE;
  static constexpr int kVecsPerLane = kVecsPerRow / kLanesPerRow;
  static constexpr int kRowsPerPass = WAVE / kLanesPerRow;
  static constexpr int kSlots = (KV + kRowsPerPass - 1) / kRowsPerPass;
};

// Segment lookup and contract check. A segment that breaks the contract is reported once (by
// the wave of kv head 0) and must not be computed; lengths and row ranges are range-checked
// here so that no kernel reads out of bounds whatever cu_seqlens holds.
struct Segment {
  int64_t q_row;   // row of q / o / dq / dO
  int64_t k_base;  // element offset of kv row 0 in k (dk shares the layout through dkv_*)
  int64_t v_base;
  int64_t dkv_base;
  int len;         // number of kv rows, 0 <= len <= max_seqlen_kv when valid
  bool valid;
};

// The raw per-segment values read from device memory, split from their interpretation so a
// wave can issue the next item's reads before it works on the current one.
struct SegmentBounds {
  int q0, q1;  // cu_seqlens_q[seg], cu_seqlens_q[seg + 1] (THD)
  int k0, k1;  // cu_seqlens_kv[seg], cu_seqlens_kv[seg + 1] (THD); BSHD: k1 = seqlens_kv[seg]
};

RA_DEVICE SegmentBounds fetch_bounds(const SmallSeqParams& p, int seg) {
  SegmentBounds b{seg, seg + 1, 0, 0};
  if (p.cu_seqlens_q != nullptr) {
    b.q0 = p.cu_seqlens_q[seg];
    b.q1 = p.cu_seqlens_q[seg + 1];
  }
  if (p.cu_seqlens_kv != nullptr) {
    b.k0 = p.cu_seqlens_kv[seg];
    b.k1 = p.cu_seqlens_kv[seg + 1];
  } else {
    b.k1 = p.seqlens_kv[seg];
  }
  return b;
}

// Valid iff the segment has exactly one query row inside q and its kv rows lie inside k/v with
// 0 <= len <= max_seqlen_kv. Every difference and comparison is taken in int64: the offsets are
// arbitrary int32 values from device memory, and a 32-bit end - start can wrap into the valid
// range (e.g. start 2147483640, end -2147483640 gives 16). An invalid segment reads no row.
RA_DEVICE Segment resolve_segment(const SmallSeqParams& p, int seg, const SegmentBounds& b) {
  Segment s;
  bool ok = true;
  const int64_t q0 = b.q0;
  if (p.cu_seqlens_q != nullptr) ok = (static_cast<int64_t>(b.q1) - q0 == 1) && q0 >= 0 && q0 < p.total_q;
  s.q_row = q0;
  int64_t len;
  if (p.cu_seqlens_kv != nullptr) {
    const int64_t kv_row0 = b.k0;
    len = static_cast<int64_t>(b.k1) - kv_row0;
    ok = ok && kv_row0 >= 0 && static_cast<int64_t>(b.k1) <= p.total_kv;
    s.k_base = kv_row0 * p.k_token_stride;
    s.v_base = kv_row0 * p.v_token_stride;
    s.dkv_base = kv_row0 * p.dkv_token_stride;
  } else {
    len = b.k1;
    ok = ok && len <= p.total_kv;
    s.k_base = static_cast<int64_t>(seg) * p.k_batch_stride;
    s.v_base = static_cast<int64_t>(seg) * p.v_batch_stride;
    s.dkv_base = static_cast<int64_t>(seg) * p.dkv_batch_stride;
  }
  ok = ok && len >= 0 && len <= p.max_seqlen_kv;
  s.len = ok ? static_cast<int>(len) : 0;
  s.valid = ok;
  if (!ok) s.q_row = s.q_row < 0 || s.q_row >= p.total_q ? -1 : s.q_row;
  return s;
}

RA_DEVICE void report_bad_segment(const SmallSeqParams& p, int seg) {
  atomicAdd(p.error_state, 1);
  // Largest (INT32_MAX - seg) wins: the lowest bad segment index, whatever the launch order.
  atomicMax(p.error_state + 1, 0x7fffffff - seg);
}

RA_DEVICE float ra_nan() { return __int_as_float(0x7fc00000); }

// Two waves per block: 64 threads on NVIDIA, 128 on CDNA. The kernels hold K/V in registers
// (100-250 per lane), so an SM/CU fits few waves; small blocks let the last few register-limited
// wave slots fill (e.g. 10 warps/SM instead of 8 at 183 registers on sm_90).
constexpr int kWavesPerBlock = 2;
constexpr int kMaxThreadsPerBlock = 128;
// The plan's default grid factor (small_seq_plan.py FWD_RESIDENCY_FACTOR /
// BWD_RESIDENCY_FACTOR, static_asserted equal): grid = this many times the blocks resident at
// once (launch_impl.h grid_for); 0 = one wave per item. Re-using resident waves raises both directions towards the byte floor on the
// benchmark cases (docs/kernels.md#small-seq-grid-and-residency has the measurements).
// NOTE: d=256/512 kv=16 measured the other way round in the backward: a per-shape factor is
// the open next step (same section).
constexpr int kFwdResidencyFactor = 4;
constexpr int kBwdResidencyFactor = 4;

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

}  // namespace small_seq
