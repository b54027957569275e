// Tiled small-seq backward, warpgroup dQ kernel with K / V streamed through a ring (Hopper,
// sm_90a): the dQ of tiled_bwd_warpgroup_kernel.h's dQ kernel for histories of any length up
// to kTiledBwdWarpgroupMaxKeys (docs/kernels.md#warpgroup-backward, "Long histories").
//
// Why: the staged dQ kernel (small_seq_tiled_bwd_warpgroup_dq_tma_kernel) holds a (segment, kv head)'s whole K and V in shared memory, 225 KiB at 256 keys
// and d 128, so past 256 keys the warpgroup backward could not run and its calls went to the
// flash route (whose dQ is an atomic sum) or to the mma.sync passes. Here shared memory does not
// depend on the history: its K / V pass through a ring of kTiledBwdDqStreamStages 64-key steps.
//
// Work item = (segment, kv head, pair of 64-row tiles), numbered segment-major so that the
// items of one (segment, kv head) run together and share its K / V through L2; block = two
// warpgroups, warpgroup w computing tile 2 pair + w (a tile past the segment's rows computes
// nothing, its warpgroup only copies and waits). Per item:
//   1. Each warpgroup copies its tile's Q and dO (cp.async, rows past the segment as zeros)
//      and issues its rows' lse / dlse loads; all 256 threads copy the first STAGES - 1 steps of
//      K and V (keys past the history as zeros: exact tails, as every staging copy).
//   2. Once Q / dO and step 0 have landed: each row's lse and Delta (rowsum(dO O) - dlse from
//      the tile's dO and the row's out, written to the workspace for the dK / dV kernel
//      launched after this one, as the staged dQ kernel does; pass 1 does not run).
//   3. Per step j: wait for step j's copies (cp.async group j) and one block barrier, after
//      which every warpgroup is done with step j - 1, so step j + STAGES - 1 is copied into its
//      slot; then S, dP, dS of the step in registers (tiled_bwd_warpgroup_scores, P = 0 past
//      the history) and dQ += dS K (tiled_bwd_warpgroup_issue_dq), waited for before the next
//      step's barrier.
//   4. scale dQ through the tile's Q buffer, stored row by row, rows past the segment not.
// Each dQ element has one writer summing the steps in key order: deterministic, and the same
// sums in the same order as the staged kernel (bitwise equal gradients). A segment without keys
// runs no step: dQ 0 (its Delta still written). Segments the forward flagged are left to the
// dK / dV kernel (NaN dq); this kernel zeroes the dq of q padding rows at its end.
//
// Shared memory (dynamic, tiled_bwd_warpgroup_dq_stream_smem_bytes): the ring's slots (K then V
// of one step each), then one Q / dO buffer per warpgroup, 1024-byte aligned (the operand
// swizzle). The kernel body is empty where the arch-specific features are missing (RA_HAS_WGMMA
// 0); the launcher never selects it there.
#pragma once

#include "tiled_bwd_warpgroup_kernel.h"

