// The kernel plan of a small-seq call as the launchers receive it. The plan is made in Python
// (rocm_attn/small_seq_plan.py: which kernel, its template parameters, its grid factor, from the
// call's host bounds, the device's capabilities and the tuning) and passed to the op as ints;
// the launchers (launch_impl.h for the one-query kernels, tiled_launch.hip,
// tiled_bwd_launch.hip) switch on it, check it against what this build compiled, and choose
// nothing themselves. The ids here and the plan's KERNEL_IDS are the same
// numbers (the generated plan unit static_asserts them).
//
// Plain host data: the bindings, compiled without the GPU compiler, include it.
#pragma once

#include <stdint.h>

enum class SmallSeqKernel : int32_t {
  kFwd = 40,                  // small_seq_fwd_kernel<T, D, KV, PIPE> (one query per segment)
  kFwdMma = 41,               // small_seq_fwd_mma_kernel<T, D, KV>
  kBwd = 42,                  // small_seq_bwd_kernel<T, D, KV, PIPE>
  kBwdMma = 43,               // small_seq_bwd_mma_kernel<T, D, KV>
  kBwdMmaWide = 44,           // small_seq_bwd_mma_wide_kernel<T, D, KV>
  kTiledFwdWave = 1,          // small_seq_tiled_fwd_kernel<T, D, ONE_TILE, ROW_MAX>
  kTiledFwdBlock = 2,         // small_seq_tiled_fwd_block_kernel<T, D, THREADS, CP_ASYNC, ROW_MAX>
  kTiledFwdResident = 3,      // small_seq_tiled_fwd_resident_kernel<T, D, KSTEP, ROW_MAX>
  kTiledFwdWarpgroup = 4,     // small_seq_tiled_fwd_warpgroup_kernel<T, D>
  kTiledFwdWarpgroupTma = 5,  // small_seq_tiled_fwd_warpgroup_tma_kernel<T, D, KEYS, CAPPED,
                              // STREAM, ROW_MAX>
  kTiledFwdWarpgroupWs = 6,   // small_seq_tiled_fwd_warpgroup_ws_kernel<T, D, ROW_MAX> (QUEUE)
  kTiledBwdDelta = 10,        // small_seq_tiled_bwd_delta_kernel<T, D>
  kTiledBwdDkv = 11,          // small_seq_tiled_bwd_dkv_kernel<T, D, ONE_ROW_TILE, FUSED_DELTA>
  kTiledBwdDkvBlock = 13,     // small_seq_tiled_bwd_dkv_block_kernel<T, D>
  kTiledBwdDqBlock = 14,      // small_seq_tiled_bwd_dq_block_kernel<T, D>
  kTiledBwdStream = 15,       // small_seq_tiled_bwd_stream_kernel<T, D, ROWS>
  kTiledBwdWarpgroupTma = 17,       // small_seq_tiled_bwd_warpgroup_tma_kernel<T, D, KEYS, ...>
  kTiledBwdWarpgroupDqTma = 19,     // small_seq_tiled_bwd_warpgroup_dq_tma_kernel<T, D>
  kTiledBwdWarpgroupTwoTile = 20,   // small_seq_tiled_bwd_warpgroup_two_tile_kernel<T, D>
  kTiledBwdWarpgroupDqStream = 21,  // small_seq_tiled_bwd_warpgroup_dq_stream_kernel<T, D>
};

// One launch: the kernel's id and its parameters in the plan's LAUNCH_PARAMS order.
constexpr int kSmallSeqLaunchInts = 8;
struct SmallSeqLaunch {
  int32_t kernel;
  int32_t p[kSmallSeqLaunchInts - 1];
};

// The launches of a call, then those the launcher runs instead where a tile-copy kernel's
// tensor maps cannot be made (an address or stride not a multiple of 16 bytes).
constexpr int kSmallSeqPlanMaxLaunches = 4;
struct SmallSeqPlan {
  int launches = 0;
  int fallbacks = 0;
  SmallSeqLaunch launch[2 * kSmallSeqPlanMaxLaunches] = {};
};

// Reads the op's `plan` ints ([launches, fallbacks, records...]); false where they are not a
// plan (wrong length or counts).
inline bool small_seq_plan_decode(const int64_t* ints, int64_t n, SmallSeqPlan* plan) {
  if (n < 2) return false;
  const int64_t launches = ints[0], fallbacks = ints[1];
  if (launches < 1 || launches > kSmallSeqPlanMaxLaunches || fallbacks < 0 ||
      fallbacks > kSmallSeqPlanMaxLaunches || n != 2 + (launches + fallbacks) * kSmallSeqLaunchInts)
    return false;
  plan->launches = static_cast<int>(launches);
  plan->fallbacks = static_cast<int>(fallbacks);
  for (int64_t i = 0; i < launches + fallbacks; ++i) {
    const int64_t* r = ints + 2 + i * kSmallSeqLaunchInts;
    for (int j = 0; j < kSmallSeqLaunchInts; ++j)
      if (r[j] < INT32_MIN || r[j] > INT32_MAX) return false;
    plan->launch[i].kernel = static_cast<int32_t>(r[0]);
    for (int j = 1; j < kSmallSeqLaunchInts; ++j)
      plan->launch[i].p[j - 1] = static_cast<int32_t>(r[j]);
  }
  return true;
}

// Whether a plan's warp-specialized forward takes its items from a work queue (its record's
// QUEUE, the parameter after D and the grid factor), whose counter
// (SmallSeqTiledParams::work_queue, zeroed per call) the binding then allocates.
inline bool small_seq_plan_work_queue(const SmallSeqPlan& plan) {
  for (int i = 0; i < plan.launches + plan.fallbacks; ++i)
    if (plan.launch[i].kernel == static_cast<int32_t>(SmallSeqKernel::kTiledFwdWarpgroupWs) &&
        plan.launch[i].p[2] != 0)
      return true;
  return false;
}
