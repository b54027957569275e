// Tiled small-seq backward, warpgroup variant (Hopper, sm_90a): the dK / dV and dQ passes of
// tiled_bwd_kernel.h with warpgroup matrix products (common/wgmma.h), for histories of at most
// kTiledBwdWarpgroupMaxKeys keys (docs/kernels.md#warpgroup-backward).
//
// Why: on many candidates the mma.sync backward is bound by its instruction stream (16-row
// tiles, fragments re-read and permuted per product, head-dim slices recomputing the scores),
// as the forward was before its warpgroup kernel. Here the matrix unit reads K, V, Q, dO, P and
// dS from shared memory itself.
//
// dK / dV kernel, work item = (segment, kv head, key block of 64 keys), one warpgroup (128
// threads) per block:
//   1. K and V of the block's keys are staged once (the forward's layout and copy,
//      tiled_warpgroup_stage: KEYS rows, zeros past the history).
//   2. The segment's rows (r = j * group + h, as in every tiled kernel) in tiles of 64; each
//      tile's Q and dO are copied one tile ahead (two buffers), rows past the segment as zeros.
//      Per tile, with the forward's LSE and Delta = rowsum(P dP) - dlse of the thread's two rows
//      (the block holds their whole history, so pass 1 does not run):
//        S = Q K^T, dP = dO V^T           (m64nKEYS in chunks of 16 keys, from shared memory)
//        P = exp2(S * scale log2e - lse log2e), dS = P (dP - Delta)   (fp32, in registers)
//        dV += P^T dO, dK += dS^T Q       (m64nD, P / dS / dO / Q read transposed from shared
//                                          memory: P and dS are stored there as [rows][keys])
//      The tile's dQ = scale dS K follows (dS and K from shared memory; complete, since the
//      block holds every key), out through the tile's Q buffer in 16-byte pieces.
//   3. dK (times the scale) and dV of the block's keys from the fp32 accumulators, once.
// Past one key block (no dQ here) tiled_bwd_warpgroup_key_block_transposed serves instead:
// S^T = K Q^T and dP^T = V dO^T as m64n64 products whose accumulators, rows being keys, are the
// register operands of dV += P^T dO and dK += dS^T Q.
// The dV / dK products have M = 64 keys: a 16-key history leaves rows 16..63 of those
// accumulators unused, which costs matrix-unit time the bytes hide. Those rows come from
// columns 16..63 of the P / dS buffers, which 16-key products never write (stale shared
// memory): they must never be stored.
// dQ kernel (histories past one block, up to kTiledBwdWarpgroupStagedMaxKeys), work item =
// (segment, kv head), two warpgroups per block sharing all of the segment's K / V: per 64-row
// tile, every key block's S, dP, dS (registers only) and dQ += dS K, stored once. Longer
// histories stream K / V through a ring (tiled_bwd_warpgroup_dq_stream_kernel.h, the same sums
// in the same order).
//
// Numerics are tiled_bwd_kernel.h's: P, dP, dS fp32; P, dS rounded to the input dtype only as
// product operands; every gradient accumulates in fp32 and is rounded once. Each gradient
// element has one writer summing in a fixed order (row tiles, key blocks in order):
// deterministic. Bad segments, padding rows and K/V rows no segment covers are handled as in
// pass 2 (tiled_bwd_edges); Delta and the dq of q padding rows come from pass 1, except where
// the plan fuses Delta: where the dK / dV block holds every key of the history (WITH_DQ,
// FUSED_DELTA) as rowsum(P dP) - dlse from its own products, past one key block (more rows
// than the one- and two-tile walks take) from the dQ kernel, launched first, as
// rowsum(dO O) - dlse.
//
// This header holds the items and products; the kernels, which move whole row tiles by tensor
// tile copies, are in tiled_bwd_warpgroup_tma_kernel.h (with the staged dQ kernel), and
// tiled_bwd_warpgroup_two_tile_kernel.h and tiled_bwd_warpgroup_dq_stream_kernel.h. Where the
// arch-specific features are missing (RA_HAS_WGMMA 0) the kernel bodies are empty and the plan
// never names them. Shared memory (dynamic): tiled_bwd_warpgroup_smem_bytes.
#pragma once

#include "tiled_bwd_kernel.h"
#include "tiled_fwd_warpgroup_kernel.h"

namespace small_seq {

// Keys of one key block: the keys of one m64n64 score product, and the rows (M) of the dK / dV
// products. A history of at most one block is served whole by one item (dQ included).
constexpr int kTiledBwdWarpgroupBlockKeys = kTiledWarpgroupKeys;
// Longest history of the staged dQ kernel (small_seq_tiled_bwd_warpgroup_dq_tma_kernel),
// which holds all of a segment's keys: 225 KiB with three tile-copy buffers at d = 128. Past it the dQ kernel streams K / V (tiled_bwd_warpgroup_dq_stream_kernel.h).
constexpr int kTiledBwdWarpgroupStagedMaxKeys = 4 * kTiledBwdWarpgroupBlockKeys;
// Longest history of the warpgroup backward, the tiled kernels' own: every other kernel of it
// (the dK / dV kernel per key block, the one- and two-tile walks, the streaming dQ kernel)
// stages one 64-key block at a time.
constexpr int kTiledBwdWarpgroupMaxKeys = kSmallSeqTiledMaxSeqlenKv;
// Warpgroups per block of the dQ kernel: two, sharing the staged K / V, so that one's products
// run while the other loads or computes its softmax terms.
constexpr int kTiledBwdWarpgroupDqWarpgroups = 2;

// Keys per chunk of the score products: at d = 128 the chunk's fp32 S and dP must fit beside
// the dK / dV accumulators (128 registers); chunks of 32 spilled 100-300 bytes there.
constexpr int kTiledBwdWarpgroupChunk = 16;

// Key blocks per (segment, kv head) of max_seqlen_kv keys.
RA_HOST_DEVICE constexpr int tiled_bwd_warpgroup_blocks(int max_seqlen_kv) {
  return (max_seqlen_kv + kTiledBwdWarpgroupBlockKeys - 1) / kTiledBwdWarpgroupBlockKeys;
}

// Dynamic shared memory of a dK / dV block whose products take KEYS keys (16 or 64): K and V of
// one key block, two buffers of a tile's Q and dO, the tile's P and dS as 64 x 64 operands, and
// 1024 bytes to align the start.
template <int D>
RA_HOST_DEVICE constexpr int64_t tiled_bwd_warpgroup_smem_bytes(int keys) {
  return 2 * static_cast<int64_t>(keys) * D * 2 +
         2 * 2 * static_cast<int64_t>(kTiledWarpgroupRows) * D * 2 +
         2 * static_cast<int64_t>(kTiledWarpgroupRows) * kTiledWarpgroupKeys * 2 + 1024;
}

#if RA_HAS_WGMMA

// Where a (segment, kv head)'s rows of q, dout and dq start: row (j, h) of its GQA group lives
// at base + j * token stride + h * head stride (each tensor's own strides).
struct TiledBwdWarpgroupRows {
  const uint16_t* q;
  const uint16_t* dout;
  uint16_t* dq;
  const uint16_t* out;  // the q batch's rows only: + (q_token0 + j) * token + (hq0 + h) * head
};

RA_DEVICE TiledBwdWarpgroupRows tiled_bwd_warpgroup_rows(const SmallSeqTiledParams& p,
                                                         const TiledSegment& s,
                                                         const TiledBwdRows& rows,
                                                         const int hq0) {
  return TiledBwdWarpgroupRows{
      rows.q + s.q_token0 * p.q_token_stride + hq0 * p.q_head_stride,
      rows.dout + s.q_token0 * p.do_token_stride + hq0 * p.do_head_stride,
      rows.dq + s.q_token0 * p.dq_token_stride + hq0 * p.dq_head_stride,
      static_cast<const uint16_t*>(p.out) + s.q_batch * p.out_batch_stride};
}

// Issues the cp.async copies of one tile's Q (into `sq`) and dO (right after it), tile rows
// r0 .. r0 + 63, rows at or past seg_rows as zeros (one warpgroup; not committed).
template <int D>
RA_DEVICE void tiled_bwd_warpgroup_load_tile(const SmallSeqTiledParams& p,
                                             const TiledBwdWarpgroupRows& at, const int group,
                                             const int64_t r0, const int64_t seg_rows,
                                             const uint32_t sq, const int wtid) {
  tiled_warpgroup_load_rows<D>(at.q, p.q, p.q_token_stride, p.q_head_stride, group, r0,
                               seg_rows, sq, wtid);
  tiled_warpgroup_load_rows<D>(at.dout, p.dout, p.do_token_stride, p.do_head_stride, group, r0,
                               seg_rows, sq + kTiledWarpgroupRows * D * 2, wtid);
}

// LSE (log2 domain) and the start of Delta of this thread's rows 16 warp + g and + 8 of the tile
// at r0, for a block that holds the rows' whole history (pass 1 did not run): `delta` gets
// -dlse (0 without dlse), to which tiled_bwd_warpgroup_scores adds rowsum(P dP). A row past the
// segment gets lse +inf (P = 0) and Delta 0 (its Q and dO are zeros).
RA_DEVICE void tiled_bwd_warpgroup_row_terms(const SmallSeqTiledParams& p,
                                             const TiledSegment& s, const int hq0,
                                             const TiledRowMap& map, const int64_t r0,
                                             const int64_t seg_rows, float (&lse2)[2],
                                             float (&delta)[2], const int wtid) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int i = 16 * (wtid / 32) + (wtid % 32) / 4 + 8 * r;
    if (r0 + i >= seg_rows) {
      lse2[r] = INFINITY;
      delta[r] = 0.f;
    } else {
      const TiledBwdRowTerms terms = tiled_bwd_row_terms_at<true>(p, s, hq0, map, i);
      lse2[r] = terms.lse2;
      delta[r] = terms.delta;
    }
  }
}

