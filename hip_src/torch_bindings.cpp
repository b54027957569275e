// The only file under hip_src/ that includes torch: checks tensors, takes the current stream,
// calls the launchers and registers the ops (TORCH_LIBRARY). User-facing validation with
// ValueErrors naming the argument lives in Python (rocm_attn/small_seq.py); the checks here guard
// direct torch.ops callers and the small-seq calls that go to the op first (a shape the kernels
// have already served), whose RuntimeError sends Python back to its own checks.
// NOTE: a failed check whose message streamed a number once segfaulted on the GPU image: its
// toolchain links libstdc++ statically, so the extension carried its own stream code next to
// torch's (setup.py loaded_libstdcxx links the process's shared libstdc++ instead).

#include <Python.h>

#include <ATen/ATen.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/library.h>

#include <limits>
#include <optional>

#include "common/device_info.h"
#include "common/error_state.h"
#include "common/selftest_kernel.h"
#include "common/tuning.h"
#include "small_seq/params.h"
#include "thd/params.h"

namespace {

hipStream_t current_stream(const at::Device& device) {
  const c10::Stream stream = c10::impl::getDeviceGuardImpl(device.type())->getStream(device);
  return static_cast<hipStream_t>(stream.native_handle());
}

void check_launch(hipError_t err, const char* what) {
  TORCH_CHECK(err == hipSuccess, "rocm_attn: ", what, " failed: ", hipGetErrorString(err));
}

SmallSeqDtype small_seq_dtype(const at::Tensor& t) {
  TORCH_CHECK(t.scalar_type() == at::kHalf || t.scalar_type() == at::kBFloat16,
              "small_seq: expected float16 or bfloat16, got ", t.scalar_type());
  return t.scalar_type() == at::kBFloat16 ? SmallSeqDtype::kBFloat16 : SmallSeqDtype::kFloat16;
}

// 16-byte vector access needs 16-byte aligned rows: base pointer and every stride but the last.
void check_rows_16b(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.stride(-1) == 1, "small_seq: ", name, " must have a contiguous last dim");
  TORCH_CHECK(reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0, "small_seq: ", name,
              " must be 16-byte aligned");
  for (int64_t i = 0; i + 1 < t.dim(); ++i)
    TORCH_CHECK(t.stride(i) % 8 == 0 || t.size(i) == 1, "small_seq: ", name,
                " strides must be multiples of 8 elements");
}

void check_index(const std::optional<at::Tensor>& t, const at::Tensor& q, int64_t numel,
                 const char* name) {
  if (!t) return;
  TORCH_CHECK(t->scalar_type() == at::kInt && t->dim() == 1 && t->is_contiguous() &&
                  t->numel() == numel && t->device() == q.device(),
              "small_seq: ", name, " must be a contiguous int32 [", numel,
              "] tensor on the device of q");
}

// Fills the layout-dependent fields of the params. THD: q [total_q, h, d], k/v [total_kv, h, d].
// BSHD: q [b, 1, h, d], k/v [b, s, h, d].
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
  check_rows_16b(q, "q");
  check_rows_16b(k, "k");
  check_rows_16b(v, "v");
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
  p.error_state = ra_error_state_ptr();
  TORCH_CHECK(p.error_state != nullptr, "rocm_attn: could not reach the device error counter");
  return p;
}

// Token / head strides of a [.., h, d] tensor viewed as rows of q (THD dim 0, BSHD dim 0).
void row_strides(const at::Tensor& t, int64_t& token, int64_t& head) {
  token = t.stride(0);
  head = t.stride(-2);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> small_seq_fwd(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
    const std::optional<at::Tensor>& cu_seqlens_q, const std::optional<at::Tensor>& cu_seqlens_kv,
    const std::optional<at::Tensor>& seqlens_kv, int64_t max_seqlen_kv, double softmax_scale,
    bool return_softmax) {
  SmallSeqParams p =
      make_params(q, k, v, cu_seqlens_q, cu_seqlens_kv, seqlens_kv, max_seqlen_kv, softmax_scale);
  const c10::DeviceGuard guard(q.device());
  at::Tensor out = at::empty(q.sizes(), q.options());
  at::Tensor lse = at::empty({p.num_heads_q, p.batch}, q.options().dtype(at::kFloat));
  at::Tensor probs = return_softmax
                         ? at::empty({p.batch, p.num_heads_q, max_seqlen_kv}, lse.options())
                         : at::empty({0}, lse.options());
  p.o = out.data_ptr();
  row_strides(out, p.o_token_stride, p.o_head_stride);
  p.lse = lse.data_ptr<float>();
  p.probs = return_softmax ? probs.data_ptr<float>() : nullptr;
  check_launch(small_seq_fwd_launch(p, small_seq_dtype(q), static_cast<int>(q.size(-1)),
                                    current_stream(q.device())),
               "small_seq forward");
  return {out, lse, probs};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> small_seq_bwd(
    const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
    const at::Tensor& out, const at::Tensor& lse, const std::optional<at::Tensor>& dlse,
    const std::optional<at::Tensor>& cu_seqlens_q, const std::optional<at::Tensor>& cu_seqlens_kv,
    const std::optional<at::Tensor>& seqlens_kv, int64_t max_seqlen_kv, double softmax_scale) {
  SmallSeqParams p =
      make_params(q, k, v, cu_seqlens_q, cu_seqlens_kv, seqlens_kv, max_seqlen_kv, softmax_scale);
  const c10::DeviceGuard guard(q.device());
  TORCH_CHECK(dout.sizes() == q.sizes() && out.sizes() == q.sizes() &&
                  dout.scalar_type() == q.scalar_type() && out.scalar_type() == q.scalar_type(),
              "small_seq backward: dout and out must match q");
  check_rows_16b(dout, "dout");
  check_rows_16b(out, "out");
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
  check_launch(small_seq_bwd_launch(p, small_seq_dtype(q), static_cast<int>(q.size(-1)),
                                    current_stream(q.device())),
               "small_seq backward");
  return {dq, dk, dv};
}

// ------------------------------------------------------------------ small-seq autograd (C++)
// The op's Autograd kernel: one node whose backward runs the backward op, all in C++, so the
// autograd engine's device thread runs it without taking the Python GIL (a Python
// autograd.Function cost far more host time per backward: docs/kernels.md#small-seq-host-path).
// Both ops are re-dispatched, never called directly, so fake tensors (torch.compile)
// reach their fake impls. Gradients are not materialised: an output the loss does not use
// arrives undefined (dout undefined reads as zeros; dlse undefined adds no LSE term). The
// weights output is not differentiable.

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
      int64_t max_seqlen_kv, double softmax_scale, bool return_softmax) {
    static const auto op = c10::Dispatcher::singleton()
                               .findSchemaOrThrow("rocm_attn::small_seq_fwd", "")
                               .typed<decltype(small_seq_fwd)>();
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    auto [out, lse, probs] = op.call(q, k, v, cu_seqlens_q, cu_seqlens_kv, seqlens_kv,
                                     max_seqlen_kv, softmax_scale, return_softmax);
    ctx->set_materialize_grads(false);
    ctx->mark_non_differentiable({probs});
    ctx->save_for_backward({q, k, v, out, lse});
    ctx->saved_data["cu_seqlens_q"] = cu_seqlens_q;
    ctx->saved_data["cu_seqlens_kv"] = cu_seqlens_kv;
    ctx->saved_data["seqlens_kv"] = seqlens_kv;
    ctx->saved_data["max_seqlen_kv"] = max_seqlen_kv;
    ctx->saved_data["softmax_scale"] = softmax_scale;
    return {out, lse, probs};
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    static const auto op = c10::Dispatcher::singleton()
                               .findSchemaOrThrow("rocm_attn::small_seq_bwd", "")
                               .typed<decltype(small_seq_bwd)>();
    const at::Tensor& dout = grads[0];
    const at::Tensor& dlse = grads[1];
    torch::autograd::variable_list result(9);  // one per forward input; only q, k, v get one
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
                ctx->saved_data["softmax_scale"].toDouble());
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
    bool return_softmax) {
  auto outputs = SmallSeqFunction::apply(q, k, v, cu_seqlens_q, cu_seqlens_kv, seqlens_kv,
                                         max_seqlen_kv, softmax_scale, return_softmax);
  return {outputs[0], outputs[1], outputs[2]};
}

