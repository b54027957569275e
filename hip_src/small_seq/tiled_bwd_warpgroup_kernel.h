// Tiled small-seq backward, warpgroup variant (Hopper, sm_90a): the dK / dV and dQ passes of
// tiled_bwd_kernel.h in one kernel with warpgroup matrix products (common/wgmma.h), for
// histories of at most kTiledBwdWarpgroupMaxKeys keys (docs/kernels.md#warpgroup-backward).
//
// Why: on many candidates the mma.sync backward is bound by its instruction stream (16-row
// tiles, fragments re-read and permuted per product, head-dim slices recomputing the scores),
// as the forward was before its warpgroup kernel. Here the matrix unit reads K, V, Q, dO, P and
// dS from shared memory itself.
//
// Work item = (segment, kv head), one warpgroup (128 threads) per block:
//   1. K and V of the segment's keys are staged once (the forward's layout and copy,
//      tiled_warpgroup_stage: KEYS rows, zeros past the history).
//   2. The segment's rows (r = j * group + h, as in every tiled kernel) in tiles of 64; each
//      tile's Q and dO are copied one tile ahead (two buffers), rows past the segment as zeros.
//      Per tile, with the forward's LSE and pass 1's Delta of the thread's two rows:
//        S = Q K^T, dP = dO V^T           (m64nKEYS, both operands from shared memory)
//        P = exp2(S * scale log2e - lse log2e), dS = P (dP - Delta)   (fp32, in registers)
//        dQ = scale dS K                  (m64nD, dS from registers, K N-major: complete, since
//                                          the tile's rows see every key)
//        dV += P^T dO, dK += dS^T Q       (m64nD, P / dS / dO / Q read transposed from shared
//                                          memory: P and dS are stored there as [rows][keys])
//      dQ goes out through the tile's Q buffer (free once dK's product is done) in 16-byte
//      pieces.
//   3. dK (times the scale) and dV of the segment's keys from the fp32 accumulators, once.
// The dV / dK products have M = 64 keys: a 16-key history leaves rows 16..63 of those
// accumulators unused (never stored), which costs matrix-unit time the bytes hide.
//
// Numerics are tiled_bwd_kernel.h's: P, dP, dS fp32; P, dS rounded to the input dtype only as
// product operands; every gradient accumulates in fp32 and is rounded once. Each gradient
// element has one writer summing in a fixed order (row tiles in order): deterministic.
// Bad segments, padding rows and K/V rows no segment covers are handled as in pass 2
// (tiled_bwd_edges); Delta and the dq of q padding rows come from pass 1.
//
// Shared memory (dynamic, tiled_bwd_warpgroup_smem_bytes): K, V, two (Q, dO) buffers, P, dS.
// Where the arch-specific features are missing (RA_HAS_WGMMA 0) the kernel body is empty and
// the launcher never selects it.
#pragma once

#include "tiled_bwd_kernel.h"
#include "tiled_fwd_warpgroup_kernel.h"