// S = Q K^T and dP = dO V^T of one chunk of kChunk keys (from key k0 + c kChunk of the K / V
// buffers, kp rows each) of a 64-row tile (Q at sq, dO at sdo), from shared memory; S becomes
// P = exp2(S scale log2e - lse log2e), 0 past the `live` keys of the history. Element 4j + e
// of a thread: row 16 warp + g + 8 (e / 2), key c kChunk + 8j + 2t + e % 2.
template <typename T, int D, int kChunk>
RA_DEVICE void tiled_bwd_warpgroup_chunk(const uint32_t sq, const uint32_t sdo,
                                         const uint32_t sk, const uint32_t sv, const int kp,
                                         const int k0, const int c, const int live,
                                         const float scale2, const float (&lse2)[2],
                                         float (&sc)[kChunk / 2], float (&dp)[kChunk / 2],
                                         const int wtid) {
  constexpr int kSteps = D / 16;  // k steps of the score products
  const int t = wtid % 4;
  ra_wgmma_fence();
#pragma unroll
  for (int st = 0; st < kSteps; ++st)
    ra_wgmma_ss<T, kChunk>(
        sc, ra_wgmma_desc(ra_wgmma_step_address(sq, st, kTiledWarpgroupRows, 0)),
        ra_wgmma_desc(ra_wgmma_step_address(sk, st, kp, k0 + c * kChunk)), st > 0);
#pragma unroll
  for (int st = 0; st < kSteps; ++st)
    ra_wgmma_ss<T, kChunk>(
        dp, ra_wgmma_desc(ra_wgmma_step_address(sdo, st, kTiledWarpgroupRows, 0)),
        ra_wgmma_desc(ra_wgmma_step_address(sv, st, kp, k0 + c * kChunk)), st > 0);
  ra_wgmma_commit();
  ra_wgmma_wait<0>();
#pragma unroll
  for (int i = 0; i < kChunk / 2; ++i) {
    ra_wgmma_pin(sc[i]);
    ra_wgmma_pin(dp[i]);
  }
#pragma unroll
  for (int i = 0; i < kChunk / 2; ++i) {
    const bool past = c * kChunk + 8 * (i / 4) + 2 * t + (i % 2) >= live;
    sc[i] = past ? 0.f : exp2f(fmaf(sc[i], scale2, -lse2[(i / 2) % 2]));
  }
}

// delta[r] += rowsum(P dP) over one chunk of this thread's row r (0: 16 warp + g, 1: + 8),
// summed across the four threads (t) that hold the row's keys.
template <int kChunk>
RA_DEVICE void tiled_bwd_warpgroup_add_rowsum(const float (&sc)[kChunk / 2],
                                              const float (&dp)[kChunk / 2],
                                              float (&delta)[2]) {
  float part[2] = {0.f, 0.f};
#pragma unroll
  for (int i = 0; i < kChunk / 2; ++i) part[(i / 2) % 2] = fmaf(sc[i], dp[i], part[(i / 2) % 2]);
#pragma unroll
  for (int r = 0; r < 2; ++r) delta[r] += ra_group_sum<4>(part[r]);
}

// P and dS of one 64-row tile (Q at sq, dO at sdo) against KEYS keys of the K / V buffers
// (kp rows each) from key k0, of which `live` are in the history (P = 0 past them). Keys go in
// chunks of kTiledBwdWarpgroupChunk, so that a chunk's fp32 scores and dP (16 registers) sit
// beside the dK / dV accumulators without spilling: per chunk S and dP
// (tiled_bwd_warpgroup_chunk), then dS = P (dP - Delta) in fp32. With STORE, P and dS are
// rounded into their [rows][keys] buffers (64 x 64 operands, columns from 0) for the dV / dK /
// dQ products; else dS is packed into `dsa`, the register operand of dQ's product. One
// warpgroup (wtid: thread within it).
//
// FUSED_DELTA (the block holds the row's whole history): Delta = rowsum(dO O) - dlse is
// computed here as rowsum(P dP) - dlse (the same sum: O = P V, so dO . O = sum_k P_k dO . V_k),
// with `delta` holding -dlse on entry. One chunk: from the chunk's own P and dP. More chunks: a
// first sweep of the score products sums rowsum(P dP) and the second computes dS (two more
// products per chunk instead of holding every chunk's fp32 P and dP, which would spill).
template <typename T, int D, int KEYS, bool STORE, bool FUSED_DELTA,
          int CHUNK = kTiledBwdWarpgroupChunk>
