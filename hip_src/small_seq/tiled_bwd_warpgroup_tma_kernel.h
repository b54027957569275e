// Tiled small-seq backward, warpgroup dK / dV kernel with its row tiles moved by tensor tile
// copies (Hopper, CUDA sm_90a builds): tiled_bwd_warpgroup_kernel.h's items and products, with
// each whole 64-row tile's Q and dO copied in, and its dQ (where the kernel computes it) copied
// out, by one thread (common/tma.h), instead of per-thread cp.async and 16-byte stores
// (docs/kernels.md#warpgroup-backward, "Tile copies"). There is no instance without tile
// copies: where they cannot serve (no tile-copy build, tuning small_seq_tiled_warpgroup_tma 0,
// a GQA group that does not divide a 64-row tile, an address or stride not a multiple of 16
// bytes) the plan and its fallback take the wave / block kernels (tiled_bwd_kernel.h).
//
// Why: as in the forward (tiled_fwd_warpgroup_tma_kernel.h), each tile's GQA-mapped Q and dO
// rows cost every thread address arithmetic and copies per 16 bytes, a large part of the
// instruction stream of a kernel bound by its issue rate.
//
// Only whole tiles take tile copies: the products sum over all 64 rows of a tile (dV += P^T dO,
// dK += dS^T Q), so rows past the segment must be zeros, which a copy of the next segment's rows
// is not. A tile that the segment's end cuts is copied by cp.async as before (zeros past the
// end), and its dQ leaves by the 16-byte stores (a tile store would write the next segment's
// rows). K / V stay cp.async too: once per item, and a history's last block must read zeros
// past its end.
//
// The dQ kernel (small_seq_tiled_bwd_warpgroup_dq_tma_kernel, histories past one key block)
// copies every tile whole, cut ones too: a row's dQ depends on that row's Q and dO only, and
// rows past the segment are not stored. Its two warpgroups share three Q / dO buffers in turn
// (tile t in buffer t % 3): the warpgroup done with tile t copies tile t + 3 into that buffer,
// for the other warpgroup, so each tile's copies run under the two tiles before it.
//
// Synchronization in the dK / dV kernel: each Q / dO buffer has an mbarrier that a whole tile's
// copies complete on (every thread tracks its phase parity); before thread 0 copies into a
// buffer, or the block writes it with cp.async, the tile store that last read it must have
// finished reading (cp.async.bulk.wait_group.read, by thread 0, which issued it). The dQ
// kernel's buffers change hands between warpgroups and take a second barrier each (at the
// kernel).
#pragma once

#include "../common/tma.h"
#include "tiled_bwd_warpgroup_kernel.h"
#include "tiled_fwd_warpgroup_tma_kernel.h"  // tiled_tma_q_map

#if RA_TMA_BUILD

namespace small_seq {

// Tensor maps of one call: q, dout and dq with the warpgroup kernels' Q box (tiled_tma_q_map).
struct TiledBwdTmaMaps {
  CUtensorMap q, dout, dq;
};

#if RA_HAS_WGMMA

// How the dK / dV kernel moves a tile's Q / dO in and its dQ out (a block of one warpgroup,
// every thread calls each member): whole tiles by tile copies, a tile the segment's end cuts by
// per-thread cp.async copies (committed by the caller as one cp.async group) and 16-byte
// stores. load(...) issues tile `tile`'s copies into the buffer at `dst`, wait(...) returns
// once they may be read (beside the caller's cp.async wait, fence and barrier), store_dq(...)
// writes the tile's dQ rows from its Q buffer once every thread has written them there.
struct TiledBwdTmaCopies {
  const TiledBwdTmaMaps* maps;
  uint32_t bar0;        // buffer b's barrier at bar0 + 8 b
  uint32_t parity = 0;  // bit b: parity of buffer b's next phase

  RA_DEVICE static bool whole(const int64_t r0, const int64_t seg_rows) {
    return r0 + kTiledWarpgroupRows <= seg_rows;
  }
  RA_DEVICE static int first_token(const TiledSegment& s, const int group, const int64_t r0) {
    return static_cast<int>(s.q_token0 + r0 / group);
  }

