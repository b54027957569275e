// Tiled small-seq attention forward: any number of queries per segment, keys streamed in tiles
// with an online softmax (docs/kernels.md#tiled-small-seq-kernels).
//
// Work item = (segment, kv head, group of kTiledRowTilesPerItem row tiles). The rows of a
// (segment, kv head) are the pairs (query j, q head h of the kv head's GQA group), numbered
// r = j * group + h, and cut into tiles of tiled_rows_for_wave rows (16 on CDNA, 8 on NVIDIA:
// the narrowest accumulator tile, which halves the registers of Q and O there); the item's wave
// computes its row tiles one after the other, each over all keys:
//   for each key tile (kTiledKeys keys):
//     S = Q . K^T              (ra_mma_dot: rows x 16 keys, fp32)
//     online softmax on S     (fp32 running max / sum per row, log2 domain)
//     O = O * alpha + P . V    (ra_mma_pv: P rounded to the input dtype, fp32 accumulators)
// K/V reuse across a segment's queries:
// - A segment of at most kTiledKeys keys (one key tile) loads its K and V into registers once
//   per item and serves all of the item's row tiles from them (many candidates over a short
//   history: K/V leave L2 once per kTiledRowTilesPerItem row tiles).
// - Many query rows over longer segments (d <= 128) take the block kernel at the end of this
//   file: a block's waves share each key tile through shared memory.
// - Otherwise longer segments stream their key tiles once per row tile; the item's next row
//   tile finds them in L1 / L2. Items are numbered segment-major, then kv head, then row-tile
//   group, so the groups of one (segment, kv head) run at the same time on neighbouring waves
//   of the grid-stride loop: the first wave to touch a K/V tile brings it from DRAM, the others
//   read it from L2.
// Each segment's K/V crosses DRAM once for all of its queries; q and out move once.
// Pipelining: the next key tile's K and the current tile's V are loaded before the current
// tile's products, so one tile of K and one of V are in flight while a wave computes (the q=1
// long-history case is a stream of K/V and must keep the memory system busy).
//
// Numerics (NOTE), as in fwd_mma_kernel.h:
// - S is the exact-input product q . k accumulated in fp32 and scaled afterwards in fp32 (q is
//   not pre-multiplied by the softmax scale: rounding q * scale to 16 bits would put a ~2^-9
//   relative error on every score).
// - The reference max m and sum l are fp32 in the log2 domain; P = exp2(s - m) is rounded to
//   the input dtype for the P.V product (flash-attention's choice), O and l stay fp32, and O / l
//   is rounded once at the end. LSE = (m + log2 l) * ln 2 from the fp32 values.
// - m is not the exact running max: it is set by a row's first key tile and moves (rescaling l
//   and O by exp2(m_old - m_new)) only when a later tile's max exceeds it by more than
//   kTiledLazyRescaleLog2, so P may reach 2^8 (exact in every 16-bit format's range; its
//   relative rounding is the same at any scale). The O rescale, a multiply per accumulator,
//   is then skipped by the whole wave on most tiles. O / l and m + log2 l do not depend on
//   which reference was used.
// - Each row's maximum logit (p.row_max, return_max_logit): the ROW_MAX instances keep m lazy
//   and carry the row's exact running maximum apart (one fmax per row and key step, from the
//   step's max that the softmax forms anyway), so O and l are rescaled exactly as without it.
//   The other instances, given p.row_max, set the threshold to 0 so that m ends exact (one
//   rescale per new maximum): the plan gives them row_max only where a history is one key
//   step (the one-tile instance), which never rescales.
// - Keys past the segment's length are never read: their K/V rows are exact zeros and their
//   scores -inf, so they contribute exactly 0 (never 0 * garbage).
// - return_softmax: a second pass over the key tiles recomputes S (the same products, so the
//   same values) and writes exp2(s - lse2) once the row's LSE is known; zero past the length.
#pragma once

#include "tiled_segment.h"
#include "tiled_smem.h"

