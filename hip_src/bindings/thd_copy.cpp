// The THD copy ops (rocm_attn::thd_gather: partition, reorders, read_half;
// rocm_attn::thd_copy_valid_tokens_) over the row gather/scatter launcher (thd/copy.hip).
// rocm_attn/thd validates every argument and calls these only for layouts they serve (it falls
// back to its torch path otherwise); the checks here are the last line of defence for direct
// torch.ops callers.

#include <cstring>
#include <vector>

#include "bindings/thd_rows.h"

namespace {

using namespace rocm_attn::bindings;

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

}  // namespace

TORCH_LIBRARY_FRAGMENT(rocm_attn, m) {
  m.def(
      "thd_gather(Tensor x, Tensor cu_seqlens_padded, int mode, int cp, int rank, int dim) "
      "-> Tensor");
  m.def(
      "thd_copy_valid_tokens_(Tensor(a!) dst, Tensor src, Tensor cu_seqlens, "
      "Tensor? cu_seqlens_dst_padded, Tensor? cu_seqlens_src_padded, int dim, float? fill) -> ()");
}

TORCH_LIBRARY_IMPL(rocm_attn, CUDA, m) {
  m.impl("thd_gather", &thd_gather);
  m.impl("thd_copy_valid_tokens_", &thd_copy_valid_tokens_);
}
