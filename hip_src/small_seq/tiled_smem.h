// Shared-memory row strides of the tiled small-seq kernels (forward block and resident kernels,
// backward block kernel): rows of 16-bit values padded so that the fragment loads of
// common/mma.h meet few bank conflicts.
#pragma once

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

}  // namespace small_seq
