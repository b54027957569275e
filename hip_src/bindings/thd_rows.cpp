// The row views and checks the THD ops share (declared and described in thd_rows.h).

#include "bindings/thd_rows.h"

namespace rocm_attn::bindings {

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

bool thd_is_row_index(const at::Tensor& idx, const at::Tensor& data, int64_t n) {
  return idx.scalar_type() == at::kLong && idx.dim() == 1 && idx.is_contiguous() &&
         idx.device() == data.device() && idx.numel() == n;
}

}  // namespace rocm_attn::bindings
