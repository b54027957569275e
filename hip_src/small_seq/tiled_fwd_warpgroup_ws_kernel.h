// Tiled small-seq forward, warp-specialized warpgroup kernel (Hopper, CUDA sm_90a builds): the
// tile-copy kernel's work (tiled_fwd_warpgroup_tma_kernel.h: 64-row tiles, 64-key steps, the
// overlapped softmax schedule of tiled_warpgroup_tile) with the copies moved to a warpgroup of
// their own, so that the next work item's K, V and Q arrive while the current one computes
// (docs/kernels.md#warp-specialized-kernel).
//
// Why: over 129-256 keys with two or more row tiles per (segment, kv head) the tile-copy kernel
// stages the whole history in a block that fills its multiprocessor, so each item's first
// steps and Q land while nothing else runs there, and its out store drains the same way. Copying
// the next item ahead from inside those warpgroups measured slower (docs/kernels_not_kept.md:
// the thread that issues the copies waits for the other warps, and every warp stalls at
// barriers). Here no computing thread ever waits for a copy to be issued: the copy
// warp does the waiting.
//
// Block: three warpgroups (384 threads, one block per multiprocessor). Warpgroups 0 and 1 take
// an item's row tiles round robin (tile0 + wg, + 2, ...), as the tile-copy kernel's blocks of two.
// Warpgroup 2 gives up its registers (ra_warpgroup_regs_lower); its warp 1 decodes the block's
// items and its warp 0 copies: per item, each computing warpgroup's first Q tile, the K / V steps,
// then the other Q tiles in the order they are computed. Its other two warps leave.
//
// Items: only the decode warp decodes them (tiled_decode_item: the segment's offsets from
// global memory, 64-bit divisions). For each item with rows to compute or that may write rows
// besides them (tiled_item_may_write: a bad segment, a first split) it writes the item into a ring
// of four entries in shared memory, and after its last item an entry that ends the run; the copy
// warp and the computing warpgroups take the entries in order. Every computing thread decoding
// every item itself took a tenth of their stall samples (ncu, 4096 x 128 x 256 with 8 kv heads),
// most of it waiting for the offsets, and the copy warp decoding them (ahead of the computing
// warpgroups, which read its entries) put that wait on the copy warp's path, which is the one
// that bounds the rows of ragged histories. The rows written besides the attention stay with the
// computing warpgroups (tiled_item_writes: their 256 threads and registers): the padding rows,
// and a bad segment's report and NaN rows, for which nothing is copied and no barrier armed.
// Where the plan asks for the work queue (p.work_queue, one block per multiprocessor), the decode
// warp takes each next item from it (atomicAdd) instead of a grid stride, and only once the
// computing warpgroups have taken the entry kTiledWsQueueAhead before it: a block then holds at
// most that many items it has not begun, so that the blocks end together on ragged batches, where
// a grid stride hands one block several long histories (the item ring alone would let it hold
// four). Outputs do not depend on which block computes an item.
//
// Shared memory: K and V rings of four 64-key slots (step st of an item in slot st % 4), two Q
// buffers per computing warpgroup (a tile's out leaves through its Q buffer by a tile store, as
// in the tile-copy kernel), the item ring.
// Histories of at most 256 keys never reuse a slot within an item, so a warpgroup may compute
// several tiles of an item against its steps (the first waits for each step, the last releases
// it). Longer histories (up to the tiled kernels' 4096 keys) stream through the ring: the copy
// warp refills a slot with step st + 4 once every computing warp has released step st, so each
// warpgroup must read each step once: the launcher makes their items a pair of row tiles (one
// per computing warpgroup; tiled_ws_tiles_per_item), whose K / V then crosses L2 once per pair,
// as flash-attention 3's forward does per 128-row tile.
// Barriers (mbarriers, each phase one use):
// - full(slot): the slot's K and V have landed. The copy warp's lane 0 arms it with the tile
//   copies' bytes; each of its 32 lanes arrives once. The step where the history ends inside it
//   takes its V by cp.async from the 32 lanes (live keys, zeros after: a tile copy would bring the
//   next segment's keys, and 0 x inf there would reach this segment through P . V), and each lane
//   arrives once its copies have landed (cp.async.mbarrier.arrive: the copy warp never waits for
//   them). A computing thread that waited for such a step fences the proxies (fence.proxy.async)
//   before its products read that V.
// - free(slot): every computing warp is done with the slot (one arrival per warp: 8). A
//   warpgroup's last tile of the item releases each step once its score and P . V products have
//   been waited for (tiled_warpgroup_tile's step_done: the last two steps' slots are refilled
//   under the last P . V and the tile's epilogue); a warpgroup with no tile of the item releases
//   every step once it has landed. Releasing only landed steps keeps a warpgroup from arriving
//   for the next item before the slot's current phase is complete.
// - q_full(wg, buf), q_free(wg, buf): warpgroup wg's Q buffer holds its tile / may be refilled.
//   A warpgroup returns its previous tile's buffer at the start of its next tile, once that
//   tile's out store has read it (its thread 0).
// - item_full(e), item_free(e): entry e of the item ring is written / may be rewritten (one
//   arrival per warp that takes entries, once it has read the entry: 9).
// The copy and decode warps wait on the free barriers with the parity of the phase before (a
// barrier's first wait passes at once); every thread keeps the parity of each barrier it uses.
// Each waiter waits for every phase in turn, so that no wait can mistake a phase for the one two
// phases later. tools/diag/ws_ring_protocol.py model-checks this protocol (tests/
// test_ws_ring_protocol.py): keep the two in step when either changes.
//
// Selected by the plan (small_seq_plan._fwd_warpgroup) at d 128 where a (segment, kv head) may
// hold more than one row tile: up to 256 keys where the tile-copy kernel would run blocks of
// two warpgroups over 64-key steps, and past 256 keys (streamed, ahead of the tile-copy kernel's
// streaming instance); tuning small_seq_tiled_warpgroup_ws 2 takes it for every call of 64-key
// steps it can serve at d 128. An item of one tile leaves warpgroup 1 idle.
#pragma once