// Reads (and optionally clears) the current device's error counter: [count, first bad segment
// or -1]. Synchronises the device; never called on a default path.
std::vector<int64_t> read_error_state(bool reset) {
  int32_t state[2] = {0, 0};
  check_launch(ra_error_state_read(state, reset), "reading the device error counter");
  return {state[0], state[1] == 0 ? -1 : static_cast<int64_t>(0x7fffffff) - state[1]};
}

// Runs the compat.h test kernel over one wave; returns (out [wave, 18] float, vec [wave, 8]
// int16 bits). Inputs: bf16 bits, fp16 bits (int16 [wave]), x float [wave], all on the GPU.
std::tuple<at::Tensor, at::Tensor> compat_selftest(const at::Tensor& bf16_bits,
                                                   const at::Tensor& fp16_bits, const at::Tensor& x) {
  const c10::DeviceGuard guard(x.device());
  const int64_t wave = x.numel();
  TORCH_CHECK(wave == 32 || wave == 64, "compat_selftest: x must have one value per lane");
  TORCH_CHECK(bf16_bits.scalar_type() == at::kShort && fp16_bits.scalar_type() == at::kShort &&
                  x.scalar_type() == at::kFloat && bf16_bits.numel() == wave &&
                  fp16_bits.numel() == wave && bf16_bits.is_contiguous() &&
                  fp16_bits.is_contiguous() && x.is_contiguous(),
              "compat_selftest: int16 bits and float x of one wave, contiguous");
  at::Tensor out = at::empty({wave, kSelftestOutputs}, x.options());
  at::Tensor vec = at::empty({wave, 8}, bf16_bits.options());
  check_launch(compat_selftest_launch(static_cast<const uint16_t*>(bf16_bits.data_ptr()),
                                      static_cast<const uint16_t*>(fp16_bits.data_ptr()),
                                      x.data_ptr<float>(), out.data_ptr<float>(),
                                      static_cast<uint16_t*>(vec.data_ptr()),
                                      current_stream(x.device())),
               "compat selftest");
  return {out, vec};
}

// Runs the matrix-unit API test kernel (mma.h) on one wave. x, y, v: int16 bits [16, d] of bf16
// (or fp16 when `fp16`) values, contiguous, on the GPU; d in 64/128/256, kv in 4/8/16, heads
// 8/16. Returns (s [16, 16] float, NaN where no lane wrote; cover [16, 16] int32; o [16, d] int16
// bits, 0xffff (NaN) where not written; rowstat [16, 3] float; info [4] int32) as described in
// selftest_kernel.h.
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> mma_selftest(
    const at::Tensor& x, const at::Tensor& y, const at::Tensor& v, int64_t kv, int64_t heads,
    int64_t ny, int64_t nv, int64_t no, bool fp16) {
  const c10::DeviceGuard guard(x.device());
  const int64_t d = x.dim() == 2 ? x.size(1) : 0;
  for (const at::Tensor* t : {&x, &y, &v})
    TORCH_CHECK(t->scalar_type() == at::kShort && t->dim() == 2 && t->size(0) == 16 &&
                    t->size(1) == d && t->is_contiguous() && t->is_cuda(),
                "mma_selftest: x, y, v must be contiguous int16 [16, d] GPU tensors");
  TORCH_CHECK(y.device() == x.device() && v.device() == x.device(),
              "mma_selftest: x, y, v must be on one device");
  const auto f32 = x.options().dtype(at::kFloat);
  at::Tensor s = at::full({16, 16}, std::numeric_limits<float>::quiet_NaN(), f32);
  at::Tensor cover = at::zeros({16, 16}, x.options().dtype(at::kInt));
  at::Tensor o = at::full({16, d}, -1, x.options());
  at::Tensor rowstat = at::full({16, 3}, std::numeric_limits<float>::quiet_NaN(), f32);
  at::Tensor info = at::full({4}, -1, x.options().dtype(at::kInt));
  check_launch(
      mma_selftest_launch(static_cast<const uint16_t*>(x.data_ptr()),
                          static_cast<const uint16_t*>(y.data_ptr()),
                          static_cast<const uint16_t*>(v.data_ptr()), static_cast<int>(d),
                          static_cast<int>(kv), static_cast<int>(heads), static_cast<int>(ny),
                          static_cast<int>(nv), static_cast<int>(no), fp16, s.data_ptr<float>(),
                          cover.data_ptr<int32_t>(), static_cast<uint16_t*>(o.data_ptr()),
                          rowstat.data_ptr<float>(), info.data_ptr<int32_t>(),
                          current_stream(x.device())),
      "mma selftest");
  return {s, cover, o, rowstat, info};
}