RA_DEVICE void tiled_bwd_warpgroup_scores(const uint32_t sq, const uint32_t sdo,
                                          const uint32_t sk, const uint32_t sv, const int kp,
                                          const int k0, const int live, const float scale2,
                                          const float (&lse2)[2], float (&delta)[2],
                                          uint8_t* sp_ptr, uint8_t* sds_ptr,
                                          uint32_t (&dsa)[KEYS / 16][4], const int wtid) {
  constexpr int kChunk = KEYS < CHUNK ? KEYS : CHUNK;
  constexpr int kChunks = KEYS / kChunk;
  const int warp = wtid / 32;
  const int g = (wtid % 32) / 4;
  const int t = wtid % 4;
  if constexpr (FUSED_DELTA && kChunks > 1) {
#pragma unroll 1
    for (int c = 0; c < kChunks; ++c) {
      float sc[kChunk / 2], dp[kChunk / 2];
      tiled_bwd_warpgroup_chunk<T, D, kChunk>(sq, sdo, sk, sv, kp, k0, c, live, scale2, lse2,
                                              sc, dp, wtid);
      tiled_bwd_warpgroup_add_rowsum<kChunk>(sc, dp, delta);
    }
  }
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
    float sc[kChunk / 2], dp[kChunk / 2];
    tiled_bwd_warpgroup_chunk<T, D, kChunk>(sq, sdo, sk, sv, kp, k0, c, live, scale2, lse2, sc,
                                            dp, wtid);
    if constexpr (FUSED_DELTA && kChunks == 1) tiled_bwd_warpgroup_add_rowsum<kChunk>(sc, dp, delta);
#pragma unroll
    for (int i = 0; i < kChunk / 2; ++i) dp[i] = sc[i] * (dp[i] - delta[(i / 2) % 2]);
    if constexpr (STORE) {
      // Rows 16 warp + g + 8r, 16-byte chunk (c kChunk / 8 + j) ^ g: both rows are g mod 8.
#pragma unroll
      for (int j = 0; j < kChunk / 8; ++j)
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const int at =
              (16 * warp + g + 8 * r) * 128 + (((c * kChunk / 8 + j) ^ g) << 4) + 4 * t;
          *reinterpret_cast<uint32_t*>(sp_ptr + at) =
              ra_mma_pack2<T>(sc[4 * j + 2 * r], sc[4 * j + 2 * r + 1]);
          *reinterpret_cast<uint32_t*>(sds_ptr + at) =
              ra_mma_pack2<T>(dp[4 * j + 2 * r], dp[4 * j + 2 * r + 1]);
        }
    }
    if constexpr (!STORE) {
#pragma unroll
      for (int kk = 0; kk < kChunk / 16; ++kk)
#pragma unroll
        for (int x = 0; x < 4; ++x)
          dsa[c * kChunk / 16 + kk][x] =
              ra_mma_pack2<T>(dp[8 * kk + 2 * x], dp[8 * kk + 2 * x + 1]);
    }
  }
}

// dq[D / 2] += dS K over KEYS keys from key k0 of the K buffer (kp rows): K read N-major, dS
// from registers. Issued and committed, not waited (dsa must stay untouched until then).
template <typename T, int D, int KEYS>
RA_DEVICE void tiled_bwd_warpgroup_issue_dq(float* dq, const uint32_t (&dsa)[KEYS / 16][4],
                                            const uint32_t sk, const int kp, const int k0) {
  ra_wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < KEYS / 16; ++kk)
    ra_wgmma_rs<T, D>(dq, dsa[kk], ra_wgmma_desc_n_major(sk + (k0 + 16 * kk) * 128, kp * 128),
                      1);
  ra_wgmma_commit();
}

// One gradient of keys kb0 + 16 warp + g (+ 8) times `factor`, keys at or past `live` not
// stored: `acc` is a dK or dV accumulator, its rows keys, its columns the head dim; `rows` the
// tensor's first key of the segment and kv head, `stride` its token stride.
template <typename T, int D>
RA_DEVICE void tiled_bwd_warpgroup_store_key_rows(uint16_t* rows, const int64_t stride,
                                                  const int kb0, const int live,
                                                  const float (&acc)[D / 2], const float factor,
                                                  const int warp, const int g, const int t) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int key = 16 * warp + g + 8 * r;
    if (key >= live) continue;
    uint16_t* row = rows + (kb0 + key) * stride + 2 * t;
#pragma unroll
    for (int c = 0; c < D / 8; ++c)
      *reinterpret_cast<uint32_t*>(row + 8 * c) =
          ra_mma_pack2<T>(acc[4 * c + 2 * r] * factor, acc[4 * c + 2 * r + 1] * factor);
  }
}

// dK (times the scale) and dV of keys kb0 + 16 warp + g (+ 8), keys at or past `live` not
// stored.
template <typename T, int D>
RA_DEVICE void tiled_bwd_warpgroup_store_dkdv(const SmallSeqTiledParams& p,
                                              const TiledBwdRows& rows, const int kb0,
                                              const int live, const float (&dk)[D / 2],
                                              const float (&dv)[D / 2], const int warp,
                                              const int g, const int t) {
  tiled_bwd_warpgroup_store_key_rows<T, D>(rows.dk, p.dk_token_stride, kb0, live, dk,
                                           p.softmax_scale, warp, g, t);
  tiled_bwd_warpgroup_store_key_rows<T, D>(rows.dv, p.dv_token_stride, kb0, live, dv, 1.f,
                                           warp, g, t);
}

// What both key-block kernels (tiled_bwd_warpgroup_key_block and _transposed) know of their
// item: the block's live keys (kb0 .. kb0 + live - 1), the segment's rows and 64-row tiles, and
// where its tensors' rows start.
struct TiledBwdKeyBlockItem {
  int live;
  int64_t seg_rows;
  int64_t tiles;
  int hq0;
  TiledBwdRows rows;
  TiledBwdWarpgroupRows at;
};

template <int KEYS>
RA_DEVICE TiledBwdKeyBlockItem tiled_bwd_key_block_item(const SmallSeqTiledParams& p,
                                                        const TiledSegment& s, const int hk,
                                                        const int group, const int kb0) {
  TiledBwdKeyBlockItem it;
  it.live = s.nk - kb0 < KEYS ? s.nk - kb0 : KEYS;
  it.seg_rows = static_cast<int64_t>(s.nq) * group;
  it.tiles = (it.seg_rows + kTiledWarpgroupRows - 1) / kTiledWarpgroupRows;
  it.rows = tiled_bwd_rows(p, hk, s);
  it.hq0 = hk * group;
  it.at = tiled_bwd_warpgroup_rows(p, s, it.rows, it.hq0);
  return it;
}

// The walk both key-block kernels make: the block's K / V staged at sk / sv (zeros past the
// live keys), dK / dV zeroed, then the segment's row tiles, Q and dO copied one tile ahead into
// two buffers of 2 kTileBytes from tiles_at. `tile_copies(tile, buf)` runs right after a tile's
// Q / dO copies are issued, to add the caller's own copies of that tile to the same copy group
// (buffer `buf`'s readers are past their closing barrier); `tile_body(tile, r0, buf, sq)` once
// a tile's copies have landed and every thread has passed the barrier after them; tile_body
// ends with a barrier before the buffer is refilled.
// After the last tile every copy is waited for and the dK / dV products are pinned.
template <int D, int KEYS, typename Copies, typename TileCopies, typename TileBody>
RA_DEVICE void tiled_bwd_warpgroup_walk_tiles(const SmallSeqTiledParams& p,
                                              const TiledSegment& s,
                                              const TiledBwdKeyBlockItem& it, const int group,
                                              const int kb0, const uint32_t sk,
                                              const uint32_t sv, const uint32_t tiles_at,
                                              const int tid, Copies& copies, float (&dk)[D / 2],
                                              float (&dv)[D / 2], const TileCopies& tile_copies,
                                              const TileBody& tile_body) {
  constexpr int ROWS = kTiledWarpgroupRows;
  constexpr int kTileBytes = ROWS * D * 2;
  const auto load_tile = [&](int64_t tile, int buf) {
    copies.template load<D>(p, it.at, s, it.hq0, group, tile * ROWS, it.seg_rows,
                            tiles_at + 2 * buf * kTileBytes, buf, tid);
    tile_copies(tile, buf);
  };
  if (it.tiles > 0) {
    tiled_warpgroup_stage<D, KEYS, 128>(sk, sv, p, it.rows.k + kb0 * p.k_token_stride,
                                        it.rows.v + kb0 * p.v_token_stride, it.live, KEYS, tid);
    load_tile(0, 0);
  }
  ra_cp_async_commit();
#pragma unroll
  for (int i = 0; i < D / 2; ++i) dk[i] = dv[i] = 0.f;
  for (int64_t tile = 0; tile < it.tiles; ++tile) {
    const int buf = static_cast<int>(tile & 1);
    if (tile + 1 < it.tiles) load_tile(tile + 1, buf ^ 1);
    ra_cp_async_commit();
    const int64_t r0 = tile * ROWS;
    ra_cp_async_wait<1>();  // this tile's copies have landed (the next one's may not)
    copies.wait(r0, it.seg_rows, buf);
    ra_fence_proxy_async();
    __syncthreads();
    tile_body(tile, r0, buf, tiles_at + 2 * buf * kTileBytes);
  }
  ra_cp_async_wait<0>();
#pragma unroll
  for (int i = 0; i < D / 2; ++i) {
    ra_wgmma_pin(dk[i]);
    ra_wgmma_pin(dv[i]);
  }
}

