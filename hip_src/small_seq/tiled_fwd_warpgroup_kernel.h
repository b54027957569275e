// Tiled small-seq forward, warpgroup variant (Hopper, sm_90a): the resident kernel's work
// (one (segment, kv head)'s whole K and V staged in shared memory once, then all its row tiles
// against it) with warpgroup matrix products (common/wgmma.h) instead of per-warp mma.sync
// (docs/kernels.md#warpgroup-kernel).
//
// Why: on many candidates the resident kernel is bound by its instruction stream, not by bytes:
// every 16-row mma.sync tile re-reads its K / V fragments from shared memory into registers and
// permutes them, and the products are a tenth of the instructions. A warpgroup product takes a
// 64-row tile with K and V read by the matrix unit straight from shared memory, so the warps
// issue little besides the softmax.
//
// Per work item (segment, kv head, split; the resident kernel's decomposition, 64-row tiles):
//   1. All threads copy K and V (keys x D each, the swizzled layout of common/wgmma.h: K is
//      read K-major by the score product, V N-major by P . V) with cp.async, keys up to the
//      segment's last step, zeros past its length; each warpgroup's first Q tile in the same
//      batch.
//   2. Each warpgroup takes tiles round robin. A tile's 64 query rows (r = j * group + h, as in
//      every tiled kernel) are copied into the warpgroup's shared Q buffer with cp.async, one
//      tile ahead (two buffers), rows past the segment as zeros.
//   3. Per step of KEYS keys (64; 16 where histories are that short): S = Q K^T (D / 16
//      products m64nKEYSk16 from shared memory), online softmax on the accumulator in registers
//      (log2 domain, fp32, the lazy reference max of the other tiled kernels; P rounded to the
//      input dtype), O += P V (KEYS / 16 products m64nDk16, P from registers). Keys past the
//      segment's length in its last step take no part in the max and get P = 0.
//   4. O / l into the tile's Q buffer (free once the last score product is done), then out in
//      whole 16-byte pieces; the LSE from registers.
// The contract (tiled_segment.h), padding rows and bad segments are handled as in the resident
// kernel, with the same helpers.
//
// Shared memory (dynamic, sized by the launch for max_seqlen_kv): K, V, then two Q buffers per
// warpgroup; see tiled_warpgroup_smem_bytes and TiledWarpgroupSmem. Where the arch-specific
// features are missing (RA_HAS_WGMMA 0: AMD, sm_90 without "a", the CPU emulation) the kernel
// body is empty and the launcher never selects it.
#pragma once

#include "../common/wgmma.h"
#include "tiled_fwd_resident_kernel.h"

namespace small_seq {

// Rows of a warpgroup tile, and keys of the longest softmax step (the m64n64 score product).
constexpr int kTiledWarpgroupRows = 64;
constexpr int kTiledWarpgroupKeys = 64;

// Keys per softmax step for histories of up to max_seqlen_kv keys: 16 where they fit one
// m64n16 product (a 64-key step would compute four times the scores and P . V products of a
// 16-key history), else 64.
RA_HOST_DEVICE constexpr int tiled_warpgroup_step_keys(int max_seqlen_kv) {
  return max_seqlen_kv <= 16 ? 16 : kTiledWarpgroupKeys;
}

// Keys the K and V buffers hold for max_seqlen_kv: whole softmax steps (a multiple of 8 rows,
// the swizzle's period).
RA_HOST_DEVICE constexpr int64_t tiled_warpgroup_keys(int max_seqlen_kv) {
  const int step = tiled_warpgroup_step_keys(max_seqlen_kv);
  return (static_cast<int64_t>(max_seqlen_kv) + step - 1) / step * step;
}

// Dynamic shared memory of a block: K and V of the staged keys, two Q buffers per
// warpgroup, and 1024 bytes to align the start (the swizzle is a function of address bits).
template <int D>
RA_HOST_DEVICE constexpr int64_t tiled_warpgroup_smem_bytes(int max_seqlen_kv, int warpgroups) {
  return 2 * tiled_warpgroup_keys(max_seqlen_kv) * D * 2 +
         static_cast<int64_t>(warpgroups) * 2 * kTiledWarpgroupRows * D * 2 + 1024;
}

#if RA_HAS_WGMMA

// Where a block's buffers sit in its dynamic shared memory (`dynamic_smem`, sized by
// tiled_warpgroup_smem_bytes), as seen by warpgroup `wg`: from the first 1024-byte aligned byte,
// K and V of `staged_keys` keys (keys x D each), then two Q buffers of a 64-row tile per
// warpgroup (the streaming instance: one Q buffer after a K and a V ring of their own sizes).
// Addresses are shared-space (copies, product descriptors), pointers generic (plain loads and
// stores). Both warpgroup forward kernels take their buffers from here, and so does the
// backward's cp.async dQ kernel (a warpgroup's Q buffer 1 holding its tile's dO).
template <int D>
struct TiledWarpgroupSmem {
  static constexpr uint32_t kQBytes = kTiledWarpgroupRows * D * 2;  // one Q buffer
  uint32_t k, v;    // K and V
  uint32_t q;       // this warpgroup's Q buffer 0; buffer 1 is kQBytes on
  uint8_t* q_ptr;   // the same, generic
  int wg;

