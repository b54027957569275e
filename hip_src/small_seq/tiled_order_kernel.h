// The order in which the tiled forward's work items take the segments: longest history first
// (docs/kernels.md#segment-order).
//
// Why: the forward kernels walk their items grid-stride, each block through a fixed share, in
// segment order. An item costs about its history's key steps, and in a ragged request batch
// histories differ by 100x or more, so in segment order a block that meets a long history late
// keeps the machine waiting while the others have run out of work. Taken longest first, the
// long items start together at the beginning and the short ones fill the gaps at the end
// (longest-processing-time-first scheduling). tools/diag/ragged_schedule_model.py replays the
// ragged-request rows' items onto the grid: in segment order the busiest block ends 1.18-1.35x
// after the mean on the long-tailed rows (H200 grid), in this order 1.01-1.14x.
//
// One block of kTiledOrderThreads threads counting-sorts the segments by key steps
// (kTiledOrderStepKeys keys; buckets 0 .. kTiledOrderBuckets - 1), most steps first: a
// histogram in shared memory, a scan from the largest bucket down, then every segment takes the
// next place of its bucket. The key count is the contract's (tiled_resolve_segment: 0 for a bad
// segment), so whatever the offsets hold every bucket is in range and the result is a
// permutation of 0 .. b - 1; the order within a bucket follows the atomics and changes nothing
// an item computes.
#pragma once

#include "tiled_segment.h"

namespace small_seq {

constexpr int kTiledOrderThreads = 256;
constexpr int kTiledOrderStepKeys = 64;
constexpr int kTiledOrderBuckets = kSmallSeqTiledMaxSeqlenKv / kTiledOrderStepKeys + 1;

// The bucket of segment `seg`: its key steps (a valid segment has at most max_seqlen_kv <=
// kSmallSeqTiledMaxSeqlenKv keys, a bad one 0).
RA_DEVICE int tiled_order_bucket(const SmallSeqTiledParams& p, const int seg) {
  const TiledSegment s = tiled_resolve_segment(p, seg, tiled_fetch_bounds(p, seg));
  const int steps = (s.nk + kTiledOrderStepKeys - 1) / kTiledOrderStepKeys;
  return steps < kTiledOrderBuckets ? steps : kTiledOrderBuckets - 1;
}

__global__ void __launch_bounds__(kTiledOrderThreads)
    small_seq_tiled_segment_order_kernel(const SmallSeqTiledParams p) {
  __shared__ int count[kTiledOrderBuckets];
  __shared__ int next[kTiledOrderBuckets];
  const int tid = threadIdx.x;
  for (int i = tid; i < kTiledOrderBuckets; i += kTiledOrderThreads) count[i] = 0;
  __syncthreads();
  for (int seg = tid; seg < p.batch; seg += kTiledOrderThreads)
    atomicAdd(&count[tiled_order_bucket(p, seg)], 1);
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
    p.segment_order[atomicAdd(&next[tiled_order_bucket(p, seg)], 1)] = seg;
}

}  // namespace small_seq
