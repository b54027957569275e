// Launch of one small-seq kernel variant: a switch on the call's plan record (plan.h; made by
// rocm_attn/small_seq_plan.py plan_one_query, which chooses the kernel, PIPE and the grid
// factor from the tuning). The launcher checks the record against the call and what this
// variant compiled, and chooses nothing else. Included only by the generated instantiation
// files (tools/generate_kernels.py), one (direction, dtype, head dim, kv bucket) per file.
#pragma once

#include "bwd_kernel.h"
#include "bwd_mma_kernel.h"
#include "dispatch.h"
#include "fwd_kernel.h"
#include "fwd_mma_kernel.h"
#include "plan.h"

namespace small_seq {

// A record naming no one-query kernel of this direction, or one that does not fit the call
// (its head dim, kv bucket, GQA group, PIPE or grid factor): the bindings raise on these.
constexpr hipError_t kOneQueryNoKernel = hipErrorNotSupported;
constexpr hipError_t kOneQueryBadPlan = hipErrorInvalidValue;

inline dim3 block_for() { return dim3(kWavesPerBlock * ra_device_wave_size()); }

// Blocks for the (segment, kv head) work items: at most `factor` x the blocks that are resident
// at once (from the occupancy API, cached per device in `resident_per_mp`), at least one;
// factor 0: one wave per item (no grid-stride reuse).
template <typename Kernel>
dim3 grid_for(const SmallSeqParams& p, Kernel kernel, int factor, int (&resident_per_mp)[64]) {
  const int64_t items = static_cast<int64_t>(p.batch) * p.num_heads_kv;
  int64_t blocks = (items + kWavesPerBlock - 1) / kWavesPerBlock;
  if (factor > 0) {
    const int device = ra_device_index();
    if (device >= 0 && device < 64 && resident_per_mp[device] == 0) {
      int n = 0;
      if (hipOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, block_for().x, 0) !=
              hipSuccess ||
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

// One kernel on the grid of `factor`, with the params and any further kernel arguments (the
// row_max kernels' row_max).
// NOTE: the occupancy cache is a static of this instantiation, one per kernel. Every kernel
// here has the same type (void(*)(SmallSeqParams)), so a static keyed by that type alone would
// be one cache shared by all of them, the first kernel launched setting the others' residency.
template <auto KERNEL, typename... Args>
hipError_t launch_one_query(const SmallSeqParams& p, int factor, hipStream_t stream,
                            Args... args) {
  static int resident_per_mp[64] = {};
  const dim3 grid = grid_for(p, KERNEL, factor, resident_per_mp);
  hipLaunchKernelGGL(KERNEL, grid, block_for(), 0, stream, p, args...);
  return hipGetLastError();
}

// Whether a record's PIPE flag can run on this variant: 0 (the plain loop), or 1 (the
// software-pipelined loop) where the variant's K/V fit one chunk (kFwdPipelinable /
// kBwdPipelinable, which the plan's fwd_pipelinable / bwd_pipelinable mirror) and the call has
// one q head per kv head (the pipelined loops take the kv head's own q head only).
inline bool pipe_fits(int32_t pipe, bool pipelinable, int group) {
  return pipe == 0 || (pipe == 1 && pipelinable && group == 1);
}

// NOTE: in run_fwd / run_bwd the matrix-unit cases come first: a unit instantiates its kernels
// in the order it names them, and that order moves clang's gfx942 register assignment of the
// d 512 matrix-unit kernels (same counts, other registers). tools/compare_device_code.py shows
// such a change; this order keeps the device code of the generated units as it was.

// Record a = {D, KV, PIPE, grid_factor} (fwd) or {D, KV, grid_factor} (fwd_mma); the caller
// (launch.hip) has matched D and KV to this variant. The matrix-unit forward serves GQA groups
// (two or more q heads per kv head); on targets without matrix units it compiles the general
// body, so the record is always runnable. ROW_MAX: the same record on the kernels that also
// write each row's maximum scaled logit to row_max ([h_q, b], indexed as the LSE:
// return_max_logit), kernels of their own that take row_max beside the params, so that
// SmallSeqParams and the default kernels' device code stay as they are.
template <typename T, int D, int KV, bool ROW_MAX>
hipError_t run_fwd_record(const SmallSeqParams& p, const SmallSeqLaunch& l, hipStream_t stream,
                          float* row_max) {
  const int32_t* a = l.p;
  const int group = p.num_heads_q / p.num_heads_kv;
  switch (static_cast<SmallSeqKernel>(l.kernel)) {
    case SmallSeqKernel::kFwdMma:
      if (group < 2 || a[2] < 0) return kOneQueryBadPlan;
      if (p.batch == 0) return hipSuccess;
      if constexpr (ROW_MAX)
        return launch_one_query<small_seq_fwd_mma_row_max_kernel<T, D, KV>>(p, a[2], stream,
                                                                            row_max);
      else
        return launch_one_query<small_seq_fwd_mma_kernel<T, D, KV>>(p, a[2], stream);
    case SmallSeqKernel::kFwd:
      if (!pipe_fits(a[2], kFwdPipelinable<D, KV>, group) || a[3] < 0) return kOneQueryBadPlan;
      if (p.batch == 0) return hipSuccess;
      if constexpr (kFwdPipelinable<D, KV>) {
        if (a[2] == 1) {
          if constexpr (ROW_MAX)
            return launch_one_query<small_seq_fwd_row_max_kernel<T, D, KV, true>>(
                p, a[3], stream, row_max);
          else
            return launch_one_query<small_seq_fwd_kernel<T, D, KV, true>>(p, a[3], stream);
        }
      }
      if constexpr (ROW_MAX)
        return launch_one_query<small_seq_fwd_row_max_kernel<T, D, KV, false>>(p, a[3], stream,
                                                                               row_max);
      else
        return launch_one_query<small_seq_fwd_kernel<T, D, KV, false>>(p, a[3], stream);
    default:
      return kOneQueryNoKernel;
  }
}

template <typename T, int D, int KV>
hipError_t run_fwd(const SmallSeqParams& p, const SmallSeqLaunch& l, hipStream_t stream) {
  return run_fwd_record<T, D, KV, false>(p, l, stream, nullptr);
}

// Instantiated after run_fwd in each generated unit (the NOTE above on the order).
template <typename T, int D, int KV>
hipError_t run_fwd_row_max(const SmallSeqParams& p, const SmallSeqLaunch& l, hipStream_t stream,
                           float* row_max) {
  return run_fwd_record<T, D, KV, true>(p, l, stream, row_max);
}

// Record a = {D, KV, PIPE, grid_factor} (bwd) or {D, KV, grid_factor} (bwd_mma, bwd_mma_wide).
// The matrix-unit backward has two kernels, so that the blocked one's dK/dV accumulators do not
// raise the one-tile kernel's registers: bwd_mma for groups of 2..kBwdMmaMaxGroup (one tile of
// q heads on every vendor), bwd_mma_wide for wider groups (it walks the group in tiles of q
// heads inside the wave, bwd_mma_kernel.h).
template <typename T, int D, int KV>
hipError_t run_bwd(const SmallSeqParams& p, const SmallSeqLaunch& l, hipStream_t stream) {
  const int32_t* a = l.p;
  const int group = p.num_heads_q / p.num_heads_kv;
  switch (static_cast<SmallSeqKernel>(l.kernel)) {
    case SmallSeqKernel::kBwdMma:
      if (group < 2 || group > kBwdMmaMaxGroup || a[2] < 0) return kOneQueryBadPlan;
      if (p.batch == 0) return hipSuccess;
      return launch_one_query<small_seq_bwd_mma_kernel<T, D, KV>>(p, a[2], stream);
    case SmallSeqKernel::kBwdMmaWide:
      if (group <= kBwdMmaMaxGroup || a[2] < 0) return kOneQueryBadPlan;
      if (p.batch == 0) return hipSuccess;
      return launch_one_query<small_seq_bwd_mma_wide_kernel<T, D, KV>>(p, a[2], stream);
    case SmallSeqKernel::kBwd:
      if (!pipe_fits(a[2], kBwdPipelinable<D, KV>, group) || a[3] < 0) return kOneQueryBadPlan;
      if (p.batch == 0) return hipSuccess;
      if constexpr (kBwdPipelinable<D, KV>) {
        if (a[2] == 1)
          return launch_one_query<small_seq_bwd_kernel<T, D, KV, true>>(p, a[3], stream);
      }
      return launch_one_query<small_seq_bwd_kernel<T, D, KV, false>>(p, a[3], stream);
    default:
      return kOneQueryNoKernel;
  }
}

}  // namespace small_seq
