// The small-seq ops (rocm_attn::small_seq_fwd / small_seq_bwd / small_seq_fwd_row_max): tensor
// checks, params, stream, launch of the plan's kernel (`plan`: rocm_attn/small_seq_plan.py
// one_query_plans, whose records hip_src/small_seq/launch_impl.h switches on). User-facing
// validation with ValueErrors naming the argument lives in Python (rocm_attn/small_seq.py); the
// checks here guard direct torch.ops callers and the small-seq calls that go to the op first (a
// shape the kernels have already served), whose RuntimeError sends Python back to its own checks.

#include <limits>

#include "bindings/small_seq.h"
#include "bindings/small_seq_plan_arg.h"
#include "common/error_state.h"

namespace {

void check_index(const std::optional<at::Tensor>& t, const at::Tensor& q, int64_t numel,
                 const char* name) {
  if (!t) return;
  TORCH_CHECK(t->scalar_type() == at::kInt && t->dim() == 1 && t->is_contiguous() &&
                  t->numel() == numel && t->device() == q.device(),
              "small_seq: ", name, " must be a contiguous int32 [", numel,
              "] tensor on the device of q");
}

// Token / head strides of a [.., h, d] tensor viewed as rows of q (THD dim 0, BSHD dim 0).
void row_strides(const at::Tensor& t, int64_t& token, int64_t& head) {
  token = t.stride(0);
  head = t.stride(-2);
}

}  // namespace