// ---------------------------------------------------------------------------------------------
// THD context-parallel helpers (hip_src/thd). rocm_attn/thd/ validates every argument and
// calls these only for layouts they serve (it falls back to its torch path otherwise); the
// checks here are the last line of defence for direct torch.ops callers.
// ---------------------------------------------------------------------------------------------

// Dims [begin, end) of t merged into one dim (size, stride in elements); false when they do
// not merge. Size-1 dims are skipped; an empty range gives (1, 1).
bool thd_collapse(const at::Tensor& t, int64_t begin, int64_t end, int64_t& size, int64_t& stride) {
  size = 1;
  stride = 1;
  bool first = true;
  for (int64_t i = end - 1; i >= begin; --i) {
    const int64_t n = t.size(i);
    if (n == 1) continue;
    if (first) {
      size = n;
      stride = t.stride(i);
      first = false;
    } else if (t.stride(i) == stride * size) {
      size *= n;
    } else {
      return false;
    }
  }
  return true;
}

// Dims [begin, ndim) of tensors with one trailing shape as [heads, head_elems]: head_elems the
// trailing dims contiguous in every tensor, heads the dims before them merged (one stride per
// tensor). Mirrored by _row_split in rocm_attn/thd/_kernels.py.
bool thd_split_rows(const std::vector<const at::Tensor*>& ts, int64_t begin, int64_t& heads,
                    int64_t& head_elems, std::vector<int64_t>& head_strides) {
  const int64_t nd = ts.front()->dim();
  int64_t s = begin;
  for (; s < nd; ++s) {
    bool ok = true;
    for (const at::Tensor* t : ts) {
      int64_t n = 0, st = 0;
      ok = ok && thd_collapse(*t, s, nd, n, st) && (n == 1 || st == 1);
    }
    if (ok) break;
  }
  int64_t st = 0;
  thd_collapse(*ts.front(), s, nd, head_elems, st);
  head_strides.clear();
  for (const at::Tensor* t : ts) {
    int64_t n = 0, hs = 0;
    if (!thd_collapse(*t, begin, s, n, hs)) return false;
    heads = n;
    head_strides.push_back(hs);
  }
  return true;
}

int64_t thd_wrap_dim(int64_t dim, const at::Tensor& t) {
  TORCH_CHECK(dim >= -t.dim() && dim < t.dim(), "thd: dim ", dim, " out of range for ", t.dim(),
              " dims");
  return dim < 0 ? dim + t.dim() : dim;
}

void thd_check_cu(const at::Tensor& cu, const at::Tensor& ref, int64_t numel, const char* name) {
  TORCH_CHECK(cu.scalar_type() == at::kInt && cu.dim() == 1 && cu.is_contiguous() &&
                  cu.numel() >= 1 && (numel < 0 || cu.numel() == numel) &&
                  cu.device() == ref.device(),
              "thd: ", name, " must be a contiguous 1-D int32 tensor on the data's device");
  // b = numel - 1 is an int32 in the kernels (ThdRowMapParams::b)
  TORCH_CHECK(cu.numel() - 1 <= INT32_MAX, "thd: ", name, " has more than 2^31 - 1 sequences");
}

ThdRowMapParams thd_map(ThdRowMap kind, const at::Tensor& cu) {
  ThdRowMapParams m{};
  m.kind = kind;
  m.cu = cu.data_ptr<int32_t>();
  m.cu_dst = m.cu;
  m.cu_src = m.cu;
  m.b = static_cast<int32_t>(cu.numel() - 1);
  m.cp = 1;
  return m;
}

ThdRowMapParams thd_identity_map() {
  ThdRowMapParams m{};
  m.kind = ThdRowMap::kIdentity;
  m.cp = 1;
  return m;
}

// Raw-byte row copy src -> dst along token dim `dim` (shapes equal but for that dim).
ThdCopyParams thd_copy_params(const at::Tensor& src, const at::Tensor& dst, int64_t dim) {
  TORCH_CHECK(src.scalar_type() == dst.scalar_type() && src.device() == dst.device() &&
                  src.dim() == dst.dim(),
              "thd: src and dst must share dtype, device and rank");
  for (int64_t i = 0; i < dst.dim(); ++i)
    TORCH_CHECK(i == dim || src.size(i) == dst.size(i), "thd: src and dst shapes differ in dim ",
                i);
  const int64_t es = static_cast<int64_t>(dst.element_size());
  TORCH_CHECK(es == 2 || es == 4 || es == 8, "thd: kernels copy 2, 4 or 8-byte elements");
  ThdCopyParams p{};
  int64_t outer = 1, so = 0, dout = 1, dso = 0;
  TORCH_CHECK(thd_collapse(src, 0, dim, outer, so) && thd_collapse(dst, 0, dim, dout, dso),
              "thd: the dims before the token dim must merge into one");
  int64_t heads = 1, head_elems = 1;
  std::vector<int64_t> hs;
  TORCH_CHECK(thd_split_rows({&src, &dst}, dim + 1, heads, head_elems, hs),
              "thd: the dims after the token dim must be [heads, contiguous elements]");
  TORCH_CHECK(heads <= INT32_MAX && head_elems * es <= INT32_MAX, "thd: rows too large");
  p.src = src.data_ptr();
  p.dst = dst.data_ptr();
  p.rows = dst.size(dim);
  p.outer = outer;
  p.src_outer_stride = so * es;
  p.dst_outer_stride = dso * es;
  p.src_row_stride = src.stride(dim) * es;
  p.dst_row_stride = dst.stride(dim) * es;
  p.heads = static_cast<int32_t>(heads);
  p.head_bytes = static_cast<int32_t>(head_elems * es);
  p.src_head_stride = hs[0] * es;
  p.dst_head_stride = hs[1] * es;
  return p;
}

