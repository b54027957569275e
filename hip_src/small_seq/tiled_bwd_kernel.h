// Tiled small-seq attention backward: any number of queries per segment, up to
// kSmallSeqTiledMaxSeqlenKv keys (docs/kernels.md#tiled-small-seq-backward).
//
// With P = exp(scale q K^T - lse) recomputed from the forward's float32 LSE, dP = dO V^T and
// Delta = rowsum(dO * O) - dlse per (query row, q head):
//   dS = P * (dP - Delta),   dV = P^T dO,   dK = scale dS^T Q,   dQ = scale dS K.
// The rows of a (segment, kv head) are the pairs (query j, q head h of the kv head's GQA group),
// numbered r = j * group + h, as in the forward. Three kernels, each a grid-stride loop:
//   1. small_seq_tiled_bwd_delta_kernel, per (query row, q head): Delta into the fp32 workspace
//      ([h_q, total_q], indexed like the LSE), and dq = 0 on the padding rows of a THD q.
//   2. small_seq_tiled_bwd_dkv_kernel, work item = (segment, kv head, key tile of
//      kTiledBwdKeys keys, head-dim slice): walks all of the segment's rows in tiles of
//      kTiledBwdRows, accumulating the slice of dK and dV of its keys in fp32 registers, and
//      stores them once. When the segment has one key tile, the same scores also give the
//      slice of dQ of every row (complete: it sums over all keys), stored per row tile.
//      A segment whose rows fit one row tile (q = 1 with a GQA group of at most 16, a few
//      candidates without GQA) instead takes one item per (kv head, slice) that walks all key
//      tiles: each tile's dK / dV are complete at once and dQ accumulates across the tiles, so
//      K / V are read once for all three gradients.
//      It also writes every gradient that is not a valid segment's: zeros for kv rows no
//      segment covers and for a bad segment's keys, NaN dq rows of a bad segment.
//   3. pass 3, dQ of a segment with more than one key tile and more than one row tile
//      (launched only when max_seqlen_kv > kTiledBwdKeys and max_seqlen_q x group >
//      kTiledBwdRows): its block variant only (tiled_bwd_block_kernel.h), which then serves
//      pass 2 too. Its per-wave scalar sums (tiled_bwd_dq_scalar) live here.
// Passes 2 and 3 give way to the streaming kernel (tiled_bwd_stream_kernel.h) where a (segment,
// kv head) has at most 4 rows, to pass 2's one-row-tile instance (only the one-row-tile item
// compiled; no pass 3) where it has at most 16, and on Hopper to the warpgroup kernels
// (tiled_bwd_warpgroup_kernel.h) where it fills 64-row tiles over at most 4096 keys. The
// one-row-tile instance and the warpgroup kernels can compute Delta themselves (items holding
// every key of a row as rowsum(P dP) - dlse; past one key block the warpgroup dQ kernel, run
// first, as rowsum(dO O) - dlse), and pass 1 is then not run.
// Every gradient element is written by exactly one work item, which sums its terms in a fixed
// order: deterministic (bitwise, run to run), no atomics. Head-dim slices are separate items:
// they bound the fp32 accumulators (two 16 x slice tiles in pass 2) to 64 registers per lane
// and give short segments more parallel items; each slice item recomputes the scores from the
// whole head dim (tile products are cheap next to the bytes; the re-reads hit L2).
//
// Numerics (NOTE), as in bwd_mma_kernel.h: scores, P, dP, Delta and dS are fp32; P^T, dS^T and
// dS are rounded to the input dtype only as operands of the output products (flash-attention's
// choice), dK / dV / dQ accumulate in fp32 and are rounded once. Keys past the segment's
// length and rows past its rows are never read: their operands are exact zeros and their P is
// set to exactly 0 (never exp of garbage).
#pragma once

#include "tiled_segment.h"

