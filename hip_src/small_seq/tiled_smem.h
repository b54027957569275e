// Shared memory of the tiled small-seq kernels (forward block and resident kernels, backward
// block kernels): row strides of 16-bit values padded so that the fragment loads of
// common/mma.h meet few bank conflicts, and the block-wide staging of one K / V tile.
#pragma once

#include "../common/compat.h"

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

// One tile of K rows and one of V rows staged in shared memory by the whole block, two buffers
// of each; V rows at stride SV (the forward reads them as P.V operands, kV; the backward's dQ
// pass as score operands, kK).
template <int D, int SV = TiledSmemStride<D>::kV>
struct TiledStage {
  static constexpr int kKElems = kTiledStageRows * TiledSmemStride<D>::kK;
  static constexpr int kVElems = kTiledStageRows * SV;
  alignas(16) uint16_t k[2][kKElems];
  alignas(16) uint16_t v[2][kVElems];
};

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

template <int D, int SV, int THREADS>
RA_DEVICE void tiled_stage_store(TiledStage<D, SV>& st, const int buf,
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

}  // namespace small_seq
