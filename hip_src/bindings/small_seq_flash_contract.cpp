// rocm_attn::small_seq_flash_contract_fwd / _bwd: the tiled small-seq contract written around a
// flash varlen call (rocm_attn/small_seq_flash.py, kernels in
// hip_src/small_seq/flash_contract_kernel.h). In place on flash's outputs; THD only. The
// offsets are never read on the host (no sync). small_seq_flash_offsets makes the offsets
// flash runs on.

#include <ATen/ATen.h>
#include <c10/core/DeviceGuard.h>
#include <torch/library.h>

#include "common/error_state.h"
#include "bindings/small_seq_tiled.h"
#include "small_seq/flash_contract.h"

namespace {

using rocm_attn::bindings::check_launch;
using rocm_attn::bindings::check_rows_16b;
using rocm_attn::bindings::check_tiled_offsets;
using rocm_attn::bindings::current_stream;
using rocm_attn::bindings::device_error_state;
using rocm_attn::bindings::fill_tiled_segments;
using rocm_attn::bindings::tiled_row_strides;

constexpr const char* kOp = "small_seq_flash_contract";

// p's segment fields from the call's offsets (q: a [total_q, h_q, d] tensor, k: a
// [total_kv, h_kv, d] one, named q_name / k_name in messages); the flash offsets checked to be
// int32 [b + 1] on the same device.
SmallSeqTiledParams contract_params(const at::Tensor& q, const char* q_name,
                                    const at::Tensor& k, const char* k_name,
                                    const at::Tensor& cu_seqlens_q,
                                    const at::Tensor& cu_seqlens_kv,
                                    const at::Tensor& flash_cu_seqlens_q,
                                    const at::Tensor& flash_cu_seqlens_kv, int64_t max_seqlen_q,
                                    int64_t max_seqlen_kv) {
  TORCH_CHECK(q.dim() == 3 && k.dim() == 3, kOp, ": THD tensors only, got shapes ", q.sizes(),
              " and ", k.sizes());
  TORCH_CHECK(q.is_cuda() && k.device() == q.device(), kOp, ": tensors must be on one GPU");
  TORCH_CHECK(q.scalar_type() == at::kHalf || q.scalar_type() == at::kBFloat16, kOp,
              ": float16 or bfloat16 only, got ", q.scalar_type());
  TORCH_CHECK(k.scalar_type() == q.scalar_type(), kOp, ": k must have the dtype of q");
  TORCH_CHECK(q.size(-1) == k.size(-1) && q.size(-1) % 8 == 0, kOp,
              ": head dims must match and be a multiple of 8");
  TORCH_CHECK(k.size(1) > 0 && q.size(1) % k.size(1) == 0, kOp,
              ": the heads of q must be a multiple of the heads of k");
  TORCH_CHECK(max_seqlen_q >= 1 && max_seqlen_q <= rocm_attn::bindings::kTiledInt32Max &&
                  max_seqlen_kv >= 1 && max_seqlen_kv <= rocm_attn::bindings::kTiledInt32Max,
              kOp, ": max_seqlen_q and max_seqlen_kv must be in 1..2^31-1");
  check_rows_16b(q, kOp, q_name);
  check_rows_16b(k, kOp, k_name);
  SmallSeqTiledParams p{};
  p.num_heads_q = static_cast<int32_t>(q.size(1));
  p.num_heads_kv = static_cast<int32_t>(k.size(1));
  fill_tiled_segments(p, q, k, cu_seqlens_q, cu_seqlens_kv, std::nullopt, max_seqlen_q,
                      max_seqlen_kv, kOp);
  for (const auto& [t, name] : {std::pair{&flash_cu_seqlens_q, "flash_cu_seqlens_q"},
                                std::pair{&flash_cu_seqlens_kv, "flash_cu_seqlens_kv"}}) {
    const bool is64 = check_tiled_offsets(*t, q, cu_seqlens_q.numel(), kOp, name);
    TORCH_CHECK(!is64, kOp, ": ", name, " must be int32 (flash's offsets)");
  }
  p.error_state = device_error_state(q, kOp);
  return p;
}

// Launches `launcher` (forward or backward contract) on q_like's device and current stream;
// q_like (out or dq) gives the dtype and head dim.
using ContractLauncher = hipError_t (*)(const SmallSeqTiledParams&, const int32_t*,
                                        const int32_t*, SmallSeqTiledDtype, int, hipStream_t);
void launch_contract(ContractLauncher launcher, const SmallSeqTiledParams& p,
                     const at::Tensor& q_like, const at::Tensor& flash_cu_seqlens_q,
                     const at::Tensor& flash_cu_seqlens_kv, const char* what) {
  const SmallSeqTiledDtype dtype = q_like.scalar_type() == at::kBFloat16
                                       ? SmallSeqTiledDtype::kBFloat16
                                       : SmallSeqTiledDtype::kFloat16;
  const c10::DeviceGuard guard(q_like.device());
  check_launch(launcher(p, flash_cu_seqlens_q.data_ptr<int32_t>(),
                        flash_cu_seqlens_kv.data_ptr<int32_t>(), dtype,
                        static_cast<int>(q_like.size(-1)), current_stream(q_like.device())),
               what);
}

void small_seq_flash_contract_fwd(at::Tensor& out, at::Tensor& lse, const at::Tensor& k,
                                  const at::Tensor& cu_seqlens_q,
                                  const at::Tensor& cu_seqlens_kv,
                                  const at::Tensor& flash_cu_seqlens_q,
                                  const at::Tensor& flash_cu_seqlens_kv, int64_t max_seqlen_q,
                                  int64_t max_seqlen_kv) {
  SmallSeqTiledParams p =
      contract_params(out, "out", k, "k", cu_seqlens_q, cu_seqlens_kv, flash_cu_seqlens_q,
                      flash_cu_seqlens_kv, max_seqlen_q, max_seqlen_kv);
  TORCH_CHECK(lse.scalar_type() == at::kFloat && lse.dim() == 2 &&
                  lse.size(0) == out.size(1) && lse.size(1) == out.size(0) &&
                  lse.stride(1) == 1 && lse.device() == out.device(),
              kOp, ": lse must be float32 [h_q, total_q] with contiguous rows, got ",
              lse.sizes());
  p.o = out.data_ptr();
  tiled_row_strides(out, p.o_batch_stride, p.o_token_stride, p.o_head_stride);
  p.lse = lse.data_ptr<float>();
  p.lse_head_stride = lse.stride(0);
  launch_contract(&small_seq_flash_contract_fwd_launch, p, out, flash_cu_seqlens_q,
                  flash_cu_seqlens_kv, "small_seq flash contract forward launch");
}

void small_seq_flash_contract_bwd(at::Tensor& dq, at::Tensor& dk, at::Tensor& dv,
                                  const at::Tensor& cu_seqlens_q,
                                  const at::Tensor& cu_seqlens_kv,
                                  const at::Tensor& flash_cu_seqlens_q,
                                  const at::Tensor& flash_cu_seqlens_kv, int64_t max_seqlen_q,
                                  int64_t max_seqlen_kv) {
  SmallSeqTiledParams p =
      contract_params(dq, "dq", dk, "dk", cu_seqlens_q, cu_seqlens_kv, flash_cu_seqlens_q,
                      flash_cu_seqlens_kv, max_seqlen_q, max_seqlen_kv);
  TORCH_CHECK(dv.sizes() == dk.sizes() && dv.scalar_type() == dk.scalar_type() &&
                  dv.device() == dk.device(),
              kOp, ": dv must have dk's shape ", dk.sizes(), ", dtype and device");
  check_rows_16b(dv, kOp, "dv");
  p.dq = dq.data_ptr();
  p.dk = dk.data_ptr();
  p.dv = dv.data_ptr();
  tiled_row_strides(dq, p.dq_batch_stride, p.dq_token_stride, p.dq_head_stride);
  tiled_row_strides(dk, p.dk_batch_stride, p.dk_token_stride, p.dk_head_stride);
  tiled_row_strides(dv, p.dv_batch_stride, p.dv_token_stride, p.dv_head_stride);
  launch_contract(&small_seq_flash_contract_bwd_launch, p, dq, flash_cu_seqlens_q,
                  flash_cu_seqlens_kv, "small_seq flash contract backward launch");
}

// int32 [2, b + 1]: row 0 cu_seqlens_q clamped into q's rows and made non-decreasing, row 1
// cu_seqlens_kv into k's (the offsets flash runs on; equal to the offsets where they are
// valid), by one kernel for both.
at::Tensor small_seq_flash_offsets(const at::Tensor& q, const at::Tensor& k,
                                   const at::Tensor& cu_seqlens_q,
                                   const at::Tensor& cu_seqlens_kv) {
  TORCH_CHECK(q.dim() == 3 && k.dim() == 3, kOp, ": THD tensors only, got shapes ", q.sizes(),
              " and ", k.sizes());
  TORCH_CHECK(q.is_cuda() && k.device() == q.device(), kOp, ": tensors must be on one GPU");
  TORCH_CHECK(cu_seqlens_q.numel() >= 1, kOp, ": cu_seqlens_q must hold b + 1 >= 1 entries");
  SmallSeqTiledParams p{};
  fill_tiled_segments(p, q, k, cu_seqlens_q, cu_seqlens_kv, std::nullopt, 1, 1, kOp);
  at::Tensor out = at::empty({2, cu_seqlens_q.numel()}, q.options().dtype(at::kInt));
  const c10::DeviceGuard guard(q.device());
  check_launch(small_seq_flash_offsets_launch(p, out.data_ptr<int32_t>(),
                                              current_stream(q.device())),
               "small_seq flash offsets launch");
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(rocm_attn, m) {
  m.def(
      "small_seq_flash_contract_fwd(Tensor(a!) out, Tensor(b!) lse, Tensor k, "
      "Tensor cu_seqlens_q, Tensor cu_seqlens_kv, Tensor flash_cu_seqlens_q, "
      "Tensor flash_cu_seqlens_kv, int max_seqlen_q, int max_seqlen_kv) -> ()");
  m.def(
      "small_seq_flash_contract_bwd(Tensor(a!) dq, Tensor(b!) dk, Tensor(c!) dv, "
      "Tensor cu_seqlens_q, Tensor cu_seqlens_kv, Tensor flash_cu_seqlens_q, "
      "Tensor flash_cu_seqlens_kv, int max_seqlen_q, int max_seqlen_kv) -> ()");
  m.def(
      "small_seq_flash_offsets(Tensor q, Tensor k, Tensor cu_seqlens_q, Tensor cu_seqlens_kv) "
      "-> Tensor");
}

TORCH_LIBRARY_IMPL(rocm_attn, CUDA, m) {
  m.impl("small_seq_flash_contract_fwd", &small_seq_flash_contract_fwd);
  m.impl("small_seq_flash_contract_bwd", &small_seq_flash_contract_bwd);
  m.impl("small_seq_flash_offsets", &small_seq_flash_offsets);
}
