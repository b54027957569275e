// The only file under hip_src/ that includes torch: checks tensors, takes the current stream,
// calls the launchers and registers the ops (TORCH_LIBRARY). User-facing validation with
// ValueErrors naming the argument lives in Python (rocm_attn/small_seq.py); the checks here are
// the last line of defence for direct torch.ops callers.
#include <Python.h>

#include <ATen/ATen.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/library.h>

#include <optional>

#include "common/error_state.h"
#include "common/selftest_kernel.h"
#include "small_seq/params.h"

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
              "small_seq: ", name, " must be a contiguous int32 [", numel, "] tensor on ",
              q.device());
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
}

TORCH_LIBRARY_IMPL(rocm_attn, CUDA, m) {
  m.impl("small_seq_fwd", &small_seq_fwd);
  m.impl("small_seq_bwd", &small_seq_bwd);
  m.impl("compat_selftest", &compat_selftest);
}

// `import rocm_attn._C` loads this library, which registers the ops above; the Python module
// itself is empty.
extern "C" PyObject* PyInit__C() {
  static PyModuleDef module = {PyModuleDef_HEAD_INIT, "_C", nullptr, -1, nullptr};
  return PyModule_Create(&module);
}