  template <int D>
  RA_DEVICE void load(const SmallSeqTiledParams& p, const TiledBwdWarpgroupRows& at,
                      const TiledSegment& s, const int hq0, const int group, const int64_t r0,
                      const int64_t seg_rows, const uint32_t dst, const int buf,
                      const int tid) {
    constexpr uint32_t kTileBytes = kTiledWarpgroupRows * D * 2;
    if (whole(r0, seg_rows)) {
      if (tid == 0) {
        const uint32_t bar = bar0 + 8 * buf;
        const int token = first_token(s, group, r0);
        const int batch = static_cast<int>(s.q_batch);
        ra_tma_store_wait_read();
        ra_mbar_arrive_expect_tx(bar, 2 * kTileBytes);
#pragma unroll
        for (int c = 0; c < D / 64; ++c) {
          ra_tma_load(dst + c * kTiledWarpgroupRows * 128, &maps->q, bar, 64 * c, hq0, token,
                      batch);
          ra_tma_load(dst + kTileBytes + c * kTiledWarpgroupRows * 128, &maps->dout, bar,
                      64 * c, hq0, token, batch);
        }
      }
    } else {
      if (tid == 0) ra_tma_store_wait_read();
      __syncthreads();  // no tile store still reads the buffer the copies below write
      tiled_bwd_warpgroup_load_tile<D>(p, at, group, r0, seg_rows, dst, tid);
    }
  }

  RA_DEVICE void wait(const int64_t r0, const int64_t seg_rows, const int buf) {
    if (!whole(r0, seg_rows)) return;
    ra_mbar_wait(bar0 + 8 * buf, (parity >> buf) & 1u);
    parity ^= 1u << buf;
  }

