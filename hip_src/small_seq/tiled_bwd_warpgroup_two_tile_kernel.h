// Tiled small-seq backward, two-tile walk (Hopper, sm_90a): the whole backward of every
// (segment, kv head) whose rows fit two 64-row tiles (host bound max_seqlen_q x group <= 128,
// e.g. 128 candidates without GQA) over histories past one key block, by one kernel
// (docs/kernels.md#two-tile-walk).
//
// Why: such items leave the dK / dV kernel two row tiles per key block and the dQ kernel one
// tile per warpgroup, so both kernels spend their time staging (K / V twice, Q / dO five
// times through L2) and the dQ kernel recomputes S and dP. The one-tile walk
// (tiled_bwd_warpgroup_one_tile) removes both for one tile; this is its two-warpgroup form.
//
// Work item = (segment, kv head), one block of two warpgroups, warpgroup w owning row tile w
// (rows 64 w .. 64 w + 63; r = j * group + h as in every tiled kernel). Each warpgroup copies
// its tile's Q and dO once and stages its rows' lse and Delta (pass 1's, by cp.async with
// them); the block walks the history's key blocks of 64 keys, staging each block's K and V
// (all threads), and per block:
//   1. each warpgroup: S^T = K Q^T, dP^T = V dO^T for its tile, P^T and dS^T in registers
//      (tiled_bwd_warpgroup_transposed_scores, keys past the history masked);
//   2. dS^T into the warpgroup's dS buffer ([keys][rows], the transposed A operand of dQ's
//      product), and the register operand the other warpgroup needs into its exchange slots:
//      warpgroup 0 hands over dS^T of tile 0, warpgroup 1 P^T of tile 1 (each thread its own
//      16 words: the fragment layout is the same in both warpgroups); one block barrier;
//   3. warpgroup 0: dV = P^T_0 dO_0 + P^T_1 dO_1, warpgroup 1: dK = dS^T_0 Q_0 + dS^T_1 Q_1
//      (m64nD, register A operands, each the block's whole sum over the item's rows, stored at
//      once), and each warpgroup dQ_w += dS_w K (m64nD from shared memory, fp32 in registers
//      across the key blocks);
//   4. one block barrier before the next block's K / V.
// After the last block each warpgroup writes scale dQ of its tile through its Q buffer in
// 16-byte pieces. Every product is one of the seven a backward needs (no recomputation), K / V,
// Q and dO are read once, and no reduction of partial gradients is needed: the exchange hands
// over bf16 operands (8 KiB per warpgroup and block), not fp32 sums. Deterministic: each
// gradient element has one writer summing in a fixed order.
//
// The two warpgroups run the same instructions: which operands a warpgroup takes (its own
// fragments or the exchanged ones, dO or Q) is selected by value, not by a branch, because a
// product issued under a branch makes ptxas serialize every product of the kernel (C7514).
//
// Rows past the segment are zero Q / dO rows with lse and Delta 0 (dS^T = 0, and P^T = 1 meets
// only their zero dO rows), so a segment of 64 rows or fewer leaves warpgroup 1's products
// zero; keys past the history are zero K / V rows with
// P^T = 0; a segment without keys takes one block of zeros (its dq is dS = 0 (dP - Delta) times
// zero K rows). Bad segments, padding rows and K / V rows no segment covers: tiled_bwd_edges,
// as the other warpgroup kernels.
#pragma once

#include "tiled_bwd_warpgroup_kernel.h"

