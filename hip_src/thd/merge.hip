// Launchers of the THD merge / correction kernels: 8-element vectors when every row allows
// them, else scalar. Two instantiations per kernel.
#include "merge_kernel.h"

namespace {

bool ptr_aligned16(const void* p) {
  return p == nullptr || reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

unsigned clip_grid(int64_t blocks) {
  return static_cast<unsigned>(blocks < INT32_MAX ? blocks : INT32_MAX);
}

}  // namespace

hipError_t thd_merge_launch(const ThdMergeParams& p, hipStream_t stream) {
  if (p.n <= 0 || p.heads <= 0) return hipSuccess;
  if (p.lse == nullptr || p.lse_step == nullptr) return hipErrorInvalidValue;
  const bool rows = p.out_dst != nullptr;
  if (rows && (p.out == nullptr || p.out_step == nullptr || p.dim <= 0))
    return hipErrorInvalidValue;
  if (p.map.kind != ThdRowMap::kIdentity && p.map.kind != ThdRowMap::kHalf &&
      p.map.kind != ThdRowMap::kIndex)
    return hipErrorInvalidValue;
  if (p.map.kind == ThdRowMap::kIndex &&
      (p.map.index == nullptr || p.map.local_rows <= 0 ||
       (p.map.step_index != nullptr && p.map.step_count <= 0)))
    return hipErrorInvalidValue;
  // 8-element vectors: 16 bytes of a 16-bit row, two 16-byte halves of an fp32 row.
  bool vec8 = rows && p.dim % 8 == 0 && ptr_aligned16(p.out) && ptr_aligned16(p.out_step) &&
              ptr_aligned16(p.out_dst);
  for (int64_t s : {p.out_tok, p.out_head, p.step_tok, p.step_head, p.dst_tok, p.dst_head})
    vec8 = vec8 && s % 8 == 0;
  const int vec = vec8 ? 8 : 1;
  const int shift =
      rows ? thd::lanes_shift(p.dim / vec, thd::kMergeRowVecsPerLane, thd::kMergeThreads) : 0;
  const int64_t groups_per_block = thd::kMergeThreads >> shift;
  const dim3 grid(clip_grid(ceil_div(p.n * p.heads, groups_per_block)));
  const dim3 block(thd::kMergeThreads);
  if (vec8) {
    hipLaunchKernelGGL((thd::merge_kernel<8>), grid, block, 0, stream, p, shift);
  } else {
    hipLaunchKernelGGL((thd::merge_kernel<1>), grid, block, 0, stream, p, shift);
  }
  return hipGetLastError();
}

hipError_t thd_grad_launch(const ThdGradParams& p, hipStream_t stream) {
  if (p.n <= 0 || p.heads <= 0 || p.head_dim <= 0) return hipSuccess;
  if (p.map.kind != ThdRowMap::kIdentity && p.map.kind != ThdRowMap::kHalf &&
      p.map.kind != ThdRowMap::kIndex)
    return hipErrorInvalidValue;
  if (p.map.kind == ThdRowMap::kIndex &&
      (p.map.index == nullptr || p.map.local_rows <= 0 ||
       (p.map.step_index != nullptr && p.map.step_count <= 0)))
    return hipErrorInvalidValue;
  bool vec8 = p.head_dim % 8 == 0 && ptr_aligned16(p.grad) && ptr_aligned16(p.step) &&
              ptr_aligned16(p.dst) && p.grad_tok % 8 == 0 && p.step_tok % 8 == 0 &&
              p.dst_tok % 8 == 0;
  if (p.heads > 1)
    vec8 = vec8 && p.grad_head % 8 == 0 && p.step_head % 8 == 0 && p.dst_head % 8 == 0;
  const int vec = vec8 ? 8 : 1;
  const int64_t nvec = static_cast<int64_t>(p.heads) * (p.head_dim / vec);
  if (nvec > INT32_MAX) return hipErrorInvalidValue;
  const int shift = thd::lanes_shift(nvec, thd::kMergeVecsPerLane, thd::kMergeThreads);
  const int64_t groups_per_block = thd::kMergeThreads >> shift;
  const dim3 grid(clip_grid(ceil_div(p.n, groups_per_block)));
  const dim3 block(thd::kMergeThreads);
  if (vec8) {
    hipLaunchKernelGGL((thd::grad_kernel<8>), grid, block, 0, stream, p, shift);
  } else {
    hipLaunchKernelGGL((thd::grad_kernel<1>), grid, block, 0, stream, p, shift);
  }
  return hipGetLastError();
}