  template <int D>
  RA_DEVICE void store_dq(const SmallSeqTiledParams& p, const TiledBwdWarpgroupRows& at,
                          const TiledSegment& s, const int hq0, const int group,
                          const TiledRowMap& map, const int64_t r0, const int64_t seg_rows,
                          const uint8_t* sq_ptr, const uint32_t sq, const int tid) {
    if (whole(r0, seg_rows)) {
      ra_fence_proxy_async();  // this thread's dQ in the buffer, for the tile store
      __syncthreads();
      if (tid == 0) {
        const int token = first_token(s, group, r0);
#pragma unroll
        for (int c = 0; c < D / 64; ++c)
          ra_tma_store(&maps->dq, sq + c * kTiledWarpgroupRows * 128, 64 * c, hq0, token,
                       static_cast<int>(s.q_batch));
        ra_tma_store_commit();
      }
    } else {
      __syncthreads();
      tiled_warpgroup_store_rows<D>(at.dq, p.dq_token_stride, p.dq_head_stride, map, r0,
                                    seg_rows, sq_ptr, tid);
    }
  }
};

#endif  // RA_HAS_WGMMA

// dK / dV kernel (tiled_bwd_warpgroup_items), whole tiles moved by tile copies.
template <typename T, int D, int KEYS, bool WITH_DQ, bool FUSED_DELTA, bool TRANSPOSED = false>
__global__ void RA_LAUNCH_BOUNDS_MIN_BLOCKS(128, 2)
    small_seq_tiled_bwd_warpgroup_tma_kernel(const SmallSeqTiledParams p,
                                             const __grid_constant__ TiledBwdTmaMaps maps) {
#if RA_HAS_WGMMA
  // The two barriers take no static shared memory: two 64-key blocks fill a multiprocessor's
  // shared memory exactly (2 x (115712 + 1024 reserved) = 228 KiB at d = 128), so 16 static bytes
  // would leave one block per multiprocessor. They sit in the dynamic part's alignment slack,
  // past the buffers: of its 1024 bytes at most 1008 go to aligning the start.
  RA_DYNAMIC_SHARED(ra_vec8, tiled_bwd_warpgroup_smem);
  const uint32_t raw = ra_smem_address(tiled_bwd_warpgroup_smem);
  const uint32_t bar0 = raw + ra_smem_pad_1024(raw) +
                        static_cast<uint32_t>(tiled_bwd_warpgroup_smem_bytes<D>(KEYS) - 1024);
  if (threadIdx.x == 0) {
    ra_mbar_init(bar0, 1);
    ra_mbar_init(bar0 + 8, 1);
    ra_mbar_init_fence();
  }
  __syncthreads();
  TiledBwdTmaCopies copies{&maps, bar0};
  tiled_bwd_warpgroup_items<T, D, KEYS, WITH_DQ, FUSED_DELTA, TRANSPOSED>(p, copies);
  if (threadIdx.x == 0) ra_tma_store_wait();
#endif
}

// Q / dO buffers of the tile-copy dQ kernel, shared by its warpgroups in turn.
constexpr int kTiledBwdDqTmaBuffers = 3;

// Dynamic shared memory of a tile-copy dQ block: K and V of max_seqlen_kv keys (whole key
// blocks), kTiledBwdDqTmaBuffers buffers of a tile's Q and dO, alignment, and 64 bytes for the
// buffers' two barriers each (past the buffers, whatever the alignment took).
template <int D>
RA_HOST_DEVICE constexpr int64_t tiled_bwd_warpgroup_dq_tma_smem_bytes(int max_seqlen_kv) {
  return 2 * static_cast<int64_t>(tiled_bwd_warpgroup_blocks(max_seqlen_kv)) *
             kTiledBwdWarpgroupBlockKeys * D * 2 +
         static_cast<int64_t>(kTiledBwdDqTmaBuffers) * 2 * kTiledWarpgroupRows * D * 2 + 1024 +
         64;
}

// The staged dQ kernel (launched where max_seqlen_kv exceeds one key block, up to
// kTiledBwdWarpgroupStagedMaxKeys): grid-stride over (segment, kv head) items of valid
// segments, K / V staged once by cp.async, each tile's dQ by tiled_bwd_warpgroup_dq_tile, its
// other loads one tile ahead, the tiles' Q and dO copied whole by one thread into
// kTiledBwdDqTmaBuffers buffers that the warpgroups take in turn.
//
// Each buffer has two barriers: `full` completes when a tile's copies have landed, `released`
// when the warpgroup that computed the buffer's previous tile is done with it. A phase-parity
// wait cannot tell the phase it waits for from the one two phases earlier, so a waiter must
// know the barrier is at most one phase behind it. The warpgroup that waits for tile t's copies
// (t >= 3) did not wait for tile t - 3's (the other warpgroup did), which may still be in flight:
// it first waits for tile t - 3's release, which comes after those copies landed and before
// tile t's are issued; the release before that (tile t - 6's) was its own. Every thread derives
// both parities from the tile's index and the tiles the buffer took in earlier items
// (`base_parity`: one copy and one release each). tools/diag/dq_buffer_protocol.py model-checks
// this protocol. Launched ahead of the dK / dV kernel without pass 1, it computes each row's
// Delta, writes it to the workspace for the dK / dV kernel, and zeroes the dq of q padding
// rows (pass 1's other part).
template <typename T, int D>
__global__ void RA_LAUNCH_BOUNDS_MIN_BLOCKS(kTiledBwdWarpgroupDqWarpgroups * 128, 1)
    small_seq_tiled_bwd_warpgroup_dq_tma_kernel(const SmallSeqTiledParams p,
                                                const __grid_constant__ TiledBwdTmaMaps maps) {
#if RA_HAS_WGMMA
  constexpr int WARPGROUPS = kTiledBwdWarpgroupDqWarpgroups;
  constexpr int THREADS = WARPGROUPS * 128;
  constexpr int ROWS = kTiledWarpgroupRows;
  constexpr int BUFS = kTiledBwdDqTmaBuffers;
  constexpr uint32_t kTileBytes = ROWS * D * 2;
  constexpr uint32_t kBufBytes = 2 * kTileBytes;  // Q, then dO
  const int tid = threadIdx.x;
  const int wg = tid / 128;
  const int wtid = tid % 128;
  const int group = p.num_heads_q / p.num_heads_kv;
  const int group_tokens = ROWS / group;
  const int kp = tiled_bwd_warpgroup_blocks(p.max_seqlen_kv) * kTiledBwdWarpgroupBlockKeys;
  RA_DYNAMIC_SHARED(ra_vec8, tiled_bwd_warpgroup_dq_smem);
  const uint32_t raw = ra_smem_address(tiled_bwd_warpgroup_dq_smem);
  const uint32_t pad = ra_smem_pad_1024(raw);
  const uint32_t sk = raw + pad;
  const uint32_t sv = sk + kp * D * 2;
  const uint32_t buf_off = pad + 2 * kp * D * 2;  // buffer b at buf_off + b * kBufBytes
  uint8_t* const smem_ptr = reinterpret_cast<uint8_t*>(tiled_bwd_warpgroup_dq_smem);
  // buffer b's barriers: full at bar0 + 8 b, released at bar0 + 8 (BUFS + b)
  const uint32_t bar0 = raw + buf_off + BUFS * kBufBytes;
  const auto full = [&](int b) { return bar0 + 8 * b; };
  const auto released = [&](int b) { return bar0 + 8 * (BUFS + b); };
  if (tid == 0) {
    for (int b = 0; b < 2 * BUFS; ++b) ra_mbar_init(bar0 + 8 * b, 1);
    ra_mbar_init_fence();
  }
  __syncthreads();
  uint32_t base_parity = 0;  // bit b: parity of buffer b's first copy (and release) this item
  const int64_t items = static_cast<int64_t>(p.batch) * p.num_heads_kv;
  for (int64_t item = blockIdx.x; item < items; item += gridDim.x) {
    const int seg = static_cast<int>(item / p.num_heads_kv);
    const int hk = static_cast<int>(item - static_cast<int64_t>(seg) * p.num_heads_kv);
    const TiledSegment s = tiled_resolve_segment(p, seg, tiled_fetch_bounds(p, seg));
    if (!s.valid) continue;  // the dK / dV kernel writes its dq (NaN)
    const int64_t seg_rows = static_cast<int64_t>(s.nq) * group;
    const int64_t tiles = (seg_rows + ROWS - 1) / ROWS;
    const int hq0 = hk * group;
    const TiledBwdRows rows = tiled_bwd_rows(p, hk, s);
    const TiledBwdWarpgroupRows at = tiled_bwd_warpgroup_rows(p, s, rows, hq0);
    const auto copy_tile = [&](int64_t t) {  // one thread
      const int b = static_cast<int>(t % BUFS);
      const uint32_t dst = raw + buf_off + b * kBufBytes;
      const uint32_t bar = full(b);
      const int token = static_cast<int>(s.q_token0 + t * group_tokens);
      const int batch = static_cast<int>(s.q_batch);
      ra_mbar_arrive_expect_tx(bar, kBufBytes);
#pragma unroll
      for (int c = 0; c < D / 64; ++c) {
        ra_tma_load(dst + c * ROWS * 128, &maps.q, bar, 64 * c, hq0, token, batch);
        ra_tma_load(dst + kTileBytes + c * ROWS * 128, &maps.dout, bar, 64 * c, hq0, token,
                    batch);
      }
    };
    // this warpgroup's tile t's row scalars and O prefetch (TiledBwdDqRowLoads), one tile ahead
    const auto load_rows = [&](int64_t t, TiledBwdDqRowLoads& l) {
      if (t < tiles)
        tiled_bwd_warpgroup_dq_load_rows<D>(p, s, hq0, at, TiledRowMap(t * ROWS, group),
                                                   t * ROWS, seg_rows, l, wtid);
    };
    // K / V by cp.async (zeros past the history), the first tiles by tile copies beside them.
    tiled_warpgroup_stage<D, kTiledBwdWarpgroupBlockKeys, THREADS>(sk, sv, p, rows.k, rows.v,
                                                                   s.nk, kp, tid);
    if (tid == 0)
      for (int64_t t = 0; t < tiles && t < BUFS; ++t) copy_tile(t);
    TiledBwdDqRowLoads l;
    load_rows(wg, l);
    ra_cp_async_commit();
    ra_cp_async_wait<0>();
    ra_fence_proxy_async();
    __syncthreads();
    for (int64_t t = wg; t < tiles; t += WARPGROUPS) {
      const int b = static_cast<int>(t % BUFS);
      const uint32_t n = (base_parity >> b) ^ static_cast<uint32_t>(t / BUFS);  // this copy
      if (t >= BUFS) ra_mbar_wait(released(b), (n ^ 1u) & 1u);  // tile t - BUFS's release
      ra_mbar_wait(full(b), n & 1u);
      TiledBwdDqRowLoads next;
      load_rows(t + WARPGROUPS, next);
      tiled_bwd_warpgroup_dq_tile<T, D>(p, s, at, hq0, group, t * ROWS, seg_rows,
                                                     l, sk, sv, kp,
                                                     smem_ptr + buf_off + b * kBufBytes,
                                                     raw + buf_off + b * kBufBytes, wg, wtid);
      l = next;
      // This thread's reads and writes of the buffer come before the tile copy that refills it.
      ra_fence_proxy_async();
      ra_warpgroup_sync(wg);
      if (wtid == 0) {
        ra_mbar_arrive(released(b));
        if (t + BUFS < tiles) copy_tile(t + BUFS);
      }
    }
    // Buffer b took a copy and a release for each tile t < tiles with t % BUFS == b.
#pragma unroll
    for (int b = 0; b < BUFS; ++b)
      if (tiles > b) base_parity ^= static_cast<uint32_t>(((tiles - 1 - b) / BUFS + 1) & 1) << b;
    __syncthreads();  // every warpgroup is done with this segment's K / V and the buffers
  }
  tiled_bwd_zero_padding_dq<D>(p, static_cast<int64_t>(blockIdx.x) * blockDim.x + tid,
                               static_cast<int64_t>(gridDim.x) * blockDim.x);
#endif
}

}  // namespace small_seq

#endif  // RA_TMA_BUILD