namespace small_seq {

// Rows of an item of the two-tile walk: two 64-row tiles, one per warpgroup.
constexpr int kTiledBwdTwoTileRows = 2 * kTiledWarpgroupRows;

// Bytes of one warpgroup's buffers in the two-tile walk: its tile's Q and dO, its dS^T
// ([keys][rows]), its exchange slots (16 words per thread) and its rows' lse and Delta, rounded
// up to 1024 bytes so that the next warpgroup's operand buffers keep their swizzle alignment.
template <int D>
RA_HOST_DEVICE constexpr int64_t tiled_bwd_two_tile_warpgroup_bytes() {
  return (2 * static_cast<int64_t>(kTiledWarpgroupRows) * D * 2 +
          static_cast<int64_t>(kTiledWarpgroupRows) * kTiledBwdWarpgroupBlockKeys * 2 +
          128 * 16 * 4 + 2 * kTiledWarpgroupRows * 4 + 1023) /
         1024 * 1024;
}

// Dynamic shared memory of a two-tile block: K and V of one key block, both warpgroups'
// buffers, and 1024 bytes to align the start.
template <int D>
RA_HOST_DEVICE constexpr int64_t tiled_bwd_two_tile_smem_bytes() {
  return 2 * static_cast<int64_t>(kTiledBwdWarpgroupBlockKeys) * D * 2 +
         2 * tiled_bwd_two_tile_warpgroup_bytes<D>() + 1024;
}

#if RA_HAS_WGMMA

// The backward of one valid (segment, kv head) of at most kTiledBwdTwoTileRows rows (see the
// file's comment). `smem` / `smem_ptr`: the 1024-byte aligned start of the block's buffers.
template <typename T, int D>
RA_DEVICE void tiled_bwd_warpgroup_two_tile(const SmallSeqTiledParams& p, const TiledSegment& s,
                                            const int hk, const int group, uint8_t* smem_ptr,
                                            const uint32_t smem, const int tid) {
  constexpr int KEYS = kTiledBwdWarpgroupBlockKeys;
  constexpr int ROWS = kTiledWarpgroupRows;
  static_assert(KEYS == 64 && ROWS == 64, "m64n64 score products over one key block");
  constexpr int kTileBytes = ROWS * D * 2;
  constexpr uint32_t kWgBytes = static_cast<uint32_t>(tiled_bwd_two_tile_warpgroup_bytes<D>());
  const int wg = tid / 128;
  const int wtid = tid % 128;
  const uint32_t sk = smem;
  const uint32_t sv = sk + KEYS * D * 2;
  // warpgroup w's buffers at tiles + w kWgBytes: Q, dO, dS^T, exchange slots, row terms
  const uint32_t tiles = sv + KEYS * D * 2;
  const uint32_t sq = tiles + wg * kWgBytes;
  const uint32_t sdo = sq + kTileBytes;
  const uint32_t sdst = sdo + kTileBytes;
  constexpr uint32_t kXchg = 2 * kTileBytes + ROWS * KEYS * 2;  // from a warpgroup's start
  constexpr uint32_t kTerms = kXchg + 128 * 16 * 4;
  uint8_t* const sq_ptr = smem_ptr + (sq - smem);
  uint8_t* const sdst_ptr = smem_ptr + (sdst - smem);
  // slot i of thread wtid at xchg[128 i + wtid]: this warpgroup's, and the other's
  uint32_t* const xchg_out = reinterpret_cast<uint32_t*>(sq_ptr + kXchg) + wtid;
  const uint32_t* const xchg_in =
      reinterpret_cast<const uint32_t*>(smem_ptr + (tiles + (wg ^ 1) * kWgBytes - smem) +
                                        kXchg) +
      wtid;
  const float* const row_terms = reinterpret_cast<const float*>(sq_ptr + kTerms);
  const int warp = wtid / 32;
  const int g = (wtid % 32) / 4;
  const int t = wtid % 4;
  const float scale2 = p.softmax_scale * kTiledBwdLog2e;
  const int64_t seg_rows = static_cast<int64_t>(s.nq) * group;
  const int64_t r0 = static_cast<int64_t>(wg) * ROWS;
  const int blocks = s.nk > 0 ? (s.nk + KEYS - 1) / KEYS : 1;
  const TiledBwdRows rows = tiled_bwd_rows(p, hk, s);
  const int hq0 = hk * group;
  const TiledBwdWarpgroupRows at = tiled_bwd_warpgroup_rows(p, s, rows, hq0);
  tiled_bwd_warpgroup_load_tile<D>(p, at, group, r0, seg_rows, sq, wtid);
  tiled_bwd_warpgroup_stage_row_terms(p, s, hq0, group, r0, seg_rows, sq + kTerms, wtid);
  // The gradient product's B operand per tile: dO (dV, warpgroup 0) or Q (dK, warpgroup 1)
  // of tile 0 and tile 1, and the factor and rows its result is stored with.
  const uint32_t grad_b0 = tiles + (wg == 0 ? kTileBytes : 0);
  const uint32_t grad_b1 = grad_b0 + kWgBytes;
  const float grad_factor = wg == 0 ? 1.f : p.softmax_scale;
  uint16_t* const grad_rows = wg == 0 ? rows.dv : rows.dk;
  const int64_t grad_stride = wg == 0 ? p.dv_token_stride : p.dk_token_stride;
  float dq[D / 2];
#pragma unroll
  for (int i = 0; i < D / 2; ++i) dq[i] = 0.f;
  for (int kb = 0; kb < blocks; ++kb) {
    const int kb0 = kb * KEYS;
    const int live = s.nk - kb0 < KEYS ? s.nk - kb0 : KEYS;
    tiled_warpgroup_stage<D, KEYS, 2 * 128>(sk, sv, p, rows.k + kb0 * p.k_token_stride,
                                            rows.v + kb0 * p.v_token_stride, live, KEYS, tid);
    ra_cp_async_commit();
    ra_cp_async_wait<0>();
    ra_fence_proxy_async();
    __syncthreads();  // K / V (and at block 0 each tile's Q, dO and row terms) in place
    uint32_t pa[ROWS / 16][4], dsa[ROWS / 16][4];
    tiled_bwd_warpgroup_transposed_scores<T, D, true>(sk, sv, sq, sdo, row_terms,
                                                      row_terms + ROWS, scale2, live, wtid, pa,
                                                      dsa);
    // dS^T into the dS buffer; the operand the other warpgroup needs into the exchange
#pragma unroll
    for (int kk = 0; kk < ROWS / 16; ++kk)
#pragma unroll
      for (int x = 0; x < 4; ++x) {
        *reinterpret_cast<uint32_t*>(sdst_ptr + tiled_bwd_warpgroup_dst_offset(warp, g, t, kk, x)) =
            dsa[kk][x];
        xchg_out[128 * (4 * kk + x)] = wg == 0 ? dsa[kk][x] : pa[kk][x];
      }
    ra_fence_proxy_async();
    __syncthreads();  // dS^T and the exchanged operands in place
    // A operands of tile 0 and tile 1: warpgroup 0 P^T_0 (own) and P^T_1 (exchanged),
    // warpgroup 1 dS^T_0 (exchanged) and dS^T_1 (own)
    uint32_t a0[ROWS / 16][4], a1[ROWS / 16][4];
#pragma unroll
    for (int kk = 0; kk < ROWS / 16; ++kk)
#pragma unroll
      for (int x = 0; x < 4; ++x) {
        const uint32_t other = xchg_in[128 * (4 * kk + x)];
        a0[kk][x] = wg == 0 ? pa[kk][x] : other;
        a1[kk][x] = wg == 0 ? other : dsa[kk][x];
      }
    float grad[D / 2];
    ra_wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < ROWS / 16; ++kk)
      ra_wgmma_rs<T, D>(grad, a0[kk], ra_wgmma_desc_n_major(grad_b0 + 16 * kk * 128, ROWS * 128),
                        kk > 0);
#pragma unroll
    for (int kk = 0; kk < ROWS / 16; ++kk)
      ra_wgmma_rs<T, D>(grad, a1[kk], ra_wgmma_desc_n_major(grad_b1 + 16 * kk * 128, ROWS * 128),
                        1);
    tiled_bwd_warpgroup_issue_dq_from_buffer<T, D>(dq, sdst, sk);
    ra_wgmma_commit();
    ra_wgmma_wait<0>();
#pragma unroll
    for (int i = 0; i < D / 2; ++i) {
      ra_wgmma_pin(grad[i]);
      ra_wgmma_pin(dq[i]);
    }
    // the block's dV (warpgroup 0) or dK times the scale (warpgroup 1), live keys only
    tiled_bwd_warpgroup_store_key_rows<T, D>(grad_rows, grad_stride, kb0, live, grad,
                                             grad_factor, warp, g, t);
    __syncthreads();  // every product of this block done: K / V, dS^T and the exchange free
  }
  // scale dQ of this warpgroup's tile through its Q buffer (every product that read it is done)
#pragma unroll
  for (int r = 0; r < 2; ++r)
    tiled_warpgroup_acc_row_to_buffer<T, D>(sq_ptr, dq, r, p.softmax_scale, wtid);
  ra_warpgroup_sync(wg);
  tiled_warpgroup_store_rows<D>(at.dq, p.dq_token_stride, p.dq_head_stride,
                                TiledRowMap(r0, group), r0, seg_rows, sq_ptr, wtid);
}

