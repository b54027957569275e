// rocm_attn::small_seq_tiled_fwd: the tiled small-seq forward (any number of queries per
// segment, long histories, int32 or int64 offsets) as a torch op. Checks the tensors, allocates
// out / lse / probs, takes the current stream and launches (hip_src/small_seq/tiled_launch.hip).
// rocm_attn::small_seq_tiled_fwd_row_max: the same launch that also writes each query row's
// maximum scaled logit (row_max, indexed as the LSE), for return_max_logit: a separate op so
// that the plain op's schema, outputs and callers stay as they are.
// User-facing validation with ValueErrors naming the argument lives in Python
// (rocm_attn/small_seq.py); the checks here guard direct torch.ops callers, each message naming
// the argument. Offsets are never read on the host (no sync): a segment that breaks the
// contract is flagged by the kernel (docs/kernels.md#tiled-small-seq-kernels).

#include <ATen/ATen.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/library.h>

#include <cmath>
#include <limits>
#include <optional>
#include <tuple>

#include "common/error_state.h"
#include "bindings/small_seq_plan_arg.h"
#include "bindings/small_seq_tiled.h"
#include "small_seq/tiled_params.h"

namespace {

using rocm_attn::bindings::check_plan_launch;
using rocm_attn::bindings::check_rows_16b;
using rocm_attn::bindings::current_stream;
using rocm_attn::bindings::decode_plan;
using rocm_attn::bindings::device_error_state;
using rocm_attn::bindings::fill_tiled_segments;
using rocm_attn::bindings::kTiledInt32Max;
using rocm_attn::bindings::tiled_row_strides;

// (out, lse, probs, row_max); row_max is [h_q, total_q] when want_row_max, else empty and the
// kernels write none (a null pointer).
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> tiled_fwd(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
    const std::optional<at::Tensor>& cu_seqlens_q, const std::optional<at::Tensor>& cu_seqlens_kv,
    const std::optional<at::Tensor>& seqlens_kv, int64_t max_seqlen_q, int64_t max_seqlen_kv,
    double softmax_scale, bool return_softmax, at::IntArrayRef plan_ints, bool want_row_max) {
  const bool thd = q.dim() == 3;
  TORCH_CHECK(thd || q.dim() == 4,
              "small_seq_tiled: q must be [total_q, h_q, d] (THD) or [b, s_q, h_q, d] (BSHD), "
              "got shape ", q.sizes());
  TORCH_CHECK(k.dim() == q.dim(), "small_seq_tiled: k must have the rank of q (", q.dim(),
              "), got shape ", k.sizes());
  TORCH_CHECK(v.sizes() == k.sizes(), "small_seq_tiled: v must have the shape of k ", k.sizes(),
              ", got ", v.sizes());
  TORCH_CHECK(q.scalar_type() == at::kHalf || q.scalar_type() == at::kBFloat16,
              "small_seq_tiled: q must be float16 or bfloat16, got ", q.scalar_type());
  TORCH_CHECK(k.scalar_type() == q.scalar_type() && v.scalar_type() == q.scalar_type(),
              "small_seq_tiled: k and v must have the dtype of q (", q.scalar_type(), ")");
  TORCH_CHECK(q.is_cuda(), "small_seq_tiled: q must be on a GPU, got ", q.device());
  TORCH_CHECK(k.device() == q.device() && v.device() == q.device(),
              "small_seq_tiled: k and v must be on the device of q (", q.device(), ")");
  const int64_t d = q.size(-1);
  TORCH_CHECK(small_seq_tiled_supports(static_cast<int>(d)), "small_seq_tiled: head dim ", d,
              " of q unsupported (64, 128, 256)");
  TORCH_CHECK(k.size(-1) == d, "small_seq_tiled: k head dim ", k.size(-1),
              " differs from q's ", d);
  const int64_t h_q = q.size(-2);
  const int64_t h_kv = k.size(-2);
  TORCH_CHECK(h_kv > 0 && h_q % h_kv == 0, "small_seq_tiled: the heads of q (", h_q,
              ") must be a multiple of the heads of k (", h_kv, ")");
  TORCH_CHECK(max_seqlen_q >= 1 && max_seqlen_q <= kTiledInt32Max,
              "small_seq_tiled: max_seqlen_q must be in 1..2^31-1, got ", max_seqlen_q);
  TORCH_CHECK(max_seqlen_kv >= 1 && max_seqlen_kv <= kSmallSeqTiledMaxSeqlenKv,
              "small_seq_tiled: max_seqlen_kv must be in 1..", kSmallSeqTiledMaxSeqlenKv,
              ", got ", max_seqlen_kv);
  const float scale = static_cast<float>(softmax_scale);
  TORCH_CHECK(std::isfinite(scale), "small_seq_tiled: softmax_scale must be finite in float32, "
              "got ", softmax_scale);
  check_rows_16b(q, "small_seq_tiled", "q");
  check_rows_16b(k, "small_seq_tiled", "k");
  check_rows_16b(v, "small_seq_tiled", "v");
  const SmallSeqPlan plan = decode_plan(plan_ints, "small_seq_tiled", "tiled_fwd_plan");

  SmallSeqTiledParams p{};
  p.num_heads_q = static_cast<int32_t>(h_q);
  p.num_heads_kv = static_cast<int32_t>(h_kv);
  p.softmax_scale = scale;
  fill_tiled_segments(p, q, k, cu_seqlens_q, cu_seqlens_kv, seqlens_kv, max_seqlen_q,
                      max_seqlen_kv, "small_seq_tiled");
  const int64_t total_q = p.total_q;
  tiled_row_strides(q, p.q_batch_stride, p.q_token_stride, p.q_head_stride);
  tiled_row_strides(k, p.k_batch_stride, p.k_token_stride, p.k_head_stride);
  tiled_row_strides(v, p.v_batch_stride, p.v_token_stride, p.v_head_stride);

  const c10::DeviceGuard guard(q.device());
  at::Tensor out = at::empty(q.sizes(), q.options());
  at::Tensor lse = at::empty({h_q, total_q}, q.options().dtype(at::kFloat));
  at::Tensor probs = return_softmax ? at::empty({total_q, h_q, max_seqlen_kv}, lse.options())
                                    : at::empty({0}, lse.options());
  at::Tensor row_max = want_row_max ? at::empty({h_q, total_q}, lse.options())
                                    : at::empty({0}, lse.options());
  if (p.batch == 0) {
    // No segment: every row of q is padding (the kernel has no work item to write it).
    out.zero_();
    lse.fill_(-std::numeric_limits<float>::infinity());
    probs.zero_();
    row_max.fill_(-std::numeric_limits<float>::infinity());
    return {out, lse, probs, row_max};
  }
  p.q = q.data_ptr();
  p.k = k.data_ptr();
  p.v = v.data_ptr();
  p.o = out.data_ptr();
  tiled_row_strides(out, p.o_batch_stride, p.o_token_stride, p.o_head_stride);
  p.lse = lse.data_ptr<float>();
  p.lse_head_stride = total_q;
  p.probs = return_softmax ? probs.data_ptr<float>() : nullptr;
  p.row_max = want_row_max ? row_max.data_ptr<float>() : nullptr;
  p.error_state = device_error_state(q, "small_seq_tiled");
  // The work queue's counter where the plan asks for one (zeroed on the stream: a graph
  // captures the fill), alive through the launch.
  at::Tensor work_queue;
  if (small_seq_plan_work_queue(plan)) {
    work_queue = at::zeros({1}, q.options().dtype(at::kLong));
    p.work_queue = reinterpret_cast<unsigned long long*>(work_queue.data_ptr<int64_t>());
  }
  const SmallSeqTiledDtype dtype = q.scalar_type() == at::kBFloat16
                                       ? SmallSeqTiledDtype::kBFloat16
                                       : SmallSeqTiledDtype::kFloat16;
  const hipError_t err = small_seq_tiled_fwd_launch(p, plan, dtype, static_cast<int>(d),
                                                    current_stream(q.device()));
  check_plan_launch(err, plan_ints, "small_seq_tiled",
                    "the Hopper warpgroup kernels need an sm_90a build on a 9.0 device; cp.async "
                    "staging a CUDA build",
                    "its head dim, GQA group, history or shared memory",
                    "small_seq tiled forward launch");
  return {out, lse, probs, row_max};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> small_seq_tiled_fwd(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
    const std::optional<at::Tensor>& cu_seqlens_q, const std::optional<at::Tensor>& cu_seqlens_kv,
    const std::optional<at::Tensor>& seqlens_kv, int64_t max_seqlen_q, int64_t max_seqlen_kv,
    double softmax_scale, bool return_softmax, at::IntArrayRef plan_ints) {
  auto [out, lse, probs, row_max] =
      tiled_fwd(q, k, v, cu_seqlens_q, cu_seqlens_kv, seqlens_kv, max_seqlen_q, max_seqlen_kv,
                softmax_scale, return_softmax, plan_ints, false);
  return {out, lse, probs};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> small_seq_tiled_fwd_row_max(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
    const std::optional<at::Tensor>& cu_seqlens_q, const std::optional<at::Tensor>& cu_seqlens_kv,
    const std::optional<at::Tensor>& seqlens_kv, int64_t max_seqlen_q, int64_t max_seqlen_kv,
    double softmax_scale, bool return_softmax, at::IntArrayRef plan_ints) {
  return tiled_fwd(q, k, v, cu_seqlens_q, cu_seqlens_kv, seqlens_kv, max_seqlen_q, max_seqlen_kv,
                   softmax_scale, return_softmax, plan_ints, true);
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(rocm_attn, m) {
  m.def(
      "small_seq_tiled_fwd(Tensor q, Tensor k, Tensor v, Tensor? cu_seqlens_q, "
      "Tensor? cu_seqlens_kv, Tensor? seqlens_kv, int max_seqlen_q, int max_seqlen_kv, "
      "float softmax_scale, bool return_softmax, int[] plan) -> (Tensor out, Tensor lse, "
      "Tensor probs)");
  m.def(
      "small_seq_tiled_fwd_row_max(Tensor q, Tensor k, Tensor v, Tensor? cu_seqlens_q, "
      "Tensor? cu_seqlens_kv, Tensor? seqlens_kv, int max_seqlen_q, int max_seqlen_kv, "
      "float softmax_scale, bool return_softmax, int[] plan) -> (Tensor out, Tensor lse, "
      "Tensor probs, Tensor row_max)");
}

TORCH_LIBRARY_IMPL(rocm_attn, CUDA, m) {
  m.impl("small_seq_tiled_fwd", &small_seq_tiled_fwd);
  m.impl("small_seq_tiled_fwd_row_max", &small_seq_tiled_fwd_row_max);
}
