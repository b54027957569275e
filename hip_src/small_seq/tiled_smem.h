// Shared memory of the tiled small-seq kernels (forward block and resident kernels, backward
// block kernels): row strides of 16-bit values padded so that the fragment loads of
// common/mma.h meet few bank conflicts, and the block-wide staging of one K / V tile.
#pragma once

#include "../common/compat.h"
#include "../common/cp_async.h"

namespace small_seq {

// Row strides (elements) of K and V in shared memory, padded so that the 16-byte fragment loads
// of one NVIDIA quarter warp (8 lanes, 128 bytes) fall into distinct banks:
// - K (ra_mma_load_rows): the quarter reads 64 bytes of each of rows g, g + 1, so consecutive
//   rows must start 64 bytes apart modulo 128: D + 32 elements (D * 2 is a multiple of 128).
// - V (ra_mma_load_vrows): it reads 32 bytes of each of rows 0, 2, 4, 6 (+ an offset), so rows
//   two apart must start 32 bytes apart modulo 128: D + 8 elements (16 bytes modulo 64).
template <int D>
struct TiledSmemStride {
  static constexpr int kK = D + 32;
  static constexpr int kV = D + 8;
};

// Rows of one tile staged by a whole block: a key tile of the forward's block kernel and of the
// backward's dQ block kernel (kTiledKeys, kTiledBwdKeys).
constexpr int kTiledStageRows = 16;

// One tile of K rows and one of V rows staged in shared memory by the whole block, BUFS
// buffers of each (two for the register staging's double buffering, a ring of
// kTiledAsyncStages for the cp.async staging); V rows at stride SV (the forward reads them as
// P.V operands, kV; the backward's dQ pass as score operands, kK).
template <int D, int SV = TiledSmemStride<D>::kV, int BUFS = 2>
struct TiledStage {
  static constexpr int kKElems = kTiledStageRows * TiledSmemStride<D>::kK;
  static constexpr int kVElems = kTiledStageRows * SV;
  alignas(16) uint16_t k[BUFS][kKElems];
  alignas(16) uint16_t v[BUFS][kVElems];
};

// Buffers of the cp.async staging's ring (the forward's block kernel): while the block
// computes one key tile, the copies of the next kTiledAsyncStages - 1 are in flight, three
// 8 KiB tiles per block at d = 128 and no register cost. Registers, not this shared memory,
// bound the blocks a multiprocessor holds (at d = 128 four 64-thread blocks of 38 KiB each);
// more than five such blocks would need a ring of three.
constexpr int kTiledAsyncStages = 4;

// This thread's share of one tile's K and V (16 rows x D / 8 vectors each, spread over the
// block's THREADS threads), loaded from global memory into registers; rows past the segment's
// keys are zeros (never read).
template <int D, int THREADS>
struct TiledStageRegs {
  static constexpr int kVecs = kTiledStageRows * D / 8;
  static constexpr int kPerThread = (kVecs + THREADS - 1) / THREADS;
  ra_vec8 k[kPerThread];
  ra_vec8 v[kPerThread];
};

// Keys k0 .. k0 + 15 (those below nk) of rows kbase / vbase + key * stride into registers.
template <int D, int THREADS>
RA_DEVICE void tiled_stage_load(TiledStageRegs<D, THREADS>& r, const uint16_t* kbase,
                                int64_t k_stride, const uint16_t* vbase, int64_t v_stride,
                                const int k0, const int nk, const int tid) {
#pragma unroll
  for (int i = 0; i < TiledStageRegs<D, THREADS>::kPerThread; ++i) {
    const int idx = tid + i * THREADS;
    const int row = idx / (D / 8);
    const int vec = idx % (D / 8);
    const bool ok = idx < TiledStageRegs<D, THREADS>::kVecs && k0 + row < nk;
    r.k[i] = ok ? ra_load16(kbase + (k0 + row) * k_stride + 8 * vec) : ra_vec8{{0u, 0u, 0u, 0u}};
    r.v[i] = ok ? ra_load16(vbase + (k0 + row) * v_stride + 8 * vec) : ra_vec8{{0u, 0u, 0u, 0u}};
  }
}

template <int D, int SV, int THREADS, int BUFS>
RA_DEVICE void tiled_stage_store(TiledStage<D, SV, BUFS>& st, const int buf,
                                 const TiledStageRegs<D, THREADS>& r, const int tid) {
#pragma unroll
  for (int i = 0; i < TiledStageRegs<D, THREADS>::kPerThread; ++i) {
    const int idx = tid + i * THREADS;
    if (idx >= TiledStageRegs<D, THREADS>::kVecs) continue;
    const int row = idx / (D / 8);
    const int col = 8 * (idx % (D / 8));
    ra_store16(st.k[buf] + row * TiledSmemStride<D>::kK + col, r.k[i]);
    ra_store16(st.v[buf] + row * SV + col, r.v[i]);
  }
}

#if RA_HAS_CP_ASYNC
// Keys k0 .. k0 + 15 of rows kbase / vbase + key * stride into buffer `buf` of the stage by
// cp.async, spread over the block's THREADS threads as tiled_stage_load spreads them: keys at
// or past nk are zero-filled (a copy of 0 bytes from `any`, a valid address it never reads),
// so the segment's last tile reads nothing past the segment. The caller commits the group.
template <int D, int SV, int THREADS, int BUFS>
RA_DEVICE void tiled_stage_copy_async(TiledStage<D, SV, BUFS>& st, const int buf,
                                      const uint16_t* kbase, int64_t k_stride,
                                      const uint16_t* vbase, int64_t v_stride, const void* any,
                                      const int k0, const int nk, const int tid) {
  constexpr int kVecs = kTiledStageRows * D / 8;
  const uint32_t sk = ra_smem_address(st.k[buf]);
  const uint32_t sv = ra_smem_address(st.v[buf]);
#pragma unroll
  for (int i = 0; i < (kVecs + THREADS - 1) / THREADS; ++i) {
    const int idx = tid + i * THREADS;
    if (kVecs % THREADS != 0 && idx >= kVecs) continue;
    const int row = idx / (D / 8);
    const int col = 8 * (idx % (D / 8));
    const bool live = k0 + row < nk;
    const int bytes = live ? 16 : 0;
    ra_cp_async16(sk + 2u * static_cast<uint32_t>(row * TiledSmemStride<D>::kK + col),
                  live ? kbase + (k0 + row) * k_stride + col : any, bytes);
    ra_cp_async16(sv + 2u * static_cast<uint32_t>(row * SV + col),
                  live ? vbase + (k0 + row) * v_stride + col : any, bytes);
  }
}
#endif  // RA_HAS_CP_ASYNC

}  // namespace small_seq