// partition (mode 0), reorder_to_contiguous (1), reorder_to_rank_sharded (2), read_half (3,
// `rank` is the half) into a new contiguous tensor.
at::Tensor thd_gather(const at::Tensor& x, const at::Tensor& cu_seqlens_padded, int64_t mode,
                      int64_t cp, int64_t rank, int64_t dim) {
  const c10::DeviceGuard guard(x.device());
  dim = thd_wrap_dim(dim, x);
  TORCH_CHECK(mode >= 0 && mode <= 3 && cp >= 1 && cp <= INT32_MAX && rank >= 0 &&
                  (mode == 3 ? rank <= 1 : rank < cp),
              "thd_gather: bad mode / cp / rank");
  thd_check_cu(cu_seqlens_padded, x, -1, "cu_seqlens_padded");
  const int64_t total = x.size(dim);
  const int64_t rows = mode == 0 ? total / cp : (mode == 3 ? total / 2 : total);
  std::vector<int64_t> sizes = x.sizes().vec();
  sizes[dim] = rows;
  at::Tensor out = at::empty(sizes, x.options());
  if (out.numel() == 0) return out;
  ThdCopyParams p = thd_copy_params(x, out, dim);
  p.map = thd_map(static_cast<ThdRowMap>(mode), cu_seqlens_padded);
  p.map.cp = static_cast<int32_t>(cp);
  p.map.rank = mode == 0 ? static_cast<int32_t>(rank) : 0;
  p.map.half = mode == 3 ? static_cast<int32_t>(rank) : 0;
  p.map.local_rows = mode == 3 ? total : total / cp;
  check_launch(thd_copy_rows_launch(p, current_stream(x.device())), "thd gather");
  return out;
}

// The bit pattern of `fill` in dst's dtype (converted as torch.full_like does), over 16 bytes.
void thd_fill_bits(double fill, at::ScalarType st, uint32_t (&out)[4]) {
  uint64_t bits = 0;
  int bytes = 0;
  switch (st) {
    case at::kFloat: {
      const float f = static_cast<float>(fill);
      uint32_t u = 0;
      std::memcpy(&u, &f, 4);
      bits = u;
      bytes = 4;
      break;
    }
    case at::kDouble:
      std::memcpy(&bits, &fill, 8);
      bytes = 8;
      break;
    case at::kHalf:
      bits = c10::Half(static_cast<float>(fill)).x;
      bytes = 2;
      break;
    case at::kBFloat16:
      bits = c10::BFloat16(static_cast<float>(fill)).x;
      bytes = 2;
      break;
    default:
      TORCH_CHECK(false, "thd: fill needs a float16, bfloat16, float32 or float64 dst");
  }
  unsigned char buf[16];
  for (int i = 0; i < 16; i += bytes) std::memcpy(buf + i, &bits, bytes);
  std::memcpy(out, buf, 16);
}

void thd_copy_valid_tokens_(at::Tensor& dst, const at::Tensor& src, const at::Tensor& cu_seqlens,
                            const std::optional<at::Tensor>& cu_seqlens_dst_padded,
                            const std::optional<at::Tensor>& cu_seqlens_src_padded, int64_t dim,
                            std::optional<double> fill) {
  const c10::DeviceGuard guard(dst.device());
  dim = thd_wrap_dim(dim, dst);
  thd_check_cu(cu_seqlens, dst, -1, "cu_seqlens");
  if (cu_seqlens_dst_padded)
    thd_check_cu(*cu_seqlens_dst_padded, dst, cu_seqlens.numel(), "cu_seqlens_dst_padded");
  if (cu_seqlens_src_padded)
    thd_check_cu(*cu_seqlens_src_padded, dst, cu_seqlens.numel(), "cu_seqlens_src_padded");
  ThdCopyParams p = thd_copy_params(src, dst, dim);
  if (dst.numel() == 0) return;
  p.map = thd_map(ThdRowMap::kCopyValid, cu_seqlens);
  if (cu_seqlens_dst_padded) p.map.cu_dst = cu_seqlens_dst_padded->data_ptr<int32_t>();
  if (cu_seqlens_src_padded) p.map.cu_src = cu_seqlens_src_padded->data_ptr<int32_t>();
  p.map.local_rows = dst.size(dim);  // cu_dst is clamped into dst's rows (index.h)
  p.map.src_rows = src.size(dim);
  if (fill) {
    p.fill = 1;
    thd_fill_bits(*fill, dst.scalar_type(), p.fill_bytes);
  }
  check_launch(thd_copy_rows_launch(p, current_stream(dst.device())), "thd copy_valid_tokens");
}

int32_t thd_math_dtype(const at::Tensor& t, const char* name) {
  switch (t.scalar_type()) {
    case at::kBFloat16:
      return kThdBFloat16;
    case at::kHalf:
      return kThdFloat16;
    case at::kFloat:
      return kThdFloat32;
    default:
      TORCH_CHECK(false, "thd: ", name, " must be bfloat16, float16 or float32");
  }
  return kThdFloat32;
}

// out [t, *heads, *rest] (heads: nh dims) as [t, H, D] with D contiguous.
void thd_out_view(const at::Tensor& o, int64_t nh, int64_t& h, int64_t& d, int64_t& tok,
                  int64_t& head, const char* name) {
  int64_t st = 0;
  TORCH_CHECK(o.dim() >= 1 + nh && thd_collapse(o, 1, 1 + nh, h, head) &&
                  thd_collapse(o, 1 + nh, o.dim(), d, st) && (d == 1 || st == 1),
              "thd: ", name, " must be [t, heads, contiguous elements]");
  tok = o.stride(0);
}

// LSE [*heads, t] float32 as [H, t].
void thd_lse_view(const at::Tensor& l, const at::Tensor& ref, int64_t& h, int64_t& head,
                  int64_t& tok, const char* name) {
  TORCH_CHECK(l.scalar_type() == at::kFloat && l.dim() >= 1 && l.device() == ref.device() &&
                  thd_collapse(l, 0, l.dim() - 1, h, head),
              "thd: ", name, " must be float32 [heads, t] on the data's device");
  tok = l.stride(-1);
}

// A row index of merge_rows / add_rows: contiguous int64 [n] on the data's device.
bool thd_is_row_index(const at::Tensor& idx, const at::Tensor& data, int64_t n) {
  return idx.scalar_type() == at::kLong && idx.dim() == 1 && idx.is_contiguous() &&
         idx.device() == data.device() && idx.numel() == n;
}