// The whole backward of one key block that holds the whole history (keys kb0 .. kb0 + KEYS - 1
// of a valid segment, kv head hk, launched where every history fits one block): the dK / dV of
// the block's keys over all of the segment's rows and the dQ of every row (the whole block: one
// warpgroup), each row's Delta from its P and dP (pass 1 not run). `smem` / `smem_ptr`: the
// 1024-byte aligned start of the block's buffers. `copies` moves the tiles' Q / dO in and dQ
// out (TiledBwdTmaCopies).
template <typename T, int D, int KEYS, typename Copies>
RA_DEVICE void tiled_bwd_warpgroup_key_block(const SmallSeqTiledParams& p,
                                             const TiledSegment& s, const int hk,
                                             const int group, const int kb0, uint8_t* smem_ptr,
                                             const uint32_t smem, const int tid,
                                             Copies& copies) {
  constexpr int ROWS = kTiledWarpgroupRows;
  constexpr int kTileBytes = ROWS * D * 2;
  // K, V, then buffer b's Q at 2 b kTileBytes and dO after it, then P and dS.
  constexpr uint32_t kPdsBytes = ROWS * kTiledWarpgroupKeys * 2;
  const uint32_t sk = smem;
  const uint32_t sv = sk + KEYS * D * 2;
  const uint32_t tiles_at = sv + KEYS * D * 2;
  const uint32_t sp = tiles_at + 4 * kTileBytes;
  const uint32_t sds = sp + kPdsBytes;
  uint8_t* const sp_ptr = smem_ptr + (sp - smem);
  uint8_t* const sds_ptr = sp_ptr + kPdsBytes;
  const int warp = tid / 32;
  const int g = (tid % 32) / 4;
  const int t = tid % 4;
  const float scale2 = p.softmax_scale * kTiledBwdLog2e;
  const TiledBwdKeyBlockItem it = tiled_bwd_key_block_item<KEYS>(p, s, hk, group, kb0);
  const int live = it.live;
  const int64_t seg_rows = it.seg_rows;
  const int hq0 = it.hq0;
  const TiledBwdWarpgroupRows& at = it.at;
  float dk[D / 2], dv[D / 2];
  tiled_bwd_warpgroup_walk_tiles<D, KEYS>(
      p, s, it, group, kb0, sk, sv, tiles_at, tid, copies, dk, dv, [](int64_t, int) {},
      [&](const int64_t, const int64_t r0, const int, const uint32_t sq) {
        const uint32_t sdo = sq + kTileBytes;
        uint8_t* const sq_ptr = smem_ptr + (sq - smem);
        const TiledRowMap map(r0, group);
        float lse2[2], delta[2];
        tiled_bwd_warpgroup_row_terms(p, s, hq0, map, r0, seg_rows, lse2, delta, tid);
        uint32_t dsa[KEYS / 16][4];
        tiled_bwd_warpgroup_scores<T, D, KEYS, true, true>(
            sq, sdo, sk, sv, KEYS, 0, live, scale2, lse2, delta, sp_ptr, sds_ptr, dsa, tid);
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
        // dQ = scale dS K in 64-column halves (32 accumulator registers at a time beside dK and
        // dV), dS read from its buffer (K-major) and K N-major; each half goes into the Q
        // buffer once every product before it is done (dK's reads Q).
#pragma unroll
        for (int col0 = 0; col0 < D; col0 += 64) {
          float dq[32];
#pragma unroll
          for (int i = 0; i < 32; ++i) dq[i] = 0.f;
          ra_wgmma_fence();
#pragma unroll
          for (int kk = 0; kk < KEYS / 16; ++kk)
            ra_wgmma_ss_bt<T, 64>(
                dq, ra_wgmma_desc(ra_wgmma_step_address(sds, kk, ROWS, 0)),
                ra_wgmma_desc_n_major(sk + (col0 / 64) * KEYS * 128 + 16 * kk * 128,
                                      KEYS * 128),
                1);
          ra_wgmma_commit();
          ra_wgmma_wait<0>();
#pragma unroll
          for (int i = 0; i < 32; ++i) ra_wgmma_pin(dq[i]);
          if (col0 == 0) __syncthreads();  // every warp's dK product is done: Q's buffer is free
#pragma unroll
          for (int r = 0; r < 2; ++r)
            tiled_warpgroup_acc_row_to_buffer<T, 64>(sq_ptr + (col0 / 64) * ROWS * 128, dq, r,
                                                     p.softmax_scale, tid);
        }
        copies.template store_dq<D>(p, at, s, hq0, group, map, r0, seg_rows, sq_ptr, sq, tid);
        __syncthreads();  // the buffers are refilled by the copies of the tile after next
      });
  tiled_bwd_warpgroup_store_dkdv<T, D>(p, it.rows, kb0, live, dk, dv, warp, g, t);
}

// The lse (natural log, as the forward wrote it) and pass 1's Delta of the 64-row tile at r0
// into row_terms[0..63] and row_terms[64..127], for the transposed kernels, whose threads each
// read 16 rows' terms: one 4-byte cp.async per thread of the warpgroup (tid 0..127: the lse of
// row tid, then the Delta of row tid - 64), joining the caller's open copy group, so that the
// terms land with the tile's Q / dO and no thread waits on their loads. Rows past the segment
// read nothing and get lse 0 and Delta 0: their Q and dO rows are zeros, so S^T = 0, P^T = 1
// and dP^T = 0 there, and dS^T = P^T (dP^T - Delta) = 0; P^T meets only their zero dO rows.
RA_DEVICE void tiled_bwd_warpgroup_stage_row_terms(const SmallSeqTiledParams& p,
                                                   const TiledSegment& s, const int hq0,
                                                   const int group, const int64_t r0,
                                                   const int64_t seg_rows, const uint32_t row_terms,
                                                   const int tid) {
  const int i = tid % kTiledWarpgroupRows;
  int64_t j;
  int h;
  TiledRowMap(r0, group).at(i, j, h);
  const int64_t at = tiled_row_term_at(p, s, hq0 + h, j);
  const bool live = r0 + i < seg_rows;
  const float* const terms = tid < kTiledWarpgroupRows ? p.lse : p.workspace;
  ra_cp_async4(row_terms + 4 * tid, live ? terms + at : p.lse, live ? 4 : 0);
}

