// Launch of one small-seq kernel variant. Included only by the generated instantiation files
// (tools/generate_kernels.py), one (direction, dtype, head dim, kv bucket) per file.
#pragma once

#include "bwd_kernel.h"
#include "bwd_mma_kernel.h"
#include "dispatch.h"
#include "fwd_kernel.h"
#include "fwd_mma_kernel.h"

#include "../common/tuning.h"

namespace small_seq {

inline dim3 block_for() { return dim3(kWavesPerBlock * ra_device_wave_size()); }

// How many resident waves per multiprocessor the grid-stride loop is sized for, as a multiple
// of what fits at once: the tuning value (common/tuning.h small_seq_fwd_grid / _bwd_grid) or,
// at -1, the compiled default (0: one wave per item, i.e. no grid-stride reuse).
inline int grid_residency_factor(int default_factor, int tuned) {
  return tuned >= 0 ? tuned : default_factor;
}

// Which passes take the matrix-unit GQA kernels (fwd_mma_kernel.h, bwd_mma_kernel.h) and the
// software-pipelined general loops (fwd_kernel.h fwd_pipelined, bwd_kernel.h bwd_pipelined):
// bit masks of the tuning values small_seq_mma / small_seq_pipe.
constexpr int kPassForward = 1;
constexpr int kPassBackward = 2;
inline bool mma_enabled(int pass) { return (ra_tuning().small_seq_mma & pass) != 0; }
inline bool pipe_enabled(int pass) { return (ra_tuning().small_seq_pipe & pass) != 0; }

// Blocks for `items` (segment, kv head) work items: at most `factor` x the blocks that are
// resident at once (from the occupancy API, cached per device in `resident_per_mp`), at least
// one.
// NOTE: the cache belongs to the caller, one per kernel. Every kernel here has the same type
// (void(*)(SmallSeqParams)), so a static inside this template was one cache shared by all of
// them: the first kernel launched set the residency used for every other one.
template <typename Kernel>
dim3 grid_for(const SmallSeqParams& p, Kernel kernel, int default_factor,
              int (&resident_per_mp)[64], int tuned_factor) {
  const int64_t items = static_cast<int64_t>(p.batch) * p.num_heads_kv;
  int64_t blocks = (items + kWavesPerBlock - 1) / kWavesPerBlock;
  const int factor = grid_residency_factor(default_factor, tuned_factor);
  if (factor > 0) {
    const int device = ra_device_index();
    if (device >= 0 && device < 64 && resident_per_mp[device] == 0) {
      int n = 0;
      if (hipOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, block_for().x, 0) != hipSuccess ||
          n <= 0)
        n = 1;
      resident_per_mp[device] = n;
    }
    const int per_mp = device >= 0 && device < 64 ? resident_per_mp[device] : 1;
    const int64_t cap = static_cast<int64_t>(per_mp) * ra_device_multiprocessors() * factor;
    blocks = blocks < cap ? blocks : cap;
  }
  return dim3(static_cast<unsigned>(blocks > 0 ? blocks : 1));
}

// GQA groups (two or more q heads per kv head) take the matrix-unit forward; one q head per kv
// head keeps the general kernel (a 16-row tile for one row would waste 15/16 of the unit, and
// that kernel is already near the byte floor there). On targets without matrix units the MMA
// kernel compiles the general body, so the choice is always safe.
template <typename T, int D, int KV, bool PIPE>
hipError_t launch_fwd_general(const SmallSeqParams& p, hipStream_t stream) {
  static int resident[64] = {};
  const dim3 grid =
      grid_for(p, small_seq_fwd_kernel<T, D, KV, PIPE>, kFwdResidencyFactor, resident,
               ra_tuning().small_seq_fwd_grid);
  hipLaunchKernelGGL((small_seq_fwd_kernel<T, D, KV, PIPE>), grid, block_for(), 0, stream, p);
  return hipGetLastError();
}