ThdMergeParams thd_merge_params(const std::optional<at::Tensor>& out, const at::Tensor& lse,
                                const std::optional<at::Tensor>& out_step,
                                const at::Tensor& lse_step,
                                const std::optional<at::Tensor>& cu_seqlens_padded,
                                bool only_second_half, bool correction,
                                const at::Tensor* rows = nullptr,
                                const at::Tensor* step_rows = nullptr) {
  ThdMergeParams p{};
  int64_t h = 0, h2 = 0;
  thd_lse_view(lse, lse, h, p.lse_head, p.lse_tok, "lse");
  thd_lse_view(lse_step, lse, h2, p.lse_step_head, p.lse_step_tok, "lse_step");
  const int64_t t = lse.size(-1);
  const int64_t step_tokens = lse_step.size(-1);
  p.n = step_tokens;
  if (rows != nullptr) {
    // step_rows: entry k reads step row step_rows[k] (a result laid out like out)
    p.n = rows->numel();
    TORCH_CHECK(thd_is_row_index(*rows, lse, p.n) && t > 0 &&
                 (step_rows != nullptr ? step_tokens > 0 : p.n == step_tokens),
             "thd merge_rows: rows must be a contiguous int64 [n] tensor on the device of lse, "
             "n = lse_step.size(-1) unless step_rows is given, and lse must have rows");
    TORCH_CHECK(step_rows == nullptr || thd_is_row_index(*step_rows, lse, p.n),
                "thd merge_rows: step_rows must be a contiguous int64 tensor like rows");
  } else {
    TORCH_CHECK(p.n == (only_second_half ? t / 2 : t) && (!only_second_half || t % 2 == 0),
             "thd merge: lse_step must be [heads, t] (or [heads, t/2] for only_second_half)");
  }
  TORCH_CHECK(lse_step.dim() == lse.dim() && h2 == h, "thd merge: lse_step heads differ from lse");
  TORCH_CHECK(h <= INT32_MAX, "thd merge: too many heads");
  p.heads = static_cast<int32_t>(h);
  p.lse = lse.data_ptr<float>();
  p.lse_step = lse_step.data_ptr<float>();
  TORCH_CHECK(out.has_value() == out_step.has_value() && (out.has_value() || !correction),
              "thd merge: out and out_step go together (and correction needs them)");
  if (out) {
    const int64_t nh = lse.dim() - 1;
    int64_t d = 0, d2 = 0, hh = 0, hh2 = 0;
    TORCH_CHECK(out->device() == lse.device() && out_step->device() == lse.device() &&
                    out->size(0) == t && out_step->size(0) == step_tokens &&
                    out->dim() == out_step->dim(),
                "thd merge: out [t, ...] / out_step [n, ...] do not match the LSEs");
    thd_out_view(*out, nh, hh, d, p.out_tok, p.out_head, "out");
    thd_out_view(*out_step, nh, hh2, d2, p.step_tok, p.step_head, "out_step");
    for (int64_t i = 1; i < out->dim(); ++i)
      TORCH_CHECK(out->size(i) == out_step->size(i) && (i > nh || out->size(i) == lse.size(i - 1)),
                  "thd merge: out, out_step and lse shapes differ");
    TORCH_CHECK(d <= INT32_MAX, "thd merge: rows too large");
    p.dim = static_cast<int32_t>(d);
    p.out = out->data_ptr();
    p.out_step = out_step->data_ptr();
    p.out_dtype = thd_math_dtype(*out, "out");
    p.step_dtype = thd_math_dtype(*out_step, "out_step");
  }
  p.correction = correction ? 1 : 0;
  if (rows != nullptr) {
    p.map = thd_identity_map();
    p.map.kind = ThdRowMap::kIndex;
    p.map.index = rows->data_ptr<int64_t>();
    p.map.local_rows = t;
    if (step_rows != nullptr) {
      p.map.step_index = step_rows->data_ptr<int64_t>();
      p.map.step_count = step_tokens;
    }
  } else if (only_second_half) {
    TORCH_CHECK(cu_seqlens_padded.has_value(),
                "thd merge: only_second_half needs cu_seqlens_padded");
    thd_check_cu(*cu_seqlens_padded, lse, -1, "cu_seqlens_padded");
    p.map = thd_map(ThdRowMap::kHalf, *cu_seqlens_padded);
    p.map.local_rows = t;
    p.map.half = 1;
  } else {
    p.map = thd_identity_map();
  }
  return p;
}

// merge_partial / lse_correction (correction=false) and out_correction (true) into new
// tensors: (out or empty [0], lse or empty [0]).
std::tuple<at::Tensor, at::Tensor> thd_merge(const std::optional<at::Tensor>& out,
                                             const at::Tensor& lse,
                                             const std::optional<at::Tensor>& out_step,
                                             const at::Tensor& lse_step,
                                             const std::optional<at::Tensor>& cu_seqlens_padded,
                                             bool only_second_half, bool correction) {
  const c10::DeviceGuard guard(lse.device());
  ThdMergeParams p = thd_merge_params(out, lse, out_step, lse_step, cu_seqlens_padded,
                                      only_second_half, correction);
  at::Tensor new_out =
      out ? at::empty(out->sizes(), out->options()) : at::empty({0}, lse.options());
  at::Tensor new_lse =
      correction ? at::empty({0}, lse.options()) : at::empty(lse.sizes(), lse.options());
  if (out && new_out.numel() > 0) {
    int64_t hh = 0, d = 0;
    thd_out_view(new_out, lse.dim() - 1, hh, d, p.dst_tok, p.dst_head, "out");
    p.out_dst = new_out.data_ptr();
  }
  if (!correction) {
    int64_t hh = 0;
    thd_lse_view(new_lse, lse, hh, p.lse_dst_head, p.lse_dst_tok, "lse");
    p.lse_dst = new_lse.data_ptr<float>();
  }
  p.copy_first_half = only_second_half ? 1 : 0;
  if (p.out_dst != nullptr || p.lse_dst != nullptr)
    check_launch(thd_merge_launch(p, current_stream(lse.device())), "thd merge");
  return {new_out, new_lse};
}