// The score stage of both transposed kernels, one 64-key block against one 64-row tile (one
// warpgroup, all from shared memory): S^T = K Q^T and dP^T = V dO^T as m64n64 products (M = the
// block's keys, N = the tile's rows), P^T = exp2(S^T scale2 - lse log2e) computed while the dP^T
// products still run (keys at or past `live` get 0 where MASK_PAST), dS^T = P^T (dP^T - Delta),
// both rounded in pairs into pa / dsa, the A operands of the dV and dK products (k step kk: tile
// rows 16 kk .. 16 kk + 15; pa[kk][x], dsa[kk][x] hold rows 8 j + 2t, + 1 with j = 2 kk + x / 2
// of key 16 warp + g + 8 (x % 2)). row_lse / row_delta: the tile's 64 lse (natural log) and
// Delta values (tiled_bwd_warpgroup_stage_row_terms). Each pass reads its own row terms: the
// wait's memory clobber between them keeps the compiler from loading all 32 terms at once
// beside the accumulators (which spilled 144 bytes at d = 128).
template <typename T, int D, bool MASK_PAST>
RA_DEVICE void tiled_bwd_warpgroup_transposed_scores(
    const uint32_t sk, const uint32_t sv, const uint32_t sq, const uint32_t sdo,
    const float* row_lse, const float* row_delta, const float scale2, const int live,
    const int tid, uint32_t (&pa)[kTiledWarpgroupRows / 16][4],
    uint32_t (&dsa)[kTiledWarpgroupRows / 16][4]) {
  constexpr int KEYS = kTiledBwdWarpgroupBlockKeys;
  constexpr int ROWS = kTiledWarpgroupRows;
  const int warp = tid / 32;
  const int g = (tid % 32) / 4;
  const int t = tid % 4;
  float st[32], dpt[32];  // element 4j + e: key 16 warp + g + 8 (e / 2), row 8j + 2t + e % 2
  ra_wgmma_fence();
#pragma unroll
  for (int k = 0; k < D / 16; ++k)
    ra_wgmma_ss<T, 64>(st, ra_wgmma_desc(ra_wgmma_step_address(sk, k, KEYS, 0)),
                       ra_wgmma_desc(ra_wgmma_step_address(sq, k, ROWS, 0)), k > 0);
  ra_wgmma_commit();
#pragma unroll
  for (int k = 0; k < D / 16; ++k)
    ra_wgmma_ss<T, 64>(dpt, ra_wgmma_desc(ra_wgmma_step_address(sv, k, KEYS, 0)),
                       ra_wgmma_desc(ra_wgmma_step_address(sdo, k, ROWS, 0)), k > 0);
  ra_wgmma_commit();
  ra_wgmma_wait<1>();  // S^T done; P^T below runs under the dP^T products
#pragma unroll
  for (int i = 0; i < 32; ++i) ra_wgmma_pin(st[i]);
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const float2 lse = *reinterpret_cast<const float2*>(row_lse + 8 * j + 2 * t);
    const float lse2[2] = {lse.x * kTiledBwdLog2e, lse.y * kTiledBwdLog2e};
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const float p_t = exp2f(fmaf(st[4 * j + e], scale2, -lse2[e % 2]));
      st[4 * j + e] = MASK_PAST && 16 * warp + g + 8 * (e / 2) >= live ? 0.f : p_t;
    }
  }
  ra_wgmma_wait<0>();
#pragma unroll
  for (int i = 0; i < 32; ++i) ra_wgmma_pin(dpt[i]);
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const float2 delta = *reinterpret_cast<const float2*>(row_delta + 8 * j + 2 * t);
#pragma unroll
    for (int e = 0; e < 4; ++e)
      dpt[4 * j + e] = st[4 * j + e] * (dpt[4 * j + e] - (e % 2 ? delta.y : delta.x));
  }
  asm volatile("" ::: "memory");
#pragma unroll
  for (int kk = 0; kk < ROWS / 16; ++kk)
#pragma unroll
    for (int x = 0; x < 4; ++x) {
      pa[kk][x] = ra_mma_pack2<T>(st[8 * kk + 2 * x], st[8 * kk + 2 * x + 1]);
      dsa[kk][x] = ra_mma_pack2<T>(dpt[8 * kk + 2 * x], dpt[8 * kk + 2 * x + 1]);
    }
}

// The dK / dV of one key block of 64 keys (kb0 .. kb0 + 63 of a valid segment, kv head hk) over
// all of the segment's rows, the dQ left to the dQ kernel (histories past one key block), with
// the score products transposed: per 64-row tile
//   S^T = K Q^T, dP^T = V dO^T         (m64n64: M = the block's keys, N = the tile's rows)
//   P^T = exp2(S^T scale log2e - lse log2e), dS^T = P^T (dP^T - Delta)   (fp32, registers)
//   dV += P^T dO, dK += dS^T Q         (m64nD, P^T and dS^T as the register A operands)
// Accumulator rows are keys, so P^T and dS^T rounded in pairs are the A operands of the dV / dK
// products as they stand (common/wgmma.h): no P / dS buffers, no barrier between the score
// and gradient products, and two score products of N = 64 in place of four chunks of N = 16
// each. A thread's columns are q rows, so each takes the lse and Delta of 16 rows, from arrays
// copied by cp.async with the tile's Q / dO, one tile ahead (two halves in the P buffer's
// place, unused here): no thread waits on their loads. P^T is computed while the dP^T products
// still run. Keys past the history are zeros in K / V: their P^T is not 0, but it reaches only
// their own dK / dV rows, never stored (no dQ here, and Delta comes from pass 1 or the dQ
// kernel). Rows past the segment are zero Q / dO rows with lse and Delta 0
// (tiled_bwd_warpgroup_stage_row_terms): dS^T = 0, and P^T = 1 meets zero dO rows. Shared
// memory: the layout of
// tiled_bwd_warpgroup_key_block (tiled_bwd_warpgroup_smem_bytes), so that both instances
// launch alike. `copies` moves the tiles' Q / dO in (TiledBwdTmaCopies).
template <typename T, int D, typename Copies>
RA_DEVICE void tiled_bwd_warpgroup_key_block_transposed(const SmallSeqTiledParams& p,
                                                        const TiledSegment& s, const int hk,
                                                        const int group, const int kb0,
                                                        uint8_t* smem_ptr, const uint32_t smem,
                                                        const int tid, Copies& copies) {
  constexpr int KEYS = kTiledBwdWarpgroupBlockKeys;
  constexpr int ROWS = kTiledWarpgroupRows;
  static_assert(KEYS == 64 && ROWS == 64, "m64n64 score products over one key block");
  constexpr int kTileBytes = ROWS * D * 2;
  const uint32_t sk = smem;
  const uint32_t sv = sk + KEYS * D * 2;
  const uint32_t tiles_at = sv + KEYS * D * 2;
  // lse and Delta of a tile's 64 rows, where key_block keeps P: two halves (tile t in half
  // t % 2), copied with the tile's Q / dO one tile ahead
  const uint32_t row_terms = tiles_at + 4 * kTileBytes;
  const float* const row_terms_ptr =
      reinterpret_cast<const float*>(smem_ptr + (row_terms - smem));
  const int warp = tid / 32;
  const int g = (tid % 32) / 4;
  const int t = tid % 4;
  const float scale2 = p.softmax_scale * kTiledBwdLog2e;
  const TiledBwdKeyBlockItem it = tiled_bwd_key_block_item<KEYS>(p, s, hk, group, kb0);
  float dk[D / 2], dv[D / 2];
  tiled_bwd_warpgroup_walk_tiles<D, KEYS>(
      p, s, it, group, kb0, sk, sv, tiles_at, tid, copies, dk, dv,
      [&](const int64_t tile, const int half) {
        tiled_bwd_warpgroup_stage_row_terms(p, s, it.hq0, group, tile * ROWS, it.seg_rows,
                                            row_terms + 2 * ROWS * 4 * half, tid);
      },
      [&](const int64_t, const int64_t, const int buf, const uint32_t sq) {
        const uint32_t sdo = sq + kTileBytes;
        // K / V's descriptors from an address the compiler must re-read per tile: hoisted out
        // of the loop, their 16 loop-invariant 64-bit values would take registers the
        // accumulators need.
        uint32_t sk_t = sk;
        asm volatile("" : "+r"(sk_t));
        const uint32_t sv_t = sk_t + KEYS * D * 2;
        const float* const row_lse = row_terms_ptr + 2 * ROWS * buf;
        uint32_t pa[ROWS / 16][4], dsa[ROWS / 16][4];
        tiled_bwd_warpgroup_transposed_scores<T, D, false>(sk_t, sv_t, sq, sdo, row_lse,
                                                           row_lse + ROWS, scale2, KEYS, tid, pa,
                                                           dsa);
        ra_wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < ROWS / 16; ++kk)
          ra_wgmma_rs<T, D>(dv, pa[kk], ra_wgmma_desc_n_major(sdo + 16 * kk * 128, ROWS * 128), 1);
#pragma unroll
        for (int kk = 0; kk < ROWS / 16; ++kk)
          ra_wgmma_rs<T, D>(dk, dsa[kk], ra_wgmma_desc_n_major(sq + 16 * kk * 128, ROWS * 128), 1);
        ra_wgmma_commit();
        ra_wgmma_wait<0>();
        __syncthreads();  // the buffers are refilled by the copies of the tile after next
      });
  tiled_bwd_warpgroup_store_dkdv<T, D>(p, it.rows, kb0, it.live, dk, dv, warp, g, t);
}