#endif  // RA_HAS_WGMMA

// Two-tile walk kernel: grid-stride over (segment, kv head) items, numbered segment-major; a
// block's first warp writes each item's edges (tiled_bwd_edges), valid segments take the walk.
template <typename T, int D>
__global__ void RA_LAUNCH_BOUNDS_MIN_BLOCKS(2 * 128, 1)
    small_seq_tiled_bwd_warpgroup_two_tile_kernel(const SmallSeqTiledParams p) {
#if RA_HAS_WGMMA
  const int tid = threadIdx.x;
  const int group = p.num_heads_q / p.num_heads_kv;
  RA_DYNAMIC_SHARED(ra_vec8, tiled_bwd_two_tile_smem);
  const uint32_t raw = ra_smem_address(tiled_bwd_two_tile_smem);
  const uint32_t pad = ra_smem_pad_1024(raw);
  uint8_t* const smem_ptr = reinterpret_cast<uint8_t*>(tiled_bwd_two_tile_smem) + pad;
  const int64_t items = static_cast<int64_t>(p.batch) * p.num_heads_kv;
  for (int64_t item = blockIdx.x; item < items; item += gridDim.x) {
    const int seg = static_cast<int>(item / p.num_heads_kv);
    const int hk = static_cast<int>(item - static_cast<int64_t>(seg) * p.num_heads_kv);
    const TiledBounds b = tiled_fetch_bounds(p, seg);
    const TiledSegment s = tiled_resolve_segment(p, seg, b);
    if (tid < 32) tiled_bwd_edges<T, D>(p, seg, hk, b, s, tid);
    if (!s.valid) continue;
    tiled_bwd_warpgroup_two_tile<T, D>(p, s, hk, group, smem_ptr, raw + pad, tid);
    __syncthreads();  // every warp is done with this item's buffers
  }
#endif
}

}  // namespace small_seq
