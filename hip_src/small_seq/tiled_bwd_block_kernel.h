// Tiled small-seq backward, block variants of pass 2 (dK / dV) and pass 3 (dQ): the waves of a
// block share each row tile's Q, dO, LSE and Delta (pass 2) or each key tile's K and V (pass 3)
// through shared memory (docs/kernels.md#tiled-small-seq-backward).
//
// Why: the wave kernel's pass-2 item (one key tile, one head-dim slice) walks all of its
// segment's rows and reads their Q and dO from L2, so with many candidates per user every row is
// fetched once per (key tile, slice) item, and each fetch is a row-mapped global load on the
// item's dependency chain. Here a block item is (segment, kv head, group of KTG key tiles) with
// one wave per (key tile, slice); for each row tile the block stages the rows once (double
// buffered: the next tile's rows are loaded into registers while the waves compute, one barrier
// per row tile), and every wave reads them from shared memory. What a wave computes, and the
// order of its sums, is the wave kernel's (tiled_bwd_dkv_mma): the gradients are bitwise the
// same.
//
// Segments whose rows fit one row tile keep the wave kernel's per-(kv head, slice) walk
// (tiled_bwd_row_tile_mma), run by the first waves of key group 0.
//
// Pass 3 (dQ; it has no wave kernel: wherever a call needs a dQ pass, both passes take their
// block variants): a block item is (segment, kv head, group of RTG row tiles), one wave per
// (row tile, slice) walking all of the segment's key tiles, and the block stages each key
// tile's K and V once for all of them.
#pragma once

#include "tiled_bwd_kernel.h"
#include "tiled_smem.h"