namespace rocm_attn::bindings {

SmallSeqParams make_params(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                           const std::optional<at::Tensor>& cu_seqlens_q,
                           const std::optional<at::Tensor>& cu_seqlens_kv,
                           const std::optional<at::Tensor>& seqlens_kv, int64_t max_seqlen_kv,
                           double softmax_scale) {
  const bool thd = q.dim() == 3;
  TORCH_CHECK(thd || q.dim() == 4, "small_seq: q must be [total_q, h, d] or [b, 1, h, d]");
  TORCH_CHECK(k.dim() == q.dim() && v.dim() == q.dim(), "small_seq: q, k, v ranks differ");
  TORCH_CHECK(k.sizes() == v.sizes(), "small_seq: k and v shapes differ");
  TORCH_CHECK(k.scalar_type() == q.scalar_type() && v.scalar_type() == q.scalar_type(),
              "small_seq: q, k, v dtypes differ");
  TORCH_CHECK(k.device() == q.device() && v.device() == q.device(), "small_seq: devices differ");
  check_rows_16b(q, "small_seq", "q");
  check_rows_16b(k, "small_seq", "k");
  check_rows_16b(v, "small_seq", "v");
  TORCH_CHECK(max_seqlen_kv >= 1 && max_seqlen_kv <= 16, "small_seq: max_seqlen_kv must be in 1..16");

  SmallSeqParams p{};
  const int64_t d = q.size(-1);
  TORCH_CHECK(small_seq_supports(static_cast<int>(d)), "small_seq: head dim ", d,
              " unsupported (64, 128, 256, 512)");
  TORCH_CHECK(k.size(-1) == d, "small_seq: k head dim differs from q");
  p.num_heads_q = static_cast<int32_t>(q.size(-2));
  p.num_heads_kv = static_cast<int32_t>(k.size(-2));
  TORCH_CHECK(p.num_heads_kv > 0 && p.num_heads_q % p.num_heads_kv == 0,
              "small_seq: num_heads_q must be a multiple of num_heads_kv");
  p.q_head_stride = q.stride(-2);
  p.k_head_stride = k.stride(-2);
  p.v_head_stride = v.stride(-2);
  p.max_seqlen_kv = static_cast<int32_t>(max_seqlen_kv);
  p.softmax_scale = static_cast<float>(softmax_scale);
  if (thd) {
    TORCH_CHECK(cu_seqlens_q && cu_seqlens_kv && !seqlens_kv,
                "small_seq: THD needs cu_seqlens_q and cu_seqlens_kv");
    p.batch = static_cast<int32_t>(cu_seqlens_q->numel() - 1);
    TORCH_CHECK(q.size(0) == p.batch, "small_seq: q must have one row per segment");
    check_index(cu_seqlens_q, q, p.batch + 1, "cu_seqlens_q");
    check_index(cu_seqlens_kv, q, p.batch + 1, "cu_seqlens_kv");
    p.cu_seqlens_q = cu_seqlens_q->data_ptr<int32_t>();
    p.cu_seqlens_kv = cu_seqlens_kv->data_ptr<int32_t>();
    // Row counts are the kernels' bounds for the int32 offsets: they must be int32 themselves.
    TORCH_CHECK(q.size(0) <= INT32_MAX && k.size(0) <= INT32_MAX,
                "small_seq: q and k/v must have at most 2^31 - 1 rows (int32 cu_seqlens)");
    p.total_q = static_cast<int32_t>(q.size(0));
    p.total_kv = static_cast<int32_t>(k.size(0));
    p.q_token_stride = q.stride(0);
    p.k_token_stride = k.stride(0);
    p.v_token_stride = v.stride(0);
  } else {
    TORCH_CHECK(seqlens_kv && !cu_seqlens_q && !cu_seqlens_kv, "small_seq: BSHD needs seqlens_kv");
    TORCH_CHECK(q.size(1) == 1, "small_seq: BSHD q must be [b, 1, h, d]");
    TORCH_CHECK(k.size(0) == q.size(0) && k.size(1) <= 16, "small_seq: BSHD k must be [b, s<=16, h, d]");
    p.batch = static_cast<int32_t>(q.size(0));
    check_index(seqlens_kv, q, p.batch, "seqlens_kv");
    p.seqlens_kv = seqlens_kv->data_ptr<int32_t>();
    p.total_q = p.batch;
    p.total_kv = static_cast<int32_t>(k.size(1));
    p.kv_rows_per_batch = static_cast<int32_t>(k.size(1));
    p.q_token_stride = q.stride(0);
    p.k_token_stride = k.stride(1);
    p.v_token_stride = v.stride(1);
    p.k_batch_stride = k.stride(0);
    p.v_batch_stride = v.stride(0);
  }
  p.q = q.data_ptr();
  p.k = k.data_ptr();
  p.v = v.data_ptr();
  p.error_state = device_error_state(q, "small_seq");
  return p;
}

namespace {

// small_seq_fwd's work; row_max_out: nullptr (the plain forward), or where the [h_q, b] row
// maxima (each row's maximum scaled logit, indexed as the LSE) go, filled by the row_max
// kernels (small_seq_fwd_launch's row_max).
std::tuple<at::Tensor, at::Tensor, at::Tensor> one_query_fwd(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
    const std::optional<at::Tensor>& cu_seqlens_q, const std::optional<at::Tensor>& cu_seqlens_kv,
    const std::optional<at::Tensor>& seqlens_kv, int64_t max_seqlen_kv, double softmax_scale,
    bool return_softmax, at::IntArrayRef plan_ints, at::IntArrayRef backward_plan_ints,
    at::Tensor* row_max_out) {
  SmallSeqParams p =
      make_params(q, k, v, cu_seqlens_q, cu_seqlens_kv, seqlens_kv, max_seqlen_kv, softmax_scale);
  const SmallSeqPlan plan = decode_plan(plan_ints, "small_seq", "one_query_plans");
  decode_plan(backward_plan_ints, "small_seq", "one_query_plans", "backward_plan");
  const c10::DeviceGuard guard(q.device());
  at::Tensor out = at::empty(q.sizes(), q.options());
  at::Tensor lse = at::empty({p.num_heads_q, p.batch}, q.options().dtype(at::kFloat));
  at::Tensor probs = return_softmax
                         ? at::empty({p.batch, p.num_heads_q, max_seqlen_kv}, lse.options())
                         : at::empty({0}, lse.options());
  float* row_max = nullptr;
  if (row_max_out != nullptr) {
    *row_max_out = at::empty({p.num_heads_q, p.batch}, lse.options());
    row_max = row_max_out->data_ptr<float>();
  }
  p.o = out.data_ptr();
  row_strides(out, p.o_token_stride, p.o_head_stride);
  p.lse = lse.data_ptr<float>();
  p.probs = return_softmax ? probs.data_ptr<float>() : nullptr;
  check_plan_launch(small_seq_fwd_launch(p, plan, small_seq_dtype(q),
                                         static_cast<int>(q.size(-1)),
                                         current_stream(q.device()), row_max),
                    plan_ints, "small_seq", "not a one-query forward kernel", kOneQueryMisfit,
                    row_max != nullptr ? "small_seq forward (row_max)" : "small_seq forward");
  return {out, lse, probs};
}

// rocm_attn::small_seq_fwd_row_max: small_seq_fwd that also returns the row maxima, for
// fused_attn_small_seq(return_max_logit=True). An op of its own, so that small_seq_fwd's schema,
// outputs, autograd kernel and direct entry point stay as they are; its autograd (the same
// backward op) and fake impl are registered in rocm_attn/ops.py.
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> small_seq_fwd_row_max(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
    const std::optional<at::Tensor>& cu_seqlens_q, const std::optional<at::Tensor>& cu_seqlens_kv,
    const std::optional<at::Tensor>& seqlens_kv, int64_t max_seqlen_kv, double softmax_scale,
    bool return_softmax, at::IntArrayRef plan_ints, at::IntArrayRef backward_plan_ints) {
  at::Tensor row_max;
  auto [out, lse, probs] =
      one_query_fwd(q, k, v, cu_seqlens_q, cu_seqlens_kv, seqlens_kv, max_seqlen_kv,
                    softmax_scale, return_softmax, plan_ints, backward_plan_ints, &row_max);
  return {out, lse, probs, row_max};
}

}  // namespace

std::tuple<at::Tensor, at::Tensor, at::Tensor> small_seq_fwd(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
    const std::optional<at::Tensor>& cu_seqlens_q, const std::optional<at::Tensor>& cu_seqlens_kv,
    const std::optional<at::Tensor>& seqlens_kv, int64_t max_seqlen_kv, double softmax_scale,
    bool return_softmax, at::IntArrayRef plan_ints, at::IntArrayRef backward_plan_ints) {
  return one_query_fwd(q, k, v, cu_seqlens_q, cu_seqlens_kv, seqlens_kv, max_seqlen_kv,
                       softmax_scale, return_softmax, plan_ints, backward_plan_ints, nullptr);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> small_seq_bwd(
    const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
    const at::Tensor& out, const at::Tensor& lse, const std::optional<at::Tensor>& dlse,
    const std::optional<at::Tensor>& cu_seqlens_q, const std::optional<at::Tensor>& cu_seqlens_kv,
    const std::optional<at::Tensor>& seqlens_kv, int64_t max_seqlen_kv, double softmax_scale,
    at::IntArrayRef plan_ints) {
  SmallSeqParams p =
      make_params(q, k, v, cu_seqlens_q, cu_seqlens_kv, seqlens_kv, max_seqlen_kv, softmax_scale);
  const SmallSeqPlan plan = decode_plan(plan_ints, "small_seq backward", "one_query_plans");
  const c10::DeviceGuard guard(q.device());
  TORCH_CHECK(dout.sizes() == q.sizes() && out.sizes() == q.sizes() &&
                  dout.scalar_type() == q.scalar_type() && out.scalar_type() == q.scalar_type(),
              "small_seq backward: dout and out must match q");
  check_rows_16b(dout, "small_seq", "dout");
  check_rows_16b(out, "small_seq", "out");
  TORCH_CHECK(lse.scalar_type() == at::kFloat && lse.is_contiguous() && lse.dim() == 2 &&
                  lse.size(0) == p.num_heads_q && lse.size(1) == p.batch,
              "small_seq backward: lse must be contiguous float32 [h_q, b]");
  if (dlse) {
    TORCH_CHECK(dlse->scalar_type() == at::kFloat && dlse->is_contiguous() &&
                    dlse->sizes() == lse.sizes() && dlse->device() == q.device(),
                "small_seq backward: dlse must be contiguous float32 like lse");
    p.dlse = dlse->data_ptr<float>();
  }
  at::Tensor dq = at::empty(q.sizes(), q.options());
  at::Tensor dk = at::empty(k.sizes(), k.options());
  at::Tensor dv = at::empty(v.sizes(), v.options());
  p.dout = dout.data_ptr();
  p.out = out.data_ptr();
  p.lse = lse.data_ptr<float>();
  p.dq = dq.data_ptr();
  p.dk = dk.data_ptr();
  p.dv = dv.data_ptr();
  row_strides(dout, p.do_token_stride, p.do_head_stride);
  row_strides(out, p.o_token_stride, p.o_head_stride);
  row_strides(dq, p.dq_token_stride, p.dq_head_stride);
  p.dkv_head_stride = dk.stride(-2);
  p.dkv_token_stride = q.dim() == 3 ? dk.stride(0) : dk.stride(1);
  p.dkv_batch_stride = q.dim() == 3 ? 0 : dk.stride(0);
  check_plan_launch(small_seq_bwd_launch(p, plan, small_seq_dtype(q),
                                         static_cast<int>(q.size(-1)),
                                         current_stream(q.device())),
                    plan_ints, "small_seq backward", "not a one-query backward kernel",
                    kOneQueryMisfit, "small_seq backward");
  return {dq, dk, dv};
}

}  // namespace rocm_attn::bindings

TORCH_LIBRARY_FRAGMENT(rocm_attn, m) {
  m.def(
      "small_seq_fwd(Tensor q, Tensor k, Tensor v, Tensor? cu_seqlens_q, Tensor? cu_seqlens_kv, "
      "Tensor? seqlens_kv, int max_seqlen_kv, float softmax_scale, bool return_softmax, "
      "int[] plan, int[] backward_plan) -> (Tensor out, Tensor lse, Tensor probs)");
  m.def(
      "small_seq_bwd(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, "
      "Tensor? dlse, Tensor? cu_seqlens_q, Tensor? cu_seqlens_kv, Tensor? seqlens_kv, "
      "int max_seqlen_kv, float softmax_scale, int[] plan) -> (Tensor dq, Tensor dk, Tensor dv)");
  m.def(
      "small_seq_fwd_row_max(Tensor q, Tensor k, Tensor v, Tensor? cu_seqlens_q, "
      "Tensor? cu_seqlens_kv, Tensor? seqlens_kv, int max_seqlen_kv, float softmax_scale, "
      "bool return_softmax, int[] plan, int[] backward_plan) -> (Tensor out, Tensor lse, "
      "Tensor probs, Tensor row_max)");
}

TORCH_LIBRARY_IMPL(rocm_attn, CUDA, m) {
  m.impl("small_seq_fwd", &rocm_attn::bindings::small_seq_fwd);
  m.impl("small_seq_bwd", &rocm_attn::bindings::small_seq_bwd);
  m.impl("small_seq_fwd_row_max", &rocm_attn::bindings::small_seq_fwd_row_max);
}
