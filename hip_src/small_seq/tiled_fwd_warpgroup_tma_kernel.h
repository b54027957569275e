// Tiled small-seq forward, warpgroup variant staged by the tensor memory accelerator (Hopper,
// CUDA sm_90a builds): the work and the softmax of tiled_fwd_warpgroup_kernel.h (steps of KEYS
// keys: 64, or 16 for histories of at most 16), with K, V, Q and out moved by tile copies
// (common/tma.h) instead of per-thread cp.async and 16-byte stores
// (docs/kernels.md#warpgroup-kernel, "Tile-copy staging").
//
// Why: the profile of the cp.async kernel on 256-key histories spends about 40% of its issue
// slots outside the softmax steps, on address arithmetic and copies (about 12 instructions per
// 16-byte K / V copy, 270 per warp and tile for the next tile's GQA-mapped Q rows, 510 for the
// out epilogue), with two warps per scheduler to hide it. One thread issues a tile copy of a
// 64-row panel in one instruction.
//
// Per work item (segment, kv head, split):
//   1. Thread 0 issues the tile copies of K and V, one barrier per step (kv_bar), so a
//      warpgroup starts its first tile once step 0 has landed, not the whole history. Rows past
//      the segment inside the tensor are the next segment's keys: the softmax masks K's (the
//      tail step), but V's would reach this segment through P = 0 (0 x inf is NaN), so the
//      last step's V, where the history ends inside it, is copied by every thread with cp.async
//      (live keys, zeros after) and completes on its own barrier (tail_bar).
//   2. Thread 0 issues the tiles' Q copies (a GQA-folded box: 64 / group
//      tokens x the group's q heads, rows r = token * group + head as the other tiled kernels),
//      one tile ahead (two buffers, a barrier each). Rows past the segment are the next
//      segment's queries or zeros: each row of a tile is computed alone and only live rows are
//      stored, so they cost nothing but their products.
//   3. The tile as tiled_warpgroup_tile computes it; out goes through the tile's Q buffer, and a
//      tile of 64 live rows leaves by one tile store (its thread 0), a tile cut by the segment's
//      end by the 16-byte stores of the cp.async kernel (a tile store would write the next
//      segment's rows). The store is waited for (its reads of the buffer) before that buffer
//      takes another Q copy.
// Blocks of one warpgroup (128 threads); the serial step schedule of tiled_warpgroup_tile.
// Barrier phases: every thread keeps the parity of each barrier's next phase; a barrier is armed
// once per item (K / V) or per use of its buffer (Q) and each use flips it, whether or not the
// thread waited on it. Items of bad segments stage nothing (tiled_staged_item writes their NaN
// rows), so they arm nothing.
//
// Streaming instance (STREAM): one warpgroup per block and one row tile per work item, K / V
// streamed through a ring of two 64-key steps instead of staged whole, so that two blocks fit a
// multiprocessor where one block holding a 256-key history (d 128) would fill it: the two
// blocks' items then start and end independently, each one's staging and epilogue under the
// other's products. Its shared memory does not grow with the history, so it serves any history
// up to the tiled kernels' last key (kSmallSeqTiledMaxSeqlenKv): the plan's rule
// (small_seq_plan._fwd_streams) takes it for histories a block cannot stage whole and, at d 128,
// for (segment, kv head)s of one row tile whose history staged whole would serve only that tile.
// A segment's tiles are consecutive items, so its K / V crosses DRAM once and L2 once per tile.
// Nothing in the ring depends on the history's length: the slots' barriers and the release
// barriers flip one phase per step, whatever the number of steps. Thread 0
// copies steps 0 and 1 at the item's start and step j + 1 into step j - 1's slot once every
// warp is past step j - 1's P . V (an mbarrier per slot counting one arrival per warp). The
// step where a history ends inside it takes its V by cp.async into a third V slot (live keys,
// zeros after), so that no V box brings another segment's keys (tiled_warpgroup_tile's RING
// addressing).
//
// Selected by the launcher for d 64 / 128 where the GQA group divides 64 and the tensors have
// tile-copy layouts (tensor maps of q, k, v, out made per call); tuning
// small_seq_tiled_warpgroup_tma 0 keeps the cp.async kernel for 16-key steps (longer histories
// then take the kernels without warpgroups).
#pragma once

