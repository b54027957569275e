// The THD merge ops (rocm_attn::thd_merge, thd_merge_, thd_merge_rows_, thd_out_correction_:
// merge_partial, lse_correction, out_correction) over the merge launcher (thd/merge.hip).
// rocm_attn/thd validates every argument; the checks here guard direct torch.ops callers.

#include <optional>
#include <tuple>

#include "bindings/thd_rows.h"

namespace {

using namespace rocm_attn::bindings;

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

}  // namespace

TORCH_LIBRARY_FRAGMENT(rocm_attn, m) {
  m.def(
      "thd_merge(Tensor? out, Tensor lse, Tensor? out_step, Tensor lse_step, "
      "Tensor? cu_seqlens_padded, bool only_second_half, bool correction) -> (Tensor, Tensor)");
  m.def(
      "thd_merge_(Tensor(a!)? out, Tensor(b!) lse, Tensor? out_step, Tensor lse_step, "
      "Tensor? cu_seqlens_padded, bool only_second_half) -> ()");
  m.def(
      "thd_merge_rows_(Tensor(a!) out, Tensor(b!) lse, Tensor out_step, Tensor lse_step, "
      "Tensor rows, Tensor? step_rows=None) -> ()");
  m.def(
      "thd_out_correction_(Tensor(a!) out, Tensor out_step, Tensor lse, Tensor lse_step, "
      "Tensor? cu_seqlens_padded, bool only_second_half) -> ()");
}

TORCH_LIBRARY_IMPL(rocm_attn, CUDA, m) {
  m.impl("thd_merge", &thd_merge);
  m.impl("thd_merge_", &thd_merge_);
  m.impl("thd_merge_rows_", &thd_merge_rows_);
  m.impl("thd_out_correction_", &thd_out_correction_);
}