// Where this thread's pair dsa[kk][x] of tiled_bwd_warpgroup_transposed_scores goes in a dS^T
// buffer ([keys][rows], 128-byte rows, 16-byte chunks XOR-swizzled by the key: the transposed A
// operand of dQ's product): key 16 warp + g + 8 (x % 2)'s row, chunk j ^ g (the key is g mod 8,
// j = 2 kk + x / 2), bytes 4t. A byte offset from the buffer's start.
RA_DEVICE uint32_t tiled_bwd_warpgroup_dst_offset(const int warp, const int g, const int t,
                                                  const int kk, const int x) {
  return (16 * warp + g + 8 * (x % 2)) * 128 + (((2 * kk + x / 2) ^ g) << 4) + 4 * t;
}

// dQ += dS K over one 64-key block: dS from the dS^T buffer at `sdst` (transposed A), K of the
// block N-major at `sk` (issued, neither fenced nor committed).
template <typename T, int D>
RA_DEVICE void tiled_bwd_warpgroup_issue_dq_from_buffer(float (&dq)[D / 2], const uint32_t sdst,
                                                        const uint32_t sk) {
  constexpr int KEYS = kTiledBwdWarpgroupBlockKeys;
#pragma unroll
  for (int kk = 0; kk < KEYS / 16; ++kk)
    ra_wgmma_ss_tt<T, D>(dq, ra_wgmma_desc_n_major(sdst + 16 * kk * 128, KEYS * 128),
                         ra_wgmma_desc_n_major(sk + 16 * kk * 128, KEYS * 128), 1);
}

// The whole backward of one (segment, kv head) whose rows fit one 64-row tile (host bound
// max_seqlen_q x group <= 64), over histories past one key block: the tile's Q and dO are
// copied once, and the item walks its key blocks, per block
//   S^T = K Q^T, dP^T = V dO^T, P^T and dS^T in registers   (as key_block_transposed)
//   dV = P^T dO, dK = dS^T Q                                 (the block's own: stored at once)
//   dQ += dS K                                               (dS^T through shared memory)
// so that K / V, Q and dO are read once for all three gradients and no dQ kernel recomputes
// the scores. dS^T goes into the dS buffer as [keys][rows] (the transposed A operand of the dQ
// product, as P is of dV's in key_block); the fp32 dQ sum lives in the second Q / dO buffer,
// which one tile leaves unused, each thread in its own slots (no barrier for the sum; blocks
// added in order: deterministic), and the last block writes scale dQ through the Q buffer.
// Keys past the history get P^T = 0 (their zero K rows would give dQ 0, but P^T may not be
// finite there: exp2 of -lse); a segment without keys takes one block of zeros, so its dq is
// dS = 0 (dP - Delta) times zero K rows; rows past the segment take lse and Delta 0 (their dS^T
// is 0, and their dq is not stored). Delta comes from pass 1. Shared memory: the layout of
// tiled_bwd_warpgroup_key_block (tiled_bwd_warpgroup_smem_bytes). The score stage is
// key_block_transposed's (tiled_bwd_warpgroup_transposed_scores), with keys past the history
// masked.
template <typename T, int D, typename Copies>
RA_DEVICE void tiled_bwd_warpgroup_one_tile(const SmallSeqTiledParams& p, const TiledSegment& s,
                                            const int hk, const int group, uint8_t* smem_ptr,
                                            const uint32_t smem, const int tid,
                                            Copies& copies) {
  constexpr int KEYS = kTiledBwdWarpgroupBlockKeys;
  constexpr int ROWS = kTiledWarpgroupRows;
  static_assert(KEYS == 64 && ROWS == 64, "m64n64 score products over one key block");
  constexpr int kTileBytes = ROWS * D * 2;
  static_assert(2 * kTileBytes == 128 * (D / 2) * 4, "a thread's dQ sum fills its slots");
  const uint32_t sk = smem;
  const uint32_t sv = sk + KEYS * D * 2;
  const uint32_t sq = sv + KEYS * D * 2;  // buffer 0: Q, then dO
  const uint32_t sdo = sq + kTileBytes;
  uint8_t* const sq_ptr = smem_ptr + (sq - smem);
  // buffer 1: slot i of thread tid at dq_sum[128 i + tid]
  float* const dq_sum = reinterpret_cast<float*>(sq_ptr + 2 * kTileBytes) + tid;
  // where key_block keeps P and dS: the tile's lse and Delta, then dS^T [keys][rows]
  const uint32_t sp = sq + 4 * kTileBytes;
  const float* const row_terms = reinterpret_cast<const float*>(smem_ptr + (sp - smem));
  const uint32_t sdst = sp + ROWS * KEYS * 2;
  uint8_t* const sdst_ptr = smem_ptr + (sdst - smem);
  const int warp = tid / 32;
  const int g = (tid % 32) / 4;
  const int t = tid % 4;
  const float scale2 = p.softmax_scale * kTiledBwdLog2e;
  const int64_t seg_rows = static_cast<int64_t>(s.nq) * group;
  const int blocks = s.nk > 0 ? (s.nk + KEYS - 1) / KEYS : 1;
  const TiledBwdRows rows = tiled_bwd_rows(p, hk, s);
  const int hq0 = hk * group;
  const TiledBwdWarpgroupRows at = tiled_bwd_warpgroup_rows(p, s, rows, hq0);
  copies.template load<D>(p, at, s, hq0, group, 0, seg_rows, sq, 0, tid);
  tiled_bwd_warpgroup_stage_row_terms(p, s, hq0, group, 0, seg_rows, sp, tid);
  for (int kb = 0; kb < blocks; ++kb) {
    const int kb0 = kb * KEYS;
    const int live = s.nk - kb0 < KEYS ? s.nk - kb0 : KEYS;
    tiled_warpgroup_stage<D, KEYS, 128>(sk, sv, p, rows.k + kb0 * p.k_token_stride,
                                        rows.v + kb0 * p.v_token_stride, live, KEYS, tid);
    ra_cp_async_commit();
    ra_cp_async_wait<0>();
    if (kb == 0) copies.wait(0, seg_rows, 0);
    ra_fence_proxy_async();
    __syncthreads();  // K / V (and at block 0 Q, dO and the row terms) in place
    uint32_t pa[ROWS / 16][4], dsa[ROWS / 16][4];
    tiled_bwd_warpgroup_transposed_scores<T, D, true>(sk, sv, sq, sdo, row_terms,
                                                      row_terms + ROWS, scale2, live, tid, pa,
                                                      dsa);
    // dS^T into the dS buffer
#pragma unroll
    for (int kk = 0; kk < ROWS / 16; ++kk)
#pragma unroll
      for (int x = 0; x < 4; ++x)
        *reinterpret_cast<uint32_t*>(sdst_ptr + tiled_bwd_warpgroup_dst_offset(warp, g, t, kk, x)) =
            dsa[kk][x];
    float dk[D / 2], dv[D / 2];
    ra_wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < ROWS / 16; ++kk)
      ra_wgmma_rs<T, D>(dv, pa[kk], ra_wgmma_desc_n_major(sdo + 16 * kk * 128, ROWS * 128),
                        kk > 0);
#pragma unroll
    for (int kk = 0; kk < ROWS / 16; ++kk)
      ra_wgmma_rs<T, D>(dk, dsa[kk], ra_wgmma_desc_n_major(sq + 16 * kk * 128, ROWS * 128),
                        kk > 0);
    ra_wgmma_commit();
    ra_wgmma_wait<0>();
#pragma unroll
    for (int i = 0; i < D / 2; ++i) {
      ra_wgmma_pin(dk[i]);
      ra_wgmma_pin(dv[i]);
    }
    tiled_bwd_warpgroup_store_dkdv<T, D>(p, rows, kb0, live, dk, dv, warp, g, t);
    ra_fence_proxy_async();
    __syncthreads();  // dS^T in place; every warp's dK product (Q) and dV product (dO) done
    float dq[D / 2];
#pragma unroll
    for (int i = 0; i < D / 2; ++i) dq[i] = kb > 0 ? dq_sum[128 * i] : 0.f;
    ra_wgmma_fence();
    tiled_bwd_warpgroup_issue_dq_from_buffer<T, D>(dq, sdst, sk);
    ra_wgmma_commit();
    ra_wgmma_wait<0>();
#pragma unroll
    for (int i = 0; i < D / 2; ++i) ra_wgmma_pin(dq[i]);
    if (kb + 1 < blocks) {
#pragma unroll
      for (int i = 0; i < D / 2; ++i) dq_sum[128 * i] = dq[i];
    } else {
#pragma unroll
      for (int r = 0; r < 2; ++r)
        tiled_warpgroup_acc_row_to_buffer<T, D>(sq_ptr, dq, r, p.softmax_scale, tid);
      copies.template store_dq<D>(p, at, s, hq0, group, TiledRowMap(0, group), 0, seg_rows,
                                  sq_ptr, sq, tid);
    }
    __syncthreads();  // every warp is done with this block's K / V and dS^T
  }
}

