// Launch of the flash route's contract kernels (flash_contract_kernel.h): one block per
// segment up to a few times the blocks resident at once (grid-stride beyond).
#include "../common/device_info.h"
#include "flash_contract.h"
#include "flash_contract_kernel.h"

namespace small_seq {
namespace {

constexpr int kFlashContractThreads = 128;
// Grid cap, in blocks per multiprocessor: a valid call's blocks only read six offsets each.
constexpr int kFlashContractBlocksPerMultiprocessor = 16;

dim3 flash_contract_grid(int batch) {
  int64_t blocks = batch;
  const int64_t cap =
      static_cast<int64_t>(ra_device_multiprocessors()) * kFlashContractBlocksPerMultiprocessor;
  if (cap > 0 && blocks > cap) blocks = cap;
  return dim3(static_cast<unsigned>(blocks > 0 ? blocks : 1));
}

bool flash_contract_serves(const SmallSeqTiledParams& p, int head_dim) {
  return head_dim > 0 && head_dim % 8 == 0 && p.cu_seqlens_q != nullptr &&
         p.cu_seqlens_kv != nullptr;
}

template <typename T>
hipError_t launch_fwd(const SmallSeqTiledParams& p, const int32_t* fq, const int32_t* fk,
                      int vecs, hipStream_t stream) {
  hipLaunchKernelGGL(small_seq_flash_contract_fwd_kernel<T>, flash_contract_grid(p.batch),
                     dim3(kFlashContractThreads), 0, stream, p, fq, fk, vecs);
  return hipGetLastError();
}

template <typename T>
hipError_t launch_bwd(const SmallSeqTiledParams& p, const int32_t* fq, const int32_t* fk,
                      int vecs, hipStream_t stream) {
  hipLaunchKernelGGL(small_seq_flash_contract_bwd_kernel<T>, flash_contract_grid(p.batch),
                     dim3(kFlashContractThreads), 0, stream, p, fq, fk, vecs);
  return hipGetLastError();
}

}  // namespace
}  // namespace small_seq

hipError_t small_seq_flash_contract_fwd_launch(const SmallSeqTiledParams& p,
                                               const int32_t* flash_cu_q,
                                               const int32_t* flash_cu_kv,
                                               SmallSeqTiledDtype dtype, int head_dim,
                                               hipStream_t stream) {
  if (!small_seq::flash_contract_serves(p, head_dim)) return hipErrorInvalidValue;
  if (p.batch == 0) return hipSuccess;
  return dtype == SmallSeqTiledDtype::kBFloat16
             ? small_seq::launch_fwd<ra_bf16>(p, flash_cu_q, flash_cu_kv, head_dim / 8, stream)
             : small_seq::launch_fwd<ra_fp16>(p, flash_cu_q, flash_cu_kv, head_dim / 8, stream);
}

hipError_t small_seq_flash_contract_bwd_launch(const SmallSeqTiledParams& p,
                                               const int32_t* flash_cu_q,
                                               const int32_t* flash_cu_kv,
                                               SmallSeqTiledDtype dtype, int head_dim,
                                               hipStream_t stream) {
  if (!small_seq::flash_contract_serves(p, head_dim)) return hipErrorInvalidValue;
  if (p.batch == 0) return hipSuccess;
  return dtype == SmallSeqTiledDtype::kBFloat16
             ? small_seq::launch_bwd<ra_bf16>(p, flash_cu_q, flash_cu_kv, head_dim / 8, stream)
             : small_seq::launch_bwd<ra_fp16>(p, flash_cu_q, flash_cu_kv, head_dim / 8, stream);
}

hipError_t small_seq_flash_offsets_launch(const SmallSeqTiledParams& p, int32_t* out,
                                          hipStream_t stream) {
  if (p.cu_seqlens_q == nullptr || p.cu_seqlens_kv == nullptr || p.batch < 0)
    return hipErrorInvalidValue;
  hipLaunchKernelGGL(small_seq::small_seq_flash_offsets_kernel, dim3(2),
                     dim3(small_seq::kFlashOffsetsThreads), 0, stream, p, out);
  return hipGetLastError();
}