  RA_DEVICE TiledWarpgroupSmem(void* dynamic_smem, int staged_keys, int warpgroup)
      : TiledWarpgroupSmem(dynamic_smem, staged_keys, 0, warpgroup) {}
  // K of k_keys rows, V of k_keys + v_extra (the streaming instance's ring: V holds one step
  // more).
  RA_DEVICE TiledWarpgroupSmem(void* dynamic_smem, int k_keys, int v_extra, int warpgroup)
      : wg(warpgroup) {
    const uint32_t raw = ra_smem_address(dynamic_smem);
    const uint32_t pad = ra_smem_pad_1024(raw);
    const uint32_t kv_bytes = static_cast<uint32_t>(k_keys) * D * 2;
    const uint32_t q_off = pad + 2 * kv_bytes + static_cast<uint32_t>(v_extra) * D * 2 +
                           static_cast<uint32_t>(wg) * 2 * kQBytes;
    k = raw + pad;
    v = k + kv_bytes;
    q = raw + q_off;
    q_ptr = static_cast<uint8_t*>(dynamic_smem) + q_off;
  }
};

// Issues the cp.async copies of keys [0, nk) of one kv head into the K and V buffers (both
// (keys x D), `kp` rows each: K is the score product's K-major B operand, V the P . V product's
// N-major one), zeros for keys nk .. round_up(nk, KEYS) - 1 and, for a history of no keys, for
// the whole first step (the backward's products over it must read zeros, not the previous
// segment's keys) (all threads of the block).
template <int D, int KEYS, int THREADS>
RA_DEVICE void tiled_warpgroup_stage(uint32_t sk, uint32_t sv, const SmallSeqTiledParams& p,
                                     const uint16_t* kbase, const uint16_t* vbase, const int nk,
                                     const int kp, const int tid) {
  constexpr int kVecs = D / 8;
  const int keys = nk > 0 ? (nk + KEYS - 1) / KEYS * KEYS : KEYS;
  for (int idx = tid; idx < keys * kVecs; idx += THREADS) {
    const int row = idx / kVecs;
    const int vec = idx - row * kVecs;
    const bool live = row < nk;
    const uint32_t off = ra_wgmma_offset(row, 8 * vec, kp);
    ra_cp_async16(sk + off, live ? kbase + row * p.k_token_stride + 8 * vec : p.k, live ? 16 : 0);
    ra_cp_async16(sv + off, live ? vbase + row * p.v_token_stride + 8 * vec : p.v, live ? 16 : 0);
  }
}

// Issues the cp.async copies of one tile's rows (tile rows r0 .. r0 + 63 of the segment) of a
// [.., token, head, D] tensor into a 64 x D operand buffer, rows at or past seg_rows as zeros
// (128 threads of one warpgroup, wtid = thread within it). Row (j, h) of the segment's kv head
// lives at base + j * token_stride + h * head_stride; `any` is a readable address for the
// zero-filling copies (which read nothing).
template <int D>
RA_DEVICE void tiled_warpgroup_load_rows(const uint16_t* base, const void* any,
                                         const int64_t token_stride, const int64_t head_stride,
                                         const int group, const int64_t r0,
                                         const int64_t seg_rows, uint32_t dst_buf,
                                         const int wtid) {
  constexpr int kVecs = D / 8;
  constexpr int kRowsPerPass = 128 / kVecs;
  // Passes move whole swizzle periods (8 rows): a thread's 16-byte chunk keeps its position in
  // the row, so its destination moves by whole rows.
  static_assert(kRowsPerPass % 8 == 0, "a pass must move whole swizzle periods");
  const int vec = wtid % kVecs;
  const int i0 = wtid / kVecs;
  const uint16_t* src = base + 8 * vec;
  const uint32_t dst = dst_buf + ra_wgmma_offset(i0, 8 * vec, kTiledWarpgroupRows);
  const int64_t rows_left = seg_rows - r0 - i0;  // pass k's row exists iff k * kRowsPerPass < it
  TiledRowWalk row(TiledRowMap(r0, group), i0, kRowsPerPass, token_stride, head_stride);
#pragma unroll
  for (int pass = 0; pass < kTiledWarpgroupRows / kRowsPerPass; ++pass, row.next()) {
    const bool live = pass * kRowsPerPass < rows_left;
    ra_cp_async16(dst + pass * kRowsPerPass * 128, live ? src + row.offset : any, live ? 16 : 0);
  }
}

// The same for one tile's query rows.
template <int D>
RA_DEVICE void tiled_warpgroup_load_q(const SmallSeqTiledParams& p, const TiledSegment& s,
                                      const int hk, const int group, const int64_t r0,
                                      const int64_t seg_rows, uint32_t sq, const int wtid) {
  const uint16_t* q = static_cast<const uint16_t*>(p.q) + s.q_batch * p.q_batch_stride +
                      s.q_token0 * p.q_token_stride + hk * group * p.q_head_stride;
  tiled_warpgroup_load_rows<D>(q, p.q, p.q_token_stride, p.q_head_stride, group, r0, seg_rows,
                               sq, wtid);
}

// Stores the live rows of a 64 x D operand buffer `src_buf` (tile rows r0 .. r0 + 63 of the
// segment) to a [.., token, head, D] tensor laid out as in tiled_warpgroup_load_rows, 16 bytes
// per thread and store (the rows and chunks of the load).
template <int D>
RA_DEVICE void tiled_warpgroup_store_rows(uint16_t* base, const int64_t token_stride,
                                          const int64_t head_stride, const TiledRowMap& map,
                                          const int64_t r0, const int64_t seg_rows,
                                          const uint8_t* src_buf, const int wtid) {
  constexpr int kVecs = D / 8;
  constexpr int kRowsPerPass = 128 / kVecs;
  const int vec = wtid % kVecs;
  const int i0 = wtid / kVecs;
  uint16_t* dst = base + 8 * vec;
  const uint8_t* src = src_buf + ra_wgmma_offset(i0, 8 * vec, kTiledWarpgroupRows);
  const int64_t rows_left = seg_rows - r0 - i0;
  TiledRowWalk row(map, i0, kRowsPerPass, token_stride, head_stride);
#pragma unroll
  for (int pass = 0; pass < kTiledWarpgroupRows / kRowsPerPass; ++pass, row.next()) {
    if (pass * kRowsPerPass >= rows_left) break;  // rows ascend with the pass
    ra_store16(dst + row.offset, ra_load16(src + pass * kRowsPerPass * 128));
  }
}

// Row r (0: 16 * warp + g, 1: that + 8) of this thread's part of an m64nD accumulator, times
// `factor` and rounded to T, into a 64 x D operand buffer (the layout the load and store above
// use). Both of a thread's rows are g modulo 8, so column chunk c of a panel sits at chunk c ^ g
// (ra_wgmma_offset with the row's swizzle taken out of the loop).
template <typename T, int D>
RA_DEVICE void tiled_warpgroup_acc_row_to_buffer(uint8_t* buf, const float* acc, const int r,
                                                 const float factor, const int wtid) {
  const int g = (wtid % 32) / 4;
  uint8_t* const row = buf + (16 * (wtid / 32) + g + 8 * r) * 128 + 4 * (wtid % 4);
#pragma unroll
  for (int c = 0; c < D / 8; ++c)
    *reinterpret_cast<uint32_t*>(row + (c / 8) * kTiledWarpgroupRows * 128 +
                                 (((c % 8) ^ g) << 4)) =
        ra_mma_pack2<T>(acc[4 * c + 2 * r] * factor, acc[4 * c + 2 * r + 1] * factor);
}

// Stores a finished tile's live rows from its Q buffer with 16-byte stores (every thread of the
// warpgroup, after the barrier that publishes the buffer): the cp.async kernel's out epilogue,
// and the TMA kernel's for a tile that a segment's end cuts.
template <int D>
RA_DEVICE void tiled_warpgroup_store_out(const SmallSeqTiledParams& p, const TiledSegment& s,
                                         const int hk, const int group,
                                         const TiledRowMap& map, const int64_t r0,
                                         const int64_t seg_rows, const uint8_t* sq_ptr,
                                         const int wtid) {
  uint16_t* out = static_cast<uint16_t*>(p.o) + s.q_batch * p.o_batch_stride +
                  s.q_token0 * p.o_token_stride + hk * group * p.o_head_stride;
  tiled_warpgroup_store_rows<D>(out, p.o_token_stride, p.o_head_stride, map, r0, seg_rows,
                                sq_ptr, wtid);
}

// tiled_warpgroup_tile's default step_done hook: nothing to release.
struct TiledNoStepDone {
  RA_DEVICE void operator()(int) const {}
};

// tiled_warpgroup_tile's step schedule, a tag argument. Serial (the default): scores, softmax,
// P . V, each waited for before the next starts; blocks of one warpgroup take it (overlapped,
// they timed a tie uncapped over 64-key steps and would spill capped for three per
// multiprocessor; over 16-key steps most histories are one step, with nothing to overlap).
// Overlapped: each step's softmax under the previous step's P . V (the warp-specialized
// kernel's computing warpgroups).
struct TiledSerialSteps {
  static constexpr bool kOverlap = false;
};
struct TiledOverlappedSteps {
  static constexpr bool kOverlap = true;
};

// One 64-row tile of a valid segment against the staged K / V (one warpgroup): scores,
// online softmax, P . V, then out and the LSE of its live rows (out through the tile's Q
// buffer `sq`, which holds Q on entry and is free again once every warp of the warpgroup
// passed its last score product). The steps cover keys [k_begin, k_end) in whole steps of KEYS
// keys: every caller passes 0 and the history's length (s.nk); as parameters, the compiler
// treats them as it always has (with a literal 0 it loses that the warp-specialized kernel's ring
// index is non-negative and emits signed modulo arithmetic, so the kernels' code would change).
// The caller decides three things through hooks: before_step(k0) returns once the step's K and
// V may be read (the cp.async kernel stages all keys before its first tile: nothing to wait
// for); store_out(map) publishes the buffer holding O / l to the warpgroup and writes the
// tile's live rows out; step_done(k0) runs once this thread has waited for every product of
// this tile that reads the step at k0 (its scores and P . V), with no product in flight (a
// caller whose steps sit in a ring frees the step's slot there: its last steps before the
// epilogue rather than after it).
// `schedule` picks the step schedule (TiledSerialSteps, TiledOverlappedSteps).
// Where the keys sit: RING 0, the whole history, key k at row k of K and V (kp rows per panel
// of both). RING > 0 (a power of two: the streaming instance of the tile-copy kernel), a ring of
// RING keys: key k at row k % RING of K (kp = RING rows per panel) and of V, whose panels hold
// RING + KEYS rows: the last KEYS rows take the step where the history ends inside it (its V
// copied apart, zeros past the history), so that step reads rows RING .. of V. TAIL_APART false
// (the warp-specialized kernel, whose copy warp writes that step's V into its own slot): V's
// panels hold RING rows and every step reads its slot.
// ROW_MAX: the instance for calls that ask for row_max: m stays lazy and each row's exact running
// maximum is kept apart (m_exact) for it (tiled_fwd_kernel.h's header NOTE); without it a call
// that passes p.row_max moves m with every new maximum instead (threshold 0), so that m ends
// exact, which costs nothing where the history is one step (the 16-key instances).
template <typename T, int D, int KEYS, int RING = 0, bool TAIL_APART = true,
          bool ROW_MAX = false, typename BeforeStep,
          typename StoreOut, typename Schedule = TiledSerialSteps,
          typename StepDone = TiledNoStepDone>
RA_DEVICE void tiled_warpgroup_tile(const SmallSeqTiledParams& p, const TiledSegment& s,
                                    const int hk, const int group, const int64_t r0,
                                    const int64_t seg_rows, uint8_t* sq_ptr, const uint32_t sq,
                                    const uint32_t sk, const uint32_t sv, const int kp,
                                    const int wg, const int wtid, const int k_begin,
                                    const int k_end, const BeforeStep& before_step,
                                    const StoreOut& store_out,
                                    const Schedule& /*schedule*/ = Schedule{},
                                    const StepDone& step_done = StepDone{}) {
  constexpr bool OVERLAP = Schedule::kOverlap;
  static_assert(RING == 0 || (RING % KEYS == 0 && (RING & (RING - 1)) == 0),
                "a ring of whole steps, a power of two keys");
  constexpr int kSteps = D / 16;  // k steps of the score product
  const int warp = wtid / 32;
  const int lane = wtid % 32;
  const int g = lane / 4;
  const int t = lane % 4;
  const float scale = p.softmax_scale * kTiledLog2e;
  const int nk = s.nk;
  float o[D / 2];
#pragma unroll
  for (int i = 0; i < D / 2; ++i) o[i] = 0.f;
  float m[2] = {-INFINITY, -INFINITY};
  float l[2] = {0.f, 0.f};
  float m_exact[2] = {-INFINITY, -INFINITY};  // ROW_MAX: each row's exact running maximum
  const float lazy = !ROW_MAX && p.row_max != nullptr ? 0.f : kTiledLazyRescaleLog2;
  // The score product of the step at key k0 into acc, asynchronous: committed, not waited.
  // Each operand's descriptor is made once per step and advanced to each k step by one add
  // (ra_wgmma_desc_advance) rather than rebuilt from the k step's address. (Q's, the same every
  // step, is still made per step: held across the steps it costs the capped one-warpgroup
  // blocks more spill.)
  const auto issue_scores = [&](float* acc, int k0) {
    const uint64_t q_desc = ra_wgmma_desc(sq);
    const uint64_t k_desc = ra_wgmma_desc(sk + (RING > 0 ? k0 % RING : k0) * 128);
    ra_wgmma_fence();
#pragma unroll
    for (int st = 0; st < kSteps; ++st)
      ra_wgmma_ss<T, KEYS>(
          acc, ra_wgmma_desc_advance(q_desc, ra_wgmma_step_address(0, st, kTiledWarpgroupRows, 0)),
          ra_wgmma_desc_advance(k_desc, ra_wgmma_step_address(0, st, kp, 0)), st > 0);
    ra_wgmma_commit();
  };
  // Online softmax of one step's scores in place (sc becomes P, unrounded), with the lazy
  // reference max of the other tiled kernels (docs/kernels.md#numerics): a row's reference m
  // moves only when a step's max exceeds it by more than kTiledLazyRescaleLog2, so most steps
  // leave O alone. Returns whether any row of this warp moved (alpha: the factors O must take
  // before this step's P . V; 1 for rows that did not move). Only a segment's last step holds
  // keys past its length (TAIL): the dense steps are compiled without the masking.
  const auto softmax = [&](float* sc, int k0, float* alpha, auto tail) {
    constexpr bool kTail = decltype(tail)::value;
    const auto past = [&](int i) { return kTail && k0 + 8 * (i / 4) + 2 * t + (i % 2) >= nk; };
    // Scores stay unscaled until the exponent, so that exp2(s * scale - m) is one fused
    // multiply-add: the row max in the log2 domain is max(s) * scale for a non-negative scale
    // and min(s) * scale for a negative one (a warp-uniform branch). Keys past the history take
    // no part in either and get P = 0 below (masking after the scale: -inf * 0 would be NaN).
    float mx[2];
    if (scale >= 0.f) {
      mx[0] = mx[1] = -INFINITY;
#pragma unroll
      for (int i = 0; i < KEYS / 2; ++i)
        mx[(i / 2) % 2] = fmaxf(mx[(i / 2) % 2], past(i) ? -INFINITY : sc[i]);
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
        mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
      }
    } else {
      mx[0] = mx[1] = INFINITY;
#pragma unroll
      for (int i = 0; i < KEYS / 2; ++i)
        mx[(i / 2) % 2] = fminf(mx[(i / 2) % 2], past(i) ? INFINITY : sc[i]);
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        mx[r] = fminf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
        mx[r] = fminf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
      }
    }
    bool moved = false;
    float mref[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      mx[r] *= scale;  // log2 domain
      if constexpr (ROW_MAX) m_exact[r] = fmaxf(m_exact[r], mx[r]);
      alpha[r] = 1.f;
      if (m[r] == -INFINITY) {
        m[r] = mx[r];  // nothing accumulated yet (l and O are 0)
      } else if (mx[r] > m[r] + lazy) {
        alpha[r] = exp2f(m[r] - mx[r]);
        m[r] = mx[r];
        l[r] *= alpha[r];
        moved = true;
      }
      // m is finite once a row has seen a live key; the guard keeps exp2(-inf - -inf) = NaN
      // out of a row whose scores are not finite.
      mref[r] = m[r] == -INFINITY ? 0.f : m[r];
    }
#pragma unroll
    for (int i = 0; i < KEYS / 2; ++i) {
      const int r = (i / 2) % 2;
      sc[i] = past(i) ? 0.f : exp2f(fmaf(sc[i], scale, -mref[r]));
      l[r] += sc[i];
    }
    return __any_sync(0xffffffffu, moved);
  };
  // P of one step rounded into the register operand of its P . V product.
  uint32_t pa[KEYS / 16][4];
  const auto pack_p = [&](const float* sc) {
#pragma unroll
    for (int kk = 0; kk < KEYS / 16; ++kk)
#pragma unroll
      for (int x = 0; x < 4; ++x)
        pa[kk][x] = ra_mma_pack2<T>(sc[8 * kk + 2 * x], sc[8 * kk + 2 * x + 1]);
  };
  // O += P . V for the step at k0 (issued and committed, not waited; pa must stay untouched
  // and O unread until the product is waited for).
  const auto issue_pv = [&](int k0) {
    const int v_row = RING == 0 ? k0 : (TAIL_APART && k0 + KEYS > nk ? RING : k0 % RING);
    const int v_panel_rows = RING > 0 ? RING + (TAIL_APART ? KEYS : 0) : kp;
    const uint64_t v_desc = ra_wgmma_desc_n_major(sv + v_row * 128, v_panel_rows * 128);
    ra_wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < KEYS / 16; ++kk)
      ra_wgmma_rs<T, D>(o, pa[kk], ra_wgmma_desc_advance(v_desc, 16 * kk * 128), 1);
    ra_wgmma_commit();
  };
  const auto rescale_o = [&](const float* alpha) {
#pragma unroll
    for (int i = 0; i < D / 2; ++i) o[i] *= alpha[(i / 2) % 2];
  };
  // After a wait: keeps the compiler from reading the scores / O before the products wrote them.
  const auto pin_scores = [](float* sc) {
#pragma unroll
    for (int i = 0; i < KEYS / 2; ++i) ra_wgmma_pin(sc[i]);
  };
  const auto pin_o = [&] {
#pragma unroll
    for (int i = 0; i < D / 2; ++i) ra_wgmma_pin(o[i]);
  };
  const auto softmax_any = [&](float* sc, int k0, float* alpha) {
    return k0 + KEYS <= nk ? softmax(sc, k0, alpha, TiledFlag<false>{})
                           : softmax(sc, k0, alpha, TiledFlag<true>{});
  };
  if constexpr (!OVERLAP) {
    // Serial: scores, softmax, P . V, each waited for before the next starts.
    for (int k0 = k_begin; k0 < k_end; k0 += KEYS) {
      float sc[KEYS / 2], alpha[2];
      before_step(k0);
      issue_scores(sc, k0);
      ra_wgmma_wait<0>();
      pin_scores(sc);
      if (softmax_any(sc, k0, alpha)) rescale_o(alpha);  // warp-uniform
      pack_p(sc);
      issue_pv(k0);
      ra_wgmma_wait<0>();
      pin_o();
      step_done(k0);
    }
  } else if (k_begin < k_end) {
    // Overlapped (flash-attention 3's schedule within a warpgroup): step j's scores are
    // issued, then step j - 1's P . V behind them; the softmax of step j runs once its scores
    // are in (products complete in order) while the matrix unit still computes P . V, which is
    // waited for only before O takes step j's factors and pa step j's P. The first step's
    // softmax and the last step's P . V are peeled off: a product issued under a branch makes
    // ptxas serialize every product of the kernel (warning C7514).
    float sc[KEYS / 2], alpha[2];
    int k0 = k_begin;
    before_step(k0);
    issue_scores(sc, k0);
    ra_wgmma_wait<0>();
    pin_scores(sc);
    softmax_any(sc, k0, alpha);  // the first step's factors meet O = 0
    pack_p(sc);
    for (k0 += KEYS; k0 < k_end; k0 += KEYS) {
      before_step(k0);
      issue_scores(sc, k0);
      issue_pv(k0 - KEYS);
      ra_wgmma_wait<1>();  // the scores are in; P . V may still run
      pin_scores(sc);
      const bool rescale = softmax_any(sc, k0, alpha);
      ra_wgmma_wait<0>();
      pin_o();
      step_done(k0 - KEYS);  // its scores and P . V are done
      if (rescale) rescale_o(alpha);  // warp-uniform
      pack_p(sc);
    }
    issue_pv(k0 - KEYS);
    ra_wgmma_wait<0>();
    pin_o();
    step_done(k0 - KEYS);
  }
  // O / l of this thread's two rows into the Q buffer, branch-free (a named barrier, shuffles,
  // selects, shared stores), then their LSE under the rows' conditions.
  ra_warpgroup_sync(wg);  // every warp is past its score products: the Q buffer is free
  float lse[2], row_max[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float sum = l[r];
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    sum += __shfl_xor_sync(0xffffffffu, sum, 2);
    tiled_warpgroup_acc_row_to_buffer<T, D>(sq_ptr, o, r, sum > 0.f ? 1.f / sum : 0.f, wtid);
    lse[r] = sum > 0.f ? (m[r] + log2f(sum)) * kTiledLn2 : -INFINITY;
    row_max[r] = sum > 0.f ? (ROW_MAX ? m_exact : m)[r] * kTiledLn2 : -INFINITY;
  }
  const TiledRowMap map(r0, group);  // (a 64-bit division: not under a product)
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int i = 16 * warp + g + 8 * r;
    if (t == 0 && r0 + i < seg_rows) {
      int64_t j;
      int h;
      map.at(i, j, h);
      p.lse[tiled_row_term_at(p, s, hk * group + h, j)] = lse[r];
      if (p.row_max != nullptr) p.row_max[tiled_row_term_at(p, s, hk * group + h, j)] = row_max[r];
    }
  }
  store_out(map);
}