namespace small_seq {

// 64-key steps of K / V in the ring: copies run STAGES - 1 steps ahead of the products. Four
// slots at d 128 (128 KiB) beside the two Q / dO buffers (64 KiB) fit one block per
// multiprocessor, which its registers (two warpgroups of up to 255) allow anyway.
constexpr int kTiledBwdDqStreamStages = 4;
// Row tiles of one work item: one per warpgroup, sharing each step of K / V.
constexpr int kTiledBwdDqStreamRows = kTiledBwdWarpgroupDqWarpgroups * kTiledWarpgroupRows;

// Dynamic shared memory of a block: the ring, a Q and a dO buffer per warpgroup, alignment.
template <int D>
RA_HOST_DEVICE constexpr int64_t tiled_bwd_warpgroup_dq_stream_smem_bytes() {
  return static_cast<int64_t>(kTiledBwdDqStreamStages) * 2 * kTiledBwdWarpgroupBlockKeys * D * 2 +
         static_cast<int64_t>(kTiledBwdWarpgroupDqWarpgroups) * 2 * kTiledWarpgroupRows * D * 2 +
         1024;
}

// Work items per (segment, kv head) of a call whose segments hold at most `max_rows` rows per
// kv head (tiled_max_rows): pairs of 64-row tiles.
RA_HOST_DEVICE constexpr int64_t tiled_bwd_dq_stream_groups(int64_t max_rows) {
  return (max_rows + kTiledBwdDqStreamRows - 1) / kTiledBwdDqStreamRows;
}

#if RA_HAS_WGMMA

// The dQ of the item (segment s, kv head hk, tile pair `pair`; the segment valid and the pair
// holding at least one of its rows) by the whole block (tid < 256). `smem` / `smem_ptr`: the
// 1024-byte aligned start of the dynamic shared memory. Returns with every copy landed and the
// calling thread done with the buffers; the caller's block barrier comes before the next item.
template <typename T, int D>
RA_DEVICE void tiled_bwd_warpgroup_dq_stream_item(const SmallSeqTiledParams& p,
                                                  const TiledSegment& s, const int hk,
                                                  const int group, const int64_t pair,
                                                  uint8_t* smem_ptr, const uint32_t smem,
                                                  const int tid) {
  constexpr int THREADS = kTiledBwdWarpgroupDqWarpgroups * 128;
  constexpr int ROWS = kTiledWarpgroupRows;
  constexpr int KEYS = kTiledBwdWarpgroupBlockKeys;
  constexpr int STAGES = kTiledBwdDqStreamStages;
  static_assert(STAGES >= 2, "a step is copied while the one before it computes");
  constexpr uint32_t kStepBytes = KEYS * D * 2;     // K (or V) of one step
  constexpr uint32_t kSlotBytes = 2 * kStepBytes;   // K, then V
  constexpr uint32_t kTileBytes = ROWS * D * 2;     // Q (or dO) of one tile
  const int wg = tid / 128;
  const int wtid = tid % 128;
  const int64_t seg_rows = static_cast<int64_t>(s.nq) * group;
  const int64_t r0 = pair * kTiledBwdDqStreamRows + wg * ROWS;
  const bool mine = r0 < seg_rows;  // the same for the whole warpgroup
  const int hq0 = hk * group;
  const TiledBwdRows rows = tiled_bwd_rows(p, hk, s);
  const TiledBwdWarpgroupRows at = tiled_bwd_warpgroup_rows(p, s, rows, hq0);
  const TiledRowMap map(r0, group);
  const uint32_t tile_at = smem + STAGES * kSlotBytes + wg * 2 * kTileBytes;  // Q, then dO
  uint8_t* const tile_ptr = smem_ptr + STAGES * kSlotBytes + wg * 2 * kTileBytes;
  const int steps = (s.nk + KEYS - 1) / KEYS;
  // Step j's keys into slot j % STAGES (all threads; not committed).
  const auto stage = [&](const int j) {
    const int kb0 = j * KEYS;
    const int live = s.nk - kb0 < KEYS ? s.nk - kb0 : KEYS;
    const uint32_t sk = smem + static_cast<uint32_t>(j % STAGES) * kSlotBytes;
    tiled_warpgroup_stage<D, KEYS, THREADS>(sk, sk + kStepBytes, p,
                                            rows.k + kb0 * p.k_token_stride,
                                            rows.v + kb0 * p.v_token_stride, live, KEYS, tid);
  };
  TiledBwdDqRowLoads l;
  if (mine) {
    tiled_bwd_warpgroup_load_tile<D>(p, at, group, r0, seg_rows, tile_at, wtid);
    tiled_bwd_warpgroup_dq_load_rows<D>(p, s, hq0, at, map, r0, seg_rows, l, wtid);
  }
  // cp.async groups 0 .. STAGES - 2 hold steps 0 .. STAGES - 2 (Q / dO join group 0); a group
  // past the last step is committed empty, so that group j is always step j's.
#pragma unroll
  for (int j = 0; j < STAGES - 1; ++j) {
    if (j < steps) stage(j);
    ra_cp_async_commit();
  }
  ra_cp_async_wait<STAGES - 2>();  // group 0: the tile's Q / dO and step 0
  ra_fence_proxy_async();
  __syncthreads();
  const float scale2 = p.softmax_scale * kTiledBwdLog2e;
  float lse2[2], delta[2];
  float dq[D / 2];
#pragma unroll
  for (int i = 0; i < D / 2; ++i) dq[i] = 0.f;
  if (mine)
    tiled_bwd_warpgroup_dq_row_terms<T, D>(p, s, hq0, map, r0, seg_rows, l, at.out,
                                                  tile_ptr + kTileBytes, lse2, delta, wtid);
  for (int j = 0; j < steps; ++j) {
    if (j > 0) {
      ra_cp_async_wait<STAGES - 2>();  // group j: step j
      ra_fence_proxy_async();
      __syncthreads();  // step j in place; every warpgroup done with step j - 1's slot
    }
    if (j + STAGES - 1 < steps) stage(j + STAGES - 1);  // into step j - 1's slot
    ra_cp_async_commit();
    if (mine) {
      const uint32_t sk = smem + static_cast<uint32_t>(j % STAGES) * kSlotBytes;
      uint32_t dsa[KEYS / 16][4];
      tiled_bwd_warpgroup_scores<T, D, KEYS, false, false, KEYS>(
          tile_at, tile_at + kTileBytes, sk, sk + kStepBytes, KEYS, 0, s.nk - j * KEYS, scale2,
          lse2, delta, nullptr, nullptr, dsa, wtid);
      tiled_bwd_warpgroup_issue_dq<T, D, KEYS>(dq, dsa, sk, KEYS, 0);
      ra_wgmma_wait<0>();  // the slot is refilled after the next barrier; dsa is rewritten
    }
  }
  ra_cp_async_wait<0>();  // only empty groups remain
  if (mine) {
#pragma unroll
    for (int i = 0; i < D / 2; ++i) ra_wgmma_pin(dq[i]);
    ra_warpgroup_sync(wg);  // every warp is past its score products: the Q buffer is free
#pragma unroll
    for (int r = 0; r < 2; ++r)
      tiled_warpgroup_acc_row_to_buffer<T, D>(tile_ptr, dq, r, p.softmax_scale, wtid);
    ra_warpgroup_sync(wg);
    tiled_warpgroup_store_rows<D>(at.dq, p.dq_token_stride, p.dq_head_stride, map, r0,
                                  seg_rows, tile_ptr, wtid);
  }
}

#endif  // RA_HAS_WGMMA

// dQ kernel over histories of up to kTiledBwdWarpgroupMaxKeys keys (launched where the staged
// dQ kernel's shared memory would not hold the history): grid-stride over (segment, kv head,
// tile pair) items, two warpgroups per block. Launched ahead of the dK / dV kernel without
// pass 1, it computes each row's Delta, writes it to the workspace for the dK / dV kernel, and
// zeroes the dq of q padding rows (pass 1's other part).
template <typename T, int D>
__global__ void RA_LAUNCH_BOUNDS_MIN_BLOCKS(kTiledBwdWarpgroupDqWarpgroups * 128, 1)
    small_seq_tiled_bwd_warpgroup_dq_stream_kernel(const SmallSeqTiledParams p) {
#if RA_HAS_WGMMA
  const int tid = threadIdx.x;
  const int group = p.num_heads_q / p.num_heads_kv;
  const int64_t pairs = tiled_bwd_dq_stream_groups(tiled_max_rows(p));
  RA_DYNAMIC_SHARED(ra_vec8, tiled_bwd_dq_stream_smem);
  const uint32_t raw = ra_smem_address(tiled_bwd_dq_stream_smem);
  const uint32_t pad = ra_smem_pad_1024(raw);
  uint8_t* const smem_ptr = reinterpret_cast<uint8_t*>(tiled_bwd_dq_stream_smem) + pad;
  const int64_t per_seg = static_cast<int64_t>(p.num_heads_kv) * pairs;
  const int64_t items = static_cast<int64_t>(p.batch) * per_seg;
  for (int64_t item = blockIdx.x; item < items; item += gridDim.x) {
    const int seg = static_cast<int>(item / per_seg);
    const int64_t rest = item - static_cast<int64_t>(seg) * per_seg;
    const int hk = static_cast<int>(rest / pairs);
    const int64_t pair = rest - static_cast<int64_t>(hk) * pairs;
    const TiledSegment s = tiled_resolve_segment(p, seg, tiled_fetch_bounds(p, seg));
    // a flagged segment's dq (NaN) is the dK / dV kernel's; pairs past the rows hold none
    if (!s.valid || pair * kTiledBwdDqStreamRows >= static_cast<int64_t>(s.nq) * group) continue;
    tiled_bwd_warpgroup_dq_stream_item<T, D>(p, s, hk, group, pair, smem_ptr, raw + pad, tid);
    __syncthreads();  // every warpgroup is done with the ring and the Q / dO buffers
  }
  tiled_bwd_zero_padding_dq<D>(p, static_cast<int64_t>(blockIdx.x) * blockDim.x + tid,
                               static_cast<int64_t>(gridDim.x) * blockDim.x);
#endif
}

}  // namespace small_seq