// The scalars the dQ kernel reads from global memory for a row tile's rows, this thread's rows
// 16 warp + g and + 8: each row's lse (natural log) and dlse (0 without; pass 1 does not run:
// the dQ kernel computes Delta). The dQ kernels load a warpgroup's next tile's while it
// computes the tile before (as they stand: converted only where used), and ask L2 for that
// tile's O rows, which a tile's Delta reads first thing (holding them in registers across a
// tile would spill at d = 128), so that no tile starts by waiting on DRAM. A row past the
// segment reads nothing (its fields are undefined and never read).
struct TiledBwdDqRowLoads {
  float lse[2];
  float dlse[2];
};

template <int D>
RA_DEVICE void tiled_bwd_warpgroup_dq_load_rows(const SmallSeqTiledParams& p,
                                                const TiledSegment& s, const int hq0,
                                                const TiledBwdWarpgroupRows& at,
                                                const TiledRowMap& map, const int64_t r0,
                                                const int64_t seg_rows, TiledBwdDqRowLoads& l,
                                                const int wtid) {
  const int t = wtid % 4;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int i = 16 * (wtid / 32) + (wtid % 32) / 4 + 8 * r;
    if (r0 + i >= seg_rows) continue;
    int64_t j;
    int h;
    map.at(i, j, h);
    const int64_t row = s.q_row0 + j;
    const int64_t hq = hq0 + h;
    const int64_t term = tiled_row_term_at(p, s, hq, j);
    l.lse[r] = p.lse[term];
    l.dlse[r] = p.dlse != nullptr ? p.dlse[hq * p.dlse_head_stride + row] : 0.f;
    const uint16_t* o = at.out + (s.q_token0 + j) * p.out_token_stride + hq * p.out_head_stride;
    // the row's D / 64 lines of 128 bytes, among its four threads
    for (int line = t; line < D / 64; line += 4) ra_prefetch_l2(o + 64 * line);
  }
}

// LSE (log2 domain) and Delta of this thread's rows 16 warp + g and + 8 of the tile at r0 from
// its loads (tiled_bwd_warpgroup_dq_load_rows), the tile's dO landed at `sdo_ptr` (generic):
// Delta = rowsum(dO * O) - dlse, O from global memory (`out`: the q batch's rows, each
// tensor's own strides), each row's four threads summing 16 of every 64 columns, the first of
// them writing the row's Delta to the workspace, where the dK / dV kernel reads it. A row past
// the segment gets lse +inf and Delta 0 and reads nothing.
template <typename T, int D>
RA_DEVICE void tiled_bwd_warpgroup_dq_row_terms(const SmallSeqTiledParams& p,
                                                const TiledSegment& s, const int hq0,
                                                const TiledRowMap& map, const int64_t r0,
                                                const int64_t seg_rows,
                                                const TiledBwdDqRowLoads& l, const uint16_t* out,
                                                const uint8_t* sdo_ptr, float (&lse2)[2],
                                                float (&delta)[2], const int wtid) {
  const int t = wtid % 4;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int i = 16 * (wtid / 32) + (wtid % 32) / 4 + 8 * r;
    const bool live = r0 + i < seg_rows;  // the same for a row's four threads
    int64_t j;
    int h;
    map.at(i, j, h);
    float part = 0.f;
    if (live) {
      const uint16_t* o =
          out + (s.q_token0 + j) * p.out_token_stride + (hq0 + h) * p.out_head_stride;
#pragma unroll
      for (int c = 0; c < D / 8; c += 4) {
        float of[8], gf[8];
        ra_unpack8<T>(ra_load16(o + 8 * (c + t)), of);
        ra_unpack8<T>(*reinterpret_cast<const ra_vec8*>(
                          sdo_ptr + ra_wgmma_offset(i, 8 * (c + t), kTiledWarpgroupRows)),
                      gf);
#pragma unroll
        for (int e = 0; e < 8; ++e) part = fmaf(gf[e], of[e], part);
      }
    }
    const float dot = ra_group_sum<4>(part);  // every lane of the warp takes part
    if (live) {
      delta[r] = dot - l.dlse[r];
      if (t == 0) p.workspace[tiled_row_term_at(p, s, hq0 + h, j)] = delta[r];
    }
    lse2[r] = live ? l.lse[r] * kTiledBwdLog2e : INFINITY;
    if (!live) delta[r] = 0.f;
  }
}