// GQA groups (two or more q heads per kv head) take the matrix-unit forward; one q head per kv
// head keeps the general kernel (a 16-row tile for one row would waste 15/16 of the unit, and
// that kernel is already near the byte floor there), in its software-pipelined loop where the
// shape allows. On targets without matrix units the MMA kernel compiles the general body, so
// the choice is always safe.
// NOTE: a pipelined loop for the matrix-unit forward gained nothing at d=128 and lost at d=64,
// so it was removed (docs/kernels.md#small-seq-forward).
template <typename T, int D, int KV>
hipError_t run_fwd(const SmallSeqParams& p, hipStream_t stream) {
  if (p.batch == 0) return hipSuccess;
  const int group = p.num_heads_q / p.num_heads_kv;
  if (group >= 2 && mma_enabled(kPassForward)) {
    static int resident_mma[64] = {};
    const dim3 grid = grid_for(p, small_seq_fwd_mma_kernel<T, D, KV>, kFwdResidencyFactor,
                               resident_mma, ra_tuning().small_seq_fwd_grid);
    hipLaunchKernelGGL((small_seq_fwd_mma_kernel<T, D, KV>), grid, block_for(), 0, stream, p);
    return hipGetLastError();
  }
  // The pipelined loop serves one q head per kv head (GQA groups on the general kernel, i.e.
  // matrix units off or absent, keep the plain loop, which re-uses K/V across the group).
  if constexpr (kFwdPipelinable<D, KV>) {
    if (group == 1 && pipe_enabled(kPassForward))
      return launch_fwd_general<T, D, KV, true>(p, stream);
  }
  return launch_fwd_general<T, D, KV, false>(p, stream);
}

template <typename T, int D, int KV, bool PIPE>
hipError_t launch_bwd_general(const SmallSeqParams& p, hipStream_t stream) {
  static int resident[64] = {};
  const dim3 grid = grid_for(p, small_seq_bwd_kernel<T, D, KV, PIPE>, kBwdResidencyFactor,
                             resident, ra_tuning().small_seq_bwd_grid);
  hipLaunchKernelGGL((small_seq_bwd_kernel<T, D, KV, PIPE>), grid, block_for(), 0, stream, p);
  return hipGetLastError();
}

// GQA groups (two or more q heads per kv head) take the matrix-unit backward, as they take the
// matrix-unit forward: groups of 2..kBwdMmaMaxGroup (one tile of q heads on every vendor) its
// one-tile kernel, wider groups its blocked kernel, which walks the group in tiles of q heads
// inside the wave (bwd_mma_kernel.h). Two kernels, so that the blocked one's dK/dV accumulators
// do not raise the one-tile kernel's registers (occupancy of groups 2..8). One q head per kv
// head keeps the general kernel, in its software-pipelined loop where the shape allows.
template <typename T, int D, int KV>
hipError_t run_bwd(const SmallSeqParams& p, hipStream_t stream) {
  if (p.batch == 0) return hipSuccess;
  const int group = p.num_heads_q / p.num_heads_kv;
  if (group >= 2 && mma_enabled(kPassBackward)) {
    if (group <= kBwdMmaMaxGroup) {
      static int resident_mma[64] = {};
      const dim3 grid = grid_for(p, small_seq_bwd_mma_kernel<T, D, KV>, kBwdResidencyFactor,
                                 resident_mma, ra_tuning().small_seq_bwd_grid);
      hipLaunchKernelGGL((small_seq_bwd_mma_kernel<T, D, KV>), grid, block_for(), 0, stream, p);
    } else {
      static int resident_wide[64] = {};
      const dim3 grid = grid_for(p, small_seq_bwd_mma_wide_kernel<T, D, KV>,
                                 kBwdResidencyFactor, resident_wide,
                                 ra_tuning().small_seq_bwd_grid);
      hipLaunchKernelGGL((small_seq_bwd_mma_wide_kernel<T, D, KV>), grid, block_for(), 0, stream,
                         p);
    }
    return hipGetLastError();
  }
  if constexpr (kBwdPipelinable<D, KV>) {
    if (group == 1 && pipe_enabled(kPassBackward))
      return launch_bwd_general<T, D, KV, true>(p, stream);
  }
  return launch_bwd_general<T, D, KV, false>(p, stream);
}

}  // namespace small_seq