#endif  // RA_HAS_WGMMA

// Blocks of one warpgroup over 16-key steps (histories of at most 16 keys; longer ones take the
// tile-copy kernel or the kernels without warpgroups).
// NOTE (registers): capped for three blocks per multiprocessor (168 registers), so that other
// blocks' products and loads fill one block's softmax and staging.
template <typename T, int D>
__global__ void RA_LAUNCH_BOUNDS_MIN_BLOCKS(128, 3)
    small_seq_tiled_fwd_warpgroup_kernel(const SmallSeqTiledParams p, const int splits) {
#if RA_HAS_WGMMA
  constexpr int THREADS = 128;
  constexpr int KEYS = 16;
  constexpr int ROWS = kTiledWarpgroupRows;
  const int tid = threadIdx.x;
  const int wg = tid / 128;
  const int wtid = tid % 128;
  const int group = p.num_heads_q / p.num_heads_kv;
  const int kp = static_cast<int>(tiled_warpgroup_keys(p.max_seqlen_kv));
  RA_DYNAMIC_SHARED(ra_vec8, tiled_warpgroup_smem);
  const TiledWarpgroupSmem<D> smem(tiled_warpgroup_smem, kp, wg);
  constexpr uint32_t kQBytes = TiledWarpgroupSmem<D>::kQBytes;
  const int64_t items = static_cast<int64_t>(p.batch) * splits * p.num_heads_kv;
  for (int64_t item = blockIdx.x; item < items; item += gridDim.x) {
    TiledStagedItem it;
    if (!tiled_staged_item<T, D, ROWS, THREADS>(p, item, splits, tid, &it)) continue;
    const TiledSegment& s = it.s;
    const int hk = it.hk;
    const int64_t seg_rows = it.seg_rows;
    const int64_t tile1 = it.tile1;
    // K, V and this warpgroup's first tile of Q in one batch of copies; then the warpgroup's
    // tiles, the next one's Q in flight while the current one computes.
    tiled_warpgroup_stage<D, KEYS, THREADS>(smem.k, smem.v, p, it.kbase, it.vbase, s.nk, kp, tid);
    int64_t tile = it.tile0 + wg;
    if (tile < tile1)
      tiled_warpgroup_load_q<D>(p, s, hk, group, tile * ROWS, seg_rows, smem.q, wtid);
    ra_cp_async_commit();
    ra_cp_async_wait<0>();
    ra_fence_proxy_async();
    __syncthreads();
    for (int buf = 0; tile < tile1; ++tile, buf ^= 1) {
      const uint32_t off = buf * kQBytes;
      if (tile + 1 < tile1)
        tiled_warpgroup_load_q<D>(p, s, hk, group, (tile + 1) * ROWS, seg_rows,
                                  smem.q + (buf ^ 1) * kQBytes, wtid);
      ra_cp_async_commit();
      ra_cp_async_wait<1>();  // this tile's copies have landed (the next one's may not)
      ra_fence_proxy_async();
      ra_warpgroup_sync(wg);
      const int64_t r0 = tile * ROWS;
      tiled_warpgroup_tile<T, D, KEYS>(
          p, s, hk, group, r0, seg_rows, smem.q_ptr + off, smem.q + off, smem.k, smem.v, kp, wg,
          wtid, 0, s.nk, [](int) {}, [&](const TiledRowMap& map) {
            ra_warpgroup_sync(wg);
            tiled_warpgroup_store_out<D>(p, s, hk, group, map, r0, seg_rows, smem.q_ptr + off,
                                         wtid);
          });
      ra_warpgroup_sync(wg);  // every warp is done with this buffer before it is refilled
    }
    ra_cp_async_wait<0>();
    __syncthreads();  // every warpgroup is done with this segment's K / V
  }
#endif
}

}  // namespace small_seq