// Point a merge's outputs at its inputs (in-place merges; out may be absent: LSE only).
void thd_merge_in_place(ThdMergeParams& p, const at::Tensor* out, at::Tensor& lse) {
  if (out != nullptr && out->numel() > 0) {
    p.out_dst = out->data_ptr();
    p.dst_tok = p.out_tok;
    p.dst_head = p.out_head;
  }
  p.lse_dst = lse.data_ptr<float>();
  p.lse_dst_head = p.lse_head;
  p.lse_dst_tok = p.lse_tok;
}

// merge_partial / lse_correction in place (out may be absent: LSE only).
void thd_merge_(const std::optional<at::Tensor>& out, at::Tensor& lse,
                const std::optional<at::Tensor>& out_step, const at::Tensor& lse_step,
                const std::optional<at::Tensor>& cu_seqlens_padded, bool only_second_half) {
  const c10::DeviceGuard guard(lse.device());
  ThdMergeParams p = thd_merge_params(out, lse, out_step, lse_step, cu_seqlens_padded,
                                      only_second_half, false);
  thd_merge_in_place(p, out ? &*out : nullptr, lse);
  check_launch(thd_merge_launch(p, current_stream(lse.device())), "thd merge (in place)");
}

// In-place merge of packed step results: step row k into row rows[k] of (out, lse).
// With step_rows: entry k merges step row step_rows[k] into row rows[k].
void thd_merge_rows_(at::Tensor& out, at::Tensor& lse, const at::Tensor& out_step,
                     const at::Tensor& lse_step, const at::Tensor& rows,
                     const std::optional<at::Tensor>& step_rows) {
  const c10::DeviceGuard guard(lse.device());
  ThdMergeParams p = thd_merge_params(out, lse, out_step, lse_step, std::nullopt, false, false,
                                      &rows, step_rows ? &*step_rows : nullptr);
  thd_merge_in_place(p, &out, lse);
  check_launch(thd_merge_launch(p, current_stream(lse.device())), "thd merge_rows (in place)");
}

void thd_out_correction_(at::Tensor& out, const at::Tensor& out_step, const at::Tensor& lse,
                         const at::Tensor& lse_step,
                         const std::optional<at::Tensor>& cu_seqlens_padded,
                         bool only_second_half) {
  const c10::DeviceGuard guard(lse.device());
  ThdMergeParams p = thd_merge_params(out, lse, out_step, lse_step, cu_seqlens_padded,
                                      only_second_half, true);
  if (out.numel() == 0) return;
  p.out_dst = out.data_ptr();
  p.dst_tok = p.out_tok;
  p.dst_head = p.out_head;
  check_launch(thd_merge_launch(p, current_stream(lse.device())), "thd out_correction (in place)");
}

// The row side of a grad launch (pointers, strides, [heads, head_dim] split, dtypes) of grad,
// step and dst: shared by grad_correction and add_rows.
ThdGradParams thd_grad_rows(const at::Tensor& grad, const at::Tensor& step, const at::Tensor& dst,
                            const char* op, const char* step_name) {
  ThdGradParams p{};
  int64_t heads = 1, head_dim = 1;
  std::vector<int64_t> hs;
  TORCH_CHECK(thd_split_rows({&grad, &step, &dst}, 1, heads, head_dim, hs), "thd ", op,
              ": rows must be [heads, contiguous elements]");
  TORCH_CHECK(heads <= INT32_MAX && head_dim <= INT32_MAX, "thd ", op, ": rows too large");
  p.grad = grad.data_ptr();
  p.step = step.data_ptr();
  p.dst = dst.data_ptr();
  p.grad_tok = grad.stride(0);
  p.step_tok = step.stride(0);
  p.dst_tok = dst.stride(0);
  p.grad_head = hs[0];
  p.step_head = hs[1];
  p.dst_head = hs[2];
  p.heads = static_cast<int32_t>(heads);
  p.head_dim = static_cast<int32_t>(head_dim);
  p.grad_dtype = thd_math_dtype(grad, "grad");
  p.step_dtype = thd_math_dtype(step, step_name);
  return p;
}

ThdGradParams thd_grad_params(const at::Tensor& grad, const at::Tensor& grad_step,
                              const at::Tensor& cu_seqlens_padded, int64_t first_half_op,
                              int64_t second_half_op, const at::Tensor& dst) {
  TORCH_CHECK(grad.dim() >= 1 && grad_step.dim() == grad.dim() &&
                  grad_step.device() == grad.device(),
              "thd grad_correction: grad and grad_step must have one rank and device");
  for (int64_t i = 1; i < grad.dim(); ++i)
    TORCH_CHECK(grad.size(i) == grad_step.size(i), "thd grad_correction: shapes differ in dim ", i);
  TORCH_CHECK(first_half_op >= 0 && first_half_op <= 2 && second_half_op >= 0 &&
                  second_half_op <= 2,
              "thd grad_correction: ops are 0 none, 1 copy, 2 add");
  const int64_t t = grad.size(0);
  const int64_t ts = grad_step.size(0);
  const bool full = ts == t;
  TORCH_CHECK(t % 2 == 0 && (full || ts == t / 2),
              "thd grad_correction: grad_step must have t or t/2 rows");
  thd_check_cu(cu_seqlens_padded, grad, -1, "cu_seqlens_padded");
  ThdGradParams p = thd_grad_rows(grad, grad_step, dst, "grad_correction", "grad_step");
  p.op0 = static_cast<int32_t>(first_half_op);
  p.op1 = static_cast<int32_t>(second_half_op);
  p.step_is_half = full ? 0 : 1;
  if (full && first_half_op == second_half_op) {
    p.map = thd_identity_map();
    p.n = t;
  } else {
    p.map = thd_map(ThdRowMap::kHalf, cu_seqlens_padded);
    p.map.local_rows = t;
    p.n = t / 2;
  }
  return p;
}

at::Tensor thd_grad_correction(const at::Tensor& grad, const at::Tensor& grad_step,
                               const at::Tensor& cu_seqlens_padded, int64_t first_half_op,
                               int64_t second_half_op) {
  const c10::DeviceGuard guard(grad.device());
  at::Tensor dst = at::empty(grad.sizes(), grad.options());
  if (dst.numel() == 0) return dst;
  ThdGradParams p = thd_grad_params(grad, grad_step, cu_seqlens_padded, first_half_op,
                                    second_half_op, dst);
  p.copy_none = 1;
  check_launch(thd_grad_launch(p, current_stream(grad.device())), "thd grad_correction");
  return dst;
}