#include "../common/tma.h"
#include "tiled_fwd_warpgroup_kernel.h"

#if RA_TMA_BUILD

namespace small_seq {

// Tensor maps of one call: q / out with boxes of 64 columns x group heads x 64 / group tokens,
// k / v with boxes of 64 columns x 1 head x one step's keys (KEYS).
struct TiledTmaMaps {
  CUtensorMap q, k, v, o;
};

// Tensor map of a tensor shaped like q (q, out, dout, dq: BSHD [b, s_q, h_q, d], THD rows as one
// batch) with the warpgroup kernels' Q box: 64 columns x the GQA group's q heads x 64 / group
// tokens (a 64-row tile, rows token-major). False where TMA cannot describe it (ra_tma_map_16bit;
// the GQA group must divide 64, which the callers check).
inline bool tiled_tma_q_map(CUtensorMap* map, const SmallSeqTiledParams& p, const void* base,
                            int d, int64_t batch_stride, int64_t token_stride,
                            int64_t head_stride) {
  const int group = p.num_heads_q / p.num_heads_kv;
  const bool thd = p.cu_seqlens_q != nullptr;
  // (a THD tensor's batch stride is never used: ra_tma_map_16bit gives a size-1 dimension one)
  return ra_tma_map_16bit(map, base, thd ? 1 : p.batch, thd ? p.total_q : p.s_q, p.num_heads_q,
                          d, batch_stride, token_stride, head_stride, group,
                          kTiledWarpgroupRows / group);
}

// Barriers for the K / V steps of the longest history a block's shared memory can hold (d 64,
// 64-key steps, within 227 KiB beside one warpgroup's Q buffers: 13). The streaming instance
// uses four of them (its two slots and their release barriers) at any history.
constexpr int kTiledTmaMaxSteps = 16;
// Static shared memory of a block: the barriers (one per step, the tail's, then two per Q buffer
// pair: the block's warpgroup takes the pair at 2 * its index, 0, and the second pair is spare,
// kept so that the kernels' code and shared layout stay those the benchmarks measured). The
// launcher counts it beside the dynamic part (with room for the compiler's alignment).
constexpr int kTiledTmaBarriers = kTiledTmaMaxSteps + 1 + 2 * 2;
RA_HOST_DEVICE constexpr int64_t tiled_tma_static_bytes() { return kTiledTmaBarriers * 8 + 64; }

// The streaming instance's ring: two 64-key steps of K and of V (V has a third step's rows
// for the tail step), one Q buffer; its dynamic shared memory.
constexpr int kTiledStreamRingKeys = 2 * kTiledWarpgroupKeys;
template <int D>
RA_HOST_DEVICE constexpr int64_t tiled_stream_smem_bytes() {
  return (2 * kTiledStreamRingKeys + kTiledWarpgroupKeys) * D * 2 + kTiledWarpgroupRows * D * 2 +
         1024;
}

#if RA_HAS_WGMMA
// Writes out the finished tile `t` of a segment (kv head hk, GQA group `group`) whose O / l sit
// in the 64 x D buffer at shared address `buf` (generic pointer buf_ptr; every thread of
// warpgroup wg, wtid = thread within it): a tile of 64 live rows by tile stores from its thread 0
// to out's box at (token q_token, batch q_batch) (committed, not waited for), one that the
// segment's end cuts by 16-byte stores (a tile store would write the next segment's rows).
template <int D>
RA_DEVICE void tiled_tma_store_tile(const SmallSeqTiledParams& p, const TiledTmaMaps& maps,
                                    const TiledSegment& s, const int hk, const int group,
                                    const TiledRowMap& map, const int64_t t,
                                    const int64_t seg_rows, const int q_token, const int q_batch,
                                    const uint32_t buf, uint8_t* buf_ptr, const int wg,
                                    const int wtid) {
  constexpr int ROWS = kTiledWarpgroupRows;
  const int64_t r0 = t * ROWS;
  if (r0 + ROWS <= seg_rows) {
    ra_fence_proxy_async();  // O / l in the buffer, for the tile store
    ra_warpgroup_sync(wg);
    if (wtid == 0) {
#pragma unroll
      for (int c = 0; c < D / 64; ++c)
        ra_tma_store(&maps.o, buf + c * ROWS * 128, 64 * c, hk * group, q_token, q_batch);
      ra_tma_store_commit();
    }
  } else {
    ra_warpgroup_sync(wg);
    tiled_warpgroup_store_out<D>(p, s, hk, group, map, r0, seg_rows, buf_ptr, wtid);
  }
}
#endif  // RA_HAS_WGMMA

// NOTE (registers): as small_seq_tiled_fwd_warpgroup_kernel (CAPPED: three blocks per
// multiprocessor where they fit). STREAM: the streaming instance (64-key steps, uncapped: two
// blocks). ROW_MAX: the instance for calls that ask for row_max (tiled_warpgroup_tile).
template <typename T, int D, int KEYS, bool CAPPED, bool STREAM = false, bool ROW_MAX = false>
__global__ void RA_LAUNCH_BOUNDS_MIN_BLOCKS(128, CAPPED ? 3 : 2)
    small_seq_tiled_fwd_warpgroup_tma_kernel(const SmallSeqTiledParams p, const int splits,
                                             const __grid_constant__ TiledTmaMaps maps) {
#if RA_HAS_WGMMA
  constexpr int THREADS = 128;
  constexpr int ROWS = kTiledWarpgroupRows;
  constexpr int PANELS = D / 64;
  constexpr uint32_t kQPanelBytes = ROWS * 128;  // a Q / out box: 64 rows x 64 columns
  constexpr uint32_t kKvPanelBytes = KEYS * 128;  // a K / V box: one step's keys x 64 columns
  static_assert(!STREAM || (KEYS == kTiledWarpgroupKeys && !CAPPED),
                "the streaming instance: uncapped, over 64-key steps");
  constexpr int kRing = STREAM ? kTiledStreamRingKeys : 0;
  const int tid = threadIdx.x;
  const int wg = tid / 128;
  const int wtid = tid % 128;
  const int group = p.num_heads_q / p.num_heads_kv;
  const int group_tokens = ROWS / group;
  const int kp = STREAM ? kRing : static_cast<int>(tiled_warpgroup_keys(p.max_seqlen_kv));
  RA_DYNAMIC_SHARED(ra_vec8, tiled_warpgroup_smem);
  const TiledWarpgroupSmem<D> smem(tiled_warpgroup_smem, kp, STREAM ? KEYS : 0, wg);
  constexpr uint32_t kQBytes = TiledWarpgroupSmem<D>::kQBytes;
  // Barriers: one per K / V step, the tail step's cp.async V, the Q buffers' (kTiledTmaBarriers).
  __shared__ alignas(8) uint64_t bars[kTiledTmaBarriers];
  const uint32_t bar0 = ra_smem_address(bars);
  const auto kv_bar = [&](int step) { return bar0 + 8 * step; };
  const uint32_t tail_bar = bar0 + 8 * kTiledTmaMaxSteps;
  const auto q_bar = [&](int b) { return bar0 + 8 * (kTiledTmaMaxSteps + 1 + 2 * wg + b); };
  // The streaming instance: kv_bar(0..1) are the ring's slots, kv_bar(2..3) say that every
  // warp is done with a slot (one arrival per warp).
  const auto slot_free_bar = [&](int slot) { return kv_bar(2 + slot); };
  if (tid == 0) {
    for (int i = 0; i < kTiledTmaMaxSteps; ++i)
      ra_mbar_init(kv_bar(i), STREAM && (i == 2 || i == 3) ? THREADS / 32 : 1);
    ra_mbar_init(tail_bar, THREADS);
    for (int i = 0; i < 2; ++i)
      ra_mbar_init(bar0 + 8 * (kTiledTmaMaxSteps + 1 + i), 1);
    ra_mbar_init_fence();
  }
  __syncthreads();
  uint32_t kv_parity = 0;    // bit i: kv_bar(i)
  uint32_t tail_parity = 0;
  uint32_t q_parity = 0;     // bit b: this warpgroup's q_bar(b)
  uint32_t free_parity = 0;  // streaming: bit s: slot_free_bar(s)
  const int64_t items = static_cast<int64_t>(p.batch) * splits * p.num_heads_kv;
  for (int64_t item = blockIdx.x; item < items; item += gridDim.x) {
    TiledStagedItem it;
    if (!tiled_staged_item<T, D, ROWS, THREADS>(p, item, splits, tid, &it)) continue;
    const TiledSegment& s = it.s;
    const int hk = it.hk;
    const int64_t seg_rows = it.seg_rows;
    const int64_t tile1 = it.tile1;
    const int nk = s.nk;
    const int steps = (nk + KEYS - 1) / KEYS;
    const bool tail = nk % KEYS != 0;
    const int kv_token0 = static_cast<int>(s.kv_token0);
    const int kv_batch = static_cast<int>(s.kv_batch);
    // Thread 0's tile copies of step st's K and V (V's only where the history does not end
    // inside the step: that V is copied below) into the step's rows, on the step's barrier; the
    // streaming instance's into its ring slot st % 2 (V's panels a step longer than K's).
    const auto copy_step = [&](int st) {
      const int slot = STREAM ? st % 2 : st;
      const int v_panel_rows = STREAM ? kRing + KEYS : kp;
      const bool v_copy = !(tail && st == steps - 1);
      ra_mbar_arrive_expect_tx(kv_bar(slot), (v_copy ? 2 : 1) * PANELS * kKvPanelBytes);
#pragma unroll
      for (int c = 0; c < PANELS; ++c) {
        ra_tma_load(smem.k + (c * kp + slot * KEYS) * 128, &maps.k, kv_bar(slot), 64 * c, hk,
                    kv_token0 + st * KEYS, kv_batch);
        if (v_copy)
          ra_tma_load(smem.v + (c * v_panel_rows + slot * KEYS) * 128, &maps.v, kv_bar(slot),
                      64 * c, hk, kv_token0 + st * KEYS, kv_batch);
      }
    };
    // (the streaming instance copies the steps after its first two as its ring frees them)
    if (tid == 0) {
      for (int st = 0; st < steps && (!STREAM || st < 2); ++st) copy_step(st);
    }
    if (tail) {  // the last step's V: live keys, then zeros (every thread arrives once)
      constexpr int kVecs = D / 8;
      const int k0 = (steps - 1) * KEYS;
      for (int idx = tid; idx < KEYS * kVecs; idx += THREADS) {
        const int row = k0 + idx / kVecs;
        const int vec = idx % kVecs;
        const bool live = row < nk;
        // (streaming: the ring's tail rows, kRing .. kRing + KEYS - 1)
        const uint32_t off = STREAM ? ra_wgmma_offset(kRing + idx / kVecs, 8 * vec, kRing + KEYS)
                                    : ra_wgmma_offset(row, 8 * vec, kp);
        ra_cp_async16(smem.v + off, live ? it.vbase + row * p.v_token_stride + 8 * vec : p.v,
                      live ? 16 : 0);
      }
      ra_mbar_arrive_cp_async(tail_bar);
    }
    const int q_token0 = static_cast<int>(s.q_token0);
    const int q_batch = static_cast<int>(s.q_batch);
    // Q of tile t into buffer b (thread 0), once the buffer's last out store
    // has read it.
    const auto load_q = [&](int64_t t, int b) {
      ra_tma_store_wait_read();
      ra_mbar_arrive_expect_tx(q_bar(b), PANELS * kQPanelBytes);
#pragma unroll
      for (int c = 0; c < PANELS; ++c)
        ra_tma_load(smem.q + b * kQBytes + c * ROWS * 128, &maps.q, q_bar(b), 64 * c,
                    hk * group, q_token0 + static_cast<int>(t) * group_tokens, q_batch);
    };
    int64_t tile = it.tile0 + wg;
    if (tile < tile1 && wtid == 0) load_q(tile, 0);
    bool first = true;
    // before_step: the block's first tile of the item waits for each step's keys.
    const auto before_step = [&](int k0) {
      if (!first) return;
      const int st = k0 / KEYS;
      ra_mbar_wait(kv_bar(st), (kv_parity >> st) & 1u);
      if (tail && st == steps - 1) {
        ra_mbar_wait(tail_bar, tail_parity);
        ra_fence_proxy_async();  // cp.async wrote V's tail: publish it to the products
      }
    };
    // store_out of the tile `t` in buffer offset `off` (tiled_tma_store_tile)
    const auto store_out_of = [&](const int64_t t, const uint32_t off) {
      return [&, t, off](const TiledRowMap& map) {
        tiled_tma_store_tile<D>(p, maps, s, hk, group, map, t, seg_rows,
                                q_token0 + static_cast<int>(t) * group_tokens, q_batch,
                                smem.q + off, smem.q_ptr + off, wg, wtid);
      };
    };
    if constexpr (STREAM) {
      // One row tile (the launcher's splits). Before step st (every warp past step st - 1's
      // P . V): step st - 1's slot is released, and thread 0 refills it with step st + 1 once
      // every warp has released it; then the step's slot (and the tail V) is waited for.
      // (its Q copy issued above: tile = it.tile0)
      ra_mbar_wait(q_bar(0), q_parity & 1u);
      q_parity ^= 1u;
      // Every warp arrives before thread 0 waits, and nothing warpgroup-collective (a product, a
      // named barrier) may come between them: the other warps reach their arrival only by
      // issuing products with warp 0.
      const auto stream_step = [&](int k0) {
        const int st = k0 / KEYS;
        if (st >= 1 && st + 1 < steps) {
          const int slot = (st - 1) % 2;
          if (wtid % 32 == 0) ra_mbar_arrive(slot_free_bar(slot));
          if (tid == 0) {
            ra_mbar_wait(slot_free_bar(slot), (free_parity >> slot) & 1u);
            copy_step(st + 1);
          }
          free_parity ^= 1u << slot;
        }
        ra_mbar_wait(kv_bar(st % 2), (kv_parity >> (st % 2)) & 1u);
        kv_parity ^= 1u << (st % 2);
        if (tail && st == steps - 1) {
          ra_mbar_wait(tail_bar, tail_parity);
          ra_fence_proxy_async();  // cp.async wrote V's tail: publish it to the products
        }
      };
      tiled_warpgroup_tile<T, D, KEYS, kRing, true, ROW_MAX>(
          p, s, hk, group, tile * ROWS, seg_rows, smem.q_ptr, smem.q, smem.k, smem.v, kp, wg,
          wtid, 0, nk, stream_step, store_out_of(tile, 0));
      if (tail) tail_parity ^= 1u;
      // Every warp is done with the ring and this thread's reads and writes of the Q buffer
      // come before the tile copy that refills it.
      ra_fence_proxy_async();
      __syncthreads();
    } else {
      for (int buf = 0; tile < tile1; ++tile, buf ^= 1) {
        if (tile + 1 < tile1 && wtid == 0) load_q(tile + 1, buf ^ 1);
        ra_mbar_wait(q_bar(buf), (q_parity >> buf) & 1u);
        q_parity ^= 1u << buf;
        const uint32_t off = buf * kQBytes;
        const int64_t r0 = tile * ROWS;
        tiled_warpgroup_tile<T, D, KEYS, 0, true, ROW_MAX>(
            p, s, hk, group, r0, seg_rows, smem.q_ptr + off, smem.q + off, smem.k, smem.v, kp, wg,
            wtid, 0, nk, before_step, store_out_of(tile, off));
        first = false;
        // This thread's reads and writes of the buffer come before the tile copy that refills it.
        ra_fence_proxy_async();
        ra_warpgroup_sync(wg);
      }
      kv_parity ^= (1u << steps) - 1u;
      if (tail) tail_parity ^= 1u;
      __syncthreads();  // every warpgroup is done with this segment's K / V
    }
  }
  if (wtid == 0) ra_tma_store_wait();
#endif
}

}  // namespace small_seq

#endif  // RA_TMA_BUILD
