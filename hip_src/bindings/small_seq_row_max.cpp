// rocm_attn::small_seq_fwd_row_max: the one-query small-seq forward (rocm_attn::small_seq_fwd's
// checks, params and launch) that also writes each segment's maximum scaled logit per q head
// (row_max [h_q, b], indexed as the LSE; hip_src/small_seq/params.h small_seq_fwd_launch), for
// fused_attn_small_seq(return_max_logit=True). A separate op, so that small_seq_fwd's schema,
// outputs, autograd kernel and direct entry point stay as they are; its autograd (the same
// backward op) and fake impl are registered in rocm_attn/ops.py.

#include "bindings/small_seq.h"
#include "bindings/small_seq_plan_arg.h"

namespace {

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> small_seq_fwd_row_max(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
    const std::optional<at::Tensor>& cu_seqlens_q, const std::optional<at::Tensor>& cu_seqlens_kv,
    const std::optional<at::Tensor>& seqlens_kv, int64_t max_seqlen_kv, double softmax_scale,
    bool return_softmax, at::IntArrayRef plan_ints, at::IntArrayRef backward_plan_ints) {
  using namespace rocm_attn::bindings;
  SmallSeqParams p =
      make_params(q, k, v, cu_seqlens_q, cu_seqlens_kv, seqlens_kv, max_seqlen_kv, softmax_scale);
  const SmallSeqPlan plan = decode_plan(plan_ints, "small_seq", "one_query_plans");
  decode_plan(backward_plan_ints, "small_seq", "one_query_plans", "backward_plan");
  const c10::DeviceGuard guard(q.device());
  at::Tensor out = at::empty(q.sizes(), q.options());
  at::Tensor lse = at::empty({p.num_heads_q, p.batch}, q.options().dtype(at::kFloat));
  at::Tensor row_max = at::empty({p.num_heads_q, p.batch}, lse.options());
  at::Tensor probs = return_softmax
                         ? at::empty({p.batch, p.num_heads_q, max_seqlen_kv}, lse.options())
                         : at::empty({0}, lse.options());
  p.o = out.data_ptr();
  p.o_token_stride = out.stride(0);
  p.o_head_stride = out.stride(-2);
  p.lse = lse.data_ptr<float>();
  p.probs = return_softmax ? probs.data_ptr<float>() : nullptr;
  check_plan_launch(small_seq_fwd_launch(p, plan, small_seq_dtype(q),
                                         static_cast<int>(q.size(-1)),
                                         current_stream(q.device()), row_max.data_ptr<float>()),
                    plan_ints, "small_seq", "not a one-query forward kernel", kOneQueryMisfit,
                    "small_seq forward (row_max)");
  return {out, lse, probs, row_max};
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(rocm_attn, m) {
  m.def(
      "small_seq_fwd_row_max(Tensor q, Tensor k, Tensor v, Tensor? cu_seqlens_q, "
      "Tensor? cu_seqlens_kv, Tensor? seqlens_kv, int max_seqlen_kv, float softmax_scale, "
      "bool return_softmax, int[] plan, int[] backward_plan) -> (Tensor out, Tensor lse, "
      "Tensor probs, Tensor row_max)");
}

TORCH_LIBRARY_IMPL(rocm_attn, CUDA, m) { m.impl("small_seq_fwd_row_max", &small_seq_fwd_row_max); }