void thd_grad_correction_(at::Tensor& grad, const at::Tensor& grad_step,
                          const at::Tensor& cu_seqlens_padded, int64_t first_half_op,
                          int64_t second_half_op) {
  const c10::DeviceGuard guard(grad.device());
  if (grad.numel() == 0) return;
  ThdGradParams p = thd_grad_params(grad, grad_step, cu_seqlens_padded, first_half_op,
                                    second_half_op, grad);
  check_launch(thd_grad_launch(p, current_stream(grad.device())), "thd grad_correction (in place)");
}

// grad[rows[k]] += step[step_rows[k]] (step row k without step_rows), fp32 math, in place.
void thd_add_rows_(at::Tensor& grad, const at::Tensor& step, const at::Tensor& rows,
                   const std::optional<at::Tensor>& step_rows) {
  const c10::DeviceGuard guard(grad.device());
  TORCH_CHECK(grad.dim() >= 1 && step.dim() == grad.dim() && step.device() == grad.device(),
              "thd add_rows: grad and step must have one rank and device");
  for (int64_t i = 1; i < grad.dim(); ++i)
    TORCH_CHECK(grad.size(i) == step.size(i), "thd add_rows: shapes differ in dim ", i);
  const int64_t n = rows.numel();
  TORCH_CHECK(thd_is_row_index(rows, grad, n) &&
                  (step_rows ? step.size(0) > 0 : step.size(0) == n),
              "thd add_rows: rows must be a contiguous int64 [n] tensor on grad's device, "
              "n = step.size(0) unless step_rows is given");
  TORCH_CHECK(!step_rows || thd_is_row_index(*step_rows, grad, n),
              "thd add_rows: step_rows must be a contiguous int64 tensor like rows");
  if (grad.numel() == 0 || n == 0) return;
  ThdGradParams p = thd_grad_rows(grad, step, grad, "add_rows", "step");
  p.op0 = kThdGradAdd;
  p.op1 = kThdGradAdd;
  p.map = thd_identity_map();
  p.map.kind = ThdRowMap::kIndex;
  p.map.index = rows.data_ptr<int64_t>();
  p.map.local_rows = grad.size(0);
  if (step_rows) {
    p.map.step_index = step_rows->data_ptr<int64_t>();
    p.map.step_count = step.size(0);
  }
  p.n = n;
  check_launch(thd_grad_launch(p, current_stream(grad.device())), "thd add_rows (in place)");
}

}  // namespace

TORCH_LIBRARY(rocm_attn, m) {
  m.def(
      "small_seq_fwd(Tensor q, Tensor k, Tensor v, Tensor? cu_seqlens_q, Tensor? cu_seqlens_kv, "
      "Tensor? seqlens_kv, int max_seqlen_kv, float softmax_scale, bool return_softmax) "
      "-> (Tensor out, Tensor lse, Tensor probs)");
  m.def(
      "small_seq_bwd(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, "
      "Tensor? dlse, Tensor? cu_seqlens_q, Tensor? cu_seqlens_kv, Tensor? seqlens_kv, int max_seqlen_kv, "
      "float softmax_scale) -> (Tensor dq, Tensor dk, Tensor dv)");
  m.def("read_error_state(bool reset) -> int[]", &read_error_state);
  m.def("compat_selftest(Tensor bf16_bits, Tensor fp16_bits, Tensor x) -> (Tensor, Tensor)");
  m.def(
      "mma_selftest(Tensor x_bits, Tensor y_bits, Tensor v_bits, int kv, int heads, int ny, "
      "int nv, int no, bool fp16) -> (Tensor, Tensor, Tensor, Tensor, Tensor)");
  m.def(
      "thd_gather(Tensor x, Tensor cu_seqlens_padded, int mode, int cp, int rank, int dim) "
      "-> Tensor");
  m.def(
      "thd_copy_valid_tokens_(Tensor(a!) dst, Tensor src, Tensor cu_seqlens, "
      "Tensor? cu_seqlens_dst_padded, Tensor? cu_seqlens_src_padded, int dim, float? fill) -> ()");
  m.def(
      "thd_merge(Tensor? out, Tensor lse, Tensor? out_step, Tensor lse_step, "
      "Tensor? cu_seqlens_padded, bool only_second_half, bool correction) -> (Tensor, Tensor)");
  m.def(
      "thd_merge_(Tensor(a!)? out, Tensor(b!) lse, Tensor? out_step, Tensor lse_step, "
      "Tensor? cu_seqlens_padded, bool only_second_half) -> ()");
  m.def(
      "thd_merge_rows_(Tensor(a!) out, Tensor(b!) lse, Tensor out_step, Tensor lse_step, "
      "Tensor rows, Tensor? step_rows=None) -> ()");
  m.def("thd_add_rows_(Tensor(a!) grad, Tensor step, Tensor rows, Tensor? step_rows=None) -> ()");
  m.def(
      "thd_out_correction_(Tensor(a!) out, Tensor out_step, Tensor lse, Tensor lse_step, "
      "Tensor? cu_seqlens_padded, bool only_second_half) -> ()");
  m.def(
      "thd_grad_correction(Tensor grad, Tensor grad_step, Tensor cu_seqlens_padded, "
      "int first_half_op, int second_half_op) -> Tensor");
  m.def(
      "thd_grad_correction_(Tensor(a!) grad, Tensor grad_step, Tensor cu_seqlens_padded, "
      "int first_half_op, int second_half_op) -> ()");
}

TORCH_LIBRARY_IMPL(rocm_attn, Autograd, m) {
  m.impl("small_seq_fwd", &small_seq_fwd_autograd);
}

TORCH_LIBRARY_IMPL(rocm_attn, CUDA, m) {
  m.impl("small_seq_fwd", &small_seq_fwd);
  m.impl("small_seq_bwd", &small_seq_bwd);
  m.impl("compat_selftest", &compat_selftest);
  m.impl("mma_selftest", &mma_selftest);
  m.impl("thd_gather", &thd_gather);
  m.impl("thd_copy_valid_tokens_", &thd_copy_valid_tokens_);
  m.impl("thd_merge", &thd_merge);
  m.impl("thd_merge_", &thd_merge_);
  m.impl("thd_merge_rows_", &thd_merge_rows_);
  m.impl("thd_add_rows_", &thd_add_rows_);
  m.impl("thd_out_correction_", &thd_out_correction_);
  m.impl("thd_grad_correction", &thd_grad_correction);
  m.impl("thd_grad_correction_", &thd_grad_correction_);
}