#include "tiled_fwd_warpgroup_tma_kernel.h"

#if RA_TMA_BUILD

namespace small_seq {

// Keys of the K and V rings (four 64-key steps): the longest history an item of several row
// tiles per warpgroup may have; longer ones stream through the ring in items of a pair of tiles.
constexpr int kTiledWsRingKeys = 256;
constexpr int kTiledWsSlots = kTiledWsRingKeys / kTiledWarpgroupKeys;
// Warpgroups 0 and 1 compute, warpgroup 2 decodes the items and copies.
constexpr int kTiledWsComputeWarpgroups = 2;
constexpr int kTiledWsThreads = (kTiledWsComputeWarpgroups + 1) * 128;
// Entries of the decoded-item ring: the decode warp runs up to this many items ahead of the
// copy warp, which runs about one item ahead of the computing warpgroups (its K / V ring holds
// one item's steps), so the decode's reads of the offsets are long done when an entry is taken.
constexpr int kTiledWsItemSlots = 4;
// Items a block of the work queue takes ahead of the one its computing warpgroups have begun:
// the next for the copy warp and one more, so that the decode's offset reads stay off the copy
// warp's path. Below kTiledWsItemSlots: a whole ring is the publish's own wait (no bound on
// the items held), and more than a ring could name a phase two phases early and stall for good
// (tools/diag/ws_ring_protocol.py --queue-ahead).
constexpr int kTiledWsQueueAhead = 2;
static_assert(kTiledWsQueueAhead > 0 && kTiledWsQueueAhead < kTiledWsItemSlots,
              "the queue's wait must name a phase the entry is in or has just completed");
// The roles of warpgroup 2's warps (its other two leave).
constexpr int kTiledWsCopyWarp = 0;
constexpr int kTiledWsDecodeWarp = 1;
// Warps that take every entry of the item ring: the computing warpgroups' and the copy warp.
constexpr int kTiledWsItemReaders = kTiledWsComputeWarpgroups * 4 + 1;

// An entry of the item ring: a decoded item (tiled_decode_item's result, with its segment and
// split), or the end of the block's items.
struct TiledWsItem {
  TiledStagedItem it;
  int64_t split;
  int seg;
  bool rows;  // the item has rows to compute (else only rows to write: tiled_item_writes)
  bool end;
};
// Register budgets per thread after the split. The block's pool is what its launch bounds
// gave it (65536 / 384 threads, rounded down to 8: 168 per thread), so the budgets of one warp
// of each warpgroup may sum to 3 x 168 = 504: a raise beyond what the lowering freed waits
// forever. ptxas spills nothing at 72 / 216. Below 72 the 64-bit item decode spills (84 bytes at
// 56, 364 at 24, measured when the copy warp decoded); a copy warp that also wrote the item ring
// spilled 12 bytes at 72.
constexpr int kTiledWsCopyRegs = 72;
constexpr int kTiledWsComputeRegs = 216;
static_assert(kTiledWsCopyRegs + kTiledWsComputeWarpgroups * kTiledWsComputeRegs <=
                  (kTiledWsComputeWarpgroups + 1) * (65536 / kTiledWsThreads / 8 * 8),
              "the register budgets exceed the block's pool");

// Row tiles per work item for histories of up to max_seqlen_kv keys: one per computing
// warpgroup where the ring cannot hold the whole history (each warpgroup reads each step once),
// else 0 (the launcher's splits: tiled_splits).
RA_HOST_DEVICE constexpr int tiled_ws_tiles_per_item(int max_seqlen_kv) {
  return max_seqlen_kv > kTiledWsRingKeys ? kTiledWsComputeWarpgroups : 0;
}

// Dynamic shared memory: the K and V rings, two Q buffers per computing warpgroup, and 1024
// bytes to align the start.
template <int D>
RA_HOST_DEVICE constexpr int64_t tiled_ws_smem_bytes() {
  return 2 * kTiledWsRingKeys * D * 2 +
         2 * kTiledWsComputeWarpgroups * kTiledWarpgroupRows * D * 2 + 1024;
}

// ROW_MAX: the instance for calls that ask for row_max (tiled_warpgroup_tile).
template <typename T, int D, bool ROW_MAX = false>
__global__ void RA_LAUNCH_BOUNDS_MIN_BLOCKS(kTiledWsThreads, 1)
    small_seq_tiled_fwd_warpgroup_ws_kernel(const SmallSeqTiledParams p, const int splits,
                                            const __grid_constant__ TiledTmaMaps maps) {
#if RA_HAS_WGMMA
  constexpr int ROWS = kTiledWarpgroupRows;
  constexpr int KEYS = kTiledWarpgroupKeys;
  constexpr int PANELS = D / 64;
  constexpr int kRing = kTiledWsRingKeys;
  constexpr int kSlots = kTiledWsSlots;
  constexpr int kCompute = kTiledWsComputeWarpgroups;
  constexpr uint32_t kQPanelBytes = ROWS * 128;  // a Q / out box: 64 rows x 64 columns
  constexpr uint32_t kKvPanelBytes = KEYS * 128;  // a K / V box: 64 keys x 64 columns
  const int tid = threadIdx.x;
  const int wg = tid / 128;
  const int wtid = tid % 128;
  const int group = p.num_heads_q / p.num_heads_kv;
  const int group_tokens = ROWS / group;
  RA_DYNAMIC_SHARED(ra_vec8, tiled_warpgroup_smem);
  // (the copy warpgroup sees warpgroup 0's Q buffers: the first of them all)
  const TiledWarpgroupSmem<D> smem(tiled_warpgroup_smem, kRing, 0, wg < kCompute ? wg : 0);
  constexpr uint32_t kQBytes = TiledWarpgroupSmem<D>::kQBytes;
  constexpr int kItemSlots = kTiledWsItemSlots;
  __shared__ alignas(8) uint64_t bars[2 * kSlots + 4 * kCompute + 2 * kItemSlots];
  __shared__ TiledWsItem ring_items[kItemSlots];
  const uint32_t bar0 = ra_smem_address(bars);
  const auto full_bar = [&](int slot) { return bar0 + 8 * slot; };
  const auto free_bar = [&](int slot) { return bar0 + 8 * (kSlots + slot); };
  const auto q_full_bar = [&](int w, int b) { return bar0 + 8 * (2 * kSlots + 2 * w + b); };
  const auto q_free_bar = [&](int w, int b) {
    return bar0 + 8 * (2 * kSlots + 2 * kCompute + 2 * w + b);
  };
  const auto item_full_bar = [&](int e) { return bar0 + 8 * (2 * kSlots + 4 * kCompute + e); };
  const auto item_free_bar = [&](int e) {
    return bar0 + 8 * (2 * kSlots + 4 * kCompute + kItemSlots + e);
  };
  if (tid == 0) {
    for (int slot = 0; slot < kSlots; ++slot) {
      ra_mbar_init(full_bar(slot), 1 + 32);
      ra_mbar_init(free_bar(slot), kCompute * 4);
    }
    for (int i = 0; i < 2 * kCompute; ++i) {
      ra_mbar_init(q_full_bar(i / 2, i % 2), 1);
      ra_mbar_init(q_free_bar(i / 2, i % 2), 1);
    }
    for (int e = 0; e < kItemSlots; ++e) {
      ra_mbar_init(item_full_bar(e), 1);
      ra_mbar_init(item_free_bar(e), kTiledWsItemReaders);
    }
    ra_mbar_init_fence();
  }
  __syncthreads();
  // Entry n of the item ring, read by every lane of the calling warp, which then releases it.
  const auto take_item = [&](uint32_t n) {
    const int e = static_cast<int>(n % kItemSlots);
    ra_mbar_wait(item_full_bar(e), (n / kItemSlots) & 1u);
    const TiledWsItem entry = ring_items[e];
    __syncwarp();  // every lane has read the entry before its warp releases it
    if (wtid % 32 == 0) ra_mbar_arrive(item_free_bar(e));
    return entry;
  };

  if (wg == kCompute) {
    ra_warpgroup_regs_lower<kTiledWsCopyRegs>();
    const int warp = wtid / 32;
    const int lane = wtid % 32;
    if (warp == kTiledWsDecodeWarp) {
      // Decodes the block's items into the ring, ahead of the warps that take them.
      const int64_t items = static_cast<int64_t>(p.batch) * splits * p.num_heads_kv;
      uint32_t published = 0;  // entries written so far
      // The next entry, once every warp that takes entries has read the one four before it:
      // write(entry) fills it.
      const auto publish = [&](const auto& write) {
        const int e = static_cast<int>(published % kItemSlots);
        if (lane == 0) {
          ra_mbar_wait(item_free_bar(e), ((published / kItemSlots) & 1u) ^ 1u);
          write(ring_items[e]);
          ra_mbar_arrive(item_full_bar(e));  // (release: the entry's stores come first)
        }
        ++published;
      };
      // The next item: grid-stride, or the queue's next once the entry kTiledWsQueueAhead
      // before the one it will fill has been taken by every warp that takes entries.
      const auto next_item = [&](int64_t item) -> int64_t {
        if (p.work_queue == nullptr) return item < 0 ? blockIdx.x : item + gridDim.x;
        int64_t taken = 0;
        if (lane == 0) {
          if (published >= kTiledWsQueueAhead) {
            const uint32_t n = published - kTiledWsQueueAhead;
            ra_mbar_wait(item_free_bar(static_cast<int>(n % kItemSlots)), (n / kItemSlots) & 1u);
          }
          taken = static_cast<int64_t>(atomicAdd(p.work_queue, 1ull));
        }
        return ra_shfl(taken, 0);
      };
      for (int64_t item = next_item(-1); item < items; item = next_item(item)) {
        TiledStagedItem it;
        int64_t split;
        const int seg = tiled_decode_item<ROWS>(p, item, splits, &it, &split);
        const bool rows = it.s.valid && it.tile0 < it.tile1;
        if (!rows && !tiled_item_may_write(split, it)) continue;
        publish([&](TiledWsItem& entry) {
          entry.it = it;
          entry.split = split;
          entry.seg = seg;
          entry.rows = rows;
          entry.end = false;
        });
      }
      publish([](TiledWsItem& entry) { entry.end = true; });
      return;
    }
    if (warp == kTiledWsCopyWarp) {
      // Tile copies of each item's Q tiles and K / V steps (all but a tail step's V).
      uint32_t free_parity = 0;    // bit s: free_bar(s), the phase before the one waited for
      uint32_t q_free_parity = 0;  // bit 2w + b: q_free_bar(w, b), likewise
      uint32_t q_next = 0;         // bit w: warpgroup w's next Q buffer
      for (uint32_t taken = 0;; ++taken) {
        const TiledWsItem entry = take_item(taken);
        if (entry.end) break;
        if (!entry.rows) continue;
        const TiledStagedItem& it = entry.it;
        const int hk = it.hk;
        const int nk = it.s.nk;
        const int steps = (nk + KEYS - 1) / KEYS;
        const int kv_token0 = static_cast<int>(it.s.kv_token0);
        const int kv_batch = static_cast<int>(it.s.kv_batch);
        const int q_token0 = static_cast<int>(it.s.q_token0);
        const int q_batch = static_cast<int>(it.s.q_batch);
        // Q of tile t into the next buffer of the warpgroup that computes it.
        const auto copy_q = [&](int64_t t) {
          const int w = static_cast<int>((t - it.tile0) % kCompute);
          const int b = (q_next >> w) & 1u;
          const int bit = 2 * w + b;
          if (lane == 0) {
            ra_mbar_wait(q_free_bar(w, b), ((q_free_parity >> bit) & 1u) ^ 1u);
            ra_mbar_arrive_expect_tx(q_full_bar(w, b), PANELS * kQPanelBytes);
#pragma unroll
            for (int c = 0; c < PANELS; ++c)
              ra_tma_load(smem.q + (2 * w + b) * kQBytes + c * ROWS * 128, &maps.q,
                          q_full_bar(w, b), 64 * c, hk * group,
                          q_token0 + static_cast<int>(t) * group_tokens, q_batch);
          }
          q_free_parity ^= 1u << bit;
          q_next ^= 1u << w;
        };
        // Step st's K and V into slot st % kSlots, once every computing warp has released the
        // slot (its previous use: an earlier step of this item past kSlots steps, else one of an
        // earlier item). The step where the history ends inside it takes its V by cp.async (live
        // keys, then zeros), each lane arriving once its copies have landed; the copy warp does
        // not wait for them.
        const auto copy_step = [&](int st) {
          const int slot = st % kSlots;
          ra_mbar_wait(free_bar(slot), ((free_parity >> slot) & 1u) ^ 1u);
          free_parity ^= 1u << slot;
          const bool v_tail = st == steps - 1 && nk % KEYS != 0;
          if (lane == 0) {
            ra_mbar_arrive_expect_tx(full_bar(slot), (v_tail ? 1 : 2) * PANELS * kKvPanelBytes);
#pragma unroll
            for (int c = 0; c < PANELS; ++c) {
              ra_tma_load(smem.k + (c * kRing + slot * KEYS) * 128, &maps.k, full_bar(slot),
                          64 * c, hk, kv_token0 + st * KEYS, kv_batch);
              if (!v_tail)
                ra_tma_load(smem.v + (c * kRing + slot * KEYS) * 128, &maps.v, full_bar(slot),
                            64 * c, hk, kv_token0 + st * KEYS, kv_batch);
            }
          }
          if (v_tail) {
            // Each lane keeps one 16-byte column chunk (kVecs divides 32) and walks the rows;
            // the slot's first row is a whole swizzle period, so its offset adds to the row's.
            constexpr int kVecs = D / 8;
            static_assert(32 % kVecs == 0, "a lane's chunk of the row is fixed");
            const int vec = lane % kVecs;
            const int k0 = st * KEYS;
            const uint32_t v_slot = smem.v + slot * KEYS * 128;
            for (int row = lane / kVecs; row < KEYS; row += 32 / kVecs) {
              const bool live = k0 + row < nk;
              ra_cp_async16(v_slot + ra_wgmma_offset(row, 8 * vec, kRing),
                            live ? it.vbase + (k0 + row) * p.v_token_stride + 8 * vec : p.v,
                            live ? 16 : 0);
            }
            ra_mbar_arrive_cp_async(full_bar(slot));
          } else {
            ra_mbar_arrive(full_bar(slot));
          }
        };
        for (int64_t t = it.tile0; t < it.tile1 && t < it.tile0 + kCompute; ++t) copy_q(t);
        for (int st = 0; st < steps; ++st) copy_step(st);
        for (int64_t t = it.tile0 + kCompute; t < it.tile1; ++t) copy_q(t);
      }
      // No lane leaves with cp.async copies in flight.
      ra_cp_async_commit();
      ra_cp_async_wait<0>();
    }
    return;
  }

  // The computing warpgroups.
  ra_warpgroup_regs_raise<kTiledWsComputeRegs>();
  uint32_t full_parity = 0;  // bit s: full_bar(s)'s next phase (flipped by each wait)
  uint32_t q_parity = 0;     // bit b: q_full_bar(wg, b)'s next phase
  int64_t tiles_done = 0;    // this warpgroup's tiles so far (tile n in buffer n % 2)
  for (uint32_t taken = 0;; ++taken) {
    const TiledWsItem entry = take_item(taken);
    if (entry.end) break;
    const TiledStagedItem& it = entry.it;
    if (!tiled_item_writes<T, D, ROWS, kCompute * 128>(p, group, entry.seg, entry.split, tid,
                                                          &it))
      continue;
    const TiledSegment& s = it.s;
    const int hk = it.hk;
    const int64_t seg_rows = it.seg_rows;
    const int64_t tile1 = it.tile1;
    const int nk = s.nk;
    const int steps = (nk + KEYS - 1) / KEYS;
    // Step st sits in slot st % kSlots. A warpgroup waits for each step of an item once (its
    // first tile, or below where it has none), so each wait flips the slot's parity.
    const auto release = [&](int st) {
      if (wtid % 32 == 0) ra_mbar_arrive(free_bar(st % kSlots));
    };
    const auto wait_step = [&](int st) {
      const int slot = st % kSlots;
      ra_mbar_wait(full_bar(slot), (full_parity >> slot) & 1u);
      full_parity ^= 1u << slot;
    };
    bool first = true;
    for (int64_t tile = it.tile0 + wg; tile < tile1; tile += kCompute) {
      const bool last = tile + kCompute >= tile1;
      const int b = static_cast<int>(tiles_done & 1);
      const uint32_t off = b * kQBytes;
      // The previous tile's buffer goes back to the copy warp once its out store has read it.
      if (tiles_done > 0 && wtid == 0) {
        ra_tma_store_wait_read();
        ra_mbar_arrive(q_free_bar(wg, b ^ 1));
      }
      ra_mbar_wait(q_full_bar(wg, b), (q_parity >> b) & 1u);
      q_parity ^= 1u << b;
      // The first tile waits for each step; the last releases each step as soon as its score
      // and P . V products have been waited for (step_done), so that the copy warp refills the
      // last two steps' slots under the last P . V and the epilogue rather than after them.
      const auto before_step = [&](int k0) {
        const int st = k0 / KEYS;
        if (first) {
          wait_step(st);
          // The copy warp's cp.async wrote a tail step's V (the generic proxy): this thread's
          // products read it only after a proxy fence (it covers the item's later tiles too).
          if (st == steps - 1 && nk % KEYS != 0) ra_fence_proxy_async();
        }
      };
      const auto store_out = [&](const TiledRowMap& map) {
        tiled_tma_store_tile<D>(p, maps, s, hk, group, map, tile, seg_rows,
                                static_cast<int>(s.q_token0) + static_cast<int>(tile) * group_tokens,
                                static_cast<int>(s.q_batch), smem.q + off, smem.q_ptr + off, wg,
                                wtid);
      };
      tiled_warpgroup_tile<T, D, KEYS, kRing, false, ROW_MAX>(
          p, s, hk, group, tile * ROWS, seg_rows, smem.q_ptr + off, smem.q + off, smem.k, smem.v,
          kRing, wg, wtid, 0, nk, before_step, store_out, TiledOverlappedSteps{},
          [&](int k0) {
            if (last) release(k0 / KEYS);
          });
      first = false;
      ++tiles_done;
      // This thread's reads and writes of the buffer come before the tile copy that refills it.
      ra_fence_proxy_async();
      ra_warpgroup_sync(wg);
    }
    // With no tile here, every step, each once it has landed (a last tile released its steps).
    if (first) {
      for (int st = 0; st < steps; ++st) {
        wait_step(st);
        release(st);
      }
    }
  }
  if (wtid == 0) ra_tma_store_wait();
#endif
}

}  // namespace small_seq

#endif  // RA_TMA_BUILD