namespace small_seq {

// Threads of a pass-2 block: 8 warps on NVIDIA (d = 128: 4 key tiles x 2 slices), 4 waves on
// CDNA (255 registers on sm_90: one block per multiprocessor).
constexpr int kTiledBwdBlockThreads = 256;
// Threads of a pass-3 block: 4 warps on NVIDIA (d = 128: 2 row tiles x 2 slices) at about 163
// registers, so that three blocks (12 warps) share a multiprocessor, as many as the wave
// kernel's small blocks get; 2 waves on CDNA.
constexpr int kTiledBwdDqBlockThreads = 128;

// Key tiles (pass 2) or row tiles (pass 3) of one block item of `threads` threads: the waves
// split over (tile, slice).
RA_HOST_DEVICE constexpr int tiled_bwd_block_tiles(int threads, int wave, int d) {
  return threads / wave / tiled_bwd_slices(wave, d) > 0
             ? threads / wave / tiled_bwd_slices(wave, d)
             : 1;
}

// Block items per (segment, kv head): groups of ktg key tiles (pass 2), of rtg row tiles
// (pass 3).
RA_HOST_DEVICE int64_t tiled_bwd_dkv_block_groups(const SmallSeqTiledParams& p, int ktg) {
  return (tiled_bwd_item_key_tiles(p) + ktg - 1) / ktg;
}
RA_HOST_DEVICE int64_t tiled_bwd_dq_block_groups(const SmallSeqTiledParams& p, int rtg) {
  return (tiled_bwd_row_tiles(p) + rtg - 1) / rtg;
}

// One row tile's operands in shared memory (two buffers): Q and dO rows (zeros past the
// segment's rows) and their LSE (log2 domain) and Delta.
template <int D>
struct TiledBwdRowStage {
  static constexpr int kStride = TiledSmemStride<D>::kK;
  alignas(16) uint16_t q[2][kTiledBwdRows * kStride];
  alignas(16) uint16_t dout[2][kTiledBwdRows * kStride];
  float lse2[2][kTiledBwdRows];
  float delta[2][kTiledBwdRows];
};

// This thread's share of one row tile (16 rows x D / 8 vectors of Q and of dO over THREADS
// threads; threads < 16 also hold one row's LSE and Delta).
template <int D, int THREADS>
struct TiledBwdRowStageRegs {
  static constexpr int kVecs = kTiledBwdRows * D / 8;
  static constexpr int kPerThread = (kVecs + THREADS - 1) / THREADS;
  ra_vec8 q[kPerThread];
  ra_vec8 dout[kPerThread];
  TiledBwdRowTerms terms;
};

template <int D, int THREADS>
RA_DEVICE void tiled_bwd_stage_rows_load(TiledBwdRowStageRegs<D, THREADS>& r,
                                         const SmallSeqTiledParams& p, const TiledSegment& s,
                                         const TiledBwdRows& rw, const int hq0, const int group,
                                         const int64_t r0, const int nrows, const int tid) {
  const TiledRowMap rows(r0, group);
#pragma unroll
  for (int i = 0; i < TiledBwdRowStageRegs<D, THREADS>::kPerThread; ++i) {
    const int idx = tid + i * THREADS;
    const int row = idx / (D / 8);
    const int vec = idx % (D / 8);
    r.q[i] = r.dout[i] = ra_vec8{{0u, 0u, 0u, 0u}};
    if (idx < TiledBwdRowStageRegs<D, THREADS>::kVecs && row < nrows) {
      int64_t j;
      int h;
      rows.at(row, j, h);
      r.q[i] = ra_load16(rw.q + (s.q_token0 + j) * p.q_token_stride +
                         (hq0 + h) * p.q_head_stride + 8 * vec);
      r.dout[i] = ra_load16(rw.dout + (s.q_token0 + j) * p.do_token_stride +
                            (hq0 + h) * p.do_head_stride + 8 * vec);
    }
  }
  r.terms = tid < nrows ? tiled_bwd_row_terms_at(p, s, hq0, rows, tid) : TiledBwdRowTerms{0.f, 0.f};
}

template <int D, int THREADS>
RA_DEVICE void tiled_bwd_stage_rows_store(TiledBwdRowStage<D>& st, const int buf,
                                          const TiledBwdRowStageRegs<D, THREADS>& r,
                                          const int tid) {
  constexpr int S = TiledBwdRowStage<D>::kStride;
#pragma unroll
  for (int i = 0; i < TiledBwdRowStageRegs<D, THREADS>::kPerThread; ++i) {
    const int idx = tid + i * THREADS;
    if (idx >= TiledBwdRowStageRegs<D, THREADS>::kVecs) continue;
    const int row = idx / (D / 8);
    const int col = 8 * (idx % (D / 8));
    ra_store16(st.q[buf] + row * S + col, r.q[i]);
    ra_store16(st.dout[buf] + row * S + col, r.dout[i]);
  }
  if (tid < kTiledBwdRows) {
    st.lse2[buf][tid] = r.terms.lse2;
    st.delta[buf][tid] = r.terms.delta;
  }
}

#if RA_HAS_MMA

// One wave's share of one staged row tile (rows r0 .., nrows of them, buffer buf): the tile's
// terms of dK and dV of key tile kt's keys (head-dim slice `slice`) added to dk / dv, and for a
// segment of one key tile (kt = 0) the tile's dQ rows stored, as tiled_bwd_dkv_mma does them.
template <typename T, int D>
RA_DEVICE void tiled_bwd_dkv_block_step(const SmallSeqTiledParams& p, const TiledSegment& s,
                                        const TiledBwdRows& rw, const TiledBwdRowStage<D>& st,
                                        const int buf, const int hq0, const int group,
                                        const int64_t r0, const int nrows, const int kt,
                                        const int slice,
                                        ra_mma_out<tiled_bwd_slice(RA_WAVE_SIZE, D), 16>& dk,
                                        ra_mma_out<tiled_bwd_slice(RA_WAVE_SIZE, D), 16>& dv,
                                        const int lane) {
  constexpr int DS = tiled_bwd_slice(RA_WAVE_SIZE, D);
  constexpr int W = DS;
  constexpr int E = ra_mma_acc<16>::kElems;
  constexpr int S = TiledBwdRowStage<D>::kStride;
  const int k0 = kt * kTiledBwdKeys;
  const int nkt = s.nk - k0;
  const bool one_tile = s.nk <= kTiledBwdKeys;
  const float qscale = p.softmax_scale * kTiledBwdLog2e;
  const uint16_t* kt_base = rw.k + static_cast<int64_t>(k0) * p.k_token_stride;
  const uint16_t* vt_base = rw.v + static_cast<int64_t>(k0) * p.v_token_stride;
  const uint16_t* qs = st.q[buf];
  const uint16_t* gs = st.dout[buf];

  ra_mma_acc<16> sct, dpt, sc, dp;  // S^T, dP^T (keys as rows); S, dP (one-tile segments)
  ra_mma_zero(sct);
  ra_mma_zero(dpt);
  ra_mma_zero(sc);
  ra_mma_zero(dp);
  // One chunk's K / V operands at a time (re-read per row tile: L1 hits), as in the wave kernel.
#pragma unroll 1
  for (int c = 0; c < D / W; ++c) {
    ra_mma_rows<W, 16> kc, vc, qr, dr;
    ra_mma_load_rows(kc, kt_base + c * W, p.k_token_stride, nkt, lane);
    ra_mma_load_rows(vc, vt_base + c * W, p.v_token_stride, nkt, lane);
    ra_mma_load_rows(qr, qs + c * W, S, kTiledBwdRows, lane);
    ra_mma_load_rows(dr, gs + c * W, S, kTiledBwdRows, lane);
    ra_mma_dot<T>(sct, kc, qr);
    ra_mma_dot<T>(dpt, vc, dr);
    if (one_tile) {
      ra_mma_dot<T>(sc, qr, kc);
      ra_mma_dot<T>(dp, dr, vc);
    }
  }
  // P^T and dS^T: element (key, row) with the row's staged LSE and Delta.
#pragma unroll
  for (int i = 0; i < E; ++i) {
    const int key = ra_mma_acc_row(lane, i);
    const int col = ra_mma_acc_col(lane, i);
    const bool live = key < nkt && col < nrows;
    const float pr = live ? exp2f(sct.x[i] * qscale - st.lse2[buf][col]) : 0.f;
    sct.x[i] = pr;
    dpt.x[i] = pr * (dpt.x[i] - st.delta[buf][col]);
  }
  const ra_mma_pfrag<16> pt_f = ra_mma_to_pfrag<T, 16>(sct);
  const ra_mma_pfrag<16> dst_f = ra_mma_to_pfrag<T, 16>(dpt);
  {
    ra_mma_vrows<DS, 16> dov;
    ra_mma_load_vrows(dov, gs + slice * DS, S, kTiledBwdRows, lane);
    ra_mma_pv<T>(dv, pt_f, dov);
  }
  {
    ra_mma_vrows<DS, 16> qv;
    ra_mma_load_vrows(qv, qs + slice * DS, S, kTiledBwdRows, lane);
    ra_mma_pv<T>(dk, dst_f, qv);
  }
  if (!one_tile) return;
  // dS with rows as rows; every key of the segment is in this tile, so dQ is complete.
#pragma unroll
  for (int i = 0; i < E; ++i) {
    const int row = ra_mma_acc_row(lane, i);
    const int key = ra_mma_acc_col(lane, i);
    const bool live = key < nkt && row < nrows;
    const float pr = live ? exp2f(sc.x[i] * qscale - st.lse2[buf][row]) : 0.f;
    sc.x[i] = pr * (dp.x[i] - st.delta[buf][row]);
  }
  const ra_mma_pfrag<16> ds_f = ra_mma_to_pfrag<T, 16>(sc);
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
  const TiledRowMap rows(r0, group);
  auto dq_row = [&](int i) {
    int64_t j;
    int h;
    rows.at(i, j, h);
    return rw.dq + (s.q_token0 + j) * p.dq_token_stride + (hq0 + h) * p.dq_head_stride +
           slice * DS;
  };
  ra_mma_store_rows_at<T>(dq, dq_row, nrows, lane);
}

#endif  // RA_HAS_MMA

// Pass 2, block variant: grid-stride over (segment, kv head, key group) items; wave w of the
// block takes key tile KTG * group + w / SLICES, slice w % SLICES.
template <typename T, int D>
__global__ void __launch_bounds__(kTiledBwdBlockThreads)
    small_seq_tiled_bwd_dkv_block_kernel(const SmallSeqTiledParams p) {
  constexpr int THREADS = kTiledBwdBlockThreads;
  constexpr int WAVE = RA_WAVE_SIZE;
  constexpr int SLICES = tiled_bwd_slices(WAVE, D);
  constexpr int KTG = tiled_bwd_block_tiles(THREADS, WAVE, D);
  const int tid = threadIdx.x;
  const int lane = tid % WAVE;
  const int w = tid / WAVE;
  const int slice = w % SLICES;
  const int64_t groups = tiled_bwd_dkv_block_groups(p, KTG);
  const int64_t per_seg = groups * p.num_heads_kv;
  const int64_t items = static_cast<int64_t>(p.batch) * per_seg;
#if RA_HAS_MMA
  __shared__ TiledBwdRowStage<D> stage;
#endif
  for (int64_t item = blockIdx.x; item < items; item += gridDim.x) {
    const int seg = static_cast<int>(item / per_seg);
    const int64_t rest = item - seg * per_seg;
    const int hk = static_cast<int>(rest / groups);
    const int64_t kg = rest - static_cast<int64_t>(hk) * groups;
    const TiledBounds b = tiled_fetch_bounds(p, seg);
    const TiledSegment s = tiled_resolve_segment(p, seg, b);
    if (kg == 0 && w == 0) tiled_bwd_edges<T, D>(p, seg, hk, b, s, lane);
    if (!s.valid) continue;  // block-uniform, as every branch below up to the row loop
    const int kt = static_cast<int>(kg * KTG) + w / SLICES;
    if (tiled_bwd_one_row_tile(p, s)) {
#if RA_HAS_MMA
      if (kg == 0 && w < SLICES) tiled_bwd_row_tile_mma<T, D>(p, hk, slice, s, lane);
#else
      if (kg == 0 && w < SLICES) {
        for (int t = 0; t * kTiledBwdKeys < s.nk; ++t)
          tiled_bwd_dkv_scalar<T, D>(p, hk, t, slice, s, lane);
        if (s.nk > kTiledBwdKeys) tiled_bwd_dq_scalar<T, D>(p, hk, 0, slice, s, lane);
        if (s.nk == 0) tiled_bwd_dkv_scalar<T, D>(p, hk, 0, slice, s, lane);  // dq = 0
      }
#endif
      continue;
    }
    // Key group 0 always runs (its tile 0 writes the dQ of a segment without keys: zeros);
    // later groups only over the segment's keys.
    if (kg > 0 && kg * KTG * kTiledBwdKeys >= s.nk) continue;
    const bool active = kt == 0 || static_cast<int64_t>(kt) * kTiledBwdKeys < s.nk;
#if RA_HAS_MMA
    constexpr int DS = tiled_bwd_slice(WAVE, D);
    const int group = p.num_heads_q / p.num_heads_kv;
    const int hq0 = hk * group;
    const TiledBwdRows rw = tiled_bwd_rows(p, hk, s);
    const int64_t nrows_all = static_cast<int64_t>(s.nq) * group;
    const int64_t ntiles = (nrows_all + kTiledBwdRows - 1) / kTiledBwdRows;
    auto tile_rows = [&](int64_t t) {
      const int64_t left = nrows_all - t * kTiledBwdRows;
      return left < kTiledBwdRows ? static_cast<int>(left) : kTiledBwdRows;
    };
    ra_mma_out<DS, 16> dk, dv;  // [key][slice column], fp32
    ra_mma_zero(dk);
    ra_mma_zero(dv);
    TiledBwdRowStageRegs<D, THREADS> staged;
    tiled_bwd_stage_rows_load<D, THREADS>(staged, p, s, rw, hq0, group, 0, tile_rows(0), tid);
    tiled_bwd_stage_rows_store<D, THREADS>(stage, 0, staged, tid);
    __syncthreads();
    for (int64_t t = 0; t < ntiles; ++t) {
      // Rows of tile t + 1 into registers while tile t is computed from shared memory, then
      // into the other buffer (last read in iteration t - 1, closed by its barrier).
      if (t + 1 < ntiles)
        tiled_bwd_stage_rows_load<D, THREADS>(staged, p, s, rw, hq0, group,
                                              (t + 1) * kTiledBwdRows, tile_rows(t + 1), tid);
      if (active)
        tiled_bwd_dkv_block_step<T, D>(p, s, rw, stage, static_cast<int>(t & 1), hq0, group,
                                       t * kTiledBwdRows, tile_rows(t), kt, slice, dk, dv, lane);
      if (t + 1 < ntiles)
        tiled_bwd_stage_rows_store<D, THREADS>(stage, static_cast<int>((t + 1) & 1), staged,
                                               tid);
      __syncthreads();
    }
    const int k0 = kt * kTiledBwdKeys;
    const int nkt = s.nk - k0;
    if (!active || nkt <= 0) continue;
#pragma unroll
    for (int i = 0; i < DS / 16; ++i)
#pragma unroll
      for (int e = 0; e < static_cast<int>(sizeof(dk.x[0]) / sizeof(float)); ++e)
        dk.x[i][e] *= p.softmax_scale;
    ra_mma_store_rows<T>(dv, rw.dv + static_cast<int64_t>(k0) * p.dv_token_stride + slice * DS,
                         p.dv_token_stride, nkt, lane);
    ra_mma_store_rows<T>(dk, rw.dk + static_cast<int64_t>(k0) * p.dk_token_stride + slice * DS,
                         p.dk_token_stride, nkt, lane);
#else
    // Targets without matrix units: each wave its (key tile, slice) as the wave kernel does.
    if (active) tiled_bwd_dkv_scalar<T, D>(p, hk, kt, slice, s, lane);
#endif
  }
}

// The dQ block kernel's key tiles (tiled_smem.h): V at K's stride, since pass 3 reads V rows
// as score operands (dP = dO V^T), as it reads K.
template <int D>
using TiledBwdKeyStage = TiledStage<D, TiledSmemStride<D>::kK>;
static_assert(kTiledBwdKeys == kTiledStageRows, "the dQ block kernel stages whole key tiles");

// Pass 3, block variant: grid-stride over (segment, kv head, row group) items of segments with
// more than one key tile and more than one row tile; wave w takes row tile RTG * group +
// w / SLICES, slice w % SLICES.
template <typename T, int D>
__global__ void RA_LAUNCH_BOUNDS_MIN_BLOCKS(kTiledBwdDqBlockThreads, 3)
    small_seq_tiled_bwd_dq_block_kernel(const SmallSeqTiledParams p) {
  constexpr int THREADS = kTiledBwdDqBlockThreads;
  constexpr int WAVE = RA_WAVE_SIZE;
  constexpr int SLICES = tiled_bwd_slices(WAVE, D);
  constexpr int RTG = tiled_bwd_block_tiles(THREADS, WAVE, D);
  const int tid = threadIdx.x;
  const int lane = tid % WAVE;
  const int w = tid / WAVE;
  const int slice = w % SLICES;
  const int group = p.num_heads_q / p.num_heads_kv;
  const int64_t groups = tiled_bwd_dq_block_groups(p, RTG);
  const int64_t per_seg = groups * p.num_heads_kv;
  const int64_t items = static_cast<int64_t>(p.batch) * per_seg;
#if RA_HAS_MMA
  __shared__ TiledBwdKeyStage<D> stage;
#endif
  for (int64_t item = blockIdx.x; item < items; item += gridDim.x) {
    const int seg = static_cast<int>(item / per_seg);
    const int64_t rest = item - seg * per_seg;
    const int hk = static_cast<int>(rest / groups);
    const int64_t rg = rest - static_cast<int64_t>(hk) * groups;
    const TiledSegment s = tiled_resolve_segment(p, seg, tiled_fetch_bounds(p, seg));
    // pass 2 wrote the dQ of segments with one key tile or one row tile (block-uniform, as
    // every branch up to the key loop)
    if (!s.valid || s.nk <= kTiledBwdKeys || tiled_bwd_one_row_tile(p, s)) continue;
    const int64_t nrows_all = static_cast<int64_t>(s.nq) * group;
    if (rg * RTG * kTiledBwdRows >= nrows_all) continue;
    const int64_t rt = rg * RTG + w / SLICES;
    const bool active = rt * kTiledBwdRows < nrows_all;
#if RA_HAS_MMA
    constexpr int DS = tiled_bwd_slice(WAVE, D);
    constexpr int W = DS;
    constexpr int E = ra_mma_acc<16>::kElems;
    constexpr int KT = kTiledBwdKeys;
    constexpr int S = TiledSmemStride<D>::kK;
    // Q / dO held across the key tiles on 64-lane waves only: on sm_90 holding them at d = 64
    // made ptxas spill.
    constexpr bool kResident = kTiledBwdResident<D> && WAVE == 64;
    const int hq0 = hk * group;
    const int64_t r0 = rt * kTiledBwdRows;
    const int64_t left = nrows_all - r0;
    const int nrows = left < kTiledBwdRows ? (left > 0 ? static_cast<int>(left) : 0)
                                           : kTiledBwdRows;
    const int nk = s.nk;
    const float qscale = p.softmax_scale * kTiledBwdLog2e;
    const TiledBwdRows rw = tiled_bwd_rows(p, hk, s);
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
    TiledBwdPanel<D, kResident ? W : D> qp, gp;  // Q and dO rows (unused unless resident)
    if constexpr (kResident) {
#pragma unroll
      for (int c = 0; c < D / W; ++c) {
        ra_mma_load_rows_at(qp.c[c], [&](int i) { return q_row(i) + c * W; }, nrows, lane);
        ra_mma_load_rows_at(gp.c[c], [&](int i) { return do_row(i) + c * W; }, nrows, lane);
      }
    }
    TiledBwdRowTerms terms[kRaMmaAccSlots];
#pragma unroll
    for (int i = 0; i < E; ++i) {
      const int row = ra_mma_acc_row(lane, i);
      terms[ra_mma_acc_slot(i)] = row < nrows ? tiled_bwd_row_terms_at(p, s, hq0, rows, row)
                                              : TiledBwdRowTerms{0.f, 0.f};
    }
    ra_mma_out<DS, 16> dq;
    ra_mma_zero(dq);
    const int ntiles = (nk + KT - 1) / KT;
    TiledStageRegs<D, THREADS> staged;
    tiled_stage_load<D, THREADS>(staged, rw.k, p.k_token_stride, rw.v, p.v_token_stride, 0, nk,
                                 tid);
    tiled_stage_store(stage, 0, staged, tid);
    __syncthreads();
    for (int t = 0; t < ntiles; ++t) {
      const int k0 = t * KT;
      const int buf = t & 1;
      // Key tile t + 1 into registers while tile t is computed, then into the other buffer
      // (last read in iteration t - 1, closed by its barrier).
      if (t + 1 < ntiles)
        tiled_stage_load<D, THREADS>(staged, rw.k, p.k_token_stride, rw.v, p.v_token_stride,
                                     k0 + KT, nk, tid);
      if (active) {
        const int nkt = nk - k0;
        ra_mma_acc<16> sc, dpa;
        ra_mma_zero(sc);
        ra_mma_zero(dpa);
        if constexpr (kResident) {
#pragma unroll
          for (int c = 0; c < D / W; ++c) {
            ra_mma_rows<W, 16> kr, vr;
            ra_mma_load_rows(kr, stage.k[buf] + c * W, S, KT, lane);
            ra_mma_load_rows(vr, stage.v[buf] + c * W, S, KT, lane);
            ra_mma_dot<T>(sc, qp.c[c], kr);
            ra_mma_dot<T>(dpa, gp.c[c], vr);
          }
        } else {
#pragma unroll 1
          for (int c = 0; c < D / W; ++c) {
            ra_mma_rows<W, 16> qc, gc, kr, vr;
            ra_mma_load_rows_at(qc, [&](int i) { return q_row(i) + c * W; }, nrows, lane);
            ra_mma_load_rows_at(gc, [&](int i) { return do_row(i) + c * W; }, nrows, lane);
            ra_mma_load_rows(kr, stage.k[buf] + c * W, S, KT, lane);
            ra_mma_load_rows(vr, stage.v[buf] + c * W, S, KT, lane);
            ra_mma_dot<T>(sc, qc, kr);
            ra_mma_dot<T>(dpa, gc, vr);
          }
        }
        ra_mma_vrows<DS, 16> kslice;
        ra_mma_load_vrows(kslice, stage.k[buf] + slice * DS, S, KT, lane);
#pragma unroll
        for (int i = 0; i < E; ++i) {
          const bool live = ra_mma_acc_col(lane, i) < nkt && ra_mma_acc_row(lane, i) < nrows;
          const TiledBwdRowTerms tm = terms[ra_mma_acc_slot(i)];
          const float pr = live ? exp2f(sc.x[i] * qscale - tm.lse2) : 0.f;
          sc.x[i] = pr * (dpa.x[i] - tm.delta);
        }
        const ra_mma_pfrag<16> ds_f = ra_mma_to_pfrag<T, 16>(sc);
        ra_mma_pv<T>(dq, ds_f, kslice);
      }
      if (t + 1 < ntiles)
        tiled_stage_store(stage, (t + 1) & 1, staged, tid);
      __syncthreads();
    }
    if (!active) continue;
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
#else
    // Targets without matrix units: each wave its (row tile, slice) as the wave kernel does.
    if (active) tiled_bwd_dq_scalar<T, D>(p, hk, rt, slice, s, lane);
#endif
  }
}

}  // namespace small_seq
