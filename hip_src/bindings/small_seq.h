// The small-seq ops' C++ functions and checks, shared by the bindings files of the family
// (small_seq.cpp: the ops; small_seq_autograd.cpp: their Autograd kernel; small_seq_direct.cpp:
// the dispatcher-free forward).
#pragma once

#include <optional>
#include <tuple>

#include "bindings/torch_helpers.h"
#include "small_seq/params.h"

namespace rocm_attn::bindings {

// What a one-query plan record must match (hip_src/small_seq/launch.hip, launch_impl.h).
inline constexpr const char* kOneQueryMisfit =
    "one launch of the call's head dim over a kv bucket that holds max_seqlen_kv, of a kernel "
    "for its GQA group, PIPE only where the variant has a pipelined loop, grid factor >= 0";

inline SmallSeqDtype small_seq_dtype(const at::Tensor& t) {
  TORCH_CHECK(t.scalar_type() == at::kHalf || t.scalar_type() == at::kBFloat16,
              "small_seq: expected float16 or bfloat16, got ", t.scalar_type());
  return t.scalar_type() == at::kBFloat16 ? SmallSeqDtype::kBFloat16 : SmallSeqDtype::kFloat16;
}

// Fills the layout-dependent fields of the params. THD: q [total_q, h, d], k/v [total_kv, h, d].
// BSHD: q [b, 1, h, d], k/v [b, s, h, d].
SmallSeqParams make_params(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                           const std::optional<at::Tensor>& cu_seqlens_q,
                           const std::optional<at::Tensor>& cu_seqlens_kv,
                           const std::optional<at::Tensor>& seqlens_kv, int64_t max_seqlen_kv,
                           double softmax_scale);

// The ops rocm_attn::small_seq_fwd / small_seq_bwd (their CUDA kernels). `plan`: the launch
// the op runs; the forward's `backward_plan`: the one its autograd passes to small_seq_bwd (both
// from rocm_attn.small_seq_plan.one_query_plans, checked to be plans by the forward).
std::tuple<at::Tensor, at::Tensor, at::Tensor> small_seq_fwd(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
    const std::optional<at::Tensor>& cu_seqlens_q, const std::optional<at::Tensor>& cu_seqlens_kv,
    const std::optional<at::Tensor>& seqlens_kv, int64_t max_seqlen_kv, double softmax_scale,
    bool return_softmax, at::IntArrayRef plan, at::IntArrayRef backward_plan);

std::tuple<at::Tensor, at::Tensor, at::Tensor> small_seq_bwd(
    const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
    const at::Tensor& out, const at::Tensor& lse, const std::optional<at::Tensor>& dlse,
    const std::optional<at::Tensor>& cu_seqlens_q, const std::optional<at::Tensor>& cu_seqlens_kv,
    const std::optional<at::Tensor>& seqlens_kv, int64_t max_seqlen_kv, double softmax_scale,
    at::IntArrayRef plan);

}  // namespace rocm_attn::bindings
