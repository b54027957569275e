// rocm_attn::small_seq_tiled_bwd: the tiled small-seq backward (any number of queries per
// segment, long histories, int32 or int64 offsets) as a torch op. Checks the tensors, allocates
// dq / dk / dv (contiguous) and the fp32 Delta workspace, takes the current stream and launches
// (hip_src/small_seq/tiled_bwd_launch.hip). User-facing validation with ValueErrors naming the
// argument lives in Python (rocm_attn/small_seq.py); the checks here guard direct torch.ops
// callers, each message naming the argument. Offsets are never read on the host (no sync): the
// kernels resolve every segment against the contract (docs/kernels.md#tiled-small-seq-backward).

#include <ATen/ATen.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/library.h>

#include <cmath>
#include <limits>
#include <optional>
#include <tuple>

#include "bindings/small_seq_plan_arg.h"
#include "bindings/small_seq_tiled.h"
#include "small_seq/tiled_params.h"

namespace {

using rocm_attn::bindings::check_plan_launch;
using rocm_attn::bindings::check_rows_16b;
using rocm_attn::bindings::current_stream;
using rocm_attn::bindings::decode_plan;
using rocm_attn::bindings::fill_tiled_segments;
using rocm_attn::bindings::kTiledInt32Max;
using rocm_attn::bindings::tiled_row_strides;

std::tuple<at::Tensor, at::Tensor, at::Tensor> small_seq_tiled_bwd(
    const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
    const at::Tensor& out, const at::Tensor& lse, const std::optional<at::Tensor>& dlse,
    const std::optional<at::Tensor>& cu_seqlens_q, const std::optional<at::Tensor>& cu_seqlens_kv,
    const std::optional<at::Tensor>& seqlens_kv, int64_t max_seqlen_q, int64_t max_seqlen_kv,
    double softmax_scale, at::IntArrayRef plan_ints) {
  const bool thd = q.dim() == 3;
  TORCH_CHECK(thd || q.dim() == 4,
              "small_seq_tiled_bwd: q must be [total_q, h_q, d] (THD) or [b, s_q, h_q, d] "
              "(BSHD), got shape ", q.sizes());
  TORCH_CHECK(k.dim() == q.dim(), "small_seq_tiled_bwd: k must have the rank of q (", q.dim(),
              "), got shape ", k.sizes());
  TORCH_CHECK(v.sizes() == k.sizes(), "small_seq_tiled_bwd: v must have the shape of k ",
              k.sizes(), ", got ", v.sizes());
  TORCH_CHECK(q.scalar_type() == at::kHalf || q.scalar_type() == at::kBFloat16,
              "small_seq_tiled_bwd: q must be float16 or bfloat16, got ", q.scalar_type());
  TORCH_CHECK(k.scalar_type() == q.scalar_type() && v.scalar_type() == q.scalar_type(),
              "small_seq_tiled_bwd: k and v must have the dtype of q (", q.scalar_type(), ")");
  TORCH_CHECK(dout.sizes() == q.sizes() && dout.scalar_type() == q.scalar_type(),
              "small_seq_tiled_bwd: dout must have the shape and dtype of q ", q.sizes(), " ",
              q.scalar_type(), ", got ", dout.sizes(), " ", dout.scalar_type());
  TORCH_CHECK(out.sizes() == q.sizes() && out.scalar_type() == q.scalar_type(),
              "small_seq_tiled_bwd: out must have the shape and dtype of q ", q.sizes(), " ",
              q.scalar_type(), ", got ", out.sizes(), " ", out.scalar_type());
  TORCH_CHECK(q.is_cuda(), "small_seq_tiled_bwd: q must be on a GPU, got ", q.device());
  for (const auto& [t, name] : {std::pair<const at::Tensor&, const char*>{k, "k"}, {v, "v"},
                                {dout, "dout"}, {out, "out"}, {lse, "lse"}})
    TORCH_CHECK(t.device() == q.device(), "small_seq_tiled_bwd: ", name,
                " must be on the device of q (", q.device(), "), got ", t.device());
  const int64_t d = q.size(-1);
  TORCH_CHECK(small_seq_tiled_supports(static_cast<int>(d)), "small_seq_tiled_bwd: head dim ",
              d, " of q unsupported (64, 128, 256)");
  TORCH_CHECK(k.size(-1) == d, "small_seq_tiled_bwd: k head dim ", k.size(-1),
              " differs from q's ", d);
  const int64_t h_q = q.size(-2);
  const int64_t h_kv = k.size(-2);
  TORCH_CHECK(h_kv > 0 && h_q % h_kv == 0, "small_seq_tiled_bwd: the heads of q (", h_q,
              ") must be a multiple of the heads of k (", h_kv, ")");
  TORCH_CHECK(max_seqlen_q >= 1 && max_seqlen_q <= kTiledInt32Max,
              "small_seq_tiled_bwd: max_seqlen_q must be in 1..2^31-1, got ", max_seqlen_q);
  TORCH_CHECK(max_seqlen_kv >= 1 && max_seqlen_kv <= kSmallSeqTiledMaxSeqlenKv,
              "small_seq_tiled_bwd: max_seqlen_kv must be in 1..", kSmallSeqTiledMaxSeqlenKv,
              ", got ", max_seqlen_kv);
  const float scale = static_cast<float>(softmax_scale);
  TORCH_CHECK(std::isfinite(scale),
              "small_seq_tiled_bwd: softmax_scale must be finite in float32, got ",
              softmax_scale);
  check_rows_16b(q, "small_seq_tiled_bwd", "q");
  check_rows_16b(k, "small_seq_tiled_bwd", "k");
  check_rows_16b(v, "small_seq_tiled_bwd", "v");
  const SmallSeqPlan plan = decode_plan(plan_ints, "small_seq_tiled_bwd", "tiled_bwd_plan");
  check_rows_16b(dout, "small_seq_tiled_bwd", "dout");
  check_rows_16b(out, "small_seq_tiled_bwd", "out");

  SmallSeqTiledParams p{};
  p.num_heads_q = static_cast<int32_t>(h_q);
  p.num_heads_kv = static_cast<int32_t>(h_kv);
  p.softmax_scale = scale;
  fill_tiled_segments(p, q, k, cu_seqlens_q, cu_seqlens_kv, seqlens_kv, max_seqlen_q,
                      max_seqlen_kv, "small_seq_tiled_bwd");
  const int64_t total_q = p.total_q;
  TORCH_CHECK(lse.scalar_type() == at::kFloat && lse.dim() == 2 && lse.size(0) == h_q &&
                  lse.size(1) == total_q && lse.is_contiguous(),
              "small_seq_tiled_bwd: lse must be contiguous float32 [h_q, total_q] = [", h_q,
              ", ", total_q, "], got ", lse.scalar_type(), " ", lse.sizes());
  if (dlse.has_value()) {
    TORCH_CHECK(dlse->scalar_type() == at::kFloat && dlse->sizes() == lse.sizes() &&
                    dlse->is_contiguous() && dlse->device() == q.device(),
                "small_seq_tiled_bwd: dlse must be contiguous float32 like lse ", lse.sizes(),
                " on ", q.device(), ", got ", dlse->scalar_type(), " ", dlse->sizes());
  }

  const c10::DeviceGuard guard(q.device());
  at::Tensor dq = at::empty(q.sizes(), q.options());
  at::Tensor dk = at::empty(k.sizes(), k.options());
  at::Tensor dv = at::empty(k.sizes(), k.options());
  if (p.batch == 0 || h_q == 0) {
    // No segment: every row of q is padding and no k / v row is covered.
    dq.zero_();
    dk.zero_();
    dv.zero_();
    return {dq, dk, dv};
  }
  at::Tensor workspace = at::empty({h_q * total_q}, lse.options());
  p.q = q.data_ptr();
  p.k = k.data_ptr();
  p.v = v.data_ptr();
  p.dout = dout.data_ptr();
  p.out = out.data_ptr();
  p.lse = lse.data_ptr<float>();
  p.lse_head_stride = total_q;
  p.dlse = dlse.has_value() ? dlse->data_ptr<float>() : nullptr;
  p.dlse_head_stride = total_q;
  p.dq = dq.data_ptr();
  p.dk = dk.data_ptr();
  p.dv = dv.data_ptr();
  p.workspace = workspace.data_ptr<float>();
  p.workspace_elems = workspace.numel();
  tiled_row_strides(q, p.q_batch_stride, p.q_token_stride, p.q_head_stride);
  tiled_row_strides(k, p.k_batch_stride, p.k_token_stride, p.k_head_stride);
  tiled_row_strides(v, p.v_batch_stride, p.v_token_stride, p.v_head_stride);
  tiled_row_strides(dout, p.do_batch_stride, p.do_token_stride, p.do_head_stride);
  tiled_row_strides(out, p.out_batch_stride, p.out_token_stride, p.out_head_stride);
  tiled_row_strides(dq, p.dq_batch_stride, p.dq_token_stride, p.dq_head_stride);
  tiled_row_strides(dk, p.dk_batch_stride, p.dk_token_stride, p.dk_head_stride);
  tiled_row_strides(dv, p.dv_batch_stride, p.dv_token_stride, p.dv_head_stride);
  const SmallSeqTiledDtype dtype = q.scalar_type() == at::kBFloat16
                                       ? SmallSeqTiledDtype::kBFloat16
                                       : SmallSeqTiledDtype::kFloat16;
  const hipError_t err =
      small_seq_tiled_bwd_launch(p, plan, dtype, static_cast<int>(d), current_stream(q.device()));
  check_plan_launch(err, plan_ints, "small_seq_tiled_bwd",
                    "the Hopper warpgroup kernels need an sm_90a build on a 9.0 device",
                    "its head dim, GQA group, rows, history or shared memory",
                    "small_seq tiled backward launch");
  return {dq, dk, dv};
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(rocm_attn, m) {
  m.def(
      "small_seq_tiled_bwd(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, "
      "Tensor? dlse, Tensor? cu_seqlens_q, Tensor? cu_seqlens_kv, Tensor? seqlens_kv, "
      "int max_seqlen_q, int max_seqlen_kv, float softmax_scale, int[] plan) -> (Tensor dq, "
      "Tensor dk, "
      "Tensor dv)");
}

TORCH_LIBRARY_IMPL(rocm_attn, CUDA, m) { m.impl("small_seq_tiled_bwd", &small_seq_tiled_bwd); }
