// Host helpers of the tiled launchers (tiled_launch.hip, tiled_bwd_launch.hip) for kernels with
// dynamic shared memory: the residency of a kernel at a shared-memory size, the grid capped at
// a multiple of it, and the opt-in to more than 48 KiB.
#pragma once

#include "../common/compat.h"
#include "../common/device_info.h"

namespace small_seq {

// Blocks of one kernel resident per multiprocessor, cached per device for the shared-memory
// size last asked (one cache per kernel; serving repeats one shape).
struct TiledOccupancyCache {
  int64_t smem[64] = {};
  int blocks[64] = {};
};

template <typename Kernel>
int tiled_blocks_per_mp(Kernel kernel, int threads, int64_t smem, TiledOccupancyCache& cache) {
  const int device = ra_device_index();
  const bool cached = device >= 0 && device < 64;
  if (cached && cache.blocks[device] > 0 && cache.smem[device] == smem)
    return cache.blocks[device];
  int n = 0;
  if (hipOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, threads,
                                                   static_cast<size_t>(smem)) != hipSuccess ||
      n <= 0) {
    (void)hipGetLastError();  // not left for the launch check to report
    n = 1;
  }
  if (cached) {
    cache.smem[device] = smem;
    cache.blocks[device] = n;
  }
  return n;
}

// `blocks` blocks of work capped at factor x the `resident` blocks resident at once (factor
// 0: no cap), at least one.
inline dim3 tiled_capped_grid(int64_t blocks, int64_t resident, int factor) {
  if (factor > 0 && blocks > resident * factor) blocks = resident * factor;
  return dim3(static_cast<unsigned>(blocks > 0 ? blocks : 1));
}

// Static shared memory of the tiled kernels is at most this (the tile-copy kernels' barriers
// and hand-over arrays; the others have none).
constexpr int64_t kTiledMaxStaticShared = 4096;

// Above 48 KiB of shared memory (static and dynamic together) a kernel's dynamic part must be
// allowed first (NVIDIA): once per device and kernel, to the device's limit less its static part.
template <auto KERNEL>
hipError_t tiled_allow_shared(int64_t smem) {
  static int raised[64] = {};
  const int device = ra_device_index();
  const bool cached = device >= 0 && device < 64;
  if (smem + kTiledMaxStaticShared <= 48 * 1024 || (cached && raised[device])) return hipSuccess;
  hipFuncAttributes attr;
  hipError_t err = hipFuncGetAttributes(&attr, reinterpret_cast<const void*>(KERNEL));
  if (err != hipSuccess) return err;
  err = hipFuncSetAttribute(reinterpret_cast<const void*>(KERNEL),
                            hipFuncAttributeMaxDynamicSharedMemorySize,
                            ra_device_max_shared_per_block() -
                                static_cast<int>(attr.sharedSizeBytes));
  if (err == hipSuccess && cached) raised[device] = 1;
  return err;
}

// Launch sizes the launchers apply (rocm_attn/small_seq_plan.py, which chooses the kernels,
// reads kTiledSharedReserve and kTiledBwdRowTileThreads too: the plan's generated
// static_asserts check they agree).

// The staged kernels' (resident, warpgroup) grid gives each resident block about this many
// work items, splitting the row tiles of a (segment, kv head) over several items when there
// are few segments.
constexpr int kTiledResidentItemsPerBlock = 4;
// Shared memory a block holds beyond its own (the runtime's reserve on NVIDIA), for the count
// of blocks that fit a multiprocessor.
constexpr int64_t kTiledSharedReserve = 1024;

// Blocks of the one-row-tile instance: four waves (the general instance takes
// kTiledBwdWavesPerBlock). Measured forward+backward on 16 candidates with 8 kv heads (H100):
// the instance in these blocks 1-5% faster than the general instance; a 168-register cap (three
// blocks, 56 bytes spilled) 1-22% slower, 200 registers over blocks of one or two warps (10
// warps per multiprocessor, 8 bytes spilled) 10-17% slower (docs/kernels.md#one-row-tile-backward).
constexpr int kTiledBwdRowTileThreads = 128;

// Work items (segment, kv head) one per wave where there are at least
// kTiledBwdStreamWaveItems x the waves resident at once (short histories are then latency
// chains, and more of them run at once with no barrier), else one per block, its waves splitting
// the keys (few long histories keep the device busy). Tuning small_seq_tiled_bwd_stream 2 / 3
// forces one item per wave / per block.
constexpr int kTiledBwdStreamWaveItems = 2;

}  // namespace small_seq