namespace small_seq {

// Longest history of the kernel: the keys of one m64n64 score product, so that one pass over a
// tile's rows completes its dQ.
constexpr int kTiledBwdWarpgroupMaxKeys = kTiledWarpgroupKeys;

// Dynamic shared memory of a block: K and V (tiled_warpgroup_keys rows each), two buffers of a
// tile's Q and dO, the tile's P and dS as 64 x 64 operands, and 1024 bytes to align the start.
template <int D>
RA_HOST_DEVICE constexpr int64_t tiled_bwd_warpgroup_smem_bytes(int max_seqlen_kv) {
  return 2 * tiled_warpgroup_keys(max_seqlen_kv) * D * 2 +
         2 * 2 * static_cast<int64_t>(kTiledWarpgroupRows) * D * 2 +
         2 * static_cast<int64_t>(kTiledWarpgroupRows) * kTiledWarpgroupKeys * 2 + 1024;
}

#if RA_HAS_WGMMA

// One valid segment's dK, dV and dQ for kv head hk (the whole block: one warpgroup). `smem` /
// `smem_ptr`: the 1024-byte aligned start of the block's buffers; kp: keys of the K / V
// buffers.
template <typename T, int D, int KEYS>
RA_DEVICE void tiled_bwd_warpgroup_segment(const SmallSeqTiledParams& p, const TiledSegment& s,
                                           const int hk, const int group, uint8_t* smem_ptr,
                                           const uint32_t smem, const int kp, const int tid) {
  constexpr int ROWS = kTiledWarpgroupRows;
  constexpr int kTileBytes = ROWS * D * 2;
  constexpr int kSteps = D / 16;  // k steps of the score products
  constexpr int kChunk = KEYS < 32 ? KEYS : 32;
  const uint32_t sk = smem;
  const uint32_t sv = sk + kp * D * 2;
  const uint32_t tiles_at = sv + kp * D * 2;  // buffer b: Q at + 2 b kTileBytes, dO after it
  const uint32_t sp = tiles_at + 4 * kTileBytes;
  const uint32_t sds = sp + ROWS * kTiledWarpgroupKeys * 2;
  uint8_t* const sp_ptr = smem_ptr + (sp - smem);
  uint8_t* const sds_ptr = smem_ptr + (sds - smem);
  const int warp = tid / 32;
  const int g = (tid % 32) / 4;
  const int t = tid % 4;
  const int nk = s.nk;
  const float scale2 = p.softmax_scale * kTiledBwdLog2e;
  const int64_t seg_rows = static_cast<int64_t>(s.nq) * group;
  const int64_t tiles = (seg_rows + ROWS - 1) / ROWS;
  const TiledBwdRows rows = tiled_bwd_rows(p, hk, s);
  const int hq0 = hk * group;
  const uint16_t* q = rows.q + s.q_token0 * p.q_token_stride + hq0 * p.q_head_stride;
  const uint16_t* dout = rows.dout + s.q_token0 * p.do_token_stride + hq0 * p.do_head_stride;
  uint16_t* dq_out = rows.dq + s.q_token0 * p.dq_token_stride + hq0 * p.dq_head_stride;
  const auto load_tile = [&](int64_t tile, int buf) {
    const uint32_t at = tiles_at + 2 * buf * kTileBytes;
    tiled_warpgroup_load_rows<D>(q, p.q, p.q_token_stride, p.q_head_stride, group, tile * ROWS,
                                 seg_rows, at, tid);
    tiled_warpgroup_load_rows<D>(dout, p.dout, p.do_token_stride, p.do_head_stride, group,
                                 tile * ROWS, seg_rows, at + kTileBytes, tid);
  };
  if (tiles > 0) {
    tiled_warpgroup_stage<D, KEYS, 128>(sk, sv, p, rows.k, rows.v, nk, kp, tid);
    load_tile(0, 0);
  }
  ra_cp_async_commit();
  float dk[D / 2], dv[D / 2];
#pragma unroll
  for (int i = 0; i < D / 2; ++i) dk[i] = dv[i] = 0.f;
  for (int64_t tile = 0; tile < tiles; ++tile) {
    const int buf = static_cast<int>(tile & 1);
    if (tile + 1 < tiles) load_tile(tile + 1, buf ^ 1);
    ra_cp_async_commit();
    ra_cp_async_wait<1>();  // this tile's copies have landed (the next one's may not)
    ra_fence_proxy_async();
    __syncthreads();
    const uint32_t sq = tiles_at + 2 * buf * kTileBytes;
    const uint32_t sdo = sq + kTileBytes;
    uint8_t* const sq_ptr = smem_ptr + (sq - smem);
    const int64_t r0 = tile * ROWS;
    const TiledRowMap map(r0, group);
    // LSE (log2 domain) and Delta of this thread's rows 16 warp + g and + 8; a row past the
    // segment gets lse +inf (P = 0) and Delta 0 (its Q and dO are zeros).
    float lse2[2], delta[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int i = 16 * warp + g + 8 * r;
      if (r0 + i < seg_rows) {
        const TiledBwdRowTerms terms = tiled_bwd_row_terms_at(p, s, hq0, map, i);
        lse2[r] = terms.lse2;
        delta[r] = terms.delta;
      } else {
        lse2[r] = INFINITY;
        delta[r] = 0.f;
      }
    }
    // Keys in chunks of up to 32 (two chunks of a 64-key history), so that the fp32 scores and
    // dP of a chunk (32 registers) sit beside dK and dV without spilling: per chunk
    // S = Q K^T and dP = dO V^T, then P (keys past the history: 0) and dS = P (dP - Delta),
    // rounded into their [rows][keys] buffers and dS into the register operand of dQ.
    uint32_t dsa[KEYS / 16][4];
#pragma unroll
    for (int c = 0; c < KEYS / kChunk; ++c) {
      float sc[kChunk / 2], dp[kChunk / 2];
      ra_wgmma_fence();
#pragma unroll
      for (int st = 0; st < kSteps; ++st)
        ra_wgmma_ss<T, kChunk>(sc, ra_wgmma_desc(ra_wgmma_step_address(sq, st, ROWS, 0)),
                               ra_wgmma_desc(ra_wgmma_step_address(sk, st, kp, c * kChunk)),
                               st > 0);
#pragma unroll
      for (int st = 0; st < kSteps; ++st)
        ra_wgmma_ss<T, kChunk>(dp, ra_wgmma_desc(ra_wgmma_step_address(sdo, st, ROWS, 0)),
                               ra_wgmma_desc(ra_wgmma_step_address(sv, st, kp, c * kChunk)),
                               st > 0);
      ra_wgmma_commit();
      ra_wgmma_wait<0>();
#pragma unroll
      for (int i = 0; i < kChunk / 2; ++i) {
        ra_wgmma_pin(sc[i]);
        ra_wgmma_pin(dp[i]);
      }
      // Element 4j + e: row 16 warp + g + 8 (e / 2), key c kChunk + 8j + 2t + e % 2.
#pragma unroll
      for (int i = 0; i < kChunk / 2; ++i) {
        const int r = (i / 2) % 2;
        const bool past = c * kChunk + 8 * (i / 4) + 2 * t + (i % 2) >= nk;
        sc[i] = past ? 0.f : exp2f(fmaf(sc[i], scale2, -lse2[r]));
        dp[i] = sc[i] * (dp[i] - delta[r]);
      }
      // Rows 16 warp + g + 8r, 16-byte chunk (c kChunk / 8 + j) ^ g: both rows are g modulo 8.
#pragma unroll
      for (int j = 0; j < kChunk / 8; ++j)
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const int at = (16 * warp + g + 8 * r) * 128 + (((c * kChunk / 8 + j) ^ g) << 4) + 4 * t;
          *reinterpret_cast<uint32_t*>(sp_ptr + at) =
              ra_mma_pack2<T>(sc[4 * j + 2 * r], sc[4 * j + 2 * r + 1]);
          *reinterpret_cast<uint32_t*>(sds_ptr + at) =
              ra_mma_pack2<T>(dp[4 * j + 2 * r], dp[4 * j + 2 * r + 1]);
        }
#pragma unroll
      for (int kk = 0; kk < kChunk / 16; ++kk)
#pragma unroll
        for (int x = 0; x < 4; ++x)
          dsa[c * kChunk / 16 + kk][x] =
              ra_mma_pack2<T>(dp[8 * kk + 2 * x], dp[8 * kk + 2 * x + 1]);
    }
    ra_fence_proxy_async();
    __syncthreads();  // every warp's P and dS rows are in shared memory
    ra_wgmma_fence();
#pragma unroll
    for (int st = 0; st < ROWS / 16; ++st)
      ra_wgmma_ss_tt<T, D>(dv, ra_wgmma_desc_n_major(sp + st * 16 * 128, ROWS * 128),
                           ra_wgmma_desc_n_major(sdo + st * 16 * 128, ROWS * 128), 1);
#pragma unroll
    for (int st = 0; st < ROWS / 16; ++st)
      ra_wgmma_ss_tt<T, D>(dk, ra_wgmma_desc_n_major(sds + st * 16 * 128, ROWS * 128),
                           ra_wgmma_desc_n_major(sq + st * 16 * 128, ROWS * 128), 1);
    ra_wgmma_commit();
    // dQ = scale dS K in 64-column halves (K's panels), each into the Q buffer once every
    // product before it is done (dK's reads Q): 32 accumulator registers at a time beside dK
    // and dV.
#pragma unroll
    for (int half = 0; half < D / 64; ++half) {
      float dq[32];
#pragma unroll
      for (int i = 0; i < 32; ++i) dq[i] = 0.f;
      ra_wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < KEYS / 16; ++kk)
        ra_wgmma_rs<T, 64>(
            dq, dsa[kk],
            ra_wgmma_desc_n_major(sk + half * kp * 128 + (16 * kk) * 128, kp * 128), 1);
      ra_wgmma_commit();
      ra_wgmma_wait<0>();
#pragma unroll
      for (int i = 0; i < 32; ++i) ra_wgmma_pin(dq[i]);
      if (half == 0) __syncthreads();  // every warp's dK product is done: the Q buffer is free
#pragma unroll
      for (int r = 0; r < 2; ++r)
        tiled_warpgroup_acc_row_to_buffer<T, 64>(sq_ptr + half * ROWS * 128, dq, r,
                                                 p.softmax_scale, tid);
    }
    __syncthreads();
    tiled_warpgroup_store_rows<D>(dq_out, p.dq_token_stride, p.dq_head_stride, map, r0,
                                  seg_rows, sq_ptr, tid);
    __syncthreads();  // the buffer is refilled by the copies of the tile after next
  }
  ra_cp_async_wait<0>();