// dQ of the row tile at r0 of one valid segment (kv head hk, q heads from hq0), all of its keys
// staged in `sk` / `sv` (kp rows each), the tile's Q and dO (Q at `tile_at`, dO right after
// it) landed and its other loads `l` issued: per key block dQ += dS K in fp32 registers, written
// once through the Q buffer (`tile_ptr`, the same bytes) and stored row by row, rows past
// seg_rows not stored. Each row's dQ depends on that row's Q and dO only, so a Q / dO row past
// the segment may hold anything. The tile's Delta from its dO and O (pass 1 not run). Returns
// after this thread's last read of the buffer; the caller syncs the warpgroup before the
// buffer takes other rows.
template <typename T, int D>
RA_DEVICE void tiled_bwd_warpgroup_dq_tile(const SmallSeqTiledParams& p, const TiledSegment& s,
                                           const TiledBwdWarpgroupRows& at, const int hq0,
                                           const int group, const int64_t r0,
                                           const int64_t seg_rows,
                                           const TiledBwdDqRowLoads& l,
                                           const uint32_t sk, const uint32_t sv, const int kp,
                                           uint8_t* tile_ptr, const uint32_t tile_at,
                                           const int wg, const int wtid) {
  constexpr int KEYS = kTiledBwdWarpgroupBlockKeys;
  constexpr int kTileBytes = kTiledWarpgroupRows * D * 2;
  const float scale2 = p.softmax_scale * kTiledBwdLog2e;
  const uint32_t sq = tile_at;
  const uint32_t sdo = tile_at + kTileBytes;
  const TiledRowMap map(r0, group);
  float lse2[2], delta[2];
  tiled_bwd_warpgroup_dq_row_terms<T, D>(p, s, hq0, map, r0, seg_rows, l, at.out,
                                         tile_ptr + kTileBytes, lse2, delta, wtid);
  float dq[D / 2];
#pragma unroll
  for (int i = 0; i < D / 2; ++i) dq[i] = 0.f;
  for (int kb0 = 0; kb0 < s.nk; kb0 += KEYS) {
    uint32_t dsa[KEYS / 16][4];
    tiled_bwd_warpgroup_scores<T, D, KEYS, false, false, KEYS>(
        sq, sdo, sk, sv, kp, kb0, s.nk - kb0, scale2, lse2, delta, nullptr, nullptr, dsa, wtid);
    tiled_bwd_warpgroup_issue_dq<T, D, KEYS>(dq, dsa, sk, kp, kb0);
    ra_wgmma_wait<0>();  // dsa is rewritten by the next block
  }
#pragma unroll
  for (int i = 0; i < D / 2; ++i) ra_wgmma_pin(dq[i]);
  ra_warpgroup_sync(wg);  // every warp is past its score products: the Q buffer is free
#pragma unroll
  for (int r = 0; r < 2; ++r)
    tiled_warpgroup_acc_row_to_buffer<T, D>(tile_ptr, dq, r, p.softmax_scale, wtid);
  ra_warpgroup_sync(wg);
  tiled_warpgroup_store_rows<D>(at.dq, p.dq_token_stride, p.dq_head_stride, map, r0, seg_rows,
                                tile_ptr, wtid);
}

// The dK / dV kernel's items: grid-stride over (segment, kv head, key block), numbered
// segment-major so that the key blocks of one segment run at once and share its Q / dO rows
// through L2. WITH_DQ (launched where every history fits one key block): each item also writes
// its rows' dQ; else the dQ kernel (staged or streaming) does. Item (block 0) also writes
// what pass 2 writes besides a valid segment's gradients (tiled_bwd_edges, warp 0). KEYS: keys
// of the products, 16 where every history fits them, else 64. FUSED_DELTA (exactly the
// instances without TRANSPOSED, which have dQ: the plan's only ones): launched without pass 1,
// the kernel computes each row's Delta from its P and dP and zeroes the dq of q padding rows
// itself. TRANSPOSED (64-key blocks, Delta from pass 1 or the dQ kernel): without dQ,
// each item by tiled_bwd_warpgroup_key_block_transposed; with dQ (launched where every item
// holds at most one row tile, over histories past one block), one item per (segment, kv head)
// walking all its key blocks (tiled_bwd_warpgroup_one_tile). `copies` moves the row tiles
// (TiledBwdTmaCopies).
template <typename T, int D, int KEYS, bool WITH_DQ, bool FUSED_DELTA, bool TRANSPOSED,
          typename Copies>
RA_DEVICE void tiled_bwd_warpgroup_items(const SmallSeqTiledParams& p, Copies& copies) {
  static_assert(WITH_DQ || !FUSED_DELTA, "Delta from P dP needs the row's whole history");
  static_assert(!TRANSPOSED || (!FUSED_DELTA && KEYS == kTiledBwdWarpgroupBlockKeys),
                "the transposed products serve 64-key blocks, Delta from pass 1");
  static_assert(WITH_DQ || TRANSPOSED,
                "key-block items (past one key block, no dQ) take the transposed products");
  static_assert(TRANSPOSED || FUSED_DELTA,
                "a history of one key block: Delta from the item's own products, no pass 1");
  // one-tile items (TRANSPOSED with dQ): an item per (segment, kv head), walking its blocks
  constexpr bool kWalk = WITH_DQ && TRANSPOSED;
  const int tid = threadIdx.x;
  const int group = p.num_heads_q / p.num_heads_kv;
  const int blocks = kWalk ? 1 : tiled_bwd_warpgroup_blocks(p.max_seqlen_kv);
  RA_DYNAMIC_SHARED(ra_vec8, tiled_bwd_warpgroup_smem);
  const uint32_t raw = ra_smem_address(tiled_bwd_warpgroup_smem);
  const uint32_t pad = ra_smem_pad_1024(raw);
  uint8_t* const smem_ptr = reinterpret_cast<uint8_t*>(tiled_bwd_warpgroup_smem) + pad;
  const int64_t per_seg = static_cast<int64_t>(p.num_heads_kv) * blocks;
  const int64_t items = static_cast<int64_t>(p.batch) * per_seg;
  for (int64_t item = blockIdx.x; item < items; item += gridDim.x) {
    const int seg = static_cast<int>(item / per_seg);
    const int rest = static_cast<int>(item - static_cast<int64_t>(seg) * per_seg);
    const int hk = rest / blocks;
    const int kb = rest - hk * blocks;
    const TiledBounds b = tiled_fetch_bounds(p, seg);
    const TiledSegment s = tiled_resolve_segment(p, seg, b);
    if (kb == 0 && tid < 32) tiled_bwd_edges<T, D>(p, seg, hk, b, s, tid);
    const int kb0 = kb * kTiledBwdWarpgroupBlockKeys;
    // Block 0 always runs with dQ (it writes the dQ of a segment without keys: zeros); without,
    // only blocks that hold keys.
    if (!s.valid || ((kb > 0 || !WITH_DQ) && kb0 >= s.nk)) continue;
    if constexpr (kWalk)
      tiled_bwd_warpgroup_one_tile<T, D>(p, s, hk, group, smem_ptr, raw + pad, tid, copies);
    else if constexpr (TRANSPOSED)
      tiled_bwd_warpgroup_key_block_transposed<T, D>(p, s, hk, group, kb0, smem_ptr, raw + pad,
                                                     tid, copies);
    else
      tiled_bwd_warpgroup_key_block<T, D, KEYS>(p, s, hk, group, kb0, smem_ptr, raw + pad, tid,
                                                copies);
    __syncthreads();  // every warp is done with this item's K / V
  }
  if constexpr (FUSED_DELTA)
    tiled_bwd_zero_padding_dq<D>(p, static_cast<int64_t>(blockIdx.x) * blockDim.x + tid,
                                 static_cast<int64_t>(gridDim.x) * blockDim.x);
}

#endif  // RA_HAS_WGMMA

}  // namespace small_seq