namespace small_seq {

// Two waves per block (64 threads on NVIDIA, 128 on CDNA), as the q=1 kernels: the waves are
// independent, and small blocks let the last register-limited wave slots of a multiprocessor
// fill.
constexpr int kTiledWavesPerBlock = 2;
constexpr int kTiledMaxThreadsPerBlock = 128;
// Grid = this many times the blocks resident at once (tuning small_seq_tiled_fwd_grid
// overrides); the grid-stride loop then re-uses resident waves, as the q=1 forward does.
constexpr int kTiledFwdResidencyFactor = 4;
// The wave kernel's one-tile instance (histories of at most one key tile, d <= 128) declares
// this many resident blocks of kTiledMaxThreadsPerBlock threads, so nvcc caps it at 168
// registers (d = 128, sm_90a; a 40-byte spill): six of its two-warp blocks per multiprocessor
// instead of four, and more K/V loads in flight, which is what those items wait on. Uncapped
// it takes 204 registers (four blocks, as the general kernel's 238-240) and is barely faster
// than the general kernel; a cap of 128 spills 400 bytes and is slower than either. At d = 64
// the cap leaves 150 registers, no spill. Measurements: docs/kernels.md#kv-read-once-per-segment.
constexpr int kTiledOneTileMinBlocks = 3;
// Rows (query x q head pairs) of a tile: 16 on 64-lane waves (the 16 x 16 MFMA tile), 8 on
// 32-lane warps (the m16n8 tile's 8 columns hold the rows of O^T = V^T P^T; 16 rows would need
// 64 registers more for Q and O at d = 128, which spilled). The host sizes its grid with the
// device's wave width, the kernel with its compile-time one: the same value.
RA_HOST_DEVICE constexpr int tiled_rows_for_wave(int wave) { return wave == 64 ? 16 : 8; }
// Keys of a tile: the 16 columns of one score accumulator.
constexpr int kTiledKeys = 16;
static_assert(kTiledKeys == kTiledStageRows, "the block kernel stages whole key tiles");
// Row tiles per work item: K/V of a one-key-tile segment are loaded once per item, so more
// tiles per item mean less L2 traffic for short histories; fewer mean more items to spread a
// (segment, kv head) with many queries over the machine. 4 keeps >= 4 items per (segment, kv
// head) at 512 queries of one q head (NVIDIA: 64 tiles of 8 rows -> 16 items).
constexpr int kTiledRowTilesPerItem = 4;

// Lazy rescaling: the running max m of a row (log2 domain) is the reference of P = exp2(s - m)
// and moves only when a tile's max exceeds it by more than this, so P <= 2^8 and O, l (fp32)
// stay far from overflow while most key tiles skip the O rescale.
constexpr float kTiledLazyRescaleLog2 = 8.f;
constexpr float kTiledLog2e = 1.4426950408889634f;
constexpr float kTiledLn2 = 0.6931471805599453f;

// Row tiles per (segment, kv head): sized by the host bound max_seqlen_q, so the grid needs no
// device data; tiles past a segment's own rows return at once.
RA_HOST_DEVICE int64_t tiled_row_tiles(const SmallSeqTiledParams& p, int rows) {
  return (tiled_max_rows(p) + rows - 1) / rows;
}

RA_HOST_DEVICE int64_t tiled_item_groups(const SmallSeqTiledParams& p, int rows) {
  return (tiled_row_tiles(p, rows) + kTiledRowTilesPerItem - 1) / kTiledRowTilesPerItem;
}

RA_HOST_DEVICE int64_t tiled_fwd_items(const SmallSeqTiledParams& p, int rows) {
  return static_cast<int64_t>(p.batch) * p.num_heads_kv * tiled_item_groups(p, rows);
}

// Flattened rows r0 .. r1 - 1 (r = j * group + h) of query rows starting at (batch, token0),
// LSE row lse_row0, q heads hq0 + h: out = out_value, lse and row_max = lse_value, probs =
// probs_value (every column). Used for padding rows (0, -inf, 0) and bad segments (NaN, NaN,
// NaN).
template <typename T, int D>
RA_DEVICE void tiled_fill_rows(const SmallSeqTiledParams& p, int64_t batch, int64_t token0,
                               int64_t lse_row0, int64_t r0, int64_t r1, int hq0, int group,
                               float out_value, float lse_value, float probs_value, int lane) {
  constexpr int WAVE = RA_WAVE_SIZE;
  constexpr int kVecs = D / 8;
  if (r1 <= r0) return;
  const uint32_t bits = ra_dtype<T>::from_float(out_value);
  const ra_vec8 fill{{bits | (bits << 16), bits | (bits << 16), bits | (bits << 16),
                      bits | (bits << 16)}};
  uint16_t* o = static_cast<uint16_t*>(p.o) + batch * p.o_batch_stride;
  for (int64_t idx = lane; idx < (r1 - r0) * kVecs; idx += WAVE) {
    const int64_t r = r0 + idx / kVecs;
    const int vec = static_cast<int>(idx % kVecs);
    const int64_t j = r / group;
    const int h = static_cast<int>(r - j * group);
    ra_store16(o + (token0 + j) * p.o_token_stride + (hq0 + h) * p.o_head_stride + 8 * vec, fill);
  }
  for (int64_t r = r0 + lane; r < r1; r += WAVE) {
    const int64_t j = r / group;
    const int h = static_cast<int>(r - j * group);
    p.lse[(hq0 + h) * p.lse_head_stride + lse_row0 + j] = lse_value;
    if (p.row_max != nullptr) p.row_max[(hq0 + h) * p.lse_head_stride + lse_row0 + j] = lse_value;
  }
  if (p.probs != nullptr) {
    const int64_t cols = p.max_seqlen_kv;
    for (int64_t idx = lane; idx < (r1 - r0) * cols; idx += WAVE) {
      const int64_t r = r0 + idx / cols;
      const int64_t c = idx % cols;
      const int64_t j = r / group;
      const int h = static_cast<int>(r - j * group);
      p.probs[((lse_row0 + j) * p.num_heads_q + hq0 + h) * cols + c] = probs_value;
    }
  }
}

// The padding rows of a THD q for the q heads of kv head hk, by one wave of the first item of
// segment 0 (rows before it) and of segment b - 1 (rows after it).
template <typename T, int D>
RA_DEVICE void tiled_fwd_padding(const SmallSeqTiledParams& p, const int seg, const int hk,
                                 const int lane) {
  if (p.cu_seqlens_q == nullptr || (seg != 0 && seg != p.batch - 1)) return;
  const int group = p.num_heads_q / p.num_heads_kv;
  const int hq0 = hk * group;
  const TiledPadding pad = tiled_padding_rows(p);
  if (seg == 0)
    tiled_fill_rows<T, D>(p, 0, 0, 0, 0, pad.lead_end * group, hq0, group, 0.f, -INFINITY, 0.f,
                          lane);
  if (seg == p.batch - 1)
    tiled_fill_rows<T, D>(p, 0, pad.tail_begin, pad.tail_begin, 0,
                          (p.total_q - pad.tail_begin) * group, hq0, group, 0.f, -INFINITY, 0.f,
                          lane);
}

// What every item does before (or instead of) its attention: the padding rows of a THD q (by
// item group 0 of the first / last segment), and a bad segment's report and NaN rows. Returns
// whether the item has rows to compute.
template <typename T, int D, int ROWS>
RA_DEVICE bool tiled_fwd_prologue(const SmallSeqTiledParams& p, const int seg, const int hk,
                                  const int64_t item_group, const TiledSegment& s,
                                  const int lane) {
  const int group = p.num_heads_q / p.num_heads_kv;
  const int hq0 = hk * group;
  if (item_group == 0) tiled_fwd_padding<T, D>(p, seg, hk, lane);
  constexpr int kItemRows = ROWS * kTiledRowTilesPerItem;
  const int64_t r0 = item_group * kItemRows;
  int64_t r1 = r0 + kItemRows;
  if (r1 > static_cast<int64_t>(s.nq) * group) r1 = static_cast<int64_t>(s.nq) * group;
  if (!s.valid) {
    if (item_group == 0 && hk == 0 && lane == 0) tiled_report_bad_segment(p, seg);
    const float nan = tiled_nan();
    tiled_fill_rows<T, D>(p, s.q_batch, s.q_token0, s.q_row0, r0, r1, hq0, group, nan, nan, nan,
                          lane);
    return false;
  }
  return r1 > r0;
}

// Head-dim slices: d <= 128 is one slice; d = 256 is two of 128, so that only half a key tile's
// K or V is in registers at a time (Q and O, which live across the key loop, stay whole).
template <int D>
struct TiledSlices {
  static constexpr int kWidth = D < 128 ? D : 128;
  static constexpr int kCount = D / kWidth;
  static_assert(kCount <= 2, "head dims up to 256");
};

// Where a row tile finds its keys: streamed from global memory by the wave (kTiledStream),
// held in registers for a one-tile segment (kTiledHeld), or staged in shared memory by the
// block (kTiledShared: every wave of the block calls with the same segment, idle ones too,
// since the staging and its barriers need all of them).
// kTiledResident: the segment's whole K and V sit in shared memory (the resident block kernel,
// tiled_fwd_resident_kernel.h, staged them once for all of the block's row tiles), so key tiles
// are read from there without barriers.
// kTiledSharedAsync: as kTiledShared, but the block copies key tiles into a ring of
// kTiledAsyncStages buffers by cp.async (RA_HAS_CP_ASYNC only), several tiles in flight and
// none of them in registers.
constexpr int kTiledStream = 0;
constexpr int kTiledHeld = 1;
constexpr int kTiledShared = 2;
constexpr int kTiledResident = 3;
constexpr int kTiledSharedAsync = 4;

// The block kernel's shared stage for a mode: two buffers for the register staging, the
// cp.async ring otherwise.
template <int D, int MODE>
using TiledFwdStage =
    TiledStage<D, TiledSmemStride<D>::kV, MODE == kTiledSharedAsync ? kTiledAsyncStages : 2>;

// A segment's K and V in shared memory for kTiledResident: key j at k + j * TiledSmemStride<D>::kK
// and v + j * TiledSmemStride<D>::kV, keys from nk to the end of the last key tile zero.
struct TiledResidentKv {
  const uint16_t* k;
  const uint16_t* v;
};
// Threads of the block kernel where many rows take it: 256 (64 rows, 8 warps / 4 waves); CUDA
// builds also compile 64 (two warps, 16 rows, staged by cp.async) for a (segment, kv head) of
// few rows over a long history (rocm_attn/small_seq_plan.py BLOCK_THREADS, _fwd_block_threads).
constexpr int kTiledBlockThreads = 256;

#if RA_HAS_MMA

template <int D>
using TiledHeldK = ra_mma_rows<TiledSlices<D>::kWidth, kTiledKeys>;
template <int D>
using TiledHeldV = ra_mma_vrows<TiledSlices<D>::kWidth, kTiledKeys>;


// ROW_MAX: the instance that writes row_max from the exact running maximum (header NOTE).
template <typename T, int D, int ROWS, int MODE, int THREADS = kTiledBlockThreads,
          int KSTEP = 1, bool ROW_MAX = false>
RA_DEVICE void tiled_fwd_tile_mma(const SmallSeqTiledParams& p, const int hk, const int64_t tile,
                                  const TiledSegment& s, const int lane,
                                  const TiledHeldK<D>* held_k, const TiledHeldV<D>* held_v,
                                  TiledFwdStage<D, MODE>* stage = nullptr, const int tid = 0,
                                  const TiledResidentKv* resident = nullptr) {
  constexpr bool HELD = MODE == kTiledHeld;
  constexpr int SLOTS = kRaMmaAccSlots;
  constexpr int E = ra_mma_acc<kTiledKeys>::kElems;
  constexpr int KT = kTiledKeys;
  constexpr int DS = TiledSlices<D>::kWidth;
  constexpr int NSL = TiledSlices<D>::kCount;
  static_assert(MODE == kTiledStream || NSL == 1, "held / staged K/V: one head-dim slice");
  constexpr int OUT_J = static_cast<int>(sizeof(ra_mma_out<DS, ROWS>{}.x[0]) / sizeof(float));
  const int group = p.num_heads_q / p.num_heads_kv;
  const int hq0 = hk * group;
  const int64_t r0 = tile * ROWS;
  const int64_t rows_left = static_cast<int64_t>(s.nq) * group - r0;
  const int nrows = rows_left < ROWS ? (rows_left > 0 ? static_cast<int>(rows_left) : 0) : ROWS;
  const int nk = s.nk;
  const float qscale = p.softmax_scale * kTiledLog2e;

  // Row i of the tile: query j = (r0 + i) / group, q head hq0 + (r0 + i) % group.
  const TiledRowMap rows(r0, group);
  const uint16_t* qb = static_cast<const uint16_t*>(p.q) + s.q_batch * p.q_batch_stride;
  uint16_t* ob = static_cast<uint16_t*>(p.o) + s.q_batch * p.o_batch_stride;
  const uint16_t* kbase = static_cast<const uint16_t*>(p.k) + s.kv_batch * p.k_batch_stride +
                          s.kv_token0 * p.k_token_stride + hk * p.k_head_stride;
  const uint16_t* vbase = static_cast<const uint16_t*>(p.v) + s.kv_batch * p.v_batch_stride +
                          s.kv_token0 * p.v_token_stride + hk * p.v_head_stride;

  ra_mma_rows<DS, ROWS> qr[NSL];
#pragma unroll
  for (int c = 0; c < NSL; ++c) {
    auto q_row = [&](int i) {
      int64_t j;
      int h;
      rows.at(i, j, h);
      return qb + (s.q_token0 + j) * p.q_token_stride + (hq0 + h) * p.q_head_stride + c * DS;
    };
    ra_mma_load_rows_at(qr[c], q_row, nrows, lane);
  }
  const int ntiles = (nk + KT - 1) / KT;

  // m: running max (log2 domain, the same in every lane of a row); l: this lane's part of the
  // running sum (summed across the row's lanes once, at the end: all parts share m).
  float m[SLOTS], l[SLOTS];
#pragma unroll
  for (int r = 0; r < SLOTS; ++r) {
    m[r] = -INFINITY;
    l[r] = 0.f;
  }
  // Each row's maximum logit (header NOTE): ROW_MAX keeps the exact running max in m_exact
  // (log2 domain, the same in every lane of a row) and m lazy; the other instances move m with
  // every new maximum (threshold 0) where p.row_max is asked, so that it ends exact.
  float m_exact[SLOTS];
#pragma unroll
  for (int r = 0; r < SLOTS; ++r) m_exact[r] = -INFINITY;
  const float lazy = !ROW_MAX && p.row_max != nullptr ? 0.f : kTiledLazyRescaleLog2;
  ra_mma_out<DS, ROWS> o[NSL];
#pragma unroll
  for (int c = 0; c < NSL; ++c) ra_mma_zero(o[c]);

  // Online softmax of the scores of NS consecutive key tiles (keys k0 .. k0 + 16 NS; sc and pf
  // are arrays of NS): S -> P fragments in pf, m / l / O rescaled when the reference max moves
  // (lazy rescaling, see the header NOTE). One row-max exchange serves all NS tiles.
  auto softmax_step = [&](auto& sc, const int k0, auto& pf, auto whole) {
    constexpr int NS = static_cast<int>(sizeof(sc) / sizeof(sc[0]));
    // Scores in the log2 domain; keys past the segment's end (last step only) are -inf, so
    // their P is exp2(-inf) = 0. `whole` (TiledFlag): the caller knows every key is live.
    float mt[SLOTS];
#pragma unroll
    for (int r = 0; r < SLOTS; ++r) mt[r] = -INFINITY;
    if (decltype(whole)::value || k0 + NS * KT <= nk) {
#pragma unroll
      for (int n = 0; n < NS; ++n)
#pragma unroll
        for (int i = 0; i < E; ++i) {
          if (ra_mma_slot_row0(ra_mma_acc_slot(i)) >= ROWS) continue;  // rows no tile has
          sc[n].x[i] *= qscale;
          mt[ra_mma_acc_slot(i)] = fmaxf(mt[ra_mma_acc_slot(i)], sc[n].x[i]);
        }
    } else {
#pragma unroll
      for (int n = 0; n < NS; ++n)
#pragma unroll
        for (int i = 0; i < E; ++i) {
          if (ra_mma_slot_row0(ra_mma_acc_slot(i)) >= ROWS) continue;
          sc[n].x[i] =
              k0 + n * KT + ra_mma_acc_col(lane, i) < nk ? sc[n].x[i] * qscale : -INFINITY;
          mt[ra_mma_acc_slot(i)] = fmaxf(mt[ra_mma_acc_slot(i)], sc[n].x[i]);
        }
    }
    float alpha[SLOTS];
    bool rescale = false;
#pragma unroll
    for (int r = 0; r < SLOTS; ++r) {
      alpha[r] = 1.f;
      if (ra_mma_slot_row0(r) >= ROWS) continue;
      const float tile_max = ra_mma_row_max(mt[r]);
      if constexpr (ROW_MAX) m_exact[r] = fmaxf(m_exact[r], tile_max);
      if (m[r] == -INFINITY) {
        m[r] = tile_max;  // nothing accumulated yet (l and O are 0): no rescale
      } else if (tile_max > m[r] + lazy) {
        alpha[r] = exp2f(m[r] - tile_max);
        m[r] = tile_max;
        l[r] *= alpha[r];
        rescale = true;
      }
    }
    // m is finite once a row has seen a live key (every row's first tile has key 0); the
    // guard keeps exp2(-inf - -inf) = NaN out of a row whose scores are not finite.
    float mref[SLOTS];
#pragma unroll
    for (int r = 0; r < SLOTS; ++r) mref[r] = m[r] == -INFINITY ? 0.f : m[r];
#pragma unroll
    for (int n = 0; n < NS; ++n)
#pragma unroll
      for (int i = 0; i < E; ++i) {
        const int slot = ra_mma_acc_slot(i);
        if (ra_mma_slot_row0(slot) >= ROWS) {
          sc[n].x[i] = 0.f;  // never a P row
          continue;
        }
        const float pr = exp2f(sc[n].x[i] - mref[slot]);
        sc[n].x[i] = pr;
        l[slot] += pr;
      }
    // O is rescaled by the whole wave or not at all (the alphas are exchanged across lanes).
    if (ra_count_lanes(rescale) > 0) {
#pragma unroll
      for (int j = 0; j < OUT_J; ++j) {
        const float a = ra_mma_row_value_for_out(alpha, j, lane);
#pragma unroll
        for (int c = 0; c < NSL; ++c)
#pragma unroll
          for (int i = 0; i < DS / 16; ++i) o[c].x[i][j] *= a;
      }
    }
#pragma unroll
    for (int n = 0; n < NS; ++n) pf[n] = ra_mma_to_pfrag<T, ROWS>(sc[n]);
  };

  // The products of one key tile whose K and V rows are in registers, over a head dim of one
  // slice: S = Q K^T, the online softmax step, O += P . V.
  const auto tile_products = [&](const auto& k, const auto& v, const int k0) {
    ra_mma_acc<KT> sc[1];
    ra_mma_zero(sc[0]);
    ra_mma_dot<T>(sc[0], qr[0], k);
    ra_mma_pfrag<ROWS> pf[1];
    softmax_step(sc, k0, pf, TiledFlag<false>{});
    ra_mma_pv<T>(o[0], pf[0], v);
  };

  ra_mma_rows<DS, KT> ka, kb;
  // One key tile from buffer `buf` of the block's shared stage (both staging modes).
  const auto staged_tile = [&](const int buf, const int k0) {
    constexpr int SK = TiledSmemStride<D>::kK;
    constexpr int SV = TiledSmemStride<D>::kV;
    ra_mma_load_rows(ka, stage->k[buf], SK, nk - k0, lane);
    ra_mma_vrows<DS, KT> vr;
    ra_mma_load_vrows(vr, stage->v[buf], SV, nk - k0, lane);
    tile_products(ka, vr, k0);
  };
  if constexpr (MODE == kTiledShared) {
    // Block-wide double buffering: tile t + 1 is loaded into registers while every wave
    // computes tile t from shared memory, then stored into the other buffer (read last in
    // iteration t - 1, which every wave finished before the barrier that closed it).
    using Regs = TiledStageRegs<D, THREADS>;
    Regs staged;
    if (ntiles > 0) {
      tiled_stage_load<D, THREADS>(staged, kbase, p.k_token_stride, vbase,
                                              p.v_token_stride, 0, nk, tid);
      tiled_stage_store(*stage, 0, staged, tid);
    }
    __syncthreads();
    for (int t = 0; t < ntiles; ++t) {
      const int k0 = t * KT;
      if (t + 1 < ntiles)
        tiled_stage_load<D, THREADS>(staged, kbase, p.k_token_stride, vbase,
                                                p.v_token_stride, k0 + KT, nk, tid);
      staged_tile(t & 1, k0);
      if (t + 1 < ntiles)
        tiled_stage_store(*stage, (t + 1) & 1, staged, tid);
      __syncthreads();
    }
#if RA_HAS_CP_ASYNC
  } else if constexpr (MODE == kTiledSharedAsync) {
    // A ring of S buffers filled by cp.async, no register round trip: key tile t goes to buffer
    // t % S, and tiles t + 1 .. t + S - 1 are in flight while the block computes tile t. Every
    // thread commits one group per tile slot, empty ones past the last tile too, so that
    // "tile t has landed" is always "at most S - 2 younger groups pending". Iteration t's
    // barrier publishes tile t to every wave and closes everyone's reads of tile t - 1, whose
    // buffer the copies of tile t + S - 1 then refill. Keys past nk are zero-filled, never read.
    constexpr int S = kTiledAsyncStages;
    constexpr int SV = TiledSmemStride<D>::kV;
    static_assert(S >= 2, "a ring of at least two buffers");
    auto issue = [&](const int t) {
      if (t < ntiles)
        tiled_stage_copy_async<D, SV, THREADS>(*stage, t % S, kbase, p.k_token_stride, vbase,
                                               p.v_token_stride, p.k, t * KT, nk, tid);
      ra_cp_async_commit();
    };
#pragma unroll
    for (int t = 0; t < S - 1; ++t) issue(t);
    for (int t = 0; t < ntiles; ++t) {
      const int k0 = t * KT;
      const int buf = t % S;
      ra_cp_async_wait<S - 2>();
      __syncthreads();
      issue(t + S - 1);
      staged_tile(buf, k0);
    }
    // Every wave is done reading the ring before the block's next item refills it.
    __syncthreads();
#endif  // RA_HAS_CP_ASYNC
  } else if constexpr (MODE == kTiledResident) {
    constexpr int SK = TiledSmemStride<D>::kK;
    constexpr int SV = TiledSmemStride<D>::kV;
    // KSTEP key tiles per softmax step: their products are independent, so a step keeps
    // several matrix chains in flight, and one row-max exchange serves them all. Rows past nk up
    // to the end of the segment's last key tile are zeros in shared memory (staged so); key
    // tiles after it were not staged: their products are skipped (scores masked to -inf, P 0).
    // Steps whose KSTEP tiles all hold keys (every step of a segment but its last) are compiled
    // without those guards (WHOLE): no selects and register moves on the dense steps.
    auto resident_step = [&](const int k0, auto whole) {
      constexpr bool WHOLE = decltype(whole)::value;
      ra_mma_acc<KT> sc[KSTEP];
#pragma unroll
      for (int n = 0; n < KSTEP; ++n) {
        ra_mma_zero(sc[n]);
        if (WHOLE || n == 0 || k0 + n * KT < nk) {
          ra_mma_load_rows(ka, resident->k + (k0 + n * KT) * SK, SK, KT, lane);
          ra_mma_dot<T>(sc[n], qr[0], ka);
        }
      }
      ra_mma_pfrag<ROWS> pf[KSTEP];
      softmax_step(sc, k0, pf, whole);
#pragma unroll
      for (int n = 0; n < KSTEP; ++n) {
        if (WHOLE || n == 0 || k0 + n * KT < nk) {
          ra_mma_vrows<DS, KT> vr;
          ra_mma_load_vrows(vr, resident->v + (k0 + n * KT) * SV, SV, KT, lane);
          ra_mma_pv<T>(o[0], pf[n], vr);
        }
      }
    };
    const int whole_end = nk / (KSTEP * KT) * (KSTEP * KT);
    int k0 = 0;
    for (; k0 < whole_end; k0 += KSTEP * KT) resident_step(k0, TiledFlag<true>{});
    if (k0 < nk) resident_step(k0, TiledFlag<false>{});
  } else if constexpr (HELD) {
    if (ntiles > 0) tile_products(*held_k, *held_v, 0);
  } else if constexpr (NSL == 1) {
    // One key tile: V of this tile and K of the next are issued before this tile's products.
    auto step = [&](const ra_mma_rows<DS, KT>& kcur, ra_mma_rows<DS, KT>& knext, const int t) {
      const int k0 = t * KT;
      ra_mma_vrows<DS, KT> vr;
      ra_mma_load_vrows(vr, vbase + k0 * p.v_token_stride, p.v_token_stride, nk - k0, lane);
      if (t + 1 < ntiles)
        ra_mma_load_rows(knext, kbase + (k0 + KT) * p.k_token_stride, p.k_token_stride,
                         nk - k0 - KT, lane);
      tile_products(kcur, vr, k0);
    };
    // Two register sets of K, used in turn (a loop over a two-entry array indexed by t & 1
    // would put them in scratch memory).
    if (ntiles > 0) ra_mma_load_rows(ka, kbase, p.k_token_stride, nk, lane);
    for (int t = 0; t < ntiles; t += 2) {
      step(ka, kb, t);
      if (t + 1 < ntiles) step(kb, ka, t + 1);
    }
  } else {
    // Half a key tile in registers at a time: each slice's loads are issued one product ahead.
    for (int t = 0; t < ntiles; ++t) {
      const int k0 = t * KT;
      const uint16_t* kt = kbase + k0 * p.k_token_stride;
      const uint16_t* vt = vbase + k0 * p.v_token_stride;
      ra_mma_load_rows(ka, kt, p.k_token_stride, nk - k0, lane);
      ra_mma_load_rows(kb, kt + DS, p.k_token_stride, nk - k0, lane);
      ra_mma_acc<KT> sc[1];
      ra_mma_zero(sc[0]);
      ra_mma_dot<T>(sc[0], qr[0], ka);
      ra_mma_vrows<DS, KT> va, vb;
      ra_mma_load_vrows(va, vt, p.v_token_stride, nk - k0, lane);
      ra_mma_dot<T>(sc[0], qr[1], kb);
      ra_mma_pfrag<ROWS> pf[1];
      softmax_step(sc, k0, pf, TiledFlag<false>{});
      ra_mma_load_vrows(vb, vt + DS, p.v_token_stride, nk - k0, lane);
      ra_mma_pv<T>(o[0], pf[0], va);
      ra_mma_pv<T>(o[1], pf[0], vb);
    }
  }

  float inv[SLOTS], lse2[SLOTS];
#pragma unroll
  for (int r = 0; r < SLOTS; ++r) {
    const float sum = ra_mma_slot_row0(r) < ROWS ? ra_mma_row_sum(l[r]) : 0.f;
    inv[r] = sum > 0.f ? 1.f / sum : 0.f;
    lse2[r] = sum > 0.f ? m[r] + log2f(sum) : -INFINITY;
  }
#pragma unroll
  for (int j = 0; j < OUT_J; ++j) {
    const float a = ra_mma_row_value_for_out(inv, j, lane);
#pragma unroll
    for (int c = 0; c < NSL; ++c)
#pragma unroll
      for (int i = 0; i < DS / 16; ++i) o[c].x[i][j] *= a;
  }
#pragma unroll
  for (int c = 0; c < NSL; ++c) {
    auto o_row = [&](int i) {
      int64_t j;
      int h;
      rows.at(i, j, h);
      return ob + (s.q_token0 + j) * p.o_token_stride + (hq0 + h) * p.o_head_stride + c * DS;
    };
    ra_mma_store_rows_at<T>(o[c], o_row, nrows, lane);
  }

  // LSE: the lane holding column 0 of a row writes it.
#pragma unroll
  for (int i = 0; i < E; ++i) {
    const int row = ra_mma_acc_row(lane, i);
    if (ra_mma_acc_col(lane, i) != 0 || row >= nrows) continue;
    int64_t j;
    int h;
    rows.at(row, j, h);
    const int64_t hq = hq0 + h;
    const float v = lse2[ra_mma_acc_slot(i)];
    p.lse[tiled_row_term_at(p, s, hq, j)] = v == -INFINITY ? -INFINITY : v * kTiledLn2;
    if (p.row_max != nullptr)
      p.row_max[tiled_row_term_at(p, s, hq, j)] =
          v == -INFINITY ? -INFINITY
                         : (ROW_MAX ? m_exact : m)[ra_mma_acc_slot(i)] * kTiledLn2;
  }

  if (p.probs == nullptr) return;
  // Probabilities: S again, tile by tile (the same products, so the same scores), normalised
  // with the final LSE; zero past the segment's keys up to max_seqlen_kv.
  const int ptiles = (p.max_seqlen_kv + KT - 1) / KT;
  for (int t = 0; t < ptiles; ++t) {
    const int k0 = t * KT;
    ra_mma_acc<KT> sc;
    ra_mma_zero(sc);
    if (k0 < nk) {  // tiles past the keys are all zero: no product
      if constexpr (HELD) {
        ra_mma_dot<T>(sc, qr[0], *held_k);
      } else {
#pragma unroll
        for (int c = 0; c < NSL; ++c) {
          ra_mma_load_rows(ka, kbase + k0 * p.k_token_stride + c * DS, p.k_token_stride,
                           nk - k0, lane);
          ra_mma_dot<T>(sc, qr[c], ka);
        }
      }
    }
#pragma unroll
    for (int i = 0; i < E; ++i) {
      const int row = ra_mma_acc_row(lane, i);
      const int col = k0 + ra_mma_acc_col(lane, i);
      if (row >= nrows || col >= p.max_seqlen_kv) continue;
      const float l2 = lse2[ra_mma_acc_slot(i)];
      const float pr = col < nk && l2 != -INFINITY ? exp2f(sc.x[i] * qscale - l2) : 0.f;
      int64_t j;
      int h;
      rows.at(row, j, h);
      const int64_t hq = hq0 + h;
      p.probs[((s.q_row0 + j) * p.num_heads_q + hq) * p.max_seqlen_kv + col] = pr;
    }
  }
}

// Row tiles [tile0, tile1) of one valid (segment, kv head): a segment of one key tile (d <=
// 128) loads K and V once and serves every row tile from registers; longer ones stream.
// ONE_TILE: the launch has max_seqlen_kv <= kTiledKeys, so every valid segment is one tile
// (the contract bounds its keys by max_seqlen_kv) and the streaming path is not compiled.
template <typename T, int D, int ROWS, bool ONE_TILE = false, bool ROW_MAX = false>
RA_DEVICE void tiled_fwd_item_mma(const SmallSeqTiledParams& p, const int hk, const int64_t tile0,
                                  const int64_t tile1, const TiledSegment& s, const int lane) {
  constexpr int DS = TiledSlices<D>::kWidth;
  static_assert(!ONE_TILE || TiledSlices<D>::kCount == 1, "one-tile items: d <= 128");
  if constexpr (TiledSlices<D>::kCount == 1) {
    if (ONE_TILE || s.nk <= kTiledKeys) {
      ra_mma_rows<DS, kTiledKeys> kr;
      ra_mma_vrows<DS, kTiledKeys> vr;
      const int64_t k_off = s.kv_batch * p.k_batch_stride + s.kv_token0 * p.k_token_stride +
                            hk * p.k_head_stride;
      const int64_t v_off = s.kv_batch * p.v_batch_stride + s.kv_token0 * p.v_token_stride +
                            hk * p.v_head_stride;
      ra_mma_load_rows(kr, static_cast<const uint16_t*>(p.k) + k_off, p.k_token_stride, s.nk,
                       lane);
      ra_mma_load_vrows(vr, static_cast<const uint16_t*>(p.v) + v_off, p.v_token_stride, s.nk,
                        lane);
      for (int64_t tile = tile0; tile < tile1; ++tile)
        tiled_fwd_tile_mma<T, D, ROWS, kTiledHeld, kTiledBlockThreads, 1, ROW_MAX>(
            p, hk, tile, s, lane, &kr, &vr);
      return;
    }
  }
  if constexpr (!ONE_TILE) {
    for (int64_t tile = tile0; tile < tile1; ++tile)
      tiled_fwd_tile_mma<T, D, ROWS, kTiledStream, kTiledBlockThreads, 1, ROW_MAX>(
          p, hk, tile, s, lane, nullptr, nullptr);
  }
}

#else  // !RA_HAS_MMA

// Targets without matrix units (and the 32-lane CPU emulation): the tile's rows one after the
// other, each over all keys. A row of D values spans LPR lanes; the wave holds RPP key rows at
// once, and each group of LPR lanes keeps its own online softmax over the keys it saw (a
// split over keys), merged across groups at the end.
template <typename T, int D, int ROWS>
RA_DEVICE void tiled_fwd_tile_scalar(const SmallSeqTiledParams& p, const int hk,
                                     const int64_t tile, const TiledSegment& s, const int lane) {
  constexpr int WAVE = RA_WAVE_SIZE;
  constexpr int kVecsPerRow = D / 8;
  constexpr int LPR = kVecsPerRow < WAVE ? kVecsPerRow : WAVE;
  constexpr int VPL = kVecsPerRow / LPR;
  constexpr int RPP = WAVE / LPR;
  const int row_group = lane / LPR;
  const int col_lane = lane % LPR;
  const int group = p.num_heads_q / p.num_heads_kv;
  const int hq0 = hk * group;
  const int64_t r0 = tile * ROWS;
  const int64_t rows_left = static_cast<int64_t>(s.nq) * group - r0;
  const int nrows = rows_left < ROWS ? static_cast<int>(rows_left) : ROWS;
  const int nk = s.nk;
  const float qscale = p.softmax_scale * kTiledLog2e;
  const uint16_t* kbase = static_cast<const uint16_t*>(p.k) + s.kv_batch * p.k_batch_stride +
                          s.kv_token0 * p.k_token_stride + hk * p.k_head_stride;
  const uint16_t* vbase = static_cast<const uint16_t*>(p.v) + s.kv_batch * p.v_batch_stride +
                          s.kv_token0 * p.v_token_stride + hk * p.v_head_stride;

  for (int i = 0; i < nrows; ++i) {
    const int64_t r = r0 + i;
    const int64_t j = r / group;
    const int64_t hq = hq0 + (r - j * group);
    const uint16_t* qrow = static_cast<const uint16_t*>(p.q) + s.q_batch * p.q_batch_stride +
                           (s.q_token0 + j) * p.q_token_stride + hq * p.q_head_stride;
    float qf[VPL][8], acc[VPL][8];
#pragma unroll
    for (int vi = 0; vi < VPL; ++vi) {
      ra_unpack8<T>(ra_load16(qrow + 8 * (col_lane + vi * LPR)), qf[vi]);
#pragma unroll
      for (int e = 0; e < 8; ++e) acc[vi][e] = 0.f;
    }
    float m = -INFINITY, l = 0.f;
    for (int base = 0; base < nk; base += RPP) {
      const int key = base + row_group;
      const bool live = key < nk;
      float part = 0.f;
      float vf[VPL][8];
#pragma unroll
      for (int vi = 0; vi < VPL; ++vi) {
        float kf[8];
        const int off = 8 * (col_lane + vi * LPR);
        if (live) {
          ra_unpack8<T>(ra_load16(kbase + key * p.k_token_stride + off), kf);
          ra_unpack8<T>(ra_load16(vbase + key * p.v_token_stride + off), vf[vi]);
        } else {
#pragma unroll
          for (int e = 0; e < 8; ++e) kf[e] = vf[vi][e] = 0.f;
        }
#pragma unroll
        for (int e = 0; e < 8; ++e) part = fmaf(qf[vi][e], kf[e], part);
      }
      const float sc = ra_group_sum<LPR>(part) * qscale;
      if (live) {
        const float mnew = fmaxf(m, sc);
        const float alpha = exp2f(m - mnew);  // m = -inf: 0
        const float pr = exp2f(sc - mnew);
        l = l * alpha + pr;
#pragma unroll
        for (int vi = 0; vi < VPL; ++vi)
#pragma unroll
          for (int e = 0; e < 8; ++e) acc[vi][e] = acc[vi][e] * alpha + pr * vf[vi][e];
        m = mnew;
      }
    }
    // Merge the row groups' partial softmaxes.
    const float mall = ra_strided_max<LPR, WAVE>(m);
    const float a = m == -INFINITY ? 0.f : exp2f(m - mall);
    const float sum = ra_strided_sum<LPR, WAVE>(l * a);
    const float inv = sum > 0.f ? 1.f / sum : 0.f;
    float out[VPL][8];
#pragma unroll
    for (int vi = 0; vi < VPL; ++vi)
#pragma unroll
      for (int e = 0; e < 8; ++e) out[vi][e] = ra_strided_sum<LPR, WAVE>(acc[vi][e] * a) * inv;
    if (row_group == 0) {
      uint16_t* orow = static_cast<uint16_t*>(p.o) + s.q_batch * p.o_batch_stride +
                       (s.q_token0 + j) * p.o_token_stride + hq * p.o_head_stride;
#pragma unroll
      for (int vi = 0; vi < VPL; ++vi)
        ra_store16(orow + 8 * (col_lane + vi * LPR), ra_pack8<T>(out[vi]));
    }
    const float lse2 = sum > 0.f ? mall + log2f(sum) : -INFINITY;
    if (lane == 0) {
      p.lse[tiled_row_term_at(p, s, hq, j)] = sum > 0.f ? lse2 * kTiledLn2 : -INFINITY;
      // mall is the exact maximum of the row's scores (no lazy reference here)
      if (p.row_max != nullptr)
        p.row_max[tiled_row_term_at(p, s, hq, j)] = sum > 0.f ? mall * kTiledLn2 : -INFINITY;
    }
    if (p.probs == nullptr) continue;
    for (int base = 0; base < p.max_seqlen_kv; base += RPP) {
      const int key = base + row_group;
      const bool live = key < nk;
      float part = 0.f;
#pragma unroll
      for (int vi = 0; vi < VPL; ++vi) {
        float kf[8];
        if (live) {
          ra_unpack8<T>(ra_load16(kbase + key * p.k_token_stride + 8 * (col_lane + vi * LPR)), kf);
        } else {
#pragma unroll
          for (int e = 0; e < 8; ++e) kf[e] = 0.f;
        }
#pragma unroll
        for (int e = 0; e < 8; ++e) part = fmaf(qf[vi][e], kf[e], part);
      }
      const float sc = ra_group_sum<LPR>(part) * qscale;
      if (col_lane == 0 && key < p.max_seqlen_kv)
        p.probs[((s.q_row0 + j) * p.num_heads_q + hq) * p.max_seqlen_kv + key] =
            live && sum > 0.f ? exp2f(sc - lse2) : 0.f;
    }
  }
}

#endif  // RA_HAS_MMA

// Grid-stride loop over (segment, kv head, row-tile group) items.
// ONE_TILE: the launch's histories fit one key tile (max_seqlen_kv <= kTiledKeys, d <= 128),
// so every item holds its K/V in registers and the streaming path is not compiled; its
// registers are capped for kTiledOneTileMinBlocks blocks (see there). ROW_MAX: the instance
// for calls that ask for row_max (header NOTE; the one-tile instance has none).
template <typename T, int D, bool ONE_TILE = false, bool ROW_MAX = false>
__global__ void RA_LAUNCH_BOUNDS_MIN_BLOCKS(kTiledMaxThreadsPerBlock,
                                            ONE_TILE ? kTiledOneTileMinBlocks : 1)
    small_seq_tiled_fwd_kernel(const SmallSeqTiledParams p) {
  constexpr int WAVE = RA_WAVE_SIZE;
  const int lane = threadIdx.x % WAVE;
  const int waves = blockDim.x / WAVE;
  constexpr int ROWS = tiled_rows_for_wave(WAVE);
  const int64_t groups = tiled_item_groups(p, ROWS);
  const int64_t per_seg = groups * p.num_heads_kv;
  const int64_t items = static_cast<int64_t>(p.batch) * per_seg;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * waves;
  int64_t item = static_cast<int64_t>(blockIdx.x) * waves + threadIdx.x / WAVE;
  // The next item's segment bounds are read before this item computes.
  TiledBounds bounds =
      item < items ? tiled_fetch_bounds(p, static_cast<int>(item / per_seg)) : TiledBounds{};
  for (; item < items; item += stride) {
    const int seg = static_cast<int>(item / per_seg);
    const int64_t rest = item - seg * per_seg;
    const int hk = static_cast<int>(rest / groups);
    const int64_t item_group = rest - hk * groups;
    const TiledSegment s = tiled_resolve_segment(p, seg, bounds);
    if (item + stride < items)
      bounds = tiled_fetch_bounds(p, static_cast<int>((item + stride) / per_seg));
    if (!tiled_fwd_prologue<T, D, ROWS>(p, seg, hk, item_group, s, lane)) continue;
    // The item's row tiles that hold rows of this segment.
    const int64_t seg_rows = static_cast<int64_t>(s.nq) * (p.num_heads_q / p.num_heads_kv);
    const int64_t tile0 = item_group * kTiledRowTilesPerItem;
    const int64_t seg_tiles = (seg_rows + ROWS - 1) / ROWS;
    const int64_t tile1 =
        tile0 + kTiledRowTilesPerItem < seg_tiles ? tile0 + kTiledRowTilesPerItem : seg_tiles;
#if RA_HAS_MMA
    tiled_fwd_item_mma<T, D, ROWS, ONE_TILE, ROW_MAX>(p, hk, tile0, tile1, s, lane);
#else
    for (int64_t tile = tile0; tile < tile1; ++tile)
      tiled_fwd_tile_scalar<T, D, ROWS>(p, hk, tile, s, lane);
#endif
  }
}

// Block variant for segments with many query rows and more than one key tile (d <= 128): the
// block's waves take consecutive row tiles of one (segment, kv head) and share each key tile,
// which the block stages in shared memory, so K/V leave L2 once per block instead of once per
// row tile. Work item = (segment, kv head, group of one row tile per wave), grid-stride over
// blocks. Segments of one key tile take the register-held path per wave; bad segments and
// padding rows are handled as in the wave kernel.
// CP_ASYNC: the key tiles are staged by cp.async into a ring (kTiledSharedAsync) where the
// device pass has it (RA_HAS_CP_ASYNC), else through registers (kTiledShared); launchers
// instantiate it only in CUDA builds (RA_CP_ASYNC_BUILD). ROW_MAX: as the wave kernel's.
// NOTE: the explicit minimum of one resident block lets nvcc use the registers it needs; with
// the thread bound alone it capped d = 64 at 128 registers and spilled.
template <typename T, int D, int THREADS, bool CP_ASYNC = false, bool ROW_MAX = false>
__global__ void RA_LAUNCH_BOUNDS_MIN_BLOCKS(THREADS, 1)
    small_seq_tiled_fwd_block_kernel(const SmallSeqTiledParams p) {
  static_assert(TiledSlices<D>::kCount == 1, "the block kernel serves head dims up to 128");
  constexpr int WAVE = RA_WAVE_SIZE;
  constexpr int ROWS = tiled_rows_for_wave(WAVE);
  constexpr int WAVES = THREADS / WAVE;
#if RA_HAS_MMA
#if RA_HAS_CP_ASYNC
  constexpr int MODE = CP_ASYNC ? kTiledSharedAsync : kTiledShared;
#else
  constexpr int MODE = kTiledShared;
#endif
  __shared__ TiledFwdStage<D, MODE> stage;
#endif
  const int tid = threadIdx.x;
  const int lane = tid % WAVE;
  const int w = tid / WAVE;
  const int group = p.num_heads_q / p.num_heads_kv;
  const int64_t groups = (tiled_row_tiles(p, ROWS) + WAVES - 1) / WAVES;
  const int64_t per_seg = groups * p.num_heads_kv;
  const int64_t items = static_cast<int64_t>(p.batch) * per_seg;
  for (int64_t item = blockIdx.x; item < items; item += gridDim.x) {
    const int seg = static_cast<int>(item / per_seg);
    const int64_t rest = item - seg * per_seg;
    const int hk = static_cast<int>(rest / groups);
    const int64_t bg = rest - hk * groups;
    const TiledSegment s = tiled_resolve_segment(p, seg, tiled_fetch_bounds(p, seg));
    if (bg == 0 && w == 0) tiled_fwd_padding<T, D>(p, seg, hk, lane);
    const int64_t tile = bg * WAVES + w;
    const int64_t seg_rows = static_cast<int64_t>(s.nq) * group;
    if (!s.valid) {
      if (bg == 0 && hk == 0 && tid == 0) tiled_report_bad_segment(p, seg);
      const int64_t r0 = tile * ROWS;
      const int64_t r1 = r0 + ROWS < seg_rows ? r0 + ROWS : seg_rows;
      const float nan = tiled_nan();
      tiled_fill_rows<T, D>(p, s.q_batch, s.q_token0, s.q_row0, r0, r1, hk * group, group, nan,
                            nan, nan, lane);
      continue;  // the same for every wave of the block
    }
    if (bg * WAVES * ROWS >= seg_rows) continue;  // no rows in this block (block-uniform)
#if RA_HAS_MMA
    if (s.nk <= kTiledKeys) {  // block-uniform: one key tile, held in registers per wave
      if (tile * ROWS < seg_rows)
        tiled_fwd_item_mma<T, D, ROWS, false, ROW_MAX>(p, hk, tile, tile + 1, s, lane);
      continue;
    }
    // Every wave, those past the segment's rows too (they stage and wait, and write nothing).
    tiled_fwd_tile_mma<T, D, ROWS, MODE, THREADS, 1, ROW_MAX>(p, hk, tile, s, lane, nullptr,
                                                              nullptr, &stage, tid);
#else
    // Targets without matrix units: each wave its own tile, scalar (no staging).
    if (tile * ROWS < seg_rows) tiled_fwd_tile_scalar<T, D, ROWS>(p, hk, tile, s, lane);
#endif
  }
}

}  // namespace small_seq