namespace {

// Argument i as a plain tensor (torch.Tensor or Parameter, not a subclass); false otherwise.
bool plain_tensor(PyObject* const* args, int i, at::Tensor& out) {
  if (!THPVariable_CheckExact(args[i])) return false;
  out = THPVariable_Unpack(args[i]);
  return true;
}

bool plain_optional_tensor(PyObject* const* args, int i, std::optional<at::Tensor>& out) {
  if (args[i] == Py_None) {
    out = std::nullopt;
    return true;
  }
  at::Tensor t;
  if (!plain_tensor(args, i, t)) return false;
  out = std::move(t);
  return true;
}

// small_seq_fwd_direct(q, k, v, cu_seqlens_q, cu_seqlens_kv, seqlens_kv, max_seqlen_kv,
// softmax_scale, return_softmax) -> (out, lse, probs) or None.
// The op's own C++ function without the dispatcher: for eager calls that need no autograd,
// where boxing the nine arguments against the schema cost about a third of the host time of a
// small call (rocm_attn/ops.py small_seq_forward). Same checks, stream and device guard as the
// op; a failed check raises as the op does (RuntimeError). None when an argument is not a plain
// tensor / int / float / bool, e.g. a tensor subclass such as a fake tensor: the caller then
// takes the op, whose dispatch such subclasses rely on.
PyObject* small_seq_fwd_direct(PyObject* /*module*/, PyObject* const* args, Py_ssize_t nargs) {
  HANDLE_TH_ERRORS
  if (nargs != 9) {
    PyErr_SetString(PyExc_TypeError, "small_seq_fwd_direct takes 9 positional arguments");
    return nullptr;
  }
  at::Tensor q, k, v;
  std::optional<at::Tensor> cu_seqlens_q, cu_seqlens_kv, seqlens_kv;
  if (!plain_tensor(args, 0, q) || !plain_tensor(args, 1, k) || !plain_tensor(args, 2, v) ||
      !plain_optional_tensor(args, 3, cu_seqlens_q) ||
      !plain_optional_tensor(args, 4, cu_seqlens_kv) ||
      !plain_optional_tensor(args, 5, seqlens_kv) || !PyLong_CheckExact(args[6]) ||
      !PyFloat_CheckExact(args[7]) || !PyBool_Check(args[8]))
    Py_RETURN_NONE;
  int overflow = 0;
  const long long max_seqlen_kv = PyLong_AsLongLongAndOverflow(args[6], &overflow);
  if (overflow != 0) Py_RETURN_NONE;  // the op's path reports it
  auto [out, lse, probs] =
      small_seq_fwd(q, k, v, cu_seqlens_q, cu_seqlens_kv, seqlens_kv, max_seqlen_kv,
                    PyFloat_AS_DOUBLE(args[7]), args[8] == Py_True);
  PyObject* result = PyTuple_New(3);
  if (result == nullptr) return nullptr;
  PyTuple_SET_ITEM(result, 0, THPVariable_Wrap(std::move(out)));
  PyTuple_SET_ITEM(result, 1, THPVariable_Wrap(std::move(lse)));
  PyTuple_SET_ITEM(result, 2, THPVariable_Wrap(std::move(probs)));
  return result;
  END_HANDLE_TH_ERRORS
}

// overlapped_launch() -> bool: whether kernels launched through ra_launch (the THD helpers) may
// start while the kernel before them drains, on the current device (benchmark reports).
PyObject* overlapped_launch(PyObject* /*module*/, PyObject* /*unused*/) {
  if (ra_device_overlapped_launch()) Py_RETURN_TRUE;
  Py_RETURN_FALSE;
}

// tuning() -> {name: (value, environment variable)}: the launch tuning values (common/tuning.h).
PyObject* tuning(PyObject* /*module*/, PyObject* /*unused*/) {
  const RaTuning& t = ra_tuning();
  PyObject* result = PyDict_New();
  if (result == nullptr) return nullptr;
  for (const RaTuningKnob& knob : kRaTuningKnobs) {
    PyObject* entry = Py_BuildValue("(is)", t.*knob.field, knob.env);
    if (entry == nullptr || PyDict_SetItemString(result, knob.name, entry) != 0) {
      Py_XDECREF(entry);
      Py_DECREF(result);
      return nullptr;
    }
    Py_DECREF(entry);
  }
  return result;
}

// set_tuning(name, value) -> previous value; KeyError for an unknown name.
PyObject* set_tuning(PyObject* /*module*/, PyObject* args) {
  const char* name = nullptr;
  int value = 0;
  if (!PyArg_ParseTuple(args, "si", &name, &value)) return nullptr;
  int old = 0;
  if (!ra_set_tuning(name, value, &old)) {
    PyErr_Format(PyExc_KeyError, "unknown tuning name %s", name);
    return nullptr;
  }
  return PyLong_FromLong(old);
}

PyMethodDef module_methods[] = {
    {"tuning", &tuning, METH_NOARGS, "launch tuning values: {name: (value, environment variable)}"},
    {"set_tuning", &set_tuning, METH_VARARGS, "set_tuning(name, value) -> previous value"},
    {"overlapped_launch", &overlapped_launch, METH_NOARGS,
     "whether THD helper launches overlap the kernel before them (CUDA sm_90+, tuning pdl)"},
    {"small_seq_fwd_direct", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(
                                 &small_seq_fwd_direct)),
     METH_FASTCALL, "small_seq_fwd without the dispatcher (eager calls without autograd)"},
    {nullptr, nullptr, 0, nullptr}};

}  // namespace

// `import rocm_attn._C` loads this library, which registers the ops above; the Python module
// holds only the direct entry point of the small-seq forward.
extern "C" PyObject* PyInit__C() {
  ra_tuning();  // the environment's tuning values are read here, once (common/tuning.h)
  static PyModuleDef module = {PyModuleDef_HEAD_INIT, "_C", nullptr, -1, module_methods};
  return PyModule_Create(&module);
}