#pragma unroll
  for (int i = 0; i < D / 2; ++i) {
    ra_wgmma_pin(dk[i]);
    ra_wgmma_pin(dv[i]);
  }
  // dK and dV of keys 16 warp + g (+ 8): accumulator rows are keys, columns the head dim.
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int key = 16 * warp + g + 8 * r;
    if (key >= nk) continue;
    uint16_t* dk_row = rows.dk + key * p.dk_token_stride + 2 * t;
    uint16_t* dv_row = rows.dv + key * p.dv_token_stride + 2 * t;
#pragma unroll
    for (int c = 0; c < D / 8; ++c) {
      *reinterpret_cast<uint32_t*>(dk_row + 8 * c) = ra_mma_pack2<T>(
          dk[4 * c + 2 * r] * p.softmax_scale, dk[4 * c + 2 * r + 1] * p.softmax_scale);
      *reinterpret_cast<uint32_t*>(dv_row + 8 * c) =
          ra_mma_pack2<T>(dv[4 * c + 2 * r], dv[4 * c + 2 * r + 1]);
    }
  }
}

#endif  // RA_HAS_WGMMA

// Grid-stride over (segment, kv head) items; also writes what pass 2 writes besides a valid
// segment's gradients (tiled_bwd_edges, warp 0).
template <typename T, int D, int KEYS>
__global__ void RA_LAUNCH_BOUNDS_MIN_BLOCKS(128, 2)
    small_seq_tiled_bwd_warpgroup_kernel(const SmallSeqTiledParams p) {
#if RA_HAS_WGMMA
  const int tid = threadIdx.x;
  const int group = p.num_heads_q / p.num_heads_kv;
  const int kp = static_cast<int>(tiled_warpgroup_keys(p.max_seqlen_kv));
  RA_DYNAMIC_SHARED(ra_vec8, tiled_bwd_warpgroup_smem);
  const uint32_t raw = ra_smem_address(tiled_bwd_warpgroup_smem);
  const uint32_t pad = (1024u - (raw & 1023u)) & 1023u;
  uint8_t* const smem_ptr = reinterpret_cast<uint8_t*>(tiled_bwd_warpgroup_smem) + pad;
  const int64_t items = static_cast<int64_t>(p.batch) * p.num_heads_kv;
  for (int64_t item = blockIdx.x; item < items; item += gridDim.x) {
    const int seg = static_cast<int>(item / p.num_heads_kv);
    const int hk = static_cast<int>(item - static_cast<int64_t>(seg) * p.num_heads_kv);
    const TiledBounds b = tiled_fetch_bounds(p, seg);
    const TiledSegment s = tiled_resolve_segment(p, seg, b);
    if (tid < 32) tiled_bwd_edges<T, D>(p, seg, hk, b, s, tid);
    if (!s.valid) continue;
    tiled_bwd_warpgroup_segment<T, D, KEYS>(p, s, hk, group, smem_ptr, raw + pad, kp, tid);
    __syncthreads();  // every warp is done with this segment's K / V
  }
#endif
}

}  // namespace small_seq
