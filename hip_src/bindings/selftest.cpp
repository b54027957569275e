// The self-test ops: compat.h's helpers and mma.h's tile products run by their test kernels
// (common/selftest_kernel.hip) on one wave, checked by tests/test_common_gpu.py.

#include <limits>

#include "bindings/torch_helpers.h"
#include "common/selftest_kernel.h"

namespace {

using rocm_attn::bindings::check_launch;
using rocm_attn::bindings::current_stream;

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

}  // namespace

TORCH_LIBRARY_FRAGMENT(rocm_attn, m) {
  m.def("compat_selftest(Tensor bf16_bits, Tensor fp16_bits, Tensor x) -> (Tensor, Tensor)");
  m.def(
      "mma_selftest(Tensor x_bits, Tensor y_bits, Tensor v_bits, int kv, int heads, int ny, "
      "int nv, int no, bool fp16) -> (Tensor, Tensor, Tensor, Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(rocm_attn, CUDA, m) {
  m.impl("compat_selftest", &compat_selftest);
  m.impl("mma_selftest", &mma_selftest);
}
