// Host helpers the THD merge and grad launchers share (merge.hip, grad.hip): alignment of the
// 16-byte vector paths and the grid of a tile kernel.
#pragma once

#include "row_units.h"

namespace thd {

inline bool ptr_aligned16(const void* p) {
  return p == nullptr || reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

inline unsigned clip_grid(int64_t blocks) {
  return static_cast<unsigned>(blocks < INT32_MAX ? blocks : INT32_MAX);
}

// Waves resident at 1024 threads per multiprocessor: what the launchers' tile sizes spread
// their items over.
inline int64_t resident_waves(int wave) {
  return static_cast<int64_t>(ra_device_multiprocessors()) * (1024 / wave);
}

// Blocks of kMergeThreads for `items` in tiles of 2^tshift items, one wave per tile.
inline dim3 grid_for(int64_t items, int tshift, int wave) {
  const int64_t tiles = ceil_div(items, int64_t{1} << tshift);
  return dim3(clip_grid(ceil_div(tiles, thd::kMergeThreads / wave)));
}

}  // namespace thd