namespace small_seq {

constexpr int kTiledBwdWavesPerBlock = 2;
constexpr int kTiledBwdMaxThreadsPerBlock = 128;
// Grid = this many times the blocks resident at once (then the grid-stride loop re-uses waves).
constexpr int kTiledBwdResidencyFactor = 4;
// Keys of a pass-2 item: the 16 rows of one accumulator tile (the keys are the rows of S^T).
constexpr int kTiledBwdKeys = 16;
// Query rows (query x q head pairs) per step: the 16 contracted rows of one P^T . dO product.
constexpr int kTiledBwdRows = 16;

constexpr float kTiledBwdLog2e = 1.4426950408889634f;

// Head-dim slice of one item: 64 on 32-lane warps (two fp32 16 x 64 tiles are 64 registers per
// lane), 128 on 64-lane waves (the same registers hold twice the columns).
RA_HOST_DEVICE constexpr int tiled_bwd_slice(int wave, int d) {
  return d < (wave == 64 ? 128 : 64) ? d : (wave == 64 ? 128 : 64);
}
RA_HOST_DEVICE constexpr int tiled_bwd_slices(int wave, int d) {
  return d / tiled_bwd_slice(wave, d);
}

RA_HOST_DEVICE int64_t tiled_bwd_key_tiles(const SmallSeqTiledParams& p) {
  return (static_cast<int64_t>(p.max_seqlen_kv) + kTiledBwdKeys - 1) / kTiledBwdKeys;
}
RA_HOST_DEVICE int64_t tiled_bwd_row_tiles(const SmallSeqTiledParams& p) {
  return (tiled_max_rows(p) + kTiledBwdRows - 1) / kTiledBwdRows;
}
// Key tiles per (segment, kv head) in pass 2's item numbering: all of them, except where every
// segment's rows fit one row tile (max_seqlen_q x group <= 16). Such a segment is walked by its
// key-tile-0 item alone (tiled_bwd_row_tile_mma), so numbering the other tiles only adds items
// that return at once, and with a grid stride that is a multiple of the items per (segment, kv
// head) every working item falls to the same few waves (measured:
// docs/kernels.md#tiled-small-seq-backward).
RA_HOST_DEVICE int64_t tiled_bwd_item_key_tiles(const SmallSeqTiledParams& p) {
  return tiled_bwd_row_tiles(p) <= 1 ? 1 : tiled_bwd_key_tiles(p);
}
RA_HOST_DEVICE int64_t tiled_bwd_dkv_items(const SmallSeqTiledParams& p, int slices) {
  return static_cast<int64_t>(p.batch) * p.num_heads_kv * tiled_bwd_item_key_tiles(p) * slices;
}
// Segments whose rows fit one row tile (q = 1 with a GQA group of at most 16, few candidates
// without GQA) are served by one pass-2 item per (kv head, slice) walking all key tiles, dQ
// included.
RA_HOST_DEVICE bool tiled_bwd_one_row_tile(const SmallSeqTiledParams& p, const TiledSegment& s) {
  return static_cast<int64_t>(s.nq) * (p.num_heads_q / p.num_heads_kv) <= kTiledBwdRows;
}
// (query row, q head) pairs of pass 1 (one lane group each).
RA_HOST_DEVICE int64_t tiled_bwd_delta_pairs(const SmallSeqTiledParams& p) {
  return static_cast<int64_t>(p.total_q) * p.num_heads_q;
}

// Where a (segment, kv head)'s rows and keys live.
struct TiledBwdRows {
  const uint16_t* q;     // q / dout / dq: + (q_token0 + j) * token stride + (hq0 + h) * head
  const uint16_t* dout;  // stride (each tensor's own strides)
  uint16_t* dq;
  const uint16_t* k;  // first key of the segment, kv head hk
  const uint16_t* v;
  uint16_t* dk;
  uint16_t* dv;
};

RA_DEVICE TiledBwdRows tiled_bwd_rows(const SmallSeqTiledParams& p, const int hk,
                                      const TiledSegment& s) {
  TiledBwdRows r;
  r.q = static_cast<const uint16_t*>(p.q) + s.q_batch * p.q_batch_stride;
  r.dout = static_cast<const uint16_t*>(p.dout) + s.q_batch * p.do_batch_stride;
  r.dq = static_cast<uint16_t*>(p.dq) + s.q_batch * p.dq_batch_stride;
  r.k = static_cast<const uint16_t*>(p.k) + s.kv_batch * p.k_batch_stride +
        s.kv_token0 * p.k_token_stride + hk * p.k_head_stride;
  r.v = static_cast<const uint16_t*>(p.v) + s.kv_batch * p.v_batch_stride +
        s.kv_token0 * p.v_token_stride + hk * p.v_head_stride;
  r.dk = static_cast<uint16_t*>(p.dk) + s.kv_batch * p.dk_batch_stride +
         s.kv_token0 * p.dk_token_stride + hk * p.dk_head_stride;
  r.dv = static_cast<uint16_t*>(p.dv) + s.kv_batch * p.dv_batch_stride +
         s.kv_token0 * p.dv_token_stride + hk * p.dv_head_stride;
  return r;
}

// LSE (log2 domain) and Delta of row r of a segment (r = j * group + h).
struct TiledBwdRowTerms {
  float lse2;
  float delta;
};

// The terms of query j, q head hq of a segment: its LSE and pass 1's Delta from the workspace.
// FUSED_DELTA (a kernel launched without pass 1: the workspace holds no Delta): -dlse (0
// without dlse) in place of Delta, to which the caller adds the row's rowsum(dO O), which is
// rowsum(P dP) (O = P V, so dO . O = sum_k P_k dO . V_k). -dlse + x is x - dlse exactly.
template <bool FUSED_DELTA = false>
RA_DEVICE TiledBwdRowTerms tiled_bwd_row_terms_of(const SmallSeqTiledParams& p,
                                                  const TiledSegment& s, const int64_t j,
                                                  const int64_t hq) {
  const int64_t row = s.q_row0 + j;
  const int64_t at = tiled_row_term_at(p, s, hq, j);
  if constexpr (FUSED_DELTA)
    return TiledBwdRowTerms{p.lse[at] * kTiledBwdLog2e,
                            p.dlse != nullptr ? -p.dlse[hq * p.dlse_head_stride + row] : 0.f};
  else
    return TiledBwdRowTerms{p.lse[at] * kTiledBwdLog2e, p.workspace[at]};
}

// The same for row i of a tile (rows.at: no 64-bit division per row).
template <bool FUSED_DELTA = false>
RA_DEVICE TiledBwdRowTerms tiled_bwd_row_terms_at(const SmallSeqTiledParams& p,
                                                  const TiledSegment& s, const int hq0,
                                                  const TiledRowMap& rows, const int i) {
  int64_t j;
  int h;
  rows.at(i, j, h);
  return tiled_bwd_row_terms_of<FUSED_DELTA>(p, s, j, hq0 + h);
}

// The same for row r = j * group + h of a segment.
template <bool FUSED_DELTA = false>
RA_DEVICE TiledBwdRowTerms tiled_bwd_row_terms(const SmallSeqTiledParams& p,
                                               const TiledSegment& s, const int hq0,
                                               const int group, const int64_t r) {
  const int64_t j = r / group;
  return tiled_bwd_row_terms_of<FUSED_DELTA>(p, s, j, hq0 + (r - j * group));
}

// dq = 0 on the q padding rows of a THD call (rows before the first segment and after the last:
// tiled_padding_rows), for kernels that run without pass 1; `thread` of `threads` threads
// striding over the rows' 16-byte pieces. A BSHD call has no padding rows.
template <int D>
RA_DEVICE void tiled_bwd_zero_padding_dq(const SmallSeqTiledParams& p, const int64_t thread,
                                         const int64_t threads) {
  constexpr int kVecs = D / 8;
  const TiledPadding pad = tiled_padding_rows(p);
  const int64_t tail = p.total_q - pad.tail_begin;
  const int64_t per_row = static_cast<int64_t>(p.num_heads_q) * kVecs;
  const int64_t pieces = (pad.lead_end + tail) * per_row;
  for (int64_t i = thread; i < pieces; i += threads) {
    const int64_t k = i / per_row;
    const int64_t rest = i - k * per_row;
    const int64_t row = k < pad.lead_end ? k : pad.tail_begin + (k - pad.lead_end);
    const int64_t hq = rest / kVecs;
    uint16_t* dq = static_cast<uint16_t*>(p.dq) + row * p.dq_token_stride +
                   hq * p.dq_head_stride + 8 * (rest - hq * kVecs);
    ra_store16(dq, ra_vec8{{0u, 0u, 0u, 0u}});
  }
}

// ---------------------------------------------------------------------------------------------
// Pass 1: Delta = rowsum(dO * O) - dlse per (query row, q head), and dq = 0 on padding rows.
// ---------------------------------------------------------------------------------------------
template <typename T, int D>
__global__ void __launch_bounds__(kTiledBwdMaxThreadsPerBlock)
    small_seq_tiled_bwd_delta_kernel(const SmallSeqTiledParams p) {
  constexpr int WAVE = RA_WAVE_SIZE;
  constexpr int kVecs = D / 8;
  constexpr int LPR = kVecs < WAVE ? kVecs : WAVE;  // lanes per (row, head) pair
  constexpr int VPL = kVecs / LPR;
  constexpr int PPW = WAVE / LPR;  // pairs per wave step
  const int lane = threadIdx.x % WAVE;
  const int sub = lane / LPR;
  const int col_lane = lane % LPR;
  const int64_t pairs = tiled_bwd_delta_pairs(p);
  const int64_t stride = static_cast<int64_t>(gridDim.x) * (blockDim.x / WAVE) * PPW;
  const TiledPadding pad = tiled_padding_rows(p);
  int64_t base =
      (static_cast<int64_t>(blockIdx.x) * (blockDim.x / WAVE) + threadIdx.x / WAVE) * PPW;
  for (; base < pairs; base += stride) {
    // A lane group past the end computes on pair 0 and stores nothing (its lanes stay in the
    // wave's shuffles).
    const bool ok = base + sub < pairs;
    const int64_t pair = ok ? base + sub : 0;
    const int64_t row = pair / p.num_heads_q;
    const int64_t hq = pair - row * p.num_heads_q;
    // Row `row` of lse is (batch, token) (row / s_q, row % s_q) of a BSHD q, token row of THD.
    const int64_t bi = p.s_q > 0 ? row / p.s_q : 0;
    const int64_t tok = p.s_q > 0 ? row - bi * p.s_q : row;
    const uint16_t* o = static_cast<const uint16_t*>(p.out) + bi * p.out_batch_stride +
                        tok * p.out_token_stride + hq * p.out_head_stride;
    const uint16_t* g = static_cast<const uint16_t*>(p.dout) + bi * p.do_batch_stride +
                        tok * p.do_token_stride + hq * p.do_head_stride;
    float part = 0.f;
#pragma unroll
    for (int vi = 0; vi < VPL; ++vi) {
      float of[8], gf[8];
      ra_unpack8<T>(ra_load16(o + 8 * (col_lane + vi * LPR)), of);
      ra_unpack8<T>(ra_load16(g + 8 * (col_lane + vi * LPR)), gf);
#pragma unroll
      for (int e = 0; e < 8; ++e) part = fmaf(gf[e], of[e], part);
    }
    const float dot = ra_group_sum<LPR>(part);
    if (!ok) continue;
    const int64_t at = hq * p.lse_head_stride + row;
    if (col_lane == 0)
      p.workspace[at] = dot - (p.dlse != nullptr ? p.dlse[hq * p.dlse_head_stride + row] : 0.f);
    if (row < pad.lead_end || row >= pad.tail_begin) {
      uint16_t* dq = static_cast<uint16_t*>(p.dq) + bi * p.dq_batch_stride +
                     tok * p.dq_token_stride + hq * p.dq_head_stride;
#pragma unroll
      for (int vi = 0; vi < VPL; ++vi)
        ra_store16(dq + 8 * (col_lane + vi * LPR), ra_vec8{{0u, 0u, 0u, 0u}});
    }
  }
}

// ---------------------------------------------------------------------------------------------
// What a pass-2 item writes besides the gradient of a valid segment's keys.
// ---------------------------------------------------------------------------------------------

// Rows [r0, r1) of one kv head of dk and dv set to zero, the wave striding over them.
template <int D>
RA_DEVICE void tiled_bwd_zero_kv(const SmallSeqTiledParams& p, int64_t batch, int hk, int64_t r0,
                                 int64_t r1, int lane) {
  constexpr int kVecs = D / 8;
  if (r1 <= r0) return;
  uint16_t* dk = static_cast<uint16_t*>(p.dk) + batch * p.dk_batch_stride + hk * p.dk_head_stride;
  uint16_t* dv = static_cast<uint16_t*>(p.dv) + batch * p.dv_batch_stride + hk * p.dv_head_stride;
  for (int64_t idx = lane; idx < (r1 - r0) * kVecs; idx += RA_WAVE_SIZE) {
    const int64_t r = r0 + idx / kVecs;
    const int vec = static_cast<int>(idx % kVecs);
    ra_store16(dk + r * p.dk_token_stride + 8 * vec, ra_vec8{{0u, 0u, 0u, 0u}});
    ra_store16(dv + r * p.dv_token_stride + 8 * vec, ra_vec8{{0u, 0u, 0u, 0u}});
  }
}

// Done by item (key tile 0, slice 0) of each (segment, kv head): zeros for the THD kv rows before
// the first segment (segment 0) and from the end of the last (segment b - 1) and for BSHD rows
// past the segment's length; for a bad segment, zeros on its keys (THD: cu_seqlens_kv[seg] ..
// [seg + 1] clamped into k, when ordered; BSHD: all of its rows) and NaN on the dq of its rows
// (the rows the forward wrote NaN to). Returns whether the segment is valid.
template <typename T, int D>
RA_DEVICE bool tiled_bwd_edges(const SmallSeqTiledParams& p, const int seg, const int hk,
                               const TiledBounds& b, const TiledSegment& s, const int lane) {
  if (p.cu_seqlens_kv != nullptr) {
    if (seg == 0) tiled_bwd_zero_kv<D>(p, 0, hk, 0, tiled_kv_offset_clamped(p, 0), lane);
    if (seg == p.batch - 1)
      tiled_bwd_zero_kv<D>(p, 0, hk, tiled_kv_offset_clamped(p, p.batch), p.total_kv, lane);
    if (!s.valid)
      tiled_bwd_zero_kv<D>(p, 0, hk, tiled_clamp_row(b.k0, p.total_kv),
                           tiled_clamp_row(b.k1, p.total_kv), lane);
  } else {
    tiled_bwd_zero_kv<D>(p, seg, hk, s.valid ? s.nk : 0, p.s_kv, lane);
  }
  if (s.valid) return true;
  constexpr int kVecs = D / 8;
  const int group = p.num_heads_q / p.num_heads_kv;
  const int hq0 = hk * group;
  const uint32_t bits = ra_dtype<T>::from_float(tiled_nan());
  const uint32_t w = bits | (bits << 16);
  uint16_t* dq = static_cast<uint16_t*>(p.dq) + s.q_batch * p.dq_batch_stride;
  const int64_t rows = static_cast<int64_t>(s.nq) * group;
  for (int64_t idx = lane; idx < rows * kVecs; idx += RA_WAVE_SIZE) {
    const int64_t r = idx / kVecs;
    const int vec = static_cast<int>(idx % kVecs);
    const int64_t j = r / group;
    const int64_t h = r - j * group;
    ra_store16(dq + (s.q_token0 + j) * p.dq_token_stride + (hq0 + h) * p.dq_head_stride + 8 * vec,
               ra_vec8{{w, w, w, w}});
  }
  return false;
}

// Lane layout and 16-byte row helpers of the lane-group kernels (the passes without matrix
// units and the streaming backward, tiled_bwd_stream_kernel.h): a row of D values is D / 8
// vectors, kLpr lanes per row, kVpl vectors per lane, kRpp rows per wave at once.
template <int D>
struct TiledBwdScalarShape {
  static constexpr int kVecs = D / 8;
  static constexpr int kLpr = kVecs < RA_WAVE_SIZE ? kVecs : RA_WAVE_SIZE;
  static constexpr int kVpl = kVecs / kLpr;
  static constexpr int kRpp = RA_WAVE_SIZE / kLpr;
  static constexpr int kSlots = (kTiledBwdKeys + kRpp - 1) / kRpp;  // keys per lane group
};

template <typename T, int VPL>
RA_DEVICE void tiled_bwd_load_vecs(float (&x)[VPL][8], const uint16_t* row, int col_lane,
                                   int lpr, bool ok) {
#pragma unroll
  for (int vi = 0; vi < VPL; ++vi) {
    if (ok) {
      ra_unpack8<T>(ra_load16(row + 8 * (col_lane + vi * lpr)), x[vi]);
    } else {
#pragma unroll
      for (int e = 0; e < 8; ++e) x[vi][e] = 0.f;
    }
  }
}

template <typename T, int VPL>
RA_DEVICE void tiled_bwd_store_vecs(uint16_t* row, const float (&x)[VPL][8], float scale,
                                    int col_lane, int lpr) {
#pragma unroll
  for (int vi = 0; vi < VPL; ++vi) {
    float y[8];
#pragma unroll
    for (int e = 0; e < 8; ++e) y[e] = x[vi][e] * scale;
    ra_store16(row + 8 * (col_lane + vi * lpr), ra_pack8<T>(y));
  }
}

template <int VPL>
RA_DEVICE float tiled_bwd_dot(const float (&a)[VPL][8], const float (&b)[VPL][8]) {
  float d = 0.f;
#pragma unroll
  for (int vi = 0; vi < VPL; ++vi)
#pragma unroll
    for (int e = 0; e < 8; ++e) d = fmaf(a[vi][e], b[vi][e], d);
  return d;
}

#if RA_HAS_MMA

// Operand panels of 16 rows over the whole head dim in W-wide chunks.
template <int D, int W>
struct TiledBwdPanel {
  ra_mma_rows<W, 16> c[D / W];
};

template <int D, int W>
RA_DEVICE void tiled_bwd_load_panel(TiledBwdPanel<D, W>& x, const uint16_t* base,
                                    int64_t row_stride, int nrows, int lane) {
#pragma unroll
  for (int c = 0; c < D / W; ++c) ra_mma_load_rows(x.c[c], base + c * W, row_stride, nrows, lane);
}

// Two 16-row panels over the whole head dim (K and V, or Q and dO) are held in registers across
// a loop when they take at most 32 registers per lane (16 D / wave: d = 64 on 32-lane warps,
// d <= 128 on 64-lane waves); otherwise they are re-read per use (L1 hits). Holding them at
// d = 128 on sm_90 took the dK / dV kernel past 255 registers (spills).
template <int D>
constexpr bool kTiledBwdResident = 16 * D / RA_WAVE_SIZE <= 32;

// Pass 2 on matrix units: one valid (segment, kv head, key tile, slice).
template <typename T, int D>
RA_DEVICE void tiled_bwd_dkv_mma(const SmallSeqTiledParams& p, const int hk, const int kt,
                                 const int slice, const TiledSegment& s, const int lane) {
  constexpr int DS = tiled_bwd_slice(RA_WAVE_SIZE, D);
  constexpr int W = DS;  // chunk of the score products
  constexpr int E = ra_mma_acc<16>::kElems;
  constexpr bool kResident = kTiledBwdResident<D>;
  const int group = p.num_heads_q / p.num_heads_kv;
  const int hq0 = hk * group;
  const int64_t nrows_all = static_cast<int64_t>(s.nq) * group;
  const int k0 = kt * kTiledBwdKeys;
  const int nkt = s.nk - k0;  // keys of this tile (may exceed 16; <= 0 only for tile 0)
  const bool one_tile = s.nk <= kTiledBwdKeys;
  const float qscale = p.softmax_scale * kTiledBwdLog2e;
  const TiledBwdRows rw = tiled_bwd_rows(p, hk, s);
  const uint16_t* kt_base = rw.k + static_cast<int64_t>(k0) * p.k_token_stride;
  const uint16_t* vt_base = rw.v + static_cast<int64_t>(k0) * p.v_token_stride;

  TiledBwdPanel<D, kResident ? W : D> kp, vp;  // (unused unless resident)
  if constexpr (kResident) {
    tiled_bwd_load_panel(kp, kt_base, p.k_token_stride, nkt, lane);
    tiled_bwd_load_panel(vp, vt_base, p.v_token_stride, nkt, lane);
  }
  ra_mma_out<DS, 16> dk, dv;  // [key][slice column], fp32
  ra_mma_zero(dk);
  ra_mma_zero(dv);

  for (int64_t r0 = 0; r0 < nrows_all; r0 += kTiledBwdRows) {
    const int nrows =
        nrows_all - r0 < kTiledBwdRows ? static_cast<int>(nrows_all - r0) : kTiledBwdRows;
    const TiledRowMap rows(r0, group);
    auto q_row = [&](int i) {
      int64_t j;
      int h;
      rows.at(i, j, h);
      return rw.q + (s.q_token0 + j) * p.q_token_stride + (hq0 + h) * p.q_head_stride;
    };
    auto do_row = [&](int i) {
      int64_t j;
      int h;
      rows.at(i, j, h);
      return rw.dout + (s.q_token0 + j) * p.do_token_stride + (hq0 + h) * p.do_head_stride;
    };
    // Scores with keys as rows (S^T, dP^T) and, for one-tile segments, with rows as rows.
    ra_mma_acc<16> st, dpt, sc, dp;
    ra_mma_zero(st);
    ra_mma_zero(dpt);
    ra_mma_zero(sc);
    ra_mma_zero(dp);
    auto chunk = [&](const int c, const ra_mma_rows<W, 16>& kc, const ra_mma_rows<W, 16>& vc) {
      ra_mma_rows<W, 16> qr, dr;
      ra_mma_load_rows_at(qr, [&](int i) { return q_row(i) + c * W; }, nrows, lane);
      ra_mma_load_rows_at(dr, [&](int i) { return do_row(i) + c * W; }, nrows, lane);
      ra_mma_dot<T>(st, kc, qr);
      ra_mma_dot<T>(dpt, vc, dr);
      if (one_tile) {
        ra_mma_dot<T>(sc, qr, kc);
        ra_mma_dot<T>(dp, dr, vc);
      }
    };
    if constexpr (kResident) {
#pragma unroll
      for (int c = 0; c < D / W; ++c) chunk(c, kp.c[c], vp.c[c]);
    } else {
      // One chunk's operands live at a time (an unrolled loop let the compiler hoist every
      // chunk's loads: past 255 registers on sm_90).
#pragma unroll 1
      for (int c = 0; c < D / W; ++c) {
        ra_mma_rows<W, 16> kc, vc;
        ra_mma_load_rows(kc, kt_base + c * W, p.k_token_stride, nkt, lane);
        ra_mma_load_rows(vc, vt_base + c * W, p.v_token_stride, nkt, lane);
        chunk(c, kc, vc);
      }
    }
    // P^T and dS^T: element (key, row) with the row's LSE and Delta.
#pragma unroll
    for (int i = 0; i < E; ++i) {
      const int key = ra_mma_acc_row(lane, i);
      const int col = ra_mma_acc_col(lane, i);
      const bool live = key < nkt && col < nrows;
      const TiledBwdRowTerms t =
          col < nrows ? tiled_bwd_row_terms_at(p, s, hq0, rows, col)
                      : TiledBwdRowTerms{0.f, 0.f};
      const float pr = live ? exp2f(st.x[i] * qscale - t.lse2) : 0.f;
      st.x[i] = pr;
      dpt.x[i] = pr * (dpt.x[i] - t.delta);
    }
    const ra_mma_pfrag<16> pt_f = ra_mma_to_pfrag<T, 16>(st);
    const ra_mma_pfrag<16> dst_f = ra_mma_to_pfrag<T, 16>(dpt);
    {
      ra_mma_vrows<DS, 16> dov;
      ra_mma_load_vrows_at(dov, [&](int i) { return do_row(i) + slice * DS; }, nrows, lane);
      ra_mma_pv<T>(dv, pt_f, dov);
    }
    {
      ra_mma_vrows<DS, 16> qv;
      ra_mma_load_vrows_at(qv, [&](int i) { return q_row(i) + slice * DS; }, nrows, lane);
      ra_mma_pv<T>(dk, dst_f, qv);
    }
    if (one_tile) {
      // dS with rows as rows; every key of the segment is in this tile, so dQ is complete.
#pragma unroll
      for (int i = 0; i < E; ++i) {
        const int row = ra_mma_acc_row(lane, i);
        const int key = ra_mma_acc_col(lane, i);
        const bool live = key < nkt && row < nrows;
        const TiledBwdRowTerms t =
            row < nrows ? tiled_bwd_row_terms_at(p, s, hq0, rows, row)
                        : TiledBwdRowTerms{0.f, 0.f};
        const float pr = live ? exp2f(sc.x[i] * qscale - t.lse2) : 0.f;
        sc.x[i] = pr * (dp.x[i] - t.delta);
      }
      const ra_mma_pfrag<16> ds_f = ra_mma_to_pfrag<T, 16>(sc);
      // K's slice as the right operand of dQ = dS K, re-read per row tile (L1 hits): held
      // across the loop it cost 16 registers of a kernel at the sm_90 limit.
      ra_mma_vrows<DS, 16> kslice;
      ra_mma_load_vrows(kslice, kt_base + slice * DS, p.k_token_stride, nkt, lane);
      ra_mma_out<DS, 16> dq;
      ra_mma_zero(dq);
      ra_mma_pv<T>(dq, ds_f, kslice);
#pragma unroll
      for (int i = 0; i < DS / 16; ++i)
#pragma unroll
        for (int e = 0; e < static_cast<int>(sizeof(dq.x[0]) / sizeof(float)); ++e)
          dq.x[i][e] *= p.softmax_scale;
      auto dq_row = [&](int i) {
        int64_t j;
        int h;
        rows.at(i, j, h);
        return rw.dq + (s.q_token0 + j) * p.dq_token_stride + (hq0 + h) * p.dq_head_stride +
               slice * DS;
      };
      ra_mma_store_rows_at<T>(dq, dq_row, nrows, lane);
    }
  }
  if (nkt <= 0) return;
#pragma unroll
  for (int i = 0; i < DS / 16; ++i)
#pragma unroll
    for (int e = 0; e < static_cast<int>(sizeof(dk.x[0]) / sizeof(float)); ++e)
      dk.x[i][e] *= p.softmax_scale;
  ra_mma_store_rows<T>(dv, rw.dv + static_cast<int64_t>(k0) * p.dv_token_stride + slice * DS,
                       p.dv_token_stride, nkt, lane);
  ra_mma_store_rows<T>(dk, rw.dk + static_cast<int64_t>(k0) * p.dk_token_stride + slice * DS,
                       p.dk_token_stride, nkt, lane);
}

// Pass 2 on matrix units for a segment whose rows fit one row tile: one item per (kv head,
// slice) walks all key tiles with the tile's Q and dO. Per key tile, dV and dK of its keys are
// complete (every row is in this tile) and stored at once; dQ accumulates over the key tiles in
// fp32 and is stored at the end. K/V are read once for all three gradients (no pass 3).
//
// FUSED_DELTA (launched without pass 1, only where every history fits one key tile: host bound
// max_seqlen_kv <= kTiledBwdKeys, which the segment checks hold every valid segment to): each
// row's Delta = rowsum(P dP) - dlse from that tile's P^T and dP^T (column sums of the
// accumulators). Every slice item of a (segment, kv head) computes the same sums: no
// communication between waves. Longer histories take Delta from pass 1: a first sweep of the
// score products over the key tiles measured 1.15-1.38x slower forward+backward there.
template <typename T, int D, bool FUSED_DELTA = false>
RA_DEVICE void tiled_bwd_row_tile_mma(const SmallSeqTiledParams& p, const int hk,
                                      const int slice, const TiledSegment& s, const int lane) {
  constexpr int DS = tiled_bwd_slice(RA_WAVE_SIZE, D);
  constexpr int W = DS;
  constexpr int E = ra_mma_acc<16>::kElems;
  constexpr bool kResident = kTiledBwdResident<D> && RA_WAVE_SIZE == 64;
  constexpr int KT = kTiledBwdKeys;
  const int group = p.num_heads_q / p.num_heads_kv;
  const int hq0 = hk * group;
  const int nrows = s.nq * group;  // <= kTiledBwdRows (the caller checks)
  const int nk = s.nk;
  const float qscale = p.softmax_scale * kTiledBwdLog2e;
  const TiledBwdRows rw = tiled_bwd_rows(p, hk, s);
  // Row addresses are recomputed inside the key loop (holding them costs registers): the
  // query index by a multiply, not a division (rows < 16).
  const TiledSmallRowSplit split(group);
  auto q_row = [&](int i) {
    const int j = split.query(i);
    return rw.q + (s.q_token0 + j) * p.q_token_stride + (hq0 + (i - j * group)) * p.q_head_stride;
  };
  auto do_row = [&](int i) {
    const int j = split.query(i);
    return rw.dout + (s.q_token0 + j) * p.do_token_stride +
           (hq0 + (i - j * group)) * p.do_head_stride;
  };
  TiledBwdPanel<D, kResident ? W : D> qp, gp;  // (unused unless resident)
  if constexpr (kResident) {
#pragma unroll
    for (int c = 0; c < D / W; ++c) {
      ra_mma_load_rows_at(qp.c[c], [&](int i) { return q_row(i) + c * W; }, nrows, lane);
      ra_mma_load_rows_at(gp.c[c], [&](int i) { return do_row(i) + c * W; }, nrows, lane);
    }
  }
  // The LSE (log2 domain) and Delta of the rows of this lane's accumulator elements (keys as
  // rows, so its columns are rows of the tile): the same for every key tile, so read once here
  // rather than per key tile behind the previous tile's stores. With FUSED_DELTA, -dlse, to
  // which the column sums of P^T dP^T are added below.
  TiledBwdRowTerms col_terms[E];
#pragma unroll
  for (int i = 0; i < E; ++i) {
    const int col = ra_mma_acc_col(lane, i);
    if (col >= nrows)
      col_terms[i] = TiledBwdRowTerms{0.f, 0.f};
    else
      col_terms[i] = tiled_bwd_row_terms<FUSED_DELTA>(p, s, hq0, group, col);
  }
  // S^T = K Q^T and dP^T = V dO^T of the key tile at k0 (nkt keys from it) over the whole head
  // dim.
  auto scores = [&](const int k0, ra_mma_acc<16>& st, ra_mma_acc<16>& dpt) {
    const uint16_t* kb = rw.k + static_cast<int64_t>(k0) * p.k_token_stride;
    const uint16_t* vb = rw.v + static_cast<int64_t>(k0) * p.v_token_stride;
    const int nkt = nk - k0;
    ra_mma_zero(st);
    ra_mma_zero(dpt);
    if constexpr (kResident) {
#pragma unroll
      for (int c = 0; c < D / W; ++c) {
        ra_mma_rows<W, 16> kc, vc;
        ra_mma_load_rows(kc, kb + c * W, p.k_token_stride, nkt, lane);
        ra_mma_load_rows(vc, vb + c * W, p.v_token_stride, nkt, lane);
        ra_mma_dot<T>(st, kc, qp.c[c]);
        ra_mma_dot<T>(dpt, vc, gp.c[c]);
      }
    } else {
#pragma unroll 1
      for (int c = 0; c < D / W; ++c) {
        ra_mma_rows<W, 16> qc, gc, kc, vc;
        ra_mma_load_rows_at(qc, [&](int i) { return q_row(i) + c * W; }, nrows, lane);
        ra_mma_load_rows_at(gc, [&](int i) { return do_row(i) + c * W; }, nrows, lane);
        ra_mma_load_rows(kc, kb + c * W, p.k_token_stride, nkt, lane);
        ra_mma_load_rows(vc, vb + c * W, p.v_token_stride, nkt, lane);
        ra_mma_dot<T>(st, kc, qc);
        ra_mma_dot<T>(dpt, vc, gc);
      }
    }
  };
  // P^T in place of S^T: exp2(S scale log2e - lse log2e), exactly 0 past the tile's keys and
  // the segment's rows.
  auto probs = [&](const int nkt, ra_mma_acc<16>& st) {
#pragma unroll
    for (int i = 0; i < E; ++i) {
      const bool live = ra_mma_acc_row(lane, i) < nkt && ra_mma_acc_col(lane, i) < nrows;
      st.x[i] = live ? exp2f(st.x[i] * qscale - col_terms[i].lse2) : 0.f;
    }
  };
  // sum += P^T dP^T per element, 0 where P is 0 (selected, not multiplied: the dP of a key
  // past the tile or a row past the segment never enters a sum, even when dO is non-finite).
  auto add_products = [&](ra_mma_acc<16>& sum, const ra_mma_acc<16>& pt,
                          const ra_mma_acc<16>& dpt) {
#pragma unroll
    for (int i = 0; i < E; ++i) sum.x[i] += pt.x[i] != 0.f ? pt.x[i] * dpt.x[i] : 0.f;
  };
  // Delta += the column sums of `sum` across the lanes that hold a column's keys
  // (ra_mma_col_sum): element i gets its column's total. A column past the segment's rows sums
  // zeros and keeps Delta 0.
  auto add_delta = [&](const ra_mma_acc<16>& sum) {
    const ra_mma_acc<16> tot = ra_mma_col_sum(sum);
#pragma unroll
    for (int i = 0; i < E; ++i) col_terms[i].delta += tot.x[i];
  };
  ra_mma_out<DS, 16> dq;
  ra_mma_zero(dq);
  for (int k0 = 0; k0 < nk; k0 += KT) {
    const uint16_t* kb = rw.k + static_cast<int64_t>(k0) * p.k_token_stride;
    const int nkt = nk - k0;
    ra_mma_acc<16> st, dpt;
    scores(k0, st, dpt);
    // P^T and dS^T (keys as rows), with each row's LSE and Delta; dS (rows as rows) for dQ is
    // dS^T transposed across lanes (one product fewer for each of S and dP).
    probs(nkt, st);
    if constexpr (FUSED_DELTA) {  // the only key tile: Delta from its own products
      ra_mma_acc<16> sum;
      ra_mma_zero(sum);
      add_products(sum, st, dpt);
      add_delta(sum);
    }
#pragma unroll
    for (int i = 0; i < E; ++i) dpt.x[i] = st.x[i] * (dpt.x[i] - col_terms[i].delta);
    const ra_mma_pfrag<16> pt_f = ra_mma_to_pfrag<T, 16>(st);
    const ra_mma_pfrag<16> dst_f = ra_mma_to_pfrag<T, 16>(dpt);
    const ra_mma_pfrag<16> ds_f = ra_mma_to_pfrag_transposed<T>(dpt, lane);
    {
      ra_mma_vrows<DS, 16> dov;
      ra_mma_load_vrows_at(dov, [&](int i) { return do_row(i) + slice * DS; }, nrows, lane);
      ra_mma_out<DS, 16> dv;
      ra_mma_zero(dv);
      ra_mma_pv<T>(dv, pt_f, dov);
      ra_mma_store_rows<T>(dv, rw.dv + static_cast<int64_t>(k0) * p.dv_token_stride + slice * DS,
                           p.dv_token_stride, nkt, lane);
    }
    {
      ra_mma_vrows<DS, 16> qv;
      ra_mma_load_vrows_at(qv, [&](int i) { return q_row(i) + slice * DS; }, nrows, lane);
      ra_mma_out<DS, 16> dk;
      ra_mma_zero(dk);
      ra_mma_pv<T>(dk, dst_f, qv);
#pragma unroll
      for (int i = 0; i < DS / 16; ++i)
#pragma unroll
        for (int e = 0; e < static_cast<int>(sizeof(dk.x[0]) / sizeof(float)); ++e)
          dk.x[i][e] *= p.softmax_scale;
      ra_mma_store_rows<T>(dk, rw.dk + static_cast<int64_t>(k0) * p.dk_token_stride + slice * DS,
                           p.dk_token_stride, nkt, lane);
    }
    {
      ra_mma_vrows<DS, 16> kslice;
      ra_mma_load_vrows(kslice, kb + slice * DS, p.k_token_stride, nkt, lane);
      ra_mma_pv<T>(dq, ds_f, kslice);
    }
  }
#pragma unroll
  for (int i = 0; i < DS / 16; ++i)
#pragma unroll
    for (int e = 0; e < static_cast<int>(sizeof(dq.x[0]) / sizeof(float)); ++e)
      dq.x[i][e] *= p.softmax_scale;
  auto dq_row = [&](int i) {
    const int j = split.query(i);
    return rw.dq + (s.q_token0 + j) * p.dq_token_stride +
           (hq0 + (i - j * group)) * p.dq_head_stride + slice * DS;
  };
  ra_mma_store_rows_at<T>(dq, dq_row, nrows, lane);
}

#else  // !RA_HAS_MMA

// LSE (log2 domain) and Delta of row r = j group + (hq - hq0) of a segment, for the scalar
// passes below, whose lane group holds the row's dO (gf). FUSED_DELTA (launched without pass
// 1): Delta = rowsum(dO O) - dlse from the row's out, the dot pass 1 computes in the same lane
// layout and order (so the same bits): a sum of P dP here would need a sweep over every key of
// the history per row and key tile.
template <typename T, int D, bool FUSED_DELTA, int VPL = TiledBwdScalarShape<D>::kVpl>
RA_DEVICE TiledBwdRowTerms tiled_bwd_row_terms_scalar(const SmallSeqTiledParams& p,
                                                      const TiledSegment& s, const int hq0,
                                                      const int group, const int64_t r,
                                                      const int64_t j, const int64_t hq,
                                                      const float (&gf)[VPL][8],
                                                      const int col_lane) {
  if constexpr (FUSED_DELTA) {
    using Sh = TiledBwdScalarShape<D>;
    static_assert(VPL == Sh::kVpl, "dO as the scalar passes hold it");
    float of[Sh::kVpl][8];
    tiled_bwd_load_vecs<T, Sh::kVpl>(
        of, static_cast<const uint16_t*>(p.out) + s.q_batch * p.out_batch_stride +
                (s.q_token0 + j) * p.out_token_stride + hq * p.out_head_stride,
        col_lane, Sh::kLpr, true);
    TiledBwdRowTerms t = tiled_bwd_row_terms<true>(p, s, hq0, group, r);
    t.delta += ra_group_sum<Sh::kLpr>(tiled_bwd_dot<Sh::kVpl>(gf, of));
    return t;
  } else {
    return tiled_bwd_row_terms(p, s, hq0, group, r);
  }
}

// Targets without matrix units (and the 32-lane CPU emulation): one row of D values spans LPR
// lanes; the wave holds RPP keys at once. Slice 0 does the whole head dim (items of the other
// slices return).
template <typename T, int D, bool FUSED_DELTA = false>
RA_DEVICE void tiled_bwd_dkv_scalar(const SmallSeqTiledParams& p, const int hk, const int kt,
                                    const int slice, const TiledSegment& s, const int lane) {
  using Sh = TiledBwdScalarShape<D>;
  constexpr int VPL = Sh::kVpl;
  constexpr int LPR = Sh::kLpr;
  constexpr int RPP = Sh::kRpp;
  constexpr int SL = Sh::kSlots;
  constexpr int WAVE = RA_WAVE_SIZE;
  if (slice != 0) return;
  const int row_group = lane / LPR;
  const int col_lane = lane % LPR;
  const int group = p.num_heads_q / p.num_heads_kv;
  const int hq0 = hk * group;
  const int64_t nrows_all = static_cast<int64_t>(s.nq) * group;
  const int k0 = kt * kTiledBwdKeys;
  const int nkt = s.nk - k0 < kTiledBwdKeys ? s.nk - k0 : kTiledBwdKeys;
  const bool one_tile = s.nk <= kTiledBwdKeys;
  const float qscale = p.softmax_scale * kTiledBwdLog2e;
  const TiledBwdRows rw = tiled_bwd_rows(p, hk, s);

  // Key k0 + slot * RPP + row_group of this lane group.
  float kf[SL][VPL][8], vf[SL][VPL][8], dk[SL][VPL][8], dv[SL][VPL][8];
#pragma unroll
  for (int sl = 0; sl < SL; ++sl) {
    const int key = sl * RPP + row_group;
    const bool ok = key < nkt;
    const int64_t at = k0 + (ok ? key : 0);
    tiled_bwd_load_vecs<T, VPL>(kf[sl], rw.k + at * p.k_token_stride, col_lane, LPR, ok);
    tiled_bwd_load_vecs<T, VPL>(vf[sl], rw.v + at * p.v_token_stride, col_lane, LPR, ok);
#pragma unroll
    for (int vi = 0; vi < VPL; ++vi)
#pragma unroll
      for (int e = 0; e < 8; ++e) dk[sl][vi][e] = dv[sl][vi][e] = 0.f;
  }
  for (int64_t r = 0; r < nrows_all; ++r) {
    const int64_t j = r / group;
    const int64_t hq = hq0 + (r - j * group);
    float qf[VPL][8], gf[VPL][8], dq[VPL][8];
    tiled_bwd_load_vecs<T, VPL>(
        qf, rw.q + (s.q_token0 + j) * p.q_token_stride + hq * p.q_head_stride, col_lane, LPR, true);
    tiled_bwd_load_vecs<T, VPL>(gf, rw.dout + (s.q_token0 + j) * p.do_token_stride +
                                        hq * p.do_head_stride,
                                col_lane, LPR, true);
    const TiledBwdRowTerms t =
        tiled_bwd_row_terms_scalar<T, D, FUSED_DELTA>(p, s, hq0, group, r, j, hq, gf, col_lane);
#pragma unroll
    for (int vi = 0; vi < VPL; ++vi)
#pragma unroll
      for (int e = 0; e < 8; ++e) dq[vi][e] = 0.f;
#pragma unroll
    for (int sl = 0; sl < SL; ++sl) {
      const bool live = sl * RPP + row_group < nkt;
      const float sc = ra_group_sum<LPR>(tiled_bwd_dot<VPL>(qf, kf[sl])) * qscale;
      const float dpv = ra_group_sum<LPR>(tiled_bwd_dot<VPL>(gf, vf[sl]));
      const float pr = live ? exp2f(sc - t.lse2) : 0.f;
      const float ds = pr * (dpv - t.delta);
#pragma unroll
      for (int vi = 0; vi < VPL; ++vi)
#pragma unroll
        for (int e = 0; e < 8; ++e) {
          dv[sl][vi][e] = fmaf(pr, gf[vi][e], dv[sl][vi][e]);
          dk[sl][vi][e] = fmaf(ds, qf[vi][e], dk[sl][vi][e]);
          dq[vi][e] = fmaf(ds, kf[sl][vi][e], dq[vi][e]);
        }
    }
    if (one_tile) {
#pragma unroll
      for (int vi = 0; vi < VPL; ++vi)
#pragma unroll
        for (int e = 0; e < 8; ++e) dq[vi][e] = ra_strided_sum<LPR, WAVE>(dq[vi][e]);
      if (row_group == 0)
        tiled_bwd_store_vecs<T, VPL>(rw.dq + (s.q_token0 + j) * p.dq_token_stride +
                                         hq * p.dq_head_stride,
                                     dq, p.softmax_scale, col_lane, LPR);
    }
  }
#pragma unroll
  for (int sl = 0; sl < SL; ++sl) {
    const int key = sl * RPP + row_group;
    if (key >= nkt) continue;
    tiled_bwd_store_vecs<T, VPL>(rw.dk + static_cast<int64_t>(k0 + key) * p.dk_token_stride, dk[sl],
                                 p.softmax_scale, col_lane, LPR);
    tiled_bwd_store_vecs<T, VPL>(rw.dv + static_cast<int64_t>(k0 + key) * p.dv_token_stride, dv[sl],
                                 1.f, col_lane, LPR);
  }
}

template <typename T, int D, bool FUSED_DELTA = false>
RA_DEVICE void tiled_bwd_dq_scalar(const SmallSeqTiledParams& p, const int hk, const int64_t rt,
                                   const int slice, const TiledSegment& s, const int lane) {
  using Sh = TiledBwdScalarShape<D>;
  constexpr int VPL = Sh::kVpl;
  constexpr int LPR = Sh::kLpr;
  constexpr int RPP = Sh::kRpp;
  constexpr int WAVE = RA_WAVE_SIZE;
  if (slice != 0) return;
  const int row_group = lane / LPR;
  const int col_lane = lane % LPR;
  const int group = p.num_heads_q / p.num_heads_kv;
  const int hq0 = hk * group;
  const int64_t r0 = rt * kTiledBwdRows;
  const int64_t left = static_cast<int64_t>(s.nq) * group - r0;
  const int nrows = left < kTiledBwdRows ? static_cast<int>(left) : kTiledBwdRows;
  const float qscale = p.softmax_scale * kTiledBwdLog2e;
  const TiledBwdRows rw = tiled_bwd_rows(p, hk, s);
  for (int i = 0; i < nrows; ++i) {
    const int64_t r = r0 + i;
    const int64_t j = r / group;
    const int64_t hq = hq0 + (r - j * group);
    float qf[VPL][8], gf[VPL][8], dq[VPL][8];
    tiled_bwd_load_vecs<T, VPL>(
        qf, rw.q + (s.q_token0 + j) * p.q_token_stride + hq * p.q_head_stride, col_lane, LPR, true);
    tiled_bwd_load_vecs<T, VPL>(gf, rw.dout + (s.q_token0 + j) * p.do_token_stride +
                                        hq * p.do_head_stride,
                                col_lane, LPR, true);
    const TiledBwdRowTerms t =
        tiled_bwd_row_terms_scalar<T, D, FUSED_DELTA>(p, s, hq0, group, r, j, hq, gf, col_lane);
#pragma unroll
    for (int vi = 0; vi < VPL; ++vi)
#pragma unroll
      for (int e = 0; e < 8; ++e) dq[vi][e] = 0.f;
    for (int base = 0; base < s.nk; base += RPP) {
      const int key = base + row_group;
      const bool live = key < s.nk;
      float kf[VPL][8], vf[VPL][8];
      const int64_t at = live ? key : 0;
      tiled_bwd_load_vecs<T, VPL>(kf, rw.k + at * p.k_token_stride, col_lane, LPR, live);
      tiled_bwd_load_vecs<T, VPL>(vf, rw.v + at * p.v_token_stride, col_lane, LPR, live);
      const float sc = ra_group_sum<LPR>(tiled_bwd_dot<VPL>(qf, kf)) * qscale;
      const float dpv = ra_group_sum<LPR>(tiled_bwd_dot<VPL>(gf, vf));
      const float pr = live ? exp2f(sc - t.lse2) : 0.f;
      const float ds = pr * (dpv - t.delta);
#pragma unroll
      for (int vi = 0; vi < VPL; ++vi)
#pragma unroll
        for (int e = 0; e < 8; ++e) dq[vi][e] = fmaf(ds, kf[vi][e], dq[vi][e]);
    }
#pragma unroll
    for (int vi = 0; vi < VPL; ++vi)
#pragma unroll
      for (int e = 0; e < 8; ++e) dq[vi][e] = ra_strided_sum<LPR, WAVE>(dq[vi][e]);
    if (row_group == 0)
      tiled_bwd_store_vecs<T, VPL>(rw.dq + (s.q_token0 + j) * p.dq_token_stride +
                                       hq * p.dq_head_stride,
                                   dq, p.softmax_scale, col_lane, LPR);
  }
}

#endif  // RA_HAS_MMA

// One (segment, kv head, slice) of a valid segment whose rows fit one row tile: dK / dV of all
// its keys and the slice of dQ of its rows (tiled_bwd_row_tile_mma; without matrix units every
// key tile's dK / dV, then dQ over all keys as pass 3 computes it). FUSED_DELTA: launched
// without pass 1, each row's Delta computed by the item (tiled_bwd_row_tile_mma; the scalar
// path: tiled_bwd_row_terms_scalar).
template <typename T, int D, bool FUSED_DELTA>
RA_DEVICE void tiled_bwd_row_tile_item(const SmallSeqTiledParams& p, const int hk,
                                       const int slice, const TiledSegment& s, const int lane) {
#if RA_HAS_MMA
  tiled_bwd_row_tile_mma<T, D, FUSED_DELTA>(p, hk, slice, s, lane);
#else
  for (int t = 0; t * kTiledBwdKeys < s.nk; ++t)
    tiled_bwd_dkv_scalar<T, D, FUSED_DELTA>(p, hk, t, slice, s, lane);
  if (s.nk > kTiledBwdKeys) tiled_bwd_dq_scalar<T, D, FUSED_DELTA>(p, hk, 0, slice, s, lane);
  if (s.nk == 0) tiled_bwd_dkv_scalar<T, D, FUSED_DELTA>(p, hk, 0, slice, s, lane);  // dq = 0
#endif
}

// Pass 2: grid-stride over (segment, kv head, key tile, slice) items, segment-major so the key
// tiles of one segment run at once on neighbouring waves (their shared Q / dO rows come from L2).
// ROW_TILE_CALL: the host bound puts every segment's rows in one row tile (max_seqlen_q x group
// <= kTiledBwdRows; the launcher's one-row-tile instance, docs/kernels.md#one-row-tile-backward):
// only the one-row-tile item is compiled, so the kernel takes that item's registers (220 on
// sm_90 at d = 128, against 246 with the general item beside it). FUSED_DELTA (ROW_TILE_CALL
// only; the plan's choice where every history fits one key tile): launched without pass 1, the
// items compute each row's Delta themselves and the kernel zeroes the dq of q padding rows,
// grid-strided after its items.
template <typename T, int D, bool ROW_TILE_CALL = false, bool FUSED_DELTA = false>
__global__ void __launch_bounds__(kTiledBwdMaxThreadsPerBlock)
    small_seq_tiled_bwd_dkv_kernel(const SmallSeqTiledParams p) {
  static_assert(ROW_TILE_CALL || !FUSED_DELTA,
                "Delta in the item needs every key of its rows: the one-row-tile item");
  constexpr int WAVE = RA_WAVE_SIZE;
  constexpr int SLICES = tiled_bwd_slices(WAVE, D);
  const int lane = threadIdx.x % WAVE;
  const int waves = blockDim.x / WAVE;
  const int64_t tiles = ROW_TILE_CALL ? 1 : tiled_bwd_item_key_tiles(p);
  const int64_t per_hk = tiles * SLICES;
  const int64_t per_seg = per_hk * p.num_heads_kv;
  const int64_t items = static_cast<int64_t>(p.batch) * per_seg;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * waves;
  for (int64_t item = static_cast<int64_t>(blockIdx.x) * waves + threadIdx.x / WAVE; item < items;
       item += stride) {
    const int seg = static_cast<int>(item / per_seg);
    int64_t rest = item - seg * per_seg;
    const int hk = static_cast<int>(rest / per_hk);
    rest -= hk * per_hk;
    const int kt = static_cast<int>(rest / SLICES);
    const int slice = static_cast<int>(rest - static_cast<int64_t>(kt) * SLICES);
    const TiledBounds b = tiled_fetch_bounds(p, seg);
    const TiledSegment s = tiled_resolve_segment(p, seg, b);
    if (kt == 0 && slice == 0) {
      if (!tiled_bwd_edges<T, D>(p, seg, hk, b, s, lane)) continue;
    } else if (!s.valid) {
      continue;
    }
    // Tile 0 always runs (it writes dQ of a segment without keys: zeros); later tiles only
    // where the segment has keys and more than one row tile.
    const bool one_row_tile = ROW_TILE_CALL || tiled_bwd_one_row_tile(p, s);
    if (kt > 0 && (one_row_tile || static_cast<int64_t>(kt) * kTiledBwdKeys >= s.nk)) continue;
    if (one_row_tile) {
      tiled_bwd_row_tile_item<T, D, FUSED_DELTA>(p, hk, slice, s, lane);
    } else if constexpr (!ROW_TILE_CALL) {
#if RA_HAS_MMA
      tiled_bwd_dkv_mma<T, D>(p, hk, kt, slice, s, lane);
#else
      tiled_bwd_dkv_scalar<T, D>(p, hk, kt, slice, s, lane);
#endif
    }
  }
  if constexpr (FUSED_DELTA)
    tiled_bwd_zero_padding_dq<D>(p, static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x,
                                 static_cast<int64_t>(gridDim.x) * blockDim.x);
}

}  // namespace small_seq
