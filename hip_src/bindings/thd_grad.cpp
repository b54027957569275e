// The THD gradient ops (rocm_attn::thd_grad_correction, thd_grad_correction_, thd_add_rows_)
// over the grad launcher (thd/grad.hip). rocm_attn/thd validates every argument; the checks
// here guard direct torch.ops callers.

#include <optional>
#include <vector>

#include "bindings/thd_rows.h"

namespace {

using namespace rocm_attn::bindings;

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

TORCH_LIBRARY_FRAGMENT(rocm_attn, m) {
  m.def("thd_add_rows_(Tensor(a!) grad, Tensor step, Tensor rows, Tensor? step_rows=None) -> ()");
  m.def(
      "thd_grad_correction(Tensor grad, Tensor grad_step, Tensor cu_seqlens_padded, "
      "int first_half_op, int second_half_op) -> Tensor");
  m.def(
      "thd_grad_correction_(Tensor(a!) grad, Tensor grad_step, Tensor cu_seqlens_padded, "
      "int first_half_op, int second_half_op) -> ()");
}

TORCH_LIBRARY_IMPL(rocm_attn, CUDA, m) {
  m.impl("thd_grad_correction", &thd_grad_correction);
  m.impl("thd_grad_correction_", &thd_grad_correction_);
  m.impl("thd_add_rows_", &thd_add_rows_);
}
