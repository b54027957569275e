// The op's Autograd kernel: one node whose backward runs the backward op, all in C++, so the
// autograd engine's device thread runs it without taking the Python GIL (a Python
// autograd.Function cost far more host time per backward: docs/kernels.md#small-seq-host-path).
// Both ops are re-dispatched, never called directly, so fake tensors (torch.compile)
// reach their fake impls. Gradients are not materialised: an output the loss does not use
// arrives undefined (dout undefined reads as zeros; dlse undefined adds no LSE term). The
// weights output is not differentiable. The backward runs the forward's `backward_plan` (made
// with the forward's plan in Python: the backward needs no Python).

#include <torch/csrc/autograd/custom_function.h>

#include "bindings/small_seq.h"

namespace {

using rocm_attn::bindings::small_seq_bwd;
using rocm_attn::bindings::small_seq_fwd;

// The backward's gradients when it runs with create_graph=True: their node hangs off q, k, v
// (the inputs a second derivative is taken with respect to), and differentiating through it
// raises instead of silently treating the kernels' backward as constant.
struct NoSecondDerivative : public torch::autograd::Function<NoSecondDerivative> {
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* /*ctx*/,
                                                const at::Tensor& dq, const at::Tensor& dk,
                                                const at::Tensor& dv, const at::Tensor& /*q*/,
                                                const at::Tensor& /*k*/,
                                                const at::Tensor& /*v*/) {
    return {dq, dk, dv};
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* /*ctx*/,
                                                 torch::autograd::variable_list /*grads*/) {
    TORCH_CHECK(false,
                "rocm_attn: fused_attn_small_seq has no second derivative (its gradients were "
                "computed with create_graph=True and are now being differentiated)");
  }
};

struct SmallSeqFunction : public torch::autograd::Function<SmallSeqFunction> {
  static torch::autograd::variable_list forward(
      torch::autograd::AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k,
      const at::Tensor& v, const std::optional<at::Tensor>& cu_seqlens_q,
      const std::optional<at::Tensor>& cu_seqlens_kv, const std::optional<at::Tensor>& seqlens_kv,
      int64_t max_seqlen_kv, double softmax_scale, bool return_softmax, at::IntArrayRef plan,
      at::IntArrayRef backward_plan) {
    static const auto op = c10::Dispatcher::singleton()
                               .findSchemaOrThrow("rocm_attn::small_seq_fwd", "")
                               .typed<decltype(small_seq_fwd)>();
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    auto [out, lse, probs] = op.call(q, k, v, cu_seqlens_q, cu_seqlens_kv, seqlens_kv,
                                     max_seqlen_kv, softmax_scale, return_softmax, plan,
                                     backward_plan);
    ctx->set_materialize_grads(false);
    ctx->mark_non_differentiable({probs});
    ctx->save_for_backward({q, k, v, out, lse});
    ctx->saved_data["cu_seqlens_q"] = cu_seqlens_q;
    ctx->saved_data["cu_seqlens_kv"] = cu_seqlens_kv;
    ctx->saved_data["seqlens_kv"] = seqlens_kv;
    ctx->saved_data["max_seqlen_kv"] = max_seqlen_kv;
    ctx->saved_data["softmax_scale"] = softmax_scale;
    ctx->saved_data["backward_plan"] = backward_plan.vec();
    return {out, lse, probs};
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    static const auto op = c10::Dispatcher::singleton()
                               .findSchemaOrThrow("rocm_attn::small_seq_bwd", "")
                               .typed<decltype(small_seq_bwd)>();
    const at::Tensor& dout = grads[0];
    const at::Tensor& dlse = grads[1];
    torch::autograd::variable_list result(11);  // one per forward input; only q, k, v get one
    if (!dout.defined() && !dlse.defined()) return result;
    const auto saved = ctx->get_saved_variables();  // q, k, v, out, lse
    auto optional = [&](const char* name) {
      return ctx->saved_data[name].toOptional<at::Tensor>();
    };
    const bool create_graph = at::GradMode::is_enabled();
    at::NoGradGuard no_grad;
    auto [dq, dk, dv] =
        op.call(dout.defined() ? dout.contiguous() : at::zeros_like(saved[3]), saved[0], saved[1],
                saved[2], saved[3], saved[4],
                dlse.defined() ? std::optional<at::Tensor>(dlse.contiguous()) : std::nullopt,
                optional("cu_seqlens_q"), optional("cu_seqlens_kv"), optional("seqlens_kv"),
                ctx->saved_data["max_seqlen_kv"].toInt(),
                ctx->saved_data["softmax_scale"].toDouble(),
                ctx->saved_data["backward_plan"].toIntVector());
    if (create_graph) {
      at::AutoGradMode grad_mode(true);
      auto guarded = NoSecondDerivative::apply(dq, dk, dv, saved[0], saved[1], saved[2]);
      dq = guarded[0];
      dk = guarded[1];
      dv = guarded[2];
    }
    result[0] = dq;
    result[1] = dk;
    result[2] = dv;
    return result;
  }
};

std::tuple<at::Tensor, at::Tensor, at::Tensor> small_seq_fwd_autograd(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
    const std::optional<at::Tensor>& cu_seqlens_q, const std::optional<at::Tensor>& cu_seqlens_kv,
    const std::optional<at::Tensor>& seqlens_kv, int64_t max_seqlen_kv, double softmax_scale,
    bool return_softmax, at::IntArrayRef plan, at::IntArrayRef backward_plan) {
  auto outputs = SmallSeqFunction::apply(q, k, v, cu_seqlens_q, cu_seqlens_kv, seqlens_kv,
                                         max_seqlen_kv, softmax_scale, return_softmax, plan,
                                         backward_plan);
  return {outputs[0], outputs[1], outputs[2]};
}

}  // namespace

TORCH_LIBRARY_IMPL(rocm_attn, Autograd, m) {
  m.impl("small_seq_fwd", &small_seq_fwd_autograd);
}
