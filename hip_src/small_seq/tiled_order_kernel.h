// The order in which the tiled kernels' work items take the segments: most work per item first
// (docs/kernels.md#segment-order).
//
// Why: the tiled kernels walk their items grid-stride, each block through a fixed share, in
// segment order. In a ragged request batch the items of one segment cost 100x or more those of
// another, so in segment order a block that meets an expensive segment late keeps the machine
// waiting while the others have run out of work. Taken most expensive first, the long items
// start together at the beginning and the short ones fill the gaps at the end
// (longest-processing-time-first scheduling). tools/diag/ragged_schedule_model.py replays the
// ragged-request rows' items onto the grid: in segment order the forward's busiest block ends
// 1.18-1.35x after the mean on the long-tailed rows (H200 grid), in this order 1.01-1.14x.
//
// What an item costs depends on the kernel: the forward's items and the backward's dQ items
// walk the segment's keys (ordered by keys), the backward's dK / dV items its rows, candidates
// x q heads of a kv head (ordered by rows). One block of kTiledOrderThreads threads
// counting-sorts the segments by steps of kTiledOrderStep keys or rows (buckets 0 ..
// kTiledOrderBuckets - 1, the last also holding everything larger), most steps first: a
// histogram in shared memory, a scan from the largest bucket down, then every segment takes the
// next place of its bucket. The counts are the contract's (tiled_resolve_segment: no keys and no
// rows for a bad segment), so whatever the offsets hold every bucket is in range and the result
// is a permutation of 0 .. b - 1; the order within a bucket follows the atomics and changes
// nothing an item computes.
#pragma once

#include "tiled_segment.h"

namespace small_seq {

constexpr int kTiledOrderThreads = 256;
constexpr int kTiledOrderStep = 64;
constexpr int kTiledOrderBuckets = kSmallSeqTiledMaxSeqlenKv / kTiledOrderStep + 1;

// The bucket of segment `seg`: its steps of keys (a valid segment has at most max_seqlen_kv <=
// kSmallSeqTiledMaxSeqlenKv) or of rows (queries x GQA group), 0 for a bad segment.
template <bool BY_ROWS>
RA_DEVICE int tiled_order_bucket(const SmallSeqTiledParams& p, const int seg) {
  const TiledSegment s = tiled_resolve_segment(p, seg, tiled_fetch_bounds(p, seg));
  const int64_t n = !s.valid ? 0
                    : BY_ROWS ? static_cast<int64_t>(s.nq) * (p.num_heads_q / p.num_heads_kv)
                              : s.nk;
  const int64_t steps = (n + kTiledOrderStep - 1) / kTiledOrderStep;
  return steps < kTiledOrderBuckets ? static_cast<int>(steps) : kTiledOrderBuckets - 1;
}

template <bool BY_ROWS>
__global__ void __launch_bounds__(kTiledOrderThreads)
    small_seq_tiled_segment_order_kernel(const SmallSeqTiledParams p) {
  __shared__ int count[kTiledOrderBuckets];
  __shared__ int next[kTiledOrderBuckets];
  const int tid = threadIdx.x;
  for (int i = tid; i < kTiledOrderBuckets; i += kTiledOrderThreads) count[i] = 0;
  __syncthreads();
  for (int seg = tid; seg < p.batch; seg += kTiledOrderThreads)
    atomicAdd(&count[tiled_order_bucket<BY_ROWS>(p, seg)], 1);
  __syncthreads();
  if (tid == 0) {  // where each bucket starts, the largest first
    int start = 0;
    for (int i = kTiledOrderBuckets - 1; i >= 0; --i) {
      next[i] = start;
      start += count[i];
    }
  }
  __syncthreads();
  for (int seg = tid; seg < p.batch; seg += kTiledOrderThreads)
    p.segment_order[atomicAdd(&next[tiled_order_bucket<BY_ROWS>(p, seg)], 1)] = seg;
}

// The plan's order launch (its record's BY_ROWS: 0 by keys, 1 by rows) into p.segment_order,
// which the binding allocates for a plan that has one (small_seq_plan_orders_segments).
inline hipError_t run_tiled_segment_order(const SmallSeqTiledParams& p, const int32_t by_rows,
                                          hipStream_t stream) {
  if (p.segment_order == nullptr || (by_rows != 0 && by_rows != 1)) return hipErrorInvalidValue;
  if (by_rows != 0)
    hipLaunchKernelGGL(small_seq_tiled_segment_order_kernel<true>, dim3(1),
                       dim3(kTiledOrderThreads), 0, stream, p);
  else
    hipLaunchKernelGGL(small_seq_tiled_segment_order_kernel<false>, dim3(1),
                       dim3(kTiledOrderThreads), 0, stream, p);
  return hipGetLastError();
}

}  // namespace small_seq
